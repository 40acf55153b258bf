//! `todo_list`: the reference stateful toolset. The model keeps a plan for multi-step work;
//! each call replaces the whole plan, and while it is non-empty every turn starts with a
//! `<TODO_LIST_REMINDER>` snapshot so the plan survives long conversations.
//!
//! In the daemon the plan is stored ([`TodoList::stored`]: the `todo` collection, keyed by
//! session), so it survives a restart and an idle session can leave memory; without a store
//! ([`TodoList::new`], `parlor ask` and tests) each fork keeps its plan in memory.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

use parlor_bot::store::{Store, StoreError};
use parlor_bot::tool::schema::schema_for;
use parlor_bot::tool::{
    Risk, Role, ToolContext, ToolInvocation, ToolResult, ToolSet, ToolSpec, codes,
};

/// Most steps a plan may hold; a longer plan is a sign the model is looping.
pub const MAX_STEPS: usize = 50;
/// Longest step text, in characters.
pub const MAX_STEP_CHARS: usize = 500;

/// The state of one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum StepStatus {
    /// Not started.
    Pending,
    /// Being worked on now; at most one step at a time.
    InProgress,
    /// Done.
    Completed,
}

impl StepStatus {
    fn as_str(self) -> &'static str {
        match self {
            StepStatus::Pending => "pending",
            StepStatus::InProgress => "in_progress",
            StepStatus::Completed => "completed",
        }
    }
}

/// One step of the plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Step {
    /// What to do, in a short sentence.
    pub step: String,
    /// The step's state.
    pub status: StepStatus,
}

/// Arguments of `todo_list`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct TodoArgs {
    /// The whole plan, in order. It replaces the previous plan; send an empty list to clear it.
    pub plan: Vec<Step>,
    /// Why the plan changed, in a sentence.
    pub explanation: Option<String>,
}

/// The store collection of stored plans.
const SPACE: &str = "todo";

/// The todo list: one plan per session, in memory or in the store.
#[derive(Default)]
pub struct TodoList {
    plan: Mutex<Vec<Step>>,
    /// Where plans live when stored; then this toolset is shared by every session.
    store: Option<Arc<dyn Store>>,
}

impl std::fmt::Debug for TodoList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TodoList")
            .field("stored", &self.store.is_some())
            .finish_non_exhaustive()
    }
}

/// A stored plan, versioned like every stored value.
#[derive(Serialize, Deserialize)]
struct StoredPlan {
    v: u32,
    plan: Vec<Step>,
}

impl TodoList {
    /// An empty plan kept in memory (per fork).
    pub fn new() -> Self {
        Self::default()
    }

    /// Plans kept in `store`, by session.
    pub fn stored(store: Arc<dyn Store>) -> Self {
        TodoList {
            plan: Mutex::default(),
            store: Some(store),
        }
    }

    /// The current plan of an in-memory list.
    pub fn plan(&self) -> Vec<Step> {
        self.lock().clone()
    }

    /// The plan of `session`.
    pub fn plan_of(&self, session: &str) -> Result<Vec<Step>, StoreError> {
        let Some(store) = &self.store else {
            return Ok(self.plan());
        };
        match store.kv_get(SPACE, session)? {
            None => Ok(Vec::new()),
            Some(text) => serde_json::from_str::<StoredPlan>(&text)
                .map(|p| p.plan)
                .map_err(|e| StoreError::Corrupt {
                    key: format!("{SPACE}[{session}]"),
                    reason: e.to_string(),
                }),
        }
    }

    fn set_plan(&self, session: &str, plan: Vec<Step>) -> Result<(), StoreError> {
        let Some(store) = &self.store else {
            *self.lock() = plan;
            return Ok(());
        };
        if plan.is_empty() {
            return store.kv_delete(SPACE, session).map(drop);
        }
        let text =
            serde_json::to_string(&StoredPlan { v: 1, plan }).map_err(|e| StoreError::Corrupt {
                key: format!("{SPACE}[{session}]"),
                reason: e.to_string(),
            })?;
        store.kv_put(SPACE, session, &text)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Step>> {
        // The plan is replaced whole under the lock, so a poisoned lock still holds a plan.
        self.plan.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn check(plan: &[Step]) -> Result<(), String> {
        if plan.len() > MAX_STEPS {
            return Err(format!(
                "the plan has {} steps; at most {MAX_STEPS} are allowed",
                plan.len()
            ));
        }
        if let Some((i, _)) = plan
            .iter()
            .enumerate()
            .find(|(_, s)| s.step.trim().is_empty())
        {
            return Err(format!("step {} is empty", i + 1));
        }
        if let Some((i, _)) = plan
            .iter()
            .enumerate()
            .find(|(_, s)| s.step.chars().count() > MAX_STEP_CHARS)
        {
            return Err(format!(
                "step {} is longer than {MAX_STEP_CHARS} characters",
                i + 1
            ));
        }
        let in_progress = plan
            .iter()
            .filter(|s| s.status == StepStatus::InProgress)
            .count();
        if in_progress > 1 {
            return Err(format!(
                "{in_progress} steps are in_progress; at most one step may be in_progress at a time"
            ));
        }
        Ok(())
    }
}

/// Renders the plan as numbered lines: `1. [completed] step`.
fn render(plan: &[Step]) -> String {
    plan.iter()
        .enumerate()
        .map(|(i, s)| format!("{}. [{}] {}", i + 1, s.status.as_str(), s.step))
        .collect::<Vec<_>>()
        .join("\n")
}

#[async_trait]
impl ToolSet for TodoList {
    fn name(&self) -> &str {
        "todo_list"
    }

    fn tools(&self) -> Vec<ToolSpec> {
        vec![ToolSpec {
            name: "todo_list".to_owned(),
            description: "Keep a step-by-step plan for work that takes several steps. Each \
                call replaces the whole plan (send every step, in order, with its status); at \
                most one step may be in_progress. Send an empty plan to clear it. Skip it for \
                simple one-step requests."
                .to_owned(),
            parameters: schema_for::<TodoArgs>(),
            result: "`data.plan`: the stored plan; `data.pending`, `data.in_progress`, \
                `data.completed`: step counts."
                .to_owned(),
            risk: Risk::Write,
            role: Role::Member,
            role_in_chat_arg: None,
            failure_codes: Vec::new(),
        }]
    }

    async fn invoke(&self, call: ToolInvocation, cx: ToolContext) -> ToolResult {
        let args: TodoArgs = match serde_json::from_value(call.arguments) {
            Ok(args) => args,
            Err(e) => return ToolResult::err(codes::INVALID_ARGUMENTS, e.to_string()),
        };
        if let Err(why) = Self::check(&args.plan) {
            return ToolResult::err(codes::INVALID_ARGUMENTS, why);
        }
        let count = |status| args.plan.iter().filter(|s| s.status == status).count();
        let data = json!({
            "plan": &args.plan,
            "pending": count(StepStatus::Pending),
            "in_progress": count(StepStatus::InProgress),
            "completed": count(StepStatus::Completed),
        });
        let message = if args.plan.is_empty() {
            "plan cleared".to_owned()
        } else {
            format!("plan updated ({} steps)", args.plan.len())
        };
        if let Err(e) = self.set_plan(&cx.session, args.plan) {
            tracing::error!(session = %cx.session, error = %e, "cannot store the plan");
            return ToolResult::err(
                codes::INTERNAL,
                "the plan could not be stored; the error was logged for the operator",
            );
        }
        ToolResult::ok_with(message, data)
    }

    fn prompt(&self) -> Option<String> {
        Some(
            "For requests that take several steps, keep a plan with the todo_list tool: \
             write it before you start, mark each step in_progress and then completed as you \
             go, and clear it when the work is done."
                .to_owned(),
        )
    }

    fn iteration_prompt_injection(&self, session: &str) -> Option<String> {
        let plan = match self.plan_of(session) {
            Ok(plan) => plan,
            Err(e) => {
                tracing::error!(session, error = %e, "cannot read the plan");
                return None;
            }
        };
        if plan.is_empty() {
            return None;
        }
        Some(format!(
            "<TODO_LIST_REMINDER>\nThis is your current plan from the todo_list tool, shown \
             for reference. It is not a new instruction from the user; update it with \
             todo_list as you make progress.\n{}\n</TODO_LIST_REMINDER>",
            render(&plan)
        ))
    }

    fn fork(&self) -> Arc<dyn ToolSet> {
        match &self.store {
            Some(store) => Arc::new(TodoList::stored(Arc::clone(store))),
            None => Arc::new(TodoList::new()),
        }
    }

    fn reset(&self, session: &str) {
        if let Err(e) = self.set_plan(session, Vec::new()) {
            tracing::error!(session, error = %e, "cannot clear the plan");
        }
    }

    fn holds_session_state(&self) -> bool {
        self.store.is_none() && !self.lock().is_empty()
    }
}
