//! Tokens per chat per day (`usage` collection) and per member per chat per day
//! (`usage_member`): what `/status`, `parlor usage` and the operator's console show, and what
//! the optional daily budgets (`SessionConfig::daily_tokens_per_chat`,
//! `SessionConfig::daily_tokens_per_member`) are checked against, before the model is asked.
//! A day's records are rewritten by each turn's commit, in the same transaction
//! (docs/contract.md, "Storage"): a kill never counts a turn without its history, nor the
//! reverse. Only the chat's worker writes its chat's records (a member's are kept per chat
//! for that reason), one turn at a time, so reading, adding and writing back needs no lock;
//! the worker keeps what its last commit wrote for its next turn (`trace.rs`, `Kept`).
//! Days are UTC days.
//!
//! A turn's tokens are shared evenly among the members whose messages it answered; a clock
//! fire, a task notice or an auto-chat turn is charged to the chat only. A turn is refused
//! for the member budget only when every member it would answer has used theirs.

use std::collections::HashMap;

use chrono::{NaiveDate, Utc};
use serde::{Deserialize, Serialize};

use super::worker::ChatWorker;
use crate::llm::{Prices, Spend, Usage};
use crate::store::{KvWrite, Store, StoreError};

/// The collection of day records, keyed `<YYYY-MM-DD>|<session>` so that one prefix scan
/// reads every chat's day.
pub const USAGE_SPACE: &str = "usage";

/// What the chat is told, once a day, when its budget is used up.
pub const BUDGET_NOTICE: &str = "I have used up today's token budget for this chat, so I \
will not answer until tomorrow (UTC). The bot's operator can raise the limit.";

/// One chat's use of the model on one day.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DayUsage {
    /// Schema version (1).
    pub v: u32,
    /// Turns that ran (asked the model) that day.
    pub turns: u64,
    /// Prompt tokens, as the provider reported them.
    pub prompt_tokens: u64,
    /// Completion tokens.
    pub completion_tokens: u64,
    /// Their sum: what the budget counts.
    pub total_tokens: u64,
    /// Whether the chat was told its budget was used up, so it is told once a day.
    #[serde(default)]
    pub budget_told: bool,
    /// Prompt tokens the provider served from its prompt cache (part of `prompt_tokens`).
    #[serde(default)]
    pub cache_read_tokens: u64,
    /// Prompt tokens the provider wrote to its prompt cache (part of `prompt_tokens`).
    #[serde(default)]
    pub cache_write_tokens: u64,
    /// What the tokens cost at `[llm.prices]`, in nanodollars (tokens of a model without a
    /// price add nothing).
    #[serde(default)]
    pub cost_nanos: u64,
}

impl DayUsage {
    /// The share of prompt tokens read from the provider's cache, in percent; `None`
    /// before any prompt.
    pub fn cache_hit_percent(&self) -> Option<u64> {
        (self.prompt_tokens > 0).then(|| self.cache_read_tokens * 100 / self.prompt_tokens)
    }
}

/// The collection of member day records, keyed `<YYYY-MM-DD>|<member>|<session>` so that
/// one prefix scan reads a member's day across chats, and a longer one a whole day.
pub const MEMBER_USAGE_SPACE: &str = "usage_member";

/// What a member is told, once a day in each chat, when their budget is used up.
pub const MEMBER_BUDGET_NOTICE: &str = "has used up today's token budget, so I will not answer until tomorrow (UTC). The bot's operator can raise the limit.";

/// One member's use of the model in one chat on one day.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberDay {
    /// Schema version (1).
    pub v: u32,
    /// The member's name when last seen.
    #[serde(default)]
    pub name: String,
    /// Turns that answered the member (shared turns count whole).
    pub turns: u64,
    /// The member's share of those turns' tokens.
    pub total_tokens: u64,
    /// The member's share of those turns' cost, in nanodollars.
    #[serde(default)]
    pub cost_nanos: u64,
    /// Whether the member was told in this chat that their budget was used up.
    #[serde(default)]
    pub budget_told: bool,
}

/// The key of `member`'s record in `session` for `day`.
pub fn member_key(day: NaiveDate, member: &str, session: &str) -> String {
    let mut key = String::with_capacity(12 + member.len() + session.len());
    crate::time::push_day(&mut key, day);
    key.push('|');
    key.push_str(member);
    key.push('|');
    key.push_str(session);
    key
}

/// Every member record of `day` (or, with `member`, only theirs): (member, session, record).
pub fn members_on(
    store: &dyn Store,
    day: NaiveDate,
    member: Option<&str>,
) -> Result<Vec<(String, String, MemberDay)>, StoreError> {
    let prefix = match member {
        Some(member) => format!("{day}|{member}|"),
        None => format!("{day}|"),
    };
    let mut out = Vec::new();
    for (key, json) in store.kv_scan(MEMBER_USAGE_SPACE, &prefix)? {
        let Some(rest) = key.strip_prefix(&format!("{day}|")) else {
            continue;
        };
        // Member ids are platform-qualified (`telegram:42`) and never hold `|`.
        let Some((member, session)) = rest.split_once('|') else {
            continue;
        };
        match serde_json::from_str(&json) {
            Ok(record) => out.push((member.to_owned(), session.to_owned(), record)),
            Err(e) => tracing::warn!(key, error = %e, "unreadable member usage record skipped"),
        }
    }
    Ok(out)
}

/// `member`'s tokens on `day` across chats, and whether they were told in `session`.
pub fn member_today(
    store: &dyn Store,
    day: NaiveDate,
    member: &str,
    session: &str,
) -> Result<(u64, bool), StoreError> {
    let records = members_on(store, day, Some(member))?;
    let used = records.iter().map(|(_, _, r)| r.total_tokens).sum();
    let told = records
        .iter()
        .any(|(_, s, r)| s == session && r.budget_told);
    Ok((used, told))
}

/// The tokens `member` used in `session` alone on `day`.
pub fn member_here(
    store: &dyn Store,
    day: NaiveDate,
    member: &str,
    session: &str,
) -> Result<u64, StoreError> {
    Ok(
        match store.kv_get(MEMBER_USAGE_SPACE, &member_key(day, member, session))? {
            Some(json) => serde_json::from_str::<MemberDay>(&json)
                .map(|r| r.total_tokens)
                .unwrap_or(0),
            None => 0,
        },
    )
}

/// The members a turn of `item` answers, each once, in order: (id, name). None for a turn
/// that answers no member (a clock fire, a task notice, auto-chat).
pub(super) fn members(item: &super::queue::QueueItem) -> Vec<(String, String)> {
    if item.kind.rules().caller != super::input::CallerRule::Senders {
        return Vec::new();
    }
    let mut out: Vec<(String, String)> = Vec::new();
    for caller in &item.callers {
        if !caller.user_id.is_empty() && !out.iter().any(|(id, _)| *id == caller.user_id) {
            out.push((caller.user_id.clone(), caller.name.clone()));
        }
    }
    out
}

/// What one member is charged by a commit: a turn's share or work they started.
struct Charge<'a> {
    member: &'a str,
    name: &'a str,
    turns: u64,
    tokens: u64,
    cost_nanos: u64,
}

/// Member day records as a chat's last commits wrote them, by [`member_key`]: read from
/// the store only when missing here.
pub(super) type KnownMembers = HashMap<String, MemberDay>;

/// The writes that add a turn's tokens and cost (`spent`, in nanodollars) to its
/// `members`, shared evenly (the first ones take the remainder), mark them `told` when the
/// turn's reply told them their budget was used up, and add what `folded` work they started
/// spent. One write per member, whatever they are charged for. `known` gives the records
/// the chat's earlier commits wrote, and gets the ones this one writes.
// One argument per fact of the turn, as `add` takes them, and the worker's known records.
#[allow(clippy::too_many_arguments)]
pub(super) fn add_members(
    store: &dyn Store,
    day: NaiveDate,
    session: &str,
    members: &[(String, String)],
    spent: Option<(&Usage, u64)>,
    told: bool,
    folded: &[Folded],
    known: &mut KnownMembers,
) -> Result<Vec<KvWrite>, StoreError> {
    let total = spent.map_or(0, |(u, _)| tokens(u));
    let count = u64::try_from(members.len()).unwrap_or(u64::MAX).max(1);
    let (share, mut rest) = (total / count, total % count);
    let cost = spent.map_or(0, |(_, nanos)| nanos);
    let (cost_share, mut cost_rest) = (cost / count, cost % count);
    let mut charges = Vec::new();
    if spent.is_some() || told {
        for (member, name) in members {
            let mut charge = Charge {
                member,
                name,
                turns: 0,
                tokens: 0,
                cost_nanos: 0,
            };
            if spent.is_some() {
                charge.turns = 1;
                charge.tokens = share + u64::from(rest > 0);
                rest = rest.saturating_sub(1);
                charge.cost_nanos = cost_share + u64::from(cost_rest > 0);
                cost_rest = cost_rest.saturating_sub(1);
            }
            charges.push(charge);
        }
    }
    for work in folded {
        if work.record.member.is_empty() {
            continue;
        }
        charges.push(Charge {
            member: &work.record.member,
            name: &work.record.name,
            turns: 0,
            tokens: tokens(&work.usage),
            cost_nanos: work.cost_nanos,
        });
    }
    let mut records: Vec<(String, MemberDay)> = Vec::new();
    for charge in charges {
        let key = member_key(day, charge.member, session);
        let at = match records.iter().position(|(k, _)| *k == key) {
            Some(at) => at,
            None => {
                // An unreadable record must not keep the turn from committing: it counts
                // afresh.
                let record = match known.get(&key) {
                    Some(record) => record.clone(),
                    None => match store.kv_get(MEMBER_USAGE_SPACE, &key) {
                        Ok(Some(json)) => serde_json::from_str(&json).unwrap_or_default(),
                        Ok(None) => MemberDay::default(),
                        Err(e) => {
                            tracing::warn!(session, error = %e, "unreadable member usage; it counts afresh");
                            MemberDay::default()
                        }
                    },
                };
                records.push((key, record));
                records.len() - 1
            }
        };
        let record = &mut records[at].1;
        record.v = 1;
        if record.name.is_empty() || charge.turns > 0 {
            charge.name.clone_into(&mut record.name);
        }
        record.turns += charge.turns;
        record.total_tokens += charge.tokens;
        record.cost_nanos += charge.cost_nanos;
        // Only the turn's own members were told; work they started tells nobody.
        record.budget_told |= told && members.iter().any(|(m, _)| m == charge.member);
    }
    records
        .into_iter()
        .map(|(key, record)| {
            let write = KvWrite {
                space: MEMBER_USAGE_SPACE.to_owned(),
                key: key.clone(),
                value: Some(
                    serde_json::to_string(&record).map_err(|e| StoreError::Io(e.to_string()))?,
                ),
                if_unchanged: None,
            };
            known.insert(key, record);
            Ok(write)
        })
        .collect()
}

/// Tokens of `usage` as the budgets count them: some providers leave the sum out.
fn tokens(usage: &Usage) -> u64 {
    usage
        .total_tokens
        .max(usage.prompt_tokens + usage.completion_tokens)
}

/// The collection of tokens spent outside the chat's worker (a background sub-agent),
/// keyed `<session>|<work id>`: written by the work when it ends, in the same transaction as
/// its final row, and folded into the chat's day (and its starter's) by the chat's next
/// commit, which deletes it. The day records keep one writer that way.
pub const PENDING_SPACE: &str = "usage_pending";

/// Tokens one piece of work spent, waiting for its chat's next commit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingSpend {
    /// Schema version (1).
    pub v: u32,
    /// Platform-qualified id of the member who started it (empty: charged to the chat
    /// only).
    #[serde(default)]
    pub member: String,
    /// Their display name.
    #[serde(default)]
    pub name: String,
    /// Tokens by the model that spent them, priced when folded in.
    pub by_model: Vec<(String, Usage)>,
}

/// The write that leaves what work `id` of `session` spent for the chat's next commit;
/// `None` when it spent nothing. `starter`: the member it is charged to, (id, name).
pub fn pending_write(
    session: &str,
    id: &str,
    starter: Option<(&str, &str)>,
    spend: &Spend,
) -> Result<Option<KvWrite>, StoreError> {
    if spend.is_empty() {
        return Ok(None);
    }
    let (member, name) = starter.unwrap_or_default();
    let record = PendingSpend {
        v: 1,
        member: member.to_owned(),
        name: name.to_owned(),
        by_model: spend.by_model().to_vec(),
    };
    Ok(Some(KvWrite {
        space: PENDING_SPACE.to_owned(),
        key: format!("{session}|{id}"),
        value: Some(serde_json::to_string(&record).map_err(|e| StoreError::Io(e.to_string()))?),
        if_unchanged: None,
    }))
}

/// One [`PendingSpend`] a commit folds in, priced.
pub(super) struct Folded {
    key: String,
    record: PendingSpend,
    usage: Usage,
    cost_nanos: u64,
}

impl Folded {
    /// The write that removes it. Unconditional: work writes its record once, so nothing
    /// can have changed it, and a refused commit would leave the chat's input unanswered.
    pub(super) fn delete(&self) -> KvWrite {
        KvWrite {
            space: PENDING_SPACE.to_owned(),
            key: self.key.clone(),
            value: None,
            if_unchanged: None,
        }
    }
}

/// What work of `session` spent and left for its next commit, priced at `prices`. An
/// unreadable record is logged and left (it never blocks a commit).
pub(super) fn pending(store: &dyn Store, session: &str, prices: &Prices) -> Vec<Folded> {
    let records = match store.kv_scan(PENDING_SPACE, &[session, "|"].concat()) {
        Ok(records) => records,
        Err(e) => {
            tracing::warn!(session, error = %e, "cannot read pending usage; it is counted later");
            return Vec::new();
        }
    };
    records
        .into_iter()
        .filter_map(|(key, json)| {
            let record: PendingSpend = serde_json::from_str(&json)
                .inspect_err(|e| tracing::warn!(key, error = %e, "unreadable pending usage left"))
                .ok()?;
            let mut spend = Spend::default();
            for (model, usage) in &record.by_model {
                spend.add(model, usage);
            }
            Some(Folded {
                key,
                usage: spend.total(),
                cost_nanos: spend.cost_nanos(prices),
                record,
            })
        })
        .collect()
}

/// The key of `session`'s record for `day`.
pub fn usage_key(day: NaiveDate, session: &str) -> String {
    let mut key = String::with_capacity(11 + session.len());
    crate::time::push_day(&mut key, day);
    key.push('|');
    key.push_str(session);
    key
}

/// Today by the system clock, for a reader without sessions (the console of a daemon whose
/// sessions are not running, tests); the sessions count by their
/// [`SessionConfig::wall_time`](super::SessionConfig::wall_time) ([`SessionManager::today`]).
///
/// [`SessionManager::today`]: super::SessionManager::today
pub fn today() -> NaiveDate {
    Utc::now().date_naive()
}

/// `session`'s usage on `day` (zero when it has none).
pub fn day_usage(store: &dyn Store, day: NaiveDate, session: &str) -> Result<DayUsage, StoreError> {
    let key = usage_key(day, session);
    match store.kv_get(USAGE_SPACE, &key)? {
        Some(json) => serde_json::from_str(&json).map_err(|e| StoreError::Corrupt {
            key: format!("{USAGE_SPACE}/{key}"),
            reason: e.to_string(),
        }),
        None => Ok(DayUsage::default()),
    }
}

/// Every chat's usage on `day`, by session key.
pub fn all_on(store: &dyn Store, day: NaiveDate) -> Result<Vec<(String, DayUsage)>, StoreError> {
    let prefix = format!("{day}|");
    let mut out = Vec::new();
    for (key, json) in store.kv_scan(USAGE_SPACE, &prefix)? {
        let Some(session) = key.strip_prefix(&prefix) else {
            continue;
        };
        // One unreadable record must not hide the others from the operator.
        match serde_json::from_str(&json) {
            Ok(usage) => out.push((session.to_owned(), usage)),
            Err(e) => tracing::warn!(key, error = %e, "unreadable usage record skipped"),
        }
    }
    Ok(out)
}

/// The write that adds tokens spent outside a turn (a compaction's summary) and their cost
/// in nanodollars to `session`'s day; the turn count stays.
pub(super) fn add_tokens(
    store: &dyn Store,
    day: NaiveDate,
    session: &str,
    usage: &Usage,
    cost_nanos: u64,
) -> Result<KvWrite, StoreError> {
    add_to(
        store,
        day,
        session,
        None,
        Some((usage, cost_nanos)),
        false,
        false,
    )
    .map(|(write, _)| write)
}

/// The write that adds one turn's tokens and cost (`spent`, in nanodollars), the budget
/// notice when `told`, and what `folded` work spent to `session`'s day, with the record it
/// writes. `known` is the day's record as the chat's last commit wrote it, when the worker
/// kept it; it is read from the store otherwise.
pub(super) fn add(
    store: &dyn Store,
    day: NaiveDate,
    session: &str,
    known: Option<DayUsage>,
    spent: Option<(&Usage, u64)>,
    told: bool,
    folded: &[Folded],
) -> Result<(KvWrite, DayUsage), StoreError> {
    if folded.is_empty() {
        return add_to(store, day, session, known, spent, told, spent.is_some());
    }
    let (mut usage, mut cost) = spent.map_or_else(Default::default, |(u, c)| (u.clone(), c));
    for work in folded {
        usage.add(&work.usage);
        cost += work.cost_nanos;
    }
    add_to(
        store,
        day,
        session,
        known,
        Some((&usage, cost)),
        told,
        spent.is_some(),
    )
}

fn add_to(
    store: &dyn Store,
    day: NaiveDate,
    session: &str,
    known: Option<DayUsage>,
    spent: Option<(&Usage, u64)>,
    told: bool,
    a_turn: bool,
) -> Result<(KvWrite, DayUsage), StoreError> {
    // An unreadable record must not keep the turn from committing: the day counts afresh.
    let mut record = match known {
        Some(record) => record,
        None => day_usage(store, day, session).unwrap_or_else(|e| {
            tracing::warn!(session, error = %e, "unreadable usage record; today's count starts over");
            DayUsage::default()
        }),
    };
    record.v = 1;
    if let Some((usage, cost_nanos)) = spent {
        record.turns += u64::from(a_turn);
        record.cost_nanos += cost_nanos;
        record.prompt_tokens += usage.prompt_tokens;
        record.completion_tokens += usage.completion_tokens;
        record.cache_read_tokens += usage.cache_read_tokens;
        record.cache_write_tokens += usage.cache_write_tokens;
        record.total_tokens += tokens(usage);
    }
    record.budget_told |= told;
    let write = KvWrite {
        space: USAGE_SPACE.to_owned(),
        key: usage_key(day, session),
        value: Some(serde_json::to_string(&record).map_err(|e| StoreError::Io(e.to_string()))?),
        if_unchanged: None,
    };
    Ok((write, record))
}

/// Where a chat stands with its daily budgets before a turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Budget {
    /// Run the turn.
    Open,
    /// The chat's is used up; `told` when the chat already heard so today.
    Spent {
        /// The notice went out earlier today.
        told: bool,
    },
    /// Every member the turn would answer has used theirs up.
    MembersSpent {
        /// Each of them was already told in this chat today.
        told: bool,
        /// Their names, for the notice.
        names: Vec<String>,
        /// The group's cap, when that (not the operator's) is what they used up.
        group_limit: Option<u64>,
    },
}

impl ChatWorker {
    /// Whether a turn of `item` may run in `session` now. A store that cannot be read lets
    /// the turn run: the budgets limit cost, they must not silence a chat over a read error.
    pub(super) fn budget(&self, session: &str, item: &super::queue::QueueItem) -> Budget {
        let store = self.manager.store().as_ref();
        let day = self.manager.now().date_naive();
        let config = self.manager.config();
        if let Some(limit) = config.daily_tokens_per_chat {
            match day_usage(store, day, session) {
                Ok(day) if day.total_tokens >= limit => {
                    return Budget::Spent {
                        told: day.budget_told,
                    };
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(session, error = %e, "cannot read today's usage; the turn runs");
                }
            }
        }
        // The group's own cap per member, counted in this chat only; the operator's, in all.
        let group_limit = self.manager.effective(session).member_daily_tokens;
        if config.daily_tokens_per_member.is_none() && group_limit.is_none() {
            return Budget::Open;
        }
        let members = members(item);
        if members.is_empty() {
            return Budget::Open;
        }
        let mut told_all = true;
        let mut by_group = false;
        for (member, _) in &members {
            let spent = member_today(store, day, member, session).and_then(|(used, told)| {
                let here = match group_limit {
                    Some(_) => member_here(store, day, member, session)?,
                    None => 0,
                };
                Ok((used, here, told))
            });
            match spent {
                Ok((used, here, told))
                    if config.daily_tokens_per_member.is_some_and(|l| used >= l)
                        || group_limit.is_some_and(|l| here >= l) =>
                {
                    by_group |= group_limit.is_some_and(|l| here >= l)
                        && config.daily_tokens_per_member.is_none_or(|l| used < l);
                    told_all &= told;
                }
                Ok(_) => return Budget::Open,
                Err(e) => {
                    tracing::warn!(session, error = %e, "cannot read a member's usage; the turn runs");
                    return Budget::Open;
                }
            }
        }
        Budget::MembersSpent {
            told: told_all,
            names: members.into_iter().map(|(_, name)| name).collect(),
            group_limit: group_limit.filter(|_| by_group),
        }
    }
}
