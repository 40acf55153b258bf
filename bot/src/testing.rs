//! Test doubles shared by every crate's tests, behind the `test-util` feature: one double
//! per trait, so a change to a trait is made once here and not in each test file.
//!
//! Not for production: nothing here has a timeout or a bound, and locks are unwrapped
//! (a poisoned lock in a test is the test's failure).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::llm::{ChatRequest, Completion, LlmBackend, LlmError, ToolCall, Usage};

/// A model that answers from a script and records every request.
#[derive(Default)]
pub struct ScriptedLlm {
    replies: Mutex<VecDeque<Completion>>,
    requests: Mutex<Vec<ChatRequest>>,
}

impl ScriptedLlm {
    /// A model that gives `replies` in order, then fails as malformed.
    pub fn new(replies: Vec<Completion>) -> Arc<Self> {
        Arc::new(ScriptedLlm {
            replies: Mutex::new(replies.into()),
            requests: Mutex::default(),
        })
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<ChatRequest> {
        self.requests.lock().unwrap().clone()
    }
}

#[async_trait]
impl LlmBackend for ScriptedLlm {
    async fn stream(
        &self,
        request: &ChatRequest,
        _cancel: &CancellationToken,
    ) -> Result<Completion, LlmError> {
        self.requests.lock().unwrap().push(request.clone());
        self.replies
            .lock()
            .unwrap()
            .pop_front()
            .ok_or_else(|| LlmError::Malformed("script exhausted".into()))
    }
}

/// A final text answer, with a fixed usage of 10 + 2 tokens.
pub fn text(t: &str) -> Completion {
    Completion {
        content: t.to_owned(),
        finish_reason: Some("stop".into()),
        usage: Some(Usage {
            prompt_tokens: 10,
            completion_tokens: 2,
            total_tokens: 12,
        }),
        ..Completion::default()
    }
}

/// An answer that calls tools: `(call id, tool name, arguments)`.
pub fn calls(calls: &[(&str, &str, serde_json::Value)]) -> Completion {
    Completion {
        tool_calls: calls
            .iter()
            .map(|(id, name, args)| ToolCall::new(*id, *name, args.to_string()))
            .collect(),
        finish_reason: Some("tool_calls".into()),
        ..Completion::default()
    }
}

/// The tool results among `messages`, as `(call id, parsed JSON)`; a result that is not
/// JSON comes back as a JSON string.
pub fn tool_results(messages: &[crate::llm::Message]) -> Vec<(String, serde_json::Value)> {
    messages
        .iter()
        .filter_map(|m| match m {
            crate::llm::Message::Tool {
                tool_call_id,
                content,
            } => Some((
                tool_call_id.clone(),
                serde_json::from_str(content).unwrap_or(serde_json::Value::String(content.clone())),
            )),
            _ => None,
        })
        .collect()
}
