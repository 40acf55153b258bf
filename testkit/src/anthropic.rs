//! A scripted, in-process fake of Anthropic's Messages API.
//!
//! [`FakeAnthropic::start`] binds `127.0.0.1:0` and serves `POST /v1/messages`. Each request
//! consumes the next scripted [`AnthropicReply`] in FIFO order; with none left it gets a
//! `500` with an `api_error`. Every request is recorded ([`FakeAnthropic::requests`]) with
//! its headers and JSON body, the unscripted ones too.
//!
//! Answers are streamed as the API streams them: `event: TYPE\ndata: JSON\n\n` for
//! `message_start` (with usage), a `ping`, one `content_block_start` / deltas /
//! `content_block_stop` per block (text in a few `text_delta`s, a tool call's input in a few
//! `input_json_delta`s, thinking in `thinking_delta`s then one `signature_delta`), then
//! `message_delta` (stop reason, output tokens) and `message_stop`. Builder methods script
//! the failures: an HTTP status (529 `overloaded_error` included), an `error` event inside
//! the stream, a stream cut before `message_stop`, a stream that stalls.
//!
//! ```
//! use std::time::Duration;
//! use parlor_testkit::{AnthropicReply, FakeAnthropic};
//! use serde_json::json;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let fake = FakeAnthropic::start().await;
//! fake.push(AnthropicReply::overloaded());
//! fake.push(AnthropicReply::thinking("Let me look.", "sig-1").tool_use("toolu_1", "todo_list", json!({})));
//! fake.push(AnthropicReply::text("done").cache(1200, 0));
//! // Point the client under test at `fake.base_url()` and run it, then:
//! assert!(fake.wait_for_requests(0, Duration::from_secs(1)).await.is_ok());
//! assert_eq!(fake.pending_replies(), 3);
//! # }
//! ```

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

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

use crate::llm::header_map;
use crate::server::{self, Server, WaitTimeout, at_least};

/// How many pieces streamed text, thinking and tool input are split into (at most).
const PIECES: usize = 3;

/// Model name echoed when a request has no `model` string.
const DEFAULT_MODEL: &str = "claude-fake";

/// One content block of a scripted answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlockSpec {
    /// Visible text.
    Text(String),
    /// A tool call; `input` is streamed as written, so it need not be JSON.
    ToolUse {
        /// The `toolu_...` id.
        id: String,
        /// The tool's name.
        name: String,
        /// The input JSON text, split across several `input_json_delta`s.
        input: String,
    },
    /// Extended thinking with its signature.
    Thinking {
        /// The thinking text.
        thinking: String,
        /// The signature, sent in one `signature_delta`.
        signature: String,
    },
    /// Redacted thinking, whole in its `content_block_start`.
    RedactedThinking(String),
}

/// Token counts of a scripted answer, as `message_start` and `message_delta` report them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnthropicUsage {
    /// `input_tokens`: the prompt tokens neither read from nor written to the cache.
    pub input: u64,
    /// `output_tokens`.
    pub output: u64,
    /// `cache_read_input_tokens`.
    pub cache_read: u64,
    /// `cache_creation_input_tokens`.
    pub cache_write: u64,
}

impl Default for AnthropicUsage {
    fn default() -> Self {
        AnthropicUsage {
            input: 10,
            output: 5,
            cache_read: 0,
            cache_write: 0,
        }
    }
}

/// One scripted answer, consumed by exactly one request.
#[derive(Debug, Clone)]
pub struct AnthropicReply {
    kind: Kind,
    usage: AnthropicUsage,
    retry_after: Option<u64>,
}

#[derive(Debug, Clone)]
enum Kind {
    Message(Script),
    Status { code: u16, body: Value },
    RawSse(String),
}

#[derive(Debug, Clone, Default)]
struct Script {
    blocks: Vec<BlockSpec>,
    stop_reason: Option<String>,
    /// `(type, message)` of an `error` event sent after the blocks, in place of the end.
    error: Option<(String, String)>,
    /// End the body after `message_delta`, without `message_stop`.
    cut: bool,
    /// Send only this many events, then nothing until the client goes away.
    stall_after: Option<usize>,
}

impl AnthropicReply {
    fn message(blocks: Vec<BlockSpec>) -> Self {
        AnthropicReply {
            kind: Kind::Message(Script {
                blocks,
                ..Script::default()
            }),
            usage: AnthropicUsage::default(),
            retry_after: None,
        }
    }

    /// An answer of these blocks, in order.
    pub fn blocks(blocks: Vec<BlockSpec>) -> Self {
        Self::message(blocks)
    }

    /// A text answer (`end_turn`).
    pub fn text(text: impl Into<String>) -> Self {
        Self::message(vec![BlockSpec::Text(text.into())])
    }

    /// An answer that is one tool call (`tool_use`) with `input` serialized.
    pub fn tool_call(id: impl Into<String>, name: impl Into<String>, input: Value) -> Self {
        Self::message(Vec::new()).tool_use(id, name, input)
    }

    /// An answer that begins with thinking signed `signature`; add text or tool calls with
    /// the builder methods.
    pub fn thinking(thinking: impl Into<String>, signature: impl Into<String>) -> Self {
        Self::message(vec![BlockSpec::Thinking {
            thinking: thinking.into(),
            signature: signature.into(),
        }])
    }

    /// An HTTP error with Anthropic's error body
    /// `{"type":"error","error":{"type":...,"message":...}}`, its type as the API names
    /// it for `code` (`invalid_request_error` for 400, `overloaded_error` for 529...).
    pub fn status(code: u16) -> Self {
        let kind = match code {
            400 => "invalid_request_error",
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            529 => "overloaded_error",
            _ => "api_error",
        };
        AnthropicReply {
            kind: Kind::Status {
                code,
                body: error_body(kind, &format!("fake anthropic: status {code}")),
            },
            usage: AnthropicUsage::default(),
            retry_after: None,
        }
    }

    /// HTTP 529 `overloaded_error`, as the API answers when it is overloaded.
    pub fn overloaded() -> Self {
        Self::status(529)
    }

    /// A `200 text/event-stream` whose body is exactly `sse` (a recorded stream, say).
    pub fn raw_sse(sse: impl Into<String>) -> Self {
        AnthropicReply {
            kind: Kind::RawSse(sse.into()),
            usage: AnthropicUsage::default(),
            retry_after: None,
        }
    }

    fn script(&mut self) -> Option<&mut Script> {
        match &mut self.kind {
            Kind::Message(script) => Some(script),
            Kind::Status { .. } | Kind::RawSse(_) => None,
        }
    }

    /// Adds a text block. No-op for status and raw replies.
    pub fn then_text(mut self, text: impl Into<String>) -> Self {
        if let Some(s) = self.script() {
            s.blocks.push(BlockSpec::Text(text.into()));
        }
        self
    }

    /// Adds a tool call with `input` serialized. No-op for status and raw replies.
    pub fn tool_use(self, id: impl Into<String>, name: impl Into<String>, input: Value) -> Self {
        self.tool_use_raw(id, name, input.to_string())
    }

    /// Adds a tool call whose input JSON is streamed exactly as `input` (empty: no
    /// `partial_json` at all). No-op for status and raw replies.
    pub fn tool_use_raw(
        mut self,
        id: impl Into<String>,
        name: impl Into<String>,
        input: impl Into<String>,
    ) -> Self {
        if let Some(s) = self.script() {
            s.blocks.push(BlockSpec::ToolUse {
                id: id.into(),
                name: name.into(),
                input: input.into(),
            });
        }
        self
    }

    /// Sets the usage reported: `input` uncached prompt tokens, `output` generated.
    pub fn usage(mut self, input: u64, output: u64) -> Self {
        self.usage.input = input;
        self.usage.output = output;
        self
    }

    /// Sets the prompt tokens read from and written to the cache.
    pub fn cache(mut self, read: u64, write: u64) -> Self {
        self.usage.cache_read = read;
        self.usage.cache_write = write;
        self
    }

    /// Replaces the stop reason (normally `end_turn`, or `tool_use` with tool calls).
    /// No-op for status and raw replies.
    pub fn stop_reason(mut self, reason: impl Into<String>) -> Self {
        if let Some(s) = self.script() {
            s.stop_reason = Some(reason.into());
        }
        self
    }

    /// After the blocks, an `event: error` with this error type (`overloaded_error`...)
    /// and message, and the body ends. No-op for status and raw replies.
    pub fn then_error(mut self, kind: impl Into<String>, message: impl Into<String>) -> Self {
        if let Some(s) = self.script() {
            s.error = Some((kind.into(), message.into()));
        }
        self
    }

    /// Ends the body after `message_delta`, without `message_stop`. No-op for status and
    /// raw replies.
    pub fn cut_before_stop(mut self) -> Self {
        if let Some(s) = self.script() {
            s.cut = true;
        }
        self
    }

    /// Sends only the first `events` events, then nothing more until the client goes
    /// away or the fake shuts down. No-op for status and raw replies.
    pub fn stall_after(mut self, events: usize) -> Self {
        if let Some(s) = self.script() {
            s.stall_after = Some(events);
        }
        self
    }

    /// Adds `retry-after: SECS` to the response.
    pub fn retry_after(mut self, secs: u64) -> Self {
        self.retry_after = Some(secs);
        self
    }
}

fn error_body(kind: &str, message: &str) -> Value {
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

/// One Messages request as the fake received it.
#[derive(Debug, Clone)]
pub struct AnthropicRequest {
    /// The request path, `/v1/messages`.
    pub path: String,
    /// All request headers, names lower-cased; repeated headers joined with `", "`.
    pub headers: BTreeMap<String, String>,
    /// The parsed JSON body; the raw body as a `Value::String` if it was not JSON (then
    /// answered with 400 and no scripted reply consumed).
    pub body: Value,
}

impl AnthropicRequest {
    /// A header's value by case-insensitive name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(String::as_str)
    }

    /// The body's `messages` array (empty if missing).
    pub fn messages(&self) -> &[Value] {
        self.body
            .get("messages")
            .and_then(Value::as_array)
            .map_or(&[], Vec::as_slice)
    }

    /// The body's `system` blocks (empty if missing).
    pub fn system(&self) -> &[Value] {
        self.body
            .get("system")
            .and_then(Value::as_array)
            .map_or(&[], Vec::as_slice)
    }

    /// The body's `tools` array (empty if missing).
    pub fn tools(&self) -> &[Value] {
        self.body
            .get("tools")
            .and_then(Value::as_array)
            .map_or(&[], Vec::as_slice)
    }

    /// Every JSON pointer in the body whose object carries `cache_control`, in document
    /// order, e.g. `/system/0`, `/tools/2`, `/messages/3/content/1`.
    pub fn cache_breakpoints(&self) -> Vec<String> {
        fn walk(value: &Value, at: String, out: &mut Vec<String>) {
            match value {
                Value::Object(map) => {
                    if map.contains_key("cache_control") {
                        out.push(at.clone());
                    }
                    // `system`, `messages`, `tools` in the order a reader expects.
                    for key in ["system", "tools", "messages", "content"] {
                        if let Some(v) = map.get(key) {
                            walk(v, format!("{at}/{key}"), out);
                        }
                    }
                }
                Value::Array(items) => {
                    for (i, item) in items.iter().enumerate() {
                        walk(item, format!("{at}/{i}"), out);
                    }
                }
                _ => {}
            }
        }
        let mut out = Vec::new();
        walk(&self.body, String::new(), &mut out);
        out
    }
}

#[derive(Default)]
struct Log {
    replies: VecDeque<AnthropicReply>,
    requests: Vec<AnthropicRequest>,
}

struct Shared {
    state: Mutex<Log>,
    recorded: Notify,
    cancel: CancellationToken,
    dropped_streams: Arc<AtomicUsize>,
    next_id: AtomicU64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Log> {
        server::lock(&self.state)
    }
}

/// A running fake of the Messages API. The server runs on a task owned by this value and
/// stops on [`FakeAnthropic::shutdown`] or when it is dropped.
pub struct FakeAnthropic {
    shared: Arc<Shared>,
    addr: SocketAddr,
    server: Server,
}

impl fmt::Debug for FakeAnthropic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeAnthropic")
            .field("addr", &self.addr)
            .field("pending_replies", &self.pending_replies())
            .finish_non_exhaustive()
    }
}

impl FakeAnthropic {
    /// Starts the server on `127.0.0.1:0`.
    ///
    /// # Panics
    /// If no local port can be bound.
    pub async fn start() -> Self {
        let (listener, addr) = server::loopback("anthropic").await;
        let shared = Arc::new(Shared {
            state: Mutex::new(Log::default()),
            recorded: Notify::new(),
            cancel: CancellationToken::new(),
            dropped_streams: Arc::new(AtomicUsize::new(0)),
            next_id: AtomicU64::new(1),
        });
        let app = Router::new()
            .route("/v1/messages", post(messages))
            .fallback(unknown_path)
            .layer(DefaultBodyLimit::disable())
            .with_state(Arc::clone(&shared));
        let mut server = Server::new(shared.cancel.clone());
        server.serve(listener, app);
        FakeAnthropic {
            shared,
            addr,
            server,
        }
    }

    /// The base URL to configure a client with: `http://127.0.0.1:PORT` (the client adds
    /// `/v1/messages`).
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Appends a reply to the script.
    pub fn push(&self, reply: AnthropicReply) {
        self.shared.lock().replies.push_back(reply);
    }

    /// How many scripted replies have not been consumed yet.
    pub fn pending_replies(&self) -> usize {
        self.shared.lock().replies.len()
    }

    /// Every request received so far, oldest first.
    pub fn requests(&self) -> Vec<AnthropicRequest> {
        self.shared.lock().requests.clone()
    }

    /// Waits until at least `n` requests were received, then returns them all; gives up
    /// after `timeout`.
    pub async fn wait_for_requests(
        &self,
        n: usize,
        timeout: Duration,
    ) -> Result<Vec<AnthropicRequest>, WaitTimeout> {
        server::wait_until("anthropic", &self.shared.recorded, timeout, || {
            at_least(&self.shared.lock().requests, n, "request(s)")
        })
        .await
    }

    /// How many streamed bodies were dropped before they ended (the client went away).
    /// Hyper notices a disconnect asynchronously, so wait for it with
    /// [`FakeAnthropic::wait_for_dropped_streams`].
    pub fn dropped_streams(&self) -> usize {
        self.shared.dropped_streams.load(Ordering::SeqCst)
    }

    /// Waits until at least `n` streamed bodies were dropped; gives up after `timeout`.
    pub async fn wait_for_dropped_streams(
        &self,
        n: usize,
        timeout: Duration,
    ) -> Result<usize, WaitTimeout> {
        server::wait_until("anthropic", &self.shared.recorded, timeout, || {
            let seen = self.dropped_streams();
            if seen >= n {
                Ok(seen)
            } else {
                Err((format!("{n} dropped stream(s)"), seen.to_string()))
            }
        })
        .await
    }

    /// Stops the server and waits (bounded) for it.
    pub async fn shutdown(mut self) {
        self.server.shutdown().await;
    }
}

async fn unknown_path(uri: Uri) -> Response {
    let body = error_body(
        "not_found_error",
        &format!(
            "fake anthropic: unknown path {}; serving POST /v1/messages",
            uri.path()
        ),
    );
    (StatusCode::NOT_FOUND, axum::Json(body)).into_response()
}

async fn messages(
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
    let reply = {
        let mut state = shared.lock();
        state.requests.push(AnthropicRequest {
            path: uri.path().to_owned(),
            headers: header_map(&headers),
            body: body.clone(),
        });
        if parsed.is_ok() {
            state.replies.pop_front()
        } else {
            None
        }
    };
    shared.recorded.notify_waiters();
    if let Err(e) = parsed {
        let body = error_body("invalid_request_error", &format!("body is not JSON: {e}"));
        return (StatusCode::BAD_REQUEST, axum::Json(body)).into_response();
    }
    let Some(reply) = reply else {
        let body = error_body("api_error", "fake anthropic: no scripted reply left");
        return (StatusCode::INTERNAL_SERVER_ERROR, axum::Json(body)).into_response();
    };
    let mut response = render(&shared, &body, &reply);
    if let Some(secs) = reply.retry_after {
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(secs));
    }
    response
}

fn render(shared: &Arc<Shared>, request: &Value, reply: &AnthropicReply) -> Response {
    let script = match &reply.kind {
        Kind::Status { code, body } => {
            let status = StatusCode::from_u16(*code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            return (status, axum::Json(body.clone())).into_response();
        }
        Kind::RawSse(raw) => return sse_response(Body::from(raw.clone())),
        Kind::Message(script) => script,
    };
    let id = format!("msg_fake{}", shared.next_id.fetch_add(1, Ordering::Relaxed));
    let model = request
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or(DEFAULT_MODEL);
    let mut events = events(&id, model, script, reply.usage);
    let stall = script.stall_after.is_some();
    if let Some(n) = script.stall_after {
        events.truncate(n);
    }
    let state = BodyState {
        events: events.into(),
        stall,
        cancel: shared.cancel.clone(),
        guard: DropGuard {
            finished: false,
            dropped: Arc::clone(&shared.dropped_streams),
            shared: Arc::clone(shared),
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

fn event(data: &Value) -> Bytes {
    let kind = data
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("unknown");
    Bytes::from(format!("event: {kind}\ndata: {data}\n\n"))
}

/// Splits `s` into at most [`PIECES`] non-empty pieces on char boundaries.
fn pieces(s: &str) -> Vec<&str> {
    let chars = s.chars().count();
    if chars == 0 {
        return Vec::new();
    }
    let per_piece = chars.div_ceil(PIECES);
    let mut out = Vec::with_capacity(PIECES);
    let mut rest = s;
    while !rest.is_empty() {
        let cut = rest
            .char_indices()
            .nth(per_piece)
            .map_or(rest.len(), |(i, _)| i);
        let (piece, tail) = rest.split_at(cut);
        out.push(piece);
        rest = tail;
    }
    out
}

fn events(id: &str, model: &str, script: &Script, usage: AnthropicUsage) -> Vec<Bytes> {
    let mut out = vec![
        event(&json!({"type": "message_start", "message": {
            "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": {
                "input_tokens": usage.input,
                "cache_creation_input_tokens": usage.cache_write,
                "cache_read_input_tokens": usage.cache_read,
                "output_tokens": 1,
            },
        }})),
        event(&json!({"type": "ping"})),
    ];
    for (index, block) in script.blocks.iter().enumerate() {
        let delta = |delta: Value| {
            event(&json!({"type": "content_block_delta", "index": index, "delta": delta}))
        };
        let start = match block {
            BlockSpec::Text(_) => json!({"type": "text", "text": ""}),
            BlockSpec::ToolUse { id, name, .. } => {
                json!({"type": "tool_use", "id": id, "name": name, "input": {}})
            }
            BlockSpec::Thinking { .. } => {
                json!({"type": "thinking", "thinking": "", "signature": ""})
            }
            BlockSpec::RedactedThinking(data) => json!({"type": "redacted_thinking", "data": data}),
        };
        out.push(event(
            &json!({"type": "content_block_start", "index": index, "content_block": start}),
        ));
        match block {
            BlockSpec::Text(text) => {
                for piece in pieces(text) {
                    out.push(delta(json!({"type": "text_delta", "text": piece})));
                }
            }
            BlockSpec::ToolUse { input, .. } => {
                for piece in pieces(input) {
                    out.push(delta(
                        json!({"type": "input_json_delta", "partial_json": piece}),
                    ));
                }
            }
            BlockSpec::Thinking {
                thinking,
                signature,
            } => {
                for piece in pieces(thinking) {
                    out.push(delta(json!({"type": "thinking_delta", "thinking": piece})));
                }
                out.push(delta(
                    json!({"type": "signature_delta", "signature": signature}),
                ));
            }
            BlockSpec::RedactedThinking(_) => {}
        }
        out.push(event(
            &json!({"type": "content_block_stop", "index": index}),
        ));
    }
    if let Some((kind, message)) = &script.error {
        out.push(event(&error_body(kind, message)));
        return out;
    }
    let stop_reason = script.stop_reason.clone().unwrap_or_else(|| {
        let calls = script
            .blocks
            .iter()
            .any(|b| matches!(b, BlockSpec::ToolUse { .. }));
        if calls { "tool_use" } else { "end_turn" }.to_owned()
    });
    out.push(event(&json!({
        "type": "message_delta",
        "delta": {"stop_reason": stop_reason, "stop_sequence": null},
        "usage": {"output_tokens": usage.output},
    })));
    if !script.cut {
        out.push(event(&json!({"type": "message_stop"})));
    }
    out
}

/// Counts a streamed body as dropped unless it ran to its end, and wakes the waits.
struct DropGuard {
    finished: bool,
    dropped: Arc<AtomicUsize>,
    shared: Arc<Shared>,
}

impl Drop for DropGuard {
    fn drop(&mut self) {
        if !self.finished {
            self.dropped.fetch_add(1, Ordering::SeqCst);
            self.shared.recorded.notify_waiters();
        }
    }
}

struct BodyState {
    events: VecDeque<Bytes>,
    stall: bool,
    cancel: CancellationToken,
    guard: DropGuard,
}

async fn next_event(mut st: BodyState) -> Option<(Result<Bytes, std::io::Error>, BodyState)> {
    if let Some(event) = st.events.pop_front() {
        return Some((Ok(event), st));
    }
    if st.stall {
        // Hyper drops the body (and this future) when the client goes away; shutdown
        // ends it.
        st.cancel.cancelled().await;
    }
    st.guard.finished = true;
    None
}
