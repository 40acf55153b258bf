//! What the operator's console reads of a live session ([`LiveChat`], from
//! [`SessionManager::live_chats`](super::SessionManager::live_chats)). Everything else it
//! shows comes from the store (`usage.rs`, `trace.rs`).

use chrono::{DateTime, Utc};

/// A session in memory, as the console shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveChat {
    /// Session key.
    pub session: String,
    /// Items waiting in its queue.
    pub queued: usize,
    /// Turns it ran since the daemon started.
    pub turns: u64,
    /// The running item: when it started and its input.
    pub current: Option<(DateTime<Utc>, String)>,
}
