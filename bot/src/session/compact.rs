//! Compaction in the session layer: when, on whose word, and what is committed. The
//! summarizing itself is the agent's ([`crate::agent::compact`]).
//!
//! Three triggers, all in the chat's worker, between items, so nothing runs beside a turn:
//! - a turn whose last request (prompt + completion) reached `compact_ratio` of the
//!   model's context window: compacted right after its reply was committed;
//! - `/compact [topic]` from a chat admin (anyone in a DM): an item of the queue;
//! - an idle session about to leave memory whose older turns are worth summarizing.
//!
//! The outcome is guaranteed: a summary (one attempt and one shorter retry) replaces the
//! older turns, keeping the newest `compact_keep_turns` whole; when it fails after a
//! threshold, the history is trimmed instead, so no turn ever fails for it. Each step is
//! one commit: the dropped messages, the new summary and the chat's notice land together.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::manager::{Session, SessionConfig};
use super::queue::QueueItem;
use super::turn::Outcome;
use super::worker::ChatWorker;
use crate::agent::compact::keep_from;
use crate::agent::history::{estimate_tokens, trim_to_budget};
use crate::agent::{CompactError, SummaryInput};
use crate::lang::{Msg, say};
use crate::llm::Message;
use crate::platform::ChatRef;
use crate::store::{HistoryChange, OutboxEntry, StoreError, Summary, TurnCommit};
use crate::tool::Role;

/// What a compaction found.
enum Compaction {
    /// No turn older than the kept ones.
    Nothing { turns: usize },
    /// The first `dropped` messages are summarized into `summary`.
    Summarized {
        dropped: usize,
        summary: Summary,
        kept_turns: usize,
    },
    /// The summary failed (the reason); nothing was changed.
    Failed(String),
    /// Stopped by `/stop` or shutdown.
    Cancelled,
}

/// When a chat's context is full enough to compact, sized against what is left after the
/// fixed part of every request (the system prompt and the tools' schemas): with a small
/// window that part alone may be most of it, and a threshold on the whole request would
/// then summarize after nearly every turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Threshold {
    /// Tokens of a whole request at which to compact.
    pub(super) at: usize,
    /// The estimated fixed part of every request.
    pub(super) fixed: usize,
    /// Turns a compaction keeps: a history of no more turns is never summarized again.
    pub(super) keep_turns: usize,
}

impl Threshold {
    /// The tokens the conversation itself may take before a compaction.
    pub(super) fn conversation(&self) -> usize {
        self.at.saturating_sub(self.fixed)
    }
}

/// The compaction threshold of `config` with a fixed part of `fixed` tokens: the fixed
/// part plus `compact_ratio` of the room the window leaves after it; `None` when
/// compaction is off.
pub(super) fn compact_threshold(config: &SessionConfig, fixed: usize) -> Option<Threshold> {
    if config.compact_ratio <= 0.0 || config.context_window == 0 {
        return None;
    }
    let room = config.context_window.saturating_sub(fixed);
    // The ratio is checked at load (0 < ratio ≤ 1) and the window is a token count.
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let conversation = (room as f64 * config.compact_ratio) as usize;
    Some(Threshold {
        at: fixed + conversation,
        fixed,
        keep_turns: config.compact_keep_turns,
    })
}

/// Whether a turn left the model's context full enough to compact: the provider's count
/// of its last request when it sent one, else the fixed part and the estimate of the
/// history, reaching the threshold. A history of no more turns than a compaction keeps is
/// never full: a chat is not summarized twice without new turns in between.
pub(super) fn context_full(
    threshold: Option<Threshold>,
    reported: Option<u64>,
    history: &[Message],
) -> bool {
    let Some(threshold) = threshold else {
        return false;
    };
    if crate::agent::history::turn_starts(history).len() <= threshold.keep_turns {
        return false;
    }
    let used = match reported {
        Some(tokens) => usize::try_from(tokens).unwrap_or(usize::MAX),
        None => threshold.fixed + history.iter().map(estimate_tokens).sum::<usize>(),
    };
    used >= threshold.at
}

impl ChatWorker {
    /// The compaction threshold; `None` when compaction is off.
    fn compact_threshold(&self) -> Option<Threshold> {
        compact_threshold(
            self.manager.config(),
            self.manager.template().prompt_size().total(),
        )
    }

    /// Summarizes the older turns of `session`; changes nothing.
    async fn summarize_older(
        &self,
        session: &Session,
        topic: Option<&str>,
        cancel: &CancellationToken,
    ) -> Result<Compaction, StoreError> {
        let store = self.manager.store();
        let history = store.load_history(session.key())?;
        let previous = store.load_summary(session.key())?;
        // The kept turns may take at most half the threshold, so that a compaction always
        // leaves room before the next one.
        let keep_tokens = self
            .compact_threshold()
            .map_or(usize::MAX, |t| t.conversation() / 2);
        let from = keep_from(
            &history,
            self.manager.config().compact_keep_turns,
            keep_tokens,
        );
        let turns_in = |messages: &[Message]| crate::agent::history::turn_starts(messages).len();
        if from == 0 {
            return Ok(Compaction::Nothing {
                turns: turns_in(&history),
            });
        }
        let input = SummaryInput {
            session: session.key(),
            previous: previous.as_ref().map(|s| s.text.as_str()),
            older: &history[..from],
            topic,
        };
        let mut spent = crate::llm::Spend::default();
        let summarized = session.agent().summarize(input, &mut spent, cancel).await;
        self.count_summary_tokens(session.key(), &spent);
        match summarized {
            Ok(text) => Ok(Compaction::Summarized {
                dropped: from,
                summary: Summary {
                    text,
                    made: self.manager.now(),
                    messages: previous.map_or(0, |s| s.messages) + from,
                },
                kept_turns: turns_in(&history[from..]),
            }),
            Err(CompactError::Cancelled) => Ok(Compaction::Cancelled),
            Err(e) => Ok(Compaction::Failed(e.to_string())),
        }
    }

    /// Counts a summary's tokens (spent, whether or not it came back) in the chat's day. Its
    /// own write: the tokens are spent even if the compaction is never committed.
    fn count_summary_tokens(&self, session: &str, spent: &crate::llm::Spend) {
        let usage = spent.total();
        if usage.prompt_tokens + usage.completion_tokens + usage.total_tokens == 0 {
            return;
        }
        let store = self.manager.store().as_ref();
        let cost = spent.cost_nanos(&self.manager.config().prices);
        // The day's usage the worker kept from its last commit is behind from here on.
        self.usage_aside
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let written = super::usage::add_tokens(
            store,
            self.manager.now().date_naive(),
            session,
            &usage,
            cost,
        )
        .and_then(|write| {
            // Counted only by the chat's holder (cluster mode), like everything it commits.
            let fence = self
                .manager
                .dispatcher()
                .fence(&self.manager, session)
                .map_err(|_| {
                    crate::store::StoreError::Changed(format!("the lease of {session}"))
                })?;
            store.kv_write(std::iter::once(write).chain(fence).collect())
        });
        if let Err(e) = written {
            tracing::warn!(session, error = %e, "cannot count the summary's tokens");
        }
    }

    /// `/compact [topic]`: a chat admin (anyone in a DM) has the older turns summarized now.
    pub(super) async fn compact_command(
        &self,
        session: &Session,
        item: &QueueItem,
        cancel: &CancellationToken,
    ) -> Option<Outcome> {
        let lang = self.manager.effective(session.key()).language;
        if !item.private && item.caller().role < Role::ChatAdmin {
            return Some(Outcome {
                reply: Some(say(lang, Msg::CompactNotAdmin, &[])),
                ..Outcome::default()
            });
        }
        let topic = item.lines.join(" ");
        let topic = Some(topic.trim()).filter(|t| !t.is_empty());
        let found = match self.summarize_older(session, topic, cancel).await {
            Ok(found) => found,
            Err(e) => {
                tracing::error!(session = %session.key(), error = %e, "cannot read the history to compact it");
                return Some(Outcome {
                    reply: Some(say(lang, Msg::CompactUnreadable, &[])),
                    ..Outcome::default()
                });
            }
        };
        let reply = match found {
            Compaction::Cancelled if self.manager.abort().is_cancelled() => return None,
            Compaction::Cancelled => say(lang, Msg::CompactStopped, &[]),
            Compaction::Nothing { turns } => say(
                lang,
                Msg::CompactNothing,
                &[
                    ("turns", &turns.to_string()),
                    (
                        "keep",
                        &self.manager.config().compact_keep_turns.to_string(),
                    ),
                ],
            ),
            Compaction::Failed(reason) => {
                tracing::warn!(session = %session.key(), %reason, "/compact: no summary");
                say(lang, Msg::CompactFailed, &[])
            }
            Compaction::Summarized {
                dropped,
                summary,
                kept_turns,
            } => {
                tracing::info!(session = %session.key(), dropped, chars = summary.text.len(), "compacted on /compact");
                let reply = say(
                    lang,
                    Msg::CompactDone,
                    &[
                        ("dropped", &dropped.to_string()),
                        (
                            "tokens",
                            &estimate_tokens(&Message::system(&summary.text)).to_string(),
                        ),
                        ("kept", &kept_turns.to_string()),
                    ],
                );
                return Some(Outcome {
                    history: Some(HistoryChange::Append {
                        dropped,
                        messages: Vec::new(),
                    }),
                    reply: Some(reply),
                    summary: Some(summary),
                    ..Outcome::default()
                });
            }
        };
        Some(Outcome {
            reply: Some(reply),
            ..Outcome::default()
        })
    }

    /// After a turn that filled the context past the threshold: summarize, or trim when the
    /// summary fails; the chat is told once (unless not `tell`), in the same commit.
    pub(super) async fn compact_after_turn(
        &self,
        session: &Arc<Session>,
        chat: &ChatRef,
        tell: bool,
    ) {
        let cancel = self.manager.abort().child_token();
        // `/stop` and `/status` see the compaction as the chat's current work.
        session.compacting(&cancel);
        let lang = self.manager.effective(session.key()).language;
        let found = self.summarize_older(session, None, &cancel).await;
        session.item_ended();
        let (history, summary, notice) = match found {
            Ok(Compaction::Summarized {
                dropped, summary, ..
            }) => {
                tracing::info!(session = %session.key(), dropped, chars = summary.text.len(), "compacted at the threshold");
                (
                    dropped,
                    Some(summary),
                    say(lang, Msg::CompactedAtThreshold, &[]),
                )
            }
            Ok(Compaction::Failed(reason)) => {
                tracing::warn!(session = %session.key(), %reason, "compaction failed; trimming instead");
                let Some(dropped) = self.trim_for_room(session) else {
                    return;
                };
                (dropped, None, say(lang, Msg::TrimmedAtThreshold, &[]))
            }
            // Nothing older than the kept turns: the per-turn trim is what keeps the
            // requests within the context then.
            Ok(Compaction::Nothing { .. } | Compaction::Cancelled) => return,
            Err(e) => {
                tracing::error!(session = %session.key(), error = %e, "cannot read the history to compact it");
                return;
            }
        };
        let reply =
            tell.then(|| OutboxEntry::new(session.key(), chat, notice, None, self.manager.now()));
        self.commit_compaction(session, history, summary, reply)
            .await;
    }

    /// Before an idle session leaves memory: its older turns are summarized when they are
    /// worth it (more than the kept turns, and at least a quarter of the threshold), so the
    /// next turn starts small. Silent: nobody asked, and a notice would wake an idle group;
    /// `/status` shows the summary. A failure changes nothing.
    pub(super) async fn compact_before_eviction(&self, session: &Arc<Session>) {
        let Some(threshold) = self.compact_threshold().map(|t| t.conversation()) else {
            return;
        };
        let worth = match self.manager.store().load_history(session.key()) {
            Ok(history) => {
                let tokens: usize = history.iter().map(estimate_tokens).sum();
                tokens >= threshold / 4
                    && keep_from(
                        &history,
                        self.manager.config().compact_keep_turns,
                        threshold / 2,
                    ) > 0
            }
            Err(_) => false,
        };
        if !worth {
            return;
        }
        let cancel = self.manager.abort().child_token();
        session.compacting(&cancel);
        let found = self.summarize_older(session, None, &cancel).await;
        session.item_ended();
        match found {
            Ok(Compaction::Summarized {
                dropped, summary, ..
            }) => {
                tracing::info!(session = %session.key(), dropped, chars = summary.text.len(), "compacted before leaving memory");
                self.commit_compaction(session, dropped, Some(summary), None)
                    .await;
            }
            Ok(Compaction::Failed(reason)) => {
                tracing::warn!(session = %session.key(), %reason, "compaction before leaving memory failed; the history stays");
            }
            Ok(Compaction::Nothing { .. } | Compaction::Cancelled) => {}
            Err(e) => {
                tracing::error!(session = %session.key(), error = %e, "cannot read the history to compact it");
            }
        }
    }

    /// How many of the oldest messages to drop so the history is down to half the
    /// threshold (whole turns; the newest one always stays); `None` when none would go.
    fn trim_for_room(&self, session: &Session) -> Option<usize> {
        let budget = self.compact_threshold()?.conversation() / 2;
        let mut history = self.manager.store().load_history(session.key()).ok()?;
        let before = history.len();
        trim_to_budget(&mut history, budget);
        Some(before - history.len()).filter(|&n| n > 0)
    }

    /// Drops the oldest `dropped` messages, stores `summary` and queues `reply`, in one
    /// transaction, waited durable; then hands the reply to the outbox lane.
    async fn commit_compaction(
        &self,
        session: &Session,
        dropped: usize,
        summary: Option<Summary>,
        reply: Option<OutboxEntry>,
    ) {
        let Ok(fence) = self
            .manager
            .dispatcher()
            .fence(&self.manager, session.key())
        else {
            tracing::info!(session = %session.key(), "the chat went to another instance; the compaction is dropped");
            return;
        };
        let commit = TurnCommit {
            session: session.key().to_owned(),
            history: Some(HistoryChange::Append {
                dropped,
                messages: Vec::new(),
            }),
            answered: Vec::new(),
            reply: reply.clone(),
            summary,
            also: fence.into_iter().collect(),
        };
        let committed = match self.manager.store().commit_turn(commit) {
            Ok(id) => self.manager.durable().await.map(|()| id),
            Err(e) => Err(e),
        };
        session.history_changed();
        match (committed, reply) {
            (Ok(Some(id)), Some(mut entry)) => {
                entry.id = id;
                self.manager.enqueue_reply(entry, Vec::new());
            }
            (Ok(_), _) => {}
            (Err(e), _) => {
                tracing::error!(session = %session.key(), error = %e, "cannot commit the compaction; the history stays");
            }
        }
    }
}
