//! [`Dispatcher`]: the one owner of the chats that run here. It alone holds the map of live
//! sessions, starts a chat's worker ([`super::worker`]) and lets it leave memory. With
//! several daemons on one store ([`super::cluster`]) it also holds each chat's lease: no
//! worker starts without it, and it is let go when the worker leaves.
//!
//! **One worker per chat, by construction.** Whether a chat's worker runs is a field of
//! the chat's entry in the map, private to this file. It is set only where the worker is
//! spawned and cleared only by that worker ([`Dispatcher::retire`],
//! [`Dispatcher::stopped`]), both under the map's lock; an entry with a running worker
//! never leaves the map (a chat that moves away has its queue emptied instead). So a
//! second worker for a chat cannot start.
//!
//! **Nothing waits without a worker.** Intake, submissions, resume and a chat's move reach
//! a session only through [`Chats`], the locked map: when it is let go, the session it
//! handed out last is given a worker if it has work and none runs. A worker leaves only
//! when its queue and its auto-chat batch are empty, checked under the same lock, so no
//! push lands on a chat that is leaving.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::lease::{self, Held, Taken};
use super::manager::{Session, SessionManager};
use crate::store::{KvWrite, OutboxEntry};

/// A live chat: its session, whether its worker runs, and (cluster mode) its lease.
struct Chat {
    session: Arc<Session>,
    worker: bool,
    lease: Option<Held>,
}

/// The chat's lease was lost: it must not commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Lost;

/// See the module docs.
#[derive(Default)]
pub(super) struct Dispatcher {
    chats: Mutex<HashMap<String, Chat>>,
    started: AtomicU64,
    running: AtomicUsize,
    evictions: AtomicU64,
    leases: AtomicUsize,
    takeovers: AtomicU64,
    lost: AtomicU64,
    /// Cluster mode: the most chats this instance takes while others have room (0: no
    /// limit), from the instances' loads the sweep reads.
    share: AtomicUsize,
}

/// Workers started, running, sessions that left memory, and (cluster mode) leases held,
/// taken over from another instance and lost: for [`SessionManager::stats`].
pub(super) struct Counts {
    pub started: u64,
    pub running: usize,
    pub evictions: u64,
    pub leases: usize,
    pub takeovers: u64,
    pub lost: u64,
}

impl Dispatcher {
    /// The locked map, for quick synchronous work: lookups, pushes, the intake
    /// transaction. `manager` starts the workers the work needs when it is let go.
    pub(super) fn lock<'a>(&'a self, manager: &'a SessionManager) -> Chats<'a> {
        Chats {
            map: self.chats.lock().unwrap_or_else(|e| e.into_inner()),
            dispatcher: self,
            manager,
            touched: None,
        }
    }

    fn map(&self) -> MutexGuard<'_, HashMap<String, Chat>> {
        self.chats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The live session of `key`, if any (never creates one).
    pub(super) fn live(&self, key: &str) -> Option<Arc<Session>> {
        self.map().get(key).map(|chat| Arc::clone(&chat.session))
    }

    /// Every live session.
    pub(super) fn all(&self) -> Vec<Arc<Session>> {
        self.map()
            .values()
            .map(|chat| Arc::clone(&chat.session))
            .collect()
    }

    /// Sessions in memory.
    pub(super) fn len(&self) -> usize {
        self.map().len()
    }

    /// Items waiting in the live sessions' queues.
    pub(super) fn queued(&self) -> usize {
        self.map()
            .values()
            .map(|chat| chat.session.queue().len())
            .sum()
    }

    pub(super) fn counts(&self) -> Counts {
        Counts {
            started: self.started.load(Ordering::Relaxed),
            running: self.running.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            leases: self.leases.load(Ordering::Relaxed),
            takeovers: self.takeovers.load(Ordering::Relaxed),
            lost: self.lost.load(Ordering::Relaxed),
        }
    }

    /// The write a commit of `key` carries: none outside cluster mode, else the lease's
    /// fence; `Lost` when this instance no longer holds the chat.
    pub(super) fn fence(
        &self,
        manager: &SessionManager,
        key: &str,
    ) -> Result<Option<KvWrite>, Lost> {
        if manager.config().cluster.is_none() {
            return Ok(None);
        }
        match self.map().get(key).and_then(|chat| chat.lease.as_ref()) {
            Some(held) => Ok(Some(held.fence())),
            None => Err(Lost),
        }
    }

    /// Whether this instance may send `entry` now: always outside cluster mode; in it,
    /// while it holds the chat's lease unexpired, or (a reply its intake made for a chat held
    /// elsewhere) while the row is younger than half a lease's life. Past that the holder
    /// sends it (the sweep hands it rows older than a lease's life), so a paused instance
    /// that wakes after its lease was taken sends nothing twice.
    pub(super) fn may_send(&self, manager: &SessionManager, entry: &OutboxEntry) -> bool {
        let Some(cluster) = &manager.config().cluster else {
            return true;
        };
        let now = manager.now();
        if let Some(held) = self
            .map()
            .get(&entry.session)
            .and_then(|chat| chat.lease.as_ref())
        {
            return held.expires() > now;
        }
        entry.created > now - cluster.ttl() / 2
    }

    /// Drops `key`'s lease if it expired unrenewed (this instance was paused, or could not
    /// reach the store): lost, as when the heartbeat finds it taken.
    pub(super) fn drop_lapsed(&self, manager: &SessionManager, key: &str) {
        let now = manager.now();
        let mut map = self.map();
        let Some(chat) = map.get_mut(key) else {
            return;
        };
        if chat
            .lease
            .as_ref()
            .is_some_and(|held| held.expires() <= now)
        {
            tracing::warn!(session = %key, "the chat's lease lapsed unrenewed; its inputs are for the next holder");
            chat.lease = None;
            self.leases.fetch_sub(1, Ordering::Relaxed);
            self.lost.fetch_add(1, Ordering::Relaxed);
            crate::metrics::global().chat_leases_lost.inc();
        }
    }

    /// Chat leases held here now.
    pub(super) fn leases_held(&self) -> usize {
        self.leases.load(Ordering::Relaxed)
    }

    /// Sets this instance's share of the chats (0: no limit).
    pub(super) fn set_share(&self, share: usize) {
        self.share.store(share, Ordering::Relaxed);
    }

    /// Whether this instance may run `key` now: always outside cluster mode; in it, while it
    /// holds the chat's lease unexpired (a daemon that wakes from a pause past its lease
    /// starts nothing more there, even before its heartbeat finds the lease taken).
    pub(super) fn holds(&self, manager: &SessionManager, key: &str) -> bool {
        if manager.config().cluster.is_none() {
            return true;
        }
        let now = manager.now();
        self.map()
            .get(key)
            .and_then(|chat| chat.lease.as_ref())
            .is_some_and(|held| held.expires() > now)
    }

    /// The heartbeat: renews every held lease; a lost one empties its chat's queue and
    /// stops its running item (the inputs stay pending for the new holder).
    pub(super) fn renew(&self, manager: &SessionManager) {
        let Some(cluster) = &manager.config().cluster else {
            return;
        };
        let held: Vec<(String, Held)> = self
            .map()
            .iter()
            .filter_map(|(key, chat)| Some((key.clone(), chat.lease.clone()?)))
            .collect();
        let metrics = crate::metrics::global();
        for (key, mut lease) in held {
            let asked = std::time::Instant::now();
            let renewed = lease::renew(
                manager.store().as_ref(),
                &mut lease,
                manager.now(),
                cluster.ttl(),
            );
            metrics
                .lease_renew_latency
                .observe(asked.elapsed().as_secs_f64());
            let mut map = self.map();
            let Some(chat) = map.get_mut(&key) else {
                continue;
            };
            // Let go meanwhile (the worker left): nothing to keep.
            if chat
                .lease
                .as_ref()
                .is_none_or(|l| l.token() != lease.token())
            {
                continue;
            }
            match renewed {
                Ok(true) => chat.lease = Some(lease),
                Ok(false) => {
                    tracing::warn!(session = %key, "lost the chat's lease to another instance; its inputs are theirs now");
                    chat.lease = None;
                    self.leases.fetch_sub(1, Ordering::Relaxed);
                    self.lost.fetch_add(1, Ordering::Relaxed);
                    metrics.chat_leases_lost.inc();
                    super::queue::handed_over(chat.session.queue().clear());
                    chat.session.batch().clear();
                    if let Some(cancel) = chat.session.running() {
                        cancel.cancel();
                    }
                }
                Err(e) => {
                    // Kept: it may still be renewed before it expires; if not, the fence
                    // refuses this instance's commits.
                    tracing::warn!(session = %key, error = %e, "cannot renew a chat's lease");
                }
            }
        }
    }

    /// Lets go the leases of chats with no worker and no work (cluster mode).
    pub(super) fn release_idle(&self, manager: &SessionManager) {
        let mut map = self.map();
        let idle: Vec<String> = map
            .iter()
            .filter(|(key, chat)| {
                chat.lease.is_some()
                    && !chat.worker
                    && !chat.session.has_work()
                    // Kept while its replies are sent from here: a new holder would send
                    // them again.
                    && !manager.lanes().busy(key)
            })
            .map(|(key, _)| key.clone())
            .collect();
        for key in idle {
            if let Some(chat) = map.get_mut(&key) {
                self.let_go(manager, chat);
            }
            if !map
                .get(&key)
                .is_some_and(|chat| chat.session.agent().tools().holds_session_state())
            {
                map.remove(&key);
            }
        }
    }

    /// Lets go every lease (shutdown, after the workers stopped): the other instances take
    /// the chats at once.
    pub(super) fn release_all(&self, manager: &SessionManager) {
        for chat in self.map().values_mut() {
            self.let_go(manager, chat);
        }
    }

    fn let_go(&self, manager: &SessionManager, chat: &mut Chat) {
        let Some(held) = chat.lease.take() else {
            return;
        };
        self.leases.fetch_sub(1, Ordering::Relaxed);
        match lease::release(manager.store().as_ref(), &held) {
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(session = %held.name(), error = %e, "cannot let a chat's lease go; it expires by itself");
            }
        }
    }

    /// The worker of `session` found it idle: it ends (`true`) unless work arrived
    /// meanwhile, and the session leaves memory unless its toolsets hold state that is not
    /// in the store (the next push starts a new worker on it).
    pub(super) fn retire(&self, manager: &SessionManager, session: &Arc<Session>) -> bool {
        let mut map = self.map();
        if session.has_work() {
            return false;
        }
        self.running.fetch_sub(1, Ordering::Relaxed);
        let Some(chat) = map.get_mut(session.key()) else {
            return true;
        };
        chat.worker = false;
        if manager.config().cluster.is_some() && manager.lanes().busy(session.key()) {
            // Its lease is kept while its replies are sent; a sweep lets it go after.
            return true;
        }
        self.let_go(manager, chat);
        if !session.agent().tools().holds_session_state() {
            map.remove(session.key());
            if let Some(to) = shrunk_capacity(map.len(), map.capacity()) {
                map.shrink_to(to);
            }
            self.evictions.fetch_add(1, Ordering::Relaxed);
        }
        true
    }

    /// The worker of `session` stopped for shutdown; its queued items stay pending.
    pub(super) fn stopped(&self, manager: &SessionManager, session: &Arc<Session>) {
        if let Some(chat) = self.map().get_mut(session.key()) {
            chat.worker = false;
            self.let_go(manager, chat);
        }
        self.running.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The locked map of live chats, from [`Dispatcher::lock`]. Letting it go starts the
/// worker of the session it handed out last, if that one has work and none runs.
pub(super) struct Chats<'a> {
    map: MutexGuard<'a, HashMap<String, Chat>>,
    dispatcher: &'a Dispatcher,
    manager: &'a SessionManager,
    touched: Option<Arc<Session>>,
}

impl Chats<'_> {
    /// The session of `key`, created on first use.
    pub(super) fn session(&mut self, key: &str) -> Arc<Session> {
        let manager = self.manager;
        let session = Arc::clone(
            &self
                .map
                .entry(key.to_owned())
                .or_insert_with(|| Chat {
                    session: Arc::new(manager.new_session(key)),
                    worker: false,
                    lease: None,
                })
                .session,
        );
        if let Some(before) = self.touched.replace(Arc::clone(&session))
            && !Arc::ptr_eq(&before, &session)
        {
            self.start_if_needed(&before);
        }
        session
    }

    /// The live session of `key`, if any (never creates one).
    pub(super) fn get(&self, key: &str) -> Option<&Arc<Session>> {
        self.map.get(key).map(|chat| &chat.session)
    }

    /// Whether `key` is in memory here.
    pub(super) fn is_live(&self, key: &str) -> bool {
        self.map.contains_key(key)
    }

    /// Whether this instance holds `key`'s lease (always true outside cluster mode).
    pub(super) fn holds(&self, key: &str) -> bool {
        self.manager.config().cluster.is_none()
            || self.map.get(key).is_some_and(|chat| chat.lease.is_some())
    }

    /// Whether the chat `key` (in the map: call [`Chats::session`] first) runs here: always
    /// outside cluster mode; in it, when this instance holds its lease or takes it now.
    /// Taking it reads the chat's pending inputs afresh and queues them, with the replies
    /// its last holder left unsent for longer than a lease lives. A chat held elsewhere
    /// leaves the map unless its worker runs here; its inputs wait, pending, for the holder.
    pub(super) fn runs_here(&mut self, key: &str) -> bool {
        let manager = self.manager;
        let Some(cluster) = &manager.config().cluster else {
            return true;
        };
        let Some(chat) = self.map.get_mut(key) else {
            return false;
        };
        if chat.lease.is_some() {
            return true;
        }
        let store = manager.store().as_ref();
        let name = super::cluster::chat_lease(key);
        // Sized honestly: past its share of the chats, this instance leaves a chat it does
        // not hold to the others (their sweep takes it within `sweep_every`).
        let share = self.dispatcher.share.load(Ordering::Relaxed);
        let over = share > 0 && self.dispatcher.leases.load(Ordering::Relaxed) >= share;
        let taken = if over {
            Ok(Taken::Busy)
        } else {
            lease::acquire(
                store,
                &name,
                &cluster.instance,
                manager.now(),
                cluster.ttl(),
            )
        };
        let held = match taken {
            Ok(Taken::Held(held)) => held,
            Ok(Taken::Busy) => {
                if !chat.worker {
                    self.map.remove(key);
                }
                return false;
            }
            Err(e) => {
                tracing::warn!(session = %key, error = %e, "cannot take a chat's lease; it runs elsewhere or later");
                if !chat.worker {
                    self.map.remove(key);
                }
                return false;
            }
        };
        if held.took_over() {
            self.dispatcher.takeovers.fetch_add(1, Ordering::Relaxed);
            crate::metrics::global().chat_lease_takeovers.inc();
        }
        self.dispatcher.leases.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(session = %key, token = held.token(), "took the chat's lease");
        chat.lease = Some(held);
        let session = Arc::clone(&chat.session);
        match store.pending() {
            Ok(pending) => {
                for item in pending.into_iter().filter(|i| i.session == key) {
                    super::cluster::load(manager, &session, item);
                }
            }
            Err(e) => {
                tracing::warn!(session = %key, error = %e, "cannot read a taken chat's inputs; the next sweep does");
            }
        }
        let stale = manager.now() - cluster.ttl();
        if let Ok(unsent) = store.unsent_outbox() {
            for entry in unsent {
                if entry.session == key && entry.created < stale {
                    manager.enqueue_reply(entry, Vec::new());
                }
            }
        }
        true
    }

    /// The queued items of `key`, a chat that moved to a new id, to go with it. Its entry
    /// leaves the map unless its worker runs (that one lets it go once idle).
    pub(super) fn move_out(&mut self, key: &str) -> Vec<super::queue::QueueItem> {
        let Some(chat) = self.map.get(key) else {
            return Vec::new();
        };
        let waiting = chat.session.queue().clear();
        if !chat.worker {
            self.map.remove(key);
        }
        waiting
    }

    fn start_if_needed(&mut self, session: &Arc<Session>) {
        if self.manager.draining().is_cancelled() || !session.has_work() {
            return;
        }
        let Some(chat) = self.map.get_mut(session.key()) else {
            return;
        };
        if chat.worker || !Arc::ptr_eq(&chat.session, session) {
            return;
        }
        if self.manager.config().cluster.is_some() && chat.lease.is_none() {
            return;
        }
        chat.worker = true;
        self.dispatcher.started.fetch_add(1, Ordering::Relaxed);
        self.dispatcher.running.fetch_add(1, Ordering::Relaxed);
        super::worker::spawn(self.manager, Arc::clone(session));
    }
}

impl Drop for Chats<'_> {
    fn drop(&mut self) {
        if let Some(session) = self.touched.take() {
            self.start_if_needed(&session);
        }
    }
}

/// The capacity to shrink a table of `len` entries to, when it is mostly empty: after a
/// burst of 10,000 chats has left memory, the tables of live sessions and lanes would
/// otherwise keep room for all of them (a few MiB) for good. Shrinking only below a
/// quarter keeps it amortized.
pub(super) fn shrunk_capacity(len: usize, capacity: usize) -> Option<usize> {
    (capacity > 256 && len.saturating_mul(4) < capacity).then(|| len.saturating_mul(2))
}
