//! The session actor: one task per chat with work to do. It takes queued items one at a
//! time, waits for the chat's rate limit, resolves the callers' roles, runs the item
//! ([`super::turn`]) and, when the queue stays empty for `idle_timeout`, compacts its
//! history if that is worth it ([`super::compact`]) and evicts its session under the owner
//! lock (see [`super::manager`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::manager::{Session, SessionManager};

/// What the actor runs next.
enum Next {
    /// The queue's front item, of this kind, taken once the rate limit allows.
    Queued(crate::store::PendingKind),
    /// The overheard batch that came due, already taken.
    Batch(Box<super::queue::QueueItem>),
}

impl SessionManager {
    /// Starts the session's actor unless one is running. Called with the sessions' owner
    /// lock held (intake, submissions, resume), so it cannot race with eviction.
    pub(super) fn ensure_actor(&self, session: &Arc<Session>) {
        {
            let mut state = session.state();
            if state.actor_running || self.inner.draining.is_cancelled() {
                return;
            }
            state.actor_running = true;
        }
        // Claimed in the same critical section that sets `actor_running`, and released in
        // the one that clears it, so a claim still held means two live actors for one chat
        // (two `Session`s for one key), not an old actor finishing its bookkeeping.
        if !self.claim_actor(&session.key) {
            self.inner
                .counters
                .double_actors
                .fetch_add(1, Ordering::Relaxed);
            tracing::error!(session = %session.key, "a second actor started for one chat");
        }
        let manager = self.clone();
        let session = Arc::clone(session);
        self.inner
            .tracker
            .spawn(async move { manager.actor(session).await });
    }

    /// The actor: runs queued items one at a time until the queue stays empty for
    /// `idle_timeout` or shutdown begins.
    async fn actor(self, session: Arc<Session>) {
        let counters = &self.inner.counters;
        counters.actors_started.fetch_add(1, Ordering::Relaxed);
        counters.actors_running.fetch_add(1, Ordering::Relaxed);
        self.actor_loop(&session).await;
        counters.actors_running.fetch_sub(1, Ordering::Relaxed);
    }

    /// Records that `key` has a live actor; `false` when it already had one.
    fn claim_actor(&self, key: &str) -> bool {
        self.inner
            .active_actors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.to_owned())
    }

    fn release_actor(&self, key: &str) {
        let mut actors = self
            .inner
            .active_actors
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        actors.remove(key);
        if let Some(to) = super::manager::shrunk_capacity(actors.len(), actors.capacity()) {
            actors.shrink_to(to);
        }
    }

    async fn actor_loop(&self, session: &Arc<Session>) {
        loop {
            if self.inner.draining.is_cancelled() {
                break;
            }
            // Queued input first: a mention never waits for an overheard batch. A queued
            // item stays queued until the rate limit lets it run, so input arriving
            // meanwhile merges into it; a due batch is taken (it merges beside the queue).
            let next = match session.queue.front_kind() {
                Some(kind) => Some(Next::Queued(kind)),
                None => self
                    .due_batch(session)
                    .map(|item| Next::Batch(Box::new(item))),
            };
            let Some(next) = next else {
                let idle = tokio::time::sleep(self.inner.config.idle_timeout);
                let due = session.state().overheard.due();
                let batch_due = async move {
                    match due {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    () = session.queue.notified() => continue,
                    () = batch_due => continue,
                    () = idle => {}
                    () = self.inner.draining.cancelled() => break,
                }
                if session.queue.is_empty() && session.state().overheard.is_empty() {
                    // Input arriving meanwhile waits for it, and then keeps the session.
                    self.compact_before_eviction(session).await;
                }
                if self.evict_if_idle(session) {
                    return;
                }
                continue;
            };
            // Boxed, so that the actor's own future holds only its idle wait: a chat that
            // is between turns (most of them, most of the time) costs the small wait, not
            // the few KiB of a whole turn's state machine.
            let work = Box::pin(async {
                let kind = match &next {
                    Next::Queued(kind) => *kind,
                    Next::Batch(item) => item.kind,
                };
                if kind.rules().rate_limited && !self.rate_limit(session).await {
                    // A batch taken stays pending in the store and runs after the restart.
                    return false;
                }
                let mut item = match next {
                    Next::Queued(_) => match session.queue.pop() {
                        Some(item) => item,
                        None => return true,
                    },
                    Next::Batch(item) => *item,
                };
                self.resolve_roles(&mut item).await;
                self.run_item(session, item).await;
                true
            });
            if !work.await {
                // Shutdown while waiting: the item stays pending in the store.
                break;
            }
        }
        let mut state = session.state();
        state.actor_running = false;
        self.release_actor(&session.key);
    }

    /// Ends the actor and drops the session from memory if nothing arrived meanwhile;
    /// history and log stay in the store. Under the owner lock, so no push can land on it
    /// after the check.
    fn evict_if_idle(&self, session: &Arc<Session>) -> bool {
        let mut sessions = self.lock_sessions();
        let mut state = session.state();
        if !session.queue.is_empty() || !state.overheard.is_empty() {
            return false;
        }
        state.actor_running = false;
        self.release_actor(&session.key);
        // Toolset state that is not in the store would be lost with the session, so such
        // a session stays (its actor still ends; the next push starts a new one).
        if !session.agent.tools().holds_session_state()
            && sessions
                .get(&session.key)
                .is_some_and(|live| Arc::ptr_eq(live, session))
        {
            sessions.remove(&session.key);
            if let Some(to) = super::manager::shrunk_capacity(sessions.len(), sessions.capacity()) {
                sessions.shrink_to(to);
            }
            self.inner
                .counters
                .evictions
                .fetch_add(1, Ordering::Relaxed);
        }
        true
    }

    /// Waits until the chat may start another turn; `false` when shutdown began meanwhile.
    async fn rate_limit(&self, session: &Session) -> bool {
        let per_minute = self.inner.config.turns_per_minute.max(1);
        loop {
            let wait = {
                let mut state = session.state();
                match state.recent_turns.try_take(
                    Instant::now(),
                    per_minute,
                    Duration::from_secs(60),
                ) {
                    Ok(()) => return true,
                    Err(wait) => wait,
                }
            };
            tracing::info!(session = %session.key, ?wait, "rate limit: waiting before the next turn");
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = self.inner.draining.cancelled() => return false,
            }
        }
    }
}
