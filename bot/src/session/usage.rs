//! Tokens per chat per day (`usage` collection): what `/status` and the operator's console
//! show, and what the optional daily budget (`SessionConfig::daily_tokens_per_chat`) is
//! checked against. A day's record is rewritten by each turn's commit, in the same
//! transaction (docs/contract.md, "Storage"): a kill never counts a turn without its
//! history, nor the reverse. Only the chat's worker writes its records, one turn at a time,
//! so reading, adding and writing back needs no lock. Days are UTC days.

use chrono::{NaiveDate, Utc};
use serde::{Deserialize, Serialize};

use super::worker::ChatWorker;
use crate::llm::Usage;
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
}

/// The key of `session`'s record for `day`.
pub fn usage_key(day: NaiveDate, session: &str) -> String {
    format!("{day}|{session}")
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

/// The write that adds tokens spent outside a turn (a compaction's summary) to `session`'s
/// day; the turn count stays.
pub(super) fn add_tokens(
    store: &dyn Store,
    day: NaiveDate,
    session: &str,
    usage: &Usage,
) -> Result<KvWrite, StoreError> {
    add_to(store, day, session, Some(usage), false, false)
}

/// The write that adds one turn's `usage` (and the budget notice, when `told`) to
/// `session`'s day.
pub(super) fn add(
    store: &dyn Store,
    day: NaiveDate,
    session: &str,
    usage: Option<&Usage>,
    told: bool,
) -> Result<KvWrite, StoreError> {
    add_to(store, day, session, usage, told, true)
}

fn add_to(
    store: &dyn Store,
    day: NaiveDate,
    session: &str,
    usage: Option<&Usage>,
    told: bool,
    a_turn: bool,
) -> Result<KvWrite, StoreError> {
    // An unreadable record must not keep the turn from committing: the day counts afresh.
    let mut record = day_usage(store, day, session).unwrap_or_else(|e| {
        tracing::warn!(session, error = %e, "unreadable usage record; today's count starts over");
        DayUsage::default()
    });
    record.v = 1;
    if let Some(usage) = usage {
        record.turns += u64::from(a_turn);
        record.prompt_tokens += usage.prompt_tokens;
        record.completion_tokens += usage.completion_tokens;
        // Some providers leave the sum out.
        record.total_tokens += usage
            .total_tokens
            .max(usage.prompt_tokens + usage.completion_tokens);
    }
    record.budget_told |= told;
    Ok(KvWrite {
        space: USAGE_SPACE.to_owned(),
        key: usage_key(day, session),
        value: Some(serde_json::to_string(&record).map_err(|e| StoreError::Io(e.to_string()))?),
        if_unchanged: None,
    })
}

/// Where a chat stands with its daily budget before a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Budget {
    /// Run the turn.
    Open,
    /// Used up; `told` when the chat already heard so today.
    Spent {
        /// The notice went out earlier today.
        told: bool,
    },
}

impl ChatWorker {
    /// Whether `session` may run a turn now. A store that cannot be read lets the turn run:
    /// the budget limits cost, it must not silence a chat over a read error.
    pub(super) fn budget(&self, session: &str) -> Budget {
        let Some(limit) = self.manager.config().daily_tokens_per_chat else {
            return Budget::Open;
        };
        match day_usage(
            self.manager.store().as_ref(),
            self.manager.now().date_naive(),
            session,
        ) {
            Ok(day) if day.total_tokens >= limit => Budget::Spent {
                told: day.budget_told,
            },
            Ok(_) => Budget::Open,
            Err(e) => {
                tracing::warn!(session, error = %e, "cannot read today's usage; the turn runs");
                Budget::Open
            }
        }
    }
}
