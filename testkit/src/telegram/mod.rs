//! An in-process fake of the Telegram Bot API, for end-to-end tests of bots.
//!
//! [`FakeTelegram::start`] binds `127.0.0.1:0` and serves the Bot API the way
//! teloxide (`Bot::new(token).set_api_url(url)`) and other clients call it:
//! methods at `{api_url}/bot{token}/{method}` (GET or POST; JSON,
//! `application/x-www-form-urlencoded`, `multipart/form-data` or query
//! parameters; method names matched case-insensitively, so teloxide's
//! `GetUpdates` works as well as `getUpdates`) and file downloads at
//! `{api_url}/file/bot{token}/{file_path}` (percent-encoded slashes in the
//! path, as teloxide sends them, are decoded). A wrong token gets
//! `401 {"ok":false,"error_code":401,"description":"Unauthorized"}`.
//! Every answer uses the Bot API envelope: `{"ok":true,"result":...}` or
//! `{"ok":false,"error_code":N,"description":"...","parameters":{...}}`.
//!
//! Incoming traffic is scripted with [`FakeTelegram::push_update`] (raw JSON)
//! or the [`MessageBuilder`]s of [`FakeTelegram::group_message`] and
//! [`FakeTelegram::private_message`], which produce messages shaped like
//! Telegram's own (entity offsets in UTF-16 units, forum topics, reply
//! threads). `getUpdates` implements offsets, acknowledgement, long polling
//! and `allowed_updates`; `sendMessage` and friends are recorded
//! ([`FakeTelegram::sent_messages`]) and answered with full `Message`
//! objects. Failures are scripted per method with [`FakeTelegram::fail_next`].
//! The bot it impersonates is `@parlor_bot` (id 4242, first name `parlor`),
//! with privacy mode off.
//!
//! Served methods: `getMe`, `getUpdates`, `sendMessage`, `sendPhoto`,
//! `sendDocument`, `editMessageText`, `sendChatAction`, `sendMessageDraft`,
//! `getFile`, `getChatAdministrators`, `getChatMember`, `setWebhook`,
//! `deleteWebhook`, `getWebhookInfo`, `setMyCommands`, `getMyCommands`, `deleteMyCommands`,
//! `answerCallbackQuery`, `deleteMessage`. Anything else gets
//! `404 "Not Found: method not found"` and is listed by
//! [`FakeTelegram::unknown_methods`].
//!
//! Behaviour copied from the real server that tests may trip over:
//! - Sending to a chat the fake has never seen fails: `400 Bad Request: chat
//!   not found` for negative ids, `403 Forbidden: bot can't initiate
//!   conversation with a user` for positive ones. Chats become known through
//!   messages (builders, raw updates) or [`FakeTelegram::group_chat`].
//! - A reply in a supergroup carries `message_thread_id` (the id of the reply
//!   thread's root) even when the group has no topics, and sending with a
//!   `message_thread_id` that is not a forum topic fails with
//!   `400 Bad Request: message thread not found`.
//! - A message in a forum topic that replies to nothing has
//!   `reply_to_message` set to the topic's `forum_topic_created` service
//!   message.
//! - An inline keyboard button whose `callback_data` is empty or longer than
//!   64 bytes fails the send with `400 Bad Request: BUTTON_DATA_INVALID`.
//! - `answerCallbackQuery` is accepted once per callback query the fake issued
//!   ([`FakeTelegram::callback_query`], or a raw `callback_query` update); an
//!   unknown or already answered id fails with `400 Bad Request: query is too
//!   old and response timeout expired or query ID is invalid`. Answers are
//!   recorded ([`FakeTelegram::callback_answers`]).
//! - Replying (`reply_parameters` / `reply_to_message_id`) to a message the
//!   fake does not know fails with `400 Bad Request: message to be replied
//!   not found` unless `allow_sending_without_reply` is true.
//! - `parse_mode: "HTML"` is parsed: unsupported or unbalanced tags fail with
//!   `400 Bad Request: can't parse entities: ...`, and the answered message
//!   has the plain text plus entities. `Markdown`/`MarkdownV2` text is not
//!   checked and is echoed verbatim. Text longer than 4096 UTF-16 units after
//!   parsing fails with `400 Bad Request: message is too long`.
//! - A new `getUpdates` call ends a still-waiting long poll with `409
//!   Conflict: terminated by other getUpdates request; ...`.
//! - While a webhook is set (`setWebhook`, or [`FakeTelegram::set_webhook`]),
//!   `getUpdates` fails with `409 Conflict: can't use getUpdates method while
//!   webhook is active; ...`. Webhook delivery is the test's move:
//!   [`FakeTelegram::deliver_webhook`] POSTs an update (from
//!   [`MessageBuilder::webhook_update`] or [`FakeTelegram::webhook_update`]) to
//!   the registered URL with the registered secret token.
//!
//! ```
//! use std::time::Duration;
//! use parlor_testkit::{FakeTelegram, Failure, TgUser};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let fake = FakeTelegram::start("123:abc").await;
//! let alice = TgUser::new(1001, "Alice").username("alice");
//! let asked = fake
//!     .group_message(-1001234567890, alice, "what is 2+2?")
//!     .mention_bot()
//!     .push();
//! fake.fail_next("sendMessage", Failure::RetryAfter(1));
//! // Point the bot under test at `fake.api_url()` and run it, then e.g.:
//! // let sent = fake.wait_for_sent(1, Duration::from_secs(5)).await.unwrap();
//! // assert_eq!(sent[0].reply_to_message_id, Some(asked));
//! # let _ = (asked, Duration::ZERO);
//! # }
//! ```
//!
//! Avoid `#[tokio::test(start_paused = true)]` with this fake: with a paused
//! clock tokio may jump time forward while real socket I/O is in flight,
//! which ends long polls and timeouts early.
//!
//! # Layout
//! - this file: [`FakeTelegram`], the handle tests hold, and the recorded
//!   teloxide fixtures;
//! - `state`: what the fake knows and recorded, behind one lock;
//! - `http`: routing, the answer envelope, recording and scripted failures;
//! - `methods`: the Bot API methods that do more than bookkeeping;
//! - `encoding`: query, JSON, urlencoded and multipart parameter decoding;
//! - `html`: the HTML parse mode;
//! - `builders`: [`TgUser`] and [`MessageBuilder`] for incoming messages;
//! - `life`: the bot added or removed, a group upgraded, a message edited;
//! - `buttons`: inline keyboards, button presses (`callback_query`) and their answers;
//! - `webhook`: `setWebhook`, `deleteWebhook`, and delivering to the bot's URL;
//! - `records`: [`SentMessage`] and the other records, and [`Failure`].
//!
//! Binding, the server task, the state lock and bounded waits are
//! `crate::server`'s, shared with the other fakes.

mod builders;
mod buttons;
mod encoding;
mod html;
mod http;
mod life;
mod methods;
mod records;
mod state;
mod webhook;

use std::collections::VecDeque;
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::DefaultBodyLimit;
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use builders::Target;
pub use builders::{MessageBuilder, TgUser, utf16_len};
pub use buttons::CallbackQueryBuilder;
pub use records::{
    CallbackAnswer, ChatAction, EditedMessage, Failure, GetUpdatesCall, InlineButton, RecordedCall,
    SentMessage,
};
use state::{Inner, Shared, update_id};
pub use webhook::{SECRET_HEADER, Webhook, WebhookError};

use crate::server::{self, Server, Unmet, WaitTimeout, at_least};

/// A running fake Telegram Bot API server.
///
/// The server runs on a tokio task owned by this value; it stops on
/// [`FakeTelegram::shutdown`] or when the value is dropped (waiting long
/// polls then end with an empty result). All methods except `start`,
/// `wait_for_*` and `shutdown` are synchronous and never block on the
/// network.
pub struct FakeTelegram {
    shared: Arc<Shared>,
    addr: SocketAddr,
    server: Server,
    latency: server::Latency,
}

impl fmt::Debug for FakeTelegram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.shared.lock();
        f.debug_struct("FakeTelegram")
            .field("addr", &self.addr)
            .field("pending_updates", &inner.updates.len())
            .field("calls", &inner.calls.len())
            .field("sent", &inner.sent.len())
            .finish_non_exhaustive()
    }
}

impl FakeTelegram {
    /// Starts the server on `127.0.0.1:0` for bot token `token`.
    ///
    /// # Panics
    /// If no local port can be bound.
    pub async fn start(token: &str) -> Self {
        let (listener, addr) = server::loopback("telegram").await;
        let shared = Arc::new(Shared {
            token: token.to_owned(),
            inner: Mutex::new(Inner::new()),
            updates: Notify::new(),
            changed: Notify::new(),
            cancel: CancellationToken::new(),
        });
        let latency = server::Latency::new(shared.cancel.clone(), Some(is_long_poll));
        let app = Router::new()
            .fallback(http::handle)
            .layer(DefaultBodyLimit::disable())
            .layer(axum::middleware::from_fn_with_state(
                latency.clone(),
                server::with_latency,
            ))
            .with_state(Arc::clone(&shared));
        let mut server = Server::new(shared.cancel.clone());
        server.serve(listener, app);
        Self {
            shared,
            addr,
            server,
            latency,
        }
    }

    /// Adds a fixed network round trip to every later call but `getUpdates` (half before
    /// the call is handled, half after), as a real Bot API has: 20–100 ms from a VPS.
    /// Zero (the default) answers at once. Long polls are exempt: their wait is Telegram
    /// holding the call open, and an update pushed during it is answered at once.
    pub fn set_latency(&self, round_trip: Duration) {
        self.latency.set(round_trip);
    }

    /// The round trip set by [`FakeTelegram::set_latency`].
    pub fn latency(&self) -> Duration {
        self.latency.get()
    }

    /// The API URL to configure a client with: `http://127.0.0.1:PORT`
    /// (clients append `/bot{token}/{method}`).
    pub fn api_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The bound socket address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    // -- chats --------------------------------------------------------------

    /// Registers supergroup `chat_id` (or renames it) so the bot can send to
    /// it before anyone wrote there. Chats are otherwise created by the
    /// message builders (title `"group {chat_id}"`) and raw updates.
    pub fn group_chat(&self, chat_id: i64, title: &str) {
        let mut inner = self.shared.lock();
        inner.ensure_group(chat_id).json["title"] = json!(title);
    }

    /// Makes `chat_id` a forum (creating it if needed) with topic
    /// `thread_id`, so the bot may send to that `message_thread_id`.
    /// [`MessageBuilder::topic`] does this implicitly.
    pub fn forum_topic(&self, chat_id: i64, thread_id: i64) {
        let mut inner = self.shared.lock();
        let creator = inner.bot.user_json();
        inner.ensure_topic(chat_id, thread_id, &creator);
    }

    /// The stored `Message` object `message_id` of `chat_id` (incoming or
    /// sent by the bot), if the fake knows it.
    pub fn message(&self, chat_id: i64, message_id: i64) -> Option<Value> {
        self.shared.lock().message(chat_id, message_id)
    }

    /// Sets the administrators `getChatAdministrators` reports for
    /// `chat_id`: the first id is the `"creator"`, the rest are
    /// `"administrator"`s. Users are described by what the fake has seen of
    /// them (or `{"first_name":"user{id}"}`); the bot's own id gives the bot.
    pub fn set_admins(&self, chat_id: i64, user_ids: Vec<i64>) {
        let mut inner = self.shared.lock();
        inner.ensure_group(chat_id);
        inner.admins.insert(chat_id, user_ids);
    }

    // -- updates ------------------------------------------------------------

    /// Queues a raw update and returns its `update_id`. A missing
    /// `update_id` is assigned (increasing from 100000, always above every
    /// id seen). Chats, users and messages inside are remembered. The update
    /// is discarded (see [`FakeTelegram::filtered_updates`]) if its kind is
    /// excluded by the `allowed_updates` of the latest `getUpdates` call, as
    /// Telegram would never have created it; by default that excludes
    /// `chat_member`, `message_reaction` and `message_reaction_count`.
    pub fn push_update(&self, update: Value) -> i64 {
        let mut update = match update {
            Value::Object(o) => Value::Object(o),
            other => json!({ "unknown": other }),
        };
        let id = {
            let mut inner = self.shared.lock();
            let id = match update.get("update_id").and_then(Value::as_i64) {
                Some(id) => id,
                None => {
                    let id = inner.next_update_id;
                    update["update_id"] = json!(id);
                    id
                }
            };
            inner.next_update_id = inner.next_update_id.max(id + 1);
            inner.learn(&update);
            if inner.update_allowed(&update) {
                let pos = inner.updates.partition_point(|u| update_id(u) <= id);
                inner.updates.insert(pos, update);
            } else {
                inner.filtered_updates.push(update);
            }
            id
        };
        self.shared.updates.notify_waiters();
        self.shared.changed.notify_waiters();
        id
    }

    /// Starts a message from `from` in supergroup `chat_id` (normally a
    /// `-100...` id). Finish it with [`MessageBuilder::push`].
    pub fn group_message(
        &self,
        chat_id: i64,
        from: TgUser,
        text: impl Into<String>,
    ) -> MessageBuilder<'_> {
        MessageBuilder::new(self, Target::Group(chat_id), from, text.into())
    }

    /// Starts a message from `from` in their private chat with the bot
    /// (chat id = user id). Finish it with [`MessageBuilder::push`].
    pub fn private_message(&self, from: TgUser, text: impl Into<String>) -> MessageBuilder<'_> {
        MessageBuilder::new(self, Target::Private, from, text.into())
    }

    /// Updates queued and not yet acknowledged (by a `getUpdates` offset
    /// above their id), oldest first.
    pub fn pending_updates(&self) -> Vec<Value> {
        self.shared.lock().updates.iter().cloned().collect()
    }

    /// Updates discarded by `allowed_updates` (see
    /// [`FakeTelegram::push_update`]).
    pub fn filtered_updates(&self) -> Vec<Value> {
        self.shared.lock().filtered_updates.clone()
    }

    /// The highest positive `offset` any `getUpdates` call has sent, i.e.
    /// every update below it is acknowledged.
    pub fn acked_offset(&self) -> Option<i64> {
        self.shared.lock().acked_offset
    }

    /// Every `getUpdates` call's parameters, oldest first (calls answered
    /// with a scripted failure are only in [`FakeTelegram::requests`]).
    pub fn get_updates_calls(&self) -> Vec<GetUpdatesCall> {
        self.shared.lock().get_updates_calls.clone()
    }

    /// Waits until update `update_id` is acknowledged (a `getUpdates` call
    /// sent an offset above it).
    pub async fn wait_for_ack(&self, update_id: i64, timeout: Duration) -> Result<(), WaitTimeout> {
        self.wait_until(timeout, |inner| {
            if inner.acked_offset.is_some_and(|o| o > update_id) {
                Ok(())
            } else {
                Err((
                    format!("an offset above update {update_id}"),
                    format!("offset {:?}", inner.acked_offset),
                ))
            }
        })
        .await
    }

    /// Waits until every queued update is acknowledged: the bot took them all in.
    pub async fn wait_for_all_taken(&self, timeout: Duration) -> Result<(), WaitTimeout> {
        self.wait_until(timeout, |inner| {
            if inner.updates.is_empty() {
                Ok(())
            } else {
                Err((
                    "no update waiting".to_owned(),
                    format!("{} waiting", inner.updates.len()),
                ))
            }
        })
        .await
    }

    // -- files --------------------------------------------------------------

    /// Registers a downloadable file and returns its `file_path`
    /// (`"documents/file_N"`). `getFile` with `file_id` then answers
    /// `{file_id, file_unique_id, file_size, file_path}` and
    /// `GET /file/bot{token}/{file_path}` serves `bytes`.
    pub fn add_file(&self, file_id: &str, bytes: impl Into<Vec<u8>>) -> String {
        self.shared
            .lock()
            .store_file(file_id.to_owned(), Bytes::from(bytes.into()))
    }

    /// The file paths downloaded so far (successfully), oldest first.
    pub fn downloads(&self) -> Vec<String> {
        self.shared.lock().downloads.clone()
    }

    // -- failures -----------------------------------------------------------

    /// Makes the next call of `method` (case-insensitive) fail with
    /// `failure`. Failures queue per method and are consumed FIFO; a failed
    /// call has no other effect (a failed `getUpdates` acknowledges
    /// nothing). The call is still recorded.
    pub fn fail_next(&self, method: &str, failure: Failure) {
        self.fail_after(method, 0, failure);
    }

    /// Like [`FakeTelegram::fail_next`], but the failure comes after `passing` more calls of
    /// `method` have been answered normally (the second part of a long reply, say).
    pub fn fail_after(&self, method: &str, passing: usize, failure: Failure) {
        self.shared
            .lock()
            .failures
            .entry(method.to_ascii_lowercase())
            .or_default()
            .push_back((passing, failure));
    }

    /// How many scripted failures of `method` are still queued.
    pub fn pending_failures(&self, method: &str) -> usize {
        self.shared
            .lock()
            .failures
            .get(&method.to_ascii_lowercase())
            .map_or(0, VecDeque::len)
    }

    // -- inspection ---------------------------------------------------------

    /// Messages the bot sent successfully, oldest first.
    pub fn sent_messages(&self) -> Vec<SentMessage> {
        self.shared.lock().sent.clone()
    }

    /// Accepted `sendChatAction` calls, oldest first.
    pub fn chat_actions(&self) -> Vec<ChatAction> {
        self.shared.lock().actions.clone()
    }

    /// Accepted `editMessageText` calls, oldest first.
    pub fn edits(&self) -> Vec<EditedMessage> {
        self.shared.lock().edits.clone()
    }

    /// The commands from the latest `setMyCommands` (`[]` initially).
    pub fn my_commands(&self) -> Value {
        self.shared.lock().commands.clone()
    }

    /// How many calls of `method` (case-insensitive) were received,
    /// including failed ones.
    pub fn calls(&self, method: &str) -> usize {
        self.shared
            .lock()
            .calls
            .iter()
            .filter(|c| c.is(method))
            .count()
    }

    /// Every method call received with the right token, oldest first.
    pub fn requests(&self) -> Vec<RecordedCall> {
        self.shared.lock().calls.clone()
    }

    /// Names of called methods the fake does not implement (answered 404).
    pub fn unknown_methods(&self) -> Vec<String> {
        self.shared.lock().unknown.clone()
    }

    /// Waits until at least `n` messages were sent, then returns all of
    /// them.
    pub async fn wait_for_sent(
        &self,
        n: usize,
        timeout: Duration,
    ) -> Result<Vec<SentMessage>, WaitTimeout> {
        self.wait_until(timeout, |inner| at_least(&inner.sent, n, "sent message(s)"))
            .await
    }

    /// Waits until a message that `this` accepts was sent, then returns every message
    /// sent so far. A reply to a later message of the same chat (a sentinel) is how a test
    /// sees that nothing else went out before it.
    pub async fn wait_for_sent_where(
        &self,
        timeout: Duration,
        this: impl Fn(&SentMessage) -> bool,
    ) -> Result<Vec<SentMessage>, WaitTimeout> {
        self.wait_until(timeout, |inner| {
            if inner.sent.iter().any(&this) {
                Ok(inner.sent.clone())
            } else {
                Err((
                    "the awaited message".to_owned(),
                    format!("{} other sent message(s)", inner.sent.len()),
                ))
            }
        })
        .await
    }

    /// Waits until at least `n` calls of `method` were received, then
    /// returns them.
    pub async fn wait_for_calls(
        &self,
        method: &str,
        n: usize,
        timeout: Duration,
    ) -> Result<Vec<RecordedCall>, WaitTimeout> {
        self.wait_until(timeout, |inner| {
            let calls: Vec<RecordedCall> = inner
                .calls
                .iter()
                .filter(|c| c.is(method))
                .cloned()
                .collect();
            at_least(&calls, n, &format!("{method} call(s)"))
        })
        .await
    }

    /// Waits until `check` passes on the state; see [`server::wait_until`].
    async fn wait_until<T>(
        &self,
        timeout: Duration,
        check: impl Fn(&Inner) -> Result<T, Unmet>,
    ) -> Result<T, WaitTimeout> {
        server::wait_until("telegram", &self.shared.changed, timeout, || {
            check(&self.shared.lock())
        })
        .await
    }

    /// Stops the server: ends waiting long polls, closes connections and
    /// waits (bounded) for the server task to finish.
    pub async fn shutdown(mut self) {
        self.server.shutdown().await;
    }
}

/// Real payloads from teloxide v0.17.0's tests (MIT), see
/// `testkit/fixtures/telegram/README.md`: `(file name, JSON text)`.
const FIXTURES: [(&str, &str); 7] = [
    (
        "update.message.L558.json",
        include_str!("../../fixtures/telegram/update.message.L558.json"),
    ),
    (
        "update.de_private_chat_text_message.L745.json",
        include_str!("../../fixtures/telegram/update.de_private_chat_text_message.L745.json"),
    ),
    (
        "update.message_reaction_updated.L897.json",
        include_str!("../../fixtures/telegram/update.message_reaction_updated.L897.json"),
    ),
    (
        "message.topic_message.L2633.json",
        include_str!("../../fixtures/telegram/message.topic_message.L2633.json"),
    ),
    (
        "message.parse_caption_entities.L2538.json",
        include_str!("../../fixtures/telegram/message.parse_caption_entities.L2538.json"),
    ),
    (
        "message.issue_475.L2525.json",
        include_str!("../../fixtures/telegram/message.issue_475.L2525.json"),
    ),
    (
        "message.de_text.L2263.json",
        include_str!("../../fixtures/telegram/message.de_text.L2263.json"),
    ),
];

/// A real Telegram payload recorded in teloxide's tests, by file name (e.g.
/// `"message.topic_message.L2633.json"`; `update.*` files are whole
/// updates, `message.*` files are `Message` objects to wrap as
/// `{"message": ..}`). `None` for an unknown name.
pub fn teloxide_fixture(name: &str) -> Option<Value> {
    server::fixture(&FIXTURES, name)
}

/// Whether `path` (`/bot{token}/{method}`) is a `getUpdates` call, which
/// [`FakeTelegram::set_latency`] leaves alone.
fn is_long_poll(path: &str) -> bool {
    path.rsplit('/')
        .next()
        .is_some_and(|method| method.eq_ignore_ascii_case("getupdates"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixtures_parse() {
        for (name, _) in FIXTURES {
            assert!(teloxide_fixture(name).is_some(), "{name}");
        }
    }
}
