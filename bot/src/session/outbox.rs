//! The outbox lanes: every reply, command answer and notice is a durable outbox row first,
//! and one lane per chat sends that chat's rows in order. A lane keeps trying — backing off
//! on outages, waiting out `retry_after` — for as long as the daemon runs, and gives a row up
//! only when the platform refuses it for good (chat gone, bot removed: logged as an error
//! for the operator). One chat's rate limit or outage holds only its own lane.
//!
//! The adapter makes one attempt per part of a reply and says which parts it sent; the lane
//! owns the retries and the reply's progress: the parts sent before a failure are recorded
//! on the row ([`Store::record_sent_parts`]), so a retry, in this run or after a restart,
//! sends only the rest. Each send carries the row's id as an idempotency key
//! ([`Platform::send`]), so where the platform supports it a retried part that was in fact
//! accepted is not doubled.
//! On shutdown a lane stops at the end of the grace period; its rows stay unsent and are
//! sent after the next start.
//!
//! [`Platform::send`]: crate::platform::Platform::send
//! [`Store::record_sent_parts`]: crate::store::Store::record_sent_parts

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::oneshot;

use super::manager::SessionManager;
use super::queue::{ScheduledOutcome, Waiter};
use crate::backoff::Backoff;
use crate::platform::{ChatRef, PlatformError};
use crate::store::{OutboxEntry, StoredMessage};
use crate::tool::{Post, Posted, ToolError};

/// The longest a single attempt at a reply may take (every part of it once).
const SEND_TIMEOUT: Duration = Duration::from_secs(300);
/// Waits between failed sends: up to five minutes, for outages of hours.
const BACKOFF: Backoff = Backoff {
    initial: Duration::from_secs(2),
    max: Duration::from_secs(300),
};

/// How long a tool's post waits for the platform before it reports the text queued: long
/// enough for a healthy platform, short of the tool call's own timeout.
const POST_WAIT: Duration = Duration::from_secs(20);

/// How long a row's id is remembered after the lane marked it sent: longer than a sweep's
/// read of the unsent rows takes, so that a read from before the mark does not send it
/// again (cluster mode).
const SENT_MEMORY: Duration = Duration::from_secs(60);

/// The lanes of every chat with replies to send.
#[derive(Default)]
pub(super) struct Lanes {
    lanes: Mutex<HashMap<String, VecDeque<Row>>>,
    /// The rows marked sent lately, oldest first.
    sent: Mutex<VecDeque<(u64, tokio::time::Instant)>>,
}

/// A row to send, and who waits to learn what became of it (a clock fire's run).
struct Row {
    entry: OutboxEntry,
    done: Vec<Waiter>,
}

impl Lanes {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, VecDeque<Row>>> {
        self.lanes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether no lane has anything to send.
    pub(super) fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Hands a committed (durable) row to its chat's lane, starting the lane if it is idle;
    /// `done` learn what became of it.
    /// A row already in the lane, or marked sent lately, is not queued twice (its waiters
    /// join the queued one).
    pub(super) fn enqueue(&self, manager: &SessionManager, entry: OutboxEntry, done: Vec<Waiter>) {
        if self.sent_lately(entry.id) {
            return;
        }
        let key = entry.session.clone();
        let start = {
            let mut lanes = self.lock();
            let lane = lanes.entry(key.clone()).or_default();
            if let Some(row) = lane.iter_mut().find(|row| row.entry.id == entry.id) {
                row.done.extend(done);
                return;
            }
            lane.push_back(Row { entry, done });
            // A lane with one row was idle: the task of a busy lane pops only after a send.
            lane.len() == 1
        };
        if start {
            let lane = Lane {
                manager: manager.clone(),
                key,
            };
            manager.tracker().spawn(lane.run());
        }
    }

    /// Whether chat `key` has rows to send here.
    pub(super) fn busy(&self, key: &str) -> bool {
        self.lock().contains_key(key)
    }

    fn remember_sent(&self, id: u64) {
        let now = tokio::time::Instant::now();
        let mut sent = self.sent.lock().unwrap_or_else(|e| e.into_inner());
        while sent
            .front()
            .is_some_and(|(_, at)| now.duration_since(*at) > SENT_MEMORY)
        {
            sent.pop_front();
        }
        sent.push_back((id, now));
    }

    fn sent_lately(&self, id: u64) -> bool {
        self.sent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|(sent, _)| *sent == id)
    }

    /// Drops every waiter (shutdown): the rows stay unsent for the next start.
    pub(super) fn drop_waiters(&self) {
        for row in self.lock().values_mut().flatten() {
            row.done.clear();
        }
    }
}

/// What became of one row.
enum Sent {
    /// Sent or given up: the lane moves on.
    Done(ScheduledOutcome),
    /// Shutdown: the row stays unsent for the next start.
    Abandoned,
    /// Cluster mode: the row is another instance's to send now (its chat's lease holder);
    /// it leaves this lane and stays unsent for that one.
    Elsewhere,
}

/// One chat's lane at work: the task that sends its rows.
struct Lane {
    manager: SessionManager,
    key: String,
}

impl Lane {
    /// Sends the lane's rows in order until it is empty (then it is removed, under the
    /// same lock that [`Lanes::enqueue`] takes) or shutdown aborts it.
    async fn run(self) {
        let key = &self.key;
        loop {
            let next = self
                .manager
                .lanes()
                .lock()
                .get(key)
                .and_then(|lane| lane.front().map(|row| row.entry.clone()));
            let Some(entry) = next else { return };
            let outcome = match self.send_row(&entry).await {
                Sent::Done(outcome) => Some(outcome),
                Sent::Elsewhere => None,
                Sent::Abandoned => return,
            };
            let mut lanes = self.manager.lanes().lock();
            if let Some(lane) = lanes.get_mut(key) {
                for waiter in lane.pop_front().into_iter().flat_map(|row| row.done) {
                    // The submitter may have given up waiting; without an outcome it learns
                    // the row is queued.
                    if let Some(outcome) = &outcome {
                        let _ = waiter.send(outcome.clone());
                    }
                }
                if lane.is_empty() {
                    lanes.remove(key);
                    if let Some(to) =
                        super::dispatcher::shrunk_capacity(lanes.len(), lanes.capacity())
                    {
                        lanes.shrink_to(to);
                    }
                    return;
                }
            }
        }
    }

    /// Sends one row, retrying until the platform takes it or refuses it for good.
    async fn send_row(&self, entry: &OutboxEntry) -> Sent {
        let Some(platform) = self.manager.platform(&entry.chat).cloned() else {
            tracing::error!(chat = %entry.chat, outbox = entry.id, "no adapter serves this reply's platform; it stays in the outbox");
            return Sent::Abandoned;
        };
        let key = format!("o{}", entry.id);
        let mut failures: u32 = 0;
        // The parts sent so far, as recorded on the row.
        let mut parts = entry.sent_ids.clone();
        loop {
            if !self.manager.dispatcher().may_send(&self.manager, entry) {
                tracing::info!(outbox = entry.id, session = %entry.session, "another instance holds the chat now; the reply is theirs to send");
                return Sent::Elsewhere;
            }
            let before = parts.len();
            let attempt = tokio::time::timeout(
                SEND_TIMEOUT,
                platform.send_buttons(
                    &entry.chat,
                    &entry.text,
                    entry.reply_to.as_deref(),
                    Some(&key),
                    &mut parts,
                    &entry.buttons,
                ),
            );
            let result = tokio::select! {
                biased;
                () = self.manager.abort().cancelled() => None,
                result = attempt => Some(result),
            };
            let failed = !matches!(result, Some(Ok(Ok(_))));
            if failed && parts.len() > before {
                self.cut(entry, &parts).await;
            }
            let Some(result) = result else {
                return Sent::Abandoned;
            };
            let wait = match result {
                Ok(Ok(sent)) => {
                    self.sent(entry, &sent.message_ids).await;
                    return Sent::Done(ScheduledOutcome::Posted(sent.message_ids));
                }
                Ok(Err(PlatformError::Refused(why) | PlatformError::NotFound(why))) => {
                    tracing::error!(outbox = entry.id, chat = %entry.chat, reason = %why, "the platform refused the reply for good; giving it up (is the bot still in this chat?)");
                    crate::metrics::global().send_error(&entry.chat.platform);
                    self.given_up(entry, &why).await;
                    return Sent::Done(ScheduledOutcome::NotDelivered(why));
                }
                Ok(Err(PlatformError::RateLimited(after))) => after.max(Duration::from_secs(1)),
                Ok(Err(e)) => {
                    crate::metrics::global().send_error(&entry.chat.platform);
                    if failures < 3 || failures.is_multiple_of(20) {
                        tracing::warn!(outbox = entry.id, chat = %entry.chat, error = %e, failures, "could not send; the reply stays in the outbox and is retried");
                    }
                    BACKOFF.delay(failures)
                }
                Err(_) => {
                    tracing::warn!(outbox = entry.id, chat = %entry.chat, "a send timed out; retrying");
                    BACKOFF.delay(failures)
                }
            };
            crate::metrics::global().send_retry(&entry.chat.platform);
            failures = failures.saturating_add(1);
            tokio::select! {
                biased;
                () = self.manager.abort().cancelled() => return Sent::Abandoned,
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// The platform took the row: mark it sent and log the bot's own message (one durable
    /// step).
    async fn sent(&self, entry: &OutboxEntry, ids: &[String]) {
        let own = ids.first().map(|first| {
            StoredMessage::from_bot(
                &entry.chat.platform,
                &self.manager.config().bot_name,
                first,
                &entry.text,
                entry.reply_to.as_deref(),
                self.manager.now(),
            )
        });
        let marked = match self.manager.store().mark_sent_with_own(
            entry.id,
            ids,
            &entry.session,
            own.as_ref(),
        ) {
            Ok(()) => self.manager.durable().await,
            Err(e) => Err(e),
        };
        if let Err(e) = marked {
            tracing::error!(outbox = entry.id, error = %e, "reply sent but not marked; it may be sent again after a restart");
        }
        self.manager.lanes().remember_sent(entry.id);
    }

    /// A long reply was cut after some parts: record them on the row, so that no retry,
    /// here or after a restart, sends them again.
    async fn cut(&self, entry: &OutboxEntry, parts: &[String]) {
        let recorded = match self.manager.store().record_sent_parts(entry.id, parts) {
            Ok(()) => self.manager.durable().await,
            Err(e) => Err(e),
        };
        if let Err(e) = recorded {
            tracing::error!(outbox = entry.id, error = %e, "cannot record the parts of a reply already sent; a retry after a restart may send them again");
        }
    }

    async fn given_up(&self, entry: &OutboxEntry, why: &str) {
        let marked = match self.manager.store().mark_failed(entry.id, why) {
            Ok(()) => self.manager.durable().await,
            Err(e) => Err(e),
        };
        if let Err(e) = marked {
            tracing::error!(outbox = entry.id, error = %e, "cannot record the refused reply");
        }
        self.manager.lanes().remember_sent(entry.id);
    }
}

/// A turn's way to post mid-turn (`send_markdown`): an outbox row like the turn's reply,
/// in the same lane, so it is durable, ordered, retried and recorded as the bot's message.
pub(super) struct TurnPost {
    pub(super) manager: SessionManager,
    pub(super) chat: ChatRef,
}

#[async_trait]
impl Post for TurnPost {
    async fn post(&self, text: &str, reply_to: Option<&str>) -> Result<Posted, ToolError> {
        let session = self.chat.session_key();
        let mut entry = OutboxEntry::new(
            &session,
            &self.chat,
            text.to_owned(),
            reply_to.map(str::to_owned),
            self.manager.now(),
        );
        let failed = |e: crate::store::StoreError| {
            tracing::error!(session = %session, error = %e, "cannot queue a post");
            ToolError::unavailable("the bot's storage failed; the text was not posted")
        };
        entry.id = self
            .manager
            .store()
            .queue_outbox_with(entry.clone(), Vec::new())
            .map_err(failed)?;
        // Like a committed reply: handed to the lane only once durable.
        self.manager.durable().await.map_err(failed)?;
        let (done, outcome) = oneshot::channel();
        self.manager.enqueue_reply(entry, vec![done]);
        match tokio::time::timeout(POST_WAIT, outcome).await {
            Ok(Ok(ScheduledOutcome::Posted(ids))) => Ok(Posted::Sent(ids)),
            Ok(Ok(ScheduledOutcome::NotDelivered(why))) => Err(ToolError::unavailable(format!(
                "the platform refused the message for good: {why}"
            ))),
            // Not taken yet (an outage, a rate limit, shutdown): the lane keeps it.
            Ok(
                Ok(
                    ScheduledOutcome::NoReply
                    | ScheduledOutcome::Failed(_)
                    | ScheduledOutcome::Elsewhere,
                )
                | Err(_),
            )
            | Err(_) => Ok(Posted::Queued),
        }
    }
}
