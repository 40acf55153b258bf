//! A scripted, in-process fake of an OpenAI-compatible chat-completions API.
//!
//! [`FakeLlm::start`] binds `127.0.0.1:0` and serves `POST /v1/chat/completions`
//! (and `POST /chat/completions`, so a client's base URL may or may not end in
//! `/v1`). Each request consumes the next scripted [`Reply`] in FIFO order; when
//! the script is empty the optional responder closure
//! ([`FakeLlm::respond_with`]) answers, and without one the request gets a
//! `500` with `{"error":{"message":"fake llm: no scripted reply left"}}`.
//! Every chat request is recorded ([`FakeLlm::requests`]), including the
//! unscripted ones, so tests can see unexpected extra calls.
//!
//! Streaming requests (`"stream": true`) are answered with Server-Sent Events
//! framed like OpenAI's: one `data: {chunk}\n\n` per chunk, a usage chunk with
//! empty `choices` only when the request set
//! `stream_options.include_usage: true`, then `data: [DONE]\n\n`. Other
//! requests get a single `chat.completion` JSON object.
//!
//! ```
//! use std::time::Duration;
//! use parlor_testkit::{FakeLlm, Reply, ToolCallSpec};
//! use serde_json::json;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let fake = FakeLlm::start().await;
//! fake.push_tool_call("call_1", "todo_list", json!({"op": "list"}));
//! fake.push(Reply::text("done").usage(120, 4));
//! fake.push(Reply::status(429).retry_after(2));
//! // Point the client under test at `fake.base_url()` and run it, then:
//! assert!(fake.wait_for_requests(0, Duration::from_secs(1)).await.is_ok());
//! assert_eq!(fake.pending_replies(), 3);
//! # }
//! ```
//!
//! Avoid `#[tokio::test(start_paused = true)]` with this fake: with a paused
//! clock tokio may jump time forward while real socket I/O is still in flight,
//! which fires timeouts early.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::net::SocketAddr;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::server::{self, Server, WaitTimeout, at_least};

/// Usage numbers reported when a [`Reply`] does not set them with
/// [`Reply::usage`]: `(prompt_tokens, completion_tokens)`.
const DEFAULT_USAGE: (u64, u64) = (10, 5);

/// How many pieces streamed text and tool-call arguments are split into (at
/// most; short strings give fewer pieces).
const PIECES: usize = 3;

/// Model name echoed when a request has no `model` string.
const DEFAULT_MODEL: &str = "fake-model";

// ---------------------------------------------------------------------------
// Tool calls
// ---------------------------------------------------------------------------

/// One tool call the fake model makes, used by [`Reply::tool_calls`] and
/// [`Reply::text_and_tools`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCallSpec {
    /// The call id (`tool_calls[].id`), e.g. `"call_1"`.
    pub id: String,
    /// The function name (`tool_calls[].function.name`).
    pub name: String,
    /// The arguments exactly as sent on the wire (a JSON text, normally).
    pub arguments: String,
}

impl ToolCallSpec {
    /// A call whose arguments are `args` serialized as compact JSON.
    pub fn new(id: impl Into<String>, name: impl Into<String>, args: Value) -> Self {
        Self::raw(id, name, args.to_string())
    }

    /// A call whose arguments are sent exactly as `arguments`, which need not be JSON (a
    /// model that writes broken or cut-off arguments).
    pub fn raw(
        id: impl Into<String>,
        name: impl Into<String>,
        arguments: impl Into<String>,
    ) -> Self {
        Self {
            id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
        }
    }
}

// ---------------------------------------------------------------------------
// Replies
// ---------------------------------------------------------------------------

/// One scripted answer of the fake server, consumed by exactly one request.
///
/// Build it with a constructor ([`Reply::text`], [`Reply::tool_calls`],
/// [`Reply::text_and_tools`], [`Reply::status`], [`Reply::raw_sse`],
/// [`Reply::stream_error`], [`Reply::stall_after_first_chunk`]) and adjust it
/// with the builder methods. Builder methods that do not apply to a reply's
/// kind are documented as no-ops for it.
#[derive(Debug, Clone)]
pub struct Reply {
    kind: Kind,
    usage: (u64, u64),
    cached: u64,
    delay: Option<Duration>,
    chunk_delay: Option<Duration>,
    retry_after: Option<u64>,
}

#[derive(Debug, Clone)]
enum Kind {
    Completion(Completion),
    Status { code: u16, body: Option<Value> },
    RawSse(String),
}

#[derive(Debug, Clone, Default)]
struct Completion {
    text: String,
    calls: Vec<ToolCallSpec>,
    error: Option<String>,
    stall: bool,
    finish_reason: Option<String>,
    cut: bool,
}

impl Reply {
    fn completion(c: Completion) -> Self {
        Self::with_kind(Kind::Completion(c))
    }

    fn with_kind(kind: Kind) -> Self {
        Self {
            kind,
            usage: DEFAULT_USAGE,
            cached: 0,
            delay: None,
            chunk_delay: None,
            retry_after: None,
        }
    }

    /// An assistant text answer. Streamed as a few content chunks (the first
    /// also carries `role: "assistant"`), then `finish_reason: "stop"`, the
    /// usage chunk (if requested) and `data: [DONE]`.
    pub fn text(text: impl Into<String>) -> Self {
        Self::completion(Completion {
            text: text.into(),
            ..Completion::default()
        })
    }

    /// An answer consisting of tool calls only. Each call is streamed by its
    /// `index`: a first delta with `id`, `type: "function"` and the function
    /// name (empty arguments), then the arguments split across several
    /// deltas; then `finish_reason: "tool_calls"`, usage (if requested) and
    /// `data: [DONE]`.
    pub fn tool_calls(calls: Vec<ToolCallSpec>) -> Self {
        Self::completion(Completion {
            calls,
            ..Completion::default()
        })
    }

    /// Text content followed by tool calls in the same answer (content chunks
    /// first, then the calls as in [`Reply::tool_calls`]).
    pub fn text_and_tools(text: impl Into<String>, calls: Vec<ToolCallSpec>) -> Self {
        Self::completion(Completion {
            text: text.into(),
            calls,
            ..Completion::default()
        })
    }

    /// An HTTP error response with status `code` (an invalid code becomes
    /// 500). The JSON body defaults to
    /// `{"error":{"message":"fake llm: status CODE","type":"fake_error","code":CODE}}`;
    /// see [`Reply::body`] and [`Reply::retry_after`].
    pub fn status(code: u16) -> Self {
        Self::with_kind(Kind::Status { code, body: None })
    }

    /// A `200 text/event-stream` response whose body is exactly `sse`, for
    /// hand-written or deliberately malformed streams. Sent as-is even to
    /// non-streaming requests.
    pub fn raw_sse(sse: impl Into<String>) -> Self {
        Self::with_kind(Kind::RawSse(sse.into()))
    }

    /// A stream that starts normally (a `role: "assistant"` chunk) and then
    /// carries `data: {"error":{"message":MESSAGE,"type":"server_error","code":null}}`
    /// and ends, without a finish reason or `[DONE]`. A non-streaming request
    /// gets HTTP 500 with that error object instead.
    pub fn stream_error(message: impl Into<String>) -> Self {
        Self::completion(Completion {
            error: Some(message.into()),
            ..Completion::default()
        })
    }

    /// A stream that sends one chunk (`role: "assistant"`, empty content) and
    /// then sends nothing more until the client disconnects or the fake shuts
    /// down (then the body ends without `[DONE]`). A non-streaming request
    /// gets no answer until shutdown, then 503. See also [`Reply::then_stall`].
    pub fn stall_after_first_chunk() -> Self {
        Self::completion(Completion {
            stall: true,
            ..Completion::default()
        })
    }

    /// OpenAI's answer to a request longer than the model's context window: HTTP 400 with
    /// `{"error":{"message":"This model's maximum context length is ...","type":
    /// "invalid_request_error","param":"messages","code":"context_length_exceeded"}}`.
    pub fn context_length_exceeded() -> Self {
        Self::status(400).body(json!({"error": {
            "message": "This model's maximum context length is 128000 tokens. However, your \
                        messages resulted in 130001 tokens. Please reduce the length of the \
                        messages.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }}))
    }

    /// Sets the reported usage (`total_tokens` is their sum). Defaults to
    /// `(10, 5)`. No-op for status and raw replies.
    pub fn usage(mut self, prompt_tokens: u64, completion_tokens: u64) -> Self {
        self.usage = (prompt_tokens, completion_tokens);
        self
    }

    /// Sets the prompt tokens reported as read from the provider's cache
    /// (`prompt_tokens_details.cached_tokens`, part of the prompt tokens). Defaults to
    /// none (the field is left out). No-op for status and raw replies.
    pub fn cached(mut self, tokens: u64) -> Self {
        self.cached = tokens;
        self
    }

    /// Waits `delay` (with `tokio::time::sleep`) before sending the response
    /// headers. Applies to every kind of reply. Cut short by shutdown (the
    /// request then gets 503).
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self
    }

    /// Waits `delay` between consecutive SSE chunks, so clients observe a
    /// real incremental stream. No-op for status, raw and non-streaming
    /// replies.
    pub fn chunk_delay(mut self, delay: Duration) -> Self {
        self.chunk_delay = Some(delay);
        self
    }

    /// Adds a `Retry-After: SECS` header to the response (any kind, though it
    /// is meant for [`Reply::status`]).
    pub fn retry_after(mut self, secs: u64) -> Self {
        self.retry_after = Some(secs);
        self
    }

    /// Replaces the JSON body of a [`Reply::status`] response. No-op for other
    /// kinds.
    pub fn body(mut self, body: Value) -> Self {
        if let Kind::Status { body: b, .. } = &mut self.kind {
            *b = Some(body);
        }
        self
    }

    /// Sends only this reply's first chunk (which carries the first piece of
    /// the text, or the first tool call's name), then stalls like
    /// [`Reply::stall_after_first_chunk`]. No-op for status and raw replies.
    pub fn then_stall(mut self) -> Self {
        if let Kind::Completion(c) = &mut self.kind {
            c.stall = true;
        }
        self
    }

    /// Replaces the `finish_reason` of the final chunk (normally `stop`, or `tool_calls` when
    /// the reply has calls), e.g. `"length"` for an answer cut at the output token limit
    /// (give the calls cut-off arguments with [`ToolCallSpec::raw`]). No-op for status and
    /// raw replies.
    pub fn finish_reason(mut self, reason: impl Into<String>) -> Self {
        if let Kind::Completion(c) = &mut self.kind {
            c.finish_reason = Some(reason.into());
        }
        self
    }

    /// Streams this reply's content and tool-call chunks, then the first half of the bytes
    /// of the chunk with the finish reason, then breaks the connection (the chunked body
    /// never ends properly): a stream that stops inside an SSE event. No-op for status, raw
    /// and non-streaming replies.
    pub fn cut_mid_event(mut self) -> Self {
        if let Kind::Completion(c) = &mut self.kind {
            c.cut = true;
        }
        self
    }

    /// Streams this reply's content and tool-call chunks, then the error
    /// event of [`Reply::stream_error`] instead of a finish reason, usage and
    /// `[DONE]`. No-op for status and raw replies.
    pub fn then_stream_error(mut self, message: impl Into<String>) -> Self {
        if let Kind::Completion(c) = &mut self.kind {
            c.error = Some(message.into());
        }
        self
    }
}

// ---------------------------------------------------------------------------
// Recorded requests
// ---------------------------------------------------------------------------

/// One chat-completions request as the fake server received it.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    /// The request path, e.g. `/v1/chat/completions`.
    pub path: String,
    /// All request headers, names lower-cased; repeated headers are joined
    /// with `", "`.
    pub headers: BTreeMap<String, String>,
    /// The parsed JSON body. If the body was not valid JSON this is a
    /// `Value::String` with the raw body (lossy UTF-8) and the request was
    /// answered with 400 without consuming a scripted reply.
    pub body: Value,
}

impl RecordedRequest {
    /// A header's value by case-insensitive name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(String::as_str)
    }

    /// The `Authorization` header, e.g. `"Bearer sk-test"`.
    pub fn authorization(&self) -> Option<&str> {
        self.header("authorization")
    }

    /// The body's `model` field.
    pub fn model(&self) -> Option<&str> {
        self.body.get("model").and_then(Value::as_str)
    }

    /// Whether the body asked for a stream (`"stream": true`).
    pub fn is_stream(&self) -> bool {
        self.body.get("stream").and_then(Value::as_bool) == Some(true)
    }

    /// The body's `messages` array (empty if missing).
    pub fn messages(&self) -> &[Value] {
        self.body
            .get("messages")
            .and_then(Value::as_array)
            .map_or(&[], Vec::as_slice)
    }

    /// The names of the functions offered in the body's `tools` array, in
    /// order.
    pub fn tool_names(&self) -> Vec<String> {
        self.body
            .get("tools")
            .and_then(Value::as_array)
            .map(|tools| {
                tools
                    .iter()
                    .filter_map(|t| t.pointer("/function/name").and_then(Value::as_str))
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The text of the last `user` message; see [`last_user_text`].
    pub fn last_user_text(&self) -> Option<String> {
        last_user_text(&self.body)
    }
}

/// The text of the last message with `role: "user"` in a chat-completions
/// request body. String content is returned as is; array content (content
/// parts) has its `text` parts joined with `"\n"`. Handy in
/// [`FakeLlm::respond_with`] closures, e.g. to echo the user.
pub fn last_user_text(body: &Value) -> Option<String> {
    let messages = body.get("messages")?.as_array()?;
    let last = messages
        .iter()
        .rev()
        .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))?;
    match last.get("content")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(parts) => Some(
            parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n"),
        ),
        _ => None,
    }
}

// ---------------------------------------------------------------------------
// Server
// ---------------------------------------------------------------------------

type Responder = Arc<dyn Fn(&Value) -> Reply + Send + Sync>;

#[derive(Default)]
struct Script {
    replies: VecDeque<Reply>,
    responder: Option<Responder>,
    requests: Vec<RecordedRequest>,
}

struct Shared {
    script: Mutex<Script>,
    recorded: Notify,
    cancel: CancellationToken,
    dropped_streams: Arc<AtomicUsize>,
    next_id: AtomicU64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Script> {
        server::lock(&self.script)
    }
}

/// A running fake OpenAI-compatible chat-completions server.
///
/// The server runs on a tokio task owned by this value; it stops on
/// [`FakeLlm::shutdown`] or when the value is dropped. All methods except
/// `start`, `wait_for_requests` and `shutdown` are synchronous and never
/// block on the network.
pub struct FakeLlm {
    shared: Arc<Shared>,
    addr: SocketAddr,
    server: Server,
}

impl fmt::Debug for FakeLlm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeLlm")
            .field("addr", &self.addr)
            .field("pending_replies", &self.pending_replies())
            .field("request_count", &self.request_count())
            .finish_non_exhaustive()
    }
}

impl FakeLlm {
    /// Starts the server on `127.0.0.1:0`.
    ///
    /// # Panics
    /// If no local port can be bound.
    pub async fn start() -> Self {
        let (listener, addr) = server::loopback("llm").await;
        Self::serve(listener, addr)
    }

    /// Starts the server on `127.0.0.1:port`, e.g. on a port a client was already pointed
    /// at while nothing listened there (a model server that comes back).
    ///
    /// # Panics
    /// If the port cannot be bound.
    pub async fn start_at(port: u16) -> Self {
        let listener = tokio::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, port))
            .await
            .unwrap_or_else(|e| panic!("fake llm: cannot bind 127.0.0.1:{port}: {e}"));
        let addr = SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port));
        Self::serve(listener, addr)
    }

    fn serve(listener: tokio::net::TcpListener, addr: SocketAddr) -> Self {
        let shared = Arc::new(Shared {
            script: Mutex::new(Script::default()),
            recorded: Notify::new(),
            cancel: CancellationToken::new(),
            dropped_streams: Arc::new(AtomicUsize::new(0)),
            next_id: AtomicU64::new(1),
        });
        let app = Router::new()
            .route("/v1/chat/completions", post(chat_completions))
            .route("/chat/completions", post(chat_completions))
            .fallback(unknown_path)
            .layer(DefaultBodyLimit::disable())
            .with_state(Arc::clone(&shared));
        let mut server = Server::new(shared.cancel.clone());
        server.serve(listener, app);
        Self {
            shared,
            addr,
            server,
        }
    }

    /// The base URL to configure a client with: `http://127.0.0.1:PORT/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The bound socket address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Appends a reply to the script; requests consume replies in FIFO order.
    pub fn push(&self, reply: Reply) {
        self.shared.lock().replies.push_back(reply);
    }

    /// Shorthand for `push(Reply::text(text))`.
    pub fn push_text(&self, text: impl Into<String>) {
        self.push(Reply::text(text));
    }

    /// Shorthand for a reply with a single tool call:
    /// `push(Reply::tool_calls(vec![ToolCallSpec::new(id, name, args)]))`.
    pub fn push_tool_call(&self, id: impl Into<String>, name: impl Into<String>, args: Value) {
        self.push(Reply::tool_calls(vec![ToolCallSpec::new(id, name, args)]));
    }

    /// Shorthand for a reply with a single tool call whose arguments are sent exactly as
    /// `arguments` (see [`ToolCallSpec::raw`]).
    pub fn push_tool_call_raw(
        &self,
        id: impl Into<String>,
        name: impl Into<String>,
        arguments: impl Into<String>,
    ) {
        self.push(Reply::tool_calls(vec![ToolCallSpec::raw(
            id, name, arguments,
        )]));
    }

    /// Answers requests with `responder(&body)` whenever the script is empty
    /// (scripted replies still take precedence). Replaces any previous
    /// responder. A panicking responder yields a 500 for that request.
    pub fn respond_with<F>(&self, responder: F)
    where
        F: Fn(&Value) -> Reply + Send + Sync + 'static,
    {
        self.shared.lock().responder = Some(Arc::new(responder));
    }

    /// Removes the responder set by [`FakeLlm::respond_with`].
    pub fn clear_responder(&self) {
        self.shared.lock().responder = None;
    }

    /// How many scripted replies have not been consumed yet.
    pub fn pending_replies(&self) -> usize {
        self.shared.lock().replies.len()
    }

    /// All chat-completions requests received so far, oldest first.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.lock().requests.clone()
    }

    /// The most recent request, if any.
    pub fn last_request(&self) -> Option<RecordedRequest> {
        self.shared.lock().requests.last().cloned()
    }

    /// How many chat-completions requests were received so far.
    pub fn request_count(&self) -> usize {
        self.shared.lock().requests.len()
    }

    /// Waits until at least `n` requests were received, then returns all
    /// recorded requests; gives up after `timeout`.
    pub async fn wait_for_requests(
        &self,
        n: usize,
        timeout: Duration,
    ) -> Result<Vec<RecordedRequest>, WaitTimeout> {
        server::wait_until("llm", &self.shared.recorded, timeout, || {
            at_least(&self.shared.lock().requests, n, "request(s)")
        })
        .await
    }

    /// How many streamed response bodies were dropped before they finished,
    /// i.e. the client disconnected mid-stream (for example from a stalled
    /// reply). Hyper notices a disconnect asynchronously, so poll this with a
    /// timeout.
    pub fn dropped_streams(&self) -> usize {
        self.shared.dropped_streams.load(Ordering::SeqCst)
    }

    /// Stops the server: ends stalled and delayed responses, closes
    /// connections and waits (bounded) for the server task to finish.
    pub async fn shutdown(mut self) {
        self.server.shutdown().await;
    }
}

// ---------------------------------------------------------------------------
// Handlers
// ---------------------------------------------------------------------------

fn error_json(status: StatusCode, message: &str) -> Response {
    (
        status,
        axum::Json(json!({"error": {"message": message, "type": "fake_error"}})),
    )
        .into_response()
}

async fn unknown_path(uri: Uri) -> Response {
    error_json(
        StatusCode::NOT_FOUND,
        &format!(
            "fake llm: unknown path {}; serving POST /v1/chat/completions and /chat/completions",
            uri.path()
        ),
    )
}

enum Next {
    Reply(Reply),
    Responder(Responder),
    Nothing,
}

async fn chat_completions(
    State(shared): State<Arc<Shared>>,
    uri: Uri,
    headers: HeaderMap,
    raw: Bytes,
) -> Response {
    let parsed = serde_json::from_slice::<Value>(&raw);
    let body = match &parsed {
        Ok(v) => v.clone(),
        Err(_) => Value::String(String::from_utf8_lossy(&raw).into_owned()),
    };
    let record = RecordedRequest {
        path: uri.path().to_owned(),
        headers: header_map(&headers),
        body,
    };
    let next = {
        let mut script = shared.lock();
        script.requests.push(record);
        if parsed.is_err() {
            Next::Nothing
        } else if let Some(reply) = script.replies.pop_front() {
            Next::Reply(reply)
        } else if let Some(responder) = &script.responder {
            Next::Responder(Arc::clone(responder))
        } else {
            Next::Nothing
        }
    };
    shared.recorded.notify_waiters();

    let body = match parsed {
        Ok(v) => v,
        Err(e) => {
            return error_json(
                StatusCode::BAD_REQUEST,
                &format!("fake llm: request body is not JSON: {e}"),
            );
        }
    };
    let reply = match next {
        Next::Reply(reply) => reply,
        Next::Responder(responder) => match catch_unwind(AssertUnwindSafe(|| responder(&body))) {
            Ok(reply) => reply,
            Err(_) => {
                return error_json(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "fake llm: responder panicked",
                );
            }
        },
        Next::Nothing => {
            return error_json(
                StatusCode::INTERNAL_SERVER_ERROR,
                "fake llm: no scripted reply left",
            );
        }
    };

    if let Some(delay) = reply.delay {
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = shared.cancel.cancelled() => {
                return error_json(StatusCode::SERVICE_UNAVAILABLE, "fake llm: shutting down");
            }
        }
    }

    let mut response = render(&shared, &body, &reply).await;
    if let Some(secs) = reply.retry_after {
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(secs));
    }
    response
}

pub(crate) fn header_map(headers: &HeaderMap) -> BTreeMap<String, String> {
    let mut map = BTreeMap::<String, String>::new();
    for (name, value) in headers {
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        map.entry(name.as_str().to_owned())
            .and_modify(|v| {
                v.push_str(", ");
                v.push_str(&value);
            })
            .or_insert(value);
    }
    map
}

/// Per-response values shared by all chunks.
struct Ctx {
    id: String,
    created: u64,
    model: String,
}

impl Ctx {
    fn chunk(&self, delta: Value, finish_reason: Option<&str>) -> Value {
        json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        })
    }
}

fn usage_json((prompt, completion, cached): (u64, u64, u64)) -> Value {
    let mut usage = json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    });
    if cached > 0 {
        usage["prompt_tokens_details"] = json!({"cached_tokens": cached});
    }
    usage
}

fn stream_error_json(message: &str) -> Value {
    json!({"error": {"message": message, "type": "server_error", "code": null}})
}

async fn render(shared: &Shared, body: &Value, reply: &Reply) -> Response {
    let completion = match &reply.kind {
        Kind::Status { code, body } => {
            let status = StatusCode::from_u16(*code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let body = body.clone().unwrap_or_else(|| {
                json!({"error": {
                    "message": format!("fake llm: status {}", status.as_u16()),
                    "type": "fake_error",
                    "code": status.as_u16(),
                }})
            });
            return (status, axum::Json(body)).into_response();
        }
        Kind::RawSse(raw) => return sse_response(Body::from(raw.clone())),
        Kind::Completion(c) => c,
    };

    let ctx = Ctx {
        id: format!(
            "chatcmpl-fake-{}",
            shared.next_id.fetch_add(1, Ordering::Relaxed)
        ),
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        model: body
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or(DEFAULT_MODEL)
            .to_owned(),
    };
    let stream = body.get("stream").and_then(Value::as_bool) == Some(true);
    if !stream {
        let usage = (reply.usage.0, reply.usage.1, reply.cached);
        return plain_completion(shared, &ctx, completion, usage).await;
    }

    let include_usage = body
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        == Some(true);
    let usage = (reply.usage.0, reply.usage.1, reply.cached);
    let mut events = sse_events(&ctx, completion, usage, include_usage);
    if completion.stall {
        events.truncate(1);
    }
    let state = BodyState {
        events: events.into(),
        stall: completion.stall,
        cut: completion.cut,
        chunk_delay: reply.chunk_delay,
        sent: 0,
        cancel: shared.cancel.clone(),
        guard: DropGuard {
            finished: false,
            dropped: Arc::clone(&shared.dropped_streams),
        },
    };
    sse_response(Body::from_stream(futures::stream::unfold(
        state, next_event,
    )))
}

fn sse_response(body: Body) -> Response {
    (
        [
            (CONTENT_TYPE, HeaderValue::from_static("text/event-stream")),
            (CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        body,
    )
        .into_response()
}

fn data_event(value: &Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

/// Splits `s` into at most [`PIECES`] non-empty pieces on char boundaries.
fn split_pieces(s: &str) -> Vec<&str> {
    let chars = s.chars().count();
    if chars == 0 {
        return Vec::new();
    }
    let per_piece = chars.div_ceil(PIECES);
    let mut pieces = Vec::with_capacity(PIECES);
    let mut rest = s;
    while !rest.is_empty() {
        let cut = rest
            .char_indices()
            .nth(per_piece)
            .map_or(rest.len(), |(i, _)| i);
        let (piece, tail) = rest.split_at(cut);
        pieces.push(piece);
        rest = tail;
    }
    pieces
}

fn sse_events(
    ctx: &Ctx,
    c: &Completion,
    usage: (u64, u64, u64),
    include_usage: bool,
) -> Vec<Bytes> {
    let mut deltas: Vec<Value> = Vec::new();
    for piece in split_pieces(&c.text) {
        deltas.push(json!({"content": piece}));
    }
    for (index, call) in c.calls.iter().enumerate() {
        deltas.push(json!({"tool_calls": [{
            "index": index,
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }]}));
        for piece in split_pieces(&call.arguments) {
            deltas.push(json!({"tool_calls": [{
                "index": index,
                "function": {"arguments": piece},
            }]}));
        }
    }
    match deltas.first_mut() {
        Some(Value::Object(first)) => {
            first.insert("role".into(), json!("assistant"));
            if !first.contains_key("content") {
                first.insert("content".into(), Value::Null);
            }
        }
        _ => deltas.insert(0, json!({"role": "assistant", "content": ""})),
    }

    let mut events: Vec<Bytes> = deltas
        .into_iter()
        .map(|delta| data_event(&ctx.chunk(delta, None)))
        .collect();
    if let Some(message) = &c.error {
        events.push(data_event(&stream_error_json(message)));
        return events;
    }
    let finish = finish_reason(c);
    let finish_event = data_event(&ctx.chunk(json!({}), Some(finish)));
    if c.cut {
        events.push(finish_event.slice(..finish_event.len() / 2));
        return events;
    }
    events.push(finish_event);
    if include_usage {
        events.push(data_event(&json!({
            "id": ctx.id,
            "object": "chat.completion.chunk",
            "created": ctx.created,
            "model": ctx.model,
            "choices": [],
            "usage": usage_json(usage),
        })));
    }
    events.push(Bytes::from_static(b"data: [DONE]\n\n"));
    events
}

fn finish_reason(c: &Completion) -> &str {
    if let Some(reason) = &c.finish_reason {
        reason
    } else if c.calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    }
}

async fn plain_completion(
    shared: &Shared,
    ctx: &Ctx,
    c: &Completion,
    usage: (u64, u64, u64),
) -> Response {
    if let Some(message) = &c.error {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            axum::Json(stream_error_json(message)),
        )
            .into_response();
    }
    if c.stall {
        shared.cancel.cancelled().await;
        return error_json(StatusCode::SERVICE_UNAVAILABLE, "fake llm: shutting down");
    }
    let mut message = json!({
        "role": "assistant",
        "content": if c.text.is_empty() && !c.calls.is_empty() { Value::Null } else { json!(c.text) },
    });
    if !c.calls.is_empty() {
        message["tool_calls"] = c
            .calls
            .iter()
            .map(|call| {
                json!({
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                })
            })
            .collect();
    }
    axum::Json(json!({
        "id": ctx.id,
        "object": "chat.completion",
        "created": ctx.created,
        "model": ctx.model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason(c)}],
        "usage": usage_json(usage),
    }))
    .into_response()
}

// ---------------------------------------------------------------------------
// Streaming body
// ---------------------------------------------------------------------------

/// Counts a streamed body as dropped unless it ran to its end.
struct DropGuard {
    finished: bool,
    dropped: Arc<AtomicUsize>,
}

impl Drop for DropGuard {
    fn drop(&mut self) {
        if !self.finished {
            self.dropped.fetch_add(1, Ordering::SeqCst);
        }
    }
}

struct BodyState {
    events: VecDeque<Bytes>,
    stall: bool,
    /// Break the connection once the events are sent ([`Reply::cut_mid_event`]).
    cut: bool,
    chunk_delay: Option<Duration>,
    sent: usize,
    cancel: CancellationToken,
    guard: DropGuard,
}

async fn next_event(mut st: BodyState) -> Option<(Result<Bytes, std::io::Error>, BodyState)> {
    let Some(event) = st.events.pop_front() else {
        if st.cut {
            // An error from the body makes hyper drop the connection without ending the
            // chunked body: to the client, the stream breaks off.
            st.cut = false;
            // Pending once, so that hyper flushes what was sent before it sees the error.
            tokio::task::yield_now().await;
            let broken = std::io::Error::new(std::io::ErrorKind::ConnectionAborted, "cut");
            return Some((Err(broken), st));
        }
        if st.stall {
            // Hyper drops the body (and this future) when the client goes
            // away; shutdown ends the body.
            st.cancel.cancelled().await;
        }
        st.guard.finished = true;
        return None;
    };
    if st.sent > 0
        && let Some(delay) = st.chunk_delay
    {
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = st.cancel.cancelled() => {
                st.guard.finished = true;
                return None;
            }
        }
    }
    st.sent += 1;
    Some((Ok(event), st))
}
