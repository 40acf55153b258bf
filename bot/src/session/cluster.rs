//! Several daemons on one store ([`Cluster`], `[cluster]` in the config): a chat runs only
//! in the instance holding its lease ([`super::lease`]), which the
//! [`Dispatcher`](super::dispatcher) takes before it starts the chat's worker and lets go
//! when the worker leaves. Any instance takes input (a webhook may reach any of them): it
//! records it pending, and queues it only when it holds the chat, or can take it.
//!
//! Two loops per instance, owned by the session layer's tracker:
//!
//! - **The sweep** reads the pending inputs every `sweep_every`. For a chat it holds, it queues what
//!   other instances recorded; for a chat nobody holds (its holder died or let it go), it
//!   takes the lease, then reads that chat's pending inputs afresh, so nothing the old
//!   holder answered comes back.
//!   A chat it holds also gets the unsent replies older than a lease's life that its lane
//!   does not hold: another instance's intake made them and left them (`may_send`).
//! - **The heartbeat** renews the held leases every third of `lease_ttl`. A lease it could
//!   not renew is lost: the chat's queue is emptied (its inputs stay pending for the new
//!   holder), its running turn is cancelled, and its commit would be refused anyway (the
//!   fence).
//!
//! **Sized honestly.** Each heartbeat writes how many chats the instance holds; each sweep
//! reads the live instances' loads and sets this one's share (all their chats, plus one,
//! spread evenly). Past it, an instance takes no chat it does not hold: it records the
//! input, and an instance below its share takes the chat at its next sweep.
//!
//! A pending input is queued once: the queue refuses an id it holds or runs, and each
//! session remembers the ids its worker took ([`Handled`]) until a sweep that began after
//! they ended, since a snapshot read before a commit still shows the input pending.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::manager::{Session, SessionManager};
use crate::store::PendingItem;

/// How this instance shares chats with others on one store.
#[derive(Debug, Clone)]
pub struct Cluster {
    /// This run's instance id: the configured name and a random part, so that a restarted
    /// instance never mistakes its predecessor's leases for its own.
    pub instance: String,
    /// How long a lease lasts unrenewed: how long the chats of an instance that died
    /// without letting go wait for another.
    pub lease_ttl: Duration,
    /// How often inputs recorded by other instances are looked for.
    pub sweep_every: Duration,
}

impl Cluster {
    /// Instance `instance` (unique to this run) with the default timing: 10 s leases, a
    /// 1 s sweep.
    pub fn new(instance: String) -> Self {
        Cluster {
            instance,
            lease_ttl: Duration::from_secs(10),
            sweep_every: Duration::from_secs(1),
        }
    }

    pub(super) fn ttl(&self) -> chrono::Duration {
        chrono::Duration::from_std(self.lease_ttl).unwrap_or(chrono::Duration::seconds(10))
    }
}

/// The pending ids a session's worker took, and when each ended (`None` while running).
#[derive(Debug, Default)]
pub(super) struct Handled(Vec<(u64, Option<Instant>)>);

impl Handled {
    pub(super) fn took(&mut self, ids: &[u64]) {
        self.0.extend(ids.iter().map(|&id| (id, None)));
    }

    pub(super) fn ended(&mut self, ids: &[u64]) {
        let now = Instant::now();
        for entry in &mut self.0 {
            if ids.contains(&entry.0) {
                entry.1.get_or_insert(now);
            }
        }
    }

    pub(super) fn holds(&self, id: u64) -> bool {
        self.0.iter().any(|(i, _)| *i == id)
    }

    /// Forgets the ids that ended before `before`: a snapshot read after that no longer
    /// shows them pending, unless their commit failed (then they run again).
    pub(super) fn prune(&mut self, before: Instant) {
        self.0
            .retain(|(_, ended)| ended.is_none_or(|at| at >= before));
        if self.0.is_empty() {
            self.0 = Vec::new();
        }
    }
}

/// Starts the sweep and the heartbeat (cluster mode only).
pub(super) fn spawn(manager: &SessionManager, cluster: &Cluster) {
    let every = cluster.sweep_every.max(Duration::from_millis(50));
    let sweeper = manager.clone();
    manager.tracker().spawn(async move {
        loop {
            sweep(&sweeper);
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                () = sweeper.draining().cancelled() => return,
            }
        }
    });
    let beat = (cluster.lease_ttl / 3).max(Duration::from_millis(50));
    let beater = manager.clone();
    // This instance's own lease says it is alive: what it runs in the background (a
    // command, a sub-agent) is its own while it holds it (`instance_alive`).
    let alive = super::lease::Keeper::new(
        Arc::clone(manager.store()),
        &instance_lease(&cluster.instance),
        &cluster.instance,
        cluster.lease_ttl,
        manager.config().wall_time.clone(),
    );
    manager.tracker().spawn(async move {
        loop {
            if !alive.hold(beater.draining()).await {
                break;
            }
            tokio::select! {
                () = tokio::time::sleep(beat) => {}
                () = beater.draining().cancelled() => break,
            }
            beater.dispatcher().renew(&beater);
            let load = Load {
                v: 1,
                chats: beater.dispatcher().leases_held(),
            };
            if let Ok(json) = serde_json::to_string(&load)
                && let Some(cluster) = &beater.config().cluster
                && let Err(e) = beater.store().kv_put(LOAD_SPACE, &cluster.instance, &json)
            {
                tracing::debug!(error = %e, "cannot write this instance's load");
            }
        }
        alive.release();
        if let Some(cluster) = &beater.config().cluster {
            let _ = beater.store().kv_delete(LOAD_SPACE, &cluster.instance);
        }
    });
}

/// The name of chat `key`'s lease.
pub fn chat_lease(key: &str) -> String {
    format!("chat:{key}")
}

/// The collection of the instances' loads: how many chats each holds, written by its
/// heartbeat, read by the others' sweeps to size their share.
pub const LOAD_SPACE: &str = "instance_load";

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Load {
    v: u32,
    chats: usize,
}

/// This instance's share of the chats: the chats all live instances hold, plus one, spread
/// evenly (rounded up). Some instance is always below its share, so a chat nobody holds
/// always finds a taker. 0 (no limit) when the loads cannot be read.
fn share(manager: &SessionManager, me: &str) -> usize {
    let store = manager.store().as_ref();
    let now = manager.now();
    let Ok(instances) = store.kv_scan(super::lease::LEASE_SPACE, "instance:") else {
        return 0;
    };
    let mut alive = 0usize;
    let mut chats = 0usize;
    for (name, _) in instances {
        let Some(instance) = name.strip_prefix("instance:") else {
            continue;
        };
        if instance != me && !instance_alive(store, instance, now) {
            continue;
        }
        alive += 1;
        chats += match store.kv_get(LOAD_SPACE, instance) {
            Ok(Some(json)) => serde_json::from_str::<Load>(&json).map_or(0, |l| l.chats),
            _ => 0,
        };
    }
    (chats + 1).div_ceil(alive.max(1))
}

/// How many daemons are alive on `store` (each renews its instance lease); at least 1.
pub fn live_instances(
    store: &dyn crate::store::Store,
    now: chrono::DateTime<chrono::Utc>,
) -> usize {
    let Ok(instances) = store.kv_scan(super::lease::LEASE_SPACE, "instance:") else {
        return 1;
    };
    instances
        .iter()
        .filter_map(|(name, _)| name.strip_prefix("instance:"))
        .filter(|instance| {
            super::lease::holder(store, &instance_lease(instance), now)
                .is_ok_and(|h| h.is_some_and(|(h, _)| h.owner == *instance))
        })
        .count()
        .max(1)
}

/// The name of the lease by which `instance` says it is alive.
pub fn instance_lease(instance: &str) -> String {
    format!("instance:{instance}")
}

/// Whether `instance` (another daemon on the store) is alive: it renewed its own lease
/// within the lease's time to live. An unreadable store counts as alive, so that nothing
/// of a live daemon is taken for lost.
pub fn instance_alive(
    store: &dyn crate::store::Store,
    instance: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> bool {
    super::lease::holder(store, &instance_lease(instance), now).map_or(true, |holder| {
        holder.is_some_and(|(h, _)| h.owner == instance)
    })
}

fn cluster_ttl(manager: &SessionManager) -> chrono::Duration {
    manager
        .config()
        .cluster
        .as_ref()
        .map_or(chrono::Duration::seconds(10), Cluster::ttl)
}

/// One sweep: see the module docs.
pub(super) fn sweep(manager: &SessionManager) {
    let started = Instant::now();
    if let Some(cluster) = &manager.config().cluster {
        manager
            .dispatcher()
            .set_share(share(manager, &cluster.instance));
    }
    let pending = match manager.store().pending() {
        Ok(pending) => pending,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read pending inputs; the sweep tries again");
            return;
        }
    };
    let mut by_chat: BTreeMap<String, Vec<PendingItem>> = BTreeMap::new();
    for item in pending {
        by_chat.entry(item.session.clone()).or_default().push(item);
    }
    // A chat with replies and no input left (its holder died between commit and send), and
    // replies another instance's intake made and left (`Dispatcher::may_send`).
    let stale = manager.now() - cluster_ttl(manager);
    let mut unsent: BTreeMap<String, Vec<crate::store::OutboxEntry>> = BTreeMap::new();
    if let Ok(rows) = manager.store().unsent_outbox() {
        for entry in rows {
            by_chat.entry(entry.session.clone()).or_default();
            if entry.created < stale {
                unsent.entry(entry.session.clone()).or_default().push(entry);
            }
        }
    }
    for (key, items) in by_chat {
        if manager.draining().is_cancelled() {
            return;
        }
        let mut chats = manager.chats();
        if chats.holds(&key) {
            let Some(session) = chats.get(&key).cloned() else {
                continue;
            };
            for item in items {
                if !session.handled().holds(item.id) {
                    load(manager, &session, item);
                }
            }
            // The lane refuses a row it holds or sent lately.
            for entry in unsent.remove(&key).unwrap_or_default() {
                manager.enqueue_reply(entry, Vec::new());
            }
            // Touched, so that a worker starts for what was queued.
            chats.session(&key);
        } else if !items.is_empty() || !chats.is_live(&key) {
            chats.session(&key);
            chats.runs_here(&key);
        }
    }
    for session in manager.dispatcher().all() {
        session.handled().prune(started);
    }
    manager.dispatcher().release_idle(manager);
}

/// Queues one pending input on `session`, as the resume after a restart does: a queued
/// kind on the queue (refused if already there), an unaddressed message in the auto-chat
/// batch. `false` when it was left out (a full queue: it stays pending; a chat no longer in
/// auto-chat).
pub(super) fn load(manager: &SessionManager, session: &Arc<Session>, item: PendingItem) -> bool {
    if item.kind.rules().waits == super::input::Wait::Batch {
        return super::auto_chat::restore(manager, session, item);
    }
    let item = super::queue::QueueItem::from_pending(item);
    if let Err(full) = session.queue().push(item) {
        tracing::warn!(session = %session.key(), ids = ?full.0.pending_ids, "queue full; the input stays pending for later");
        return false;
    }
    true
}
