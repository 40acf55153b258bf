//! [`ToolRegistry`]: the toolsets of one session and the gate every tool call passes.
//!
//! The program, not the model, enforces policy (DESIGN.md §2). Before a toolset sees a call
//! the registry checks that the tool exists, that the arguments parse and fit the schema,
//! and that this caller may use a tool of that risk. A panic inside a tool is caught here
//! and becomes `INTERNAL`, so one broken tool cannot take a session down.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;

use super::bridge::is_valid_tool_name;
use super::result::codes;
use super::schema::check_schema;
use super::validate::{ArgValidator, drop_optional_nulls, parse_arguments};
use super::{Risk, Role, ToolContext, ToolInvocation, ToolResult, ToolSet, ToolSpec};
use crate::llm::{ToolCall, ToolDef};

/// Why a set of toolsets cannot be registered. Raised at startup, never at the first request.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// A tool name breaks OpenAI's rule `^[a-zA-Z0-9_-]{1,64}$`.
    #[error(
        "tool name {name:?} of toolset {toolset:?} is invalid: names are 1-64 characters of a-z, A-Z, 0-9, '_' or '-'"
    )]
    InvalidName {
        /// The offending name.
        name: String,
        /// The toolset declaring it.
        toolset: String,
    },
    /// Two tools share a name.
    #[error("tool {name:?} is declared by both toolset {first:?} and toolset {second:?}")]
    Duplicate {
        /// The shared name.
        name: String,
        /// The toolset registered first.
        first: String,
        /// The toolset registered second.
        second: String,
    },
    /// A tool's parameter schema is not a self-contained JSON Schema object.
    #[error("tool {name:?} has an unusable parameter schema: {reason}")]
    BadSchema {
        /// The tool.
        name: String,
        /// What is wrong.
        reason: String,
    },
}

/// One registered tool: where it lives, what it looks like, how its arguments are checked.
struct Entry {
    /// Index into [`ToolRegistry::toolsets`].
    toolset: usize,
    spec: ToolSpec,
    validator: ArgValidator,
}

/// The toolsets of one agent, in registration order, with a name index.
///
/// Cloning is cheap and shares the toolsets; [`ToolRegistry::fork`] gives a new session its
/// own per-session state.
#[derive(Clone)]
pub struct ToolRegistry {
    toolsets: Vec<Arc<dyn ToolSet>>,
    /// Specs and validators are the same for every fork, so they are shared.
    entries: Arc<Vec<Entry>>,
    by_name: Arc<HashMap<String, usize>>,
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolRegistry")
            .field(
                "toolsets",
                &self.toolsets.iter().map(|t| t.name()).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl ToolRegistry {
    /// Registers `toolsets` in order, checking every name, duplicate and schema.
    pub fn new(toolsets: Vec<Arc<dyn ToolSet>>) -> Result<Self, RegistryError> {
        let mut entries: Vec<Entry> = Vec::new();
        let mut by_name: HashMap<String, usize> = HashMap::new();
        for (index, toolset) in toolsets.iter().enumerate() {
            for spec in toolset.tools() {
                if !is_valid_tool_name(&spec.name) {
                    return Err(RegistryError::InvalidName {
                        name: spec.name,
                        toolset: toolset.name().to_owned(),
                    });
                }
                if let Some(&first) = by_name.get(&spec.name) {
                    return Err(RegistryError::Duplicate {
                        name: spec.name,
                        first: toolsets[entries[first].toolset].name().to_owned(),
                        second: toolset.name().to_owned(),
                    });
                }
                check_schema(&spec.parameters).map_err(|reason| RegistryError::BadSchema {
                    name: spec.name.clone(),
                    reason,
                })?;
                let validator =
                    ArgValidator::new(&spec.parameters).map_err(|e| RegistryError::BadSchema {
                        name: spec.name.clone(),
                        reason: e.to_string(),
                    })?;
                by_name.insert(spec.name.clone(), entries.len());
                entries.push(Entry {
                    toolset: index,
                    spec,
                    validator,
                });
            }
        }
        Ok(ToolRegistry {
            toolsets,
            entries: Arc::new(entries),
            by_name: Arc::new(by_name),
        })
    }

    /// A registry for a new session: every toolset forked, specs shared.
    pub fn fork(&self) -> Self {
        ToolRegistry {
            toolsets: self.toolsets.iter().map(|t| t.fork()).collect(),
            entries: Arc::clone(&self.entries),
            by_name: Arc::clone(&self.by_name),
        }
    }

    /// Forgets every toolset's per-session state (`/reset`).
    pub fn reset(&self) {
        for toolset in &self.toolsets {
            toolset.reset();
        }
    }

    /// The toolsets, in registration order.
    pub fn toolsets(&self) -> &[Arc<dyn ToolSet>] {
        &self.toolsets
    }

    /// Every tool with the name of its toolset, in registration order.
    pub fn specs(&self) -> impl Iterator<Item = (&str, &ToolSpec)> {
        self.entries
            .iter()
            .map(|e| (self.toolsets[e.toolset].name(), &e.spec))
    }

    /// The names of every tool, in registration order.
    pub fn names(&self) -> Vec<&str> {
        self.entries.iter().map(|e| e.spec.name.as_str()).collect()
    }

    /// The exact `tools` array sent to the model.
    pub fn defs(&self) -> Vec<ToolDef> {
        self.entries.iter().map(|e| e.spec.to_def()).collect()
    }

    /// Every toolset's static prompt, in order.
    pub fn prompts(&self) -> Vec<String> {
        self.toolsets.iter().filter_map(|t| t.prompt()).collect()
    }

    /// Whether any toolset holds in-memory session state (see
    /// [`ToolSet::holds_session_state`]).
    pub fn holds_session_state(&self) -> bool {
        self.toolsets.iter().any(|t| t.holds_session_state())
    }

    /// Every toolset's injection for the turn about to start in `session`, in order.
    pub fn injections(&self, session: &str) -> Vec<String> {
        self.toolsets
            .iter()
            .filter_map(|t| t.iteration_prompt_injection(session))
            .collect()
    }

    /// Runs one call through the policy gate and the toolset. Never panics, never fails:
    /// every problem is a [`ToolResult`] with an error code.
    pub async fn call(&self, call: &ToolCall, cx: ToolContext) -> ToolResult {
        let name = &call.function.name;
        let Some(entry) = self.by_name.get(name).map(|&i| &self.entries[i]) else {
            return ToolResult::err(
                codes::TOOL_NOT_FOUND,
                format!(
                    "there is no tool named {name:?}; the tools are: {}",
                    self.names().join(", ")
                ),
            );
        };
        let mut arguments = match parse_arguments(&call.function.arguments) {
            Ok(value) => value,
            Err(why) => {
                return ToolResult::err(codes::INVALID_ARGUMENTS, format!("{name}: {why}"));
            }
        };
        // `"x": null` from a model means "not given"; serde only applies defaults to absent
        // members, so nulls of optional members are removed before the toolset sees them.
        drop_optional_nulls(entry.validator.schema(), &mut arguments);
        if let Err(why) = entry.validator.validate(&arguments) {
            return ToolResult::err(codes::INVALID_ARGUMENTS, format!("{name}: {why}"));
        }
        if entry.spec.risk == Risk::Dangerous && cx.caller.role < Role::Operator {
            return ToolResult::err(
                codes::PERMISSION_DENIED,
                format!("{name} can change things outside this chat, so only an admin may use it"),
            );
        }
        let toolset = &self.toolsets[entry.toolset];
        let invocation = ToolInvocation {
            id: call.id.clone(),
            name: name.clone(),
            arguments,
        };
        match AssertUnwindSafe(toolset.invoke(invocation, cx))
            .catch_unwind()
            .await
        {
            Ok(result) => result,
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "non-string panic payload".to_owned());
                tracing::error!(tool = %name, panic = %what, "tool panicked");
                ToolResult::err(
                    codes::INTERNAL,
                    format!("{name} failed unexpectedly; the error was logged for the operator"),
                )
            }
        }
    }
}
