//! The OpenAI-compatible streaming client. (Being written; see the llm helper.)

/// Retry settings.
#[derive(Debug, Clone)]
pub struct RetryPolicy {}

/// Client settings.
#[derive(Debug, Clone)]
pub struct OpenAiConfig {}

/// The client.
#[derive(Debug, Clone)]
pub struct OpenAiClient {}
