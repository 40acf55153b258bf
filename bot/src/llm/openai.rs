//! The OpenAI-compatible streaming client: one POST to `{base_url}/chat/completions` per
//! [`LlmBackend::stream`] call, read as server-sent events and assembled by
//! [`assemble`].
//!
//! The client makes exactly one attempt; retrying is the job of the [`Retrying`] decorator,
//! which [`OpenAiClient::with_retries`] puts around it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use secrecy::SecretString;
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use super::body;
use super::http::{FirstPiece, Poster, Transport};
pub use super::retry::{RetryPolicy, Retrying};
use super::stream::{MAX_STREAM_BYTES, StreamAssembler, assemble, error_message};
use super::wire::{ChatRequest, Completion};
use super::{LlmBackend, LlmError};

/// Where and how to reach an OpenAI-compatible server.
#[derive(Clone)]
pub struct OpenAiConfig {
    /// API root including the version, e.g. `https://api.openai.com/v1`; a trailing slash is
    /// ignored.
    pub base_url: String,
    /// Sent as `Authorization: Bearer ...` when set (and not empty). Never logged.
    pub api_key: Option<SecretString>,
    /// Limit for one whole attempt once the answer has begun (connecting and waiting for
    /// the first byte fall under `first_byte_timeout`, on top of this).
    pub request_timeout: Duration,
    /// Longest wait for the answer to begin (the model reads the whole prompt first).
    /// `None`: sized for the endpoint ([`first_byte_timeout`]).
    pub first_byte_timeout: Option<Duration>,
    /// Limit for establishing the TCP/TLS connection.
    pub connect_timeout: Duration,
    /// Longest silence tolerated between two pieces of the response body.
    pub idle_timeout: Duration,
    /// Retries used by [`OpenAiClient::with_retries`].
    pub retry: RetryPolicy,
    /// Extra headers sent with every request (`api-key` for Azure, `HTTP-Referer` for
    /// OpenRouter...). Values are treated as secrets: never logged.
    pub extra_headers: Vec<(String, String)>,
}

impl Default for OpenAiConfig {
    fn default() -> Self {
        OpenAiConfig {
            base_url: "https://api.openai.com/v1".to_owned(),
            api_key: None,
            request_timeout: Duration::from_secs(120),
            first_byte_timeout: None,
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            retry: RetryPolicy::default(),
            extra_headers: Vec::new(),
        }
    }
}

impl fmt::Debug for OpenAiConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let header_names: Vec<&str> = self.extra_headers.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("OpenAiConfig")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "[redacted]"))
            .field("request_timeout", &self.request_timeout)
            .field("first_byte_timeout", &self.first_byte_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("idle_timeout", &self.idle_timeout)
            .field("retry", &self.retry)
            .field("extra_headers", &header_names)
            .finish()
    }
}

/// The HTTP implementation of [`LlmBackend`] for OpenAI-compatible servers. One attempt
/// per call; wrap it in [`Retrying`] (see [`OpenAiClient::with_retries`]) for retries.
#[derive(Clone)]
pub struct OpenAiClient {
    http: Arc<Poster>,
    config: Arc<OpenAiConfig>,
    // Timeouts and secrets, shared with every body stream in flight.
    transport: Arc<Transport>,
    /// The system prompts' JSON, written once (`body.rs`).
    system: Arc<body::SystemCache>,
    /// The wait for the answer to begin, as configured or sized for the endpoint.
    first_byte: Duration,
    /// The endpoint is on this machine or network (see [`is_local_endpoint`]).
    local: bool,
}

/// The wait for a local model server's answer to begin when none is configured: a small
/// model on two CPU cores reads a prompt of 5,000 tokens in one to two minutes, a larger one
/// in several.
pub const LOCAL_FIRST_BYTE: Duration = Duration::from_secs(600);

/// Whether `base_url` names a server on this machine or its network (loopback, a private,
/// link-local or shared address, `localhost`, a `.local`, `.lan`, `.internal` or dotless
/// name): a slow answer there is a model still reading the prompt, not a provider in
/// trouble.
pub fn is_local_endpoint(base_url: &str) -> bool {
    let Ok(url) = reqwest::Url::parse(base_url) else {
        return false;
    };
    let Some(host) = url.host_str() else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    match host.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(ip)) => {
            ip.is_loopback()
                || ip.is_private()
                || ip.is_link_local()
                // 100.64.0.0/10: carrier-grade NAT, and the addresses of VPN meshes.
                || (ip.octets()[0] == 100 && (ip.octets()[1] & 0xc0) == 64)
        }
        Ok(std::net::IpAddr::V6(ip)) => {
            ip.is_loopback() || ip.is_unique_local() || ip.is_unicast_link_local()
        }
        Err(_) => {
            let name = host.trim_end_matches('.').to_ascii_lowercase();
            !name.contains('.')
                || [".localhost", ".local", ".lan", ".internal", ".home.arpa"]
                    .iter()
                    .any(|suffix| name.ends_with(suffix))
        }
    }
}

impl fmt::Debug for OpenAiClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiClient")
            .field("url", &self.http.url())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl OpenAiClient {
    /// Builds the HTTP client for `config`.
    ///
    /// # Errors
    /// [`LlmError::Connect`] when an extra header or the API key cannot be sent as an HTTP
    /// header, or the TLS backend cannot be set up.
    pub fn new(config: OpenAiConfig) -> Result<Self, LlmError> {
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
        super::http::bearer(&mut headers, config.api_key.as_ref())?;
        let url = format!("{}/chat/completions", config.base_url.trim_end_matches('/'));
        let http = Arc::new(Poster::new(url, headers, config.connect_timeout)?);
        let local = is_local_endpoint(&config.base_url);
        let first_byte = config.first_byte_timeout.unwrap_or(if local {
            LOCAL_FIRST_BYTE
        } else {
            config.idle_timeout
        });
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
        Ok(OpenAiClient {
            http,
            config: Arc::new(config),
            transport,
            system: Arc::default(),
            first_byte,
            local,
        })
    }

    /// The client wrapped in [`Retrying`] with `config.retry` — what the daemon uses.
    ///
    /// # Errors
    /// As [`OpenAiClient::new`].
    pub fn with_retries(config: OpenAiConfig) -> Result<Retrying<OpenAiClient>, LlmError> {
        let policy = config.retry.clone();
        Ok(Retrying::new(Self::new(config)?, policy))
    }

    /// The settings this client was built with.
    pub fn config(&self) -> &OpenAiConfig {
        &self.config
    }

    /// The URL requests are POSTed to.
    pub fn endpoint(&self) -> &str {
        self.http.url()
    }

    /// Exactly the JSON body POSTed for `request`: its fields, plus `"stream": true` and
    /// `"stream_options": {"include_usage": true}`. Without tools, `tools`, `tool_choice`
    /// and `parallel_tool_calls` are left out (OpenAI answers 400 to `parallel_tool_calls`
    /// without `tools`). parlor's own content parts never appear in it (see
    /// [`ChatRequest::wire_form`]), nor do an assistant message's Anthropic thinking blocks.
    pub fn request_body(request: &ChatRequest) -> Value {
        let mut body = match serde_json::to_value(&*request.wire_form()) {
            Ok(Value::Object(map)) => map,
            // Unreachable for these types (string keys only); an empty body is refused by
            // the server with a clear 400 rather than crashing the daemon.
            Ok(_) | Err(_) => {
                tracing::error!("could not serialize the chat request");
                Map::new()
            }
        };
        if request.tools.is_empty() {
            for key in ["tools", "tool_choice", "parallel_tool_calls"] {
                body.remove(key);
            }
        }
        // Anthropic's thinking blocks ride along in history; they mean nothing to an
        // OpenAI-compatible server, and strict ones refuse unknown fields.
        if let Some(Value::Array(messages)) = body.get_mut("messages") {
            for message in messages.iter_mut().filter_map(Value::as_object_mut) {
                message.remove("thinking");
            }
        }
        // f32 -> JSON goes through f64 and would send 0.699999988079071 for 0.7.
        if let Some(t) = request.temperature
            && let Some(n) = t
                .to_string()
                .parse::<f64>()
                .ok()
                .and_then(serde_json::Number::from_f64)
        {
            body.insert("temperature".to_owned(), Value::Number(n));
        }
        body.insert("stream".to_owned(), Value::Bool(true));
        body.insert("stream_options".to_owned(), json!({"include_usage": true}));
        Value::Object(body)
    }

    /// [`OpenAiClient::request_body`] serialized, byte for byte, but written from `request`
    /// directly (see `body.rs`): what [`LlmBackend::stream`] POSTs.
    pub fn request_bytes(request: &ChatRequest) -> Vec<u8> {
        body::write(request).unwrap_or_else(|e| {
            // Unreachable for these types, as in `request_body`.
            tracing::error!(error = %e, "could not serialize the chat request");
            serde_json::to_vec(&Self::request_body(request)).unwrap_or_default()
        })
    }

    /// The error of an answer that did not begin within `first_byte`: on a local server
    /// one that is not retried (see [`LlmError::NoAnswerYet`]).
    fn no_answer(&self) -> LlmError {
        if self.local {
            LlmError::NoAnswerYet(self.first_byte)
        } else {
            LlmError::Timeout(self.first_byte)
        }
    }

    /// One attempt, without the overall timeout and cancellation (see `stream`).
    async fn attempt(&self, request: &ChatRequest) -> Result<Completion, LlmError> {
        let body = body::write_with(request, Some(&self.system)).unwrap_or_else(|e| {
            // Unreachable for these types, as in `request_body`.
            tracing::error!(error = %e, "could not serialize the chat request");
            serde_json::to_vec(&Self::request_body(request))
                .unwrap_or_default()
                .into()
        });
        let sent = tokio::time::Instant::now();
        let response = tokio::time::timeout(self.first_byte, self.http.post(body))
            .await
            .map_err(|_| self.no_answer())?
            .map_err(|e| self.transport.error(e))?;
        if !response.status.is_success() {
            return Err(self.transport.status_error(response).await);
        }
        let is_json = response.is_json();
        // Some servers send the headers at once and the first token when it is ready. A
        // remote server that sent its headers still gets a whole idle window for it, as
        // before the first-byte limit existed.
        let left = self.first_byte.saturating_sub(sent.elapsed());
        let first = FirstPiece {
            limit: if self.local {
                left
            } else {
                left.max(self.config.idle_timeout)
            },
            error: if self.local {
                LlmError::NoAnswerYet
            } else {
                LlmError::Timeout
            },
            reported: self.first_byte,
        };
        let bytes = self.transport.body_stream(response.body, Some(first));
        if is_json {
            return self.json_completion(bytes).await;
        }
        let assembler = assemble(bytes).await?;
        // Providers that never send `[DONE]` still end every choice with a finish reason;
        // a stream with neither was cut off, and its text would be half an answer.
        if !assembler.done()
            && assembler
                .completions()
                .values()
                .all(|c| c.finish_reason.is_none())
        {
            return Err(LlmError::Interrupted(
                "the stream ended without a finish reason or [DONE]".to_owned(),
            ));
        }
        Ok(assembler.finish())
    }

    /// A 200 with a JSON body: a server reporting an error without an HTTP status, or one
    /// that ignored `stream: true` and sent a whole `chat.completion`.
    async fn json_completion(
        &self,
        bytes: impl Stream<Item = Result<Bytes, LlmError>>,
    ) -> Result<Completion, LlmError> {
        let mut bytes = std::pin::pin!(bytes);
        let mut body = Vec::new();
        while let Some(piece) = bytes.next().await {
            body.extend_from_slice(&piece?);
            if body.len() > MAX_STREAM_BYTES {
                return Err(LlmError::Malformed(format!(
                    "the response exceeds {MAX_STREAM_BYTES} bytes"
                )));
            }
        }
        let text = String::from_utf8_lossy(&body);
        match serde_json::from_str::<Value>(&text) {
            Ok(value) => {
                if let Some(error) = value.get("error").filter(|e| !e.is_null()) {
                    return Err(LlmError::Stream(
                        self.transport.redact(&error_message(error)),
                    ));
                }
                let mut assembler = StreamAssembler::new();
                assembler.push_data(&text)?;
                if assembler.completions().is_empty() {
                    return Err(LlmError::Malformed(
                        "the JSON response holds no choices".to_owned(),
                    ));
                }
                Ok(assembler.finish())
            }
            // Mislabelled server-sent events.
            Err(_) if text.trim_start().starts_with("data:") => {
                let once = futures::stream::iter([Ok::<_, LlmError>(Bytes::from(body))]);
                Ok(assemble(once).await?.finish())
            }
            Err(e) => Err(LlmError::Malformed(format!(
                "the JSON response cannot be read: {e}"
            ))),
        }
    }
}

#[async_trait]
impl LlmBackend for OpenAiClient {
    async fn stream(
        &self,
        request: &ChatRequest,
        cancel: &CancellationToken,
    ) -> Result<Completion, LlmError> {
        if cancel.is_cancelled() {
            return Err(LlmError::Cancelled);
        }
        let started = tokio::time::Instant::now();
        let timeout = self.config.request_timeout + self.first_byte;
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

#[cfg(test)]
mod local_tests {
    use super::is_local_endpoint;

    #[test]
    fn endpoints_on_this_machine_or_network_are_local() {
        for url in [
            "http://127.0.0.1:8080/v1",
            "http://localhost:11434/v1",
            "http://[::1]:8000/v1",
            "http://192.168.1.20:8080/v1",
            "http://10.0.0.5/v1",
            "http://172.20.0.2:8000/v1",
            "http://100.101.102.103:11434/v1",
            "http://gpu-box:8080/v1",
            "http://ollama.local:11434/v1",
            "http://llm.internal/v1",
            "http://[fd00::5]/v1",
        ] {
            assert!(is_local_endpoint(url), "{url}");
        }
        for url in [
            "https://api.openai.com/v1",
            "https://openrouter.ai/api/v1",
            "http://8.8.8.8/v1",
            "http://172.32.0.1/v1",
            "not a url",
        ] {
            assert!(!is_local_endpoint(url), "{url}");
        }
    }
}
