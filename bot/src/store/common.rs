//! What both store backends share: their options, the session keys they accept, and the
//! rules of records they both write. Neither backend imports the other.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{ChatRecord, PendingItem, PendingKind, StoreError};
use crate::platform::ChatRef;
use crate::time::WallTime;

/// Tunables shared by both store backends.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// How many messages the log of one session keeps; the oldest are dropped first, from
    /// the log and from the dedupe index alike. Values below 1 are treated as 1.
    pub max_messages_per_chat: usize,
    /// How long [`SledStore::open`](super::SledStore::open) retries when the database is locked before it gives up
    /// with [`StoreError::Locked`]. sled releases its file lock a moment *after* the last
    /// handle is dropped (its background threads close the file), so an immediate reopen in
    /// the same process (a restart in tests) needs a short wait. Ignored by [`MemoryStore`].
    ///
    /// [`MemoryStore`]: super::MemoryStore
    pub lock_timeout: Duration,
    /// Where the store reads the time it stamps itself: a done reply's `done_at` (and so
    /// when it is pruned) and a migrated chat's `since`. Everything else it stores carries
    /// the time its caller gave.
    pub wall: WallTime,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            max_messages_per_chat: 2000,
            lock_timeout: Duration::from_secs(2),
            wall: WallTime::system(),
        }
    }
}

impl StoreOptions {
    /// The bound as used: at least one message.
    pub(crate) fn bound(&self) -> u64 {
        u64::try_from(self.max_messages_per_chat.max(1)).unwrap_or(u64::MAX)
    }
}

/// Refuses session keys that would make the `session \0 ...` keys ambiguous.
pub(crate) fn check_session(session: &str) -> Result<(), StoreError> {
    if session.contains('\0') {
        return Err(StoreError::Io(format!(
            "session key {session:?} contains a NUL byte"
        )));
    }
    Ok(())
}

/// The chat record of the new chat after a migration: the old one's, moved.
pub(super) fn migrated_record(
    to: &ChatRef,
    old: Option<ChatRecord>,
    since: DateTime<Utc>,
) -> ChatRecord {
    ChatRecord {
        chat: to.clone(),
        title: old.and_then(|record| record.title),
        present: true,
        status: "migrated".to_owned(),
        since,
    }
}

/// Whether `item` is the user-message input of message `message_id` of `session`.
pub(super) fn is_pending_for(item: &PendingItem, session: &str, message_id: &str) -> bool {
    item.session == session
        && item.kind == PendingKind::UserMessage
        && item.reply_to.as_deref() == Some(message_id)
}
