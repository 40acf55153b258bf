//! [`Dispatcher`]: the one owner of the chats that run here. It alone holds the map of live
//! sessions, starts a chat's worker ([`super::worker`]) and lets it leave memory; a later
//! lease check (several daemons sharing chats) belongs here, in front of the start.
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

use super::manager::{Session, SessionManager};

/// A live chat: its session and whether its worker runs.
struct Chat {
    session: Arc<Session>,
    worker: bool,
}

/// See the module docs.
#[derive(Default)]
pub(super) struct Dispatcher {
    chats: Mutex<HashMap<String, Chat>>,
    started: AtomicU64,
    running: AtomicUsize,
    evictions: AtomicU64,
}

/// Workers started, running, and sessions that left memory: for [`SessionManager::stats`].
pub(super) struct Counts {
    pub started: u64,
    pub running: usize,
    pub evictions: u64,
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
        }
    }

    /// The worker of `session` found it idle: it ends (`true`) unless work arrived
    /// meanwhile, and the session leaves memory unless its toolsets hold state that is not
    /// in the store (the next push starts a new worker on it).
    pub(super) fn retire(&self, session: &Arc<Session>) -> bool {
        let mut map = self.map();
        if session.has_work() {
            return false;
        }
        self.running.fetch_sub(1, Ordering::Relaxed);
        let Some(chat) = map.get_mut(session.key()) else {
            return true;
        };
        chat.worker = false;
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
    pub(super) fn stopped(&self, session: &Arc<Session>) {
        if let Some(chat) = self.map().get_mut(session.key()) {
            chat.worker = false;
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
