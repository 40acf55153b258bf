//! Compaction through the session layer with a scripted model: at the threshold, on
//! `/compact`, before eviction, on a context-length refusal; a failing summarizer leaves a
//! working session; a tool call is never split from its results; the summary survives a
//! restart.

use std::sync::Arc;
use std::time::Duration;

use parlor_bot::agent::AgentConfig;
use parlor_bot::llm::{Completion, LlmError, Message, ToolCall, Usage};
use parlor_bot::platform::{Inbox, IncomingMessage};
use parlor_bot::session::{SessionConfig, SessionManager};
use parlor_bot::store::{MemoryStore, SledStore, Store, StoreOptions};
use parlor_bot::testing::{
    ScriptedLlm, TestPlatform, WAIT_LIMIT, echo, group, is_summary_request, last_text, message,
    text, toolless_manager, wait_until,
};

const KEY: &str = "test:-100";
const SUMMARY: &str = "- The group decided the picnic is on Saturday at the lake (alice).";
/// A turn whose input holds this word reports a nearly full context.
const BIG: &str = "BIGTURN";

fn msg(id: u32, who: &str, text: &str) -> IncomingMessage {
    message(&group(), id, who, text)
}

/// Compaction on at 0.7 of a 32,000-token window, keeping the last two turns.
fn config() -> SessionConfig {
    SessionConfig {
        context_window: 32_000,
        compact_ratio: 0.7,
        compact_keep_turns: 2,
        history_tokens: 1_000_000,
        ..SessionConfig::default()
    }
}

/// Echoes turns (reporting 500 prompt tokens, or 30,000 for a [`BIG`] input) and answers
/// summary requests with `summary`.
fn model(summary: Result<&'static str, u16>) -> ScriptedLlm {
    ScriptedLlm::answering(move |request, _| {
        if is_summary_request(request) {
            return match summary {
                Ok(s) => Ok(Completion {
                    usage: Some(Usage {
                        prompt_tokens: 1000,
                        completion_tokens: 100,
                        total_tokens: 1100,
                        ..Usage::default()
                    }),
                    ..text(s)
                }),
                Err(status) => Err(LlmError::Status {
                    status,
                    body: "summarizer down".into(),
                    retry_after: None,
                }),
            };
        }
        let prompt = if last_text(request).contains(BIG) {
            30_000
        } else {
            500
        };
        Ok(Completion {
            usage: Some(Usage {
                prompt_tokens: prompt,
                completion_tokens: 20,
                total_tokens: prompt + 20,
                ..Usage::default()
            }),
            ..echo(request)
        })
    })
}

struct Rig {
    manager: SessionManager,
    store: Arc<dyn Store>,
    platform: Arc<TestPlatform>,
    llm: Arc<ScriptedLlm>,
}

fn rig_on(store: Arc<dyn Store>, llm: ScriptedLlm, config: SessionConfig) -> Rig {
    let llm = llm.shared();
    let platform = TestPlatform::new();
    let manager = toolless_manager(
        Arc::clone(&store),
        llm.clone(),
        &platform,
        config,
        AgentConfig::default(),
    );
    Rig {
        manager,
        store,
        platform,
        llm,
    }
}

fn rig(llm: ScriptedLlm) -> Rig {
    rig_on(Arc::new(MemoryStore::new()), llm, config())
}

/// Six old turns, each with a tool call and its result, the first one about the picnic;
/// about `size` characters of answer each.
fn old_turns(size: usize) -> Vec<Message> {
    (0..6)
        .flat_map(|i| {
            let question = if i == 0 {
                "alice (test:alice): @parlor the picnic is on Saturday at the lake, remember that"
                    .to_owned()
            } else {
                format!("bob (test:bob): @parlor question {i}")
            };
            vec![
                Message::user(question),
                Message::Assistant {
                    content: None,
                    tool_calls: vec![ToolCall::new(format!("c{i}"), "time_now", "{}")],
                    thinking: Vec::new(),
                    model: None,
                },
                Message::tool(format!("c{i}"), "{\"ok\":true,\"data\":\"12:00\"}"),
                Message::assistant(format!("answer {i} {}", "x".repeat(size))),
            ]
        })
        .collect()
}

impl Rig {
    async fn say(&self, id: u32, who: &str, text: &str) {
        self.manager.deliver(msg(id, who, text)).await.unwrap();
    }

    fn summary_requests(&self) -> Vec<parlor_bot::llm::ChatRequest> {
        self.llm
            .requests()
            .into_iter()
            .filter(is_summary_request)
            .collect()
    }
}

/// Every assistant tool call is followed by its results, and the history starts with a
/// user message.
fn assert_whole_turns(history: &[Message]) {
    assert!(
        matches!(history.first(), Some(Message::User { .. })),
        "{history:?}"
    );
    for (i, message) in history.iter().enumerate() {
        if let Message::Assistant { tool_calls, .. } = message {
            for (k, call) in tool_calls.iter().enumerate() {
                assert!(
                    matches!(history.get(i + 1 + k), Some(Message::Tool { tool_call_id, .. }) if *tool_call_id == call.id),
                    "tool call {} split from its result: {history:?}",
                    call.id
                );
            }
        }
    }
}

#[tokio::test]
async fn a_turn_past_the_threshold_is_compacted_and_the_summary_serves_later_turns() {
    let rig = rig(model(Ok(SUMMARY)));
    rig.store.save_history(KEY, &old_turns(100)).unwrap();
    rig.say(1, "carol", &format!("@parlor {BIG} what is next?"))
        .await;
    let sent = rig.platform.wait_sent(2).await;
    assert!(sent[0].text.starts_with("reply: "), "{sent:?}");
    assert!(
        sent[1].text.contains("summarized its older part"),
        "told once: {sent:?}"
    );

    let summaries = rig.summary_requests();
    assert_eq!(summaries.len(), 1);
    assert!(summaries[0].tools.is_empty(), "a summarizer does not act");
    assert_eq!(summaries[0].max_completion_tokens, Some(1500));
    assert!(
        last_text(&summaries[0]).contains("the picnic is on Saturday"),
        "the oldest turn is summarized"
    );

    let summary = rig.store.load_summary(KEY).unwrap().unwrap();
    assert_eq!(summary.text, SUMMARY);
    // The summary's tokens count against the chat's day, as a turn's do, but not as a turn.
    let day = parlor_bot::session::usage::day_usage(
        rig.store.as_ref(),
        parlor_bot::session::usage::today(),
        KEY,
    )
    .unwrap();
    assert_eq!((day.turns, day.total_tokens), (1, 30_020 + 1_100));
    let history = rig.store.load_history(KEY).unwrap();
    // The last two turns stay whole: the newest old one (4 messages) and this one (2).
    assert_eq!(history.len(), 6, "{history:?}");
    assert_whole_turns(&history);
    assert_eq!(summary.messages, 24 + 2 - 6);

    // The next turn carries the summary quoted at the start of its first user message,
    // never in the system message (members' words must not speak with the program's voice).
    rig.say(2, "dave", "@parlor when is the picnic?").await;
    rig.platform.wait_sent(3).await;
    // The next turn adds its tokens to the day with the summary's: the worker, which keeps
    // what its last commit wrote of the day, knows the summary was counted after it.
    let after = parlor_bot::session::usage::day_usage(
        rig.store.as_ref(),
        parlor_bot::session::usage::today(),
        KEY,
    )
    .unwrap();
    let trace = parlor_bot::session::trace::recent(rig.store.as_ref(), KEY).unwrap();
    let second = trace[0].prompt_tokens + trace[0].completion_tokens;
    assert!(second > 0, "{trace:?}");
    assert_eq!(
        (after.turns, after.total_tokens),
        (2, 30_020 + 1_100 + second)
    );
    let last = rig.llm.requests().pop().unwrap();
    let Message::System { content } = &last.messages[0] else {
        panic!("no system message: {last:?}");
    };
    assert!(content.starts_with("test"), "the prompt is a stable prefix");
    assert!(!content.contains(SUMMARY), "{content}");
    assert_summary_quoted(&last);
    // The history as the compaction left it (not as the turn before it), then the input.
    assert_eq!(last.messages.len(), 1 + 6 + 1, "{:?}", last.messages);
    assert_eq!(
        last.messages
            .iter()
            .filter(|m| matches!(m, Message::System { .. }))
            .count(),
        1
    );
    // And the status says how big the summary is.
    rig.say(3, "dave", "/status").await;
    let sent = rig.platform.wait_sent(4).await;
    assert!(
        sent[3]
            .text
            .contains(&format!("Summary: {} characters", SUMMARY.chars().count())),
        "{}",
        sent[3].text
    );
}

#[tokio::test]
async fn a_turn_below_the_threshold_is_not_compacted() {
    let rig = rig(model(Ok(SUMMARY)));
    rig.store.save_history(KEY, &old_turns(100)).unwrap();
    rig.say(1, "carol", "@parlor small question").await;
    rig.platform.wait_sent(1).await;
    rig.say(2, "carol", "/status").await;
    let sent = rig.platform.wait_sent(2).await;
    assert!(sent[1].text.contains("Summary: none"), "{}", sent[1].text);
    assert!(rig.summary_requests().is_empty());
    assert_eq!(rig.store.load_history(KEY).unwrap().len(), 26);
}

#[tokio::test]
async fn a_failing_summarizer_trims_instead_and_the_session_keeps_working() {
    let rig = rig(model(Err(500)));
    // About 12,000 estimated tokens: trimming to half the threshold drops some turns.
    rig.store.save_history(KEY, &old_turns(8000)).unwrap();
    rig.say(1, "carol", &format!("@parlor {BIG} go on")).await;
    let sent = rig.platform.wait_sent(2).await;
    assert!(
        sent[0].text.starts_with("reply: "),
        "the turn itself answered"
    );
    assert!(
        sent[1].text.contains("could not summarize"),
        "told once: {sent:?}"
    );
    // One attempt and one retry with a shorter transcript.
    let summaries = rig.summary_requests();
    assert_eq!(summaries.len(), 2);
    assert!(last_text(&summaries[1]).len() < last_text(&summaries[0]).len());
    assert!(rig.store.load_summary(KEY).unwrap().is_none());
    let history = rig.store.load_history(KEY).unwrap();
    assert!(history.len() < 26, "trimmed: {}", history.len());
    assert_whole_turns(&history);

    rig.say(2, "carol", "@parlor still there?").await;
    let sent = rig.platform.wait_sent(3).await;
    assert_eq!(
        sent[2].text,
        "reply: carol (test:carol): @parlor still there?"
    );
}

#[tokio::test]
async fn compact_needs_an_admin_and_focuses_on_its_topic() {
    let rig = rig(model(Ok(SUMMARY)));
    rig.store.save_history(KEY, &old_turns(100)).unwrap();
    rig.platform.set_admins_everywhere(&["test:alice"]);
    rig.say(1, "bob", "/compact").await;
    let sent = rig.platform.wait_sent(1).await;
    assert_eq!(sent[0].text, "Only an admin can compact this chat.");
    assert!(rig.summary_requests().is_empty());

    rig.say(2, "alice", "/compact the picnic plans").await;
    let sent = rig.platform.wait_sent(2).await;
    assert!(
        sent[1]
            .text
            .starts_with("Done: I summarized 16 older messages"),
        "{}",
        sent[1].text
    );
    let summaries = rig.summary_requests();
    assert_eq!(summaries.len(), 1);
    // The topic is a chat admin's words: quoted in the user message, not an instruction.
    let Message::System { content } = &summaries[0].messages[0] else {
        panic!("no system message");
    };
    assert!(!content.contains("picnic"), "{content}");
    let Message::User { content } = &summaries[0].messages[1] else {
        panic!("no user message");
    };
    assert!(
        content.text().contains("\n  the picnic plans\n"),
        "{}",
        content.text()
    );
    assert_eq!(rig.store.load_history(KEY).unwrap().len(), 8);
    assert_eq!(rig.store.load_summary(KEY).unwrap().unwrap().text, SUMMARY);

    // Nothing older than the kept turns now.
    rig.say(3, "alice", "/compact").await;
    let sent = rig.platform.wait_sent(3).await;
    assert!(
        sent[2]
            .text
            .starts_with("There is nothing to summarize yet"),
        "{}",
        sent[2].text
    );
}

#[tokio::test]
async fn a_failed_compact_changes_nothing() {
    let rig = rig(model(Err(502)));
    rig.store.save_history(KEY, &old_turns(100)).unwrap();
    rig.platform.set_admins_everywhere(&["test:alice"]);
    rig.say(1, "alice", "/compact").await;
    let sent = rig.platform.wait_sent(1).await;
    assert!(
        sent[0].text.contains("nothing was changed"),
        "{}",
        sent[0].text
    );
    assert_eq!(rig.store.load_history(KEY).unwrap().len(), 24);
    assert!(rig.store.load_summary(KEY).unwrap().is_none());
}

#[tokio::test]
async fn a_context_length_refusal_summarizes_the_older_half_and_retries_once() {
    let refusal = LlmError::Status {
        status: 400,
        body: r#"{"error":{"code":"context_length_exceeded","message":"too long"}}"#.into(),
        retry_after: None,
    };
    let llm = model(Ok(SUMMARY)).script_when(|r| !is_summary_request(r));
    llm.push(Err(refusal));
    let rig = rig(llm);
    rig.store.save_history(KEY, &old_turns(100)).unwrap();
    rig.say(1, "carol", "@parlor hello").await;
    let sent = rig.platform.wait_sent(1).await;
    assert!(sent[0].text.starts_with("reply: carol"), "{}", sent[0].text);
    assert!(
        sent[0].text.contains("so I summarized its older part"),
        "{}",
        sent[0].text
    );
    let summary = rig.store.load_summary(KEY).unwrap().unwrap();
    assert_eq!(summary.text, SUMMARY);
    assert_eq!(summary.messages, 12, "the older half");
    let history = rig.store.load_history(KEY).unwrap();
    assert_eq!(history.len(), 12 + 2);
    assert_whole_turns(&history);
    // The retried request carried the summary instead of the older half.
    let last = rig.llm.requests().pop().unwrap();
    assert_summary_quoted(&last);
}

/// The request's first user message opens with the summary, fenced and indented, and no
/// system message holds it.
fn assert_summary_quoted(request: &parlor_bot::llm::ChatRequest) {
    let first = request
        .messages
        .iter()
        .find_map(|m| match m {
            Message::User { content } => Some(content.text()),
            _ => None,
        })
        .unwrap();
    assert!(first.starts_with("<conversation_summary"), "{first}");
    assert!(first.contains(&format!("\n  {SUMMARY}\n")), "{first}");
    for m in &request.messages {
        if let Message::System { content } = m {
            assert!(!content.contains(SUMMARY), "{content}");
        }
    }
}

#[tokio::test]
async fn an_idle_session_is_compacted_before_it_leaves_memory_without_a_notice() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let rig = rig_on(
        Arc::clone(&store),
        model(Ok(SUMMARY)),
        SessionConfig {
            idle_timeout: Duration::ZERO,
            ..config()
        },
    );
    // About 7,000 estimated tokens: under the threshold, over a quarter of it.
    rig.store.save_history(KEY, &old_turns(4400)).unwrap();
    rig.say(1, "carol", "@parlor hi").await;
    rig.platform.wait_sent(1).await;
    wait_until("the idle session left memory", WAIT_LIMIT, || {
        rig.manager.stats().evictions > 0
    })
    .await;
    assert_eq!(rig.manager.stats().evictions, 1);
    assert_eq!(rig.summary_requests().len(), 1);
    assert_eq!(store.load_summary(KEY).unwrap().unwrap().text, SUMMARY);
    assert_eq!(store.load_history(KEY).unwrap().len(), 6);
    assert_eq!(rig.platform.sent().len(), 1, "no notice into an idle chat");
}

#[tokio::test]
async fn the_summary_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let open = || {
        Arc::new(SledStore::open(dir.path(), StoreOptions::default()).unwrap()) as Arc<dyn Store>
    };
    {
        let rig = rig_on(open(), model(Ok(SUMMARY)), config());
        rig.store.save_history(KEY, &old_turns(100)).unwrap();
        rig.platform.set_admins_everywhere(&["test:alice"]);
        rig.say(1, "alice", "/compact").await;
        let sent = rig.platform.wait_sent(1).await;
        assert!(sent[0].text.starts_with("Done"), "{}", sent[0].text);
        rig.manager.shutdown(Duration::from_secs(1)).await;
    }
    let rig = rig_on(open(), model(Ok(SUMMARY)), config());
    rig.manager.resume().await.unwrap();
    rig.say(2, "dave", "@parlor when is the picnic?").await;
    rig.platform.wait_sent(1).await;
    let last = rig.llm.requests().pop().unwrap();
    assert_summary_quoted(&last);
    // Reset forgets the summary with the conversation.
    rig.platform.set_admins_everywhere(&["test:alice"]);
    rig.say(3, "alice", "/reset").await;
    rig.platform.wait_sent(2).await;
    assert!(rig.store.load_summary(KEY).unwrap().is_none());
}

/// A small window whose fixed part (here a system prompt of about 5,000 tokens) takes a third
/// of it: the threshold is sized against what is left, so 19 turns are not each followed by
/// a summary, and no chat is summarized twice without new turns in between.
#[tokio::test]
async fn a_large_fixed_prompt_in_a_small_window_does_not_summarize_every_turn() {
    use parlor_bot::agent::history::estimate_tokens;
    let llm = ScriptedLlm::answering(|request, _| {
        // The provider's real count: every message the request holds, system prompt
        // included.
        let prompt: usize = request.messages.iter().map(estimate_tokens).sum();
        let prompt = u64::try_from(prompt).unwrap();
        let usage = Some(Usage {
            prompt_tokens: prompt,
            completion_tokens: 400,
            total_tokens: prompt + 400,
            ..Usage::default()
        });
        if is_summary_request(request) {
            return Ok(Completion {
                usage,
                ..text("- The group talked about the weather.")
            });
        }
        Ok(Completion {
            usage,
            ..echo(request)
        })
    })
    .shared();
    let registry = parlor_bot::tool::ToolRegistry::new(Vec::new()).unwrap();
    let prompt = "Answer kindly and briefly. ".repeat(760);
    let agent =
        parlor_bot::agent::Agent::new(llm.clone(), registry, &prompt, AgentConfig::default());
    assert!((5_000..5_300).contains(&agent.prompt_size().total()));
    let platform = TestPlatform::new();
    let manager = parlor_bot::testing::manager_with(
        Arc::new(MemoryStore::new()),
        agent,
        &platform,
        SessionConfig {
            context_window: 16_000,
            compact_ratio: 0.5,
            compact_keep_turns: 2,
            history_tokens: 1_000_000,
            turns_per_minute: 1000,
            ..SessionConfig::default()
        },
    );
    let words = "the weather is fine today and tomorrow ".repeat(40);
    for id in 1..=19u32 {
        manager
            .deliver(msg(id, "alice", &format!("@parlor {id} {words}")))
            .await
            .unwrap();
        platform
            .wait_sent_where(|s| {
                s.text
                    .starts_with(&format!("reply: alice (test:alice): @parlor {id} "))
            })
            .await;
    }
    let summaries = llm
        .requests()
        .iter()
        .filter(|r| is_summary_request(r))
        .count();
    // About 800 tokens a turn against ~5,400 of room: a summary every five turns or so.
    assert!(
        (1..=4).contains(&summaries),
        "{summaries} summaries in 19 turns"
    );
}
