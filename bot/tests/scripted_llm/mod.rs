//! The scripted model double shared by the agent tests: answers from a script, records
//! every request.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use parlor_bot::llm::{ChatRequest, Completion, LlmBackend, LlmError};
use tokio_util::sync::CancellationToken;

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
