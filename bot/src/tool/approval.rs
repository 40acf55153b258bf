//! Approvals: a tool the operator marks (`[approvals]`, or per MCP server) runs only after a
//! person with the named role in the chat says yes. The registry asks the turn's
//! [`Approver`] once a call has passed every other check (exists, role, arguments), and runs
//! the tool only on [`Approval::Approved`]; every other answer is the call's result, so the
//! model learns what happened and tells the chat. The session layer's approver stores the
//! request before it asks, so a restart neither asks twice nor runs the tool twice.

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use super::{Caller, Role, ToolResult};

/// The error code of a call a person denied.
pub const DENIED: &str = "DENIED";
/// The error code of a call nobody decided in time.
pub const APPROVAL_EXPIRED: &str = "APPROVAL_EXPIRED";

/// What the approver is asked.
#[derive(Debug, Clone, Copy)]
pub struct ApprovalRequest<'a> {
    /// The tool.
    pub tool: &'a str,
    /// Its arguments, checked against its schema.
    pub arguments: &'a serde_json::Value,
    /// The role whoever decides must hold in the chat.
    pub role: Role,
    /// Who the call is for.
    pub caller: &'a Caller,
}

/// What became of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Approval {
    /// Someone with the role said yes: run it.
    Approved {
        /// Who (their name).
        by: String,
    },
    /// Someone with the role said no.
    Denied {
        /// Who (their name).
        by: String,
    },
    /// Nobody decided in time.
    Expired {
        /// How long it waited, in minutes.
        minutes: u64,
    },
    /// It was approved and run before a restart; it is not run again.
    AlreadyRan,
    /// The turn was stopped while it waited.
    Cancelled,
    /// It could not be asked (the store failed).
    Unavailable(String),
}

impl Approval {
    /// The call's result for anything but [`Approval::Approved`].
    pub fn refusal(&self, tool: &str) -> Option<ToolResult> {
        Some(match self {
            Approval::Approved { .. } => return None,
            Approval::Denied { by } => ToolResult::err(
                DENIED,
                format!(
                    "{by} denied running {tool}. It did not run; tell the chat, and do not try it another way"
                ),
            ),
            Approval::Expired { minutes } => ToolResult::err(
                APPROVAL_EXPIRED,
                format!(
                    "nobody approved {tool} within {minutes} min, so it did not run; tell the chat"
                ),
            ),
            Approval::AlreadyRan => ToolResult::err(
                super::codes::UNAVAILABLE,
                format!(
                    "{tool} was approved and ran before a restart; its result was lost and it does not run twice. Tell the chat"
                ),
            ),
            Approval::Cancelled => ToolResult::err(
                super::codes::CANCELLED,
                format!("the turn was stopped while {tool} waited for approval"),
            ),
            Approval::Unavailable(why) => ToolResult::err(
                super::codes::UNAVAILABLE,
                format!("{tool} needs approval, which cannot be asked now ({why}); it did not run"),
            ),
        })
    }
}

/// Asks a person for a yes: the session layer's, per turn.
#[async_trait]
pub trait Approver: Send + Sync {
    /// Asks, waits for the decision (or the timeout, or `cancel`) and answers it.
    async fn approve(&self, request: ApprovalRequest<'_>, cancel: &CancellationToken) -> Approval;
}
