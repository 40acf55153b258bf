//! An in-process fake of Discord: the REST API under `/api/v10/...` and a gateway WebSocket,
//! for end-to-end tests of bots built on serenity (or any client speaking the same wire).
//!
//! [`FakeDiscord::start`] binds two ports on `127.0.0.1`: one for HTTP, one for the gateway.
//! Point serenity at it with
//! `HttpBuilder::new(token).proxy(fake.api_url()).ratelimiter_disabled(true)`: serenity then
//! sends its REST calls to `{api_url}/api/v10/...`, and asks `GET /api/v10/gateway` for the
//! gateway URL, which the fake answers with its own `ws://127.0.0.1:PORT/gw`.
//!
//! ## REST routes
//! `GET /api/v10/gateway`, `GET /api/v10/gateway/bot`, `GET /api/v10/users/@me`,
//! `POST /api/v10/channels/{id}/messages` (recorded, answered with a full Message object with
//! a new snowflake id, and echoed back over the gateway as `MESSAGE_CREATE` like Discord does),
//! `POST /api/v10/channels/{id}/typing` (204), `GET /api/v10/channels/{id}`,
//! `GET /api/v10/guilds/{id}`, `GET /api/v10/guilds/{id}/roles`,
//! `GET /api/v10/guilds/{id}/members/{user}`, and attachment downloads at
//! `/attachments/{channel}/{id}/{filename}` (the `url` of attachments the fake builds).
//! Every `/api/v10` route except `/gateway` wants `Authorization: Bot {token}` and answers
//! `401 {"message":"401: Unauthorized","code":0}` otherwise. Unknown routes get
//! `404 {"message":"404: Not Found","code":0}` and are listed by
//! [`FakeDiscord::unknown_routes`].
//!
//! Behaviour copied from Discord that tests may trip over:
//! - Sending to a channel the fake does not know fails with `404` code 10003 (Unknown
//!   Channel). Channels become known through [`FakeDiscord::text_channel`],
//!   [`FakeDiscord::thread`], [`FakeDiscord::dm_channel`] or a message pushed to them.
//! - `content` longer than 2000 characters fails with `400` code 50035 (Invalid Form Body); an
//!   empty message with code 50006.
//! - A `message_reference` to a message the fake does not know fails with `400` code 50035
//!   unless `fail_if_not_exists` is `false`.
//! - Without `allowed_mentions`, Discord parses every mention in the content, `@everyone`
//!   included; [`DiscordSent::pings_everyone`] tells whether a sent message would have pinged.
//! - The bot's own messages come back as `MESSAGE_CREATE`.
//! - `nonce` (an integer, or a string of at most 25 characters; 400 code 50035 otherwise) is
//!   echoed in the message. With `enforce_nonce: true`, a nonce the bot already used in that
//!   channel within five minutes returns the message created then, and nothing new is
//!   created, recorded or dispatched.
//!
//! ## Gateway
//! JSON text frames, no compression. On connect the fake sends Hello (op 10, from Discord's
//! example); Identify (op 2) gets `READY`; a heartbeat
//! (op 1) gets an ACK (op 11); Resume (op 6) of the current session replays the events after
//! the client's `seq` and then sends `RESUMED`; a resume of an unknown session gets Invalid
//! Session (op 9, `d: false`). Events pushed while no connection is ready are queued and sent
//! after the next `READY`/`RESUMED`, so a test never loses an event to a reconnect.
//! [`FakeDiscord::disconnect`] closes the live connection with close code 4000 (resumable).
//!
//! Incoming messages are scripted with [`FakeDiscord::message`], a builder based on Discord's
//! documented example message; button presses with [`FakeDiscord::button_press`]
//! (`INTERACTION_CREATE`).
//!
//! ## Buttons (`discord/interactions.rs`)
//! A message's `components` are checked like Discord's (action rows of at most five
//! buttons, `custom_id` of 1-100 characters; 400 code 50035 otherwise), kept in the created
//! message and readable as [`DiscordSent::buttons`].
//! `POST /api/v10/interactions/{id}/{token}/callback` takes one response per interaction the
//! fake dispatched (404 code 10062 Unknown interaction for others, 400 code 40060 for a
//! second one); `POST /api/v10/webhooks/{application}/{token}` takes follow-ups once the
//! interaction has its response (404 code 10015 Unknown Webhook before). Both are recorded
//! ([`FakeDiscord::interaction_callbacks`], [`FakeDiscord::followups`]) and need no bot
//! token, as on Discord.
//!
//! Avoid `#[tokio::test(start_paused = true)]` with this fake: real sockets and heartbeats need
//! a running clock.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, mpsc};
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_util::sync::CancellationToken;

use crate::server::{self, Server, Unmet, WaitTimeout, at_least};

mod interactions;

pub use interactions::{
    DiscordButton, DiscordFollowup, DiscordInteraction, DiscordInteractionBuilder,
    DiscordInteractionCallback,
};

/// The guild a message goes to when neither the builder nor the channel says otherwise.
pub const DEFAULT_GUILD_ID: u64 = 290_926_798_626_357_999;

/// The Discord epoch (2015-01-01) in milliseconds, for snowflakes.
const DISCORD_EPOCH_MS: u64 = 1_420_070_400_000;

/// The examples from discord/discord-api-docs @ c98d64bc (CC-BY-SA 4.0), see
/// `fixtures/discord/README.md`.
const FIXTURES: &[(&str, &str)] = &[
    (
        "gateway.Example_Hello_Event.L129.json",
        include_str!("../fixtures/discord/gateway.Example_Hello_Event.L129.json"),
    ),
    (
        "gateway.Example_Heartbeat_ACK.L161.json",
        include_str!("../fixtures/discord/gateway.Example_Heartbeat_ACK.L161.json"),
    ),
    (
        "gateway.Example_Identify_Payload.L198.json",
        include_str!("../fixtures/discord/gateway.Example_Identify_Payload.L198.json"),
    ),
    (
        "gateway.Example_Gateway_Resume_Event.L276.json",
        include_str!("../fixtures/discord/gateway.Example_Gateway_Resume_Event.L276.json"),
    ),
    (
        "gateway.Example_Response.L756.json",
        include_str!("../fixtures/discord/gateway.Example_Response.L756.json"),
    ),
    (
        "message.Example_Message.L167.json",
        include_str!("../fixtures/discord/message.Example_Message.L167.json"),
    ),
];

/// One of the copied Discord documentation examples, parsed; `None` for an unknown name.
pub fn discord_fixture(name: &str) -> Option<Value> {
    server::fixture(FIXTURES, name)
}

fn fixture(name: &str) -> Value {
    discord_fixture(name).unwrap_or_else(|| panic!("fake discord: fixture {name} is missing"))
}

/// A Discord user, as the fake writes it into payloads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscordUser {
    /// The snowflake.
    pub id: u64,
    /// The unique username.
    pub username: String,
    /// The display name, if set.
    pub global_name: Option<String>,
    /// Whether the account is a bot.
    pub bot: bool,
}

impl DiscordUser {
    /// A human user.
    pub fn new(id: u64, username: impl Into<String>) -> Self {
        DiscordUser {
            id,
            username: username.into(),
            global_name: None,
            bot: false,
        }
    }

    /// With a display name.
    pub fn global_name(mut self, name: impl Into<String>) -> Self {
        self.global_name = Some(name.into());
        self
    }

    /// Marks the user as a bot.
    fn bot(mut self) -> Self {
        self.bot = true;
        self
    }

    /// The user object.
    fn to_json(&self) -> Value {
        json!({
            "id": self.id.to_string(),
            "username": self.username,
            "discriminator": "0",
            "global_name": self.global_name,
            "avatar": null,
            "bot": self.bot,
        })
    }

    /// The mention markup `<@id>`.
    fn mention(&self) -> String {
        format!("<@{}>", self.id)
    }
}

impl Default for DiscordUser {
    /// The bot the fake impersonates by default: `parlor_bot` (id 1100).
    fn default() -> Self {
        DiscordUser::new(1100, "parlor_bot").bot()
    }
}

/// A scripted failure for the next call of a route.
#[derive(Debug, Clone, PartialEq)]
pub enum DiscordFailure {
    /// `429 Too Many Requests` with `retry_after` (seconds) in the body and the headers.
    RateLimited {
        /// Seconds to wait.
        retry_after: f64,
        /// Whether the limit is global.
        global: bool,
    },
    /// Any other status with a JSON error body `{"code", "message"}`.
    Status {
        /// The HTTP status.
        status: u16,
        /// Discord's JSON error code.
        code: u64,
        /// The error message.
        message: String,
    },
}

impl DiscordFailure {
    /// A 429 asking to wait `retry_after` seconds.
    pub fn rate_limited(retry_after: f64) -> Self {
        DiscordFailure::RateLimited {
            retry_after,
            global: false,
        }
    }

    /// A 500.
    pub fn server_error() -> Self {
        DiscordFailure::Status {
            status: 500,
            code: 0,
            message: "500: Internal Server Error".to_owned(),
        }
    }
}

/// How long Discord remembers a nonce for `enforce_nonce` ("the past few minutes").
const NONCE_WINDOW: Duration = Duration::from_secs(5 * 60);

/// A message sent through `POST /channels/{id}/messages`.
#[derive(Debug, Clone, PartialEq)]
pub struct DiscordSent {
    /// The channel it went to.
    pub channel_id: String,
    /// The id the fake gave it.
    pub id: String,
    /// `content`.
    pub content: String,
    /// `message_reference`, as sent.
    pub message_reference: Option<Value>,
    /// `allowed_mentions`, as sent.
    pub allowed_mentions: Option<Value>,
    /// The whole request body.
    pub body: Value,
}

impl DiscordSent {
    /// The referenced message id, if any.
    pub fn reply_to(&self) -> Option<String> {
        self.message_reference
            .as_ref()
            .and_then(|r| r.get("message_id"))
            .and_then(snowflake_string)
    }

    /// Whether `allowed_mentions` (Discord's default when absent: everything) lets `kind`
    /// (`users`, `roles`, `everyone`) be parsed from the content.
    pub fn parses(&self, kind: &str) -> bool {
        match &self.allowed_mentions {
            None => true,
            Some(allowed) => allowed
                .get("parse")
                .and_then(Value::as_array)
                .is_some_and(|parse| parse.iter().any(|p| p.as_str() == Some(kind))),
        }
    }

    /// Whether this message would ping `@everyone`/`@here`: the content has one and
    /// `allowed_mentions` lets `everyone` through.
    pub fn pings_everyone(&self) -> bool {
        (self.content.contains("@everyone") || self.content.contains("@here"))
            && self.parses("everyone")
    }
}

/// A call of `POST /channels/{id}/typing`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscordTyping {
    /// The channel.
    pub channel_id: String,
}

/// One HTTP request the fake received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscordRequest {
    /// `GET`, `POST`, ...
    pub method: String,
    /// The path, e.g. `/api/v10/channels/1/messages`.
    pub path: String,
}

#[derive(Debug, Clone)]
struct ChannelInfo {
    /// Discord's channel type: 0 text, 1 DM, 11 public thread.
    kind: u8,
    guild_id: Option<u64>,
    parent_id: Option<u64>,
}

#[derive(Debug, Clone, Default)]
struct GuildInfo {
    owner_id: u64,
    /// role id -> permission bits.
    roles: Vec<(u64, u64)>,
    /// user id -> role ids.
    members: HashMap<u64, Vec<u64>>,
}

/// The live gateway connection.
struct Connection {
    id: u64,
    tx: mpsc::UnboundedSender<WsMessage>,
    /// READY or RESUMED was sent: dispatches may flow.
    ready: bool,
}

struct Inner {
    bot: DiscordUser,
    reject_identify: bool,
    session_id: Option<String>,
    seq: u64,
    /// Events of the current session, by seq, for resumes.
    backlog: Vec<(u64, Value)>,
    /// Events not sent on any ready connection yet: `(t, d)`.
    pending: VecDeque<(String, Value)>,
    connection: Option<Connection>,
    connections: u64,
    /// Sharded mode ([`FakeDiscord::set_shards`] above 1): the identified connection of
    /// each shard, its sequence number and the events waiting for it. Resumes are refused
    /// (the client identifies again).
    shards: u32,
    shard_conns: HashMap<u32, Connection>,
    shard_seq: HashMap<u32, u64>,
    shard_pending: HashMap<u32, VecDeque<(String, Value)>>,
    identifies: Vec<Value>,
    resumes: Vec<Value>,
    heartbeats: u64,
    dispatched: Vec<Value>,
    sent: Vec<DiscordSent>,
    typing: Vec<DiscordTyping>,
    requests: Vec<DiscordRequest>,
    unknown: Vec<String>,
    failures: HashMap<String, VecDeque<DiscordFailure>>,
    channels: HashMap<u64, ChannelInfo>,
    guilds: HashMap<u64, GuildInfo>,
    messages: HashMap<String, Value>,
    /// `(channel, nonce)` -> the message id created with it, and when.
    nonces: HashMap<(u64, String), (String, std::time::Instant)>,
    attachments: HashMap<String, Vec<u8>>,
    downloads: Vec<String>,
    /// Interactions dispatched, by id: their token and whether they got their response.
    interactions: HashMap<u64, interactions::Issued>,
    /// Accepted interaction responses.
    callbacks: Vec<DiscordInteractionCallback>,
    /// Accepted interaction follow-ups.
    followups: Vec<DiscordFollowup>,
}

struct Shared {
    token: String,
    http_addr: SocketAddr,
    gw_addr: SocketAddr,
    inner: Mutex<Inner>,
    changed: Notify,
    cancel: CancellationToken,
    next_id: AtomicU64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        server::lock(&self.inner)
    }

    fn snowflake(&self) -> u64 {
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(DISCORD_EPOCH_MS)
            .saturating_sub(DISCORD_EPOCH_MS);
        let counter = self.next_id.fetch_add(1, Ordering::Relaxed) & 0x3f_ffff;
        (ms << 22) | counter
    }

    fn ws_url(&self) -> String {
        format!("ws://{}/gw", self.gw_addr)
    }

    fn base_url(&self) -> String {
        format!("http://{}", self.http_addr)
    }

    /// Sends or queues a dispatch event.
    fn dispatch(&self, t: &str, d: Value) {
        let mut inner = self.lock();
        inner.dispatched.push(json!({"t": t, "d": d.clone()}));
        if inner.shards > 1 {
            // Discord's rule: a server's events go to shard (server id >> 22) % shards;
            // DMs to shard 0.
            let guild = d
                .get("guild_id")
                .and_then(Value::as_str)
                .and_then(|g| g.parse::<u64>().ok());
            let shard = guild.map_or(0, |g| ((g >> 22) % u64::from(inner.shards)) as u32);
            inner
                .shard_pending
                .entry(shard)
                .or_default()
                .push_back((t.to_owned(), d));
            flush_shard(&mut inner, shard);
            drop(inner);
            self.changed.notify_waiters();
            return;
        }
        inner.pending.push_back((t.to_owned(), d));
        flush_pending(&mut inner);
        drop(inner);
        self.changed.notify_waiters();
    }
}

/// Sharded mode: sends shard `shard`'s pending events on its connection, if it has one.
fn flush_shard(inner: &mut Inner, shard: u32) {
    let Some(tx) = inner.shard_conns.get(&shard).map(|c| c.tx.clone()) else {
        return;
    };
    let events: Vec<_> = inner
        .shard_pending
        .get_mut(&shard)
        .map(|p| p.drain(..).collect())
        .unwrap_or_default();
    for (t, d) in events {
        let seq = inner.shard_seq.entry(shard).or_insert(1);
        *seq += 1;
        let payload = json!({"op": 0, "s": *seq, "t": t, "d": d});
        let _ = tx.send(WsMessage::Text(payload.to_string()));
    }
}

/// Sends the pending events on the ready connection, if any.
fn flush_pending(inner: &mut Inner) {
    let ready = inner.connection.as_ref().is_some_and(|c| c.ready);
    if !ready {
        return;
    }
    while let Some((t, d)) = inner.pending.pop_front() {
        inner.seq += 1;
        let payload = json!({"op": 0, "s": inner.seq, "t": t, "d": d});
        inner.backlog.push((inner.seq, payload.clone()));
        if let Some(conn) = &inner.connection {
            let _ = conn.tx.send(WsMessage::Text(payload.to_string()));
        }
    }
}

/// An in-process fake Discord (REST + gateway). Stops when dropped. All methods except `start`
/// and `wait_for_*` are synchronous.
pub struct FakeDiscord {
    shared: Arc<Shared>,
    /// Held for its `Drop`, which stops both servers.
    _server: Server,
    latency: server::Latency,
}

impl fmt::Debug for FakeDiscord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.shared.lock();
        f.debug_struct("FakeDiscord")
            .field("http", &self.shared.http_addr)
            .field("gateway", &self.shared.gw_addr)
            .field("sent", &inner.sent.len())
            .field("connections", &inner.connections)
            .finish_non_exhaustive()
    }
}

impl FakeDiscord {
    /// Starts the fake for bot token `token`, impersonating the default [`DiscordUser`].
    ///
    /// # Panics
    /// If no local port can be bound.
    pub async fn start(token: &str) -> Self {
        let bot = DiscordUser::default();
        let (http, http_addr) = server::loopback("discord").await;
        let (gw, gw_addr) = server::loopback("discord").await;
        let shared = Arc::new(Shared {
            token: token.to_owned(),
            http_addr,
            gw_addr,
            inner: Mutex::new(Inner {
                bot,
                reject_identify: false,
                session_id: None,
                seq: 0,
                backlog: Vec::new(),
                pending: VecDeque::new(),
                connection: None,
                connections: 0,
                shards: 1,
                shard_conns: HashMap::new(),
                shard_seq: HashMap::new(),
                shard_pending: HashMap::new(),
                identifies: Vec::new(),
                resumes: Vec::new(),
                heartbeats: 0,
                dispatched: Vec::new(),
                sent: Vec::new(),
                typing: Vec::new(),
                requests: Vec::new(),
                unknown: Vec::new(),
                failures: HashMap::new(),
                channels: HashMap::new(),
                guilds: HashMap::new(),
                messages: HashMap::new(),
                nonces: HashMap::new(),
                attachments: HashMap::new(),
                downloads: Vec::new(),
                interactions: HashMap::new(),
                callbacks: Vec::new(),
                followups: Vec::new(),
            }),
            changed: Notify::new(),
            cancel: CancellationToken::new(),
            next_id: AtomicU64::new(1),
        });
        let latency = server::Latency::new(shared.cancel.clone(), None);
        let app = Router::new()
            .route("/api/v10/gateway", get(gateway))
            .route("/api/v10/gateway/bot", get(gateway_bot))
            .route("/api/v10/users/@me", get(users_me))
            .route("/api/v10/channels/{channel}", get(get_channel))
            .route("/api/v10/channels/{channel}/messages", post(create_message))
            .route("/api/v10/channels/{channel}/typing", post(typing))
            .route("/api/v10/guilds/{guild}", get(get_guild))
            .route("/api/v10/guilds/{guild}/roles", get(get_roles))
            .route("/api/v10/guilds/{guild}/members/{user}", get(get_member))
            .route(
                "/api/v10/interactions/{id}/{token}/callback",
                post(interactions::interaction_callback),
            )
            .route(
                "/api/v10/webhooks/{application}/{token}",
                post(interactions::followup),
            )
            .route(
                "/attachments/{channel}/{attachment}/{filename}",
                get(download),
            )
            .fallback(unknown)
            .layer(axum::middleware::from_fn_with_state(
                latency.clone(),
                server::with_latency,
            ))
            .with_state(Arc::clone(&shared));
        let mut server = Server::new(shared.cancel.clone());
        server.serve(http, app);
        server.spawn(accept_gateway(gw, Arc::clone(&shared)));
        FakeDiscord {
            shared,
            _server: server,
            latency,
        }
    }

    /// Adds a fixed network round trip to every later REST call (half before it is
    /// handled, half after), as the real API has from a VPS. Zero (the default) answers at
    /// once. The gateway's events are not delayed: they are pushed, not asked for.
    pub fn set_latency(&self, round_trip: Duration) {
        self.latency.set(round_trip);
    }

    /// The base URL for serenity's `HttpBuilder::proxy`: `http://127.0.0.1:PORT`.
    pub fn api_url(&self) -> String {
        self.shared.base_url()
    }

    /// The gateway URL `GET /api/v10/gateway` answers: `ws://127.0.0.1:PORT/gw`.
    pub fn gateway_url(&self) -> String {
        self.shared.ws_url()
    }

    /// The bot user.
    pub fn bot(&self) -> DiscordUser {
        self.shared.lock().bot.clone()
    }

    /// Whether Identify is answered with close code 4004 (Authentication failed) whatever the
    /// token, as when a token is reset while the REST side still worked.
    pub fn set_reject_identify(&self, reject: bool) {
        self.shared.lock().reject_identify = reject;
    }

    /// Registers a guild with its owner; the `@everyone` role (id = guild id) has no
    /// permissions.
    pub fn guild(&self, guild_id: u64, owner_id: u64) {
        let mut inner = self.shared.lock();
        let guild = inner.guilds.entry(guild_id).or_default();
        guild.owner_id = owner_id;
        if !guild.roles.iter().any(|(id, _)| *id == guild_id) {
            guild.roles.push((guild_id, 0));
        }
    }

    /// Adds (or replaces) a role with permission bits `permissions` (e.g. `8` Administrator,
    /// `32` Manage Server).
    pub fn role(&self, guild_id: u64, role_id: u64, permissions: u64) {
        let mut inner = self.shared.lock();
        let guild = inner.guilds.entry(guild_id).or_default();
        guild.roles.retain(|(id, _)| *id != role_id);
        guild.roles.push((role_id, permissions));
    }

    /// Makes `user_id` a member of the guild with `roles`.
    pub fn member(&self, guild_id: u64, user_id: u64, roles: Vec<u64>) {
        let mut inner = self.shared.lock();
        inner
            .guilds
            .entry(guild_id)
            .or_default()
            .members
            .insert(user_id, roles);
    }

    /// Registers a guild text channel.
    pub fn text_channel(&self, guild_id: u64, channel_id: u64) {
        self.shared.lock().channels.insert(
            channel_id,
            ChannelInfo {
                kind: 0,
                guild_id: Some(guild_id),
                parent_id: None,
            },
        );
    }

    /// Registers a public thread of `parent_id`.
    pub fn thread(&self, guild_id: u64, parent_id: u64, thread_id: u64) {
        self.shared.lock().channels.insert(
            thread_id,
            ChannelInfo {
                kind: 11,
                guild_id: Some(guild_id),
                parent_id: Some(parent_id),
            },
        );
    }

    /// Registers a DM channel; messages built for it carry no `guild_id`.
    pub fn dm_channel(&self, channel_id: u64) {
        self.shared.lock().channels.insert(
            channel_id,
            ChannelInfo {
                kind: 1,
                guild_id: None,
                parent_id: None,
            },
        );
    }

    /// Starts building a `MESSAGE_CREATE` by `author` in `channel_id`.
    pub fn message(
        &self,
        channel_id: u64,
        author: &DiscordUser,
        content: impl Into<String>,
    ) -> DiscordMessageBuilder<'_> {
        DiscordMessageBuilder {
            fake: self,
            channel_id,
            author: author.clone(),
            content: content.into(),
            guild_id: None,
            dm: false,
            mentions: Vec::new(),
            reply_to: None,
            attachments: Vec::new(),
        }
    }

    /// Pushes a plain `MESSAGE_CREATE`; returns its id.
    pub fn message_create(
        &self,
        channel_id: u64,
        author: &DiscordUser,
        content: impl Into<String>,
    ) -> String {
        self.message(channel_id, author, content).push()
    }

    /// Pushes any dispatch event (`op 0`, `t`, `d`); sent now if a connection is ready,
    /// else queued for the next one.
    fn dispatch(&self, t: &str, d: Value) {
        if t == "MESSAGE_CREATE"
            && let Some(id) = d.get("id").and_then(snowflake_string)
        {
            let mut inner = self.shared.lock();
            inner.messages.insert(id, d.clone());
            // A channel a message was pushed to exists from now on.
            if let Some(channel) = d
                .get("channel_id")
                .and_then(snowflake_string)
                .and_then(|c| c.parse::<u64>().ok())
            {
                let guild_id = d
                    .get("guild_id")
                    .and_then(snowflake_string)
                    .and_then(|g| g.parse::<u64>().ok());
                inner.channels.entry(channel).or_insert(ChannelInfo {
                    kind: if guild_id.is_some() { 0 } else { 1 },
                    guild_id,
                    parent_id: None,
                });
            }
        }
        self.shared.dispatch(t, d);
    }

    /// Splits the gateway into `shards` shards (before the bot connects): each connection
    /// must identify as one of them, and a server's events go only to its shard's
    /// connection, `(server id >> 22) % shards`, as on Discord.
    pub fn set_shards(&self, shards: u32) {
        self.shared.lock().shards = shards.max(1);
    }

    /// Sharded mode: the shards that have a live connection now.
    pub fn connected_shards(&self) -> Vec<u32> {
        let mut shards: Vec<u32> = self.shared.lock().shard_conns.keys().copied().collect();
        shards.sort_unstable();
        shards
    }

    /// Sharded mode: waits until every shard has a live connection.
    pub async fn wait_for_all_shards(&self, timeout: Duration) -> Result<(), WaitTimeout> {
        self.wait_until(timeout, |inner| {
            if inner.shard_conns.len() as u32 >= inner.shards {
                Ok(())
            } else {
                Err((
                    format!("{} shards connected", inner.shards),
                    format!("{} connected", inner.shard_conns.len()),
                ))
            }
        })
        .await
    }

    /// Closes the live gateway connection with close code 4000 (resumable). Returns whether
    /// there was one.
    pub fn disconnect(&self) -> bool {
        let mut inner = self.shared.lock();
        let Some(conn) = inner.connection.take() else {
            return false;
        };
        let _ = conn.tx.send(WsMessage::Close(Some(CloseFrame {
            code: CloseCode::from(4000),
            reason: "fake discord: disconnect".into(),
        })));
        drop(inner);
        self.shared.changed.notify_waiters();
        true
    }

    /// Scripts `failure` for the next call of `route`: `create_message`, `typing`,
    /// `get_channel`, `get_guild`, `get_roles`, `get_member`, `users_me`, `gateway`,
    /// `download`, `interaction_callback`, `followup`. Failures queue up in order.
    pub fn fail_next(&self, route: &str, failure: DiscordFailure) {
        self.shared
            .lock()
            .failures
            .entry(route.to_owned())
            .or_default()
            .push_back(failure);
    }

    /// Stores bytes to download at `/attachments/{channel}/{id}/{filename}`; returns the URL.
    pub fn add_attachment(&self, channel_id: u64, filename: &str, bytes: Vec<u8>) -> String {
        let id = self.shared.snowflake();
        let path = format!("/attachments/{channel_id}/{id}/{filename}");
        self.shared.lock().attachments.insert(path.clone(), bytes);
        format!("{}{path}", self.shared.base_url())
    }

    /// Every message sent so far.
    pub fn sent_messages(&self) -> Vec<DiscordSent> {
        self.shared.lock().sent.clone()
    }

    /// Every typing call so far.
    pub fn typing_calls(&self) -> Vec<DiscordTyping> {
        self.shared.lock().typing.clone()
    }

    /// Every HTTP request so far.
    pub fn requests(&self) -> Vec<DiscordRequest> {
        self.shared.lock().requests.clone()
    }

    /// Requests to routes the fake does not serve (`METHOD path`).
    pub fn unknown_routes(&self) -> Vec<String> {
        self.shared.lock().unknown.clone()
    }

    /// Attachment paths downloaded.
    pub fn downloads(&self) -> Vec<String> {
        self.shared.lock().downloads.clone()
    }

    /// The Identify payloads (`d`) received.
    pub fn identifies(&self) -> Vec<Value> {
        self.shared.lock().identifies.clone()
    }

    /// Heartbeats received.
    pub fn heartbeats(&self) -> u64 {
        self.shared.lock().heartbeats
    }

    /// Gateway connections accepted.
    pub fn connections(&self) -> u64 {
        self.shared.lock().connections
    }

    /// Every event dispatched (`{"t","d"}`), sent or still queued.
    pub fn dispatched(&self) -> Vec<Value> {
        self.shared.lock().dispatched.clone()
    }

    /// Whether a connection has received READY or RESUMED and is live.
    pub fn is_ready(&self) -> bool {
        self.shared
            .lock()
            .connection
            .as_ref()
            .is_some_and(|c| c.ready)
    }

    /// Waits until a gateway connection is live (READY/RESUMED sent).
    pub async fn wait_for_ready(&self, timeout: Duration) -> Result<(), WaitTimeout> {
        self.wait_until(timeout, |inner| {
            if inner.connection.as_ref().is_some_and(|c| c.ready) {
                Ok(())
            } else {
                Err((
                    "a ready gateway connection".to_owned(),
                    format!("{} connection(s), none ready", inner.connections),
                ))
            }
        })
        .await
    }

    /// Waits until at least `n` Resume payloads were received.
    pub async fn wait_for_resumes(
        &self,
        n: usize,
        timeout: Duration,
    ) -> Result<Vec<Value>, WaitTimeout> {
        self.wait_until(timeout, |inner| at_least(&inner.resumes, n, "resume(s)"))
            .await
    }

    /// Waits until at least `n` messages were sent, then returns all of them.
    pub async fn wait_for_sent(
        &self,
        n: usize,
        timeout: Duration,
    ) -> Result<Vec<DiscordSent>, WaitTimeout> {
        self.wait_until(timeout, |inner| at_least(&inner.sent, n, "sent message(s)"))
            .await
    }

    /// Waits until `check` passes on the state; see [`server::wait_until`].
    async fn wait_until<T>(
        &self,
        timeout: Duration,
        check: impl Fn(&Inner) -> Result<T, Unmet>,
    ) -> Result<T, WaitTimeout> {
        server::wait_until("discord", &self.shared.changed, timeout, || {
            check(&self.shared.lock())
        })
        .await
    }
}

/// Builds a `MESSAGE_CREATE` payload from Discord's documented example message.
#[must_use = "call push() to send it"]
pub struct DiscordMessageBuilder<'a> {
    fake: &'a FakeDiscord,
    channel_id: u64,
    author: DiscordUser,
    content: String,
    guild_id: Option<u64>,
    dm: bool,
    mentions: Vec<DiscordUser>,
    reply_to: Option<String>,
    attachments: Vec<(String, String, Vec<u8>)>,
}

impl DiscordMessageBuilder<'_> {
    /// In guild `guild_id` (default: the channel's guild, else [`DEFAULT_GUILD_ID`]).
    pub fn guild(mut self, guild_id: u64) -> Self {
        self.guild_id = Some(guild_id);
        self
    }

    /// A direct message: no `guild_id`, no `member`.
    pub fn dm(mut self) -> Self {
        self.dm = true;
        self
    }

    /// Adds `user` to the `mentions` array (the content is left as written).
    pub fn mention(mut self, user: &DiscordUser) -> Self {
        self.mentions.push(user.clone());
        self
    }

    /// Prepends `<@bot>` to the content and lists the bot in `mentions`.
    pub fn mention_bot(mut self) -> Self {
        let bot = self.fake.bot();
        self.content = format!("{} {}", bot.mention(), self.content);
        self.mentions.push(bot);
        self
    }

    /// A reply to message `message_id` (`message_reference` plus `referenced_message` when
    /// the fake knows the message).
    pub fn reply_to(mut self, message_id: impl Into<String>) -> Self {
        self.reply_to = Some(message_id.into());
        self
    }

    /// Attaches a file served by the fake.
    pub fn attachment(
        mut self,
        filename: impl Into<String>,
        content_type: impl Into<String>,
        bytes: Vec<u8>,
    ) -> Self {
        self.attachments
            .push((filename.into(), content_type.into(), bytes));
        self
    }

    /// The message object (`d` of the event).
    fn build(self) -> Value {
        let fake = self.fake;
        let id = fake.shared.snowflake().to_string();
        let mut message = example_message(&id, self.author.to_json(), &self.content);
        message["channel_id"] = json!(self.channel_id.to_string());
        message["reactions"] = json!([]);
        message["mentions"] = Value::Array(self.mentions.iter().map(|u| u.to_json()).collect());
        message["mention_everyone"] =
            json!(self.content.contains("@everyone") || self.content.contains("@here"));
        let channel = fake.shared.lock().channels.get(&self.channel_id).cloned();
        let guild_id = if self.dm || channel.as_ref().is_some_and(|c| c.kind == 1) {
            None
        } else {
            Some(
                self.guild_id
                    .or(channel.and_then(|c| c.guild_id))
                    .unwrap_or(DEFAULT_GUILD_ID),
            )
        };
        if let Some(guild_id) = guild_id {
            message["guild_id"] = json!(guild_id.to_string());
            let roles = fake
                .shared
                .lock()
                .guilds
                .get(&guild_id)
                .and_then(|g| g.members.get(&self.author.id).cloned())
                .unwrap_or_default();
            message["member"] = json!({
                "roles": roles.iter().map(u64::to_string).collect::<Vec<_>>(),
                "joined_at": "2020-01-01T00:00:00.000000+00:00",
                "deaf": false,
                "mute": false,
                "flags": 0,
                "nick": null,
            });
        }
        if let Some(reply_to) = &self.reply_to {
            message["type"] = json!(19);
            message["message_reference"] = json!({
                "type": 0,
                "message_id": reply_to,
                "channel_id": self.channel_id.to_string(),
                "guild_id": guild_id.map(|g| g.to_string()),
            });
            let referenced = fake.shared.lock().messages.get(reply_to).cloned();
            message["referenced_message"] = referenced.unwrap_or(Value::Null);
        }
        let attachments: Vec<Value> = self
            .attachments
            .into_iter()
            .map(|(filename, content_type, bytes)| {
                let size = bytes.len();
                let url = fake.add_attachment(self.channel_id, &filename, bytes);
                json!({
                    "id": fake.shared.snowflake().to_string(),
                    "filename": filename,
                    "size": size,
                    "url": url,
                    "proxy_url": url,
                    "content_type": content_type,
                })
            })
            .collect();
        message["attachments"] = Value::Array(attachments);
        message
    }

    /// Sends the `MESSAGE_CREATE` (or queues it for the next connection); returns the id.
    pub fn push(self) -> String {
        let fake = self.fake;
        let message = self.build();
        let id = message["id"].as_str().unwrap_or_default().to_owned();
        fake.dispatch("MESSAGE_CREATE", message);
        id
    }
}

// ---------------------------------------------------------------------------
// Gateway

async fn accept_gateway(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let accepted = tokio::select! {
            () = shared.cancel.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, _)) = accepted else { continue };
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let cancel = shared.cancel.clone();
            tokio::select! {
                () = cancel.cancelled() => {}
                () = serve_connection(stream, shared) => {}
            }
        });
    }
}

async fn serve_connection(stream: TcpStream, shared: Arc<Shared>) {
    let Ok(ws) = tokio_tungstenite::accept_async(stream).await else {
        return;
    };
    let (mut sink, mut source) = ws.split();
    let (tx, mut rx) = mpsc::unbounded_channel::<WsMessage>();
    let conn_id = {
        let mut inner = shared.lock();
        inner.connections += 1;
        let id = inner.connections;
        // A new connection replaces the old one, as on Discord (sharded: one per shard,
        // known once it identifies).
        if inner.shards <= 1 {
            inner.connection = Some(Connection {
                id,
                tx: tx.clone(),
                ready: false,
            });
        }
        let hello = fixture("gateway.Example_Hello_Event.L129.json");
        let _ = tx.send(WsMessage::Text(hello.to_string()));
        id
    };
    shared.changed.notify_waiters();
    let writer = tokio::spawn(async move {
        while let Some(message) = rx.recv().await {
            let close = matches!(message, WsMessage::Close(_));
            if sink.send(message).await.is_err() {
                break;
            }
            if close {
                // Give the client a moment to answer the close, then hang up.
                let _ = tokio::time::timeout(Duration::from_millis(200), sink.close()).await;
                break;
            }
        }
    });
    while let Some(Ok(frame)) = source.next().await {
        let text = match frame {
            WsMessage::Text(text) => text,
            WsMessage::Binary(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            WsMessage::Close(_) => break,
            _ => continue,
        };
        let Ok(payload) = serde_json::from_str::<Value>(&text) else {
            continue;
        };
        if !handle_gateway_payload(&shared, conn_id, &tx, &payload) {
            break;
        }
        if writer.is_finished() {
            break;
        }
    }
    {
        let mut inner = shared.lock();
        if inner.connection.as_ref().is_some_and(|c| c.id == conn_id) {
            inner.connection = None;
        }
        inner.shard_conns.retain(|_, c| c.id != conn_id);
    }
    shared.changed.notify_waiters();
    drop(tx);
    let _ = tokio::time::timeout(Duration::from_secs(1), writer).await;
}

/// Sharded mode: Identify with `shard: [i, n]`, `n` the fake's shard count, makes the
/// connection shard `i`'s (replacing an older one) and gets a READY naming the shard and
/// its servers; any other shard field is closed with 4010 (Invalid shard).
fn identify_shard(
    shared: &Shared,
    inner: &mut Inner,
    conn_id: u64,
    tx: &mpsc::UnboundedSender<WsMessage>,
    d: &Value,
) -> bool {
    let n = inner.shards;
    let shard = d
        .get("shard")
        .and_then(Value::as_array)
        .and_then(|a| Some((a.first()?.as_u64()?, a.get(1)?.as_u64()?)));
    let Some((i, _)) = shard.filter(|&(i, total)| total == u64::from(n) && i < total) else {
        let _ = tx.send(WsMessage::Close(Some(CloseFrame {
            code: CloseCode::from(4010),
            reason: "Invalid shard.".into(),
        })));
        return false;
    };
    let i = i as u32;
    if let Some(old) = inner.shard_conns.insert(
        i,
        Connection {
            id: conn_id,
            tx: tx.clone(),
            ready: true,
        },
    ) {
        let _ = old.tx.send(WsMessage::Close(Some(CloseFrame {
            code: CloseCode::from(4000),
            reason: "fake discord: replaced by a new connection".into(),
        })));
    }
    inner.shard_seq.insert(i, 1);
    let session_id = format!("fake-session-{}", shared.snowflake());
    let ready = ready_event(shared, inner, session_id, (i, n));
    let _ = tx.send(WsMessage::Text(ready.to_string()));
    flush_shard(inner, i);
    true
}

/// The READY event of session `session_id` on shard `(i, n)`: the servers of that shard,
/// each unavailable until its GUILD_CREATE, as Discord sends it.
fn ready_event(shared: &Shared, inner: &Inner, session_id: String, (i, n): (u32, u32)) -> Value {
    let guilds: Vec<Value> = inner
        .guilds
        .keys()
        .filter(|g| ((**g >> 22) % u64::from(n)) as u32 == i)
        .map(|id| json!({"id": id.to_string(), "unavailable": true}))
        .collect();
    json!({
        "op": 0,
        "s": 1,
        "t": "READY",
        "d": {
            "v": 10,
            "user": inner.bot.to_json(),
            "guilds": guilds,
            "session_id": session_id,
            "resume_gateway_url": shared.ws_url(),
            "shard": [i, n],
            "application": {"id": inner.bot.id.to_string(), "flags": 0},
        }
    })
}

/// Answers one client payload; false to hang up.
fn handle_gateway_payload(
    shared: &Shared,
    conn_id: u64,
    tx: &mpsc::UnboundedSender<WsMessage>,
    payload: &Value,
) -> bool {
    let op = payload
        .get("op")
        .and_then(Value::as_u64)
        .unwrap_or(u64::MAX);
    let d = payload.get("d").cloned().unwrap_or(Value::Null);
    let mut inner = shared.lock();
    let current = inner.connection.as_ref().is_some_and(|c| c.id == conn_id);
    let keep = match op {
        1 => {
            inner.heartbeats += 1;
            let ack = fixture("gateway.Example_Heartbeat_ACK.L161.json");
            let _ = tx.send(WsMessage::Text(ack.to_string()));
            true
        }
        2 => {
            inner.identifies.push(d.clone());
            let token = d.get("token").and_then(Value::as_str).unwrap_or_default();
            if token.trim_start_matches("Bot ") != shared.token || inner.reject_identify {
                let _ = tx.send(WsMessage::Close(Some(CloseFrame {
                    code: CloseCode::from(4004),
                    reason: "Authentication failed.".into(),
                })));
                false
            } else if inner.shards > 1 {
                identify_shard(shared, &mut inner, conn_id, tx, &d)
            } else if current {
                let session_id = format!("fake-session-{}", shared.snowflake());
                inner.session_id = Some(session_id.clone());
                inner.seq = 1;
                inner.backlog.clear();
                let ready = ready_event(shared, &inner, session_id, (0, 1));
                inner.backlog.push((1, ready.clone()));
                let _ = tx.send(WsMessage::Text(ready.to_string()));
                if let Some(conn) = inner.connection.as_mut() {
                    conn.ready = true;
                }
                flush_pending(&mut inner);
                true
            } else {
                false
            }
        }
        6 => {
            inner.resumes.push(d.clone());
            let session = d.get("session_id").and_then(Value::as_str);
            let seq = d.get("seq").and_then(Value::as_u64).unwrap_or(0);
            let token = d.get("token").and_then(Value::as_str).unwrap_or_default();
            if token.trim_start_matches("Bot ") != shared.token {
                let _ = tx.send(WsMessage::Close(Some(CloseFrame {
                    code: CloseCode::from(4004),
                    reason: "Authentication failed.".into(),
                })));
                false
            } else if current && session.is_some() && session == inner.session_id.as_deref() {
                for (s, event) in &inner.backlog {
                    if *s > seq {
                        let _ = tx.send(WsMessage::Text(event.to_string()));
                    }
                }
                inner.seq += 1;
                let resumed = json!({"op": 0, "s": inner.seq, "t": "RESUMED", "d": {}});
                let s = inner.seq;
                inner.backlog.push((s, resumed.clone()));
                let _ = tx.send(WsMessage::Text(resumed.to_string()));
                if let Some(conn) = inner.connection.as_mut() {
                    conn.ready = true;
                }
                flush_pending(&mut inner);
                true
            } else {
                let _ = tx.send(WsMessage::Text(json!({"op": 9, "d": false}).to_string()));
                true
            }
        }
        _ => true,
    };
    drop(inner);
    shared.changed.notify_waiters();
    keep
}

// ---------------------------------------------------------------------------
// REST

type Shr = State<Arc<Shared>>;

fn json_response(status: StatusCode, body: Value) -> Response {
    (status, axum::Json(body)).into_response()
}

fn discord_error(status: StatusCode, code: u64, message: &str) -> Response {
    json_response(status, json!({"code": code, "message": message}))
}

/// Discord's answer to a body that is not JSON.
fn invalid_json() -> Response {
    discord_error(
        StatusCode::BAD_REQUEST,
        50109,
        "The request body contains invalid JSON.",
    )
}

/// Discord's answer to a message with nothing to show.
fn empty_message() -> Response {
    discord_error(
        StatusCode::BAD_REQUEST,
        50006,
        "Cannot send an empty message",
    )
}

/// The `content` of a request body, `""` when absent.
fn content_of(body: &Value) -> String {
    body.get("content")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

/// A message by `author` saying `content`, from Discord's documented example message: the
/// fields every message the fake makes sets; the rest stay as in the example.
fn example_message(id: &str, author: Value, content: &str) -> Value {
    let mut message = fixture("message.Example_Message.L167.json");
    message["id"] = json!(id);
    message["author"] = author;
    message["content"] = json!(content);
    message["timestamp"] = json!(now_rfc3339());
    message
}

/// Records the request, checks the token (when `auth`) and plays a scripted failure.
fn gate(
    shared: &Shared,
    route: &str,
    method: &str,
    path: &str,
    headers: &HeaderMap,
    auth: bool,
) -> Option<Response> {
    let mut inner = shared.lock();
    inner.requests.push(DiscordRequest {
        method: method.to_owned(),
        path: path.to_owned(),
    });
    if auth {
        let expected = format!("Bot {}", shared.token);
        let given = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if given != expected {
            return Some(discord_error(
                StatusCode::UNAUTHORIZED,
                0,
                "401: Unauthorized",
            ));
        }
    }
    let failure = inner.failures.get_mut(route).and_then(VecDeque::pop_front);
    drop(inner);
    shared.changed.notify_waiters();
    failure.map(|failure| match failure {
        DiscordFailure::RateLimited {
            retry_after,
            global,
        } => {
            let mut response = json_response(
                StatusCode::TOO_MANY_REQUESTS,
                json!({
                    "message": "You are being rate limited.",
                    "retry_after": retry_after,
                    "global": global,
                }),
            );
            let headers = response.headers_mut();
            let secs = retry_after.ceil().max(0.0) as u64;
            if let Ok(value) = HeaderValue::from_str(&secs.to_string()) {
                headers.insert("retry-after", value);
            }
            if let Ok(value) = HeaderValue::from_str(&format!("{retry_after:.3}")) {
                headers.insert("x-ratelimit-reset-after", value);
            }
            headers.insert(
                "x-ratelimit-scope",
                HeaderValue::from_static(if global { "global" } else { "user" }),
            );
            response
        }
        DiscordFailure::Status {
            status,
            code,
            message,
        } => discord_error(
            StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            code,
            &message,
        ),
    })
}

async fn gateway(State(shared): Shr, uri: Uri, headers: HeaderMap) -> Response {
    if let Some(r) = gate(&shared, "gateway", "GET", uri.path(), &headers, false) {
        return r;
    }
    json_response(StatusCode::OK, json!({"url": shared.ws_url()}))
}

async fn gateway_bot(State(shared): Shr, uri: Uri, headers: HeaderMap) -> Response {
    if let Some(r) = gate(&shared, "gateway", "GET", uri.path(), &headers, true) {
        return r;
    }
    let mut body = fixture("gateway.Example_Response.L756.json");
    body["url"] = json!(shared.ws_url());
    body["shards"] = json!(1);
    json_response(StatusCode::OK, body)
}

async fn users_me(State(shared): Shr, uri: Uri, headers: HeaderMap) -> Response {
    if let Some(r) = gate(&shared, "users_me", "GET", uri.path(), &headers, true) {
        return r;
    }
    let bot = shared.lock().bot.clone();
    let mut user = bot.to_json();
    user["verified"] = json!(true);
    user["mfa_enabled"] = json!(false);
    user["flags"] = json!(0);
    json_response(StatusCode::OK, user)
}

async fn get_channel(
    State(shared): Shr,
    Path(channel): Path<String>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    if let Some(r) = gate(&shared, "get_channel", "GET", uri.path(), &headers, true) {
        return r;
    }
    let Ok(id) = channel.parse::<u64>() else {
        return discord_error(StatusCode::NOT_FOUND, 10003, "Unknown Channel");
    };
    let Some(info) = shared.lock().channels.get(&id).cloned() else {
        return discord_error(StatusCode::NOT_FOUND, 10003, "Unknown Channel");
    };
    let mut body = json!({
        "id": id.to_string(),
        "type": info.kind,
        "name": format!("channel-{id}"),
    });
    if let Some(guild) = info.guild_id {
        body["guild_id"] = json!(guild.to_string());
        body["position"] = json!(0);
        body["permission_overwrites"] = json!([]);
        body["nsfw"] = json!(false);
    }
    if let Some(parent) = info.parent_id {
        body["parent_id"] = json!(parent.to_string());
    }
    if info.kind == 1 {
        body["recipients"] = json!([]);
    }
    json_response(StatusCode::OK, body)
}

fn role_json(guild_id: u64, role_id: u64, permissions: u64) -> Value {
    json!({
        "id": role_id.to_string(),
        "name": if role_id == guild_id { "@everyone".to_owned() } else { format!("role-{role_id}") },
        "color": 0,
        "hoist": false,
        "icon": null,
        "unicode_emoji": null,
        "position": 0,
        "permissions": permissions.to_string(),
        "managed": false,
        "mentionable": false,
        "flags": 0,
    })
}

/// The registered guild `guild` (a snowflake in the path), if any.
fn known_guild(shared: &Shared, guild: &str) -> Option<(u64, GuildInfo)> {
    let id = guild.parse::<u64>().ok()?;
    let info = shared.lock().guilds.get(&id).cloned()?;
    Some((id, info))
}

async fn get_guild(
    State(shared): Shr,
    Path(guild): Path<String>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    if let Some(r) = gate(&shared, "get_guild", "GET", uri.path(), &headers, true) {
        return r;
    }
    let Some((id, info)) = known_guild(&shared, &guild) else {
        return discord_error(StatusCode::NOT_FOUND, 10004, "Unknown Guild");
    };
    json_response(
        StatusCode::OK,
        json!({
            "id": id.to_string(),
            "name": format!("guild-{id}"),
            "icon": null,
            "owner_id": info.owner_id.to_string(),
            "roles": info.roles.iter().map(|(r, p)| role_json(id, *r, *p)).collect::<Vec<_>>(),
            "emojis": [],
            "features": [],
        }),
    )
}

async fn get_roles(
    State(shared): Shr,
    Path(guild): Path<String>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    if let Some(r) = gate(&shared, "get_roles", "GET", uri.path(), &headers, true) {
        return r;
    }
    let Some((id, info)) = known_guild(&shared, &guild) else {
        return discord_error(StatusCode::NOT_FOUND, 10004, "Unknown Guild");
    };
    json_response(
        StatusCode::OK,
        Value::Array(
            info.roles
                .iter()
                .map(|(r, p)| role_json(id, *r, *p))
                .collect(),
        ),
    )
}

async fn get_member(
    State(shared): Shr,
    Path((guild, user)): Path<(String, String)>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    if let Some(r) = gate(&shared, "get_member", "GET", uri.path(), &headers, true) {
        return r;
    }
    let (Ok(guild_id), Ok(user_id)) = (guild.parse::<u64>(), user.parse::<u64>()) else {
        return discord_error(StatusCode::NOT_FOUND, 10007, "Unknown Member");
    };
    let inner = shared.lock();
    let Some(roles) = inner
        .guilds
        .get(&guild_id)
        .and_then(|g| g.members.get(&user_id))
        .cloned()
    else {
        return discord_error(StatusCode::NOT_FOUND, 10007, "Unknown Member");
    };
    drop(inner);
    json_response(
        StatusCode::OK,
        json!({
            "user": DiscordUser::new(user_id, format!("user{user_id}")).to_json(),
            "roles": roles.iter().map(u64::to_string).collect::<Vec<_>>(),
            "joined_at": "2020-01-01T00:00:00.000000+00:00",
            "deaf": false,
            "mute": false,
            "flags": 0,
        }),
    )
}

async fn typing(
    State(shared): Shr,
    Path(channel): Path<String>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    if let Some(r) = gate(&shared, "typing", "POST", uri.path(), &headers, true) {
        return r;
    }
    shared.lock().typing.push(DiscordTyping {
        channel_id: channel,
    });
    shared.changed.notify_waiters();
    StatusCode::NO_CONTENT.into_response()
}

async fn create_message(
    State(shared): Shr,
    Path(channel): Path<String>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(r) = gate(
        &shared,
        "create_message",
        "POST",
        uri.path(),
        &headers,
        true,
    ) {
        return r;
    }
    let Ok(channel_id) = channel.parse::<u64>() else {
        return discord_error(StatusCode::NOT_FOUND, 10003, "Unknown Channel");
    };
    if !shared.lock().channels.contains_key(&channel_id) {
        return discord_error(StatusCode::NOT_FOUND, 10003, "Unknown Channel");
    }
    let Ok(body) = serde_json::from_slice::<Value>(&body) else {
        return invalid_json();
    };
    let content = content_of(&body);
    if content.chars().count() > 2000 {
        return json_response(
            StatusCode::BAD_REQUEST,
            json!({
                "code": 50035,
                "message": "Invalid Form Body",
                "errors": {"content": {"_errors": [{
                    "code": "BASE_TYPE_MAX_LENGTH",
                    "message": "Must be 2000 or fewer in length."
                }]}}
            }),
        );
    }
    if let Some(invalid) = interactions::check_components(body.get("components")) {
        return invalid;
    }
    if content.trim().is_empty() && body.get("embeds").is_none() {
        return empty_message();
    }
    let nonce = match body.get("nonce") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => Some(n.to_string()),
        Some(Value::String(s)) if s.chars().count() <= 25 => Some(s.clone()),
        Some(_) => {
            return json_response(
                StatusCode::BAD_REQUEST,
                json!({
                    "code": 50035,
                    "message": "Invalid Form Body",
                    "errors": {"nonce": {"_errors": [{
                        "code": "BASE_TYPE_BAD_LENGTH",
                        "message": "Must be an integer or a string of at most 25 characters."
                    }]}}
                }),
            );
        }
    };
    let enforce_nonce = body
        .get("enforce_nonce")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let reference = body
        .get("message_reference")
        .cloned()
        .filter(|r| !r.is_null());
    let referenced = match reference
        .as_ref()
        .and_then(|r| r.get("message_id"))
        .and_then(snowflake_string)
    {
        None => None,
        Some(id) => {
            let known = shared.lock().messages.get(&id).cloned();
            let fail = reference
                .as_ref()
                .and_then(|r| r.get("fail_if_not_exists"))
                .and_then(Value::as_bool)
                .unwrap_or(true);
            if known.is_none() && fail {
                return json_response(
                    StatusCode::BAD_REQUEST,
                    json!({
                        "code": 50035,
                        "message": "Invalid Form Body",
                        "errors": {"message_reference": {"_errors": [{
                            "code": "MESSAGE_REFERENCE_UNKNOWN_MESSAGE",
                            "message": "Unknown message"
                        }]}}
                    }),
                );
            }
            known
        }
    };
    let allowed_mentions = body
        .get("allowed_mentions")
        .cloned()
        .filter(|a| !a.is_null());
    let id = shared.snowflake().to_string();
    let (bot, channel_info) = {
        let inner = shared.lock();
        (inner.bot.clone(), inner.channels.get(&channel_id).cloned())
    };
    let sent = DiscordSent {
        channel_id: channel.clone(),
        id: id.clone(),
        content: content.clone(),
        message_reference: reference.clone(),
        allowed_mentions: allowed_mentions.clone(),
        body: body.clone(),
    };
    let pings_everyone = sent.pings_everyone();
    let mut message = example_message(&id, bot.to_json(), &content);
    message["channel_id"] = json!(channel);
    message["reactions"] = json!([]);
    message["mention_everyone"] = json!(pings_everyone);
    if let Some(nonce) = &nonce {
        message["nonce"] = json!(nonce);
    }
    if let Some(components) = body.get("components").filter(|c| !c.is_null()) {
        message["components"] = components.clone();
    }
    if let Some(reference) = &reference
        && referenced.is_some()
    {
        message["type"] = json!(19);
        message["message_reference"] = json!({
            "type": 0,
            "message_id": reference.get("message_id").and_then(snowflake_string),
            "channel_id": channel,
        });
        message["referenced_message"] = referenced.unwrap_or(Value::Null);
    }
    {
        let mut inner = shared.lock();
        // Checked and claimed under one lock, so concurrent duplicates create one message.
        if let Some(nonce) = nonce.filter(|_| enforce_nonce) {
            let key = (channel_id, nonce);
            let now = std::time::Instant::now();
            let earlier = inner
                .nonces
                .get(&key)
                .filter(|(_, at)| now.duration_since(*at) < NONCE_WINDOW)
                .and_then(|(id, _)| inner.messages.get(id).cloned());
            if let Some(existing) = earlier {
                drop(inner);
                return json_response(StatusCode::OK, existing);
            }
            inner.nonces.insert(key, (id.clone(), now));
        }
        inner.sent.push(sent);
        inner.messages.insert(id.clone(), message.clone());
    }
    shared.changed.notify_waiters();
    let mut event = message.clone();
    if let Some(guild) = channel_info.and_then(|c| c.guild_id) {
        event["guild_id"] = json!(guild.to_string());
        event["member"] = json!({
            "roles": [],
            "joined_at": "2020-01-01T00:00:00.000000+00:00",
            "deaf": false,
            "mute": false,
            "flags": 0,
        });
    }
    shared.dispatch("MESSAGE_CREATE", event);
    json_response(StatusCode::OK, message)
}

async fn download(State(shared): Shr, uri: Uri, headers: HeaderMap) -> Response {
    let path = uri.path().to_owned();
    if let Some(r) = gate(&shared, "download", "GET", &path, &headers, false) {
        return r;
    }
    let bytes = {
        let mut inner = shared.lock();
        inner.downloads.push(path.clone());
        inner.attachments.get(&path).cloned()
    };
    shared.changed.notify_waiters();
    match bytes {
        Some(bytes) => (StatusCode::OK, bytes).into_response(),
        None => (StatusCode::NOT_FOUND, "Not Found").into_response(),
    }
}

async fn unknown(State(shared): Shr, method: Method, uri: Uri) -> Response {
    {
        let mut inner = shared.lock();
        inner.requests.push(DiscordRequest {
            method: method.to_string(),
            path: uri.path().to_owned(),
        });
        inner.unknown.push(format!("{method} {}", uri.path()));
    }
    shared.changed.notify_waiters();
    discord_error(StatusCode::NOT_FOUND, 0, "404: Not Found")
}

/// A snowflake given as a string or a number, as a string.
fn snowflake_string(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// Now as `2017-07-11T17:27:07.299000+00:00` (the shape of Discord's timestamps).
fn now_rfc3339() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs();
    let micros = now.subsec_micros();
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{micros:06}+00:00",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

/// Days since 1970-01-01 -> (year, month, day) (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(17_358), (2017, 7, 11));
        assert_eq!(civil_from_days(20_513), (2026, 3, 1));
    }

    #[test]
    fn fixtures_parse() {
        for (name, _) in FIXTURES {
            assert!(discord_fixture(name).is_some(), "{name}");
        }
    }
}
