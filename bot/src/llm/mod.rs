//! The LLM edge: the only module that knows the OpenAI chat-completions wire JSON.
//!
//! - [`wire`]: request/response message types in the OpenAI shape.
//! - [`stream`]: assembles streamed chunks (content, reasoning, tool-call deltas by `index`)
//!   into one [`Completion`].
//! - [`openai`]: [`OpenAiClient`], the reqwest implementation of [`LlmBackend`], with SSE
//!   framing, timeouts and retries.

pub mod openai;
pub mod retry;
pub mod stream;
pub mod wire;

use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

pub use openai::{OpenAiClient, OpenAiConfig, RetryPolicy};
pub use retry::Retrying;
pub use stream::{StreamAssembler, assemble};
pub use wire::{
    ChatRequest, Completion, Content, ContentPart, FunctionCall, FunctionDef, ImageUrl, Message,
    ToolCall, ToolChoice, ToolDef, Usage,
};

/// Why a completion could not be produced. Every variant says whether a retry could help
/// through [`LlmError::is_retryable`]; the message never contains the API key.
#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    /// Could not connect, or the connection broke before a response arrived.
    #[error("cannot reach the LLM server: {0}")]
    Connect(String),
    /// The request (or a pause inside the stream) took longer than the configured timeout.
    #[error("the LLM request timed out after {0:?}")]
    Timeout(Duration),
    /// The server answered with a non-success HTTP status.
    #[error("the LLM server answered HTTP {status}: {body}")]
    Status {
        /// HTTP status code.
        status: u16,
        /// The (possibly truncated) response body, for the log.
        body: String,
        /// The server's `Retry-After`, when it sent one.
        retry_after: Option<Duration>,
    },
    /// The stream carried `{"error": ...}` instead of a chunk.
    #[error("the LLM stream reported an error: {0}")]
    Stream(String),
    /// The stream carried something that is not a chat-completion chunk.
    #[error("the LLM sent malformed data: {0}")]
    Malformed(String),
    /// The caller cancelled the request.
    #[error("the LLM request was cancelled")]
    Cancelled,
}

impl LlmError {
    /// Connect errors, timeouts, 429 and 5xx may succeed on a later attempt; other 4xx,
    /// malformed data and cancellation will not.
    pub fn is_retryable(&self) -> bool {
        match self {
            LlmError::Connect(_) | LlmError::Timeout(_) => true,
            LlmError::Status { status, .. } => *status == 429 || *status >= 500,
            LlmError::Stream(_) | LlmError::Malformed(_) | LlmError::Cancelled => false,
        }
    }
}

/// Something that turns a [`ChatRequest`] into a [`Completion`] — the real OpenAI-compatible
/// client, or a decorator around one (logging, metrics, rate limiting).
#[async_trait]
pub trait LlmBackend: Send + Sync {
    /// Streams one completion and returns it assembled. Cancelling `cancel` ends the request
    /// promptly with [`LlmError::Cancelled`].
    async fn stream(
        &self,
        request: &ChatRequest,
        cancel: &CancellationToken,
    ) -> Result<Completion, LlmError>;
}
