//! Intake: [`Inbox::deliver`] records, dedupes, makes pending and enqueues, waits until
//! that is durable, and returns. It never waits on the network and never takes a turn's
//! lock: roles are resolved in the chat's worker, answers go out through the outbox lanes.
//!
//! Each message is one store transaction — the chat-log record (which is also the dedupe
//! key) together with its pending record, or with its immediate answer — made durable
//! before `deliver` returns for anything addressed, so a kill at any moment either leaves no
//! trace (the platform delivers it again) or leaves it pending (it is answered after the
//! restart). The record and the push onto the session queue happen under the sessions'
//! owner lock; the wait for durability after it is dropped, shared with every other chat
//! waiting at the same moment (group commit). The turn may start before the wait ends: its
//! commit waits for durability too, and that covers the earlier intake write (the store's
//! log is ordered), so no reply leaves for an input a kill could still lose. An answer
//! (`/help`, an overflow notice) goes to its outbox lane only once durable.
//!
//! [`Inbox::deliver_all`] takes a batch (one `getUpdates` answer) the same way, item by
//! item in order, with one wait for the whole batch.

use async_trait::async_trait;

use super::commands::Command;
use super::flood::Admit;
use super::limits::TurnAdmit;
use super::manager::SessionManager;
use super::policy::{self, Addressed};
use super::queue::QueueItem;
use super::settings::ReplyMode;
use crate::lang::{Msg, say};
use crate::platform::{
    BatchError, ChatEvent, ChatKind, Delivery, Inbox, InboxError, IncomingMessage,
};
use crate::store::Intake as Recorded;
use crate::store::{Inbound, OutboxEntry, PendingItem, PendingKind, StoredMessage};
use crate::tool::{Caller, Role};

fn store_error(e: crate::store::StoreError) -> InboxError {
    InboxError::Store(e.to_string())
}

/// What intake leaves for after the wait for durability.
#[derive(Default)]
pub(super) struct Accepted {
    /// Whether something was written (or found already written) that must be durable
    /// before the adapter may acknowledge it. Chatter is not waited for: sled writes it out
    /// within half a second by itself, and a kill before then loses chatter, never an
    /// addressed message.
    pub(super) durable: bool,
    /// Outbox rows written, handed to their lanes once durable.
    pub(super) replies: Vec<OutboxEntry>,
}

impl Accepted {
    /// Nothing to wait for.
    pub(super) fn nothing() -> Self {
        Accepted::default()
    }

    /// Writes to make durable, and no reply.
    pub(super) fn durable() -> Self {
        Accepted {
            durable: true,
            replies: Vec::new(),
        }
    }

    fn merge(&mut self, other: Accepted) {
        self.durable |= other.durable;
        self.replies.extend(other.replies);
    }
}

/// The intake stage, for one delivery: policy, the one store write, the hand-off to the
/// [`Dispatcher`](super::dispatcher). It touches no session's internals beyond the push.
pub(super) struct Intake<'a> {
    pub(super) manager: &'a SessionManager,
}

/// The adapters' way in: messages (intake, here) and chat events
/// ([`super::life`]), both recorded and enqueued without a network call.
#[async_trait]
impl Inbox for SessionManager {
    async fn deliver(&self, message: IncomingMessage) -> Result<(), InboxError> {
        let intake = Intake { manager: self };
        let accepted = intake.intake(message)?;
        intake.settle(accepted).await
    }

    async fn chat_event(&self, event: ChatEvent) -> Result<(), InboxError> {
        let intake = Intake { manager: self };
        let accepted = intake.event_intake(event)?;
        intake.settle(accepted).await
    }

    /// Every item recorded and queued in order (so a chat's order is kept), then one wait
    /// for durability for all of them. An item that cannot be taken ends the batch: the
    /// ones before it are still made durable and reported taken, the rest are not.
    async fn deliver_all(&self, batch: Vec<Delivery>) -> Result<(), BatchError> {
        let intake = Intake { manager: self };
        let mut accepted = Accepted::nothing();
        let mut failed = None;
        for (taken, delivery) in batch.into_iter().enumerate() {
            let one = match delivery {
                Delivery::Message(message) => intake.intake(message),
                Delivery::Event(event) => intake.event_intake(event),
            };
            match one {
                Ok(one) => accepted.merge(one),
                Err(error) => {
                    failed = Some(BatchError {
                        durable: taken,
                        error,
                    });
                    break;
                }
            }
        }
        intake
            .settle(accepted)
            .await
            .map_err(|error| BatchError { durable: 0, error })?;
        failed.map_or(Ok(()), Err)
    }
}

impl Intake<'_> {
    /// After intake: waits until its writes are durable (no lock held), then hands its
    /// answers to the outbox lanes.
    pub(super) async fn settle(&self, accepted: Accepted) -> Result<(), InboxError> {
        if accepted.durable {
            self.manager.durable().await.map_err(store_error)?;
        }
        for entry in accepted.replies {
            self.manager.enqueue_reply(entry, Vec::new());
        }
        Ok(())
    }

    /// The writing part of intake, synchronous: nothing in it may wait.
    pub(super) fn intake(&self, message: IncomingMessage) -> Result<Accepted, InboxError> {
        if self.manager.draining().is_cancelled() {
            return Err(InboxError::ShuttingDown);
        }
        let config = self.manager.config();
        if !policy::allowed(config, &message) {
            tracing::debug!(chat = %message.chat, sender = %message.sender.id, "message outside the allow-lists ignored");
            return Ok(Accepted::nothing());
        }
        let key = message.chat.session_key();
        let stored = StoredMessage::received(&message);
        let reply_to = Some(message.message_id.clone());
        // The group's own settings (cached): its reply mode, limits and language.
        let effective = self.manager.effective(&key);
        let lang = effective.language;
        let word = message.text.split_whitespace().next().unwrap_or_default();
        let toolset_command = self
            .manager
            .chat_command(word)
            .filter(|_| !(message.sender.is_bot && config.ignore_bots));
        let addressed = match policy::addressed(config, &message) {
            _ if toolset_command.is_some() => Addressed::Command(Command::Toolset),
            Addressed::No
                if effective.reply_mode == ReplyMode::All
                    && message.kind != ChatKind::Private
                    && !(message.sender.is_bot && config.ignore_bots) =>
            {
                Addressed::Turn
            }
            addressed => addressed,
        };
        if let Addressed::Command(_) = addressed
            && !policy::is_operator(config, &message.sender.id)
        {
            let admit = self
                .manager
                .command_limits()
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .admit(
                    &key,
                    &message.sender.id,
                    tokio::time::Instant::now(),
                    config.commands_per_member_per_minute,
                    config.commands_per_chat_per_minute,
                    lang,
                );
            match admit {
                Admit::Yes => {}
                Admit::Notice(text) => {
                    tracing::info!(session = %key, sender = %message.sender.id, "too many commands; told once, the rest only recorded");
                    let notice =
                        OutboxEntry::new(&key, &message.chat, text, reply_to, self.manager.now());
                    return self.record_and_answer(&key, &stored, notice);
                }
                Admit::Quiet => {
                    self.manager
                        .store()
                        .record_inbound(&key, &stored, Recorded::Record)
                        .map_err(store_error)?;
                    return Ok(Accepted::nothing());
                }
            }
        }
        match addressed {
            Addressed::No => {
                if let Some(auto) = self.auto_chat_of(&message) {
                    return self.record_auto_chat(&message, &stored, &auto);
                }
                // Context only: not waited for (see `Accepted::durable`).
                self.manager
                    .store()
                    .record_inbound(&key, &stored, Recorded::Record)
                    .map_err(store_error)?;
                Ok(Accepted::nothing())
            }
            Addressed::Command(
                command @ (Command::Help
                | Command::Status
                | Command::Stop
                | Command::Reload
                | Command::Settings),
            ) => {
                let session = self.manager.live_session(&key);
                let (text, cancel) = match command {
                    Command::Help => (self.help_text(lang), None),
                    Command::Status => (
                        self.status_text(&key, session.as_deref(), &message.sender.id),
                        None,
                    ),
                    Command::Reload => (self.reload_text(&message.sender.id, lang), None),
                    Command::Settings => (
                        self.settings_text(
                            &key,
                            &effective,
                            super::commands::argument(&message.text),
                        ),
                        None,
                    ),
                    _ => self.stop(session.as_deref(), lang),
                };
                let mut answer =
                    OutboxEntry::new(&key, &message.chat, text, reply_to, self.manager.now());
                if command == Command::Settings
                    && super::commands::argument(&message.text).is_empty()
                    && message.kind != ChatKind::Private
                {
                    answer = answer.with_buttons(super::settings::settings_buttons(
                        &config.groups,
                        &effective,
                        super::auto_chat::listed(config, &key),
                    ));
                }
                let accepted = self.record_and_answer(&key, &stored, answer)?;
                if let (false, Some(cancel)) = (accepted.replies.is_empty(), cancel) {
                    cancel.cancel();
                }
                Ok(accepted)
            }
            Addressed::Command(Command::Reset) => {
                self.record_and_queue(&message, &stored, PendingKind::Reset, String::new())
            }
            Addressed::Command(Command::Compact) => {
                let topic = super::commands::argument(&message.text);
                let topic = crate::text::ellipsize(topic, config.max_input_chars).into_owned();
                self.record_and_queue(&message, &stored, PendingKind::Compact, topic)
            }
            Addressed::Command(Command::Toolset) => {
                let Some(command) = toolset_command else {
                    return Ok(Accepted::nothing());
                };
                let argument = super::commands::argument(&message.text);
                let caller = Caller {
                    user_id: message.sender.id.clone(),
                    name: message.sender.name.clone(),
                    role: if policy::is_operator(config, &message.sender.id) {
                        Role::Operator
                    } else {
                        Role::Member
                    },
                    grants: Vec::new(),
                };
                if command.writes(argument) || command.role(argument) > Role::Member {
                    let line = crate::text::ellipsize(message.text.trim(), config.max_input_chars)
                        .into_owned();
                    return self.record_and_queue(
                        &message,
                        &stored,
                        PendingKind::ChatCommand,
                        line,
                    );
                }
                // A member's read: answered here, like /status.
                let text = match command.run(
                    self.manager.store().as_ref(),
                    &key,
                    argument,
                    &caller,
                    lang,
                ) {
                    Ok(answer) => answer.text,
                    Err(e) => {
                        tracing::error!(session = %key, word, error = %e, "a chat command failed");
                        say(lang, Msg::SettingsStoreFailed, &[])
                    }
                };
                let answer =
                    OutboxEntry::new(&key, &message.chat, text, reply_to, self.manager.now());
                self.record_and_answer(&key, &stored, answer)
            }
            Addressed::Command(Command::Set) => {
                let line = super::commands::argument(&message.text);
                let line = crate::text::ellipsize(line, config.max_input_chars).into_owned();
                self.record_and_queue(&message, &stored, PendingKind::Settings, line)
            }
            Addressed::Command(command @ (Command::Approve | Command::Deny)) => {
                let code = super::commands::argument(&message.text).to_owned();
                self.decide_by_command(&message, &stored, command == Command::Approve, code, lang)
            }
            Addressed::Turn => {
                if let Some(limit) = effective.member_turns_per_hour
                    && !policy::is_operator(config, &message.sender.id)
                {
                    let admit = self.manager.member_turns().admit(
                        &key,
                        &message.sender.id,
                        tokio::time::Instant::now(),
                        limit,
                    );
                    match admit {
                        TurnAdmit::Yes => {}
                        TurnAdmit::Notice(wait) => {
                            tracing::info!(session = %key, sender = %message.sender.id, limit, "member over their turns per hour; told once");
                            let text = say(
                                lang,
                                Msg::MemberTurnsSpent,
                                &[
                                    ("name", &crate::quote::name(&message.sender.name, 64)),
                                    ("limit", &limit.to_string()),
                                    ("minutes", &wait.as_secs().div_ceil(60).max(1).to_string()),
                                ],
                            );
                            let notice = OutboxEntry::new(
                                &key,
                                &message.chat,
                                text,
                                reply_to,
                                self.manager.now(),
                            );
                            return self.record_and_answer(&key, &stored, notice);
                        }
                        TurnAdmit::Quiet => {
                            self.manager
                                .store()
                                .record_inbound(&key, &stored, Recorded::Record)
                                .map_err(store_error)?;
                            return Ok(Accepted::nothing());
                        }
                    }
                }
                let line =
                    policy::attribute(&message.sender, &message.text, config.max_input_chars);
                self.record_and_queue(&message, &stored, PendingKind::UserMessage, line)
            }
        }
    }

    /// Records a command and its answer, in one transaction; the answer is in the returned
    /// replies unless the message was a duplicate (nothing written).
    pub(super) fn record_and_answer(
        &self,
        key: &str,
        stored: &StoredMessage,
        answer: OutboxEntry,
    ) -> Result<Accepted, InboxError> {
        let mut entry = answer.clone();
        // A duplicate is waited for too: its first delivery may not be durable yet.
        let mut accepted = Accepted::durable();
        match self
            .manager
            .store()
            .record_inbound(key, stored, Recorded::Reply(answer))
            .map_err(store_error)?
        {
            Inbound::Duplicate => {
                tracing::debug!(session = %key, message = %stored.message_id, "duplicate delivery ignored");
            }
            Inbound::Recorded(id) => {
                entry.id = id.unwrap_or_default();
                accepted.replies.push(entry);
            }
        }
        Ok(accepted)
    }

    /// Records an addressed message as pending and queues it on its session: the record,
    /// the capacity check, the push and the worker's start under the sessions' owner lock.
    /// A full queue is told (the answer recorded with the message), never a silent drop.
    fn record_and_queue(
        &self,
        message: &IncomingMessage,
        stored: &StoredMessage,
        kind: PendingKind,
        line: String,
    ) -> Result<Accepted, InboxError> {
        let key = message.chat.session_key();
        let private = message.kind == ChatKind::Private;
        // Operators are known from the config; chat admins are looked up by the worker.
        let role = if policy::is_operator(self.manager.config(), &message.sender.id) {
            Role::Operator
        } else {
            Role::Member
        };
        let pending = PendingItem {
            id: 0,
            session: key.clone(),
            chat: message.chat.clone(),
            kind,
            caller: Caller {
                user_id: message.sender.id.clone(),
                name: message.sender.name.clone(),
                role,
                grants: Vec::new(),
            },
            text: line,
            reply_to: Some(message.message_id.clone()),
            images: message.images.clone(),
            received: self.manager.now(),
            private,
        };
        let mut item = QueueItem::from_pending(pending.clone());

        let mut chats = self.manager.chats();
        let session = chats.session(&key);
        if !session.queue().can_take(&item) {
            drop(chats);
            let notice = OutboxEntry::new(
                &key,
                &message.chat,
                say(self.manager.effective(&key).language, Msg::QueueFull, &[]),
                Some(message.message_id.clone()),
                self.manager.now(),
            );
            tracing::warn!(session = %key, message = %message.message_id, "queue full; the sender is told to ask again");
            return self.record_and_answer(&key, stored, notice);
        }
        let id = match self
            .manager
            .store()
            .record_inbound(&key, stored, Recorded::Pending(pending))
            .map_err(store_error)?
        {
            Inbound::Duplicate => {
                // Waited for all the same: the first delivery may not be durable yet.
                tracing::debug!(session = %key, message = %message.message_id, "duplicate delivery ignored");
                return Ok(Accepted::durable());
            }
            Inbound::Recorded(id) => id.unwrap_or_default(),
        };
        item.pending_ids = vec![id];
        if !chats.runs_here(&key) {
            // Held by another instance (cluster mode): its sweep finds the input pending.
            return Ok(Accepted::durable());
        }
        if let Err(full) = session.queue().push(item) {
            // Checked above under the same lock; kept for the next start if it happens.
            tracing::error!(session = %key, ids = ?full.0.pending_ids, "queue refused a checked item; it stays pending");
        }
        Ok(Accepted::durable())
    }
}
