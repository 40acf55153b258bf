//! The commit stage: what a finished item leaves — the history change, the removal of the
//! answered pending records, the reply as an outbox row, the turn's usage, trace and marks —
//! is one [`Store::commit_turn`](crate::store::Store::commit_turn), made durable (one
//! transaction in); then the reply row goes to the chat's outbox lane and the item's
//! waiters learn what became of it (outbox rows out). A kill before the commit leaves the
//! input pending; after it, the row is sent at the next start. A turn that filled the
//! model's context is then compacted ([`super::compact`]), its own step with its own commit.

use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::input::Action;
use super::manager::Session;
use super::queue::{QueueItem, ScheduledOutcome, Waiter};
use super::turn::Outcome;
use super::worker::ChatWorker;
use crate::store::{OutboxEntry, TurnCommit};

/// An item the worker ran, with what it left to commit.
pub(super) struct Finished {
    pub(super) item: QueueItem,
    /// Who waits to learn what became of it (a clock fire's run).
    pub(super) done: Vec<Waiter>,
    pub(super) outcome: Outcome,
    /// When the item started (session wall time).
    pub(super) started: DateTime<Utc>,
    /// The session's history changes when the item started: a change since means another
    /// step wrote the history meanwhile, and the kept copy would be stale.
    pub(super) changes_before: u64,
}

impl ChatWorker {
    /// Commits `finished` and hands its reply to the outbox; see the module docs.
    pub(super) async fn commit(&mut self, session: &Arc<Session>, finished: Finished) {
        let Finished {
            item,
            mut done,
            outcome,
            started,
            changes_before,
        } = finished;
        let rules = item.kind.rules();
        let mut answered = item.pending_ids.clone();
        if rules.action == Action::Reset && outcome.history.is_some() {
            // Everything queued before the reset goes with the conversation.
            for cleared in session.queue().clear() {
                answered.extend(cleared.pending_ids);
                done.extend(cleared.done);
            }
        }
        // An auto-chat turn's answer is never posted: it speaks only through `send_message`.
        let mut reply = (outcome.reply).filter(|_| rules.posts).map(|text| {
            OutboxEntry::new(
                session.key(),
                &item.chat,
                text,
                item.reply_to.clone(),
                self.manager.now(),
            )
        });
        let compact_due = outcome.compact_due;
        // Only a `/set` changes what the settings cache holds.
        let settings_written = rules.action == Action::Settings && !outcome.also.is_empty();
        // What the turn's records leave to keep, put back only if this commit lands.
        let (also, kept) = match self.turn_records(
            session.key(),
            &item,
            outcome.facts.as_ref(),
            outcome.budget_told,
            started,
            reply.as_mut(),
        ) {
            Ok((also, kept)) => (Ok(also), kept),
            Err(e) => (Err(e), None),
        };
        let extra = outcome.also;
        // Only a turn with images marked its inputs (`quarantine.rs`): a text turn's commit
        // carries no extra write.
        let also = also.map(|mut also| {
            also.extend(extra);
            if !item.images.is_empty() {
                also.extend(super::quarantine::cleared(&item.pending_ids));
            }
            also
        });
        // Cluster mode: the commit holds only while this instance holds the chat.
        let also = also.and_then(|mut also| {
            match self
                .manager
                .dispatcher()
                .fence(&self.manager, session.key())
            {
                Ok(fence) => {
                    also.extend(fence);
                    Ok(also)
                }
                Err(super::dispatcher::Lost) => Err(crate::store::StoreError::Changed(format!(
                    "the lease of {} (another instance holds the chat)",
                    session.key()
                ))),
            }
        });
        let changes_history = outcome.history.is_some();
        let history_after = outcome.history_after;
        let commit = also.map(|also| TurnCommit {
            session: session.key().to_owned(),
            history: outcome.history,
            answered: answered.clone(),
            reply: reply.clone(),
            summary: outcome.summary,
            also,
        });
        // The wait is shared with every other chat committing or taking input meanwhile, and
        // covers this chat's intake writes before it.
        let committed = match commit.and_then(|commit| self.manager.store().commit_turn(commit)) {
            Ok(id) => self.manager.durable().await.map(|()| id),
            Err(e) => Err(e),
        };
        if changes_history {
            let changes_now = session.history_changes();
            // Only what this commit wrote, only when nothing else changed it meanwhile, and
            // only for a chat with more to answer: an idle session holds no copy.
            self.history = match &committed {
                Ok(_) if changes_now == changes_before && !session.queue().is_empty() => {
                    history_after.map(|history| (changes_before, history))
                }
                _ => None,
            };
        }
        let outbox_id = match committed {
            Ok(id) => {
                // Several instances: the chat may be answered elsewhere between two of its
                // turns here, so what this worker wrote is not known to be the latest.
                self.kept = kept.filter(|_| self.manager.config().cluster.is_none());
                if settings_written {
                    self.manager.settings_changed(session.key());
                }
                id
            }
            Err(crate::store::StoreError::Changed(what))
                if what.starts_with(super::lease::LEASE_SPACE) || what.contains("the lease of") =>
            {
                // Fenced: this instance lost the chat (paused past its lease, or cut off from
                // the store) and the new holder answers its inputs.
                crate::metrics::global().fenced_commits.inc();
                tracing::warn!(session = %session.key(), "the turn's commit was refused: another instance holds the chat now (fenced); its inputs are answered there");
                return;
            }
            Err(crate::store::StoreError::Changed(what)) if rules.action == Action::Settings => {
                // Another chat of the group (a forum topic, another daemon) changed its
                // settings since `/set` read them: it runs again on what is there now.
                tracing::info!(session = %session.key(), %what, "the group's settings changed meanwhile; /set runs again");
                let mut again = item;
                again.done = done;
                session.queue().push_over_capacity(again);
                return;
            }
            Err(e) => {
                // The input stays pending and runs again after a restart; replying now could
                // answer twice after a crash.
                tracing::error!(session = %session.key(), error = %e, "cannot commit the turn");
                return;
            }
        };
        let report = match (&outcome.model_failed, outbox_id) {
            (Some(reason), _) => Some(ScheduledOutcome::Failed(reason.clone())),
            (None, None) => Some(ScheduledOutcome::NoReply),
            // Told by the outbox lane once the platform took it (or refused it).
            (None, Some(_)) => None,
        };
        if let Some(report) = report {
            for waiter in done.drain(..) {
                // The submitter may have given up waiting; nothing to do then.
                let _ = waiter.send(report.clone());
            }
        }
        if let (Some(mut entry), Some(id)) = (reply, outbox_id) {
            entry.id = id;
            self.manager.enqueue_reply(entry, done);
        }
        if compact_due {
            // After an auto-chat turn nothing is posted, this notice neither.
            self.compact_after_turn(session, &item.chat, rules.posts)
                .await;
        }
    }
}
