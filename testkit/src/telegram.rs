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
//!
//! Served methods: `getMe`, `getUpdates`, `sendMessage`, `sendPhoto`,
//! `sendDocument`, `editMessageText`, `sendChatAction`, `sendMessageDraft`,
//! `getFile`, `getChatAdministrators`, `getChatMember`, `deleteWebhook`,
//! `getWebhookInfo`, `setMyCommands`, `getMyCommands`, `deleteMyCommands`,
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

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long [`FakeTelegram::shutdown`] waits for the server task before
/// aborting it.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The first `update_id` handed out when an update has none.
const FIRST_UPDATE_ID: i64 = 100_000;

/// Maximum text length of a message, in UTF-16 code units after entity
/// parsing.
const MAX_TEXT_UTF16: usize = 4096;

/// Maximum caption length of a media message, in UTF-16 code units.
const MAX_CAPTION_UTF16: usize = 1024;

/// `icon_color` of the synthesized `forum_topic_created` messages.
const TOPIC_ICON_COLOR: i64 = 7_322_096;

/// Update kinds Telegram does not send unless `allowed_updates` names them.
const OPT_IN_UPDATES: [&str; 3] = ["chat_member", "message_reaction", "message_reaction_count"];

/// Chat actions `sendChatAction` accepts.
const CHAT_ACTIONS: [&str; 11] = [
    "typing",
    "upload_photo",
    "record_video",
    "upload_video",
    "record_voice",
    "upload_voice",
    "upload_document",
    "choose_sticker",
    "find_location",
    "record_video_note",
    "upload_video_note",
];

/// Width and height of the full-size photo produced by
/// [`MessageBuilder::photo`].
const PHOTO_SIZE: (i64, i64) = (1280, 960);

// ---------------------------------------------------------------------------
// Users
// ---------------------------------------------------------------------------

/// The bot the fake server impersonates, as returned by `getMe`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BotUser {
    /// The bot's user id (`4242` by default).
    pub id: i64,
    /// `first_name` (`"parlor"` by default).
    pub first_name: String,
    /// `username` without `@` (`"parlor_bot"` by default).
    pub username: String,
    /// `can_join_groups` (`true` by default).
    pub can_join_groups: bool,
    /// `can_read_all_group_messages`, i.e. privacy mode off (`true` by
    /// default).
    pub can_read_all_group_messages: bool,
    /// `supports_inline_queries` (`false` by default).
    pub supports_inline_queries: bool,
    /// `can_connect_to_business` (`false` by default).
    pub can_connect_to_business: bool,
    /// `has_main_web_app` (`false` by default). teloxide requires the field.
    pub has_main_web_app: bool,
}

impl Default for BotUser {
    fn default() -> Self {
        Self {
            id: 4242,
            first_name: "parlor".to_owned(),
            username: "parlor_bot".to_owned(),
            can_join_groups: true,
            can_read_all_group_messages: true,
            supports_inline_queries: false,
            can_connect_to_business: false,
            has_main_web_app: false,
        }
    }
}

impl BotUser {
    /// The bot as a `User` object (what appears in `from` of its messages).
    pub fn user_json(&self) -> Value {
        json!({
            "id": self.id,
            "is_bot": true,
            "first_name": self.first_name,
            "username": self.username,
        })
    }

    /// The bot as `getMe` returns it: the `User` fields plus the bot-only
    /// capability flags.
    pub fn me_json(&self) -> Value {
        let mut me = self.user_json();
        let extra = json!({
            "can_join_groups": self.can_join_groups,
            "can_read_all_group_messages": self.can_read_all_group_messages,
            "supports_inline_queries": self.supports_inline_queries,
            "can_connect_to_business": self.can_connect_to_business,
            "has_main_web_app": self.has_main_web_app,
        });
        merge(&mut me, extra);
        me
    }
}

/// A (human, by default) Telegram user that sends messages to the bot.
///
/// `TgUser::from((id, first_name, username))` and
/// `TgUser::from((id, first_name))` are shorthands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TgUser {
    /// The user id; also the chat id of the private chat with the bot.
    pub id: i64,
    /// `first_name`.
    pub first_name: String,
    /// `last_name`, omitted when `None`.
    pub last_name: Option<String>,
    /// `username` without `@`, omitted when `None`.
    pub username: Option<String>,
    /// `language_code`, omitted when `None`.
    pub language_code: Option<String>,
    /// `is_bot`.
    pub is_bot: bool,
}

impl TgUser {
    /// A human user with only an id and a first name.
    pub fn new(id: i64, first_name: impl Into<String>) -> Self {
        Self {
            id,
            first_name: first_name.into(),
            last_name: None,
            username: None,
            language_code: None,
            is_bot: false,
        }
    }

    /// Sets `username` (without `@`).
    pub fn username(mut self, username: impl Into<String>) -> Self {
        self.username = Some(username.into());
        self
    }

    /// Sets `last_name`.
    pub fn last_name(mut self, last_name: impl Into<String>) -> Self {
        self.last_name = Some(last_name.into());
        self
    }

    /// Sets `language_code`, e.g. `"en"`.
    pub fn language_code(mut self, code: impl Into<String>) -> Self {
        self.language_code = Some(code.into());
        self
    }

    /// Marks the user as a bot (`is_bot: true`).
    pub fn bot(mut self) -> Self {
        self.is_bot = true;
        self
    }

    /// The `User` object.
    pub fn to_json(&self) -> Value {
        let mut user = json!({
            "id": self.id,
            "is_bot": self.is_bot,
            "first_name": self.first_name,
        });
        if let Some(v) = &self.last_name {
            user["last_name"] = json!(v);
        }
        if let Some(v) = &self.username {
            user["username"] = json!(v);
        }
        if let Some(v) = &self.language_code {
            user["language_code"] = json!(v);
        }
        user
    }

    fn private_chat_json(&self) -> Value {
        let mut chat = json!({
            "id": self.id,
            "type": "private",
            "first_name": self.first_name,
        });
        if let Some(v) = &self.last_name {
            chat["last_name"] = json!(v);
        }
        if let Some(v) = &self.username {
            chat["username"] = json!(v);
        }
        chat
    }
}

impl From<(i64, &str, &str)> for TgUser {
    fn from((id, first_name, username): (i64, &str, &str)) -> Self {
        Self::new(id, first_name).username(username)
    }
}

impl From<(i64, &str)> for TgUser {
    fn from((id, first_name): (i64, &str)) -> Self {
        Self::new(id, first_name)
    }
}

// ---------------------------------------------------------------------------
// Failures
// ---------------------------------------------------------------------------

/// A scripted error answer, queued per method with
/// [`FakeTelegram::fail_next`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// `429 {"description":"Too Many Requests: retry after N","parameters":{"retry_after":N}}`
    /// (teloxide: `RequestError::RetryAfter`).
    RetryAfter(u32),
    /// `409 Conflict: terminated by other getUpdates request; make sure that
    /// only one bot instance is running` (teloxide:
    /// `RequestError::Api(ApiError::TerminatedByOtherGetUpdates)`).
    Conflict,
    /// `400` with this description; `"Bad Request: "` is prepended unless
    /// already present.
    BadRequest(String),
    /// `400 Bad Request: group chat was upgraded to a supergroup chat` with
    /// `parameters.migrate_to_chat_id` (teloxide:
    /// `RequestError::MigrateToChatId`).
    MigrateToChatId(i64),
    /// Any status with this exact description. An invalid status becomes
    /// 500. Note that teloxide sleeps 10 s before reading any 5xx answer.
    Status(u16, String),
}

impl Failure {
    fn render(&self) -> Response {
        match self {
            Self::RetryAfter(secs) => api_error_with(
                StatusCode::TOO_MANY_REQUESTS,
                &format!("Too Many Requests: retry after {secs}"),
                json!({"retry_after": secs}),
            ),
            Self::Conflict => api_error(
                StatusCode::CONFLICT,
                "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running",
            ),
            Self::BadRequest(desc) => {
                let desc = if desc.starts_with("Bad Request") {
                    desc.clone()
                } else {
                    format!("Bad Request: {desc}")
                };
                api_error(StatusCode::BAD_REQUEST, &desc)
            }
            Self::MigrateToChatId(to) => api_error_with(
                StatusCode::BAD_REQUEST,
                "Bad Request: group chat was upgraded to a supergroup chat",
                json!({"migrate_to_chat_id": to}),
            ),
            Self::Status(code, desc) => api_error(
                StatusCode::from_u16(*code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                desc,
            ),
        }
    }
}

// ---------------------------------------------------------------------------
// Records
// ---------------------------------------------------------------------------

/// A message the bot sent (`sendMessage`, `sendPhoto` or `sendDocument`)
/// and the fake accepted.
#[derive(Debug, Clone, PartialEq)]
pub struct SentMessage {
    /// The method as it was called, e.g. `"sendMessage"` or `"SendMessage"`.
    pub method: String,
    /// The target chat.
    pub chat_id: i64,
    /// The `message_id` the fake assigned.
    pub message_id: i64,
    /// `text` exactly as sent (for media: the `caption`, or empty).
    pub text: String,
    /// `parse_mode`, e.g. `"HTML"`.
    pub parse_mode: Option<String>,
    /// `reply_parameters.message_id` (or the legacy `reply_to_message_id`).
    pub reply_to_message_id: Option<i64>,
    /// `message_thread_id`.
    pub thread_id: Option<i64>,
    /// `reply_markup`, if any.
    pub reply_markup: Option<Value>,
    /// For media: the `file_id` of the sent photo or document.
    pub file_id: Option<String>,
    /// All request parameters (file parts appear as
    /// `{"file_name":..,"size":..}`).
    pub params: Value,
    /// The `Message` object the fake answered with.
    pub message: Value,
}

/// A `sendChatAction` call the fake accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatAction {
    /// The target chat.
    pub chat_id: i64,
    /// The action, e.g. `"typing"`.
    pub action: String,
    /// `message_thread_id`, if any.
    pub thread_id: Option<i64>,
}

/// An `editMessageText` call the fake accepted.
#[derive(Debug, Clone, PartialEq)]
pub struct EditedMessage {
    /// The chat of the edited message.
    pub chat_id: i64,
    /// The edited message.
    pub message_id: i64,
    /// The new text exactly as sent.
    pub text: String,
    /// `parse_mode`, if any.
    pub parse_mode: Option<String>,
    /// All request parameters.
    pub params: Value,
}

/// The parameters of one `getUpdates` call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GetUpdatesCall {
    /// `offset`, if given.
    pub offset: Option<i64>,
    /// `limit`, if given.
    pub limit: Option<i64>,
    /// `timeout` in seconds, if given.
    pub timeout: Option<i64>,
    /// `allowed_updates`, if given.
    pub allowed_updates: Option<Vec<String>>,
}

/// One Bot API method call as the fake received it (with the right token).
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedCall {
    /// The method name as it appeared in the URL, e.g. `"GetUpdates"`.
    pub method: String,
    /// The HTTP method, e.g. `"POST"`.
    pub http_method: String,
    /// The `Content-Type` header, if any.
    pub content_type: Option<String>,
    /// Query and body parameters merged into one object (body wins). Values
    /// from query strings, forms and multipart text fields stay strings;
    /// multipart file parts appear as `{"file_name":..,"size":..}`.
    pub params: Value,
}

impl RecordedCall {
    /// Whether this is a call of `method` (compared case-insensitively).
    pub fn is(&self, method: &str) -> bool {
        self.method.eq_ignore_ascii_case(method)
    }
}

/// Returned by the `wait_for_*` methods of [`FakeTelegram`] when the awaited
/// condition did not happen in time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TelegramWaitTimeout {
    /// What was awaited, e.g. `"3 sent message(s)"`.
    pub wanted: String,
    /// What had happened when the wait gave up, e.g. `"1"`.
    pub seen: String,
    /// How long the wait lasted.
    pub timeout: Duration,
}

impl fmt::Display for TelegramWaitTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "fake telegram: waited {:?} for {} but saw {}",
            self.timeout, self.wanted, self.seen
        )
    }
}

impl std::error::Error for TelegramWaitTimeout {}

// ---------------------------------------------------------------------------
// Message builder
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
enum Target {
    Group(i64),
    Private,
}

/// Builds an incoming message; created by [`FakeTelegram::group_message`]
/// and [`FakeTelegram::private_message`]. Finish with
/// [`MessageBuilder::push`] (queue it as an update) or
/// [`MessageBuilder::build`].
#[derive(Debug)]
#[must_use = "a message builder does nothing until .push() or .build()"]
pub struct MessageBuilder<'a> {
    fake: &'a FakeTelegram,
    target: Target,
    from: TgUser,
    text: String,
    mention: bool,
    command: Option<String>,
    reply_to: Option<(i64, bool)>,
    topic: Option<i64>,
    photo: Option<(String, u64)>,
    date: Option<i64>,
    extra_entities: Vec<Value>,
    fields: Map<String, Value>,
}

impl MessageBuilder<'_> {
    /// Mentions the bot with a `mention` entity. If the text already contains
    /// `@{bot username}` the entity covers that; otherwise `"@{username} "`
    /// is prepended.
    pub fn mention_bot(mut self) -> Self {
        self.mention = true;
        self
    }

    /// Makes the message a reply to `message_id` in the same chat. The
    /// embedded `reply_to_message` is the stored message if the fake knows it
    /// (messages it built, received in raw updates or sent for the bot);
    /// otherwise a text message synthesized from the bot (`from_bot`) or from
    /// a user `{"id":1,"first_name":"someone"}`. In a supergroup the reply
    /// also gets `message_thread_id` (the reply thread's root), like
    /// Telegram's.
    pub fn reply_to(mut self, message_id: i64, from_bot: bool) -> Self {
        self.reply_to = Some((message_id, from_bot));
        self
    }

    /// Starts the text with the bot command `command` (e.g. `"/reset"` or
    /// `"/reset@parlor_bot"`) and adds its `bot_command` entity. If the text
    /// already starts with it, only the entity is added.
    pub fn command(mut self, command: impl Into<String>) -> Self {
        self.command = Some(command.into());
        self
    }

    /// Posts the message in forum topic `thread_id`: `message_thread_id`,
    /// `is_topic_message: true`, and the chat becomes a forum
    /// (`is_forum: true`, also for later messages). Without
    /// [`MessageBuilder::reply_to`], `reply_to_message` is the topic's
    /// `forum_topic_created` service message, as Telegram sends it. No-op for
    /// private messages.
    pub fn topic(mut self, thread_id: i64) -> Self {
        self.topic = Some(thread_id);
        self
    }

    /// Makes it a photo message: `photo` holds a 90×90 thumbnail (file id
    /// `"{file_id}-thumb"`, unknown to `getFile` unless added) and then the
    /// full photo (`file_id`, 1280×960, `file_size`); the text becomes the
    /// `caption` (omitted if empty) and entities become `caption_entities`.
    pub fn photo(mut self, file_id: impl Into<String>, file_size: u64) -> Self {
        self.photo = Some((file_id.into(), file_size));
        self
    }

    /// Makes the sender a bot (`from.is_bot: true`), e.g. another bot in the
    /// group. (Telegram never delivers the bot's own messages.)
    pub fn from_bot(mut self) -> Self {
        self.from.is_bot = true;
        self
    }

    /// Sets `date` (unix seconds; defaults to now).
    pub fn date(mut self, unix_secs: i64) -> Self {
        self.date = Some(unix_secs);
        self
    }

    /// Adds a raw `MessageEntity` object (offsets in UTF-16 units of the
    /// final text).
    pub fn entity(mut self, entity: Value) -> Self {
        self.extra_entities.push(entity);
        self
    }

    /// Sets (or overrides) a top-level field of the message JSON.
    pub fn field(mut self, key: impl Into<String>, value: Value) -> Self {
        self.fields.insert(key.into(), value);
        self
    }

    /// Queues the message as `{"update_id":..,"message":..}` and returns its
    /// `message_id`.
    pub fn push(self) -> i64 {
        let fake = self.fake;
        let message = self.build();
        let id = message["message_id"].as_i64().unwrap_or_default();
        fake.push_update(json!({ "message": message }));
        id
    }

    /// Creates the message (assigning its `message_id` and remembering it for
    /// replies) without queuing an update, and returns its JSON, e.g. to wrap
    /// it in an `edited_message` update for [`FakeTelegram::push_update`].
    pub fn build(self) -> Value {
        let bot = self.fake.shared.lock().bot.username.clone();
        let mention = format!("@{bot}");
        let mut text = self.text;
        if self.mention && !text.contains(&mention) {
            text = join_words(&mention, &text);
        }
        let mut entities = Vec::new();
        let mut search_from = 0;
        if let Some(cmd) = &self.command {
            if !text.starts_with(cmd.as_str()) {
                text = join_words(cmd, &text);
            }
            entities.push(entity("bot_command", 0, utf16_len(cmd)));
            search_from = cmd.len();
        }
        if self.mention
            && let Some(pos) = text[search_from..].find(&mention)
        {
            let start = search_from + pos;
            entities.push(entity(
                "mention",
                utf16_len(&text[..start]),
                utf16_len(&mention),
            ));
        }
        entities.extend(self.extra_entities);
        sort_entities(&mut entities);

        let mut content = Map::new();
        match self.photo {
            Some((file_id, size)) => {
                content.insert(
                    "photo".into(),
                    json!([
                        {
                            "file_id": format!("{file_id}-thumb"),
                            "file_unique_id": unique_id(&format!("{file_id}-thumb")),
                            "file_size": size / 40 + 1,
                            "width": 90,
                            "height": 68,
                        },
                        {
                            "file_id": file_id,
                            "file_unique_id": unique_id(&file_id),
                            "file_size": size,
                            "width": PHOTO_SIZE.0,
                            "height": PHOTO_SIZE.1,
                        },
                    ]),
                );
                if !text.is_empty() {
                    content.insert("caption".into(), json!(text));
                }
                if !entities.is_empty() {
                    content.insert("caption_entities".into(), Value::Array(entities));
                }
            }
            None => {
                content.insert("text".into(), json!(text));
                if !entities.is_empty() {
                    content.insert("entities".into(), Value::Array(entities));
                }
            }
        }
        content.extend(self.fields);

        let mut st = self.fake.shared.lock();
        st.remember_user(&self.from.to_json());
        let chat_id = match self.target {
            Target::Group(id) => {
                st.ensure_group(id);
                id
            }
            Target::Private => {
                st.ensure_private(&self.from);
                self.from.id
            }
        };
        let topic = match self.target {
            Target::Group(_) => self.topic,
            Target::Private => None,
        };
        if let Some(thread_id) = topic {
            st.ensure_topic(chat_id, thread_id, &self.from.to_json());
        }
        let reply = self.reply_to.map(|(id, from_bot)| {
            st.message(chat_id, id)
                .unwrap_or_else(|| st.synthesize_message(chat_id, id, from_bot))
        });
        st.compose(Compose {
            chat_id,
            from: self.from.to_json(),
            date: self.date.unwrap_or_else(now_unix),
            reply,
            thread: topic,
            content,
        })
    }
}

fn join_words(first: &str, rest: &str) -> String {
    if rest.is_empty() {
        first.to_owned()
    } else {
        format!("{first} {rest}")
    }
}

fn entity(kind: &str, offset: usize, length: usize) -> Value {
    json!({"type": kind, "offset": offset, "length": length})
}

/// Sorts entities like Telegram: by offset, longer (outer) first.
fn sort_entities(entities: &mut [Value]) {
    entities.sort_by_key(|e| {
        (
            e["offset"].as_i64().unwrap_or_default(),
            -e["length"].as_i64().unwrap_or_default(),
        )
    });
}

/// The length of `s` in UTF-16 code units, the unit of Telegram's entity
/// offsets and lengths.
pub fn utf16_len(s: &str) -> usize {
    s.encode_utf16().count()
}

// ---------------------------------------------------------------------------
// State
// ---------------------------------------------------------------------------

#[derive(Debug)]
struct ChatState {
    /// The `Chat` object, without `is_forum`.
    json: Value,
    is_forum: bool,
    /// Forum topics: thread id -> name.
    topics: BTreeMap<i64, String>,
    next_message_id: i64,
}

impl ChatState {
    fn new(json: Value) -> Self {
        let is_forum = json.get("is_forum").and_then(Value::as_bool) == Some(true);
        let mut json = json;
        if let Some(obj) = json.as_object_mut() {
            obj.remove("is_forum");
        }
        Self {
            json,
            is_forum,
            topics: BTreeMap::new(),
            next_message_id: 1,
        }
    }

    fn chat_json(&self) -> Value {
        let mut chat = self.json.clone();
        if self.is_forum {
            chat["is_forum"] = json!(true);
        }
        chat
    }

    fn is_supergroup(&self) -> bool {
        self.json.get("type").and_then(Value::as_str) == Some("supergroup")
    }

    fn is_private(&self) -> bool {
        self.json.get("type").and_then(Value::as_str) == Some("private")
    }
}

#[derive(Debug)]
struct StoredFile {
    unique_id: String,
    path: String,
    bytes: Bytes,
}

struct Compose {
    chat_id: i64,
    from: Value,
    date: i64,
    reply: Option<Value>,
    thread: Option<i64>,
    content: Map<String, Value>,
}

#[derive(Debug)]
struct Inner {
    bot: BotUser,
    updates: VecDeque<Value>,
    next_update_id: i64,
    allowed_updates: Option<Vec<String>>,
    filtered_updates: Vec<Value>,
    acked_offset: Option<i64>,
    poll_generation: u64,
    get_updates_calls: Vec<GetUpdatesCall>,
    chats: HashMap<i64, ChatState>,
    users: HashMap<i64, Value>,
    messages: HashMap<(i64, i64), Value>,
    files: HashMap<String, StoredFile>,
    next_file: u64,
    downloads: Vec<String>,
    admins: HashMap<i64, Vec<i64>>,
    /// Per method: scripted failures, each after that many calls still pass.
    failures: HashMap<String, VecDeque<(usize, Failure)>>,
    calls: Vec<RecordedCall>,
    unknown: Vec<String>,
    sent: Vec<SentMessage>,
    actions: Vec<ChatAction>,
    edits: Vec<EditedMessage>,
    commands: Value,
}

impl Inner {
    fn new(bot: BotUser) -> Self {
        Self {
            bot,
            updates: VecDeque::new(),
            next_update_id: FIRST_UPDATE_ID,
            allowed_updates: None,
            filtered_updates: Vec::new(),
            acked_offset: None,
            poll_generation: 0,
            get_updates_calls: Vec::new(),
            chats: HashMap::new(),
            users: HashMap::new(),
            messages: HashMap::new(),
            files: HashMap::new(),
            next_file: 1,
            downloads: Vec::new(),
            admins: HashMap::new(),
            failures: HashMap::new(),
            calls: Vec::new(),
            unknown: Vec::new(),
            sent: Vec::new(),
            actions: Vec::new(),
            edits: Vec::new(),
            commands: json!([]),
        }
    }

    fn remember_user(&mut self, user: &Value) {
        if let Some(id) = user.get("id").and_then(Value::as_i64) {
            self.users.insert(id, user.clone());
        }
    }

    fn ensure_group(&mut self, chat_id: i64) -> &mut ChatState {
        self.chats.entry(chat_id).or_insert_with(|| {
            ChatState::new(json!({
                "id": chat_id,
                "type": "supergroup",
                "title": format!("group {chat_id}"),
            }))
        })
    }

    fn ensure_private(&mut self, user: &TgUser) {
        self.chats
            .entry(user.id)
            .or_insert_with(|| ChatState::new(user.private_chat_json()));
    }

    fn ensure_topic(&mut self, chat_id: i64, thread_id: i64, creator: &Value) {
        let chat = self.ensure_group(chat_id);
        chat.is_forum = true;
        if chat.topics.contains_key(&thread_id) {
            return;
        }
        let name = format!("topic {thread_id}");
        chat.topics.insert(thread_id, name.clone());
        chat.next_message_id = chat.next_message_id.max(thread_id + 1);
        let chat_json = chat.chat_json();
        self.messages
            .entry((chat_id, thread_id))
            .or_insert_with(|| {
                json!({
                    "message_id": thread_id,
                    "message_thread_id": thread_id,
                    "is_topic_message": true,
                    "from": creator,
                    "chat": chat_json,
                    "date": now_unix() - 60,
                    "forum_topic_created": {"name": name, "icon_color": TOPIC_ICON_COLOR},
                })
            });
    }

    fn chat_json(&self, chat_id: i64) -> Value {
        self.chats.get(&chat_id).map_or_else(
            || json!({"id": chat_id, "type": "supergroup"}),
            ChatState::chat_json,
        )
    }

    fn message(&self, chat_id: i64, message_id: i64) -> Option<Value> {
        self.messages.get(&(chat_id, message_id)).cloned()
    }

    fn synthesize_message(&self, chat_id: i64, message_id: i64, from_bot: bool) -> Value {
        let from = if from_bot {
            self.bot.user_json()
        } else {
            json!({"id": 1, "is_bot": false, "first_name": "someone"})
        };
        json!({
            "message_id": message_id,
            "from": from,
            "chat": self.chat_json(chat_id),
            "date": now_unix() - 60,
            "text": "(earlier message)",
        })
    }

    fn alloc_message_id(&mut self, chat_id: i64) -> i64 {
        let chat = self
            .chats
            .entry(chat_id)
            .or_insert_with(|| ChatState::new(json!({"id": chat_id, "type": "supergroup"})));
        let id = chat.next_message_id;
        chat.next_message_id += 1;
        id
    }

    /// Creates, stores and returns a new message in `c.chat_id`.
    fn compose(&mut self, c: Compose) -> Value {
        let message_id = self.alloc_message_id(c.chat_id);
        let (chat_json, supergroup, topic_name) = {
            let chat = &self.chats[&c.chat_id];
            (
                chat.chat_json(),
                chat.is_supergroup(),
                c.thread.and_then(|t| chat.topics.get(&t).cloned()),
            )
        };
        let mut msg = json!({
            "message_id": message_id,
            "from": c.from,
            "chat": chat_json.clone(),
            "date": c.date,
        });
        let reply = c.reply.map(|mut r| {
            if let Some(obj) = r.as_object_mut() {
                obj.remove("reply_to_message");
            }
            r
        });
        match (c.thread, reply) {
            (Some(thread), reply) => {
                msg["message_thread_id"] = json!(thread);
                msg["is_topic_message"] = json!(true);
                let reply = reply
                    .or_else(|| self.message(c.chat_id, thread))
                    .unwrap_or_else(|| {
                        let name = topic_name.unwrap_or_else(|| format!("topic {thread}"));
                        json!({
                            "message_id": thread,
                            "message_thread_id": thread,
                            "is_topic_message": true,
                            "chat": chat_json,
                            "date": c.date,
                            "forum_topic_created": {"name": name, "icon_color": TOPIC_ICON_COLOR},
                        })
                    });
                msg["reply_to_message"] = reply;
            }
            (None, Some(reply)) => {
                if supergroup {
                    let root = reply
                        .get("message_thread_id")
                        .and_then(Value::as_i64)
                        .or_else(|| reply.get("message_id").and_then(Value::as_i64));
                    if let Some(root) = root {
                        msg["message_thread_id"] = json!(root);
                    }
                    if reply.get("is_topic_message").and_then(Value::as_bool) == Some(true) {
                        msg["is_topic_message"] = json!(true);
                    }
                }
                msg["reply_to_message"] = reply;
            }
            (None, None) => {}
        }
        merge(&mut msg, Value::Object(c.content));
        self.messages.insert((c.chat_id, message_id), msg.clone());
        msg
    }

    /// Learns chats, users and messages from a raw update.
    fn learn(&mut self, update: &Value) {
        for key in [
            "message",
            "edited_message",
            "channel_post",
            "edited_channel_post",
            "business_message",
            "edited_business_message",
        ] {
            let Some(msg) = update.get(key) else { continue };
            let Some(chat) = msg.get("chat") else {
                continue;
            };
            let Some(chat_id) = chat.get("id").and_then(Value::as_i64) else {
                continue;
            };
            let state = self
                .chats
                .entry(chat_id)
                .or_insert_with(|| ChatState::new(chat.clone()));
            if chat.get("is_forum").and_then(Value::as_bool) == Some(true) {
                state.is_forum = true;
            }
            if let Some(mid) = msg.get("message_id").and_then(Value::as_i64) {
                state.next_message_id = state.next_message_id.max(mid + 1);
                if msg.get("is_topic_message").and_then(Value::as_bool) == Some(true)
                    && let Some(thread) = msg.get("message_thread_id").and_then(Value::as_i64)
                {
                    state
                        .topics
                        .entry(thread)
                        .or_insert_with(|| format!("topic {thread}"));
                }
                self.messages.insert((chat_id, mid), msg.clone());
            }
            if let Some(from) = msg.get("from") {
                self.remember_user(from);
            }
        }
    }

    fn update_allowed(&self, update: &Value) -> bool {
        let Some(kind) = update
            .as_object()
            .and_then(|o| o.keys().find(|k| k.as_str() != "update_id"))
        else {
            return true;
        };
        match &self.allowed_updates {
            Some(allowed) => allowed.iter().any(|a| a == kind),
            None => !OPT_IN_UPDATES.contains(&kind.as_str()),
        }
    }

    fn apply_offset(&mut self, offset: i64) {
        if offset > 0 {
            self.updates.retain(|u| update_id(u) >= offset);
            self.acked_offset = Some(self.acked_offset.map_or(offset, |o| o.max(offset)));
        } else if offset < 0 {
            let keep = usize::try_from(offset.unsigned_abs()).unwrap_or(usize::MAX);
            while self.updates.len() > keep {
                self.updates.pop_front();
            }
        }
    }

    fn file_json(&self, file_id: &str) -> Option<Value> {
        self.files.get(file_id).map(|f| {
            json!({
                "file_id": file_id,
                "file_unique_id": f.unique_id,
                "file_size": f.bytes.len(),
                "file_path": f.path,
            })
        })
    }

    fn store_file(&mut self, file_id: String, bytes: Bytes) -> String {
        let path = format!("documents/file_{}", self.next_file);
        self.next_file += 1;
        self.files.insert(
            file_id.clone(),
            StoredFile {
                unique_id: unique_id(&file_id),
                path: path.clone(),
                bytes,
            },
        );
        path
    }

    fn user_json(&self, user_id: i64) -> Value {
        if user_id == self.bot.id {
            return self.bot.user_json();
        }
        self.users.get(&user_id).cloned().unwrap_or_else(
            || json!({"id": user_id, "is_bot": false, "first_name": format!("user{user_id}")}),
        )
    }
}

fn update_id(update: &Value) -> i64 {
    update
        .get("update_id")
        .and_then(Value::as_i64)
        .unwrap_or_default()
}

struct Shared {
    token: String,
    inner: Mutex<Inner>,
    /// Woken when updates are pushed or a new `getUpdates` starts.
    updates: Notify,
    /// Woken when anything is recorded (calls, sent messages, offsets).
    changed: Notify,
    cancel: CancellationToken,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Critical sections never leave the state half-updated in a way that
        // matters to tests, so recover from poisoning.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

// ---------------------------------------------------------------------------
// The fake
// ---------------------------------------------------------------------------

/// A running fake Telegram Bot API server.
///
/// The server runs on a tokio task owned by this value; it stops on
/// [`FakeTelegram::shutdown`] or when the value is dropped (waiting long
/// polls then end with an empty result). All methods except `start*`,
/// `wait_for_*` and `shutdown` are synchronous and never block on the
/// network.
pub struct FakeTelegram {
    shared: Arc<Shared>,
    addr: SocketAddr,
    task: Option<JoinHandle<()>>,
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
    /// Starts the server on `127.0.0.1:0` for bot token `token`, with the
    /// default [`BotUser`].
    ///
    /// # Panics
    /// If no local port can be bound (see [`FakeTelegram::try_start`]).
    pub async fn start(token: &str) -> Self {
        Self::start_with(token, BotUser::default()).await
    }

    /// Like [`FakeTelegram::start`], impersonating `bot`.
    ///
    /// # Panics
    /// If no local port can be bound.
    pub async fn start_with(token: &str, bot: BotUser) -> Self {
        match Self::try_start(token, bot).await {
            Ok(fake) => fake,
            Err(e) => panic!("fake telegram: cannot bind 127.0.0.1:0: {e}"),
        }
    }

    /// Starts the server on `127.0.0.1:0`, returning the bind error if any.
    pub async fn try_start(token: &str, bot: BotUser) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            token: token.to_owned(),
            inner: Mutex::new(Inner::new(bot)),
            updates: Notify::new(),
            changed: Notify::new(),
            cancel: CancellationToken::new(),
        });
        let app = Router::new()
            .fallback(handle)
            .layer(DefaultBodyLimit::disable())
            .with_state(Arc::clone(&shared));
        let serve = axum::serve(listener, app)
            .with_graceful_shutdown(shared.cancel.clone().cancelled_owned());
        let task = tokio::spawn(async move {
            // An error here means the server is gone, which tests notice
            // through failed requests.
            let _ = serve.await;
        });
        Ok(Self {
            shared,
            addr,
            task: Some(task),
        })
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

    /// The bot token the fake accepts.
    pub fn token(&self) -> &str {
        &self.shared.token
    }

    /// The bot the fake impersonates.
    pub fn bot(&self) -> BotUser {
        self.shared.lock().bot.clone()
    }

    /// Replaces the impersonated bot (affects later answers and builders).
    pub fn set_bot(&self, bot: BotUser) {
        self.shared.lock().bot = bot;
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
        from: impl Into<TgUser>,
        text: impl Into<String>,
    ) -> MessageBuilder<'_> {
        self.builder(Target::Group(chat_id), from.into(), text.into())
    }

    /// Starts a message from `from` in their private chat with the bot
    /// (chat id = user id). Finish it with [`MessageBuilder::push`].
    pub fn private_message(
        &self,
        from: impl Into<TgUser>,
        text: impl Into<String>,
    ) -> MessageBuilder<'_> {
        self.builder(Target::Private, from.into(), text.into())
    }

    fn builder(&self, target: Target, from: TgUser, text: String) -> MessageBuilder<'_> {
        MessageBuilder {
            fake: self,
            target,
            from,
            text,
            mention: false,
            command: None,
            reply_to: None,
            topic: None,
            photo: None,
            date: None,
            extra_entities: Vec::new(),
            fields: Map::new(),
        }
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
    pub async fn wait_for_ack(
        &self,
        update_id: i64,
        timeout: Duration,
    ) -> Result<(), TelegramWaitTimeout> {
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

    /// The bytes of a registered or uploaded file.
    pub fn file_bytes(&self, file_id: &str) -> Option<Vec<u8>> {
        self.shared
            .lock()
            .files
            .get(file_id)
            .map(|f| f.bytes.to_vec())
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

    /// The calls of `method` (case-insensitive), oldest first.
    pub fn requests_for(&self, method: &str) -> Vec<RecordedCall> {
        self.shared
            .lock()
            .calls
            .iter()
            .filter(|c| c.is(method))
            .cloned()
            .collect()
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
    ) -> Result<Vec<SentMessage>, TelegramWaitTimeout> {
        self.wait_until(timeout, |inner| {
            if inner.sent.len() >= n {
                Ok(inner.sent.clone())
            } else {
                Err((format!("{n} sent message(s)"), inner.sent.len().to_string()))
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
    ) -> Result<Vec<RecordedCall>, TelegramWaitTimeout> {
        self.wait_until(timeout, |inner| {
            let calls: Vec<RecordedCall> = inner
                .calls
                .iter()
                .filter(|c| c.is(method))
                .cloned()
                .collect();
            if calls.len() >= n {
                Ok(calls)
            } else {
                Err((format!("{n} {method} call(s)"), calls.len().to_string()))
            }
        })
        .await
    }

    /// Waits until `check` returns `Ok`; `Err((wanted, seen))` describes the
    /// unmet condition for the timeout error.
    async fn wait_until<T>(
        &self,
        timeout: Duration,
        check: impl Fn(&Inner) -> Result<T, (String, String)>,
    ) -> Result<T, TelegramWaitTimeout> {
        let deadline = deadline_after(timeout);
        loop {
            let notified = self.shared.changed.notified();
            tokio::pin!(notified);
            // Register before checking so a change in between still wakes us.
            notified.as_mut().enable();
            let (wanted, seen) = match check(&self.shared.lock()) {
                Ok(v) => return Ok(v),
                Err(unmet) => unmet,
            };
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(TelegramWaitTimeout {
                    wanted,
                    seen,
                    timeout,
                });
            }
        }
    }

    /// Stops the server: ends waiting long polls, closes connections and
    /// waits (bounded) for the server task to finish.
    pub async fn shutdown(mut self) {
        self.shared.cancel.cancel();
        if let Some(mut task) = self.task.take()
            && tokio::time::timeout(SHUTDOWN_GRACE, &mut task)
                .await
                .is_err()
        {
            task.abort();
        }
    }
}

impl Drop for FakeTelegram {
    fn drop(&mut self) {
        self.shared.cancel.cancel();
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

// ---------------------------------------------------------------------------
// HTTP layer
// ---------------------------------------------------------------------------

fn ok(result: Value) -> Response {
    axum::Json(json!({"ok": true, "result": result})).into_response()
}

fn api_error(status: StatusCode, description: &str) -> Response {
    (
        status,
        axum::Json(json!({
            "ok": false,
            "error_code": status.as_u16(),
            "description": description,
        })),
    )
        .into_response()
}

fn api_error_with(status: StatusCode, description: &str, parameters: Value) -> Response {
    (
        status,
        axum::Json(json!({
            "ok": false,
            "error_code": status.as_u16(),
            "description": description,
            "parameters": parameters,
        })),
    )
        .into_response()
}

/// An error answer of a method handler.
struct ApiErr {
    status: StatusCode,
    description: String,
}

impl ApiErr {
    fn render(&self) -> Response {
        api_error(self.status, &self.description)
    }
}

fn bad_request(description: &str) -> ApiErr {
    ApiErr {
        status: StatusCode::BAD_REQUEST,
        description: format!("Bad Request: {description}"),
    }
}

/// An uploaded multipart file part.
struct Upload {
    field: String,
    file_name: Option<String>,
    bytes: Bytes,
}

/// Decoded request parameters.
struct Params {
    map: Map<String, Value>,
    uploads: Vec<Upload>,
}

impl Params {
    fn get(&self, key: &str) -> Option<&Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn str(&self, key: &str) -> Option<String> {
        match self.get(key)? {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            Value::Bool(b) => Some(b.to_string()),
            _ => None,
        }
    }

    fn i64(&self, key: &str) -> Option<i64> {
        as_i64(self.get(key)?)
    }

    fn bool(&self, key: &str) -> bool {
        match self.get(key) {
            Some(Value::Bool(b)) => *b,
            Some(Value::String(s)) => s == "true" || s == "1",
            Some(Value::Number(n)) => n.as_i64() == Some(1),
            _ => false,
        }
    }

    /// An object or array parameter, which forms and queries carry as a
    /// JSON-serialized string.
    fn json(&self, key: &str) -> Option<Value> {
        match self.get(key)? {
            Value::String(s) => serde_json::from_str(s).ok(),
            v => Some(v.clone()),
        }
    }

    fn upload(&self, field: &str) -> Option<&Upload> {
        self.uploads.iter().find(|u| u.field == field)
    }
}

fn as_i64(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let segments: Vec<String> = uri
        .path()
        .split('/')
        .filter(|s| !s.is_empty())
        .map(percent_decode)
        .collect();
    let token_ok = |seg: &str| seg.strip_prefix("bot") == Some(shared.token.as_str());
    match segments.as_slice() {
        [file, bot, path @ ..] if file == "file" && bot.starts_with("bot") && !path.is_empty() => {
            if !token_ok(bot) {
                return api_error(StatusCode::UNAUTHORIZED, "Unauthorized");
            }
            download(&shared, &path.join("/"))
        }
        [bot, name] if bot.starts_with("bot") => {
            if !token_ok(bot) {
                return api_error(StatusCode::UNAUTHORIZED, "Unauthorized");
            }
            let params = match parse_params(&uri, &headers, &body) {
                Ok(p) => p,
                Err(desc) => return bad_request(&desc).render(),
            };
            call(&shared, &method, name, &headers, params).await
        }
        _ => api_error(StatusCode::NOT_FOUND, "Not Found"),
    }
}

fn download(shared: &Shared, path: &str) -> Response {
    let mut inner = shared.lock();
    let Some(bytes) = inner
        .files
        .values()
        .find(|f| f.path == path)
        .map(|f| f.bytes.clone())
    else {
        return api_error(StatusCode::NOT_FOUND, "Not Found");
    };
    inner.downloads.push(path.to_owned());
    drop(inner);
    shared.changed.notify_waiters();
    (
        [(
            CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        )],
        bytes,
    )
        .into_response()
}

async fn call(
    shared: &Arc<Shared>,
    http_method: &Method,
    name: &str,
    headers: &HeaderMap,
    params: Params,
) -> Response {
    let lower = name.to_ascii_lowercase();
    let failure = {
        let mut inner = shared.lock();
        inner.calls.push(RecordedCall {
            method: name.to_owned(),
            http_method: http_method.as_str().to_owned(),
            content_type: headers
                .get(CONTENT_TYPE)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()),
            params: Value::Object(params.map.clone()),
        });
        match inner.failures.get_mut(&lower) {
            Some(queue) => match queue.front_mut() {
                Some((passing, _)) if *passing > 0 => {
                    *passing -= 1;
                    None
                }
                _ => queue.pop_front().map(|(_, failure)| failure),
            },
            None => None,
        }
    };
    shared.changed.notify_waiters();
    if let Some(failure) = failure {
        if lower == "getupdates" {
            // Still a new poll: it ends a waiting one, as on Telegram.
            shared.lock().poll_generation += 1;
            shared.updates.notify_waiters();
        }
        return failure.render();
    }

    let response = match lower.as_str() {
        "getupdates" => return get_updates(shared, &params).await,
        "getme" => Ok(shared.lock().bot.me_json()),
        "sendmessage" => send_message(shared, name, &params),
        "sendphoto" | "senddocument" => send_media(shared, name, &lower, &params),
        "editmessagetext" => edit_message_text(shared, &params),
        "sendchataction" => send_chat_action(shared, &params),
        "getfile" => get_file(shared, &params),
        "getchatadministrators" => get_chat_administrators(shared, &params),
        "getchatmember" => get_chat_member(shared, &params),
        "getwebhookinfo" => Ok(json!({
            "url": "",
            "has_custom_certificate": false,
            "pending_update_count": shared.lock().updates.len(),
        })),
        "setmycommands" => {
            let commands = params.json("commands").unwrap_or_else(|| json!([]));
            shared.lock().commands = commands;
            Ok(json!(true))
        }
        "getmycommands" => Ok(shared.lock().commands.clone()),
        "deletemycommands" => {
            shared.lock().commands = json!([]);
            Ok(json!(true))
        }
        "deletewebhook" | "answercallbackquery" | "sendmessagedraft" | "deletemessage" => {
            Ok(json!(true))
        }
        _ => {
            shared.lock().unknown.push(name.to_owned());
            Err(ApiErr {
                status: StatusCode::NOT_FOUND,
                description: "Not Found: method not found".to_owned(),
            })
        }
    };
    shared.changed.notify_waiters();
    match response {
        Ok(result) => ok(result),
        Err(e) => e.render(),
    }
}

// ---------------------------------------------------------------------------
// Methods
// ---------------------------------------------------------------------------

async fn get_updates(shared: &Arc<Shared>, params: &Params) -> Response {
    let offset = params.i64("offset");
    let limit = params
        .i64("limit")
        .map_or(100, |l| l.clamp(1, 100))
        .try_into()
        .unwrap_or(100usize);
    let timeout = params.i64("timeout").unwrap_or(0).max(0);
    let allowed: Option<Vec<String>> = params.json("allowed_updates").and_then(|v| {
        v.as_array().map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
    });
    let generation = {
        let mut inner = shared.lock();
        inner.poll_generation += 1;
        inner.get_updates_calls.push(GetUpdatesCall {
            offset,
            limit: params.i64("limit"),
            timeout: params.i64("timeout"),
            allowed_updates: allowed.clone(),
        });
        if let Some(offset) = offset {
            inner.apply_offset(offset);
        }
        if let Some(allowed) = allowed {
            inner.allowed_updates = if allowed.is_empty() {
                None
            } else {
                Some(allowed)
            };
        }
        inner.poll_generation
    };
    // Ends an older poll that is still waiting (it answers 409).
    shared.updates.notify_waiters();
    shared.changed.notify_waiters();

    let deadline = deadline_after(Duration::from_secs(timeout.unsigned_abs()));
    loop {
        let notified = shared.updates.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        {
            let inner = shared.lock();
            if inner.poll_generation != generation {
                drop(inner);
                return Failure::Conflict.render();
            }
            let batch: Vec<Value> = inner.updates.iter().take(limit).cloned().collect();
            if !batch.is_empty() || tokio::time::Instant::now() >= deadline {
                return ok(Value::Array(batch));
            }
        }
        tokio::select! {
            _ = tokio::time::timeout_at(deadline, notified) => {}
            () = shared.cancel.cancelled() => return ok(json!([])),
        }
    }
}

fn chat_id_param(inner: &Inner, params: &Params) -> Result<i64, ApiErr> {
    let Some(raw) = params.get("chat_id") else {
        return Err(bad_request("chat_id is empty"));
    };
    let Some(chat_id) = as_i64(raw) else {
        return Err(bad_request("chat not found"));
    };
    if inner.chats.contains_key(&chat_id) {
        Ok(chat_id)
    } else if chat_id > 0 {
        Err(ApiErr {
            status: StatusCode::FORBIDDEN,
            description: "Forbidden: bot can't initiate conversation with a user".to_owned(),
        })
    } else {
        Err(bad_request("chat not found"))
    }
}

/// The reply target of a send: `reply_parameters.message_id` or legacy
/// `reply_to_message_id`, with `allow_sending_without_reply`.
fn reply_param(params: &Params) -> (Option<i64>, bool) {
    if let Some(rp) = params.json("reply_parameters") {
        let id = rp.get("message_id").and_then(as_i64);
        let lenient = rp
            .get("allow_sending_without_reply")
            .and_then(Value::as_bool)
            == Some(true);
        return (id, lenient);
    }
    (
        params.i64("reply_to_message_id"),
        params.bool("allow_sending_without_reply"),
    )
}

/// Checks thread and reply target of a send to `chat_id`; returns the
/// `reply_to_message` to embed.
fn send_context(
    inner: &Inner,
    chat_id: i64,
    thread: Option<i64>,
    reply_to: Option<i64>,
    lenient: bool,
) -> Result<Option<Value>, ApiErr> {
    if let Some(thread) = thread {
        let chat = &inner.chats[&chat_id];
        if !(chat.is_forum && chat.topics.contains_key(&thread)) {
            return Err(bad_request("message thread not found"));
        }
    }
    match reply_to {
        Some(id) => match inner.message(chat_id, id) {
            Some(m) => Ok(Some(m)),
            None if lenient => Ok(None),
            None => Err(bad_request("message to be replied not found")),
        },
        None => Ok(None),
    }
}

/// Parses `text` according to `parse_mode` into the delivered text and its
/// entities.
fn formatted(
    text: &str,
    parse_mode: Option<&str>,
    explicit: Option<Value>,
) -> Result<(String, Vec<Value>), ApiErr> {
    match parse_mode.map(str::to_ascii_lowercase).as_deref() {
        None | Some("") => Ok((
            text.to_owned(),
            explicit
                .and_then(|v| v.as_array().cloned())
                .unwrap_or_default(),
        )),
        Some("html") => {
            parse_html(text).map_err(|e| bad_request(&format!("can't parse entities: {e}")))
        }
        Some("markdown" | "markdownv2") => Ok((text.to_owned(), Vec::new())),
        Some(_) => Err(bad_request("unsupported parse_mode")),
    }
}

fn send_message(shared: &Shared, name: &str, params: &Params) -> Result<Value, ApiErr> {
    let mut inner = shared.lock();
    let chat_id = chat_id_param(&inner, params)?;
    let text = params.str("text").unwrap_or_default();
    let parse_mode = params.str("parse_mode");
    let (plain, entities) = formatted(&text, parse_mode.as_deref(), params.json("entities"))?;
    if plain.trim().is_empty() {
        return Err(bad_request("message text is empty"));
    }
    if utf16_len(&plain) > MAX_TEXT_UTF16 {
        return Err(bad_request("message is too long"));
    }
    let thread = params.i64("message_thread_id");
    let (reply_to, lenient) = reply_param(params);
    let reply = send_context(&inner, chat_id, thread, reply_to, lenient)?;

    let mut content = Map::new();
    content.insert("text".into(), json!(plain));
    if !entities.is_empty() {
        content.insert("entities".into(), Value::Array(entities));
    }
    if let Some(markup) = params.json("reply_markup") {
        content.insert("reply_markup".into(), markup);
    }
    let from = inner.bot.user_json();
    let message = inner.compose(Compose {
        chat_id,
        from,
        date: now_unix(),
        reply,
        thread,
        content,
    });
    inner.sent.push(SentMessage {
        method: name.to_owned(),
        chat_id,
        message_id: message["message_id"].as_i64().unwrap_or_default(),
        text,
        parse_mode,
        reply_to_message_id: reply_to,
        thread_id: thread,
        reply_markup: params.json("reply_markup"),
        file_id: None,
        params: Value::Object(params.map.clone()),
        message: message.clone(),
    });
    Ok(message)
}

fn send_media(shared: &Shared, name: &str, lower: &str, params: &Params) -> Result<Value, ApiErr> {
    let field = if lower == "sendphoto" {
        "photo"
    } else {
        "document"
    };
    let mut inner = shared.lock();
    let chat_id = chat_id_param(&inner, params)?;
    let (file_id, file_name, size) = match params.upload(field) {
        Some(upload) => {
            let id = format!("fake-file-{}", inner.next_file);
            let size = upload.bytes.len();
            inner.store_file(id.clone(), upload.bytes.clone());
            (id, upload.file_name.clone(), size)
        }
        None => {
            let Some(id) = params.str(field).filter(|s| !s.is_empty()) else {
                return Err(bad_request(&format!("there is no {field} in the request")));
            };
            let size = inner.files.get(&id).map_or(0, |f| f.bytes.len());
            (id, None, size)
        }
    };
    let caption = params.str("caption").unwrap_or_default();
    let parse_mode = params.str("parse_mode");
    let (plain, entities) = formatted(
        &caption,
        parse_mode.as_deref(),
        params.json("caption_entities"),
    )?;
    if utf16_len(&plain) > MAX_CAPTION_UTF16 {
        return Err(bad_request("message caption is too long"));
    }
    let thread = params.i64("message_thread_id");
    let (reply_to, lenient) = reply_param(params);
    let reply = send_context(&inner, chat_id, thread, reply_to, lenient)?;

    let mut content = Map::new();
    if field == "photo" {
        content.insert(
            "photo".into(),
            json!([{
                "file_id": file_id,
                "file_unique_id": unique_id(&file_id),
                "file_size": size,
                "width": PHOTO_SIZE.0,
                "height": PHOTO_SIZE.1,
            }]),
        );
    } else {
        let mut doc = json!({
            "file_id": file_id,
            "file_unique_id": unique_id(&file_id),
            "file_size": size,
        });
        if let Some(n) = &file_name {
            doc["file_name"] = json!(n);
        }
        content.insert("document".into(), doc);
    }
    if !plain.is_empty() {
        content.insert("caption".into(), json!(plain));
    }
    if !entities.is_empty() {
        content.insert("caption_entities".into(), Value::Array(entities));
    }
    let from = inner.bot.user_json();
    let message = inner.compose(Compose {
        chat_id,
        from,
        date: now_unix(),
        reply,
        thread,
        content,
    });
    inner.sent.push(SentMessage {
        method: name.to_owned(),
        chat_id,
        message_id: message["message_id"].as_i64().unwrap_or_default(),
        text: caption,
        parse_mode,
        reply_to_message_id: reply_to,
        thread_id: thread,
        reply_markup: params.json("reply_markup"),
        file_id: Some(file_id),
        params: Value::Object(params.map.clone()),
        message: message.clone(),
    });
    Ok(message)
}

fn edit_message_text(shared: &Shared, params: &Params) -> Result<Value, ApiErr> {
    let mut inner = shared.lock();
    if params.get("inline_message_id").is_some() {
        return Ok(json!(true));
    }
    let chat_id = chat_id_param(&inner, params)?;
    let Some(message_id) = params.i64("message_id") else {
        return Err(bad_request("message identifier is not specified"));
    };
    let Some(mut message) = inner.message(chat_id, message_id) else {
        return Err(bad_request("message to edit not found"));
    };
    if message.pointer("/from/id").and_then(Value::as_i64) != Some(inner.bot.id) {
        return Err(bad_request("message can't be edited"));
    }
    let text = params.str("text").unwrap_or_default();
    let parse_mode = params.str("parse_mode");
    let (plain, entities) = formatted(&text, parse_mode.as_deref(), params.json("entities"))?;
    if plain.trim().is_empty() {
        return Err(bad_request("message text is empty"));
    }
    if utf16_len(&plain) > MAX_TEXT_UTF16 {
        return Err(bad_request("message is too long"));
    }
    let markup = params.json("reply_markup");
    let old_entities = message
        .get("entities")
        .cloned()
        .unwrap_or_else(|| json!([]));
    if message.get("text") == Some(&json!(plain))
        && old_entities == json!(entities)
        && message.get("reply_markup") == markup.as_ref()
    {
        return Err(bad_request(
            "message is not modified: specified new message content and reply markup are exactly the same as a current content and reply markup of the message",
        ));
    }
    message["text"] = json!(plain);
    if let Some(obj) = message.as_object_mut() {
        obj.remove("entities");
        obj.remove("reply_markup");
    }
    if !entities.is_empty() {
        message["entities"] = Value::Array(entities);
    }
    if let Some(markup) = markup {
        message["reply_markup"] = markup;
    }
    message["edit_date"] = json!(now_unix());
    inner
        .messages
        .insert((chat_id, message_id), message.clone());
    inner.edits.push(EditedMessage {
        chat_id,
        message_id,
        text,
        parse_mode,
        params: Value::Object(params.map.clone()),
    });
    Ok(message)
}

fn send_chat_action(shared: &Shared, params: &Params) -> Result<Value, ApiErr> {
    let mut inner = shared.lock();
    let chat_id = chat_id_param(&inner, params)?;
    let action = params.str("action").unwrap_or_default();
    if !CHAT_ACTIONS.contains(&action.as_str()) {
        return Err(bad_request("wrong parameter action in request"));
    }
    inner.actions.push(ChatAction {
        chat_id,
        action,
        thread_id: params.i64("message_thread_id"),
    });
    Ok(json!(true))
}

fn get_file(shared: &Shared, params: &Params) -> Result<Value, ApiErr> {
    let file_id = params.str("file_id").unwrap_or_default();
    shared
        .lock()
        .file_json(&file_id)
        .ok_or_else(|| bad_request("invalid file_id"))
}

fn admin_json(user: Value, creator: bool) -> Value {
    if creator {
        return json!({"status": "creator", "user": user, "is_anonymous": false});
    }
    json!({
        "status": "administrator",
        "user": user,
        "can_be_edited": false,
        "is_anonymous": false,
        "can_manage_chat": true,
        "can_delete_messages": true,
        "can_manage_video_chats": true,
        "can_restrict_members": true,
        "can_promote_members": false,
        "can_change_info": true,
        "can_invite_users": true,
        "can_post_stories": false,
        "can_edit_stories": false,
        "can_delete_stories": false,
        "can_pin_messages": true,
        "can_manage_topics": false,
    })
}

fn get_chat_administrators(shared: &Shared, params: &Params) -> Result<Value, ApiErr> {
    let inner = shared.lock();
    let chat_id = chat_id_param(&inner, params)?;
    if inner.chats[&chat_id].is_private() {
        return Err(bad_request(
            "there are no administrators in the private chat",
        ));
    }
    let ids = inner.admins.get(&chat_id).cloned().unwrap_or_default();
    Ok(ids
        .iter()
        .enumerate()
        .map(|(i, id)| admin_json(inner.user_json(*id), i == 0))
        .collect())
}

fn get_chat_member(shared: &Shared, params: &Params) -> Result<Value, ApiErr> {
    let inner = shared.lock();
    let chat_id = chat_id_param(&inner, params)?;
    let Some(user_id) = params.i64("user_id") else {
        return Err(bad_request("user not found"));
    };
    let user = inner.user_json(user_id);
    let ids = inner.admins.get(&chat_id).cloned().unwrap_or_default();
    Ok(match ids.iter().position(|id| *id == user_id) {
        Some(i) => admin_json(user, i == 0),
        None if inner.users.contains_key(&user_id) || user_id == inner.bot.id => {
            json!({"status": "member", "user": user})
        }
        None => json!({"status": "left", "user": user}),
    })
}

// ---------------------------------------------------------------------------
// Request decoding
// ---------------------------------------------------------------------------

fn parse_params(uri: &Uri, headers: &HeaderMap, body: &[u8]) -> Result<Params, String> {
    let mut map = Map::new();
    if let Some(query) = uri.query() {
        for (k, v) in parse_form(query.as_bytes()) {
            map.insert(k, Value::String(v));
        }
    }
    let mut uploads = Vec::new();
    let content_type = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    let is_blank = body.iter().all(u8::is_ascii_whitespace);
    if content_type.starts_with("multipart/form-data") {
        let raw_ct = headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let boundary = raw_ct
            .split(';')
            .filter_map(|p| p.trim().strip_prefix("boundary="))
            .next()
            .map(|b| b.trim_matches('"').to_owned())
            .ok_or_else(|| "multipart body without boundary".to_owned())?;
        for part in parse_multipart(body, &boundary) {
            match part.file_name {
                Some(file_name) => {
                    map.insert(
                        part.name.clone(),
                        json!({"file_name": file_name, "size": part.data.len()}),
                    );
                    uploads.push(Upload {
                        field: part.name,
                        file_name: Some(file_name),
                        bytes: Bytes::from(part.data),
                    });
                }
                None => {
                    map.insert(
                        part.name,
                        Value::String(String::from_utf8_lossy(&part.data).into_owned()),
                    );
                }
            }
        }
    } else if content_type.starts_with("application/x-www-form-urlencoded") {
        for (k, v) in parse_form(body) {
            map.insert(k, Value::String(v));
        }
    } else if !is_blank {
        match serde_json::from_slice::<Value>(body) {
            Ok(Value::Object(obj)) => map.extend(obj),
            Ok(_) => return Err("can't parse request JSON object".to_owned()),
            Err(_) if !content_type.starts_with("application/json") => {
                for (k, v) in parse_form(body) {
                    map.insert(k, Value::String(v));
                }
            }
            Err(_) => return Err("can't parse request JSON object".to_owned()),
        }
    }
    Ok(Params { map, uploads })
}

fn parse_form(raw: &[u8]) -> Vec<(String, String)> {
    raw.split(|b| *b == b'&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (k, v) = match pair.iter().position(|b| *b == b'=') {
                Some(i) => (&pair[..i], &pair[i + 1..]),
                None => (pair, &[][..]),
            };
            (form_decode(k), form_decode(v))
        })
        .collect()
}

fn form_decode(raw: &[u8]) -> String {
    let plus: Vec<u8> = raw
        .iter()
        .map(|b| if *b == b'+' { b' ' } else { *b })
        .collect();
    percent_decode_bytes(&plus)
}

fn percent_decode(s: &str) -> String {
    percent_decode_bytes(s.as_bytes())
}

fn percent_decode_bytes(raw: &[u8]) -> String {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'%'
            && i + 2 < raw.len()
            && let (Some(h), Some(l)) = (hex(raw[i + 1]), hex(raw[i + 2]))
        {
            out.push(h * 16 + l);
            i += 3;
            continue;
        }
        out.push(raw[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

struct Part {
    name: String,
    file_name: Option<String>,
    data: Vec<u8>,
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    if needle.is_empty() || from > hay.len() {
        return None;
    }
    hay[from..]
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

/// A minimal `multipart/form-data` parser: enough for the text fields and
/// file parts that Bot API clients send.
fn parse_multipart(body: &[u8], boundary: &str) -> Vec<Part> {
    let delim = format!("--{boundary}");
    let delim = delim.as_bytes();
    let mut parts = Vec::new();
    let Some(mut pos) = find(body, delim, 0) else {
        return parts;
    };
    loop {
        let start = pos + delim.len();
        if body[start..].starts_with(b"--") {
            break;
        }
        let Some(next) = find(body, delim, start) else {
            break;
        };
        let chunk = &body[start..next];
        let chunk = chunk.strip_prefix(b"\r\n").unwrap_or(chunk);
        let chunk = chunk.strip_suffix(b"\r\n").unwrap_or(chunk);
        if let Some(split) = find(chunk, b"\r\n\r\n", 0) {
            let head = String::from_utf8_lossy(&chunk[..split]);
            let data = chunk[split + 4..].to_vec();
            let mut name = None;
            let mut file_name = None;
            for line in head.lines() {
                if !line.to_ascii_lowercase().starts_with("content-disposition") {
                    continue;
                }
                for attr in line.split(';').map(str::trim) {
                    if let Some(v) = attr.strip_prefix("name=") {
                        name = Some(v.trim_matches('"').to_owned());
                    } else if let Some(v) = attr.strip_prefix("filename=") {
                        file_name = Some(v.trim_matches('"').to_owned());
                    }
                }
            }
            if let Some(name) = name {
                parts.push(Part {
                    name,
                    file_name,
                    data,
                });
            }
        }
        pos = next;
    }
    parts
}

// ---------------------------------------------------------------------------
// HTML parse mode
// ---------------------------------------------------------------------------

struct OpenTag {
    name: String,
    start: usize,
    attrs: Vec<(String, String)>,
    /// Language set by a nested `<code class="language-...">`.
    language: Option<String>,
}

impl OpenTag {
    fn attr(&self, key: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

const HTML_TAGS: [&str; 17] = [
    "b",
    "strong",
    "i",
    "em",
    "u",
    "ins",
    "s",
    "strike",
    "del",
    "span",
    "tg-spoiler",
    "a",
    "code",
    "pre",
    "blockquote",
    "tg-emoji",
    "tg-time",
];

/// Parses Telegram's HTML parse mode into plain text and entities (offsets in
/// UTF-16 units), with error messages modelled on Telegram's.
fn parse_html(src: &str) -> Result<(String, Vec<Value>), String> {
    let bytes = src.as_bytes();
    let mut out = String::new();
    // Length of `out` in UTF-16 units, kept up to date.
    let mut units = 0;
    let mut stack: Vec<OpenTag> = Vec::new();
    let mut entities: Vec<Value> = Vec::new();
    let mut i = 0;
    while i < src.len() {
        match bytes[i] {
            b'<' => {
                let Some(rel_end) = src[i..].find('>') else {
                    return Err(format!("Unclosed start tag at byte offset {i}"));
                };
                let end = i + rel_end;
                let inner = &src[i + 1..end];
                if let Some(name) = inner.strip_prefix('/') {
                    let name = name.trim().to_ascii_lowercase();
                    let Some(open) = stack.pop() else {
                        return Err(format!("Unexpected end tag at byte offset {i}"));
                    };
                    if open.name != name {
                        return Err(format!(
                            "Unmatched end tag at byte offset {i}, expected \"</{}>\", found \"</{name}>\"",
                            open.name
                        ));
                    }
                    close_tag(open, units, stack.last_mut(), &mut entities);
                } else {
                    let name_len = inner
                        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                        .unwrap_or(inner.len());
                    let name = inner[..name_len].to_ascii_lowercase();
                    if !HTML_TAGS.contains(&name.as_str()) {
                        return Err(format!(
                            "Unsupported start tag \"{name}\" at byte offset {i}"
                        ));
                    }
                    let attrs = parse_attrs(&inner[name_len..]);
                    let tag = OpenTag {
                        name,
                        start: units,
                        attrs,
                        language: None,
                    };
                    if tag.name == "span" && tag.attr("class") != Some("tg-spoiler") {
                        return Err(format!(
                            "Tag \"span\" must have class \"tg-spoiler\" at byte offset {i}"
                        ));
                    }
                    stack.push(tag);
                }
                i = end + 1;
            }
            b'&' => {
                let (decoded, used) = decode_entity(&src[i..]);
                units += utf16_len(&decoded);
                out.push_str(&decoded);
                i += used;
            }
            _ => {
                let ch = src[i..].chars().next().unwrap_or_default();
                out.push(ch);
                units += ch.len_utf16();
                i += ch.len_utf8();
            }
        }
    }
    if let Some(open) = stack.pop() {
        return Err(format!(
            "Can't find end tag corresponding to start tag \"{}\"",
            open.name
        ));
    }
    sort_entities(&mut entities);
    Ok((out, entities))
}

fn close_tag(open: OpenTag, end: usize, parent: Option<&mut OpenTag>, entities: &mut Vec<Value>) {
    let length = end - open.start;
    if open.name == "code"
        && let Some(parent) = parent
        && parent.name == "pre"
    {
        // `<pre><code class="language-x">` is one pre entity.
        if let Some(lang) = open.attr("class").and_then(|c| c.strip_prefix("language-")) {
            parent.language = Some(lang.to_owned());
        }
        return;
    }
    if length == 0 {
        return;
    }
    let mut e = entity("", open.start, length);
    let kind = match open.name.as_str() {
        "b" | "strong" => "bold",
        "i" | "em" => "italic",
        "u" | "ins" => "underline",
        "s" | "strike" | "del" => "strikethrough",
        "span" | "tg-spoiler" => "spoiler",
        "code" => "code",
        "pre" => {
            if let Some(lang) = &open.language {
                e["language"] = json!(lang);
            }
            "pre"
        }
        "blockquote" => {
            if open.attrs.iter().any(|(k, _)| k == "expandable") {
                "expandable_blockquote"
            } else {
                "blockquote"
            }
        }
        "tg-emoji" => {
            let Some(id) = open.attr("emoji-id") else {
                return;
            };
            e["custom_emoji_id"] = json!(id);
            "custom_emoji"
        }
        "tg-time" => {
            let Some(unix) = open.attr("unix").and_then(|u| u.parse::<i64>().ok()) else {
                return;
            };
            e["unix_time"] = json!(unix);
            if let Some(f) = open.attr("format") {
                e["date_time_format"] = json!(f);
            }
            "date_time"
        }
        "a" => {
            let Some(href) = open.attr("href").filter(|h| !h.is_empty()) else {
                return;
            };
            if let Some(id) = href
                .strip_prefix("tg://user?id=")
                .and_then(|id| id.parse::<i64>().ok())
            {
                e["user"] = json!({"id": id, "is_bot": false, "first_name": format!("user{id}")});
                "text_mention"
            } else {
                let url = if href.contains(':') {
                    href.to_owned()
                } else {
                    format!("http://{href}")
                };
                e["url"] = json!(url);
                "text_link"
            }
        }
        _ => return,
    };
    e["type"] = json!(kind);
    entities.push(e);
}

fn parse_attrs(mut s: &str) -> Vec<(String, String)> {
    let mut attrs = Vec::new();
    loop {
        s = s.trim_start();
        let name_len = s
            .find(|c: char| c.is_whitespace() || c == '=')
            .unwrap_or(s.len());
        if name_len == 0 {
            break;
        }
        let name = s[..name_len].to_ascii_lowercase();
        s = s[name_len..].trim_start();
        let value = if let Some(rest) = s.strip_prefix('=') {
            let rest = rest.trim_start();
            let (value, tail) = match rest.chars().next() {
                Some(q @ ('"' | '\'')) => {
                    let body = &rest[1..];
                    let end = body.find(q).unwrap_or(body.len());
                    (&body[..end], body.get(end + 1..).unwrap_or(""))
                }
                _ => {
                    let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
                    (&rest[..end], &rest[end..])
                }
            };
            s = tail;
            let mut decoded = String::new();
            let mut j = 0;
            while j < value.len() {
                if value.as_bytes()[j] == b'&' {
                    let (d, used) = decode_entity(&value[j..]);
                    decoded.push_str(&d);
                    j += used;
                } else {
                    let ch = value[j..].chars().next().unwrap_or_default();
                    decoded.push(ch);
                    j += ch.len_utf8();
                }
            }
            decoded
        } else {
            String::new()
        };
        attrs.push((name, value));
    }
    attrs
}

/// Decodes the HTML entity at the start of `s` (which starts with `&`);
/// returns the text and how many bytes were consumed. Unknown entities are
/// kept literally, as Telegram does.
fn decode_entity(s: &str) -> (String, usize) {
    let Some(semi) = s.find(';').filter(|p| *p <= 12) else {
        return ("&".to_owned(), 1);
    };
    let name = &s[1..semi];
    let decoded = match name {
        "lt" => Some('<'),
        "gt" => Some('>'),
        "amp" => Some('&'),
        "quot" => Some('"'),
        _ => name.strip_prefix('#').and_then(|num| {
            let code = match num.strip_prefix(['x', 'X']) {
                Some(h) => u32::from_str_radix(h, 16).ok(),
                None => num.parse().ok(),
            };
            code.and_then(char::from_u32)
        }),
    };
    match decoded {
        Some(c) => (c.to_string(), semi + 1),
        None => ("&".to_owned(), 1),
    }
}

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// `now + timeout`, saturating at a year from now.
fn deadline_after(timeout: Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    now.checked_add(timeout.min(Duration::from_secs(365 * 24 * 3600)))
        .unwrap_or(now)
}

fn now_unix() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// A stable short `file_unique_id` derived from a `file_id` (FNV-1a).
fn unique_id(file_id: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in file_id.bytes() {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("AQAD{hash:016x}")
}

/// Shallow-merges the fields of object `extra` into object `base`.
fn merge(base: &mut Value, extra: Value) {
    if let (Some(base), Value::Object(extra)) = (base.as_object_mut(), extra) {
        base.extend(extra);
    }
}

// ---------------------------------------------------------------------------
// Fixtures
// ---------------------------------------------------------------------------

/// Real payloads from teloxide v0.17.0's tests (MIT), see
/// `testkit/fixtures/telegram/README.md`: `(file name, JSON text)`.
const FIXTURES: [(&str, &str); 7] = [
    (
        "update.message.L558.json",
        include_str!("../fixtures/telegram/update.message.L558.json"),
    ),
    (
        "update.de_private_chat_text_message.L745.json",
        include_str!("../fixtures/telegram/update.de_private_chat_text_message.L745.json"),
    ),
    (
        "update.message_reaction_updated.L897.json",
        include_str!("../fixtures/telegram/update.message_reaction_updated.L897.json"),
    ),
    (
        "message.topic_message.L2633.json",
        include_str!("../fixtures/telegram/message.topic_message.L2633.json"),
    ),
    (
        "message.parse_caption_entities.L2538.json",
        include_str!("../fixtures/telegram/message.parse_caption_entities.L2538.json"),
    ),
    (
        "message.issue_475.L2525.json",
        include_str!("../fixtures/telegram/message.issue_475.L2525.json"),
    ),
    (
        "message.de_text.L2263.json",
        include_str!("../fixtures/telegram/message.de_text.L2263.json"),
    ),
];

/// A real Telegram payload recorded in teloxide's tests, by file name (e.g.
/// `"message.topic_message.L2633.json"`; `update.*` files are whole
/// updates, `message.*` files are `Message` objects to wrap as
/// `{"message": ..}`). `None` for an unknown name.
pub fn teloxide_fixture(name: &str) -> Option<Value> {
    FIXTURES
        .iter()
        .find(|(n, _)| *n == name)
        .and_then(|(_, text)| serde_json::from_str(text).ok())
}

/// The names accepted by [`teloxide_fixture`].
pub fn teloxide_fixture_names() -> Vec<&'static str> {
    FIXTURES.iter().map(|(n, _)| *n).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn html_parses_to_plain_text_and_entities() {
        let (text, entities) = parse_html(
            "<b>héllo 👋</b> &lt;x&gt; <pre><code class=\"language-rust\">fn</code></pre>",
        )
        .unwrap();
        assert_eq!(text, "héllo 👋 <x> fn");
        assert_eq!(
            entities,
            vec![
                json!({"type":"bold","offset":0,"length":8}),
                json!({"type":"pre","offset":13,"length":2,"language":"rust"}),
            ]
        );
    }

    #[test]
    fn html_errors_look_like_telegram() {
        assert_eq!(
            parse_html("<b>x").unwrap_err(),
            "Can't find end tag corresponding to start tag \"b\""
        );
        assert!(
            parse_html("a <foo>b</foo>")
                .unwrap_err()
                .starts_with("Unsupported start tag \"foo\"")
        );
        assert!(
            parse_html("<b><i>x</b></i>")
                .unwrap_err()
                .starts_with("Unmatched end tag")
        );
        assert_eq!(parse_html("a & b &amp; c").unwrap().0, "a & b & c");
    }

    #[test]
    fn multipart_parts() {
        let body = b"--XY\r\nContent-Disposition: form-data; name=\"chat_id\"\r\n\r\n-100\r\n--XY\r\nContent-Disposition: form-data; name=\"photo\"; filename=\"a.png\"\r\nContent-Type: image/png\r\n\r\n\x00\x01\r\n--XY--\r\n";
        let parts = parse_multipart(body, "XY");
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].name, "chat_id");
        assert_eq!(parts[0].data, b"-100");
        assert_eq!(parts[1].file_name.as_deref(), Some("a.png"));
        assert_eq!(parts[1].data, b"\x00\x01");
    }

    #[test]
    fn fixtures_parse() {
        for name in teloxide_fixture_names() {
            assert!(teloxide_fixture(name).is_some(), "{name}");
        }
    }
}
