//! Commands answered without a turn (`/help`, `/status`...) cost nothing of the model but a
//! post each: sixty `/help` from one member were sixty posts of a few thousand characters,
//! and the operator's reply waited behind them in the chat's outbox lane (on QQ it gets the
//! account banned). Intake asks [`CommandLimits::admit`] before it answers or queues a
//! command: a member gets a few a minute, a chat a few more; past either, the first refused
//! command is answered once with a notice and the rest are only recorded. Operators are
//! never limited.
//!
//! The table is bounded: entries whose windows are empty are pruned when it grows, and it
//! never holds more than [`MAX_ENTRIES`].

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::lang::{Lang, Msg, say};
use crate::ratelimit::SlidingWindow;

/// The window of both limits.
pub const WINDOW: Duration = Duration::from_secs(60);

/// Most chats and members remembered at once; past it, the stalest go.
pub const MAX_ENTRIES: usize = 4096;

/// What intake does with a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Admit {
    /// Answer it (or queue it) as usual.
    Yes,
    /// Do not answer it; answer this notice instead (the first refusal of a window).
    Notice(String),
    /// Only record it: the chat was told already.
    Quiet,
}

/// One limited thing's recent events, and until when its refusals are not told again
/// (shared with the member turn limits, [`super::limits`]).
#[derive(Debug, Default)]
pub(super) struct Entry {
    pub(super) window: SlidingWindow,
    /// Until when refusals of this entry are not told again.
    pub(super) told_until: Option<Instant>,
}

/// The sliding windows of commands per member (in a chat) and per chat.
#[derive(Debug, Default)]
pub(super) struct CommandLimits {
    entries: HashMap<String, Entry>,
}

impl CommandLimits {
    /// Whether `user` may have a command answered in the chat of `session` at `now`, at most
    /// `per_member` and `per_chat` a minute.
    pub(super) fn admit(
        &mut self,
        session: &str,
        user: &str,
        now: Instant,
        per_member: usize,
        per_chat: usize,
        lang: Lang,
    ) -> Admit {
        if self.entries.len() >= MAX_ENTRIES {
            self.prune(now);
        }
        let member_key = format!("{session}\u{0}{user}");
        // The member's own limit first: one member's flood does not use up the chat's.
        let member = self.entries.entry(member_key).or_default();
        if let Err(wait) = member.window.try_take(now, per_member, WINDOW) {
            return refuse(
                member,
                now,
                wait,
                say(lang, Msg::CommandFloodMember, &[]),
                lang,
            );
        }
        let chat = self.entries.entry(session.to_owned()).or_default();
        if let Err(wait) = chat.window.try_take(now, per_chat, WINDOW) {
            return refuse(chat, now, wait, say(lang, Msg::CommandFloodChat, &[]), lang);
        }
        Admit::Yes
    }

    fn prune(&mut self, now: Instant) {
        prune(&mut self.entries, now, WINDOW, MAX_ENTRIES);
    }

    /// Entries held now (for tests and the bound).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

/// Drops the entries of `entries` with nothing in their `window`; if that leaves `max` or
/// more, a quarter of them, used longest ago.
pub(super) fn prune(
    entries: &mut HashMap<String, Entry>,
    now: Instant,
    window: Duration,
    max: usize,
) {
    entries.retain(|_, e| {
        e.window
            .last()
            .is_some_and(|last| now.duration_since(last) < window)
            || e.told_until.is_some_and(|t| t > now)
    });
    if entries.len() >= max {
        let mut by_age: Vec<(Option<Instant>, String)> = entries
            .iter()
            .map(|(k, e)| (e.window.last(), k.clone()))
            .collect();
        by_age.sort();
        for (_, key) in by_age.into_iter().take(max / 4) {
            entries.remove(&key);
        }
    }
    entries.shrink_to(entries.len() * 2);
}

fn refuse(entry: &mut Entry, now: Instant, wait: Duration, who: String, lang: Lang) -> Admit {
    if entry.told_until.is_some_and(|t| t > now) {
        return Admit::Quiet;
    }
    entry.told_until = Some(now + wait);
    let secs = wait.as_secs().max(1);
    Admit::Notice(say(
        lang,
        Msg::CommandFlood,
        &[("who", &who), ("secs", &secs.to_string())],
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_flood_is_told_once_then_recorded_only() {
        let mut limits = CommandLimits::default();
        let now = Instant::now();
        let outcomes: Vec<Admit> = (0..60)
            .map(|_| limits.admit("t:1", "t:bob", now, 3, 10, Lang::En))
            .collect();
        assert_eq!(&outcomes[..3], &[Admit::Yes, Admit::Yes, Admit::Yes]);
        assert!(matches!(outcomes[3], Admit::Notice(_)), "{outcomes:?}");
        assert!(outcomes[4..].iter().all(|o| *o == Admit::Quiet));
        // Another member still has the chat's remaining room, not bob's.
        assert_eq!(
            limits.admit("t:1", "t:carol", now, 3, 10, Lang::En),
            Admit::Yes
        );
        // A minute later bob is answered again.
        let later = now + WINDOW;
        assert_eq!(
            limits.admit("t:1", "t:bob", later, 3, 10, Lang::En),
            Admit::Yes
        );
    }

    #[tokio::test(start_paused = true)]
    async fn many_members_share_the_chats_limit() {
        let mut limits = CommandLimits::default();
        let now = Instant::now();
        let admitted = (0..30)
            .filter(|i| limits.admit("t:1", &format!("t:{i}"), now, 3, 10, Lang::En) == Admit::Yes)
            .count();
        assert_eq!(admitted, 10);
    }

    #[tokio::test(start_paused = true)]
    async fn the_table_stays_bounded() {
        let mut limits = CommandLimits::default();
        let start = Instant::now();
        for i in 0..(MAX_ENTRIES * 3) {
            let now = start + Duration::from_millis(i as u64);
            limits.admit(&format!("t:{i}"), "t:x", now, 3, 10, Lang::En);
            assert!(limits.len() <= MAX_ENTRIES + 2, "{}", limits.len());
        }
    }
}
