//! The chats' search indexes, kept in memory while they are current.
//!
//! The store is the truth: an index is built from a chat's entries and never written. Every
//! write to a chat's memory (a tool, `/forget`, a chat's migration) also writes a new
//! *stamp* for the chat, in the same transaction; an index is used only while the chat's
//! stamp is the one it was built at, and built again otherwise. So an index that is missing
//! (a restart, an evicted chat) or stale (another daemon wrote, a write raced the build) is
//! rebuilt from the store, and a kill at any moment leaves nothing to repair. The stamp is
//! read before the entries, so a write that lands during a build leaves the index stale,
//! never wrong.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use parlor_bot::store::KvWrite;

use super::Entry;
use super::rank::Index;

/// The store collection holding each chat's stamp (key: the session).
pub const STAMP_SPACE: &str = "memory_stamp";

/// How many chats' indexes stay in memory; the least recently searched leaves first.
pub(super) const CHATS: usize = 32;

/// One chat's entries as the index saw them, and the index.
#[derive(Debug)]
pub(super) struct Built {
    /// The chat's stamp when its entries were read.
    pub(super) stamp: Option<String>,
    /// The entries (key, entry), most recently updated first; an entry's vector lives in
    /// `vectors`, not here.
    pub(super) entries: Vec<(String, Entry)>,
    /// Each entry's vector for the configured embedding model, if it has one.
    pub(super) vectors: Vec<Option<Vec<f32>>>,
    /// The inverted index of the entries, in their order.
    pub(super) index: Index,
}

/// The indexes of the chats searched lately.
#[derive(Debug, Default)]
pub(super) struct Cache {
    /// Session → (index, when last used).
    chats: Mutex<HashMap<String, (Arc<Built>, u64)>>,
    clock: AtomicU64,
    /// Indexes built so far (for tests and logs).
    builds: AtomicU64,
}

impl Cache {
    /// The index of `session`, if it was built at `stamp`.
    pub(super) fn get(&self, session: &str, stamp: Option<&str>) -> Option<Arc<Built>> {
        let now = self.clock.fetch_add(1, Ordering::Relaxed);
        let mut chats = self.chats.lock().unwrap_or_else(PoisonError::into_inner);
        let (built, used) = chats.get_mut(session)?;
        if built.stamp.as_deref() != stamp {
            return None;
        }
        *used = now;
        Some(Arc::clone(built))
    }

    /// Keeps `built` as `session`'s index, letting the least recently used go past
    /// [`CHATS`].
    pub(super) fn put(&self, session: &str, built: Arc<Built>) {
        self.builds.fetch_add(1, Ordering::Relaxed);
        let now = self.clock.fetch_add(1, Ordering::Relaxed);
        let mut chats = self.chats.lock().unwrap_or_else(PoisonError::into_inner);
        chats.insert(session.to_owned(), (built, now));
        while chats.len() > CHATS {
            let Some(oldest) = chats
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(key, _)| key.clone())
            else {
                break;
            };
            chats.remove(&oldest);
        }
    }

    /// How many indexes were built since start.
    pub(super) fn builds(&self) -> u64 {
        self.builds.load(Ordering::Relaxed)
    }
}

/// The write that gives `session` a new stamp: part of every transaction that changes the
/// chat's entries.
pub fn restamp(session: &str) -> KvWrite {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    // Unique across this process (the counter) and across daemons on one store (the
    // time and process id).
    let stamp = format!(
        "{nanos:x}-{:x}-{:x}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    KvWrite {
        space: STAMP_SPACE.to_owned(),
        key: session.to_owned(),
        value: Some(stamp),
        if_unchanged: None,
    }
}
