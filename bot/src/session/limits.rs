//! Turns per member per hour in a chat (a group's `member_turns_per_hour`), checked at
//! intake before anything is queued, so the model is never asked for the excess. A member
//! past the limit is told once per window (the first refused mention), and the rest are only
//! recorded. Counted in this daemon's memory: a restart, or another daemon taking the
//! webhook's next update, starts the count again, which errs on answering.
//!
//! The table is bounded like the command limits' ([`super::flood`]).

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use super::flood::{Entry, prune};

/// The window of the limit.
pub const WINDOW: Duration = Duration::from_secs(3600);

/// Most (chat, member) pairs remembered at once; past it, the stalest go.
pub const MAX_ENTRIES: usize = 8192;

/// What intake does with a member's turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TurnAdmit {
    /// Queue it.
    Yes,
    /// Refuse it and tell the member, who may ask again after this long.
    Notice(Duration),
    /// Refuse it quietly: the member was told in this window.
    Quiet,
}

/// The windows of every (chat, member) pair with a limit.
#[derive(Debug, Default)]
pub(super) struct MemberTurns {
    entries: HashMap<String, Entry>,
}

fn key(chat: &str, member: &str) -> String {
    format!("{chat}\u{0}{member}")
}

impl MemberTurns {
    /// Whether `member` may start another turn in `chat` at `now`, at most `limit` an hour.
    pub(super) fn admit(
        &mut self,
        chat: &str,
        member: &str,
        now: Instant,
        limit: u32,
    ) -> TurnAdmit {
        if self.entries.len() >= MAX_ENTRIES {
            self.prune(now);
        }
        let entry = self.entries.entry(key(chat, member)).or_default();
        match entry.window.try_take(now, limit as usize, WINDOW) {
            Ok(()) => TurnAdmit::Yes,
            Err(_) if entry.told_until.is_some_and(|t| t > now) => TurnAdmit::Quiet,
            Err(wait) => {
                entry.told_until = Some(now + wait);
                TurnAdmit::Notice(wait)
            }
        }
    }

    /// The turns `member` started in `chat` in the last hour.
    pub(super) fn used(&self, chat: &str, member: &str, now: Instant) -> usize {
        self.entries
            .get(&key(chat, member))
            .map_or(0, |e| e.window.count(now, WINDOW))
    }

    fn prune(&mut self, now: Instant) {
        prune(&mut self.entries, now, WINDOW, MAX_ENTRIES);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn past_the_limit_a_member_is_told_once_and_others_are_unaffected() {
        let mut turns = MemberTurns::default();
        let now = Instant::now();
        assert_eq!(turns.admit("g", "a", now, 2), TurnAdmit::Yes);
        assert_eq!(turns.admit("g", "a", now, 2), TurnAdmit::Yes);
        assert!(matches!(
            turns.admit("g", "a", now, 2),
            TurnAdmit::Notice(_)
        ));
        assert_eq!(turns.admit("g", "a", now, 2), TurnAdmit::Quiet);
        assert_eq!(turns.admit("g", "b", now, 2), TurnAdmit::Yes);
        assert_eq!(turns.used("g", "a", now), 2);
        assert_eq!(turns.admit("g", "a", now + WINDOW, 2), TurnAdmit::Yes);
    }
}
