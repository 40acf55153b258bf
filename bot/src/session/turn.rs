//! One queued item, carried out by the chat's worker: a turn of the agent (input content,
//! typing indicator, the agent loop, history trim), or `/reset`. Either ends in an
//! [`Outcome`] that writes nothing; [`super::commit`] writes it in one transaction and
//! hands the reply to the chat's outbox lane.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::commit::Finished;
use super::input::Action;
use super::manager::{Session, SessionManager};
use super::queue::QueueItem;
use super::trace::TurnFacts;
use super::usage::Budget;
use super::worker::ChatWorker;
use crate::agent::history::trim_to_budget;
use crate::agent::{AgentError, Turn, TurnEnd, TurnInput, strip_image_data};
use crate::lang::{Lang, Msg, say};
use crate::llm::{Content, ContentPart, LlmError, Message};
use crate::store::{HistoryChange, Summary};
use crate::tool::{Role, RoleResolver};

/// What a turn wants committed.
#[derive(Default)]
pub(super) struct Outcome {
    pub(super) history: Option<HistoryChange>,
    pub(super) reply: Option<String>,
    /// The reason, when the reply is the "could not reach the model" notice.
    pub(super) model_failed: Option<String>,
    /// The session's new summary, committed with the history change that drops what it
    /// stands for.
    pub(super) summary: Option<Summary>,
    /// The turn filled the model's context past `compact_ratio`: compact after committing.
    pub(super) compact_due: bool,
    /// What the model did, for the day's usage and the trace; `None` when it was not asked.
    pub(super) facts: Option<TurnFacts>,
    /// The reply is today's budget notice (`usage.rs`): the chat's, or its members'.
    pub(super) budget_told: Told,
    /// The whole history once `history` is committed, kept for the next turn; `None`
    /// when there is none to keep (the next turn reads the store).
    pub(super) history_after: Option<Vec<Message>>,
    /// Further records the item's commit writes (a group setting and its log entry).
    pub(super) also: Vec<crate::store::KvWrite>,
}

/// What [`run`] needs, named: a turn runs over these and nothing else (no manager), so it
/// can be run and tested on its own.
pub(super) struct TurnDeps<'a> {
    pub(super) store: &'a dyn crate::store::Store,
    pub(super) agent: &'a crate::agent::Agent,
    /// The session key.
    pub(super) session: &'a str,
    /// The chat's platform, for the typing indicator and the tools.
    pub(super) platform: Option<Arc<dyn crate::platform::Platform>>,
    pub(super) roles: Arc<dyn RoleResolver>,
    /// How `send_markdown` posts: the chat's outbox lane.
    pub(super) post: Arc<dyn crate::tool::Post>,
    /// Set for an auto-chat turn: how `send_message` speaks.
    pub(super) auto_chat: Option<Arc<dyn crate::tool::AutoChatSpeech>>,
    /// The history budget in estimated tokens.
    pub(super) history_tokens: usize,
    /// The compaction threshold; `None`: compaction is off.
    pub(super) compact_at: Option<super::compact::Threshold>,
    /// Cancelled when the grace period of a shutdown is over.
    pub(super) shutdown: &'a CancellationToken,
    /// `[llm.prices]`, to cost the turn.
    pub(super) prices: &'a crate::llm::Prices,
    /// The chat's settings: its toolsets, persona and language ([`super::settings`]).
    pub(super) settings: &'a super::settings::Effective,
    /// Who is asked when a tool needs approval.
    pub(super) approver: Option<Arc<dyn crate::tool::approval::Approver>>,
}

impl ChatWorker {
    /// Runs one item and hands what it left to the commit stage ([`super::commit`]).
    pub(super) async fn run_item(&mut self, session: &Arc<Session>, item: QueueItem) {
        let cancel = self.manager.abort().child_token();
        let started = self.manager.now();
        // Before the turn reads the history: a change to it from here on is not in what
        // the turn commits on top of.
        let changes_before = session.item_started(&cancel, started, item.text());
        let ids = item.pending_ids.clone();
        let cluster = self.manager.config().cluster.is_some();
        if cluster {
            session.handled().took(&ids);
        }
        self.run_started(session, item, cancel, started, changes_before)
            .await;
        if cluster {
            session.handled().ended(&ids);
        }
    }

    /// The rest of [`ChatWorker::run_item`], once the item is marked started.
    async fn run_started(
        &mut self,
        session: &Arc<Session>,
        mut item: QueueItem,
        cancel: tokio_util::sync::CancellationToken,
        started: chrono::DateTime<chrono::Utc>,
        changes_before: u64,
    ) {
        // Dropped unanswered wherever the turn is abandoned: its submitter learns that.
        let done = std::mem::take(&mut item.done);
        self.mark_started(&item).await;
        let rules = item.kind.rules();
        // Only a refused turn says something here; reading the settings is left to it.
        let lang = || self.manager.effective(session.key()).language;
        let outcome = match rules.action {
            Action::Reset => self.reset(session, &item).await,
            Action::Compact => self.compact_command(session, &item, &cancel).await,
            Action::Settings => Some(self.set_setting(session, &item)),
            Action::ChatCommand => Some(self.chat_command(session, &item)),
            Action::Turn => match self.budget(session.key(), &item) {
                Budget::Spent { told } => Some(over_budget(told, lang())),
                Budget::MembersSpent {
                    told,
                    names,
                    group_limit,
                } => Some(members_over_budget(told, &names, lang(), group_limit)),
                Budget::Open => self.turn(session, &item, &cancel).await,
            },
        };
        session.item_ended();
        let Some(outcome) = outcome else {
            if !self
                .manager
                .dispatcher()
                .holds(&self.manager, session.key())
            {
                // The chat moved to another daemon, which runs the input.
                for waiter in done {
                    let _ = waiter.send(super::queue::ScheduledOutcome::Elsewhere);
                }
            }
            // Abandoned (shutdown, store failure): the input stays pending; the waiter is
            // dropped and its submitter sees the turn cancelled. Not the input's fault.
            if !item.images.is_empty() {
                self.unmark_started(&item.pending_ids);
            }
            return;
        };
        self.commit(
            session,
            Finished {
                item,
                done,
                outcome,
                started,
                changes_before,
            },
        )
        .await;
    }

    /// `/reset`: a chat admin (anyone in a DM) clears the conversation, the queue and the
    /// toolsets' session state; memory stays. Runs between turns, so nothing is half done.
    async fn reset(&self, session: &Session, item: &QueueItem) -> Option<Outcome> {
        let caller = item.caller();
        let lang = self.manager.effective(session.key()).language;
        if !item.private && caller.role < Role::ChatAdmin {
            return Some(Outcome {
                reply: Some(say(lang, Msg::ResetNotAdmin, &[])),
                ..Outcome::default()
            });
        }
        session.agent().tools().reset(session.key());
        // Replacing the history drops its summary too.
        Some(Outcome {
            history: Some(HistoryChange::Replace(Vec::new())),
            reply: Some(say(lang, Msg::ResetDone, &[])),
            ..Outcome::default()
        })
    }

    /// Runs the agent on one item ([`run`]); `None` when it was abandoned by shutdown.
    async fn turn(
        &mut self,
        session: &Session,
        item: &QueueItem,
        cancel: &CancellationToken,
    ) -> Option<Outcome> {
        let kept = self.take_history();
        let manager = &self.manager;
        let settings = manager.effective(session.key());
        // A group's chosen model: the same agent asking another client and model.
        let chosen = settings
            .model
            .as_deref()
            .and_then(|name| manager.group_model(name))
            .map(|m| session.agent().with_llm(Arc::clone(&m.llm), &m.model));
        let approver: Arc<dyn crate::tool::approval::Approver> =
            Arc::new(super::approvals::TurnApprover {
                manager: manager.clone(),
                session: session.key().to_owned(),
                chat: item.chat.clone(),
                lang: settings.language,
            });
        let deps = TurnDeps {
            store: manager.store().as_ref(),
            agent: chosen.as_ref().unwrap_or(session.agent()),
            settings: &settings,
            approver: Some(approver),
            session: session.key(),
            platform: manager.platform(&item.chat).cloned(),
            roles: Arc::new(super::roles::TurnRoles {
                manager: manager.clone(),
                chat: item.chat.clone(),
                private: item.private,
            }),
            post: Arc::new(super::outbox::TurnPost {
                manager: manager.clone(),
                chat: item.chat.clone(),
            }),
            auto_chat: self.auto_chat_speech(item),
            history_tokens: manager.config().history_tokens,
            compact_at: super::compact::compact_threshold(
                manager.config(),
                manager.template().prompt_size().total(),
            ),
            shutdown: manager.abort(),
            prices: &manager.config().prices,
        };
        if manager.config().cluster.is_none() {
            return run(deps, kept, item, cancel).await;
        }
        // Cluster mode: the turn stops once this instance no longer holds the chat's lease
        // unexpired (lost to another, or past its expiry after a pause), before its next
        // model request or tool; its commit would be refused anyway (the fence). Polled
        // first, so that a daemon waking from a pause cancels before it goes on.
        let lapsed = lease_lapsed(manager, session.key(), cancel);
        let outcome = tokio::select! {
            biased;
            () = lapsed => None,
            outcome = run(deps, kept, item, cancel) => outcome,
        };
        // Stopped because the chat moved on (or it did as the turn ended): abandoned, so
        // that its input stays pending for the new holder rather than being committed as
        // cancelled.
        if !manager.dispatcher().holds(manager, session.key()) {
            return None;
        }
        outcome
    }
}

/// Cancels `cancel` once this instance no longer holds `key`'s lease unexpired; never
/// ends (the turn ends by itself, cancelled).
async fn lease_lapsed(manager: &SessionManager, key: &str, cancel: &CancellationToken) {
    let every = manager
        .config()
        .cluster
        .as_ref()
        .map_or(Duration::from_secs(1), |c| c.lease_ttl / 10)
        .max(Duration::from_millis(50));
    loop {
        if !manager.dispatcher().holds(manager, key) {
            tracing::info!(session = %key, "this instance no longer holds the chat; the turn stops");
            cancel.cancel();
            return std::future::pending().await;
        }
        tokio::time::sleep(every).await;
    }
}

/// Runs the agent on one item over `deps`, on `kept` (the history as the last commit
/// left it, when the worker kept it) or the stored history; `None` when it was
/// abandoned by shutdown. Writes nothing: the caller commits the [`Outcome`].
pub(super) async fn run(
    deps: TurnDeps<'_>,
    kept: Option<Vec<Message>>,
    item: &QueueItem,
    cancel: &CancellationToken,
) -> Option<Outcome> {
    let store = deps.store;
    let key = deps.session;
    // An unreadable history is replaced by this turn's, not appended to.
    let (history, readable) = match kept.map_or_else(|| store.load_history(key), Ok) {
        Ok(h) => (h, true),
        Err(e) => {
            tracing::error!(session = %key, error = %e, "cannot load history; starting fresh for this turn");
            (Vec::new(), false)
        }
    };
    // A summary that cannot be read is left out of this turn, not overwritten: a
    // compaction writes a new one only from one it read.
    let summary = store.load_summary(key).unwrap_or_else(|e| {
        tracing::error!(session = %key, error = %e, "cannot load the summary; this turn goes without it");
        None
    });
    let platform = deps.platform;
    let input = TurnInput {
        session: key.to_owned(),
        caller: item.caller(),
        content: input_content(item),
        chat: Some(item.chat.clone()),
        platform: platform.clone(),
        roles: Some(deps.roles),
        auto_chat: deps.auto_chat,
        post: Some(deps.post),
        toolsets: deps.settings.toolsets.as_deref().map(Arc::from),
        approver: deps.approver,
        // Only a member's message is a source; a clock fire's or a notice's input is ours.
        answering: item
            .reply_to
            .clone()
            .filter(|_| item.kind.rules().caller == super::input::CallerRule::Senders),
        // The group's words never steer a turn that holds an operator's rights.
        persona: deps
            .settings
            .persona
            .clone()
            .filter(|_| item.caller().role < Role::Operator),
    };
    // An auto-chat turn shows no typing: nobody waits for it.
    let platform = platform.filter(|_| item.kind.rules().posts);
    let chat = item.chat.clone();
    let typing = async move {
        let Some(platform) = platform else {
            return std::future::pending::<()>().await;
        };
        loop {
            let _ = tokio::time::timeout(Duration::from_secs(5), platform.send_typing(&chat)).await;
            tokio::time::sleep(Duration::from_secs(4)).await;
        }
    };
    let result: Result<Turn, _> = tokio::select! {
        result = deps.agent.run_turn_in(&history, summary.as_ref(), input, cancel.clone()) => result,
        () = typing => return None,
    };
    let mut history = history;
    let loaded = history.len();
    // How many of the loaded messages the model's context refused.
    let mut refused = 0;
    let facts;
    let mut new_summary = None;
    let mut context_tokens = None;
    let (new_messages, reply, model_failed) = match result {
        Ok(turn) if turn.end == TurnEnd::Cancelled && deps.shutdown.is_cancelled() => {
            tracing::info!(session = %key, "turn cancelled by shutdown; it resumes after restart");
            return None;
        }
        Ok(turn) => {
            facts = TurnFacts::of(&turn, deps.prices);
            let reply = match turn.end {
                TurnEnd::Cancelled => None,
                _ if turn.reply.trim().is_empty() => {
                    Some(say(deps.settings.language, Msg::EmptyAnswer, &[]))
                }
                _ => Some(turn.reply),
            };
            // The model refused the older history as too long; it goes from the store
            // too, or every later turn would pay for the same refusal.
            if turn.history_dropped > 0 {
                tracing::warn!(session = %key, dropped = turn.history_dropped, summarized = turn.summary.is_some(), "history exceeded the model's context; its older part was dropped");
                refused = turn.history_dropped.min(history.len());
                history.drain(..refused);
            }
            let lang = deps.settings.language;
            let note = match (&turn.summary, turn.history_dropped) {
                (_, 0) => None,
                (Some(_), _) => Some(say(lang, Msg::ContextSummarized, &[])),
                (None, _) => Some(say(lang, Msg::ContextForgotten, &[])),
            };
            let reply = reply.map(|text| match note {
                Some(note) => format!("{text}\n\n{note}"),
                None => text,
            });
            new_summary = turn.summary;
            context_tokens = turn.context_tokens;
            (turn.messages, reply, None)
        }
        Err(e) => {
            tracing::error!(session = %key, error = %e, "turn failed");
            let reason = short_reason(&e.to_string());
            facts = TurnFacts::failed(&reason);
            (
                Vec::new(),
                Some(failure_notice(&e, deps.settings.language)),
                Some(reason),
            )
        }
    };
    // The loaded messages still in front of this turn's.
    let kept = loaded - refused;
    history.extend(new_messages);
    // `load_image`'s pictures were for this turn only. Stored messages hold none, unless
    // an older release wrote them: such a history is stripped and rewritten whole.
    let rewrite = !readable || holds_image_data(&history[..kept]);
    if rewrite {
        strip_image_data(&mut history);
    } else {
        strip_image_data(&mut history[kept..]);
    }
    let compact_due = reply.is_some()
        && model_failed.is_none()
        && super::compact::context_full(deps.compact_at, context_tokens, &history);
    let before = history.len();
    trim_to_budget(&mut history, deps.history_tokens);
    let trimmed = before - history.len();
    let (change, after) = if rewrite {
        let after = history.clone();
        (HistoryChange::Replace(history), after)
    } else {
        // The trim cuts the front: the loaded messages first, then (when the newest turn
        // alone is over the budget, or the loaded ones held no turn start) this turn's.
        let from_loaded = trimmed.min(kept);
        let messages = history.split_off(kept - from_loaded);
        // What the store holds after the append: the loaded messages it kept, then these.
        let mut after = history;
        after.extend(messages.iter().cloned());
        (
            HistoryChange::Append {
                dropped: refused + from_loaded,
                messages,
            },
            after,
        )
    };
    Some(Outcome {
        history: Some(change),
        reply,
        model_failed,
        // A rewritten history would drop the summary the turn ran with.
        summary: new_summary.or(if rewrite { summary } else { None }),
        compact_due,
        facts: Some(facts),
        budget_told: Told::Nobody,
        history_after: Some(after),
        also: Vec::new(),
    })
}

/// The turn's input content: the text, and a reference to each attached image. The
/// images are not downloaded here: the agent shows them in this turn's requests, and
/// history (which this content becomes part of) keeps only the references.
fn input_content(item: &QueueItem) -> Content {
    let text = item.text();
    if item.images.is_empty() {
        return Content::Text(text);
    }
    let mut parts = vec![ContentPart::Text { text }];
    parts.extend(
        item.images
            .iter()
            .map(|(image, message_id)| ContentPart::ImageRef {
                image: image.clone(),
                message_id: message_id.clone(),
            }),
    );
    Content::Parts(parts)
}

/// A turn not run: the chat's daily token budget is used up. The input is answered
/// (committed) all the same, and the chat told once a day.
fn over_budget(told: bool, lang: Lang) -> Outcome {
    Outcome {
        reply: (!told).then(|| say(lang, Msg::ChatBudgetSpent, &[])),
        // A clock fire's run log says why nothing was posted.
        model_failed: Some("the chat's daily token budget is used up".to_owned()),
        budget_told: if told { Told::Nobody } else { Told::Chat },
        ..Outcome::default()
    }
}

/// Every member the turn would answer has used up their budget: told once a day per chat.
fn members_over_budget(
    told: bool,
    names: &[String],
    lang: Lang,
    group_limit: Option<u64>,
) -> Outcome {
    let names = names.join(", ");
    Outcome {
        reply: (!told).then(|| match group_limit {
            Some(limit) => say(
                lang,
                Msg::MemberGroupBudgetSpent,
                &[("names", &names), ("limit", &limit.to_string())],
            ),
            None => say(lang, Msg::MemberBudgetSpent, &[("names", &names)]),
        }),
        model_failed: Some("the members' daily token budget is used up".to_owned()),
        budget_told: if told { Told::Nobody } else { Told::Members },
        ..Outcome::default()
    }
}

/// Who a budget notice told.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) enum Told {
    /// No notice.
    #[default]
    Nobody,
    /// The chat's budget is used up.
    Chat,
    /// The members' budgets are used up.
    Members,
}

/// Whether `messages` hold image bytes (a `data:` URL).
fn holds_image_data(messages: &[Message]) -> bool {
    messages.iter().any(|message| match message {
        Message::User {
            content: Content::Parts(parts),
        } => parts.iter().any(|part| {
            matches!(part, ContentPart::ImageUrl { image_url }
                if image_url.url.get(..5).is_some_and(|s| s.eq_ignore_ascii_case("data:")))
        }),
        _ => false,
    })
}

/// What the chat is told when a turn failed: what happened and what to do, in one or two
/// short sentences. Never the error's text: that may quote the provider's whole answer, and
/// it is in the log for the operator.
fn failure_notice(error: &AgentError, lang: Lang) -> String {
    let AgentError::Llm(error) = error;
    let (msg, args): (Msg, Vec<(&str, String)>) = match error {
        LlmError::Connect(_) => (Msg::FailConnect, Vec::new()),
        LlmError::Timeout(after) => (
            Msg::FailTimeout,
            vec![("secs", after.as_secs().max(1).to_string())],
        ),
        LlmError::NoAnswerYet(after) => (
            Msg::FailNoAnswerYet,
            vec![("minutes", after.as_secs().div_ceil(60).to_string())],
        ),
        LlmError::Interrupted(_) => (Msg::FailInterrupted, Vec::new()),
        e if e.is_context_length_exceeded() => (Msg::FailTooLong, Vec::new()),
        LlmError::Status { status: 429, .. } => (Msg::FailRateLimited, Vec::new()),
        LlmError::Status {
            status: 401 | 403, ..
        } => (Msg::FailCredentials, Vec::new()),
        LlmError::Status { status, .. } if *status >= 500 => {
            (Msg::FailServer, vec![("status", status.to_string())])
        }
        LlmError::Status { status, .. } => (Msg::FailRefused, vec![("status", status.to_string())]),
        LlmError::Stream(_) => (Msg::FailStream, Vec::new()),
        LlmError::Malformed(_) => (Msg::FailMalformed, Vec::new()),
        LlmError::Cancelled => (Msg::FailCancelled, Vec::new()),
    };
    let args: Vec<(&str, &str)> = args.iter().map(|(k, v)| (*k, v.as_str())).collect();
    say(lang, msg, &args)
}

/// The first line of an error, capped, for a chat notice (the full error is in the log).
fn short_reason(error: &str) -> String {
    let line = error.lines().next().unwrap_or("unknown error");
    let (head, rest) = crate::text::split_chars(line, 160);
    let mut out = head.to_owned();
    if !rest.is_empty() {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio_util::sync::CancellationToken;

    use super::{TurnDeps, run};
    use crate::agent::{Agent, AgentConfig};
    use crate::session::QueueItem;
    use crate::store::{HistoryChange, MemoryStore, PendingItem, PendingKind, Store};
    use crate::testing::{ScriptedLlm, TestPost, TestRoles, group, text};
    use crate::tool::{Caller, Role, ToolRegistry};

    fn item(text: &str) -> QueueItem {
        let chat = group();
        let mut item = QueueItem::from_pending(PendingItem {
            id: 7,
            session: chat.session_key(),
            chat,
            kind: PendingKind::UserMessage,
            caller: Caller {
                user_id: "test:alice".to_owned(),
                name: "alice".to_owned(),
                role: Role::Member,
                grants: Vec::new(),
            },
            text: text.to_owned(),
            reply_to: Some("1".to_owned()),
            images: Vec::new(),
            received: chrono::Utc::now(),
            private: false,
        });
        item.pending_ids = vec![7];
        item
    }

    /// A turn runs over its named dependencies alone, and writes nothing: what it wants
    /// committed comes back as its outcome.
    #[tokio::test]
    async fn a_turn_runs_without_a_manager_and_only_reports_what_to_commit() {
        let store = MemoryStore::new();
        let agent = Agent::new(
            ScriptedLlm::new(vec![text("hello alice")]),
            ToolRegistry::new(Vec::new()).unwrap(),
            "test",
            AgentConfig::default(),
        );
        let shutdown = CancellationToken::new();
        let key = group().session_key();
        let deps = TurnDeps {
            store: &store,
            agent: &agent,
            session: &key,
            platform: None,
            roles: Arc::new(TestRoles::new()),
            post: TestPost::new(),
            auto_chat: None,
            history_tokens: 24_000,
            compact_at: None,
            shutdown: &shutdown,
            prices: &crate::llm::Prices::default(),
            settings: &super::super::settings::Effective::default(),
            approver: None,
        };
        let outcome = run(deps, None, &item("alice: hi"), &CancellationToken::new())
            .await
            .expect("not abandoned");
        assert_eq!(outcome.reply.as_deref(), Some("hello alice"));
        assert!(outcome.model_failed.is_none());
        assert!(!outcome.compact_due);
        match outcome.history {
            Some(HistoryChange::Append { dropped, messages }) => {
                assert_eq!(dropped, 0);
                assert_eq!(messages.len(), 2, "the input and the answer: {messages:?}");
            }
            other => panic!("expected an append, got {other:?}"),
        }
        assert_eq!(outcome.history_after.map(|h| h.len()), Some(2));
        assert!(
            store.load_history(&key).unwrap().is_empty(),
            "nothing written"
        );
    }
}
