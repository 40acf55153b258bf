//! `parlor usage`: the tokens each chat and member used, per UTC day, read from the store.
//! The store is the daemon's: while `parlor run` holds it, the console's usage page and
//! `/status` show the same figures.

use std::fmt::Write as _;

use anyhow::Context;
use chrono::{Days, NaiveDate};
use parlor_bot::session::usage;
use parlor_bot::store::Store;

/// What `parlor usage` prints.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Only this chat (its session key, `telegram:-100123`).
    pub chat: Option<String>,
    /// Only this member (`telegram:42`).
    pub member: Option<String>,
    /// Days back from `today`, `today` included.
    pub days: u32,
}

/// The usage table for `filter`, ending at `today`: chats by day, then members by day
/// (only those of `filter.chat` when it is set). Each table ends with its total.
pub fn report(store: &dyn Store, today: NaiveDate, filter: &Filter) -> anyhow::Result<String> {
    let mut chats = Vec::new();
    let mut members = Vec::new();
    for back in (0..filter.days.max(1)).rev() {
        let Some(day) = today.checked_sub_days(Days::new(u64::from(back))) else {
            continue;
        };
        if filter.member.is_none() {
            for (session, record) in usage::all_on(store, day).context("cannot read usage")? {
                if filter.chat.as_ref().is_none_or(|c| *c == session) {
                    chats.push((day, session, record));
                }
            }
        }
        let records = usage::members_on(store, day, filter.member.as_deref())
            .context("cannot read member usage")?;
        for (member, session, record) in records {
            if filter.chat.as_ref().is_none_or(|c| *c == session) {
                members.push((day, member, session, record));
            }
        }
    }
    let mut out = String::new();
    if filter.member.is_none() {
        let width = chats
            .iter()
            .map(|(_, s, _)| s.len())
            .max()
            .unwrap_or(4)
            .max(4);
        let _ = writeln!(
            out,
            "{:<10}  {:<width$}  {:>6}  {:>12}",
            "Day", "Chat", "Turns", "Tokens"
        );
        let (mut turns, mut tokens) = (0, 0);
        for (day, session, record) in &chats {
            let _ = writeln!(
                out,
                "{day}  {session:<width$}  {:>6}  {:>12}",
                record.turns, record.total_tokens
            );
            turns += record.turns;
            tokens += record.total_tokens;
        }
        let _ = writeln!(
            out,
            "{:<10}  {:<width$}  {turns:>6}  {tokens:>12}",
            "Total", ""
        );
        out.push('\n');
    }
    let width = members
        .iter()
        .map(|(_, m, _, r)| m.len() + r.name.len() + 3)
        .max()
        .unwrap_or(6)
        .max(6);
    let chat_width = members
        .iter()
        .map(|(_, _, s, _)| s.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let _ = writeln!(
        out,
        "{:<10}  {:<width$}  {:<chat_width$}  {:>6}  {:>12}",
        "Day", "Member", "Chat", "Turns", "Tokens"
    );
    let (mut turns, mut tokens) = (0, 0);
    for (day, member, session, record) in &members {
        let who = format!("{} ({member})", record.name);
        let _ = writeln!(
            out,
            "{day}  {who:<width$}  {session:<chat_width$}  {:>6}  {:>12}",
            record.turns, record.total_tokens
        );
        turns += record.turns;
        tokens += record.total_tokens;
    }
    let _ = writeln!(
        out,
        "{:<10}  {:<width$}  {:<chat_width$}  {turns:>6}  {tokens:>12}",
        "Total", "", ""
    );
    Ok(out)
}
