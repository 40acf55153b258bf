//! [`ChatWorker`]: one task per chat with work to do, started by the
//! [`Dispatcher`](super::dispatcher). It takes queued items one at a time, waits for the
//! chat's rate limit (its own, held by value), resolves the callers' roles, runs the item
//! ([`super::turn`]) and, when the queue stays empty for `idle_timeout`, compacts its
//! history if that is worth it ([`super::compact`]) and hands the chat back to the
//! dispatcher, which lets it leave memory.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use tokio::time::Instant;

use super::manager::{Session, SessionManager};
use crate::ratelimit::SlidingWindow;

/// What the worker runs next.
enum Next {
    /// The queue's front item, of this kind, taken once the rate limit allows.
    Queued(crate::store::PendingKind),
    /// The auto-chat batch that came due, already taken.
    Batch(Box<super::queue::QueueItem>),
}

/// Starts the worker of `session`; only the dispatcher calls this, under its lock.
pub(super) fn spawn(manager: &SessionManager, session: Arc<Session>) {
    let worker = ChatWorker {
        manager: manager.clone(),
        session,
        recent_turns: SlidingWindow::default(),
        history: None,
        kept: None,
        usage_aside: AtomicBool::new(false),
    };
    manager.tracker().spawn(worker.run());
}

/// One chat's worker: see the module docs. Its items run in [`super::turn`] and
/// [`super::compact`].
pub(super) struct ChatWorker {
    pub(super) manager: SessionManager,
    session: Arc<Session>,
    /// Start times of recent turns, for the rate limit.
    recent_turns: SlidingWindow,
    /// The history as this chat's last commit left it in the store, with the session's
    /// `history_changes` it was kept at, so that the next turn need not read and decode it
    /// again; kept only when more input is already queued (a busy chat), so that an idle
    /// chat holds none.
    pub(super) history: Option<(u64, Vec<crate::llm::Message>)>,
    /// The trace head and day's usage this chat's last commit wrote ([`super::trace::Kept`]).
    pub(super) kept: Option<super::trace::Kept>,
    /// Set when tokens were counted outside a turn's commit (a compaction's summary): the
    /// usage in `kept` is then behind the store's.
    pub(super) usage_aside: AtomicBool,
}

impl ChatWorker {
    /// Runs queued items one at a time until the queue stays empty for `idle_timeout`
    /// (the dispatcher then lets the chat go) or shutdown begins.
    async fn run(mut self) {
        if !self.serve().await {
            self.manager
                .dispatcher()
                .stopped(&self.manager, &self.session);
        }
    }

    /// The loop of [`ChatWorker::run`]: `true` when the dispatcher let the chat go,
    /// `false` when shutdown began.
    async fn serve(&mut self) -> bool {
        let manager = self.manager.clone();
        let session = Arc::clone(&self.session);
        loop {
            if manager.draining().is_cancelled() {
                return false;
            }
            if !manager.dispatcher().holds(&manager, session.key()) {
                // Lost to another instance (cluster mode): what was queued is pending in
                // the store for the new holder.
                manager.dispatcher().drop_lapsed(&manager, session.key());
                super::queue::handed_over(session.queue().clear());
                session.batch().clear();
                if manager.dispatcher().retire(&manager, &session) {
                    return true;
                }
                continue;
            }
            // Queued input first: a mention never waits for an auto-chat batch. A queued
            // item stays queued until the rate limit lets it run, so input arriving
            // meanwhile merges into it; a due batch is taken (it merges beside the queue).
            let next = match session.queue().front_kind() {
                Some(kind) => Some(Next::Queued(kind)),
                None => self
                    .due_batch(&session)
                    .map(|item| Next::Batch(Box::new(item))),
            };
            let Some(next) = next else {
                let idle = tokio::time::sleep(manager.config().idle_timeout);
                let due = session.batch().due();
                let batch_due = async move {
                    match due {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    () = session.queue().notified() => continue,
                    () = batch_due => continue,
                    () = idle => {}
                    () = manager.draining().cancelled() => return false,
                }
                if !session.has_work() {
                    // Input arriving meanwhile waits for it, and then keeps the session.
                    self.compact_before_eviction(&session).await;
                }
                if manager.dispatcher().retire(&manager, &session) {
                    return true;
                }
                continue;
            };
            // Boxed, so that the worker's own future holds only its idle wait: a chat that
            // is between turns (most of them, most of the time) costs the small wait, not
            // the few KiB of a whole turn's state machine.
            let work = Box::pin(async {
                let kind = match &next {
                    Next::Queued(kind) => *kind,
                    Next::Batch(item) => item.kind,
                };
                if kind.rules().rate_limited && !self.rate_limit().await {
                    // A batch taken stays pending in the store and runs after the restart.
                    return false;
                }
                let mut item = match next {
                    Next::Queued(_) => match session.queue().pop() {
                        Some(item) => item,
                        None => return true,
                    },
                    Next::Batch(item) => *item,
                };
                self.resolve_roles(&mut item).await;
                self.run_item(&session, item).await;
                true
            });
            if !work.await {
                // Shutdown while waiting: the item stays pending in the store.
                return false;
            }
        }
    }

    /// The kept history, unless the stored one changed since it was kept.
    pub(super) fn take_history(&mut self) -> Option<Vec<crate::llm::Message>> {
        let changes = self.session.history_changes();
        self.history
            .take()
            .and_then(|(kept_at, history)| (kept_at == changes).then_some(history))
    }

    /// Waits until the chat may start another turn; `false` when shutdown began meanwhile.
    async fn rate_limit(&mut self) -> bool {
        let per_minute = self.manager.config().turns_per_minute.max(1);
        loop {
            let wait = match self.recent_turns.try_take(
                Instant::now(),
                per_minute,
                Duration::from_secs(60),
            ) {
                Ok(()) => return true,
                Err(wait) => wait,
            };
            tracing::info!(session = %self.session.key(), ?wait, "rate limit: waiting before the next turn");
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = self.manager.draining().cancelled() => return false,
            }
        }
    }
}
