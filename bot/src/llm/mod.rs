//! The LLM edge: the only module that knows a provider's wire JSON (OpenAI's chat
//! completions, Anthropic's Messages).
//!
//! - [`wire`]: the conversation types every backend maps from (serde in the OpenAI shape);
//!   the store keeps history in its own form (`store/history.rs`).
//! - [`stream`]: assembles streamed chunks (content, reasoning, tool-call deltas by `index`)
//!   into one [`Completion`].
//! - [`openai`]: [`OpenAiClient`], the HTTP implementation of [`LlmBackend`] (hyper, or
//!   reqwest through a proxy: `http.rs`), with SSE framing, timeouts and retries; `body.rs`
//!   writes its request bodies.
//! - [`failover`]: [`Failover`], the primary and its fallbacks as one backend, each with a
//!   circuit breaker.
//! - [`anthropic`]: [`AnthropicClient`], the same for Anthropic's Messages API, spoken
//!   natively rather than through its OpenAI compatibility layer: that layer drops prompt
//!   caching, thinking signatures and cache usage. It maps the same [`ChatRequest`] to a
//!   Messages body (system blocks, content blocks, `tool_use`/`tool_result` pairs,
//!   `cache_control` on the stable prefix and the newest user turn) and assembles the event
//!   stream into the same [`Completion`]; thinking comes back as [`ThinkingBlock`]s, which
//!   the assistant message carries so the next request can replay them. Retries are
//!   [`Retrying`]'s, as for OpenAI.
//! - [`embed`]: [`Embedder`], texts to vectors by the provider's `/embeddings` endpoint
//!   ([`OpenAiEmbedder`]), for the memory toolset's search.
//! - [`price`]: `[llm.prices]`, what a model's tokens cost, and [`Spend`], tokens by the
//!   model that spent them.
//! - `http.rs`: what both clients share: body streams under an idle timeout, status and
//!   transport errors, `Retry-After`, redaction.

pub mod anthropic;
mod body;
pub mod embed;
pub mod failover;
mod http;
pub mod openai;
pub mod price;
pub mod retry;
pub mod stream;
pub mod wire;

use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

pub use anthropic::{AnthropicClient, AnthropicConfig, CacheTtl};
pub use embed::{Embedder, EmbedderConfig, OpenAiEmbedder};
pub use failover::{Failover, Link};
pub use openai::{OpenAiClient, OpenAiConfig, RetryPolicy};
pub use price::{Price, Prices, Spend};
pub use retry::Retrying;
pub use stream::{StreamAssembler, assemble};
pub use wire::{
    ChatRequest, Completion, Content, ContentPart, FunctionCall, FunctionDef, ImageUrl, Message,
    ThinkingBlock, ToolCall, ToolChoice, ToolDef, ToolDefs, Usage,
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
    /// A model server on this machine or network had not begun to answer after this long.
    /// It may still be reading the prompt: sending the request again would start that over,
    /// so it is not retried.
    #[error("the local model server had not begun to answer after {0:?}")]
    NoAnswerYet(Duration),
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
    /// The response began but broke off before it was complete: the connection failed
    /// inside the body, the stream ended with neither a finish reason nor `[DONE]` (nor
    /// Anthropic's `message_stop`), or Anthropic reported inside the stream an error it
    /// sends with a retryable status (`overloaded_error`, `api_error`, `rate_limit_error`).
    #[error("the LLM stream broke off before the answer was complete: {0}")]
    Interrupted(String),
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
    /// Connect errors, timeouts, broken-off streams, 429 and 5xx may succeed on a later
    /// attempt; other 4xx, malformed data and cancellation will not.
    pub fn is_retryable(&self) -> bool {
        match self {
            LlmError::Connect(_) | LlmError::Timeout(_) | LlmError::Interrupted(_) => true,
            LlmError::Status { status, .. } => *status == 429 || *status >= 500,
            LlmError::Stream(_)
            | LlmError::Malformed(_)
            | LlmError::NoAnswerYet(_)
            | LlmError::Cancelled => false,
        }
    }

    /// Whether the server refused the request as longer than the model's context window:
    /// OpenAI's `400` with the code `context_length_exceeded` (also recognised by its
    /// message, for compatible servers that send no code), or Anthropic's `400` saying
    /// `prompt is too long`.
    pub fn is_context_length_exceeded(&self) -> bool {
        let LlmError::Status { status, body, .. } = self else {
            return false;
        };
        if !matches!(status, 400 | 413) {
            return false;
        }
        let code = serde_json::from_str::<serde_json::Value>(body)
            .ok()
            .and_then(|v| {
                v.pointer("/error/code")
                    .and_then(serde_json::Value::as_str)
                    .map(str::to_owned)
            });
        code.as_deref() == Some("context_length_exceeded")
            || body.contains("context_length_exceeded")
            || body.contains("maximum context length")
            || body.contains("prompt is too long")
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
