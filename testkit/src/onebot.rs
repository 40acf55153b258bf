//! An in-process fake OneBot v11 implementation (a stand-in for NapCat and its kind), for
//! tests of bots speaking OneBot over WebSocket, in both directions.
//!
//! - **Forward**: [`FakeOneBot::start`] listens on `127.0.0.1` like NapCat's WebSocket
//!   server ([`FakeOneBot::ws_url`]); a client must present the access token as
//!   `Authorization: Bearer` or `?access_token=`, else the handshake is answered 401.
//! - **Reverse**: [`FakeOneBot::dial_reverse`] dials the bot's listener like NapCat's
//!   WebSocket client, with `X-Self-ID`, `X-Client-Role: Universal` and the token.
//!
//! Either way one connection carries events and actions. On connect the fake sends the
//! lifecycle `connect` event. Actions are answered by `echo`: `send_group_msg` and
//! `send_private_msg` (recorded, answered with a new `message_id`), `get_login_info`,
//! `get_msg`, `get_group_member_info` (roles from [`FakeOneBot::set_role`]), `get_image`;
//! anything else gets `retcode` 1404. [`FakeOneBot::fail_next`] scripts a `retcode`, or
//! a connection dropped before the answer. Events are built with
//! [`FakeOneBot::group_message`] / [`FakeOneBot::private_message`] (segments or, with
//! [`OneBotMessageBuilder::as_cq_string`], a CQ string), notices with
//! [`FakeOneBot::bot_joined`] / [`FakeOneBot::bot_kicked`], heartbeats with
//! [`FakeOneBot::heartbeat`]. Events pushed while nothing is connected wait for the next
//! connection (a real implementation would drop them), so a test never loses one to a
//! reconnect. Images are served over HTTP at [`FakeOneBot::add_image`]'s URLs.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::handshake::server::{
    ErrorResponse, Request, Response as WsResponse,
};
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_util::sync::CancellationToken;

use crate::WaitTimeout;
use crate::server::{self, Server, Unmet, at_least};

/// Why [`FakeOneBot::dial_reverse`] did not connect.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DialError {
    /// The bot answered the upgrade with this HTTP status (401, 403, 409).
    #[error("{0}")]
    Refused(u16),
    /// No answer to speak of: a bad URL or header, the connection failed.
    #[error("{0}")]
    Failed(String),
}

/// What the next call of an action does instead of succeeding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OneBotFailure {
    /// Answer `status: failed` with this `retcode` and `message`.
    Retcode(i64, String),
    /// Close the connection without answering (and without doing the action).
    Drop,
}

/// A message the bot sent (`send_group_msg` / `send_private_msg`).
#[derive(Debug, Clone)]
pub struct OneBotSent {
    /// The action.
    pub action: String,
    /// The group, for a group message.
    pub group_id: Option<i64>,
    /// The user, for a private message.
    pub user_id: Option<i64>,
    /// The `message` parameter as sent (segments, or a string).
    pub message: Value,
    /// The id the fake answered with.
    pub message_id: i64,
    /// When the fake received it.
    pub at: Instant,
}

impl OneBotSent {
    /// The segments of the message (a string message as one text segment).
    pub fn segments(&self) -> Vec<Value> {
        match &self.message {
            Value::Array(items) => items.clone(),
            Value::String(text) => vec![json!({"type": "text", "data": {"text": text}})],
            _ => Vec::new(),
        }
    }

    /// The text of its `text` segments, joined.
    pub fn text(&self) -> String {
        self.segments()
            .iter()
            .filter(|s| s["type"] == "text")
            .filter_map(|s| s["data"]["text"].as_str().map(str::to_owned))
            .collect()
    }

    /// The `id` of its `reply` segment.
    pub fn reply_to(&self) -> Option<String> {
        self.segment_param("reply", "id")
    }

    /// The `qq` of its first `at` segment.
    pub fn at(&self) -> Option<String> {
        self.segment_param("at", "qq")
    }

    fn segment_param(&self, kind: &str, key: &str) -> Option<String> {
        self.segments()
            .iter()
            .find(|s| s["type"] == kind)
            .and_then(|s| match &s["data"][key] {
                Value::String(text) => Some(text.clone()),
                Value::Number(n) => Some(n.to_string()),
                _ => None,
            })
    }
}

struct Connection {
    id: u64,
    tx: mpsc::UnboundedSender<WsMessage>,
}

#[derive(Default)]
struct Inner {
    connection: Option<Connection>,
    connections: u64,
    refused: u64,
    pending: VecDeque<Value>,
    pushed: Vec<Value>,
    calls: Vec<Value>,
    sent: Vec<OneBotSent>,
    failures: HashMap<String, VecDeque<OneBotFailure>>,
    roles: HashMap<(i64, i64), String>,
    messages: HashMap<i64, Value>,
    images: HashMap<String, Vec<u8>>,
    downloads: Vec<String>,
}

struct Shared {
    token: String,
    self_id: i64,
    nickname: String,
    http_addr: SocketAddr,
    inner: Mutex<Inner>,
    changed: Notify,
    cancel: CancellationToken,
    next_id: AtomicI64,
    /// Reverse connections' tasks, stopped with the fake.
    dialled: Mutex<Vec<JoinHandle<()>>>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        server::lock(&self.inner)
    }

    fn push(&self, event: Value) {
        let mut inner = self.lock();
        inner.pushed.push(event.clone());
        match &inner.connection {
            Some(conn) if conn.tx.send(WsMessage::Text(event.to_string())).is_ok() => {}
            _ => inner.pending.push_back(event),
        }
        drop(inner);
        self.changed.notify_waiters();
    }

    fn event(&self, post_type: &str) -> Value {
        json!({"time": now(), "self_id": self.self_id, "post_type": post_type})
    }
}

/// An in-process fake OneBot implementation. Stops when dropped.
pub struct FakeOneBot {
    shared: Arc<Shared>,
    ws_addr: SocketAddr,
    _server: Server,
}

impl fmt::Debug for FakeOneBot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.shared.lock();
        f.debug_struct("FakeOneBot")
            .field("ws", &self.ws_addr)
            .field("self_id", &self.shared.self_id)
            .field("sent", &inner.sent.len())
            .field("connections", &inner.connections)
            .finish_non_exhaustive()
    }
}

impl FakeOneBot {
    /// Starts the fake for QQ account `self_id` with access token `token` (empty: none
    /// asked).
    ///
    /// # Panics
    /// If no local port can be bound.
    pub async fn start(token: &str, self_id: i64) -> Self {
        let (ws, ws_addr) = server::loopback("onebot").await;
        let (http, http_addr) = server::loopback("onebot").await;
        let shared = Arc::new(Shared {
            token: token.to_owned(),
            self_id,
            nickname: "parlor".to_owned(),
            http_addr,
            inner: Mutex::new(Inner::default()),
            changed: Notify::new(),
            cancel: CancellationToken::new(),
            next_id: AtomicI64::new(1000),
            dialled: Mutex::new(Vec::new()),
        });
        let app = Router::new()
            .route("/images/{name}", get(image))
            .with_state(Arc::clone(&shared));
        let mut server = Server::new(shared.cancel.clone());
        server.serve(http, app);
        server.spawn(accept_forward(ws, Arc::clone(&shared)));
        FakeOneBot {
            shared,
            ws_addr,
            _server: server,
        }
    }

    /// The forward WebSocket URL (`ws://127.0.0.1:PORT`).
    pub fn ws_url(&self) -> String {
        format!("ws://{}", self.ws_addr)
    }

    /// The account's QQ number.
    pub fn self_id(&self) -> i64 {
        self.shared.self_id
    }

    /// Dials a bot listening for reverse connections at `url`, presenting `token` (empty:
    /// none) and `extra` headers (an `Origin`, as a web page's connection would carry).
    pub async fn dial_reverse(
        &self,
        url: &str,
        token: &str,
        extra: &[(&'static str, &str)],
    ) -> Result<(), DialError> {
        let mut request = url
            .into_client_request()
            .map_err(|e| DialError::Failed(e.to_string()))?;
        let headers = request.headers_mut();
        for (name, value) in extra {
            let value =
                HeaderValue::from_str(value).map_err(|e| DialError::Failed(e.to_string()))?;
            headers.insert(*name, value);
        }
        headers.insert("X-Client-Role", HeaderValue::from_static("Universal"));
        if let Ok(id) = HeaderValue::from_str(&self.shared.self_id.to_string()) {
            headers.insert("X-Self-ID", id);
        }
        if !token.is_empty()
            && let Ok(value) = HeaderValue::from_str(&format!("Bearer {token}"))
        {
            headers.insert("Authorization", value);
        }
        let (ws, _) = match tokio_tungstenite::connect_async(request).await {
            Ok(connected) => connected,
            Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
                return Err(DialError::Refused(response.status().as_u16()));
            }
            Err(error) => return Err(DialError::Failed(error.to_string())),
        };
        let shared = Arc::clone(&self.shared);
        let task = tokio::spawn(async move {
            let cancel = shared.cancel.clone();
            tokio::select! {
                () = cancel.cancelled() => {}
                () = serve(ws, Arc::clone(&shared)) => {}
            }
        });
        server::lock(&self.shared.dialled).push(task);
        Ok(())
    }

    /// A group message from `user_id` (named `name`, a `member`) in `group_id`.
    pub fn group_message(
        &self,
        group_id: i64,
        user_id: i64,
        name: &str,
        text: &str,
    ) -> OneBotMessageBuilder<'_> {
        OneBotMessageBuilder::new(self, Some(group_id), user_id, name, text)
    }

    /// A private message from `user_id` (a friend).
    pub fn private_message(
        &self,
        user_id: i64,
        name: &str,
        text: &str,
    ) -> OneBotMessageBuilder<'_> {
        OneBotMessageBuilder::new(self, None, user_id, name, text)
    }

    /// Pushes any event as is.
    pub fn push_event(&self, event: Value) {
        self.shared.push(event);
    }

    /// The notice that the bot was added to `group_id` by `operator_id`.
    pub fn bot_joined(&self, group_id: i64, operator_id: i64) {
        let mut event = self.shared.event("notice");
        event["notice_type"] = json!("group_increase");
        event["sub_type"] = json!("invite");
        event["group_id"] = json!(group_id);
        event["user_id"] = json!(self.shared.self_id);
        event["operator_id"] = json!(operator_id);
        self.shared.push(event);
    }

    /// The notice that `operator_id` removed the bot from `group_id`.
    pub fn bot_kicked(&self, group_id: i64, operator_id: i64) {
        let mut event = self.shared.event("notice");
        event["notice_type"] = json!("group_decrease");
        event["sub_type"] = json!("kick_me");
        event["group_id"] = json!(group_id);
        event["user_id"] = json!(self.shared.self_id);
        event["operator_id"] = json!(operator_id);
        self.shared.push(event);
    }

    /// A heartbeat announcing the next one `interval_ms` later.
    pub fn heartbeat(&self, interval_ms: u64) {
        let mut event = self.shared.event("meta_event");
        event["meta_event_type"] = json!("heartbeat");
        event["status"] = json!({"online": true, "good": true});
        event["interval"] = json!(interval_ms);
        self.shared.push(event);
    }

    /// Closes the live connection. Returns whether there was one.
    pub fn disconnect(&self) -> bool {
        let mut inner = self.shared.lock();
        let Some(conn) = inner.connection.take() else {
            return false;
        };
        let _ = conn.tx.send(WsMessage::Close(None));
        drop(inner);
        self.shared.changed.notify_waiters();
        true
    }

    /// Scripts `failure` for the next call of `action`; failures queue up in order.
    pub fn fail_next(&self, action: &str, failure: OneBotFailure) {
        self.shared
            .lock()
            .failures
            .entry(action.to_owned())
            .or_default()
            .push_back(failure);
    }

    /// `user_id`'s role in `group_id` (`owner`, `admin`, `member`), for
    /// `get_group_member_info`.
    pub fn set_role(&self, group_id: i64, user_id: i64, role: &str) {
        self.shared
            .lock()
            .roles
            .insert((group_id, user_id), role.to_owned());
    }

    /// Serves `bytes` over HTTP; returns the URL an image segment carries.
    pub fn add_image(&self, name: &str, bytes: Vec<u8>) -> String {
        self.shared.lock().images.insert(name.to_owned(), bytes);
        format!("http://{}/images/{name}", self.shared.http_addr)
    }

    /// Image names downloaded.
    pub fn downloads(&self) -> Vec<String> {
        self.shared.lock().downloads.clone()
    }

    /// Every message the bot sent.
    pub fn sent(&self) -> Vec<OneBotSent> {
        self.shared.lock().sent.clone()
    }

    /// Every action request received (`{"action","params","echo"}`).
    pub fn calls(&self) -> Vec<Value> {
        self.shared.lock().calls.clone()
    }

    /// Every event pushed so far.
    pub fn pushed(&self) -> Vec<Value> {
        self.shared.lock().pushed.clone()
    }

    /// Connections accepted or made, in total.
    pub fn connections(&self) -> u64 {
        self.shared.lock().connections
    }

    /// Forward handshakes refused for a wrong or missing token.
    pub fn refused(&self) -> u64 {
        self.shared.lock().refused
    }

    /// Whether a connection is live.
    pub fn is_connected(&self) -> bool {
        self.shared.lock().connection.is_some()
    }

    /// Waits until at least `n` connections were made, the last one still live.
    pub async fn wait_for_connections(&self, n: u64, timeout: Duration) -> Result<(), WaitTimeout> {
        self.wait_until(timeout, |inner| {
            if inner.connections >= n && inner.connection.is_some() {
                Ok(())
            } else {
                Err((
                    format!("{n} connection(s), the last live"),
                    inner.connections.to_string(),
                ))
            }
        })
        .await
    }

    /// Waits until at least `n` forward handshakes were refused.
    pub async fn wait_for_refusals(&self, n: u64, timeout: Duration) -> Result<(), WaitTimeout> {
        self.wait_until(timeout, |inner| {
            if inner.refused >= n {
                Ok(())
            } else {
                Err((format!("{n} refusal(s)"), inner.refused.to_string()))
            }
        })
        .await
    }

    /// Waits until at least `n` messages were sent, then returns all of them.
    pub async fn wait_for_sent(
        &self,
        n: usize,
        timeout: Duration,
    ) -> Result<Vec<OneBotSent>, WaitTimeout> {
        self.wait_until(timeout, |inner| at_least(&inner.sent, n, "sent message(s)"))
            .await
    }

    /// Waits until at least `n` action requests named `action` arrived.
    pub async fn wait_for_calls(
        &self,
        action: &str,
        n: usize,
        timeout: Duration,
    ) -> Result<Vec<Value>, WaitTimeout> {
        self.wait_until(timeout, |inner| {
            let calls: Vec<Value> = inner
                .calls
                .iter()
                .filter(|c| c["action"] == action)
                .cloned()
                .collect();
            at_least(&calls, n, &format!("`{action}` call(s)"))
        })
        .await
    }

    async fn wait_until<T>(
        &self,
        timeout: Duration,
        check: impl Fn(&Inner) -> Result<T, Unmet>,
    ) -> Result<T, WaitTimeout> {
        server::wait_until("onebot", &self.shared.changed, timeout, || {
            check(&self.shared.lock())
        })
        .await
    }
}

impl Drop for FakeOneBot {
    fn drop(&mut self) {
        self.shared.cancel.cancel();
        for task in server::lock(&self.shared.dialled).drain(..) {
            task.abort();
        }
    }
}

/// Builds a `message` event. Segments by default; [`as_cq_string`](Self::as_cq_string) for
/// the string form.
#[must_use = "call push() to send it"]
pub struct OneBotMessageBuilder<'a> {
    fake: &'a FakeOneBot,
    group_id: Option<i64>,
    user_id: i64,
    name: String,
    role: String,
    segments: Vec<Value>,
    cq_string: bool,
    message_id: Option<i64>,
}

impl<'a> OneBotMessageBuilder<'a> {
    fn new(
        fake: &'a FakeOneBot,
        group_id: Option<i64>,
        user_id: i64,
        name: &str,
        text: &str,
    ) -> Self {
        let mut builder = OneBotMessageBuilder {
            fake,
            group_id,
            user_id,
            name: name.to_owned(),
            role: "member".to_owned(),
            segments: Vec::new(),
            cq_string: false,
            message_id: None,
        };
        if !text.is_empty() {
            builder
                .segments
                .push(json!({"type": "text", "data": {"text": text}}));
        }
        builder
    }

    /// The sender's `sender.role` (`owner`, `admin`, `member`).
    pub fn role(mut self, role: &str) -> Self {
        self.role = role.to_owned();
        self
    }

    /// Starts the message with an `at` of the bot, as QQ's client writes a mention.
    pub fn mention_bot(mut self) -> Self {
        let at = json!({"type": "at", "data": {"qq": self.fake.shared.self_id.to_string()}});
        self.segments.insert(0, at);
        self
    }

    /// Starts the message with a `reply` to `message_id`.
    pub fn reply_to(mut self, message_id: i64) -> Self {
        let reply = json!({"type": "reply", "data": {"id": message_id.to_string()}});
        self.segments.insert(0, reply);
        self
    }

    /// Appends an `image` segment whose `url` is `url`.
    pub fn image(mut self, url: &str, size: usize) -> Self {
        self.segments.push(json!({"type": "image", "data": {
            "file": "image.png", "url": url, "file_size": size.to_string(), "sub_type": 0
        }}));
        self
    }

    /// Appends a `face` segment.
    pub fn face(mut self, id: u32) -> Self {
        self.segments
            .push(json!({"type": "face", "data": {"id": id.to_string()}}));
        self
    }

    /// Sends the message as a CQ string instead of segments.
    pub fn as_cq_string(mut self) -> Self {
        self.cq_string = true;
        self
    }

    /// Uses `message_id` instead of a new one (a resent event).
    pub fn message_id(mut self, message_id: i64) -> Self {
        self.message_id = Some(message_id);
        self
    }

    /// Pushes the event; returns its `message_id`.
    pub fn push(self) -> i64 {
        let shared = &self.fake.shared;
        let id = self
            .message_id
            .unwrap_or_else(|| shared.next_id.fetch_add(1, Ordering::Relaxed));
        let raw = cq_string(&self.segments);
        let message = if self.cq_string {
            json!(raw)
        } else {
            json!(self.segments)
        };
        let mut event = shared.event("message");
        event["message_id"] = json!(id);
        event["user_id"] = json!(self.user_id);
        event["message"] = message;
        event["raw_message"] = json!(raw);
        event["message_format"] = json!(if self.cq_string { "string" } else { "array" });
        event["font"] = json!(0);
        let mut sender = json!({"user_id": self.user_id, "nickname": self.name, "card": ""});
        match self.group_id {
            Some(group) => {
                event["message_type"] = json!("group");
                event["sub_type"] = json!("normal");
                event["group_id"] = json!(group);
                sender["role"] = json!(self.role);
            }
            None => {
                event["message_type"] = json!("private");
                event["sub_type"] = json!("friend");
            }
        }
        event["sender"] = sender;
        shared.lock().messages.insert(id, event.clone());
        shared.push(event);
        id
    }
}

/// Segments as a CQ string, escaped as the standard says (the fake's own writer, so tests
/// of a bot's parser do not lean on that parser).
fn cq_string(segments: &[Value]) -> String {
    let escape = |text: &str, comma: bool| {
        let mut out = String::new();
        for c in text.chars() {
            match c {
                '&' => out.push_str("&amp;"),
                '[' => out.push_str("&#91;"),
                ']' => out.push_str("&#93;"),
                ',' if comma => out.push_str("&#44;"),
                c => out.push(c),
            }
        }
        out
    };
    let mut out = String::new();
    for segment in segments {
        let kind = segment["type"].as_str().unwrap_or_default();
        let data = segment["data"].as_object().cloned().unwrap_or_default();
        if kind == "text" {
            out.push_str(&escape(
                data.get("text").and_then(Value::as_str).unwrap_or_default(),
                false,
            ));
            continue;
        }
        out.push_str("[CQ:");
        out.push_str(kind);
        for (key, value) in data {
            let value = match value {
                Value::String(text) => text,
                other => other.to_string(),
            };
            out.push(',');
            out.push_str(&key);
            out.push('=');
            out.push_str(&escape(&value, true));
        }
        out.push(']');
    }
    out
}

async fn accept_forward(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let accepted = tokio::select! {
            () = shared.cancel.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, _)) = accepted else { continue };
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let cancel = shared.cancel.clone();
            let token = shared.token.clone();
            #[allow(clippy::result_large_err)]
            let check =
                |request: &Request, response: WsResponse| -> Result<WsResponse, ErrorResponse> {
                    if token.is_empty() || presents(request, &token) {
                        Ok(response)
                    } else {
                        let mut refusal = ErrorResponse::new(Some("token check failed".to_owned()));
                        *refusal.status_mut() = StatusCode::UNAUTHORIZED;
                        Err(refusal)
                    }
                };
            let ws = match tokio_tungstenite::accept_hdr_async(stream, check).await {
                Ok(ws) => ws,
                Err(_) => {
                    shared.lock().refused += 1;
                    shared.changed.notify_waiters();
                    return;
                }
            };
            tokio::select! {
                () = cancel.cancelled() => {}
                () = serve(ws, shared) => {}
            }
        });
    }
}

fn presents(request: &Request, token: &str) -> bool {
    let bearer = request
        .headers()
        .get("Authorization")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == format!("Bearer {token}"));
    let query = request.uri().query().is_some_and(|q| {
        q.split('&')
            .any(|pair| pair == format!("access_token={token}"))
    });
    bearer || query
}

/// One connection, from either side: events out, actions answered.
async fn serve<S>(ws: WebSocketStream<S>, shared: Arc<Shared>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sink, mut source) = ws.split();
    let (tx, mut rx) = mpsc::unbounded_channel::<WsMessage>();
    let id = {
        let mut inner = shared.lock();
        inner.connections += 1;
        let id = inner.connections;
        if let Some(old) = inner.connection.replace(Connection { id, tx: tx.clone() }) {
            let _ = old.tx.send(WsMessage::Close(None));
        }
        let mut connect = shared.event("meta_event");
        connect["meta_event_type"] = json!("lifecycle");
        connect["sub_type"] = json!("connect");
        let _ = tx.send(WsMessage::Text(connect.to_string()));
        while let Some(event) = inner.pending.pop_front() {
            let _ = tx.send(WsMessage::Text(event.to_string()));
        }
        id
    };
    shared.changed.notify_waiters();
    let writer = tokio::spawn(async move {
        while let Some(message) = rx.recv().await {
            let close = matches!(message, WsMessage::Close(_));
            if sink.send(message).await.is_err() || close {
                let _ = tokio::time::timeout(Duration::from_millis(200), sink.close()).await;
                break;
            }
        }
    });
    // Cancelled (the fake dropped), this future is dropped where it waits: the guard still
    // forgets the connection and ends its writer, which holds the socket open otherwise.
    let _hangup = Hangup {
        shared: Arc::clone(&shared),
        id,
        writer: writer.abort_handle(),
    };
    while let Some(Ok(frame)) = source.next().await {
        let text = match frame {
            WsMessage::Text(text) => text,
            WsMessage::Close(_) => break,
            _ => continue,
        };
        let Ok(request) = serde_json::from_str::<Value>(&text) else {
            continue;
        };
        if !answer(&shared, &tx, request) || writer.is_finished() {
            break;
        }
    }
    {
        let mut inner = shared.lock();
        if inner.connection.as_ref().is_some_and(|c| c.id == id) {
            inner.connection = None;
        }
    }
    shared.changed.notify_waiters();
    drop(tx);
    let _ = tokio::time::timeout(Duration::from_secs(1), writer).await;
}

/// Ends a connection however [`serve`] ends.
struct Hangup {
    shared: Arc<Shared>,
    id: u64,
    writer: tokio::task::AbortHandle,
}

impl Drop for Hangup {
    fn drop(&mut self) {
        {
            let mut inner = self.shared.lock();
            if inner.connection.as_ref().is_some_and(|c| c.id == self.id) {
                inner.connection = None;
            }
        }
        self.shared.changed.notify_waiters();
        self.writer.abort();
    }
}

/// Answers one action request; false to hang up.
fn answer(shared: &Shared, tx: &mpsc::UnboundedSender<WsMessage>, request: Value) -> bool {
    let action = request["action"].as_str().unwrap_or_default().to_owned();
    let echo = request.get("echo").cloned().unwrap_or(Value::Null);
    let params = request.get("params").cloned().unwrap_or(Value::Null);
    let mut inner = shared.lock();
    inner.calls.push(request);
    let failure = inner
        .failures
        .get_mut(&action)
        .and_then(VecDeque::pop_front);
    let reply = match failure {
        Some(OneBotFailure::Drop) => {
            inner.connection = None;
            drop(inner);
            shared.changed.notify_waiters();
            return false;
        }
        Some(OneBotFailure::Retcode(retcode, message)) => {
            json!({"status": "failed", "retcode": retcode, "data": null, "message": message, "wording": message})
        }
        None => match action.as_str() {
            "send_group_msg" | "send_private_msg" => {
                let message_id = shared.next_id.fetch_add(1, Ordering::Relaxed);
                inner.sent.push(OneBotSent {
                    action: action.clone(),
                    group_id: params["group_id"].as_i64(),
                    user_id: params["user_id"].as_i64(),
                    message: params["message"].clone(),
                    message_id,
                    at: Instant::now(),
                });
                ok(json!({"message_id": message_id}))
            }
            "get_login_info" => ok(json!({"user_id": shared.self_id, "nickname": shared.nickname})),
            "get_msg" => match params["message_id"]
                .as_i64()
                .and_then(|id| inner.messages.get(&id))
            {
                Some(event) => ok(event.clone()),
                None => failed(100, "message not found"),
            },
            "get_group_member_info" => {
                let key = (
                    params["group_id"].as_i64().unwrap_or(0),
                    params["user_id"].as_i64().unwrap_or(0),
                );
                match inner.roles.get(&key) {
                    Some(role) => ok(json!({"group_id": key.0, "user_id": key.1, "role": role})),
                    None => failed(100, "not a member"),
                }
            }
            "get_image" => {
                let file = params["file"].as_str().unwrap_or_default().to_owned();
                if inner.images.contains_key(&file) {
                    ok(
                        json!({"file": file, "url": format!("http://{}/images/{file}", shared.http_addr)}),
                    )
                } else {
                    failed(100, "no such image")
                }
            }
            _ => failed(1404, "no such action"),
        },
    };
    let mut reply = reply;
    reply["echo"] = echo;
    // Queued before the lock is let go and the waiters woken: a test that saw the call
    // and then disconnects queues its close behind the answer, never ahead of it.
    let answered = tx.send(WsMessage::Text(reply.to_string())).is_ok();
    drop(inner);
    shared.changed.notify_waiters();
    answered
}

fn ok(data: Value) -> Value {
    json!({"status": "ok", "retcode": 0, "data": data, "message": "", "wording": ""})
}

fn failed(retcode: i64, message: &str) -> Value {
    json!({"status": "failed", "retcode": retcode, "data": null, "message": message, "wording": message})
}

async fn image(State(shared): State<Arc<Shared>>, Path(name): Path<String>) -> Response {
    let bytes = {
        let mut inner = shared.lock();
        inner.downloads.push(name.clone());
        inner.images.get(&name).cloned()
    };
    shared.changed.notify_waiters();
    match bytes {
        Some(bytes) => (StatusCode::OK, bytes).into_response(),
        None => (StatusCode::NOT_FOUND, "Not Found").into_response(),
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
