//! Usage accounting and turn traces (`session/usage.rs`, `session/trace.rs`): tokens per
//! chat per day and each turn's trace land with the turn's commit; `/status` shows the day's
//! tokens; a chat over its daily budget runs no turn, is told once, and its inputs are
//! answered all the same.

use std::sync::Arc;

use parlor_bot::agent::AgentConfig;
use parlor_bot::platform::{ChatRef, Inbox};
use parlor_bot::session::trace::{self, KEEP_TRACES};
use parlor_bot::session::usage::{self, BUDGET_NOTICE, MEMBER_BUDGET_NOTICE};
use parlor_bot::session::{SessionConfig, SessionManager};
use parlor_bot::store::{MemoryStore, Store};
use parlor_bot::testing::{
    ScriptedLlm, TestPlatform, calls, group, message, text, toolless_manager,
};

struct Rig {
    manager: SessionManager,
    store: Arc<MemoryStore>,
    platform: Arc<TestPlatform>,
    llm: Arc<ScriptedLlm>,
}

/// Every request answered `text("fine")` (12 tokens), except a user message containing
/// `tool please`, which first calls a tool that does not exist.
fn rig(config: SessionConfig) -> Rig {
    let llm = ScriptedLlm::answering(|request, _| {
        let last = parlor_bot::testing::last_text(request);
        if last.contains("tool please") {
            Ok(calls(&[(
                "c1",
                "no_such_tool",
                serde_json::json!({"x": 1}),
            )]))
        } else {
            Ok(text("fine"))
        }
    })
    .shared();
    let store = Arc::new(MemoryStore::new());
    let platform = TestPlatform::new();
    let manager = toolless_manager(
        store.clone() as Arc<dyn Store>,
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

impl Rig {
    async fn say(&self, id: u32, text: &str) {
        self.say_as(&group(), id, "alice", text).await;
    }

    async fn say_as(&self, chat: &ChatRef, id: u32, who: &str, text: &str) {
        self.manager
            .deliver(message(chat, id, who, text))
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn a_turn_commits_its_tokens_and_its_trace() {
    let rig = rig(SessionConfig::default());
    let key = group().session_key();
    rig.say(1, "@parlor tool please").await;
    rig.platform.wait_sent(1).await;
    rig.say(2, "@parlor again").await;
    rig.platform.wait_sent(2).await;

    let day = usage::day_usage(rig.store.as_ref(), usage::today(), &key).unwrap();
    assert_eq!(day.turns, 2);
    // The tool-calling request reported no usage; each text answer 12.
    assert_eq!(day.total_tokens, 24);
    assert_eq!(rig.manager.tokens_today(&key), (24, None));

    let traces = trace::recent(rig.store.as_ref(), &key).unwrap();
    assert_eq!(traces.len(), 2);
    let first = &traces[1];
    assert!(first.input.contains("tool please"), "{first:?}");
    assert_eq!(first.callers, vec!["alice".to_owned()]);
    assert_eq!(first.requests[0].calls[0].name, "no_such_tool");
    assert_eq!(first.requests[0].calls[0].arguments, r#"{"x":1}"#);
    assert_eq!(first.requests[0].calls[0].code, "TOOL_NOT_FOUND");
    assert_eq!(first.end, "answered");
    assert_eq!(first.kind, "user_message");
    assert_eq!(first.reply.as_deref(), Some("fine"));
    // The trace names the reply's outbox record, which holds the platform's ids once sent.
    let outbox = first.outbox_id.unwrap();
    let sent = rig.store.sent_reply(outbox).unwrap().unwrap();
    assert_eq!(sent.sent_ids, vec![rig.platform.sent()[0].id.clone()]);

    rig.say(3, "/status").await;
    let status = rig.platform.wait_sent(3).await;
    assert!(
        status[2].text.contains("Tokens today (UTC): 24"),
        "{}",
        status[2].text
    );
}

#[tokio::test]
async fn a_chat_keeps_only_its_last_traces() {
    let rig = rig(SessionConfig {
        turns_per_minute: 1000,
        ..SessionConfig::default()
    });
    let key = group().session_key();
    let turns = u32::try_from(KEEP_TRACES).unwrap() + 3;
    for id in 1..=turns {
        rig.say(id, &format!("@parlor number {id}")).await;
        rig.platform.wait_sent(id as usize).await;
    }
    let traces = trace::recent(rig.store.as_ref(), &key).unwrap();
    assert_eq!(traces.len() as u64, KEEP_TRACES);
    assert!(traces[0].input.contains(&format!("number {turns}")));
    assert!(traces.last().unwrap().input.contains("number 4"));
    assert_eq!(
        trace::head(rig.store.as_ref(), &key).unwrap().next,
        u64::from(turns)
    );
}

#[tokio::test]
async fn a_spent_budget_stops_turns_and_is_told_once_a_day() {
    let rig = rig(SessionConfig {
        daily_tokens_per_chat: Some(20),
        ..SessionConfig::default()
    });
    let key = group().session_key();
    rig.say(1, "@parlor one").await;
    rig.platform.wait_sent(1).await;
    // 12 of 20: the next turn still runs, and reaches the budget.
    rig.say(2, "@parlor two").await;
    rig.platform.wait_sent(2).await;
    rig.say(3, "@parlor three").await;
    let sent = rig.platform.wait_sent(3).await;
    assert_eq!(sent[2].text, BUDGET_NOTICE);
    // Told already: answered without a word. A /reset queued behind it shows it is done.
    rig.say(4, "@parlor four").await;
    rig.say(5, "/reset").await;
    let sent = rig.platform.wait_sent(4).await;
    assert!(sent[3].text.contains("Only an admin"), "{}", sent[3].text);
    assert!(rig.store.pending().unwrap().is_empty());
    let day = usage::day_usage(rig.store.as_ref(), usage::today(), &key).unwrap();
    assert_eq!(
        (day.turns, day.total_tokens, day.budget_told),
        (2, 24, true)
    );
    // Turns that did not run leave no trace.
    assert_eq!(trace::recent(rig.store.as_ref(), &key).unwrap().len(), 2);
}

/// The sessions read wall time from `SessionConfig::wall_time`: anchored to paused tokio
/// time, a spent budget opens again when a day of paused time has passed, and the new
/// day's usage is counted on its own date.
#[tokio::test(start_paused = true)]
async fn a_spent_budget_opens_again_the_next_day_of_the_sessions_clock() {
    use chrono::TimeZone;
    let start = chrono::Utc
        .with_ymd_and_hms(2026, 3, 2, 23, 0, 0)
        .single()
        .unwrap();
    let rig = rig(SessionConfig {
        daily_tokens_per_chat: Some(10),
        wall_time: parlor_bot::time::WallTime::anchored_at(start),
        ..SessionConfig::default()
    });
    let key = group().session_key();
    rig.say(1, "@parlor one").await;
    rig.platform.wait_sent(1).await;
    rig.say(2, "@parlor two").await;
    let sent = rig.platform.wait_sent(2).await;
    assert_eq!(sent[1].text, BUDGET_NOTICE);
    tokio::time::advance(std::time::Duration::from_secs(2 * 3600)).await;
    rig.say(3, "@parlor three").await;
    let sent = rig.platform.wait_sent(3).await;
    assert_eq!(sent[2].text, "fine", "a new day, a new budget");
    let first = usage::day_usage(rig.store.as_ref(), start.date_naive(), &key).unwrap();
    let next = start.date_naive().succ_opt().unwrap();
    let second = usage::day_usage(rig.store.as_ref(), next, &key).unwrap();
    assert_eq!((first.turns, first.budget_told), (1, true));
    assert_eq!((second.turns, second.budget_told), (1, false));
}

#[tokio::test]
async fn a_member_over_budget_is_refused_before_the_model_is_asked_and_told_once_per_chat() {
    let rig = rig(SessionConfig {
        daily_tokens_per_member: Some(20),
        ..SessionConfig::default()
    });
    let key = group().session_key();
    rig.say(1, "@parlor one").await;
    rig.platform.wait_sent(1).await;
    // 12 of 20: alice's next turn still runs, and reaches her budget.
    rig.say(2, "@parlor two").await;
    rig.platform.wait_sent(2).await;
    assert_eq!(rig.llm.requests().len(), 2);
    rig.say(3, "@parlor three").await;
    let sent = rig.platform.wait_sent(3).await;
    assert_eq!(sent[2].text, format!("alice {MEMBER_BUDGET_NOTICE}"));
    assert_eq!(rig.llm.requests().len(), 2, "the model was not asked");
    // Told already: her next mention is answered without a word; bob still has his budget.
    rig.say(4, "@parlor four").await;
    parlor_bot::testing::wait_until(
        "alice's input done",
        parlor_bot::testing::WAIT_LIMIT,
        || rig.store.pending().unwrap().is_empty(),
    )
    .await;
    rig.say_as(&group(), 5, "bob", "@parlor hi").await;
    let sent = rig.platform.wait_sent(4).await;
    assert_eq!(sent[3].text, "fine");
    assert_eq!(rig.llm.requests().len(), 3);

    let day = usage::today();
    assert_eq!(
        usage::member_today(rig.store.as_ref(), day, "test:alice", &key).unwrap(),
        (24, true)
    );
    assert_eq!(
        usage::member_today(rig.store.as_ref(), day, "test:bob", &key).unwrap(),
        (12, false)
    );
    // The chat's own count has every turn.
    let chat = usage::day_usage(rig.store.as_ref(), day, &key).unwrap();
    assert_eq!((chat.turns, chat.total_tokens), (3, 36));

    // Her budget holds in every chat; each chat is told once.
    let other = ChatRef::new("test", "-200");
    rig.say_as(&other, 6, "alice", "@parlor over here?").await;
    let sent = rig.platform.wait_sent(5).await;
    assert_eq!(sent[4].chat, other);
    assert_eq!(sent[4].text, format!("alice {MEMBER_BUDGET_NOTICE}"));
    assert_eq!(rig.llm.requests().len(), 3);

    rig.say(7, "/status").await;
    let status = rig.platform.wait_sent(6).await;
    assert!(
        status[5]
            .text
            .contains("Your tokens today, in every chat: 24 of 20"),
        "{}",
        status[5].text
    );
}

#[tokio::test]
async fn cache_reads_are_counted_per_day_and_shown_by_status() {
    let llm = ScriptedLlm::answering(|_, _| {
        Ok(parlor_bot::llm::Completion {
            usage: Some(parlor_bot::llm::Usage {
                prompt_tokens: 100,
                completion_tokens: 10,
                total_tokens: 110,
                cache_read_tokens: 80,
                cache_write_tokens: 20,
            }),
            ..text("fine")
        })
    })
    .shared();
    let store = Arc::new(MemoryStore::new());
    let platform = TestPlatform::new();
    let manager = toolless_manager(
        store.clone() as Arc<dyn Store>,
        llm,
        &platform,
        SessionConfig::default(),
        AgentConfig::default(),
    );
    for (id, text) in [(1, "@parlor one"), (2, "@parlor two")] {
        manager
            .deliver(message(&group(), id, "alice", text))
            .await
            .unwrap();
        platform.wait_sent(id as usize).await;
    }
    let day = usage::day_usage(store.as_ref(), usage::today(), &group().session_key()).unwrap();
    assert_eq!(
        (
            day.prompt_tokens,
            day.cache_read_tokens,
            day.cache_write_tokens
        ),
        (200, 160, 40)
    );
    manager
        .deliver(message(&group(), 3, "alice", "/status"))
        .await
        .unwrap();
    let sent = platform.wait_sent(3).await;
    assert!(
        sent[2]
            .text
            .contains("Tokens today (UTC): 220 (80% of prompt tokens read from the cache)"),
        "{}",
        sent[2].text
    );
}

/// What background work left (`usage_pending`) is folded into the chat's next commit: the
/// chat's day and its starter's, one record each even when the starter is also the turn's
/// member, and the pending record goes in the same commit.
#[tokio::test]
async fn work_spent_outside_a_turn_is_folded_into_the_next_commit_once() {
    let rig = rig(SessionConfig::default());
    let key = group().session_key();
    let mut spend = parlor_bot::llm::Spend::default();
    let used = parlor_bot::llm::Usage {
        prompt_tokens: 100,
        completion_tokens: 20,
        total_tokens: 120,
        ..Default::default()
    };
    spend.add("cheap", &used);
    spend.add("cheap", &used);
    let write = usage::pending_write(&key, "sa-1", Some(("test:alice", "alice")), &spend)
        .unwrap()
        .unwrap();
    rig.store.kv_write(vec![write]).unwrap();
    assert_eq!(
        usage::pending_write(&key, "sa-2", None, &parlor_bot::llm::Spend::default()).unwrap(),
        None,
        "nothing spent, nothing left"
    );

    rig.say(1, "@parlor hi").await;
    rig.platform.wait_sent(1).await;
    rig.say(2, "@parlor again").await;
    rig.platform.wait_sent(2).await;

    let day = usage::today();
    let chat = usage::day_usage(rig.store.as_ref(), day, &key).unwrap();
    assert_eq!((chat.turns, chat.total_tokens), (2, 24 + 240));
    // Each `text("fine")` reports 10 prompt tokens.
    assert_eq!(chat.prompt_tokens, 200 + 2 * 10);
    let members = usage::members_on(rig.store.as_ref(), day, None).unwrap();
    assert_eq!(members.len(), 1, "{members:?}");
    assert_eq!(
        (members[0].2.turns, members[0].2.total_tokens),
        (2, 24 + 240)
    );
    assert!(
        rig.store
            .kv_scan(usage::PENDING_SPACE, "")
            .unwrap()
            .is_empty(),
        "folded once"
    );
}
