//! Anthropic's Messages API, natively: one streamed POST to `{base_url}/v1/messages` per
//! [`LlmBackend::stream`] call, the request written from parlor's [`ChatRequest`] and the
//! server-sent events assembled into the same [`Completion`] the OpenAI client returns.
//!
//! The client makes exactly one attempt; [`AnthropicClient::with_retries`] wraps it in
//! [`Retrying`], like the OpenAI client.
//!
//! # The request
//!
//! - System messages become the top-level `system`, one text block each, in order (parlor
//!   sends only one, first).
//! - Every other message becomes content blocks; adjacent messages of one role are merged
//!   into one, since the API requires user and assistant to alternate. A run of tool
//!   results therefore becomes one user message of `tool_result` blocks.
//! - An assistant's tool call becomes a `tool_use` block whose `input` is its arguments
//!   parsed. Arguments that are not a JSON object are sent as `{}`: the API accepts only an
//!   object, and the tool result that follows (an invalid-arguments error from the registry)
//!   already tells the model what went wrong.
//! - An assistant's [`ThinkingBlock`]s go first in its message, with their signatures, when
//!   thinking is on (the API requires them back in a tool-use turn); with thinking off they
//!   are left out.
//! - A `data:` image URL becomes a base64 `image` block, another URL a `url` image block;
//!   an image reference left over becomes text ([`ChatRequest::wire_form`]). Empty text is
//!   left out (the API refuses empty text blocks), and so is a message left with nothing.
//! - Prompt caching: `cache_control` on the last tool definition and the last system block
//!   (the prefix that stays the same from request to request) and on the last block of the
//!   newest user message (the conversation so far, read back by the next request). Three of
//!   the four breakpoints the API allows. [`CacheTtl::OneHour`] adds `"ttl": "1h"`.
//! - `max_tokens` is required: the request's `max_completion_tokens`, else
//!   [`AnthropicConfig::max_tokens`]. With thinking on, the budget comes on top of it (the
//!   API wants `budget_tokens < max_tokens`), `temperature` is left out and a required tool
//!   call becomes `auto` (the API refuses both with thinking).
//!
//! # The answer
//!
//! Events are read by their JSON `type` (the `event:` line says the same). Text blocks are
//! joined into the content, `tool_use` blocks become tool calls whose arguments are the
//! concatenated `partial_json` (`{}` when there was none), thinking blocks are kept with
//! their signatures. `end_turn` and `stop_sequence` finish as `stop`, `tool_use` as
//! `tool_calls`, `max_tokens` as `length`. Usage counts cache reads and writes into
//! `prompt_tokens` (as OpenAI does) and reports them apart too.
//!
//! A stream that ends without `message_stop` is [`LlmError::Interrupted`], never half an
//! answer. An `error` event is [`LlmError::Stream`], except the error types Anthropic
//! sends for a retryable status (`overloaded_error`, 529; `api_error`, 500;
//! `rate_limit_error`, 429): those are [`LlmError::Interrupted`], so that [`Retrying`] tries
//! again, as it would had the server answered with that status.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use super::http::{Poster, Transport};
use super::retry::{RetryPolicy, Retrying};
use super::stream::{MAX_STREAM_BYTES, error_message, for_each_data, preview};
use super::wire::{
    ChatRequest, Completion, Content, ContentPart, Message, ThinkingBlock, ToolCall, ToolChoice,
    UNSHOWN_IMAGE, Usage,
};
use super::{LlmBackend, LlmError};

/// The API version every request names; the wire shapes here are this version's.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// How long a prompt-cache entry lives after its last use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CacheTtl {
    /// Five minutes, the API's default; a write costs 1.25 times a normal input token.
    #[default]
    FiveMinutes,
    /// One hour (`"ttl": "1h"`), for chats quieter than every five minutes; a write costs
    /// twice a normal input token.
    OneHour,
}

/// Where and how to reach Anthropic's Messages API.
#[derive(Clone)]
pub struct AnthropicConfig {
    /// API root without the version path, e.g. `https://api.anthropic.com`; a trailing
    /// slash is ignored.
    pub base_url: String,
    /// Sent as `x-api-key` when set (and not empty). Never logged.
    pub api_key: Option<SecretString>,
    /// Limit for one whole attempt: connecting, waiting, and reading the entire stream.
    pub request_timeout: Duration,
    /// Limit for establishing the TCP/TLS connection.
    pub connect_timeout: Duration,
    /// Longest silence tolerated between two pieces of the response body (the API pings
    /// every few seconds while it thinks).
    pub idle_timeout: Duration,
    /// Retries used by [`AnthropicClient::with_retries`].
    pub retry: RetryPolicy,
    /// The answer's token limit when a request sets none: the API requires one.
    pub max_tokens: u32,
    /// Extended thinking's token budget; `None` leaves thinking off. The API wants at
    /// least 1024.
    pub thinking_budget: Option<u32>,
    /// How long the cached prompt prefix lives.
    pub cache_ttl: CacheTtl,
    /// Extra headers sent with every request (`anthropic-beta`...). Values are treated as
    /// secrets: never logged.
    pub extra_headers: Vec<(String, String)>,
}

impl Default for AnthropicConfig {
    fn default() -> Self {
        AnthropicConfig {
            base_url: "https://api.anthropic.com".to_owned(),
            api_key: None,
            request_timeout: Duration::from_secs(300),
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            retry: RetryPolicy::default(),
            max_tokens: 4096,
            thinking_budget: None,
            cache_ttl: CacheTtl::FiveMinutes,
            extra_headers: Vec::new(),
        }
    }
}

impl fmt::Debug for AnthropicConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let header_names: Vec<&str> = self.extra_headers.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("AnthropicConfig")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "[redacted]"))
            .field("request_timeout", &self.request_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("idle_timeout", &self.idle_timeout)
            .field("retry", &self.retry)
            .field("max_tokens", &self.max_tokens)
            .field("thinking_budget", &self.thinking_budget)
            .field("cache_ttl", &self.cache_ttl)
            .field("extra_headers", &header_names)
            .finish()
    }
}

/// The HTTP implementation of [`LlmBackend`] for Anthropic's Messages API. One attempt
/// per call; wrap it in [`Retrying`] (see [`AnthropicClient::with_retries`]) for retries.
#[derive(Clone)]
pub struct AnthropicClient {
    http: Arc<Poster>,
    config: Arc<AnthropicConfig>,
    // Timeouts and secrets, shared with every body stream in flight.
    transport: Arc<Transport>,
}

impl fmt::Debug for AnthropicClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AnthropicClient")
            .field("url", &self.http.url())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl AnthropicClient {
    /// Builds the HTTP client for `config`.
    ///
    /// # Errors
    /// [`LlmError::Connect`] when an extra header or the API key cannot be sent as an HTTP
    /// header, or the TLS backend cannot be set up.
    pub fn new(config: AnthropicConfig) -> Result<Self, LlmError> {
        let mut headers = HeaderMap::new();
        for (name, value) in &config.extra_headers {
            let header_name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| LlmError::Connect(format!("invalid extra header name {name:?}")))?;
            let mut header_value = HeaderValue::from_str(value).map_err(|_| {
                LlmError::Connect(format!("the value of extra header {name:?} is not valid"))
            })?;
            header_value.set_sensitive(true);
            headers.insert(header_name, header_value);
        }
        headers.insert(
            HeaderName::from_static("anthropic-version"),
            HeaderValue::from_static(ANTHROPIC_VERSION),
        );
        if let Some(key) = config
            .api_key
            .as_ref()
            .map(ExposeSecret::expose_secret)
            .filter(|k| !k.is_empty())
        {
            let mut value = HeaderValue::from_str(key).map_err(|_| {
                LlmError::Connect("the API key contains characters not allowed in a header".into())
            })?;
            value.set_sensitive(true);
            headers.insert(HeaderName::from_static("x-api-key"), value);
        }
        let url = format!("{}/v1/messages", config.base_url.trim_end_matches('/'));
        let http = Arc::new(Poster::new(url, headers, config.connect_timeout)?);
        let transport = Arc::new(Transport {
            connect_timeout: config.connect_timeout,
            request_timeout: config.request_timeout,
            idle_timeout: config.idle_timeout,
            secrets: config
                .api_key
                .iter()
                .cloned()
                .chain(
                    config
                        .extra_headers
                        .iter()
                        .map(|(_, v)| SecretString::from(v.as_str())),
                )
                .collect(),
        });
        Ok(AnthropicClient {
            http,
            config: Arc::new(config),
            transport,
        })
    }

    /// The client wrapped in [`Retrying`] with `config.retry` — what the daemon uses.
    ///
    /// # Errors
    /// As [`AnthropicClient::new`].
    pub fn with_retries(config: AnthropicConfig) -> Result<Retrying<AnthropicClient>, LlmError> {
        let policy = config.retry.clone();
        Ok(Retrying::new(Self::new(config)?, policy))
    }

    /// The settings this client was built with.
    pub fn config(&self) -> &AnthropicConfig {
        &self.config
    }

    /// The URL requests are POSTed to.
    pub fn endpoint(&self) -> &str {
        self.http.url()
    }

    /// Exactly the JSON body POSTed for `request` under this client's settings (see the
    /// module documentation for the mapping).
    pub fn request_body(&self, request: &ChatRequest) -> Value {
        request_body(&self.config, request)
    }

    /// One attempt, without the overall timeout and cancellation (see `stream`).
    async fn attempt(&self, request: &ChatRequest) -> Result<Completion, LlmError> {
        let body = serde_json::to_vec(&self.request_body(request))
            .map_err(|e| LlmError::Malformed(format!("cannot write the request body: {e}")))?;
        let response = self
            .http
            .post(body)
            .await
            .map_err(|e| self.transport.error(e))?;
        if !response.status.is_success() {
            return Err(self.transport.status_error(response).await);
        }
        let is_json = response.is_json();
        let bytes = self.transport.body_stream(response.body, None);
        if is_json {
            return Err(self.json_error(bytes).await);
        }
        assemble(bytes).await.map_err(|e| match e {
            LlmError::Stream(message) => LlmError::Stream(self.transport.redact(&message)),
            LlmError::Interrupted(message) => {
                LlmError::Interrupted(self.transport.redact(&message))
            }
            other => other,
        })
    }

    /// A 200 with a JSON body where events were asked for: a proxy reporting an error
    /// without an HTTP status. Nothing else is expected there.
    async fn json_error(&self, bytes: impl Stream<Item = Result<Bytes, LlmError>>) -> LlmError {
        let mut bytes = std::pin::pin!(bytes);
        let mut body = Vec::new();
        while let Some(piece) = bytes.next().await {
            match piece {
                Ok(piece) => body.extend_from_slice(&piece),
                Err(e) => return e,
            }
            if body.len() > MAX_STREAM_BYTES {
                break;
            }
        }
        let text = String::from_utf8_lossy(&body);
        match serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v.get("error").cloned())
        {
            Some(error) => stream_error(&error, |m| self.transport.redact(m)),
            None => LlmError::Malformed(format!(
                "a JSON answer where events were expected: {}",
                preview(&self.transport.redact(&text))
            )),
        }
    }
}

#[async_trait]
impl LlmBackend for AnthropicClient {
    async fn stream(
        &self,
        request: &ChatRequest,
        cancel: &CancellationToken,
    ) -> Result<Completion, LlmError> {
        if cancel.is_cancelled() {
            return Err(LlmError::Cancelled);
        }
        let started = tokio::time::Instant::now();
        let timeout = self.config.request_timeout;
        // A cancel drops the attempt with whatever it had assembled: no partial tool call
        // ever leaves this function.
        let result = tokio::select! {
            biased;
            () = cancel.cancelled() => Err(LlmError::Cancelled),
            r = tokio::time::timeout(timeout, self.attempt(request)) => {
                r.unwrap_or(Err(LlmError::Timeout(timeout)))
            }
        };
        let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        match &result {
            Ok(c) => tracing::debug!(
                model = %request.model,
                elapsed_ms,
                finish_reason = c.finish_reason.as_deref().unwrap_or(""),
                tool_calls = c.tool_calls.len(),
                prompt_tokens = c.usage.as_ref().map_or(0, |u| u.prompt_tokens),
                cache_read_tokens = c.usage.as_ref().map_or(0, |u| u.cache_read_tokens),
                cache_write_tokens = c.usage.as_ref().map_or(0, |u| u.cache_write_tokens),
                completion_tokens = c.usage.as_ref().map_or(0, |u| u.completion_tokens),
                "LLM completion"
            ),
            Err(e) => {
                tracing::debug!(model = %request.model, elapsed_ms, error = %e, "LLM request failed")
            }
        }
        result
    }
}

// ---------------------------------------------------------------------------------------
// The request
// ---------------------------------------------------------------------------------------

/// The body for `request` under `config`.
fn request_body(config: &AnthropicConfig, request: &ChatRequest) -> Value {
    let request = request.wire_form();
    let thinking = config.thinking_budget;
    let cache_control = match config.cache_ttl {
        CacheTtl::FiveMinutes => json!({"type": "ephemeral"}),
        CacheTtl::OneHour => json!({"type": "ephemeral", "ttl": "1h"}),
    };

    let mut system: Vec<Value> = Vec::new();
    let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for message in &request.messages {
        let (role, blocks) = match message {
            Message::System { content } => {
                if !content.is_empty() {
                    system.push(json!({"type": "text", "text": content}));
                }
                continue;
            }
            Message::User { content } => ("user", user_blocks(content)),
            Message::Assistant {
                content,
                tool_calls,
                thinking: thought,
                ..
            } => {
                let mut blocks = Vec::new();
                if thinking.is_some() {
                    blocks.extend(thought.iter().filter_map(|t| serde_json::to_value(t).ok()));
                }
                if let Some(text) = content.as_deref().filter(|t| !t.is_empty()) {
                    blocks.push(json!({"type": "text", "text": text}));
                }
                blocks.extend(tool_calls.iter().map(tool_use));
                ("assistant", blocks)
            }
            Message::Tool {
                tool_call_id,
                content,
            } => (
                "user",
                vec![json!({
                    "type": "tool_result",
                    "tool_use_id": tool_call_id,
                    "content": content,
                })],
            ),
        };
        if blocks.is_empty() {
            continue;
        }
        match turns.last_mut() {
            Some((last, merged)) if *last == role => merged.extend(blocks),
            _ => turns.push((role, blocks)),
        }
    }

    // The newest user message: its last block ends the conversation cached so far.
    if let Some(block) = turns
        .iter_mut()
        .rev()
        .find(|(role, _)| *role == "user")
        .and_then(|(_, blocks)| blocks.last_mut())
    {
        block["cache_control"] = cache_control.clone();
    }
    if let Some(block) = system.last_mut() {
        block["cache_control"] = cache_control.clone();
    }

    let answer_limit = request.max_completion_tokens.unwrap_or(config.max_tokens);
    let mut body = Map::new();
    body.insert("model".into(), json!(request.model));
    body.insert(
        "max_tokens".into(),
        json!(answer_limit.saturating_add(thinking.unwrap_or(0))),
    );
    body.insert("stream".into(), json!(true));
    if !system.is_empty() {
        body.insert("system".into(), Value::Array(system));
    }
    body.insert(
        "messages".into(),
        turns
            .into_iter()
            .map(|(role, content)| json!({"role": role, "content": content}))
            .collect(),
    );
    if !request.tools.is_empty() {
        let mut tools: Vec<Value> = request
            .tools
            .iter()
            .map(|t| {
                json!({
                    "name": t.function.name,
                    "description": t.function.description,
                    "input_schema": t.function.parameters,
                })
            })
            .collect();
        if let Some(last) = tools.last_mut() {
            last["cache_control"] = cache_control;
        }
        body.insert("tools".into(), Value::Array(tools));
        if let Some(choice) = tool_choice(&request, thinking.is_some()) {
            body.insert("tool_choice".into(), choice);
        }
    }
    if let Some(budget) = thinking {
        body.insert(
            "thinking".into(),
            json!({"type": "enabled", "budget_tokens": budget}),
        );
    } else if let Some(t) = request.temperature {
        // f32 -> JSON goes through f64 and would send 0.699999988079071 for 0.7.
        if let Some(n) = t
            .to_string()
            .parse::<f64>()
            .ok()
            .and_then(serde_json::Number::from_f64)
        {
            body.insert("temperature".into(), Value::Number(n));
        }
    }
    Value::Object(body)
}

/// The content blocks of a user message.
fn user_blocks(content: &Content) -> Vec<Value> {
    let text = |t: &str| (!t.is_empty()).then(|| json!({"type": "text", "text": t}));
    match content {
        Content::Text(t) => text(t).into_iter().collect(),
        Content::Parts(parts) => parts
            .iter()
            .filter_map(|part| match part {
                ContentPart::Text { text: t } => text(t),
                ContentPart::ImageUrl { image_url } => Some(image(&image_url.url)),
                // `wire_form` has replaced these already; the same text, should one remain.
                ContentPart::ImageRef { .. } => text(UNSHOWN_IMAGE),
            })
            .collect(),
    }
}

/// An image block: `data:<media type>;base64,<data>` inline, any other URL by reference.
fn image(url: &str) -> Value {
    let inline = url
        .strip_prefix("data:")
        .and_then(|rest| rest.split_once(','))
        .and_then(|(meta, data)| {
            let media_type = meta.strip_suffix(";base64")?;
            Some(json!({"type": "base64", "media_type": media_type, "data": data}))
        });
    let source = inline.unwrap_or_else(|| json!({"type": "url", "url": url}));
    json!({"type": "image", "source": source})
}

/// A `tool_use` block for a call; see the module documentation for arguments that are not
/// an object.
fn tool_use(call: &ToolCall) -> Value {
    let input = match serde_json::from_str::<Value>(&call.function.arguments) {
        Ok(object @ Value::Object(_)) => object,
        _ => json!({}),
    };
    json!({
        "type": "tool_use",
        "id": call.id,
        "name": call.function.name,
        "input": input,
    })
}

/// The `tool_choice` object; `None` leaves the API's default (`auto`).
fn tool_choice(request: &ChatRequest, thinking: bool) -> Option<Value> {
    let mut choice = match request.tool_choice.as_ref()? {
        ToolChoice::None => return Some(json!({"type": "none"})),
        ToolChoice::Auto => json!({"type": "auto"}),
        // The API refuses a forced tool call with thinking on.
        ToolChoice::Required if thinking => json!({"type": "auto"}),
        ToolChoice::Required => json!({"type": "any"}),
    };
    if request.parallel_tool_calls == Some(false) {
        choice["disable_parallel_tool_use"] = json!(true);
    }
    Some(choice)
}

// ---------------------------------------------------------------------------------------
// The answer
// ---------------------------------------------------------------------------------------

/// Accumulates the events of one streamed message.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MessageAssembler {
    blocks: BTreeMap<u64, Block>,
    usage: Option<RawUsage>,
    stop_reason: Option<String>,
    events: usize,
    stopped: bool,
}

/// One content block as it grows.
#[derive(Debug, Clone, PartialEq)]
enum Block {
    Text(String),
    ToolUse {
        id: String,
        name: String,
        /// The `input` of `content_block_start`: used only when no `partial_json` came.
        start: Value,
        json: String,
    },
    Thinking {
        thinking: String,
        signature: String,
    },
    Redacted(String),
    /// A block parlor does not use (server tools' results, say).
    Other,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
struct RawUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
}

impl RawUsage {
    /// `message_delta` carries the counts again, cumulatively; the ones it has win.
    fn update(&mut self, newer: RawUsage) {
        self.input_tokens = newer.input_tokens.or(self.input_tokens);
        self.output_tokens = newer.output_tokens.or(self.output_tokens);
        self.cache_read_input_tokens = newer
            .cache_read_input_tokens
            .or(self.cache_read_input_tokens);
        self.cache_creation_input_tokens = newer
            .cache_creation_input_tokens
            .or(self.cache_creation_input_tokens);
    }

    fn to_usage(&self) -> Usage {
        let read = self.cache_read_input_tokens.unwrap_or(0);
        let write = self.cache_creation_input_tokens.unwrap_or(0);
        let prompt = self.input_tokens.unwrap_or(0) + read + write;
        let completion = self.output_tokens.unwrap_or(0);
        Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt + completion,
            cache_read_tokens: read,
            cache_write_tokens: write,
        }
    }
}

// The events, typed: unknown event, block and delta types are skipped (the API documents
// that new ones may appear), a known one of the wrong shape is malformed.

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Event {
    MessageStart {
        message: StartMessage,
    },
    ContentBlockStart {
        index: u64,
        content_block: StartBlock,
    },
    ContentBlockDelta {
        index: u64,
        delta: Delta,
    },
    ContentBlockStop {},
    MessageDelta {
        #[serde(default)]
        delta: Option<MessageDelta>,
        #[serde(default)]
        usage: Option<RawUsage>,
    },
    MessageStop {},
    Ping {},
    Error {
        error: Value,
    },
    #[serde(other)]
    Unknown,
}

#[derive(Deserialize)]
struct StartMessage {
    #[serde(default)]
    usage: Option<RawUsage>,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum StartBlock {
    Text {
        #[serde(default)]
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        #[serde(default)]
        input: Value,
    },
    Thinking {
        #[serde(default)]
        thinking: String,
        #[serde(default)]
        signature: String,
    },
    RedactedThinking {
        data: String,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Delta {
    #[serde(rename = "text_delta")]
    Text { text: String },
    #[serde(rename = "input_json_delta")]
    InputJson {
        #[serde(default)]
        partial_json: String,
    },
    #[serde(rename = "thinking_delta")]
    Thinking { thinking: String },
    #[serde(rename = "signature_delta")]
    Signature { signature: String },
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
struct MessageDelta {
    #[serde(default)]
    stop_reason: Option<String>,
}

impl MessageAssembler {
    /// An assembler that has seen nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Consumes the `data` of one event. Returns `Ok(true)` once `message_stop` has arrived
    /// (later data is ignored).
    ///
    /// # Errors
    /// [`LlmError::Stream`] or [`LlmError::Interrupted`] for an `error` event (see the module
    /// documentation), [`LlmError::Malformed`] for data that is not an event.
    pub fn push_data(&mut self, data: &str) -> Result<bool, LlmError> {
        if self.stopped {
            return Ok(true);
        }
        let data = data.trim();
        if data.is_empty() {
            return Ok(false);
        }
        let event: Event = serde_json::from_str(data).map_err(|e| {
            LlmError::Malformed(format!("not a Messages API event ({e}): {}", preview(data)))
        })?;
        self.events += 1;
        match event {
            Event::MessageStart { message } => {
                // A second start (a proxy that retried upstream) begins the message anew.
                *self = MessageAssembler {
                    events: self.events,
                    usage: message.usage,
                    ..MessageAssembler::default()
                };
            }
            Event::ContentBlockStart {
                index,
                content_block,
            } => {
                let block = match content_block {
                    StartBlock::Text { text } => Block::Text(text),
                    StartBlock::ToolUse { id, name, input } => Block::ToolUse {
                        id,
                        name,
                        start: input,
                        json: String::new(),
                    },
                    StartBlock::Thinking {
                        thinking,
                        signature,
                    } => Block::Thinking {
                        thinking,
                        signature,
                    },
                    StartBlock::RedactedThinking { data } => Block::Redacted(data),
                    StartBlock::Other => Block::Other,
                };
                self.blocks.insert(index, block);
            }
            Event::ContentBlockDelta { index, delta } => self.apply(index, delta),
            Event::MessageDelta { delta, usage } => {
                if let Some(reason) = delta.and_then(|d| d.stop_reason) {
                    self.stop_reason = Some(reason);
                }
                if let Some(usage) = usage {
                    self.usage
                        .get_or_insert_with(RawUsage::default)
                        .update(usage);
                }
            }
            Event::MessageStop {} => {
                self.stopped = true;
                return Ok(true);
            }
            Event::Error { error } => return Err(stream_error(&error, str::to_owned)),
            Event::ContentBlockStop {} | Event::Ping {} | Event::Unknown => {}
        }
        Ok(false)
    }

    fn apply(&mut self, index: u64, delta: Delta) {
        let block = self.blocks.get_mut(&index);
        match (block, delta) {
            (Some(Block::Text(text)), Delta::Text { text: more }) => text.push_str(&more),
            // Text for a block that never started: still text.
            (None, Delta::Text { text }) => {
                self.blocks.insert(index, Block::Text(text));
            }
            (Some(Block::ToolUse { json, .. }), Delta::InputJson { partial_json }) => {
                json.push_str(&partial_json);
            }
            (Some(Block::Thinking { thinking, .. }), Delta::Thinking { thinking: more }) => {
                thinking.push_str(&more);
            }
            (Some(Block::Thinking { signature, .. }), Delta::Signature { signature: s }) => {
                signature.push_str(&s);
            }
            // A delta that does not fit its block (or a block parlor skips): nothing to keep.
            _ => {}
        }
    }

    /// Whether `message_stop` has arrived.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// How many events were consumed.
    pub fn events(&self) -> usize {
        self.events
    }

    /// The completion assembled so far.
    pub fn completion(&self) -> Completion {
        let mut completion = Completion {
            usage: self.usage.as_ref().map(RawUsage::to_usage),
            finish_reason: self.stop_reason.as_deref().map(finish_reason),
            ..Completion::default()
        };
        let mut reasoning = Vec::new();
        for block in self.blocks.values() {
            match block {
                Block::Text(text) => completion.content.push_str(text),
                Block::ToolUse {
                    id,
                    name,
                    start,
                    json,
                } => {
                    let arguments = if !json.is_empty() {
                        json.clone()
                    } else if start.as_object().is_some_and(|o| !o.is_empty()) {
                        start.to_string()
                    } else {
                        "{}".to_owned()
                    };
                    completion
                        .tool_calls
                        .push(ToolCall::new(id.clone(), name.clone(), arguments));
                }
                Block::Thinking {
                    thinking,
                    signature,
                } => {
                    reasoning.push(thinking.as_str());
                    completion.thinking.push(ThinkingBlock::Thinking {
                        thinking: thinking.clone(),
                        signature: signature.clone(),
                    });
                }
                Block::Redacted(data) => completion
                    .thinking
                    .push(ThinkingBlock::RedactedThinking { data: data.clone() }),
                Block::Other => {}
            }
        }
        completion.reasoning = reasoning.join("\n\n");
        completion
    }
}

/// parlor's finish reason (OpenAI's words) for Anthropic's stop reason.
fn finish_reason(stop_reason: &str) -> String {
    match stop_reason {
        "end_turn" | "stop_sequence" => "stop",
        "tool_use" => "tool_calls",
        "max_tokens" | "model_context_window_exceeded" => "length",
        "refusal" => "content_filter",
        other => other,
    }
    .to_owned()
}

/// The error for an `error` event's (or body's) `error` object; see the module
/// documentation for which are retryable.
fn stream_error(error: &Value, redact: impl Fn(&str) -> String) -> LlmError {
    let message = redact(&error_message(error));
    match error.get("type").and_then(Value::as_str) {
        Some("overloaded_error" | "api_error" | "rate_limit_error") => {
            LlmError::Interrupted(message)
        }
        _ => LlmError::Stream(message),
    }
}

/// Reads a Messages API event stream to `message_stop` and returns the completion.
/// Chunk boundaries may fall anywhere, also inside a UTF-8 character.
///
/// # Errors
/// The transport's own error, converted; an `error` event's error; [`LlmError::Malformed`]
/// for data that is not an event, more than [`MAX_STREAM_BYTES`], or a stream without any
/// event (bytes that are not UTF-8 are read as U+FFFD); [`LlmError::Interrupted`] for a
/// stream that ended before `message_stop`.
pub async fn assemble<S, E>(bytes: S) -> Result<Completion, LlmError>
where
    S: Stream<Item = Result<Bytes, E>>,
    E: Into<LlmError>,
{
    let mut assembler = MessageAssembler::new();
    if for_each_data(bytes, |data| assembler.push_data(data)).await? {
        return Ok(assembler.completion());
    }
    if assembler.events() == 0 {
        return Err(LlmError::Malformed(
            "empty response: the stream ended before any event".to_owned(),
        ));
    }
    Err(LlmError::Interrupted(
        "the stream ended before message_stop".to_owned(),
    ))
}
