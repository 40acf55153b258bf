//! What the operator's console reads of the live sessions and does to them: each chat in
//! memory with its queue and running turn, and the console's stop button (the same as
//! `/stop`). Everything else it shows comes from the store (`usage.rs`, `trace.rs`).

use chrono::{DateTime, Utc};

use super::manager::SessionManager;

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

impl SessionManager {
    /// Every session in memory, by key.
    pub fn live_chats(&self) -> Vec<LiveChat> {
        let sessions: Vec<_> = self.dispatcher().all();
        let mut chats: Vec<LiveChat> = sessions
            .iter()
            .map(|s| {
                let state = s.state();
                LiveChat {
                    session: s.key.clone(),
                    queued: s.queue.len(),
                    turns: state.turns,
                    current: state.current.clone(),
                }
            })
            .collect();
        chats.sort_by(|a, b| a.session.cmp(&b.session));
        chats
    }

    /// Cancels `session`'s running turn, as `/stop` does; `false` when none runs.
    pub fn stop_turn(&self, session: &str) -> bool {
        let Some(live) = self.live_session(session) else {
            return false;
        };
        let token = live.state().turn_cancel.clone();
        match token {
            Some(token) => {
                token.cancel();
                true
            }
            None => false,
        }
    }
}
