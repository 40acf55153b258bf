//! The stable result JSON every tool call answers with (docs/contract.md, "Tools"):
//! `{"success":true,"message":...,"data":...}` or
//! `{"success":false,"error_code":...,"message":...,"data":...}`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Error codes shared by every toolset; a toolset adds its own beside them.
pub mod codes {
    /// The model named a tool that does not exist.
    pub const TOOL_NOT_FOUND: &str = "TOOL_NOT_FOUND";
    /// The arguments are not JSON or do not fit the schema.
    pub const INVALID_ARGUMENTS: &str = "INVALID_ARGUMENTS";
    /// The caller may not use this tool here.
    pub const PERMISSION_DENIED: &str = "PERMISSION_DENIED";
    /// The call took longer than its timeout.
    pub const TIMEOUT: &str = "TIMEOUT";
    /// The turn was stopped before the call finished.
    pub const CANCELLED: &str = "CANCELLED";
    /// Too many calls; try later.
    pub const RATE_LIMITED: &str = "RATE_LIMITED";
    /// Something the tool needs is unreachable.
    pub const UNAVAILABLE: &str = "UNAVAILABLE";
    /// The tool failed in a way the model cannot fix; details are in the log only.
    pub const INTERNAL: &str = "INTERNAL";

    /// Every shared code, for the catalog.
    pub const SHARED: &[&str] = &[
        TOOL_NOT_FOUND,
        INVALID_ARGUMENTS,
        PERMISSION_DENIED,
        TIMEOUT,
        CANCELLED,
        RATE_LIMITED,
        UNAVAILABLE,
        INTERNAL,
    ];
}

/// What a tool call answers. Serialized as the stable JSON above; field order is fixed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    /// Whether the call did what was asked.
    pub success: bool,
    /// On failure, a code from [`codes`] or the toolset's own list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<String>,
    /// What the model should know, in a sentence.
    pub message: String,
    /// Structured payload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

impl ToolResult {
    /// A success with a message and no data.
    pub fn ok(message: impl Into<String>) -> Self {
        ToolResult {
            success: true,
            error_code: None,
            message: message.into(),
            data: None,
        }
    }

    /// A success carrying data.
    pub fn ok_with(message: impl Into<String>, data: Value) -> Self {
        ToolResult {
            data: Some(data),
            ..ToolResult::ok(message)
        }
    }

    /// A failure with a code and a message for the model.
    pub fn err(code: impl Into<String>, message: impl Into<String>) -> Self {
        ToolResult {
            success: false,
            error_code: Some(code.into()),
            message: message.into(),
            data: None,
        }
    }

    /// Adds data to a result.
    pub fn with_data(mut self, data: Value) -> Self {
        self.data = Some(data);
        self
    }

    /// The error code, when this is a failure.
    pub fn code(&self) -> Option<&str> {
        self.error_code.as_deref()
    }

    /// The JSON text sent to the model as the tool message content.
    pub fn to_json(&self) -> String {
        // Serializing a struct of strings, bools and `Value`s cannot fail.
        serde_json::to_string(self).unwrap_or_else(|_| {
            r#"{"success":false,"error_code":"INTERNAL","message":"result could not be encoded"}"#
                .to_owned()
        })
    }
}
