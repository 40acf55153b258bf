//! Events of the agent loop, for logs now and metrics later.

use std::time::Duration;

use super::TurnEnd;
use crate::llm::{ToolCall, Usage};
use crate::tool::ToolResult;

/// Something that happened in a turn. Borrowed, so observing costs no copies.
#[derive(Debug, Clone, Copy)]
pub enum AgentEvent<'a> {
    /// An LLM request is about to be sent.
    LlmRequest {
        /// Session key.
        session: &'a str,
        /// 1-based iteration within the turn.
        iteration: usize,
    },
    /// The provider reported usage for one request.
    Usage {
        /// Session key.
        session: &'a str,
        /// The model that answered (a fallback's, when the primary failed).
        model: &'a str,
        /// Token counts.
        usage: &'a Usage,
    },
    /// A tool call passed to the registry.
    ToolStarted {
        /// Session key.
        session: &'a str,
        /// The call.
        call: &'a ToolCall,
    },
    /// A tool call has its result (success or failure).
    ToolFinished {
        /// Session key.
        session: &'a str,
        /// The call.
        call: &'a ToolCall,
        /// Its result.
        result: &'a ToolResult,
        /// Wall time of the call.
        elapsed: Duration,
    },
    /// The turn is over.
    TurnFinished {
        /// Session key.
        session: &'a str,
        /// LLM calls made.
        iterations: usize,
        /// How it ended.
        end: TurnEnd,
        /// Tokens used by the whole turn.
        usage: &'a Usage,
    },
}

/// Receives [`AgentEvent`]s. Must be quick: it runs inline in the loop.
pub trait AgentObserver: Send + Sync {
    /// Called for every event.
    fn on_event(&self, event: &AgentEvent<'_>);
}

/// Writes events to the `tracing` log.
#[derive(Debug, Clone, Copy, Default)]
pub struct TracingObserver;

impl AgentObserver for TracingObserver {
    fn on_event(&self, event: &AgentEvent<'_>) {
        match *event {
            AgentEvent::LlmRequest { session, iteration } => {
                tracing::debug!(session, iteration, "llm request");
            }
            AgentEvent::Usage {
                session,
                model,
                usage,
            } => tracing::debug!(
                session,
                model,
                prompt_tokens = usage.prompt_tokens,
                completion_tokens = usage.completion_tokens,
                "llm usage"
            ),
            AgentEvent::ToolStarted { session, call } => {
                tracing::info!(session, tool = %call.function.name, id = %call.id, "tool started");
            }
            AgentEvent::ToolFinished {
                session,
                call,
                result,
                elapsed,
            } => {
                if result.success {
                    tracing::info!(session, tool = %call.function.name, ?elapsed, "tool finished");
                } else {
                    tracing::warn!(
                        session,
                        tool = %call.function.name,
                        code = result.code().unwrap_or(""),
                        message = %result.message,
                        ?elapsed,
                        "tool failed"
                    );
                }
            }
            AgentEvent::TurnFinished {
                session,
                iterations,
                end,
                usage,
            } => tracing::info!(
                session,
                iterations,
                ?end,
                total_tokens = usage.total_tokens,
                "turn finished"
            ),
        }
    }
}
