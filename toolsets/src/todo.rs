//! `todo_list`: the reference stateful toolset. The model keeps a plan for multi-step work;
//! each call replaces the whole plan, and while it is non-empty every turn starts with a
//! `<TODO_LIST_REMINDER>` snapshot so the plan survives long conversations.
//!
//! In the daemon the plan is stored ([`TodoList::stored`]: the `todo` collection, keyed by
//! session), so it survives a restart and an idle session can leave memory; without a store
//! ([`TodoList::new`], `parlor ask` and tests) each fork keeps its plan in memory.

use std::sync::{Arc, Mutex};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

use parlor_bot::platform::ChatRef;
use parlor_bot::quote;
use parlor_bot::session::{ChatHook, move_record};
use parlor_bot::store::{KvWrite, Store, StoreError};
use parlor_bot::tool::{Bridged, Risk, ToolContext, ToolResult, ToolSetBridge, codes};

use crate::support::built;

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

/// The plan's part in a chat's life: when a chat moves to a new id, its stored plan moves
/// with it (in the migration's one transaction).
#[derive(Debug, Clone, Copy, Default)]
pub struct TodoChatHook;

impl ChatHook for TodoChatHook {
    fn on_migrate(
        &self,
        store: &dyn Store,
        from: &ChatRef,
        to: &ChatRef,
    ) -> Result<Vec<KvWrite>, StoreError> {
        move_record(store, SPACE, &from.session_key(), &to.session_key())
    }
}

/// The `todo_list` toolset: one plan per session, in memory (per fork) or in the store (by
/// session).
#[derive(Debug, Clone)]
pub struct TodoList {
    bridge: ToolSetBridge,
}

impl Bridged for TodoList {
    fn bridge(&self) -> &ToolSetBridge {
        &self.bridge
    }
}

impl Default for TodoList {
    fn default() -> Self {
        Self::new()
    }
}

impl TodoList {
    /// Plans kept in memory: each fork starts empty.
    pub fn new() -> Self {
        Self::over(None)
    }

    /// Plans kept in `store`, by session.
    pub fn stored(store: Arc<dyn Store>) -> Self {
        Self::over(Some(store))
    }

    fn over(store: Option<Arc<dyn Store>>) -> Self {
        let plans = Plans {
            plan: Mutex::default(),
            store,
        };
        let builder = ToolSetBridge::builder_with_state("todo_list", Arc::new(plans))
            .prompt(
                "For requests that take several steps, keep a plan with the todo_list tool: \
                 write it before you start, mark each step in_progress and then completed as \
                 you go, and clear it when the work is done.",
            )
            .add_function_with_state(
                "todo_list",
                "Keep a step-by-step plan for work that takes several steps. Each call \
                 replaces the whole plan (send every step, in order, with its status); at most \
                 one step may be in_progress. Send an empty plan to clear it. Skip it for \
                 simple one-step requests.",
                |plans: Arc<Plans>, args: TodoArgs, cx: ToolContext| async move {
                    plans.replace(&cx.session, args.plan)
                },
            )
            .risk(Risk::Write)
            .result_doc(
                "`data.plan`: the stored plan; `data.pending`, `data.in_progress`, \
                 `data.completed`: step counts.",
            )
            .fork_state(Plans::fresh)
            .injection(Plans::reminder)
            .on_reset(|plans, session| {
                if let Err(e) = plans.set_plan(session, Vec::new()) {
                    tracing::error!(session, error = %e, "cannot clear the plan");
                }
            })
            .holds_session_state(|plans| plans.store.is_none() && !plans.lock().is_empty());
        TodoList {
            bridge: built(builder),
        }
    }
}

/// The plans behind the toolset: the one of this fork, or the stored ones.
struct Plans {
    /// The plan of this fork, when plans are not stored.
    plan: Mutex<Vec<Step>>,
    /// Where plans live when stored; then every fork shares them, by session.
    store: Option<Arc<dyn Store>>,
}

/// A stored plan, versioned like every stored value.
#[derive(Serialize, Deserialize)]
struct StoredPlan {
    v: u32,
    plan: Vec<Step>,
}

impl Plans {
    /// The state of a new fork: an empty plan of its own, or the same store.
    fn fresh(&self) -> Self {
        Plans {
            plan: Mutex::default(),
            store: self.store.clone(),
        }
    }

    /// The plan of `session`.
    fn plan_of(&self, session: &str) -> Result<Vec<Step>, StoreError> {
        let Some(store) = &self.store else {
            return Ok(self.lock().clone());
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

    /// `todo_list`: checks `plan` and makes it the plan of `session`.
    fn replace(&self, session: &str, plan: Vec<Step>) -> ToolResult {
        if let Err(why) = check(&plan) {
            return ToolResult::err(codes::INVALID_ARGUMENTS, why.to_string());
        }
        let count = |status| plan.iter().filter(|s| s.status == status).count();
        let data = json!({
            "plan": &plan,
            "pending": count(StepStatus::Pending),
            "in_progress": count(StepStatus::InProgress),
            "completed": count(StepStatus::Completed),
        });
        let message = if plan.is_empty() {
            "plan cleared".to_owned()
        } else {
            format!("plan updated ({} steps)", plan.len())
        };
        if let Err(e) = self.set_plan(session, plan) {
            tracing::error!(session, error = %e, "cannot store the plan");
            return ToolResult::err(
                codes::INTERNAL,
                "the plan could not be stored; the error was logged for the operator",
            );
        }
        ToolResult::ok_with(message, data)
    }

    /// The `<TODO_LIST_REMINDER>` of `session`'s plan, while it is non-empty.
    fn reminder(&self, session: &str) -> Option<String> {
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
}

/// Why a plan is refused; the text is for the model.
#[derive(Debug, thiserror::Error)]
enum BadPlan {
    #[error("the plan has {0} steps; at most {MAX_STEPS} are allowed")]
    TooLong(usize),
    #[error("step {0} is empty")]
    EmptyStep(usize),
    #[error(
        "step {0} contains a line break or another control character; write each step as one \
         short line, and split a longer one into several steps"
    )]
    Breaks(usize),
    #[error("step {0} is longer than {MAX_STEP_CHARS} characters")]
    LongStep(usize),
    #[error("{0} steps are in_progress; at most one step may be in_progress at a time")]
    ManyInProgress(usize),
}

/// Why `plan` cannot be the plan, if it cannot.
fn check(plan: &[Step]) -> Result<(), BadPlan> {
    if plan.len() > MAX_STEPS {
        return Err(BadPlan::TooLong(plan.len()));
    }
    if let Some((i, _)) = plan
        .iter()
        .enumerate()
        .find(|(_, s)| s.step.trim().is_empty())
    {
        return Err(BadPlan::EmptyStep(i + 1));
    }
    // A step is shown to the model on a line of its own: a line break in it could start a
    // line that reads as someone's message (quote.rs).
    if let Some((i, _)) = plan
        .iter()
        .enumerate()
        .find(|(_, s)| quote::has_breaks(&s.step))
    {
        return Err(BadPlan::Breaks(i + 1));
    }
    if let Some((i, _)) = plan
        .iter()
        .enumerate()
        .find(|(_, s)| s.step.chars().count() > MAX_STEP_CHARS)
    {
        return Err(BadPlan::LongStep(i + 1));
    }
    let in_progress = plan
        .iter()
        .filter(|s| s.status == StepStatus::InProgress)
        .count();
    if in_progress > 1 {
        return Err(BadPlan::ManyInProgress(in_progress));
    }
    Ok(())
}

/// Renders the plan as indented numbered lines: `  1. [completed] step`. Whoever wrote a
/// step, no line of it can pass for an attributed message: every line is indented, and a
/// step stored before breaks were refused is put on one line.
fn render(plan: &[Step]) -> String {
    plan.iter()
        .enumerate()
        .map(|(i, s)| {
            let step = quote::one_line(&s.step, MAX_STEP_CHARS);
            format!("{}{}. [{}] {step}", quote::INDENT, i + 1, s.status.as_str())
        })
        .collect::<Vec<_>>()
        .join("\n")
}
