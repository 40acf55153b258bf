//! `parlor usage` and the console's `/usage` page: the tokens, cache reads and cost of each
//! chat and member per UTC day, read from the store. The store is the daemon's: while
//! `parlor run` holds it, the console's usage page and `/status` show the same figures.

use std::fmt::Write as _;

use anyhow::Context;
use chrono::{Days, NaiveDate};
use parlor_bot::llm::price::dollars;
use parlor_bot::session::usage::{self, DayUsage, MemberDay};
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

/// One chat's day.
#[derive(Debug, Clone)]
pub struct ChatLine {
    pub day: NaiveDate,
    pub session: String,
    pub record: DayUsage,
}

/// One member's day in one chat.
#[derive(Debug, Clone)]
pub struct MemberLine {
    pub day: NaiveDate,
    pub member: String,
    pub session: String,
    pub record: MemberDay,
}

impl MemberLine {
    /// `Name (telegram:42)`.
    pub fn who(&self) -> String {
        format!("{} ({})", self.record.name, self.member)
    }
}

/// What a filter selects: chats by day (none when the filter names a member), then members
/// by day, oldest day first.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub chats: Vec<ChatLine>,
    pub members: Vec<MemberLine>,
}

/// The chats' sums: turns, tokens, the cache's share of prompt tokens, cost.
#[derive(Debug, Clone, Default)]
pub struct Sums {
    pub turns: u64,
    pub tokens: u64,
    pub prompt_tokens: u64,
    pub cache_read_tokens: u64,
    pub cost_nanos: u64,
}

impl Sums {
    /// `82%`, or `-` before any prompt token.
    pub fn cached(&self) -> String {
        cached(&DayUsage {
            prompt_tokens: self.prompt_tokens,
            cache_read_tokens: self.cache_read_tokens,
            ..DayUsage::default()
        })
    }
}

/// The width of a column headed `header` holding cells `lens` characters long.
fn widest(lens: impl Iterator<Item = usize>, header: &str) -> usize {
    lens.max().unwrap_or(0).max(header.len())
}

/// A day's share of prompt tokens read from the cache: `82%`, or `-` before any prompt.
pub fn cached(day: &DayUsage) -> String {
    day.cache_hit_percent()
        .map_or_else(|| "-".to_owned(), |p| format!("{p}%"))
}

impl Report {
    /// The records `filter` selects, ending at `today`.
    pub fn read(store: &dyn Store, today: NaiveDate, filter: &Filter) -> anyhow::Result<Self> {
        let mut report = Self::default();
        for back in (0..filter.days.max(1)).rev() {
            let Some(day) = today.checked_sub_days(Days::new(u64::from(back))) else {
                continue;
            };
            let wanted = |session: &String| filter.chat.as_ref().is_none_or(|c| c == session);
            if filter.member.is_none() {
                for (session, record) in usage::all_on(store, day).context("cannot read usage")? {
                    if wanted(&session) {
                        report.chats.push(ChatLine {
                            day,
                            session,
                            record,
                        });
                    }
                }
            }
            let records = usage::members_on(store, day, filter.member.as_deref())
                .context("cannot read member usage")?;
            for (member, session, record) in records {
                if wanted(&session) {
                    report.members.push(MemberLine {
                        day,
                        member,
                        session,
                        record,
                    });
                }
            }
        }
        Ok(report)
    }

    /// The chat lines' sums.
    pub fn chat_sums(&self) -> Sums {
        let mut sums = Sums::default();
        for line in &self.chats {
            let r = &line.record;
            sums.turns += r.turns;
            sums.tokens += r.total_tokens;
            sums.prompt_tokens += r.prompt_tokens;
            sums.cache_read_tokens += r.cache_read_tokens;
            sums.cost_nanos += r.cost_nanos;
        }
        sums
    }

    /// The member lines' sums (members have no cache figures).
    pub fn member_sums(&self) -> Sums {
        let mut sums = Sums::default();
        for line in &self.members {
            sums.turns += line.record.turns;
            sums.tokens += line.record.total_tokens;
            sums.cost_nanos += line.record.cost_nanos;
        }
        sums
    }

    /// The report as plain-text tables, each ending with its total. The cost is at
    /// `[llm.prices]` when each turn ran (`$0` for models without a price).
    pub fn text(&self, member_only: bool) -> String {
        let mut out = String::new();
        if !member_only {
            let width = widest(self.chats.iter().map(|l| l.session.len()), "Chat");
            let _ = writeln!(
                out,
                "{:<10}  {:<width$}  {:>6}  {:>12}  {:>6}  {:>10}",
                "Day", "Chat", "Turns", "Tokens", "Cached", "Cost"
            );
            for l in &self.chats {
                let r = &l.record;
                let _ = writeln!(
                    out,
                    "{}  {:<width$}  {:>6}  {:>12}  {:>6}  {:>10}",
                    l.day,
                    l.session,
                    r.turns,
                    r.total_tokens,
                    cached(r),
                    dollars(r.cost_nanos)
                );
            }
            let s = self.chat_sums();
            let _ = writeln!(
                out,
                "{:<10}  {:<width$}  {:>6}  {:>12}  {:>6}  {:>10}",
                "Total",
                "",
                s.turns,
                s.tokens,
                s.cached(),
                dollars(s.cost_nanos)
            );
            out.push('\n');
        }
        let width = widest(self.members.iter().map(|l| l.who().len()), "Member");
        let chat_width = widest(self.members.iter().map(|l| l.session.len()), "Chat");
        let _ = writeln!(
            out,
            "{:<10}  {:<width$}  {:<chat_width$}  {:>6}  {:>12}  {:>10}",
            "Day", "Member", "Chat", "Turns", "Tokens", "Cost"
        );
        for l in &self.members {
            let _ = writeln!(
                out,
                "{}  {:<width$}  {:<chat_width$}  {:>6}  {:>12}  {:>10}",
                l.day,
                l.who(),
                l.session,
                l.record.turns,
                l.record.total_tokens,
                dollars(l.record.cost_nanos)
            );
        }
        let s = self.member_sums();
        let _ = writeln!(
            out,
            "{:<10}  {:<width$}  {:<chat_width$}  {:>6}  {:>12}  {:>10}",
            "Total",
            "",
            "",
            s.turns,
            s.tokens,
            dollars(s.cost_nanos)
        );
        out
    }
}

/// The usage tables for `filter`, ending at `today`: chats by day, then members by day
/// (only those of `filter.chat` when it is set). Each table ends with its total.
pub fn report(store: &dyn Store, today: NaiveDate, filter: &Filter) -> anyhow::Result<String> {
    Ok(Report::read(store, today, filter)?.text(filter.member.is_some()))
}
