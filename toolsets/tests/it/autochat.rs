//! Auto-chat through the session layer with the real `message` toolset: unaddressed messages
//! batched by count and by time into one auto-chat turn, `send_message` offered only there and
//! limited per batch and per hour (also across a restart), the dry run, overheard commands
//! and an admin's chatter lending no rights, no sub-agent (whose result would post later),
//! the auto-chat turn's answer never posted, mentions first, and an unfinished batch surviving a
//! restart. Paused time throughout: every wait is for an event.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use parlor_bot::agent::{Agent, AgentConfig};
use parlor_bot::llm::{ChatRequest, Message};
use parlor_bot::platform::{Inbox, Platform};
use parlor_bot::session::{AutoChat, SessionConfig, SessionManager};
use parlor_bot::store::{MemoryStore, SledStore, Store, StoreOptions};
use parlor_bot::testing::{
    ScriptedLlm, TestPlatform, TestSpeech, calls, echo, group, last_text, message, tool_results,
};
use parlor_bot::tool::{
    Role, ToolContext, ToolRegistry, ToolResult, ToolSet, ToolSetBridge, codes,
};
use parlor_toolsets::message::{MessageOptions, MessageToolset};
use parlor_toolsets::subagent::{
    SUBAGENT_PROMPT, SubagentOptions, SubagentService, subagent_toolset,
};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::support;

fn auto(batch_messages: usize, batch_secs: u64, per_batch: u32, per_hour: u32) -> AutoChat {
    AutoChat {
        batch_messages,
        batch_wait: Duration::from_secs(batch_secs),
        max_sends_per_batch: per_batch,
        max_sends_per_hour: per_hour,
        ..AutoChat::new("test:-100")
    }
}

/// Whether `request` is an auto-chat turn's first: its input is the auto-chat batch.
fn auto_chat_request(request: &ChatRequest) -> bool {
    last_text(request).contains("<overheard>")
}

/// A model that answers an auto-chat turn's first request with `auto_chat` (each answer once, in
/// order) and everything else with the echo.
fn model(auto_chat: Vec<parlor_bot::llm::Completion>) -> Arc<ScriptedLlm> {
    let llm = ScriptedLlm::answering(|r, _| Ok(echo(r))).script_when(auto_chat_request);
    for answer in auto_chat {
        llm.push(Ok(answer));
    }
    llm.shared()
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct NoArgs {}

/// A tool only a chat admin may call: proof of the role an auto-chat turn runs with.
fn admin_tool() -> Arc<dyn ToolSet> {
    Arc::new(
        ToolSetBridge::builder("admin_test")
            .add_function("admin_only", "Needs a chat admin.", |_: NoArgs| async {
                ToolResult::ok("ran")
            })
            .role(Role::ChatAdmin)
            .build()
            .unwrap(),
    )
}

struct Rig {
    manager: SessionManager,
    platform: Arc<TestPlatform>,
    llm: Arc<ScriptedLlm>,
}

fn rig_on(store: Arc<dyn Store>, llm: Arc<ScriptedLlm>, auto: AutoChat) -> Rig {
    rig_with(store, llm, auto, Vec::new())
}

/// [`rig_on`] with `more` toolsets besides the message toolset and [`admin_tool`].
fn rig_with(
    store: Arc<dyn Store>,
    llm: Arc<ScriptedLlm>,
    auto: AutoChat,
    more: Vec<Arc<dyn ToolSet>>,
) -> Rig {
    let options = MessageOptions {
        auto_chat_turns: true,
        ..MessageOptions::default()
    };
    let messages = MessageToolset::new(Arc::clone(&store), options).unwrap();
    let mut toolsets: Vec<Arc<dyn ToolSet>> = vec![Arc::new(messages), admin_tool()];
    toolsets.extend(more);
    let registry = ToolRegistry::new(toolsets).unwrap();
    let agent = Agent::new(llm.clone(), registry, "test", AgentConfig::default());
    let platform = TestPlatform::new();
    let config = SessionConfig {
        admins: vec!["test:root".into()],
        auto_chat: vec![auto],
        ..SessionConfig::default()
    };
    let manager = SessionManager::new(
        store,
        agent,
        vec![platform.clone() as Arc<dyn Platform>],
        config,
    );
    Rig {
        manager,
        platform,
        llm,
    }
}

fn rig(llm: Arc<ScriptedLlm>, auto: AutoChat) -> Rig {
    rig_on(Arc::new(MemoryStore::new()), llm, auto)
}

impl Rig {
    async fn say(&self, id: u32, who: &str, text: &str) {
        self.manager
            .deliver(message(&group(), id, who, text))
            .await
            .unwrap();
    }

    /// Mentions the bot and waits for the reply, so every earlier turn of the chat has
    /// committed and every earlier send has left (one actor and one lane per chat, in
    /// order). The texts posted so far.
    async fn mention_and_wait(&self, id: u32) -> Vec<String> {
        let before = self.platform.sent().len();
        self.say(id, "alice", "@parlor ping").await;
        let sent = self.platform.wait_sent(before + 1).await;
        assert_eq!(
            sent.last().unwrap().text,
            "reply: alice (test:alice): @parlor ping"
        );
        sent.into_iter().map(|s| s.text).collect()
    }

    /// The tool results of the auto-chat turn whose first request was number `first`.
    fn results_after(&self, first: usize) -> Vec<Value> {
        let requests = self.llm.requests();
        let messages = &requests[first + 1].messages;
        // This turn's: after its input, the last user message.
        let input = messages
            .iter()
            .rposition(|m| matches!(m, Message::User { .. }))
            .unwrap();
        tool_results(&messages[input..])
            .into_iter()
            .map(|(_, v)| v)
            .collect()
    }
}

fn tool_names(request: &ChatRequest) -> String {
    request.tools.wire_json().to_owned()
}

#[tokio::test(start_paused = true)]
async fn a_batch_is_flushed_at_its_count_as_one_auto_chat_turn_offering_send_message() {
    let rig = rig(model(vec![]), auto(3, 3600, 1, 6));
    let start = Instant::now();
    rig.say(1, "bob", "nice weather").await;
    rig.say(2, "carol", "indeed\nsunny").await;
    rig.say(3, "bob", "shall we go out?").await;
    let requests = rig.llm.wait_requests(1).await;
    assert!(rig.llm.request_times()[0] - start < Duration::from_secs(1));
    let input = last_text(&requests[0]);
    assert!(
        input.contains("nobody addressed these messages to you"),
        "{input}"
    );
    assert!(input.contains(
        "<overheard>\nbob (test:bob): nice weather\ncarol (test:carol): indeed\n  sunny\nbob (test:bob): shall we go out?\n</overheard>"
    ), "{input}");
    let tools = tool_names(&requests[0]);
    assert!(tools.contains("\"send_message\""), "{tools}");
    assert!(!tools.contains("send_markdown"), "{tools}");
    // The echo's answer is the auto-chat turn's final text: never posted.
    let sent = rig.mention_and_wait(4).await;
    assert_eq!(sent, ["reply: alice (test:alice): @parlor ping"]);
    let mention = rig.llm.requests().last().cloned().unwrap();
    let tools = tool_names(&mention);
    assert!(
        tools.contains("send_markdown") && !tools.contains("\"send_message\""),
        "{tools}"
    );
    assert_eq!(
        rig.llm
            .requests()
            .iter()
            .filter(|r| auto_chat_request(r))
            .count(),
        1
    );
}

#[tokio::test(start_paused = true)]
async fn a_batch_is_flushed_its_wait_after_the_first_message() {
    let rig = rig(model(vec![]), auto(10, 5, 1, 6));
    let start = Instant::now();
    rig.say(1, "bob", "anyone here?").await;
    rig.say(2, "carol", "me").await;
    let requests = rig.llm.wait_requests(1).await;
    let after = rig.llm.request_times()[0] - start;
    assert!(
        after >= Duration::from_secs(5) && after < Duration::from_secs(6),
        "{after:?}"
    );
    assert!(last_text(&requests[0]).contains("carol (test:carol): me"));
}

#[tokio::test(start_paused = true)]
async fn send_message_posts_through_the_outbox_at_most_k_times_per_batch() {
    let llm = model(vec![calls(&[
        ("c1", "send_message", json!({"text": "Go to the park!"})),
        ("c2", "send_message", json!({"text": "Really, go."})),
    ])]);
    let rig = rig(llm, auto(1, 60, 1, 6));
    rig.say(1, "bob", "where should we go?").await;
    let sent = rig.platform.wait_sent(1).await;
    assert_eq!(sent[0].text, "Go to the park!");
    assert_eq!(sent[0].reply_to, None);
    let sent = rig.mention_and_wait(2).await;
    assert_eq!(
        sent,
        ["Go to the park!", "reply: alice (test:alice): @parlor ping"]
    );
    let results = rig.results_after(0);
    assert_eq!(results[0]["success"], true, "{results:?}");
    assert_eq!(results[0]["data"]["left_in_batch"], 0);
    assert_eq!(results[1]["error_code"], codes::RATE_LIMITED, "{results:?}");
    assert!(
        results[1]["message"]
            .as_str()
            .unwrap()
            .contains("per batch")
            || results[1]["message"]
                .as_str()
                .unwrap()
                .contains("about these messages")
    );
}

#[tokio::test(start_paused = true)]
async fn send_message_is_limited_per_hour_across_batches() {
    let say = |t: &str| calls(&[("c", "send_message", json!({ "text": t }))]);
    let llm = model(vec![say("one"), say("two"), say("three")]);
    let rig = rig(llm, auto(1, 60, 5, 2));
    for (id, text) in [(1, "a"), (2, "b"), (3, "c")] {
        rig.say(id, "bob", text).await;
        // Each its own batch: the next message only after this batch's turn began.
        rig.llm.wait_requests(2 * id as usize).await;
    }
    let sent = rig.mention_and_wait(9).await;
    assert_eq!(
        sent,
        ["one", "two", "reply: alice (test:alice): @parlor ping"]
    );
    let third = rig.results_after(4);
    assert_eq!(third[0]["error_code"], codes::RATE_LIMITED, "{third:?}");
    assert!(
        third[0]["message"]
            .as_str()
            .unwrap()
            .contains("within the hour")
    );
}

#[tokio::test(start_paused = true)]
async fn the_hourly_limit_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let open = || {
        Arc::new(SledStore::open(dir.path(), StoreOptions::default()).unwrap()) as Arc<dyn Store>
    };
    let say = |t: &str| calls(&[("c", "send_message", json!({ "text": t }))]);
    {
        let rig = rig_on(open(), model(vec![say("before")]), auto(1, 60, 1, 1));
        rig.say(1, "bob", "a").await;
        rig.platform.wait_sent(1).await;
        rig.mention_and_wait(2).await;
        rig.manager.shutdown(Duration::from_secs(5)).await;
    }
    let rig = rig_on(open(), model(vec![say("after")]), auto(1, 60, 1, 1));
    rig.manager.resume().await.unwrap();
    rig.say(3, "bob", "b").await;
    let sent = rig.mention_and_wait(4).await;
    assert_eq!(sent, ["reply: alice (test:alice): @parlor ping"]);
    let results = rig.results_after(0);
    assert_eq!(results[0]["error_code"], codes::RATE_LIMITED, "{results:?}");
}

/// The log lines written while the returned guard lives (this thread: the tests' runtime
/// is single-threaded).
fn capture_logs() -> (Arc<Mutex<Vec<u8>>>, tracing::subscriber::DefaultGuard) {
    #[derive(Clone)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);
    impl Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buffer = Arc::new(Mutex::new(Vec::new()));
    let writer = Buffer(Arc::clone(&buffer));
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    (buffer, tracing::subscriber::set_default(subscriber))
}

#[tokio::test(start_paused = true)]
async fn a_dry_run_logs_what_it_would_say_and_sends_nothing() {
    let (logs, _guard) = capture_logs();
    let llm = model(vec![calls(&[(
        "c",
        "send_message",
        json!({"text": "Hello, park people"}),
    )])]);
    let rig = rig(
        llm,
        AutoChat {
            dry_run: true,
            ..auto(1, 60, 1, 6)
        },
    );
    rig.say(1, "bob", "hi all").await;
    // The auto-chat turn's request and the one with its tool result.
    rig.llm.wait_requests(2).await;
    let sent = rig.mention_and_wait(2).await;
    assert_eq!(sent, ["reply: alice (test:alice): @parlor ping"]);
    let results = rig.results_after(0);
    assert_eq!(results[0]["success"], true, "{results:?}");
    assert_eq!(results[0]["data"]["dry_run"], true);
    let logs = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
    let line = logs
        .lines()
        .find(|l| l.contains("would have said"))
        .unwrap_or_else(|| panic!("no dry-run line in {logs}"));
    assert!(
        line.contains("INFO") && line.contains("test:-100") && line.contains("Hello, park people"),
        "{line}"
    );
}

#[tokio::test(start_paused = true)]
async fn unaddressed_commands_do_nothing_and_an_admins_chatter_lends_no_rights() {
    let llm = model(vec![calls(&[("c", "admin_only", json!({}))])]);
    let rig = rig(llm, auto(2, 60, 1, 6));
    // A conversation to lose, were anything reset.
    rig.mention_and_wait(1).await;
    rig.say(2, "root", "ok bot /reset and /stop please").await;
    rig.say(3, "bob", "and then /compact now").await;
    rig.llm.wait_requests(2).await;
    let sent = rig.mention_and_wait(4).await;
    assert_eq!(
        sent,
        [
            "reply: alice (test:alice): @parlor ping",
            "reply: alice (test:alice): @parlor ping"
        ]
    );
    // The auto-chat turn ran as the system with a member's role, though an operator wrote one
    // of its messages: an admin's tool is not even offered, and a call to it is unknown.
    let results = rig.results_after(1);
    assert_eq!(
        results[0]["error_code"],
        codes::TOOL_NOT_FOUND,
        "{results:?}"
    );
    let quiet = rig
        .llm
        .requests()
        .into_iter()
        .find(auto_chat_request)
        .unwrap();
    assert!(!tool_names(&quiet).contains("admin_only"));
    // Nothing was reset: the last mention's request still carries the first one.
    let last = rig.llm.requests().last().cloned().unwrap();
    let users = last
        .messages
        .iter()
        .filter(|m| matches!(m, Message::User { .. }))
        .count();
    assert_eq!(users, 3, "first mention, the auto-chat batch and this one");
}

#[tokio::test(start_paused = true)]
async fn a_mention_during_a_batch_is_answered_first_and_normally() {
    let rig = rig(model(vec![]), auto(10, 5, 1, 6));
    let start = Instant::now();
    rig.say(1, "bob", "chatting along").await;
    let sent = rig.mention_and_wait(2).await;
    assert_eq!(sent, ["reply: alice (test:alice): @parlor ping"]);
    assert!(Instant::now() - start < Duration::from_secs(5));
    assert!(!auto_chat_request(&rig.llm.requests()[0]));
    // The batch keeps its own turn, at its time.
    let requests = rig.llm.wait_requests(2).await;
    assert!(auto_chat_request(&requests[1]));
    assert!(!last_text(&requests[1]).contains("ping"));
    assert!(rig.llm.request_times()[1] - start >= Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn an_unfinished_batch_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let open = || {
        Arc::new(SledStore::open(dir.path(), StoreOptions::default()).unwrap()) as Arc<dyn Store>
    };
    {
        let rig = rig_on(open(), model(vec![]), auto(10, 3600, 1, 6));
        rig.say(1, "bob", "first").await;
        rig.say(2, "carol", "second").await;
        rig.manager.shutdown(Duration::from_secs(5)).await;
        assert!(rig.llm.requests().is_empty());
    }
    let llm = model(vec![calls(&[(
        "c",
        "send_message",
        json!({"text": "welcome back"}),
    )])]);
    let rig = rig_on(open(), llm, auto(10, 3600, 1, 6));
    let start = Instant::now();
    rig.manager.resume().await.unwrap();
    let requests = rig.llm.wait_requests(1).await;
    assert!(rig.llm.request_times()[0] - start < Duration::from_secs(1));
    let input = last_text(&requests[0]);
    assert!(
        input.contains("bob (test:bob): first\ncarol (test:carol): second"),
        "{input}"
    );
    assert_eq!(rig.platform.wait_sent(1).await[0].text, "welcome back");
}

#[tokio::test]
async fn send_message_is_offered_only_in_auto_chat_turns_and_send_markdown_only_outside() {
    let store = Arc::new(MemoryStore::new()) as Arc<dyn Store>;
    let without = MessageToolset::new(Arc::clone(&store), MessageOptions::default()).unwrap();
    assert!(!without.tools().iter().any(|t| t.name == "send_message"));
    let options = MessageOptions {
        auto_chat_turns: true,
        ..MessageOptions::default()
    };
    let messages = MessageToolset::new(store, options).unwrap();
    let registry = ToolRegistry::new(vec![Arc::new(messages)]).unwrap();
    let (addressed, quiet) = (registry.defs_for(false), registry.defs_for(true));
    assert!(addressed.wire_json().contains("send_markdown"));
    assert!(!addressed.wire_json().contains("\"send_message\""));
    assert!(quiet.wire_json().contains("\"send_message\""));
    assert!(!quiet.wire_json().contains("send_markdown"));
    assert!(quiet.wire_json().contains("get_group_context"));

    let call =
        |name: &str, args: Value| parlor_bot::llm::ToolCall::new("c", name, args.to_string());
    let speech = TestSpeech::new();
    let auto_chat_cx = ToolContext {
        chat: Some(group()),
        auto_chat: Some(speech.clone() as Arc<dyn parlor_bot::tool::AutoChatSpeech>),
        ..ToolContext::default()
    };
    let addressed_cx = ToolContext {
        chat: Some(group()),
        ..ToolContext::default()
    };
    let hello = json!({"text": "hello"});
    let refused = registry
        .call(&call("send_message", hello.clone()), addressed_cx)
        .await;
    assert_eq!(refused.code(), Some(codes::TOOL_NOT_FOUND), "{refused:?}");
    let refused = registry
        .call(&call("send_markdown", hello.clone()), auto_chat_cx.clone())
        .await;
    assert_eq!(refused.code(), Some(codes::TOOL_NOT_FOUND), "{refused:?}");
    let long = json!({"text": "x".repeat(501)});
    let refused = registry
        .call(&call("send_message", long), auto_chat_cx.clone())
        .await;
    assert_eq!(
        refused.code(),
        Some(codes::INVALID_ARGUMENTS),
        "{refused:?}"
    );
    let said = registry
        .call(&call("send_message", hello), auto_chat_cx)
        .await;
    assert!(said.success, "{said:?}");
    assert_eq!(speech.said(), ["hello"]);
}

#[tokio::test(start_paused = true)]
async fn a_auto_chat_turn_is_not_offered_a_sub_agent_and_a_call_to_one_is_unknown() {
    // A background sub-agent's result posts later, into the group: an auto-chat turn (here in a
    // dry run, which must post nothing) cannot start one.
    let store = Arc::new(MemoryStore::new());
    let notifier = Arc::new(support::TestNotifier::default());
    let service = SubagentService::new(store.clone(), notifier.clone(), SubagentOptions::default());
    service.set_agent(Agent::new(
        ScriptedLlm::new(vec![]),
        ToolRegistry::new(Vec::new()).unwrap(),
        SUBAGENT_PROMPT,
        AgentConfig::default(),
    ));
    let llm = model(vec![calls(&[(
        "c",
        "subagent",
        json!({"task": "post hello in an hour", "run_in_background": true}),
    )])]);
    let rig = rig_with(
        store,
        llm,
        AutoChat {
            dry_run: true,
            ..auto(1, 60, 1, 6)
        },
        vec![Arc::new(subagent_toolset(service.clone())) as Arc<dyn ToolSet>],
    );
    rig.say(1, "bob", "hi all").await;
    rig.llm.wait_requests(2).await;
    rig.mention_and_wait(2).await;

    let requests = rig.llm.requests();
    let quiet = tool_names(&requests[0]);
    assert!(auto_chat_request(&requests[0]));
    assert!(!quiet.contains("\"subagent"), "{quiet}");
    let results = rig.results_after(0);
    assert_eq!(
        results[0]["error_code"],
        codes::TOOL_NOT_FOUND,
        "{results:?}"
    );
    let addressed = tool_names(requests.last().unwrap());
    for name in [
        "subagent",
        "subagent_output",
        "subagent_stop",
        "subagent_list",
    ] {
        assert!(addressed.contains(&format!("\"{name}\"")), "{addressed}");
    }
    assert!(
        service.rows(None).is_empty() && notifier.notices().is_empty(),
        "no sub-agent ran"
    );
}
