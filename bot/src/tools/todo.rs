//! `todo_list`: the reference stateful toolset. The model keeps a plan for multi-step work;
//! each call replaces the whole plan, and while it is non-empty every turn starts with a
//! `<TODO_LIST_REMINDER>` snapshot so the plan survives long conversations.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::tool::schema::schema_for;
use crate::tool::{Risk, Role, ToolContext, ToolInvocation, ToolResult, ToolSet, ToolSpec, codes};

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

/// The todo list of one session.
#[derive(Debug, Default)]
pub struct TodoList {
    plan: Mutex<Vec<Step>>,
}

impl TodoList {
    /// An empty plan.
    pub fn new() -> Self {
        Self::default()
    }

    /// The current plan.
    pub fn plan(&self) -> Vec<Step> {
        self.lock().clone()
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

    async fn invoke(&self, call: ToolInvocation, _cx: ToolContext) -> ToolResult {
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
        *self.lock() = args.plan;
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

    fn iteration_prompt_injection(&self, _session: &str) -> Option<String> {
        let plan = self.lock();
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
        Arc::new(TodoList::new())
    }

    fn reset(&self) {
        self.lock().clear();
    }

    fn holds_session_state(&self) -> bool {
        !self.lock().is_empty()
    }
}
