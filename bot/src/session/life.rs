//! Intake of chat events ([`Inbox::chat_event`]): the bot added to a chat or removed from
//! it, a chat moved to a new id, a message edited. Like a message, each is applied in one
//! store transaction, durable before `chat_event` returns (the wait after every lock is
//! dropped, see [`super::inbox`]), and never waits on the network: the adapter acknowledges
//! it only afterwards, and a repeated event changes nothing.
//!
//! Toolsets keep data about chats (memory, a plan, clock tasks), which the runtime does not
//! know; they take part through [`ChatHook`]s registered with
//! [`SessionManager::add_chat_hook`]: a hook reads what it keeps and answers the writes
//! (and notices) that land in the same transaction as the event.
//!
//! - **Joined**: the chat's record says the bot is in it, so it is a known chat from now on
//!   (a clock task may target it before anyone spoke there).
//! - **Removed** (`left`, `kicked`): the record says the bot is out; hooks pause what fires
//!   into the chat and name whom to tell. A notice goes to the outbox of a chat other than
//!   the removed one that the bot is still in; one for the removed chat itself, or for a
//!   chat the bot is out of, is only logged.
//! - **Migrated**: [`Store::migrate_session`](crate::store::Store::migrate_session) moves
//!   log, history, pending inputs, unsent replies and the hooks' records; the inputs waiting
//!   in the old session's queue move to the new one. Idempotent through the store's record
//!   of the move.
//! - **Edited**: the log record takes the new text; an input still pending for the message
//!   (not yet answered) takes it too, in the store and in the waiting queue item.

use chrono::{DateTime, Utc};

use super::inbox::Accepted;
use super::inbox::Intake;
use super::policy;
use crate::platform::{ChatEvent, ChatRef, InboxError, IncomingMessage, Sender};
use crate::store::{ChatRecord, Edited, KvWrite, OutboxEntry, Store, StoreError, StoredMessage};

/// What a hook wants done when the bot is removed from a chat.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Removal {
    /// Records to write with the removal (tasks paused).
    pub writes: Vec<KvWrite>,
    /// Whom to tell: a chat and the text to post there.
    pub notices: Vec<(ChatRef, String)>,
}

/// A toolset's part in a chat's life: the records it keeps about a chat, rewritten when
/// the chat moves or the bot leaves it. Each method reads what it needs from `store` and
/// answers writes; the session layer applies them in the event's one transaction, so a
/// hook writes nothing itself.
pub trait ChatHook: Send + Sync {
    /// The records to rewrite when the session of chat `from` moves to chat `to`.
    fn on_migrate(
        &self,
        store: &dyn Store,
        from: &ChatRef,
        to: &ChatRef,
    ) -> Result<Vec<KvWrite>, StoreError> {
        let _ = (store, from, to);
        Ok(Vec::new())
    }

    /// What to write and whom to tell when the bot is removed from `chat` (`status`:
    /// `left`, `kicked`).
    fn on_removed(
        &self,
        store: &dyn Store,
        chat: &ChatRef,
        status: &str,
    ) -> Result<Removal, StoreError> {
        let _ = (store, chat, status);
        Ok(Removal::default())
    }
}

/// For [`ChatHook::on_migrate`]: the writes that move record `from` of collection `space`
/// to key `to` (nothing when there is none, or `to` holds one already: the newer chat's
/// record wins).
pub fn move_record(
    store: &dyn Store,
    space: &str,
    from: &str,
    to: &str,
) -> Result<Vec<KvWrite>, StoreError> {
    if from == to || store.kv_get(space, to)?.is_some() {
        return Ok(Vec::new());
    }
    Ok(match store.kv_get(space, from)? {
        Some(value) => moves(space, from, to, value),
        None => Vec::new(),
    })
}

/// For [`ChatHook::on_migrate`]: the writes that move every record of `space` whose key
/// starts with `from` to the same key starting with `to` (a record whose new key is taken
/// stays where it is).
pub fn move_records(
    store: &dyn Store,
    space: &str,
    from: &str,
    to: &str,
) -> Result<Vec<KvWrite>, StoreError> {
    if from == to {
        return Ok(Vec::new());
    }
    let mut writes = Vec::new();
    for (key, value) in store.kv_scan(space, from)? {
        let Some(rest) = key.strip_prefix(from) else {
            continue;
        };
        let new_key = format!("{to}{rest}");
        if store.kv_get(space, &new_key)?.is_none() {
            writes.extend(moves(space, &key, &new_key, value));
        }
    }
    Ok(writes)
}

/// Conditional on what was read: a tool writing either record before the event's
/// transaction lands makes the transaction retry with a fresh read instead of undoing it.
fn moves(space: &str, from: &str, to: &str, value: String) -> Vec<KvWrite> {
    vec![
        KvWrite {
            space: space.to_owned(),
            key: to.to_owned(),
            value: Some(value.clone()),
            if_unchanged: Some(None),
        },
        KvWrite {
            space: space.to_owned(),
            key: from.to_owned(),
            value: None,
            if_unchanged: Some(Some(value)),
        },
    ]
}

/// How often an event's hooks read again when their conditional writes found a record
/// changed; each retry follows a write that landed meanwhile, so more means a storm.
const HOOK_ATTEMPTS: usize = 5;

fn store_error(e: StoreError) -> InboxError {
    InboxError::Store(e.to_string())
}

/// Whether `a` and `b` are the same chat, whatever their threads.
fn same_chat(a: &ChatRef, b: &ChatRef) -> bool {
    a.platform == b.platform && a.chat_id == b.chat_id
}

impl Intake<'_> {
    /// The writing part of an event's intake, synchronous: nothing in it may wait.
    pub(super) fn event_intake(&self, event: ChatEvent) -> Result<Accepted, InboxError> {
        if self.manager.draining().is_cancelled() {
            return Err(InboxError::ShuttingDown);
        }
        if !policy::chat_allowed(self.manager.config(), event.chat()) {
            tracing::debug!(chat = %event.chat(), "event outside the allow-lists ignored");
            return Ok(Accepted::nothing());
        }
        match event {
            ChatEvent::Joined {
                chat, title, by, ..
            } => self.joined(chat, title, &by),
            ChatEvent::Removed {
                chat,
                status,
                by,
                time,
            } => self.removed(&chat, &status, &by, time),
            ChatEvent::Migrated { from, to } => self.migrated(&from, &to),
            ChatEvent::Edited(message) => self.edited(&message),
            ChatEvent::Button(press) => self.button_pressed(press),
        }
    }

    fn joined(
        &self,
        chat: ChatRef,
        title: Option<String>,
        by: &Sender,
    ) -> Result<Accepted, InboxError> {
        let store = self.manager.store();
        let record = ChatRecord {
            chat,
            title,
            present: true,
            status: "member".to_owned(),
            since: self.manager.now(),
        };
        store
            .set_chat_status(&record, Vec::new(), Vec::new())
            .map_err(store_error)?;
        tracing::info!(chat = %record.chat, by = %by.id, "added to a chat");
        Ok(Accepted::durable())
    }

    fn removed(
        &self,
        chat: &ChatRef,
        status: &str,
        by: &Sender,
        time: DateTime<Utc>,
    ) -> Result<Accepted, InboxError> {
        // A hook's writes are computed from a read outside the transaction and conditional on
        // it: a tool or a clock fire changing a record in between refuses the transaction,
        // and the hooks read again.
        for attempt in 1..=HOOK_ATTEMPTS {
            match self.removed_once(chat, status, by, time) {
                Err(StoreError::Changed(what)) if attempt < HOOK_ATTEMPTS => {
                    tracing::debug!(chat = %chat, %what, "a record changed during the removal; again");
                }
                other => return other.map_err(store_error),
            }
        }
        Err(InboxError::Store(format!(
            "the records of {chat} kept changing during the removal"
        )))
    }

    fn removed_once(
        &self,
        chat: &ChatRef,
        status: &str,
        by: &Sender,
        time: DateTime<Utc>,
    ) -> Result<Accepted, StoreError> {
        let store = self.manager.store();
        let mut writes = Vec::new();
        let mut notices = Vec::new();
        for hook in self.manager.hooks() {
            let removal = hook.on_removed(store.as_ref(), chat, status)?;
            writes.extend(removal.writes);
            for (to, text) in removal.notices {
                let reachable = !same_chat(&to, chat)
                    && self.manager.platform(&to).is_some()
                    && store
                        .chat_status(&to.session_key())?
                        .is_none_or(|record| record.present);
                if reachable {
                    notices.push(OutboxEntry::new(
                        &to.session_key(),
                        &to,
                        text,
                        None,
                        self.manager.now(),
                    ));
                } else {
                    tracing::warn!(removed_from = %chat, creator_chat = %to, notice = %text, "cannot tell the creator in their chat; logged only");
                }
            }
        }
        let record = ChatRecord {
            chat: chat.clone(),
            title: store
                .chat_status(&chat.session_key())?
                .and_then(|r| r.title),
            present: false,
            status: status.to_owned(),
            since: time,
        };
        let ids = store.set_chat_status(&record, writes, notices.clone())?;
        tracing::info!(chat = %chat, status, by = %by.id, told = ids.len(), "removed from a chat");
        let mut accepted = Accepted::durable();
        for (mut entry, id) in notices.into_iter().zip(ids) {
            entry.id = id;
            accepted.replies.push(entry);
        }
        Ok(accepted)
    }

    fn migrated(&self, from: &ChatRef, to: &ChatRef) -> Result<Accepted, InboxError> {
        let store = self.manager.store();
        let (old, new) = (from.session_key(), to.session_key());
        if old == new {
            return Ok(Accepted::nothing());
        }
        if store.migrated_to(&old).map_err(store_error)?.is_some() {
            // Waited for all the same: the move may not be durable yet.
            tracing::debug!(from = %old, to = %new, "chat already moved");
            return Ok(Accepted::durable());
        }
        // Under the owner lock: no input can be queued on the old session meanwhile.
        let mut chats = self.manager.chats();
        let mut attempt = 0;
        let moved = loop {
            attempt += 1;
            let mut writes = Vec::new();
            for hook in self.manager.hooks() {
                writes.extend(
                    hook.on_migrate(store.as_ref(), from, to)
                        .map_err(store_error)?,
                );
            }
            // Conditional writes, as in a removal.
            match store.migrate_session(from, to, writes) {
                Err(StoreError::Changed(what)) if attempt < HOOK_ATTEMPTS => {
                    tracing::debug!(from = %old, to = %new, %what, "a record changed during the move; again");
                }
                other => break other.map_err(store_error)?,
            }
        };
        if !moved {
            return Ok(Accepted::durable());
        }
        // The old chat's history is now in front of the new one's.
        if let Some(session) = chats.get(&new) {
            session.history_changed();
        }
        let waiting = chats.move_out(&old);
        tracing::info!(from = %old, to = %new, moved_inputs = waiting.len(), "chat moved to a new id");
        if waiting.is_empty() {
            return Ok(Accepted::durable());
        }
        let session = chats.session(&new);
        for mut item in waiting {
            item.chat = ChatRef {
                thread_id: item.chat.thread_id.take(),
                ..to.clone()
            };
            item.reply_to = None;
            // Inputs already accepted: they go in even over the capacity (they are pending).
            session.queue().push_over_capacity(item);
        }
        Ok(Accepted::durable())
    }

    /// A button press: an approval's decision ([`super::approvals`], decided off intake), or
    /// a setting chosen under `/settings`, which becomes the presser's `/set`.
    fn button_pressed(&self, press: crate::platform::ButtonPress) -> Result<Accepted, InboxError> {
        if self.decide_by_button(&press) {
            return Ok(Accepted::nothing());
        }
        // Acknowledged at once: the answer is the `/set` reply in the chat.
        let manager = self.manager.clone();
        let answered = press.clone();
        self.manager.tracker().spawn(async move {
            super::approvals::answer_press(&manager, &answered, None).await;
        });
        let Some((key, value)) = press
            .data
            .strip_prefix(super::settings::BUTTON_PREFIX)
            .and_then(|rest| rest.split_once(':'))
        else {
            tracing::debug!(chat = %press.chat, "a press of no button of ours ignored");
            return Ok(Accepted::nothing());
        };
        let message = IncomingMessage {
            chat: press.chat.clone(),
            kind: crate::platform::ChatKind::Group,
            // One press is one input, however often the platform reports it.
            message_id: format!("press:{}", press.answer),
            sender: press.sender.clone(),
            text: format!("/set {key} {value}"),
            time: self.manager.now(),
            reply_to: None,
            reply_to_bot: false,
            mentions_bot: false,
            images: Vec::new(),
        };
        self.intake(message)
    }

    fn edited(&self, message: &IncomingMessage) -> Result<Accepted, InboxError> {
        if !policy::allowed(self.manager.config(), message) {
            return Ok(Accepted::nothing());
        }
        let key = message.chat.session_key();
        let stored = StoredMessage::received(message);
        let line = policy::attribute(
            &message.sender,
            &message.text,
            self.manager.config().max_input_chars,
        );
        // Under the owner lock, so the waiting item cannot be merged or taken in between.
        let chats = self.manager.chats();
        let edited = self
            .manager
            .store()
            .edit_message(&key, &stored, Some(&line))
            .map_err(store_error)?;
        if let Edited::Pending(id) = edited {
            let queued = chats.get(&key).is_some_and(|session| {
                session
                    .queue()
                    .edit(id, &message.message_id, &line, &message.images)
            });
            tracing::debug!(session = %key, message = %message.message_id, queued, "pending input edited");
            Ok(Accepted::durable())
        } else {
            // Like chatter: only the log changed.
            tracing::debug!(session = %key, message = %message.message_id, ?edited, "message edited");
            Ok(Accepted::nothing())
        }
    }
}
