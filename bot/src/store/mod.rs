//! Durable state behind the [`Store`] trait (docs/contract.md, "Storage"): the message log of every chat,
//! session history, addressed inputs waiting for a turn (pending), replies waiting to be
//! sent (outbox) and small adapter state (poll offsets).
//!
//! The trait is what makes "never lose, never repeat" checkable, one logical step per
//! transaction:
//! - intake: [`Store::record_inbound`] records a message in the chat log (the dedupe key)
//!   *and* makes it pending (or queues its immediate answer) in one transaction, so a kill
//!   can never leave a message recorded (deduped) but not pending;
//! - a system input (a task notice) is [`Store::add_pending_with`] together with the
//!   toolset record saying it was told;
//! - a turn's history, the removal of its pending items and its reply in the outbox land in
//!   one [`Store::commit_turn`];
//! - the reply is [`Store::mark_sent`] with the platform's message ids, which stay on the
//!   outbox row ([`Store::sent_reply`]).
//!
//! After a crash, `pending` is resumed and `unsent_outbox` is sent again.
//!
//! **Durability.** A write is in the store when its method returns, and durable (it
//! survives a kill) once a [`Store::durable`] (or [`Store::flush`]) called *after* it has
//! returned `Ok`. Such a wait is shared: the callers waiting at the same moment, from any
//! chat, are covered by one flush ([`GroupCommit`]). Anything told to the outside world
//! (the platform acknowledged, a reply sent) waits for durability first, and no lock of
//! the session layer is held while waiting.
//!
//! Implementations: [`SledStore`] (sled 0.34, the default), [`PgStore`] (PostgreSQL, for
//! state on a database server) and [`MemoryStore`] (tests, ephemeral runs). Every value is versioned JSON so that later versions can read it.

pub mod arena;
mod common;
mod group_commit;
mod history;
mod memory;
mod pg;
mod sled_step;
mod sled_store;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use crate::llm::Message;
use crate::platform::{ChatRef, ImageRef, IncomingMessage, Sender};
use crate::tool::Caller;

pub use common::StoreOptions;
pub use group_commit::{GroupCommit, Ticket};
pub use memory::MemoryStore;
pub use pg::PgStore;
pub use sled_store::SledStore;

/// How long the record of a sent (or given-up) reply is kept.
pub const SENT_KEEP_DAYS: i64 = 7;

/// Why the store could not do what was asked.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// Another process holds the database (a second daemon on the same `data_dir`).
    #[error("the data directory {0} is in use by another parlor process")]
    Locked(String),
    /// The database could not be opened, read or written.
    #[error("storage error: {0}")]
    Io(String),
    /// A conditional write ([`KvWrite::if_unchanged`]) found its record changed since it
    /// was read: nothing of the transaction was written; read again and retry.
    #[error("record {0} changed since it was read")]
    Changed(String),
    /// A stored value could not be decoded (corruption, or written by a newer version).
    #[error("stored value {key} cannot be read: {reason}")]
    Corrupt {
        /// Which key.
        key: String,
        /// What is wrong.
        reason: String,
    },
}

/// One message of a chat as recorded in the message log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredMessage {
    /// The platform's message id (unique within the chat).
    pub message_id: String,
    /// Who wrote it; the bot itself for its own replies.
    pub sender: Sender,
    /// Text or caption.
    pub text: String,
    /// When it was sent.
    #[serde(serialize_with = "crate::time::rfc3339::serialize")]
    pub time: DateTime<Utc>,
    /// The message it replies to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
    /// Attached images, by platform reference.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<ImageRef>,
    /// Whether this bot wrote it.
    #[serde(default)]
    pub from_self: bool,
}

impl StoredMessage {
    /// A message someone else wrote, as the log keeps it.
    pub fn received(message: &IncomingMessage) -> Self {
        StoredMessage {
            message_id: message.message_id.clone(),
            sender: message.sender.clone(),
            text: message.text.clone(),
            time: message.time,
            reply_to: message.reply_to.clone(),
            images: message.images.clone(),
            from_self: false,
        }
    }

    /// A message the bot itself posted on `platform` under `bot_name`, as the log keeps it,
    /// so that context shows both sides of the conversation.
    pub fn from_bot(
        platform: &str,
        bot_name: &str,
        message_id: &str,
        text: &str,
        reply_to: Option<&str>,
        time: DateTime<Utc>,
    ) -> Self {
        StoredMessage {
            message_id: message_id.to_owned(),
            sender: Sender {
                id: [platform, ":self"].concat(),
                name: bot_name.to_owned(),
                username: None,
                is_bot: true,
            },
            text: text.to_owned(),
            time,
            reply_to: reply_to.map(str::to_owned),
            images: Vec::new(),
            from_self: true,
        }
    }
}

/// What kind of input a pending item is; the session queue merges items of the same kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PendingKind {
    /// A message addressed to the bot.
    UserMessage,
    /// A background task finished.
    TaskResult,
    /// A clock task fired.
    ClockFire,
    /// An unaddressed message in an auto-chat group: part of a batch that becomes one
    /// auto-chat turn. Stored as `overheard`, its name before auto-chat had one name.
    #[serde(rename = "overheard")]
    AutoChat,
    /// `/reset`: checked (chat admins only in groups) and carried out by the chat's worker.
    Reset,
    /// `/compact [topic]`: checked (chat admins only in groups) and carried out by the
    /// chat's worker, which summarizes the older turns (the text is the topic).
    Compact,
    /// `/set key value`: checked (chat admins only in groups, within the operator's caps)
    /// and applied by the chat's worker (the text is `key value`).
    Settings,
    /// A toolset's command (`/forget KEY`): its role checked and run by the chat's worker
    /// (the text is the command line).
    ChatCommand,
}

impl PendingKind {
    /// The kind's name as it is stored (its serde form).
    pub fn name(self) -> &'static str {
        match self {
            PendingKind::UserMessage => "user_message",
            PendingKind::TaskResult => "task_result",
            PendingKind::ClockFire => "clock_fire",
            PendingKind::AutoChat => "overheard",
            PendingKind::Reset => "reset",
            PendingKind::Compact => "compact",
            PendingKind::Settings => "settings",
            PendingKind::ChatCommand => "chat_command",
        }
    }
}

/// An input that must get a turn, recorded before the turn runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingItem {
    /// Unique and increasing in arrival order; assigned by [`Store::add_pending`].
    pub id: u64,
    /// Session key.
    pub session: String,
    /// Where the reply goes.
    pub chat: ChatRef,
    /// The kind of input.
    pub kind: PendingKind,
    /// Who it is from (for attribution and permissions).
    pub caller: Caller,
    /// The text as the model should see it (already attributed: `alice: ...`).
    pub text: String,
    /// The platform message to thread the reply to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
    /// Images attached to the input.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<ImageRef>,
    /// When it arrived.
    #[serde(serialize_with = "crate::time::rfc3339::serialize")]
    pub received: DateTime<Utc>,
    /// Whether it came from a direct message (where nobody is a chat admin).
    #[serde(default)]
    pub private: bool,
}

/// A reply waiting to be sent, or — once [`Store::mark_sent`] or [`Store::mark_failed`] —
/// the record of what became of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutboxEntry {
    /// Unique; assigned by [`Store::commit_turn`].
    pub id: u64,
    /// Session key.
    pub session: String,
    /// Target chat.
    pub chat: ChatRef,
    /// The reply text (Markdown).
    pub text: String,
    /// The platform message to thread to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
    /// When the turn committed.
    #[serde(serialize_with = "crate::time::rfc3339::serialize")]
    pub created: DateTime<Utc>,
    /// The platform's ids of the messages the reply became, once sent; while unsent, those
    /// of the parts of a long reply already sent ([`Store::record_sent_parts`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sent_ids: Vec<String>,
    /// When it was sent or given up on.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "crate::time::rfc3339::serialize_option"
    )]
    pub done_at: Option<DateTime<Utc>>,
    /// Why the platform refused it for good (chat gone, bot removed), when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
    /// Buttons under it ([`Platform::send_buttons`](crate::platform::Platform::send_buttons)).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub buttons: Vec<crate::platform::Button>,
}

impl OutboxEntry {
    /// A reply to `chat` (session `session`), to be given an id by the store.
    /// `created`: the session layer's wall time, when it was made.
    pub fn new(
        session: &str,
        chat: &ChatRef,
        text: String,
        reply_to: Option<String>,
        created: DateTime<Utc>,
    ) -> Self {
        OutboxEntry {
            id: 0,
            session: session.to_owned(),
            chat: chat.clone(),
            text,
            reply_to,
            created,
            sent_ids: Vec::new(),
            done_at: None,
            failed: None,
            buttons: Vec::new(),
        }
    }

    /// The same with `buttons` under it.
    pub fn with_buttons(mut self, buttons: Vec<crate::platform::Button>) -> Self {
        self.buttons = buttons;
        self
    }
}

/// What intake does with a message besides recording it, in the same transaction.
#[derive(Debug, Clone, PartialEq)]
pub enum Intake {
    /// Only record it (chatter, a bot's message).
    Record,
    /// Record it and make it pending: it must get a turn (`id` is assigned by the store).
    Pending(PendingItem),
    /// Record it and queue this answer (a command answered at once, an overflow notice;
    /// `id` is assigned by the store).
    Reply(OutboxEntry),
}

/// What [`Store::record_inbound`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inbound {
    /// The message was recorded before: nothing was written.
    Duplicate,
    /// Recorded; the id of the pending item or the queued reply, when the intake had one.
    Recorded(Option<u64>),
}

/// A write to a toolset collection that must land together with another write (see
/// [`Store::add_pending_with`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KvWrite {
    /// The collection.
    pub space: String,
    /// The record's key.
    pub key: String,
    /// The new value; `None` removes the record.
    pub value: Option<String>,
    /// When set, the write applies only if the record still holds this (`None`: absent);
    /// otherwise the whole transaction is refused with [`StoreError::Changed`]. For a
    /// write computed from a read made outside the transaction (a chat hook), which must
    /// not undo what another writer did in between.
    pub if_unchanged: Option<Option<String>>,
}

impl KvWrite {
    /// The error of a conditional write whose record changed.
    pub(crate) fn changed(&self) -> StoreError {
        StoreError::Changed(format!("{}/{}", self.space, self.key))
    }
}

/// What the bot knows of its own place in a chat (the `chats` tree): written when it is
/// added or removed, read to tell whether a chat is one the bot is in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatRecord {
    /// The chat.
    pub chat: ChatRef,
    /// Its title, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// Whether the bot is in the chat.
    pub present: bool,
    /// The platform's word for the bot's status (`member`, `administrator`, `left`,
    /// `kicked`), or `migrated` for a record carried over to a chat's new id.
    pub status: String,
    /// When the status changed.
    pub since: DateTime<Utc>,
}

/// What [`Store::edit_message`] changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Edited {
    /// The message is not in the chat log (never seen, or pruned): nothing changed.
    Unknown,
    /// The log record was updated; no pending input was (it was answered, or never one).
    Logged,
    /// The log record and the pending input with this id were updated.
    Pending(u64),
}

/// How a commit changes a session's history.
#[derive(Debug, Clone, PartialEq)]
pub enum HistoryChange {
    /// What a turn writes: the `dropped` oldest stored messages go (all of them, when fewer
    /// are stored: trimming, or the model's context refusing the older part), then
    /// `messages`, the turn's new ones, follow what is left. Only the new messages are
    /// written, not the whole history again.
    Append {
        /// How many messages the trim dropped from the front of the stored history.
        dropped: usize,
        /// The turn's messages, oldest first.
        messages: Vec<Message>,
    },
    /// The history becomes exactly this (`/reset`: empty), and the session's summary goes
    /// unless the commit sets a new one.
    Replace(Vec<Message>),
}

/// What a session's older turns were compacted into: it stands in for them in every later
/// request (after the system prompt) and survives restarts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// The summary, as the model wrote it.
    pub text: String,
    /// When it was written.
    pub made: DateTime<Utc>,
    /// How many messages it stands for, over every compaction that built it.
    #[serde(default)]
    pub messages: usize,
}

/// Everything a finished turn writes, applied atomically by [`Store::commit_turn`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TurnCommit {
    /// Session key.
    pub session: String,
    /// What becomes of the session's history; `None` leaves it as it is (an input answered
    /// without a turn, such as a refused command).
    pub history: Option<HistoryChange>,
    /// Pending items this turn answered.
    pub answered: Vec<u64>,
    /// The reply to send, if any (`id` is assigned by the store, unless it is one
    /// [`Store::reserve_id`] gave).
    pub reply: Option<OutboxEntry>,
    /// Records of other collections that belong to the turn and land with it: the chat's
    /// usage of the day and the turn's trace (`session/usage.rs`, `session/trace.rs`).
    pub also: Vec<KvWrite>,
    /// The session's new summary (compaction), written with the history change that drops
    /// the turns it stands for; `None` keeps the old one (unless the history is replaced).
    pub summary: Option<Summary>,
}

/// Durable state of the daemon. Methods are synchronous and quick (sled is an embedded
/// database); only the waits for durability, [`Store::durable`] and [`Store::flush`], are
/// slow.
///
/// Each write method is one transaction: it is wholly in the store when it returns, or (on
/// an error) not at all. It is *durable* only once a [`Store::durable`] or [`Store::flush`]
/// called after it returned `Ok`; a kill before that may lose it, along with every later
/// write (never an earlier one without the later: the log is ordered). Concurrent waits
/// share one flush (see [`GroupCommit`]), so a caller must not hold a lock that other
/// writers need while it waits.
pub trait Store: Send + Sync + 'static {
    /// Records a chat message. Returns `false` (and changes nothing) when this
    /// `(session, message_id)` is already recorded: the inbound dedupe. The log of each
    /// session is bounded; the oldest messages are dropped first.
    fn record_message(&self, session: &str, message: &StoredMessage) -> Result<bool, StoreError> {
        Ok(self.record_inbound(session, message, Intake::Record)? != Inbound::Duplicate)
    }

    /// Records a message the bot posted (under the first of the platform's `ids`; nothing
    /// without one) in the chat log, so that `get_message` and the group context see the
    /// bot's side of the conversation.
    fn record_own(
        &self,
        session: &str,
        platform: &str,
        bot_name: &str,
        ids: &[String],
        text: &str,
        reply_to: Option<&str>,
    ) -> Result<(), StoreError> {
        let Some(first) = ids.first() else {
            return Ok(());
        };
        // Not injected yet: the message toolset, its one caller (outside a session),
        // holds no wall time.
        let message =
            StoredMessage::from_bot(platform, bot_name, first, text, reply_to, Utc::now());
        self.record_message(session, &message).map(drop)
    }

    /// One recorded message of a session.
    fn get_message(
        &self,
        session: &str,
        message_id: &str,
    ) -> Result<Option<StoredMessage>, StoreError>;

    /// The last `limit` recorded messages of a session, oldest first.
    fn recent_messages(
        &self,
        session: &str,
        limit: usize,
    ) -> Result<Vec<StoredMessage>, StoreError>;

    /// The session's conversation history (empty when none).
    fn load_history(&self, session: &str) -> Result<Vec<Message>, StoreError>;

    /// Replaces a session's history (trimming, `/reset`).
    fn save_history(&self, session: &str, history: &[Message]) -> Result<(), StoreError>;

    /// The summary of a session's compacted older turns, if it has one.
    fn load_summary(&self, session: &str) -> Result<Option<Summary>, StoreError>;

    /// Records an inbound message in the chat log and, in the same transaction, makes it
    /// pending or queues its answer (see [`Intake`]). A message already recorded changes
    /// nothing and is [`Inbound::Duplicate`].
    fn record_inbound(
        &self,
        session: &str,
        message: &StoredMessage,
        intake: Intake,
    ) -> Result<Inbound, StoreError>;

    /// Records an addressed input before its turn; returns the id assigned to it.
    fn add_pending(&self, item: PendingItem) -> Result<u64, StoreError> {
        self.add_pending_with(item, Vec::new())
    }

    /// Records an input before its turn together with toolset records (a task row saying
    /// its notice was queued), atomically; returns the id assigned to the input.
    fn add_pending_with(&self, item: PendingItem, also: Vec<KvWrite>) -> Result<u64, StoreError>;

    /// Every pending item, in arrival order.
    fn pending(&self) -> Result<Vec<PendingItem>, StoreError>;

    /// Drops pending items without a turn (`/reset` of a session, say).
    fn remove_pending(&self, ids: &[u64]) -> Result<(), StoreError>;

    /// Atomically changes the history (appends the turn's messages, or replaces it), removes
    /// the answered pending items, queues the reply and writes the turn's other records
    /// (`also`); returns the reply's outbox id.
    fn commit_turn(&self, commit: TurnCommit) -> Result<Option<u64>, StoreError>;

    /// An id no pending item or reply has or will get: a reply's outbox id known before its
    /// commit, so that a record committed with it (the turn's trace) can name it.
    fn reserve_id(&self) -> Result<u64, StoreError>;
    /// Queues a message for the outbox outside a turn's commit (an auto-chat turn's
    /// `send_message`) together with toolset-style records (the chat's send counts), in one
    /// transaction; returns its outbox id.
    fn queue_outbox_with(&self, entry: OutboxEntry, also: Vec<KvWrite>) -> Result<u64, StoreError>;

    /// Replies committed but not yet marked sent, oldest first.
    fn unsent_outbox(&self) -> Result<Vec<OutboxEntry>, StoreError>;

    /// Marks a reply sent, with the platform's message ids: it leaves the unsent outbox and
    /// its record keeps the ids (for a week; older records are pruned).
    fn mark_sent(&self, outbox_id: u64, platform_ids: &[String]) -> Result<(), StoreError>;

    /// [`Store::mark_sent`], and the bot's message as the platform took it (`own`, built by
    /// [`StoredMessage::from_bot`]) recorded in the chat log of `session` like
    /// [`Store::record_own`] does, in one step: a stop between the two cannot leave a sent
    /// reply missing from the log. An `own` already recorded is left as it is.
    fn mark_sent_with_own(
        &self,
        outbox_id: u64,
        platform_ids: &[String],
        session: &str,
        own: Option<&StoredMessage>,
    ) -> Result<(), StoreError> {
        self.mark_sent(outbox_id, platform_ids)?;
        match own {
            Some(message) => self.record_message(session, message).map(drop),
            None => Ok(()),
        }
    }

    /// Records the platform's ids of the parts of an unsent long reply that were sent before
    /// a send failed (kept in its `sent_ids`), so that a retry, in this process or after a
    /// restart, sends only the rest. A reply no longer unsent is left as it is.
    fn record_sent_parts(&self, outbox_id: u64, platform_ids: &[String]) -> Result<(), StoreError>;

    /// Gives a reply up for good (the platform refused it: chat gone, bot removed), with
    /// the reason, kept on its record like a sent one.
    fn mark_failed(&self, outbox_id: u64, reason: &str) -> Result<(), StoreError>;

    /// The record of a reply that was sent or given up on.
    fn sent_reply(&self, outbox_id: u64) -> Result<Option<OutboxEntry>, StoreError>;

    /// Small adapter state (poll offsets, caches).
    fn get_meta(&self, key: &str) -> Result<Option<String>, StoreError>;

    /// Sets small adapter state.
    fn set_meta(&self, key: &str, value: &str) -> Result<(), StoreError>;

    /// A record of a toolset's own collection (`memory`, `clocks`, `clock_runs`...): the
    /// value as stored, or `None`. Callers store versioned JSON.
    fn kv_get(&self, space: &str, key: &str) -> Result<Option<String>, StoreError>;

    /// Inserts or replaces a record of a collection.
    fn kv_put(&self, space: &str, key: &str, value: &str) -> Result<(), StoreError>;

    /// Removes a record; `true` when it existed.
    fn kv_delete(&self, space: &str, key: &str) -> Result<bool, StoreError>;

    /// Applies `writes` to toolset collections in one transaction: all or none (a changed
    /// conditional write refuses them all with [`StoreError::Changed`]).
    fn kv_write(&self, writes: Vec<KvWrite>) -> Result<(), StoreError>;

    /// Every record of a collection whose key starts with `prefix`, in key order.
    fn kv_scan(&self, space: &str, prefix: &str) -> Result<Vec<(String, String)>, StoreError>;

    /// What the bot knows of its place in the chat with session key `session`, if it was
    /// ever recorded ([`Store::set_chat_status`]).
    fn chat_status(&self, session: &str) -> Result<Option<ChatRecord>, StoreError>;

    /// Records the bot's place in a chat (added, removed) together with toolset records
    /// (clock tasks paused) and notices to queue in the outbox (their creators told), in
    /// one transaction; returns the notices' outbox ids.
    fn set_chat_status(
        &self,
        record: &ChatRecord,
        also: Vec<KvWrite>,
        notices: Vec<OutboxEntry>,
    ) -> Result<Vec<u64>, StoreError>;

    /// Moves the session of chat `from` to chat `to` (a group that became a supergroup),
    /// in one transaction: the chat log (appended before anything `to` already logged; the
    /// moved messages' ids become `{from.chat_id}/{id}`, since the new chat numbers its
    /// messages afresh and must not be deduped against the old ones), the history (before
    /// `to`'s), the pending inputs and unsent replies (re-addressed to `to`, no longer
    /// threaded to a message of the old chat), the chat record, the toolset records in
    /// `also`, and a record that the move happened. `false`, and nothing written, when that
    /// record exists already: a repeated migration is a no-op.
    fn migrate_session(
        &self,
        from: &ChatRef,
        to: &ChatRef,
        also: Vec<KvWrite>,
    ) -> Result<bool, StoreError>;

    /// Where the session `session` moved, if it did ([`Store::migrate_session`]).
    fn migrated_to(&self, session: &str) -> Result<Option<String>, StoreError>;

    /// An edit of a recorded message, in one transaction: its log record takes the new
    /// text and images (`message`, same `message_id`), and when `pending_text` is given
    /// the user-message input still pending for it (not yet answered) takes that text.
    fn edit_message(
        &self,
        session: &str,
        message: &StoredMessage,
        pending_text: Option<&str>,
    ) -> Result<Edited, StoreError>;

    /// Waits until every write made before the call is durable. The session layer's wait
    /// before it tells the outside world anything. Concurrent waits share a flush: one that
    /// starts after the call covers it and every other caller queued by then. The ticket is
    /// taken when this is called, not when the future is first polled.
    ///
    /// The default flushes on the first poll, for stores without a [`GroupCommit`].
    fn durable(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move { self.flush() })
    }

    /// [`Store::durable`] for synchronous code (the toolsets' writes, shutdown): blocks the
    /// thread until every write so far is durable, sharing flushes with the other callers
    /// like `durable`. (sled also flushes by itself twice a second.)
    fn flush(&self) -> Result<(), StoreError>;

    /// How many flushes the store ran (each covering every caller then waiting), for tests
    /// and the bench; 0 for a store that does not count them.
    fn flushes(&self) -> u64 {
        0
    }
}

/// The meta key recording that session `from` moved ([`Store::migrate_session`]).
/// The summary of a chat moved onto another (a group upgraded to a supergroup): the old
/// chat's comes first, as its history does.
pub(crate) fn merged_summaries(old: Option<Summary>, new: Option<Summary>) -> Option<Summary> {
    match (old, new) {
        (Some(old), Some(new)) => Some(Summary {
            text: format!("{}\n\n{}", old.text, new.text),
            made: old.made.max(new.made),
            messages: old.messages + new.messages,
        }),
        (old, new) => old.or(new),
    }
}

pub(crate) fn migrated_key(from: &str) -> String {
    format!("migrated:{from}")
}

/// The id a message of the old chat `from` keeps after [`Store::migrate_session`].
pub(crate) fn moved_message_id(from: &ChatRef, message_id: &str) -> String {
    format!("{}/{message_id}", from.chat_id)
}

/// A logged message of the old chat `from`, as the new chat's log keeps it.
pub(crate) fn moved_message(from: &ChatRef, mut message: StoredMessage) -> StoredMessage {
    message.message_id = moved_message_id(from, &message.message_id);
    message.reply_to = message.reply_to.map(|reply| moved_message_id(from, &reply));
    message
}

/// A pending input of the old chat, re-addressed to `to` (same thread, if any). It is no
/// longer threaded: the message it answered lives in the old chat.
pub(crate) fn moved_pending(to: &ChatRef, mut item: PendingItem) -> PendingItem {
    (item.chat, item.session) = moved_chat(&item.chat, to);
    item.reply_to = None;
    item
}

/// An unsent reply of the old chat, re-addressed to `to` like [`moved_pending`].
pub(crate) fn moved_outbox(to: &ChatRef, mut entry: OutboxEntry) -> OutboxEntry {
    (entry.chat, entry.session) = moved_chat(&entry.chat, to);
    entry.reply_to = None;
    entry
}

/// `chat` (in its thread, if any) under the new chat `to`, with its session key.
fn moved_chat(chat: &ChatRef, to: &ChatRef) -> (ChatRef, String) {
    let moved = ChatRef {
        thread_id: chat.thread_id.clone(),
        ..to.clone()
    };
    let session = moved.session_key();
    (moved, session)
}

/// A reply to chat `telegram:-100`, not yet queued: for the stores' own tests.
#[cfg(test)]
pub(crate) fn test_reply(text: &str) -> OutboxEntry {
    OutboxEntry {
        id: 0,
        session: "telegram:-100".to_owned(),
        chat: crate::platform::ChatRef::new("telegram", "-100"),
        text: text.to_owned(),
        reply_to: None,
        created: chrono::Utc::now(),
        sent_ids: Vec::new(),
        done_at: None,
        failed: None,
        buttons: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::PendingKind;

    #[test]
    fn a_kind_name_is_its_stored_form() {
        use PendingKind::*;
        for kind in [
            UserMessage,
            TaskResult,
            ClockFire,
            AutoChat,
            Reset,
            Compact,
            Settings,
            ChatCommand,
        ] {
            assert_eq!(
                serde_json::to_value(kind).unwrap(),
                serde_json::Value::from(kind.name())
            );
        }
    }
}
