//! The `Platform` trait: everything the runtime and the toolsets see of a chat platform, and
//! the normalized message types adapters produce. Adapters (Telegram, Discord, console)
//! implement it; nothing in `bot` or `toolsets` knows an SDK.

use std::fmt;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Where a message lives: a platform, a chat, and optionally a thread (a Telegram forum
/// topic). One `ChatRef` is one agent session.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ChatRef {
    /// `telegram`, `discord`, `console`.
    pub platform: String,
    /// The platform's chat id, as text (`-100123`, `local`).
    pub chat_id: String,
    /// Forum topic / thread id, when the chat has threads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
}

impl ChatRef {
    /// A chat without threads.
    pub fn new(platform: impl Into<String>, chat_id: impl Into<String>) -> Self {
        ChatRef {
            platform: platform.into(),
            chat_id: chat_id.into(),
            thread_id: None,
        }
    }

    /// The same chat, in thread `thread_id`.
    pub fn in_thread(mut self, thread_id: impl Into<String>) -> Self {
        self.thread_id = Some(thread_id.into());
        self
    }

    /// The session key: `telegram:-100123`, `telegram:-100123/topic:7`, `console:local`.
    pub fn session_key(&self) -> String {
        // Pushed, not `format!`ed: every message and every turn builds it.
        let topic = self.thread_id.as_deref();
        let mut key = String::with_capacity(
            self.platform.len() + 1 + self.chat_id.len() + topic.map_or(0, |t| 7 + t.len()),
        );
        key.push_str(&self.platform);
        key.push(':');
        key.push_str(&self.chat_id);
        if let Some(topic) = topic {
            key.push_str("/topic:");
            key.push_str(topic);
        }
        key
    }

    /// Reads a session key back (`telegram:-100123`, `telegram:-100123/topic:7`): the
    /// inverse of [`ChatRef::session_key`]. Surrounding whitespace is ignored, since keys
    /// reach it from model-written tool arguments; `None` when a part is missing or holds
    /// whitespace.
    pub fn parse_session_key(key: &str) -> Option<ChatRef> {
        let key = key.trim();
        let (platform, rest) = key.split_once(':')?;
        let (chat_id, thread) = match rest.split_once("/topic:") {
            Some((chat, topic)) => (chat, Some(topic)),
            None => (rest, None),
        };
        let clean = |s: &str| !s.is_empty() && !s.chars().any(char::is_whitespace);
        if !clean(platform) || !clean(chat_id) || thread.is_some_and(|t| !clean(t)) {
            return None;
        }
        let chat = ChatRef::new(platform, chat_id);
        Some(match thread {
            Some(topic) => chat.in_thread(topic),
            None => chat,
        })
    }
}

impl fmt::Display for ChatRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.session_key())
    }
}

/// Whether a chat is one person talking to the bot or a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChatKind {
    /// A direct message: every message is addressed to the bot.
    Private,
    /// A group, supergroup or channel-like chat: only mentions, replies and commands are.
    Group,
}

/// Who sent a message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sender {
    /// Platform-qualified user id (`telegram:1001`, `console:alice`).
    pub id: String,
    /// Display name (first + last name, or username).
    pub name: String,
    /// `@username` without the `@`, when the platform has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// Whether the sender is a bot (bot-to-bot loops are ignored by default).
    #[serde(default)]
    pub is_bot: bool,
}

/// An image attached to a message, by the platform's reference (downloaded on demand).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageRef {
    /// The platform's file id.
    pub file_id: String,
    /// MIME type, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
    /// Size in bytes, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
}

/// A message as an adapter normalizes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IncomingMessage {
    /// The chat (and session) it belongs to.
    pub chat: ChatRef,
    /// Private or group.
    pub kind: ChatKind,
    /// The platform's message id, unique within the chat; the dedupe key.
    pub message_id: String,
    /// Who wrote it.
    pub sender: Sender,
    /// Text or caption; empty for a bare image.
    pub text: String,
    /// When the platform says it was sent.
    pub time: DateTime<Utc>,
    /// The message this one replies to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
    /// Whether the message it replies to was written by this bot.
    #[serde(default)]
    pub reply_to_bot: bool,
    /// Whether the message mentions the bot (entity or `@username`), as the adapter saw it.
    #[serde(default)]
    pub mentions_bot: bool,
    /// Images attached.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<ImageRef>,
}

/// Something that happened to a chat rather than a message in it, as an adapter normalizes
/// it: the bot added or removed, the chat moved to a new id, a message edited. Delivered
/// through [`Inbox::chat_event`]; like a message, it is acknowledged only once recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum ChatEvent {
    /// The bot became a member (or administrator) of the chat: the chat is known from now
    /// on, even before anyone speaks.
    Joined {
        /// The chat.
        chat: ChatRef,
        /// Its title, when it has one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        title: Option<String>,
        /// Who added the bot.
        by: Sender,
        /// When.
        time: DateTime<Utc>,
    },
    /// The bot left or was removed (`left`, `kicked`): nothing can be posted there any more.
    Removed {
        /// The chat.
        chat: ChatRef,
        /// The platform's word for it (`left`, `kicked`).
        status: String,
        /// Who removed the bot (the bot itself when it left).
        by: Sender,
        /// When.
        time: DateTime<Utc>,
    },
    /// The chat continues under another id (a Telegram group upgraded to a supergroup):
    /// its session moves there. Reported from both sides; either, or both, or one twice.
    Migrated {
        /// The old chat.
        from: ChatRef,
        /// The new chat.
        to: ChatRef,
    },
    /// A message was edited: its new version, under the same `message_id`.
    Edited(IncomingMessage),
    /// Someone pressed one of the bot's buttons ([`Button`]): Telegram's `callback_query`,
    /// a Discord component interaction. The adapter acknowledges the press to the platform
    /// only as far as it must at once (Discord's three seconds); the runtime answers it with
    /// [`Platform::answer_button`] once it has decided.
    Button(ButtonPress),
}

/// A button under one of the bot's posts: what it says and what a press sends back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Button {
    /// The label people see.
    pub label: String,
    /// What a press reports in [`ButtonPress::data`]: at most [`Button::MAX_DATA`] bytes
    /// (Telegram's `callback_data` limit; Discord's `custom_id` allows 100).
    pub data: String,
}

impl Button {
    /// The longest `data`, in bytes.
    pub const MAX_DATA: usize = 64;
}

/// A press of a [`Button`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ButtonPress {
    /// The chat of the message that carries the button.
    pub chat: ChatRef,
    /// Who pressed it.
    pub sender: Sender,
    /// The button's [`Button::data`], as the platform reported it (outside input: parse it
    /// as such).
    pub data: String,
    /// What the adapter needs to answer the press: Telegram's callback query id, Discord's
    /// interaction id and token.
    pub answer: String,
    /// The id of the message that carries the button, when the platform says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
}

impl ChatEvent {
    /// The chat the event belongs to (for a migration: the old one).
    pub fn chat(&self) -> &ChatRef {
        match self {
            ChatEvent::Joined { chat, .. } | ChatEvent::Removed { chat, .. } => chat,
            ChatEvent::Migrated { from, .. } => from,
            ChatEvent::Edited(message) => &message.chat,
            ChatEvent::Button(press) => &press.chat,
        }
    }
}

/// What the platform answered to a sent message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SentMessage {
    /// The platform's id of the (first) message sent; a long reply may be several messages.
    pub message_ids: Vec<String>,
}

/// Why a platform call failed.
#[derive(Debug, thiserror::Error)]
pub enum PlatformError {
    /// The platform asked us to wait (Telegram's `retry_after`, HTTP 429).
    #[error("rate limited by the platform; retry after {0:?}")]
    RateLimited(std::time::Duration),
    /// Another process is polling with the same token (Telegram 409).
    #[error("another bot instance is using this token: {0}")]
    Conflict(String),
    /// The platform refused the request (bad chat, no rights, message too long...).
    #[error("the platform refused the request: {0}")]
    Refused(String),
    /// Network or server trouble; may succeed later.
    #[error("the platform is unreachable: {0}")]
    Unavailable(String),
    /// The token was rejected.
    #[error("the platform rejected the bot token")]
    Unauthorized,
    /// The requested thing (file, message, chat) does not exist.
    #[error("not found: {0}")]
    NotFound(String),
}

/// What the runtime and toolsets may do on a platform.
#[async_trait]
pub trait Platform: Send + Sync {
    /// `telegram`, `discord`, `console`: the prefix of this platform's session keys.
    fn name(&self) -> &str;

    /// Sends `text` (Markdown as the model wrote it; the adapter renders it for the
    /// platform and splits it as needed) to `chat`, threaded to `reply_to` when given.
    ///
    /// One attempt per part, no retries: the caller retries (the outbox, which owns a
    /// reply's progress). `sent` holds the ids of the parts an earlier attempt sent; the
    /// adapter skips that many parts and adds the id of each part it sends, so after an
    /// error `sent` says how far the reply got, and a retry with it sends only the rest.
    /// On success the returned ids are those of every part (as `sent` then holds).
    ///
    /// `key`, when given, is unique to this message (its outbox id): a platform with
    /// idempotent sends (Discord's `nonce` with `enforce_nonce`) turns a retry of a part it
    /// already accepted into a no-op. Without such support (Telegram, OneBot) a part whose
    /// answer was lost may show twice.
    async fn send(
        &self,
        chat: &ChatRef,
        text: &str,
        reply_to: Option<&str>,
        key: Option<&str>,
        sent: &mut Vec<String>,
    ) -> Result<SentMessage, PlatformError>;

    /// [`Platform::send`] with `buttons` (at most five: Discord's row) in one row under the
    /// message (under its last part when it is cut). The default sends without them: every post with buttons also says in
    /// its text the command that does the same (`/approve CODE`).
    async fn send_buttons(
        &self,
        chat: &ChatRef,
        text: &str,
        reply_to: Option<&str>,
        key: Option<&str>,
        sent: &mut Vec<String>,
        buttons: &[Button],
    ) -> Result<SentMessage, PlatformError> {
        let _ = buttons;
        self.send(chat, text, reply_to, key, sent).await
    }

    /// Answers a [`ButtonPress`]: `text`, when given, is shown to the presser alone
    /// (Telegram's callback answer as an alert, a Discord ephemeral follow-up); `None` only
    /// acknowledges. Called once per press. The default does nothing (no buttons).
    async fn answer_button(
        &self,
        press: &ButtonPress,
        text: Option<&str>,
    ) -> Result<(), PlatformError> {
        let _ = (press, text);
        Ok(())
    }

    /// Shows "typing..." in `chat` for a few seconds.
    async fn send_typing(&self, chat: &ChatRef) -> Result<(), PlatformError>;

    /// The platform-qualified ids of the chat's administrators; empty where the platform has
    /// no such notion.
    async fn chat_admins(&self, chat: &ChatRef) -> Result<Vec<String>, PlatformError>;

    /// Downloads an image (bounded in size by the adapter).
    async fn download_image(&self, image: &ImageRef) -> Result<Vec<u8>, PlatformError>;
}

/// Why the runtime could not take a message.
#[derive(Debug, thiserror::Error)]
pub enum InboxError {
    /// The daemon is shutting down; the adapter must not acknowledge the message, so the
    /// platform delivers it again after the restart.
    #[error("the daemon is shutting down")]
    ShuttingDown,
    /// The message could not be stored; it must not be acknowledged either.
    #[error("the message could not be stored: {0}")]
    Store(String),
}

/// One item of a batch for [`Inbox::deliver_all`].
#[derive(Debug, Clone, PartialEq)]
pub enum Delivery {
    /// A message, as for [`Inbox::deliver`].
    Message(IncomingMessage),
    /// A chat event, as for [`Inbox::chat_event`].
    Event(ChatEvent),
}

/// Why [`Inbox::deliver_all`] took only part of a batch.
#[derive(Debug, thiserror::Error)]
#[error("{error} (the batch's first {durable} item(s) were taken)")]
pub struct BatchError {
    /// How many items from the front of the batch are durably taken: the adapter may
    /// acknowledge these, and nothing after them.
    pub durable: usize,
    /// What stopped the rest.
    pub error: InboxError,
}

/// Where an adapter delivers what it receives. The runtime (the session manager) implements
/// it; adapters only see this trait.
#[async_trait]
pub trait Inbox: Send + Sync {
    /// Takes one message. Returns once it is durably recorded (and, when addressed to the
    /// bot, queued for a turn); only then may the adapter acknowledge it to the platform
    /// (for Telegram: advance the `getUpdates` offset past it). Delivering the same message
    /// twice is harmless: the runtime dedupes by `(chat, message_id)`.
    async fn deliver(&self, message: IncomingMessage) -> Result<(), InboxError>;

    /// Takes a batch (one `getUpdates` answer) in order, with the promise of
    /// [`Inbox::deliver`] for each item, but made durable together: one wait for the whole
    /// batch rather than one per item. On an error, [`BatchError::durable`] says how many
    /// items from the front were taken (durably); the adapter acknowledges those at most.
    ///
    /// The default delivers the items one by one.
    async fn deliver_all(&self, batch: Vec<Delivery>) -> Result<(), BatchError> {
        for (taken, delivery) in batch.into_iter().enumerate() {
            let delivered = match delivery {
                Delivery::Message(message) => self.deliver(message).await,
                Delivery::Event(event) => self.chat_event(event).await,
            };
            delivered.map_err(|error| BatchError {
                durable: taken,
                error,
            })?;
        }
        Ok(())
    }

    /// Takes one chat event ([`ChatEvent`]), with the same promise as
    /// [`Inbox::deliver`]: it returns once the event is durably applied, never waiting on the
    /// network, and a repeated event is harmless. The default ignores events, for inboxes
    /// that only take messages.
    async fn chat_event(&self, event: ChatEvent) -> Result<(), InboxError> {
        let _ = event;
        Ok(())
    }
}
