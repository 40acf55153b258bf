//! The trace of a turn, for the operator's console: its input, each model request's tool
//! calls (arguments, result code), the reply and its outbox id (whose record holds the
//! platform's message ids once sent), tokens and timings. Built from what the turn already
//! has (its messages and usage) and written with the turn's commit, in the same transaction
//! as its history and its day's usage ([`SessionManager::turn_records`]). Each chat keeps
//! its last [`KEEP_TRACES`]: a ring of records `<session>|<seq>` in the `traces`
//! collection, with a head record per chat (`trace_heads`) naming the next `seq`, so a
//! commit reads one small record and deletes the one that falls off the ring.

use chrono::{DateTime, NaiveDate, Utc};
use serde::{Deserialize, Serialize};

use super::queue::QueueItem;
use super::turn::Told;
use super::usage;
use super::worker::ChatWorker;
use crate::agent::{Turn, TurnEnd};
use crate::llm::{Content, ContentPart, Message, Prices, Usage};
use crate::store::{KvWrite, OutboxEntry, Store, StoreError};
use crate::text::ellipsize;

/// The collection of traces, keyed `<session>|<seq, 20 digits>`.
pub const TRACE_SPACE: &str = "traces";
/// One record per chat with a trace: [`TraceHead`].
pub const HEAD_SPACE: &str = "trace_heads";
/// Traces kept per chat.
pub const KEEP_TRACES: u64 = 50;
/// Longest text kept of an input, a reply, a tool's arguments or result (characters).
const MAX_TEXT: usize = 2000;

/// What a turn did, taken from it before its messages go to the history.
#[derive(Debug, Clone, Default)]
pub(super) struct TurnFacts {
    /// Tokens of every request.
    pub usage: Usage,
    /// What they cost at `[llm.prices]`, in nanodollars.
    pub cost_nanos: u64,
    /// The turn's new messages (input, assistant, tool).
    pub messages: Vec<Message>,
    /// How it ended; `None` when the model failed.
    pub end: Option<TurnEnd>,
    /// The error, when the model failed.
    pub error: Option<String>,
    /// The model that answered.
    pub model: Option<String>,
}

impl TurnFacts {
    /// The facts of a turn that ran, its cost at `prices`.
    pub(super) fn of(turn: &Turn, prices: &Prices) -> Self {
        TurnFacts {
            usage: turn.usage.clone(),
            cost_nanos: turn.spend.cost_nanos(prices),
            messages: turn.messages.clone(),
            end: Some(turn.end),
            error: None,
            model: turn.model.clone(),
        }
    }

    /// The facts of a turn the model failed.
    pub(super) fn failed(error: &str) -> Self {
        TurnFacts {
            error: Some(error.to_owned()),
            ..TurnFacts::default()
        }
    }
}

/// What a chat's commit wrote of its trace head and its day's usage, kept by its worker so
/// that the next turn need not read them back: only the chat's worker writes them
/// ([`usage`]'s module docs), and a compaction's tokens, counted apart, drop them. Not kept
/// with several instances, where another may answer the chat in between.
#[derive(Debug, Clone)]
pub(super) struct Kept {
    day: NaiveDate,
    usage: usage::DayUsage,
    head: TraceHead,
    /// The day's member records the chat's commits wrote, by key: the chat's worker is
    /// also their only writer. Bounded by the members it answered that day.
    members: usage::KnownMembers,
}

/// Where a chat's ring stands.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceHead {
    /// Schema version (1).
    pub v: u32,
    /// The next trace's sequence number.
    pub next: u64,
    /// When the last traced turn ended.
    #[serde(serialize_with = "crate::time::rfc3339::serialize_option")]
    pub last: Option<DateTime<Utc>>,
}

/// One tool call of a model request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallTrace {
    /// The tool's wire name.
    pub name: String,
    /// The arguments as the model wrote them (capped).
    pub arguments: String,
    /// `ok`, the result's `error_code`, or `none` when no result came back.
    pub code: String,
    /// The result's `message` (capped).
    pub message: String,
}

/// One model request: the text it answered with and the tools it called.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestTrace {
    /// Text the model wrote alongside (or instead of) tool calls (capped).
    pub text: String,
    /// Its tool calls, in order.
    pub calls: Vec<CallTrace>,
}

/// One turn, as the console shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnTrace {
    /// Schema version (1).
    pub v: u32,
    /// Position in the chat's ring.
    pub seq: u64,
    /// The input (capped), attributed lines as the model saw them.
    pub input: String,
    /// Who wrote it.
    pub callers: Vec<String>,
    /// `user_message`, `clock_fire`, `task_result`.
    pub kind: String,
    /// Each model request that asked for tools, then the last one's answer.
    pub requests: Vec<RequestTrace>,
    /// The reply (capped), if one was sent.
    pub reply: Option<String>,
    /// The reply's outbox id: [`Store::sent_reply`] has its platform message ids.
    pub outbox_id: Option<u64>,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Completion tokens.
    pub completion_tokens: u64,
    /// What the turn cost at `[llm.prices]`, in nanodollars (0 without prices).
    #[serde(default)]
    pub cost_nanos: u64,
    /// How it ended (`answered`, `cancelled`, ..., `model_failed`).
    pub end: String,
    /// The model's error, when it failed (first line).
    pub error: Option<String>,
    /// When the turn started.
    #[serde(serialize_with = "crate::time::rfc3339::serialize")]
    pub started: DateTime<Utc>,
    /// How long it ran.
    pub millis: u64,
    /// The model that answered (a fallback's, when the primary failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// `<session>|<seq, 20 digits>`, built by hand: `format!` with padding costs several times
/// the pushes, and a turn makes two of these keys.
fn trace_key(session: &str, seq: u64) -> String {
    // u64::MAX has 20 digits, so the padded number always fits.
    let mut digits = [b'0'; 20];
    let mut rest = seq;
    for digit in digits.iter_mut().rev() {
        *digit = b'0' + (rest % 10) as u8;
        rest /= 10;
    }
    let mut key = String::with_capacity(session.len() + 21);
    key.push_str(session);
    key.push('|');
    key.extend(digits.iter().map(|&d| char::from(d)));
    key
}

fn cap(text: &str) -> String {
    ellipsize(text, MAX_TEXT).into_owned()
}

fn end_name(end: Option<TurnEnd>) -> &'static str {
    match end {
        Some(TurnEnd::Answered) => "answered",
        Some(TurnEnd::IterationLimit) => "iteration_limit",
        Some(TurnEnd::Cancelled) => "cancelled",
        Some(TurnEnd::RepeatedToolCall) => "repeated_tool_call",
        None => "model_failed",
    }
}

/// The model requests of a turn's messages: each assistant message, with its calls matched
/// to their tool messages by id.
fn requests(messages: &[Message]) -> Vec<RequestTrace> {
    let result_of = |id: &str| {
        messages.iter().find_map(|m| match m {
            Message::Tool {
                tool_call_id,
                content,
            } if tool_call_id == id => Some(content.as_str()),
            _ => None,
        })
    };
    messages
        .iter()
        .filter_map(|m| match m {
            Message::Assistant {
                content,
                tool_calls,
                ..
            } => Some(RequestTrace {
                text: cap(content.as_deref().unwrap_or("")),
                calls: tool_calls
                    .iter()
                    .map(|call| {
                        let (code, message) = match result_of(&call.id) {
                            Some(json) => result_code(json),
                            None => ("none".to_owned(), String::new()),
                        };
                        CallTrace {
                            name: call.function.name.clone(),
                            arguments: cap(&call.function.arguments),
                            code,
                            message: cap(&message),
                        }
                    })
                    .collect(),
            }),
            _ => None,
        })
        .collect()
}

/// A tool message's code and message (docs/contract.md, "Tool results").
fn result_code(json: &str) -> (String, String) {
    #[derive(Deserialize)]
    struct Result {
        success: bool,
        #[serde(default)]
        error_code: Option<String>,
        #[serde(default)]
        message: String,
    }
    match serde_json::from_str::<Result>(json) {
        Ok(r) if r.success => ("ok".to_owned(), r.message),
        Ok(r) => (
            r.error_code.unwrap_or_else(|| "error".to_owned()),
            r.message,
        ),
        // A toolset answering something else than the contract: shown as it is.
        Err(_) => ("unreadable".to_owned(), json.to_owned()),
    }
}

/// The text of a user message.
fn user_text(message: &Message) -> Option<String> {
    match message {
        Message::User {
            content: Content::Text(text),
        } => Some(text.clone()),
        Message::User {
            content: Content::Parts(parts),
        } => Some(
            parts
                .iter()
                .map(|p| match p {
                    ContentPart::Text { text } => text.clone(),
                    _ => "[image]".to_owned(),
                })
                .collect::<Vec<_>>()
                .join(" "),
        ),
        _ => None,
    }
}

fn encode<T: Serialize>(value: &T) -> Result<String, StoreError> {
    // A turn's trace is a few hundred bytes: room for it at once, where `to_string` starts
    // at 128 bytes and grows the buffer three times.
    let mut out = Vec::with_capacity(1024);
    serde_json::to_writer(&mut out, value).map_err(|e| StoreError::Io(e.to_string()))?;
    String::from_utf8(out).map_err(|e| StoreError::Io(e.to_string()))
}

/// `session`'s ring head.
pub fn head(store: &dyn Store, session: &str) -> Result<TraceHead, StoreError> {
    match store.kv_get(HEAD_SPACE, session)? {
        Some(json) => serde_json::from_str(&json).map_err(|e| StoreError::Corrupt {
            key: format!("{HEAD_SPACE}/{session}"),
            reason: e.to_string(),
        }),
        None => Ok(TraceHead::default()),
    }
}

/// Every chat with a trace, with its head, in key order.
pub fn heads(store: &dyn Store) -> Result<Vec<(String, TraceHead)>, StoreError> {
    Ok(store
        .kv_scan(HEAD_SPACE, "")?
        .into_iter()
        .filter_map(|(session, json)| Some((session, serde_json::from_str(&json).ok()?)))
        .collect())
}

/// `session`'s kept traces, newest first.
pub fn recent(store: &dyn Store, session: &str) -> Result<Vec<TurnTrace>, StoreError> {
    let mut traces: Vec<TurnTrace> = store
        .kv_scan(TRACE_SPACE, &format!("{session}|"))?
        .into_iter()
        .filter_map(|(_, json)| serde_json::from_str(&json).ok())
        .collect();
    traces.reverse();
    Ok(traces)
}

impl ChatWorker {
    /// The records a turn commits besides its history: its day's usage and (for a turn that
    /// asked the model) its trace. Reserves the reply's outbox id so the trace can name it.
    /// `budget_told`: who the reply told their budget is used up.
    pub(super) fn turn_records(
        &mut self,
        session: &str,
        item: &QueueItem,
        facts: Option<&TurnFacts>,
        budget_told: Told,
        started: DateTime<Utc>,
        reply: Option<&mut OutboxEntry>,
    ) -> Result<(Vec<KvWrite>, Option<Kept>), StoreError> {
        // Taken: the caller puts back what is returned only if the commit lands. Kept only
        // while nothing else wrote the day's usage.
        let kept = self.kept.take().filter(|_| {
            !self
                .usage_aside
                .swap(false, std::sync::atomic::Ordering::SeqCst)
        });
        let store = self.manager.store().as_ref();
        let mut writes = Vec::new();
        // What background work spent is counted by the chat's next commit of any kind.
        let folded = usage::pending(store, session, &self.manager.config().prices);
        if facts.is_none() && budget_told == Told::Nobody && folded.is_empty() {
            return Ok((writes, kept));
        }
        let day = self.manager.now().date_naive();
        let (known_usage, known_head, mut known_members) = match kept {
            Some(kept) if kept.day == day => (Some(kept.usage), Some(kept.head), kept.members),
            Some(kept) => (None, Some(kept.head), usage::KnownMembers::default()),
            None => (None, None, usage::KnownMembers::default()),
        };
        let usage = facts.map(|f| (&f.usage, f.cost_nanos));
        let (write, day_usage) = usage::add(
            store,
            day,
            session,
            known_usage,
            usage,
            budget_told == Told::Chat,
            &folded,
        )?;
        writes.push(write);
        writes.extend(usage::add_members(
            store,
            day,
            session,
            &usage::members(item),
            usage,
            budget_told == Told::Members,
            &folded,
            &mut known_members,
        )?);
        writes.extend(folded.iter().map(usage::Folded::delete));
        let Some(facts) = facts else {
            return Ok((
                writes,
                known_head.map(|head| Kept {
                    day,
                    usage: day_usage,
                    head,
                    members: known_members,
                }),
            ));
        };
        let (outbox_id, reply_text) = match reply {
            Some(entry) => {
                entry.id = store.reserve_id()?;
                (Some(entry.id), Some(cap(&entry.text)))
            }
            None => (None, None),
        };
        // An unreadable head must not keep the turn from committing: the ring restarts.
        let mut head = match known_head {
            Some(head) => head,
            None => head(store, session).unwrap_or_else(|e| {
                tracing::warn!(session, error = %e, "unreadable trace head; the chat's traces start over");
                TraceHead::default()
            }),
        };
        let seq = head.next;
        let now = self.manager.now();
        let trace = TurnTrace {
            v: 1,
            seq,
            input: cap(&facts
                .messages
                .first()
                .and_then(user_text)
                .unwrap_or_else(|| item.text())),
            callers: item.callers.iter().map(|c| c.name.clone()).collect(),
            kind: item.kind.name().to_owned(),
            requests: requests(&facts.messages),
            reply: reply_text,
            outbox_id,
            prompt_tokens: facts.usage.prompt_tokens,
            completion_tokens: facts.usage.completion_tokens,
            cost_nanos: facts.cost_nanos,
            end: end_name(facts.end).to_owned(),
            error: facts.error.clone(),
            started,
            millis: u64::try_from((now - started).num_milliseconds()).unwrap_or(0),
            model: facts.model.clone(),
        };
        writes.push(KvWrite {
            space: TRACE_SPACE.to_owned(),
            key: trace_key(session, seq),
            value: Some(encode(&trace)?),
            if_unchanged: None,
        });
        if let Some(old) = seq.checked_sub(KEEP_TRACES) {
            writes.push(KvWrite {
                space: TRACE_SPACE.to_owned(),
                key: trace_key(session, old),
                value: None,
                if_unchanged: None,
            });
        }
        head.v = 1;
        head.next = seq + 1;
        head.last = Some(now);
        writes.push(KvWrite {
            space: HEAD_SPACE.to_owned(),
            key: session.to_owned(),
            value: Some(encode(&head)?),
            if_unchanged: None,
        });
        Ok((
            writes,
            Some(Kept {
                day,
                usage: day_usage,
                head,
                members: known_members,
            }),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_keys_pad_the_sequence_to_twenty_digits() {
        for seq in [0, 7, 50, 12_345, u64::MAX] {
            assert_eq!(trace_key("tg:1", seq), format!("tg:1|{seq:020}"));
        }
    }
}
