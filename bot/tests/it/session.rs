//! The session layer with an in-memory platform and a gated model: group policy, threading,
//! bursts, commands, overflow, restart and shutdown.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use parlor_bot::agent::{Agent, AgentConfig, ImageOptions};
use parlor_bot::llm::{Content, Message};
use parlor_bot::platform::{
    ChatKind, ChatRef, Delivery, ImageRef, Inbox, InboxError, IncomingMessage, Platform,
    PlatformError,
};
use parlor_bot::session::{SessionConfig, SessionManager};
use parlor_bot::store::{MemoryStore, Store};
use parlor_bot::testing::{
    CrashStore, PNG_1X1, ScriptedLlm, Sent, TestPlatform, WAIT_LIMIT, group, message,
    toolless_manager, wait_until,
};
use parlor_bot::tool::ToolRegistry;

/// A model that answers `reply: <last line of the user's text>`; unless `open`, only once the
/// test releases a permit.
fn model(open: bool) -> Arc<ScriptedLlm> {
    let llm = ScriptedLlm::echo();
    if open { llm } else { llm.gated() }.shared()
}

/// A platform that records what it was asked to send and serves [`PNG_1X1`] for every image.
fn platform() -> Arc<TestPlatform> {
    let platform = TestPlatform::new();
    platform.serve_any(PNG_1X1.to_vec());
    platform
}

/// What a platform answers while the network is down.
fn network_down() -> PlatformError {
    PlatformError::Unavailable("network down".into())
}

fn msg(id: u32, who: &str, text: &str) -> IncomingMessage {
    message(&group(), id, who, text)
}

struct Rig {
    manager: SessionManager,
    store: Arc<MemoryStore>,
    platform: Arc<TestPlatform>,
    llm: Arc<ScriptedLlm>,
}

fn rig_with(
    store: Arc<MemoryStore>,
    llm: Arc<ScriptedLlm>,
    platform: Arc<TestPlatform>,
    config: SessionConfig,
) -> Rig {
    rig_with_agent(store, llm, platform, config, AgentConfig::default())
}

fn rig_with_agent(
    store: Arc<MemoryStore>,
    llm: Arc<ScriptedLlm>,
    platform: Arc<TestPlatform>,
    config: SessionConfig,
    agent: AgentConfig,
) -> Rig {
    let manager = toolless_manager(
        store.clone() as Arc<dyn Store>,
        llm.clone(),
        &platform,
        config,
        agent,
    );
    Rig {
        manager,
        store,
        platform,
        llm,
    }
}

/// A rig on a fresh store; the model is gated unless `open`.
fn rig_config(open: bool, config: SessionConfig) -> Rig {
    rig_with(
        Arc::new(MemoryStore::new()),
        model(open),
        platform(),
        config,
    )
}

fn rig(open: bool) -> Rig {
    rig_config(open, SessionConfig::default())
}

impl Rig {
    /// Delivers `m`, which must be taken.
    async fn deliver(&self, m: IncomingMessage) {
        self.manager.deliver(m).await.unwrap();
    }

    /// Delivers message `id` from `who` in the group.
    async fn say(&self, id: u32, who: &str, text: &str) {
        self.deliver(msg(id, who, text)).await;
    }

    /// Says `@parlor sentinel` (message `id`, from zed) and waits for its reply; every message
    /// so far. The group's inputs are served in order, so whatever came before it is done by
    /// then: how a test sees that nothing else happened. A gated model needs a permit for it.
    async fn sentinel(&self, id: u32) -> Vec<Sent> {
        self.say(id, "zed", "@parlor sentinel").await;
        let reply = format!("reply: {SENTINEL}");
        self.platform.wait_sent_where(|s| s.text == reply).await
    }
}

/// The sentinel's input, as its turn shows it.
const SENTINEL: &str = "zed (test:zed): @parlor sentinel";

#[tokio::test]
async fn a_mention_gets_a_threaded_reply_and_other_messages_are_only_recorded() {
    let rig = rig(true);
    rig.say(1, "bob", "nice weather").await;
    rig.say(2, "alice", "hi @parlor").await;
    let sent = rig.platform.wait_sent(1).await;
    assert_eq!(sent[0].chat, group());
    assert_eq!(sent[0].text, "reply: alice (test:alice): hi @parlor");
    assert_eq!(
        sent[0].reply_to.as_deref(),
        Some("2"),
        "threaded to the mention"
    );
    assert_eq!(rig.llm.user_inputs(), ["alice (test:alice): hi @parlor"]);
    // No tool needed more than a member, so the chat's admins were never asked for: a new
    // chat's first reply does not wait for that round trip.
    assert_eq!(rig.platform.admin_lookups(), 0);

    let log = rig.store.recent_messages("test:-100", 10).unwrap();
    let texts: Vec<&str> = log.iter().map(|m| m.text.as_str()).collect();
    assert_eq!(
        texts,
        [
            "nice weather",
            "hi @parlor",
            "reply: alice (test:alice): hi @parlor"
        ]
    );
    assert!(log[2].from_self);
    let history = rig.store.load_history("test:-100").unwrap();
    assert_eq!(history.len(), 2);
    assert!(rig.store.pending().unwrap().is_empty());
    assert!(rig.store.unsent_outbox().unwrap().is_empty());
}

#[tokio::test]
async fn replies_to_the_bot_and_dms_are_addressed_but_bots_are_ignored() {
    let rig = rig(true);
    let mut reply = msg(1, "carol", "and tomorrow?");
    reply.reply_to = Some("bot-9".into());
    reply.reply_to_bot = true;
    rig.deliver(reply).await;
    rig.platform.wait_sent(1).await;

    let mut dm = msg(2, "dave", "hello");
    dm.chat = ChatRef::new("test", "77");
    dm.kind = ChatKind::Private;
    rig.deliver(dm).await;
    rig.platform.wait_sent(2).await;

    let mut other_bot = msg(3, "otherbot", "@parlor ping");
    other_bot.sender.is_bot = true;
    rig.deliver(other_bot).await;
    let sent = rig.sentinel(4).await;
    assert_eq!(sent.len(), 3, "a bot's mention starts no turn: {sent:?}");
    let inputs = rig.llm.user_inputs();
    assert_eq!(inputs.len(), 3, "{inputs:?}");
    assert_eq!(inputs[2], SENTINEL, "nor joins the next one");
}

#[tokio::test]
async fn a_burst_during_a_slow_turn_becomes_one_turn_with_every_sender() {
    let rig = rig(false);
    rig.say(1, "alice", "@parlor first").await;
    // The first turn is now waiting on the model.
    rig.llm.wait_requests(1).await;
    for i in 0..20 {
        let who = format!("user{i}");
        rig.say(10 + i, &who, &format!("@parlor question {i}"))
            .await;
    }
    rig.llm.release(100);
    let sent = rig.platform.wait_sent(2).await;
    rig.sentinel(99).await;
    let inputs = rig.llm.user_inputs();
    let burst = inputs[1..]
        .iter()
        .filter(|i| i.contains("question"))
        .count();
    assert!(burst <= 2, "at most 2 further turns: {inputs:?}");
    let merged = inputs[1..].join("\n");
    for i in 0..20 {
        assert!(
            merged.contains(&format!("user{i} (test:user{i}): @parlor question {i}")),
            "user{i} missing in {merged}"
        );
    }
    // The merged reply threads to the latest message of the burst.
    assert_eq!(sent[1].reply_to.as_deref(), Some("29"));
    assert!(rig.store.pending().unwrap().is_empty());
}

#[tokio::test]
async fn duplicate_deliveries_are_answered_once() {
    let rig = rig(true);
    rig.say(5, "alice", "@parlor once").await;
    rig.say(5, "alice", "@parlor once").await;
    rig.platform.wait_sent(1).await;
    let sent = rig.sentinel(6).await;
    assert_eq!(sent.len(), 2, "once, then the sentinel: {sent:?}");
    assert_eq!(rig.llm.user_inputs().len(), 2);
}

#[tokio::test]
async fn stop_cancels_the_running_turn_and_reset_forgets() {
    let rig = rig(false);
    rig.say(1, "alice", "@parlor long task").await;
    rig.llm.wait_requests(1).await;
    rig.say(2, "alice", "/stop").await;
    let sent = rig.platform.wait_sent(1).await;
    assert_eq!(sent[0].text, "Stopped.");
    rig.llm.release(1);
    let sent = rig.sentinel(9).await;
    assert_eq!(sent.len(), 2, "a stopped turn sends no reply: {sent:?}");
    assert!(
        rig.store.pending().unwrap().is_empty(),
        "a stopped input is done"
    );
    // The cancelled turn's user message is kept: the history shows what was asked (then
    // the sentinel's turn).
    let history = rig.store.load_history("test:-100").unwrap();
    assert_eq!(history.len(), 3, "{history:?}");
    assert_eq!(
        history[0],
        Message::user("alice (test:alice): @parlor long task")
    );

    // /reset in a group needs an admin.
    rig.say(3, "alice", "/reset").await;
    let sent = rig.platform.wait_sent(3).await;
    assert_eq!(sent[2].text, "Only an admin can reset this chat.");

    let admin = rig_with(
        rig.store.clone(),
        rig.llm.clone(),
        platform(),
        SessionConfig::default(),
    );
    admin.platform.set_admins_everywhere(&["test:alice"]);
    admin.say(4, "alice", "/reset").await;
    let sent = admin.platform.wait_sent(1).await;
    assert!(sent[0].text.starts_with("Done"), "{}", sent[0].text);
    // `/reset` decides on the role before anything runs: looked up in the actor.
    assert_eq!(admin.platform.admin_lookups(), 1);
    assert!(rig.store.load_history("test:-100").unwrap().is_empty());
}

#[tokio::test]
async fn help_and_status_answer_without_the_model() {
    let rig = rig(true);
    rig.say(1, "alice", "/help").await;
    rig.say(2, "alice", "/status").await;
    rig.say(3, "alice", "/weather@otherbot").await;
    let sent = rig.platform.wait_sent(2).await;
    assert!(sent[0].text.contains("/reset"), "{}", sent[0].text);
    assert!(
        sent[1].text.contains("Session test:-100"),
        "{}",
        sent[1].text
    );
    let sent = rig.sentinel(4).await;
    assert_eq!(sent.len(), 3, "{sent:?}");
    assert_eq!(
        rig.llm.user_inputs(),
        [SENTINEL],
        "only the sentinel asked the model"
    );
}

#[tokio::test]
async fn overflow_is_told_to_the_chat() {
    let config = SessionConfig {
        queue_capacity: 1,
        ..SessionConfig::default()
    };
    let rig = rig_config(false, config);
    // A clock-like non-stackable kind cannot merge, but user messages do: fill the single
    // slot with a merged burst of MAX_LINES_PER_ITEM lines, then one more overflows.
    rig.say(1, "alice", "@parlor first").await;
    rig.llm.wait_requests(1).await;
    for i in 0..51 {
        rig.say(100 + i, "bob", &format!("@parlor {i}")).await;
    }
    let sent = rig.platform.wait_sent(1).await;
    assert!(
        sent[0].text.contains("too many messages"),
        "{}",
        sent[0].text
    );
    assert_eq!(sent[0].reply_to.as_deref(), Some("150"));
    // The refused message is not left pending; the 50 queued ones are.
    assert_eq!(rig.store.pending().unwrap().len(), 1 + 50);
}

#[tokio::test]
async fn after_a_crash_pending_inputs_resume_once_and_unsent_replies_go_out() {
    let store = Arc::new(MemoryStore::new());
    let llm = model(false);
    let first = rig_with(
        store.clone(),
        llm.clone(),
        platform(),
        SessionConfig::default(),
    );
    first.say(1, "alice", "@parlor are you there?").await;
    llm.wait_requests(1).await;
    // "kill -9": the process is gone mid-turn; only the store survives.
    drop(first);
    assert_eq!(store.pending().unwrap().len(), 1);

    let llm2 = model(true);
    let second = rig_with(
        store.clone(),
        llm2.clone(),
        platform(),
        SessionConfig::default(),
    );
    second.manager.resume().await.unwrap();
    // The platform redelivers the unacknowledged message: deduped.
    second.say(1, "alice", "@parlor are you there?").await;
    let sent = second.platform.wait_sent(1).await;
    assert_eq!(
        sent[0].text,
        "reply: alice (test:alice): @parlor are you there?"
    );
    let sent = second.sentinel(2).await;
    assert_eq!(sent.len(), 2, "answered once: {sent:?}");
    assert_eq!(llm2.user_inputs().len(), 2);
    assert!(store.pending().unwrap().is_empty());
}

#[tokio::test]
async fn an_input_whose_turn_stopped_the_daemon_twice_is_set_aside_with_a_notice() {
    use parlor_bot::session::quarantine;
    let store = Arc::new(MemoryStore::new());
    // Two lives die in the middle of the same turn ("kill -9": only the store survives).
    let first_llm = model(false);
    let first = rig_with(
        store.clone(),
        first_llm.clone(),
        platform(),
        SessionConfig::default(),
    );
    // A picture: the input whose turn can stop the daemon (memory), so its start is marked.
    let mut picture = msg(1, "mallory", "@parlor look at this");
    picture.images = vec![ImageRef {
        file_id: "f1".into(),
        mime_type: Some("image/png".into()),
        size: Some(PNG_1X1.len() as u64),
    }];
    first.deliver(picture).await;
    first_llm.wait_requests(1).await;
    drop(first);
    let second_llm = model(false);
    let second = rig_with(
        store.clone(),
        second_llm.clone(),
        platform(),
        SessionConfig::default(),
    );
    second.manager.resume().await.unwrap();
    second_llm.wait_requests(1).await;
    drop(second);
    let id = store.pending().unwrap()[0].id;
    assert_eq!(
        store.kv_get(quarantine::STARTS, &id.to_string()).unwrap(),
        Some("2".to_owned())
    );

    // The third start does not run it again: it is set aside and the chat told.
    let third = rig(true);
    let third = rig_with(
        store.clone(),
        third.llm.clone(),
        third.platform.clone(),
        SessionConfig::default(),
    );
    third.manager.resume().await.unwrap();
    let sent = third.platform.wait_sent(1).await;
    assert!(
        sent[0]
            .text
            .starts_with("I set aside a message from mallory"),
        "{}",
        sent[0].text
    );
    assert_eq!(sent[0].reply_to.as_deref(), Some("1"));
    assert!(third.llm.requests().is_empty(), "the model was not asked");
    assert!(store.pending().unwrap().is_empty());
    let kept = store.kv_scan(quarantine::QUARANTINE, "").unwrap();
    assert_eq!(kept.len(), 1);
    assert!(kept[0].1.contains("look at this"), "{kept:?}");
    assert_eq!(
        store.kv_get(quarantine::STARTS, &id.to_string()).unwrap(),
        None
    );

    // A turn that commits leaves no mark behind; text is never marked.
    let mut picture = msg(2, "alice", "@parlor and this?");
    picture.images = vec![ImageRef {
        file_id: "f2".into(),
        mime_type: Some("image/png".into()),
        size: Some(PNG_1X1.len() as u64),
    }];
    third.deliver(picture).await;
    third.platform.wait_sent(2).await;
    third.say(3, "alice", "@parlor hello").await;
    third.platform.wait_sent(3).await;
    assert!(store.kv_scan(quarantine::STARTS, "").unwrap().is_empty());
}

#[tokio::test]
async fn a_text_input_is_answered_however_often_the_daemon_died_during_its_turn() {
    let store = Arc::new(MemoryStore::new());
    for _ in 0..3 {
        let llm = model(false);
        let life = rig_with(
            store.clone(),
            llm.clone(),
            platform(),
            SessionConfig::default(),
        );
        life.manager.resume().await.unwrap();
        if store.pending().unwrap().is_empty() {
            life.say(1, "alice", "@parlor are you there?").await;
        }
        llm.wait_requests(1).await;
        drop(life);
    }
    let last = rig(true);
    let last = rig_with(
        store.clone(),
        last.llm.clone(),
        last.platform.clone(),
        SessionConfig::default(),
    );
    last.manager.resume().await.unwrap();
    let sent = last.platform.wait_sent(1).await;
    assert_eq!(
        sent[0].text,
        "reply: alice (test:alice): @parlor are you there?"
    );
}

#[tokio::test]
async fn a_reply_the_platform_could_not_take_is_sent_after_restart() {
    let store = Arc::new(MemoryStore::new());
    let down = platform();
    down.fail_sends(Some(network_down()));
    let first = rig_with(store.clone(), model(true), down, SessionConfig::default());
    first.say(1, "alice", "@parlor hi").await;
    // A reply is sent from the outbox: once the platform refused it, it is there.
    first.platform.wait_attempts(1).await;
    assert_eq!(store.unsent_outbox().unwrap().len(), 1);
    drop(first);

    let second = rig_with(
        store.clone(),
        model(true),
        platform(),
        SessionConfig::default(),
    );
    second.manager.resume().await.unwrap();
    let sent = second.platform.wait_sent(1).await;
    assert_eq!(sent[0].text, "reply: alice (test:alice): @parlor hi");
    assert_eq!(sent[0].reply_to.as_deref(), Some("1"));
    assert!(store.unsent_outbox().unwrap().is_empty());
    assert_eq!(
        store.load_history("test:-100").unwrap().len(),
        2,
        "the turn ran once"
    );
}

/// The outbox owns a long reply's progress: the parts sent before an outage are recorded
/// on its row, and the retry, after a restart too, sends only the rest.
#[tokio::test]
async fn a_long_reply_cut_by_an_outage_sends_only_its_missing_parts_after_a_restart() {
    let store = Arc::new(MemoryStore::new());
    // The reply `reply: alice (test:alice): @parlor hi` goes out in three parts.
    let cut = TestPlatform::default().parts_at(": ").shared();
    cut.fail_sends(Some(network_down()));
    cut.fail_after(1, network_down());
    let first = rig_with(store.clone(), model(true), cut, SessionConfig::default());
    first.say(1, "alice", "@parlor hi").await;
    first.platform.wait_attempts(2).await;
    wait_until("the sent part recorded on the row", WAIT_LIMIT, || {
        let unsent = store.unsent_outbox().unwrap();
        unsent.first().is_some_and(|row| row.sent_ids == ["bot-1"])
    })
    .await;
    let id = store.unsent_outbox().unwrap()[0].id;
    assert_eq!(first.platform.sent().len(), 1);
    drop(first);

    let up = TestPlatform::default()
        .parts_at(": ")
        .ids("new-", 1)
        .shared();
    let second = rig_with(store.clone(), model(true), up, SessionConfig::default());
    second.manager.resume().await.unwrap();
    let sent = second.platform.wait_sent(2).await;
    let texts: Vec<&str> = sent.iter().map(|s| s.text.as_str()).collect();
    assert_eq!(texts, ["alice (test:alice)", "@parlor hi"], "no part twice");
    assert!(
        sent.iter().all(|s| s.reply_to.is_none()),
        "only the first part replies"
    );
    wait_until("the reply marked sent", WAIT_LIMIT, || {
        store.unsent_outbox().unwrap().is_empty()
    })
    .await;
    let record = store.sent_reply(id).unwrap().expect("kept");
    assert_eq!(record.sent_ids, ["bot-1", "new-1", "new-2"]);
}

/// The waiter of a scheduled input travels with it; at shutdown, whether the input was
/// running or waiting, it learns at once that nothing will be posted now.
#[tokio::test(start_paused = true)]
async fn shutdown_tells_each_scheduled_input_it_was_abandoned() {
    let rig = rig(false);
    let running = rig
        .manager
        .submit_scheduled(&group(), "[scheduled task] one".into(), Default::default())
        .await
        .unwrap();
    rig.llm.wait_requests(1).await;
    let waiting = rig
        .manager
        .submit_scheduled(&group(), "[scheduled task] two".into(), Default::default())
        .await
        .unwrap();
    rig.manager.shutdown(Duration::from_millis(50)).await;
    assert!(running.await.is_err(), "the running one was abandoned");
    assert!(waiting.await.is_err(), "the waiting one was abandoned");
    assert_eq!(
        rig.store.pending().unwrap().len(),
        2,
        "both run after the restart"
    );
    assert!(rig.platform.sent().is_empty());
}

#[tokio::test]
async fn shutdown_cancels_after_the_grace_period_and_keeps_the_input_pending() {
    let rig = rig(false);
    rig.say(1, "alice", "@parlor slow").await;
    rig.llm.wait_requests(1).await;
    rig.manager.shutdown(Duration::from_millis(50)).await;
    assert!(rig.platform.sent().is_empty());
    assert_eq!(
        rig.store.pending().unwrap().len(),
        1,
        "resumes after the restart"
    );
    assert!(
        rig.store.load_history("test:-100").unwrap().is_empty(),
        "nothing half-written"
    );
    let err = rig
        .manager
        .deliver(msg(2, "bob", "@parlor late"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("shutting down"));
}

#[tokio::test(start_paused = true)]
async fn the_rate_limit_delays_turns_and_merges_what_waits() {
    let config = SessionConfig {
        turns_per_minute: 2,
        ..SessionConfig::default()
    };
    let rig = rig_config(true, config);
    for i in 0..2 {
        rig.say(i, "alice", &format!("@parlor {i}")).await;
        rig.platform.wait_sent(i as usize + 1).await;
    }
    let start = tokio::time::Instant::now();
    rig.say(2, "alice", "@parlor 2").await;
    // The actor is waiting out the limit now (time is paused: this second passes at once);
    // what arrives meanwhile still merges with the input it waits with.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for i in 3..6 {
        rig.say(i, "alice", &format!("@parlor {i}")).await;
    }
    tokio::time::sleep(Duration::from_secs(50)).await;
    assert_eq!(
        rig.platform.sent().len(),
        2,
        "no third turn within the minute"
    );
    tokio::time::sleep(Duration::from_secs(15)).await;
    rig.platform.wait_sent(3).await;
    assert!(
        start.elapsed() >= Duration::from_secs(60),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(
        rig.llm.user_inputs().len(),
        3,
        "the four waiting messages merged into one turn"
    );
}

#[tokio::test]
async fn images_reach_a_vision_model_in_their_turn_and_history_keeps_only_a_reference() {
    let agent = AgentConfig {
        images: ImageOptions {
            vision: true,
            ..ImageOptions::default()
        },
        ..AgentConfig::default()
    };
    let rig = rig_with_agent(
        Arc::new(MemoryStore::new()),
        model(true),
        platform(),
        SessionConfig::default(),
        agent,
    );
    let mut m = msg(1, "alice", "@parlor what is this?");
    m.images = vec![ImageRef {
        file_id: "f1".into(),
        mime_type: Some("image/png".into()),
        size: Some(PNG_1X1.len() as u64),
    }];
    rig.deliver(m).await;
    rig.platform.wait_sent(1).await;
    let request = rig.llm.requests()[0].clone();
    let Some(Message::User {
        content: Content::Parts(parts),
    }) = request.messages.last()
    else {
        panic!("expected content parts");
    };
    let photo = base64::engine::general_purpose::STANDARD.encode(PNG_1X1);
    let json = serde_json::to_value(&parts[1]).unwrap();
    assert_eq!(
        json["image_url"]["url"],
        format!("data:image/png;base64,{photo}")
    );

    // The store has the reference, with the message it came with; no image bytes.
    let history = serde_json::to_string(&rig.store.load_history("test:-100").unwrap()).unwrap();
    assert!(!history.contains("data:"), "{history}");
    assert!(!history.contains(&photo), "{history}");
    assert!(
        history.contains(r#"{"type":"image_ref","image":{"file_id":"f1","#),
        "{history}"
    );
    assert!(history.contains(r#""message_id":"1""#), "{history}");

    // The next turn names the photo and does not download it again.
    rig.say(2, "alice", "@parlor and the colours?").await;
    rig.platform.wait_sent(2).await;
    let second = rig.llm.requests()[1].clone();
    let body = parlor_bot::llm::OpenAiClient::request_body(&second).to_string();
    assert!(!body.contains(&photo), "{body}");
    assert_eq!(
        second.messages[1],
        Message::user(
            "alice (test:alice): @parlor what is this?\n[image from message 1; load_image can \
             show it again]"
        )
    );
    assert_eq!(rig.platform.downloads().len(), 1);
}

#[tokio::test]
async fn a_scheduled_input_runs_as_its_own_turn_and_reports_the_posted_ids() {
    use parlor_bot::session::ScheduledOutcome;
    let rig = rig(false);
    rig.say(1, "alice", "@parlor first").await;
    rig.llm.wait_requests(1).await;
    // Queued behind the running turn, between two user messages: it must not merge.
    rig.say(2, "bob", "@parlor second").await;
    let outcome = rig
        .manager
        .submit_scheduled(
            &group(),
            "[scheduled task] post the reminder".into(),
            Default::default(),
        )
        .await
        .unwrap();
    rig.say(3, "carol", "@parlor third").await;
    rig.llm.release(100);
    let outcome = tokio::time::timeout(Duration::from_secs(5), outcome)
        .await
        .unwrap()
        .unwrap();
    let ScheduledOutcome::Posted(ids) = outcome else {
        panic!("expected a posted reply, got {outcome:?}");
    };
    let sent = rig.platform.wait_sent(3).await;
    let scheduled = sent
        .iter()
        .position(|s| s.text.contains("[scheduled task]"))
        .unwrap();
    assert_eq!(ids, [format!("bot-{}", scheduled + 1)]);
    assert_eq!(
        sent[scheduled].reply_to, None,
        "a scheduled reply threads to nothing"
    );
    let inputs = rig.llm.user_inputs();
    assert!(
        inputs.contains(&"[scheduled task] post the reminder".to_owned()),
        "{inputs:?}"
    );
    assert!(rig.store.pending().unwrap().is_empty());
}

/// A clock fire that arrives as the daemon starts is stored and queued; the resume then
/// reads the store's pending inputs, that one included. Offered twice, it runs once.
#[tokio::test]
async fn a_pending_input_is_queued_once_whoever_offers_it() {
    let rig = rig(false);
    let first = rig
        .manager
        .submit_scheduled(&group(), "[scheduled task] one".into(), Default::default())
        .await
        .unwrap();
    // Its turn is running; a second fire waits behind it.
    rig.llm.wait_requests(1).await;
    let second = rig
        .manager
        .submit_scheduled(&group(), "[scheduled task] two".into(), Default::default())
        .await
        .unwrap();
    assert_eq!(rig.store.pending().unwrap().len(), 2);
    assert_eq!(rig.manager.queued_items(), 1);
    rig.manager.resume().await.unwrap();
    assert_eq!(
        rig.manager.queued_items(),
        1,
        "neither the running input nor the waiting one is queued again"
    );
    rig.llm.release(100);
    for outcome in [first, second] {
        tokio::time::timeout(Duration::from_secs(5), outcome)
            .await
            .unwrap()
            .unwrap();
    }
    assert_eq!(
        rig.llm.user_inputs(),
        ["[scheduled task] one", "[scheduled task] two"]
    );
    assert_eq!(rig.manager.queued_items(), 0);
    assert!(rig.store.pending().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn idle_sessions_leave_memory_and_come_back_from_the_store() {
    let config = SessionConfig {
        idle_timeout: Duration::from_secs(60),
        ..SessionConfig::default()
    };
    let rig = rig_config(true, config);
    rig.say(1, "alice", "@parlor hi").await;
    rig.platform.wait_sent(1).await;
    assert_eq!(rig.manager.live_sessions(), 1);
    tokio::time::sleep(Duration::from_secs(61)).await;
    assert_eq!(
        rig.manager.live_sessions(),
        0,
        "the idle session left memory"
    );
    rig.say(2, "alice", "@parlor again").await;
    rig.platform.wait_sent(2).await;
    // The history came back from the store: the second request carries the first turn.
    let requests = rig.llm.requests();
    assert_eq!(requests[1].messages.len(), 1 + 2 + 1);
}

#[tokio::test]
async fn notices_merge_while_busy_and_a_withdrawn_one_is_never_delivered() {
    let rig = rig(false);
    rig.say(1, "alice", "@parlor start").await;
    rig.llm.wait_requests(1).await;
    let system = parlor_bot::tool::Caller::default();
    let a = rig
        .manager
        .submit_notice(&group(), "<R>a</R>".into(), system.clone(), Vec::new())
        .await
        .unwrap();
    let b = rig
        .manager
        .submit_notice(&group(), "<R>b</R>".into(), system.clone(), Vec::new())
        .await
        .unwrap();
    let c = rig
        .manager
        .submit_notice(&group(), "<R>c</R>".into(), system, Vec::new())
        .await
        .unwrap();
    assert!(rig.manager.withdraw(&group(), b).unwrap());
    assert!(
        !rig.manager.withdraw(&group(), b).unwrap(),
        "already withdrawn"
    );
    rig.llm.release(100);
    rig.platform.wait_sent(2).await;
    rig.sentinel(2).await;
    let inputs = rig.llm.user_inputs();
    assert_eq!(inputs.len(), 3, "{inputs:?}");
    assert_eq!(inputs[1], "<R>a</R>\n<R>c</R>");
    assert_eq!(inputs[2], SENTINEL);
    assert!(rig.store.pending().unwrap().is_empty());
    let _ = (a, c);
}

#[tokio::test]
async fn without_vision_the_model_is_told_an_image_was_attached() {
    let rig = rig(true);
    let mut m = msg(1, "alice", "@parlor look");
    m.images = vec![ImageRef {
        file_id: "f1".into(),
        mime_type: None,
        size: None,
    }];
    rig.deliver(m).await;
    rig.platform.wait_sent(1).await;
    assert_eq!(
        rig.llm.user_inputs(),
        ["alice (test:alice): @parlor look\n[1 image attached; this model cannot see images]"]
    );
    assert_eq!(rig.platform.downloads().len(), 0, "nothing to download");
}

/// A manager with an instant model and no tools over `store` and `platform`.
fn plain_manager(store: Arc<dyn Store>, platform: Arc<dyn Platform>) -> SessionManager {
    let registry = ToolRegistry::new(vec![]).unwrap();
    let agent = Agent::new(model(true), registry, "test", AgentConfig::default());
    SessionManager::new(store, agent, vec![platform], SessionConfig::default())
}

fn mention_in(chat: &str, id: u32, who: &str) -> IncomingMessage {
    let mut m = msg(id, who, &format!("@parlor question {id}"));
    m.chat = ChatRef::new("test", chat);
    m
}

#[tokio::test(start_paused = true)]
async fn a_chat_held_by_retry_after_does_not_hold_another_chat() {
    let rig = rig(true);
    let held = ChatRef::new("test", "-1");
    rig.platform.fail_sends_in(
        &held,
        Some(PlatformError::RateLimited(Duration::from_secs(60))),
    );
    let start = tokio::time::Instant::now();
    rig.deliver(mention_in("-1", 1, "alice")).await;
    rig.deliver(mention_in("-2", 2, "bob")).await;
    let sent = rig.platform.wait_sent(1).await;
    assert_eq!(sent[0].chat.chat_id, "-2", "the other chat is answered");
    assert!(
        start.elapsed() < Duration::from_secs(60),
        "without waiting for the held chat: {:?}",
        start.elapsed()
    );
    // The held chat's reply is waiting in the outbox, not lost.
    assert_eq!(rig.store.unsent_outbox().unwrap().len(), 1);
    rig.platform.fail_sends_in(&held, None);
    let sent = rig
        .platform
        .wait_sent_within(2, Duration::from_secs(120))
        .await;
    assert_eq!(sent[1].chat.chat_id, "-1");
    assert!(
        start.elapsed() >= Duration::from_secs(60),
        "retry_after honoured"
    );
    assert!(rig.store.unsent_outbox().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_outbox_delivers_after_hours_of_outage_and_never_twice() {
    let rig = rig(true);
    rig.platform.fail_sends(Some(network_down()));
    rig.say(1, "alice", "@parlor are you there?").await;
    // Three hours of outage, in paused time: the lane keeps trying, backing off.
    tokio::time::sleep(Duration::from_secs(3 * 3600)).await;
    let tries = rig.platform.attempts();
    assert!(
        (20..200).contains(&tries),
        "kept trying with backoff capped at minutes: {tries} tries"
    );
    assert_eq!(rig.store.unsent_outbox().unwrap().len(), 1);
    rig.platform.fail_sends(None);
    let sent = rig
        .platform
        .wait_sent_within(1, Duration::from_secs(600))
        .await;
    assert_eq!(
        sent[0].text,
        "reply: alice (test:alice): @parlor are you there?"
    );
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert_eq!(rig.platform.sent().len(), 1, "sent once");
    assert!(rig.store.unsent_outbox().unwrap().is_empty());
    assert!(rig.manager.is_idle());
}

#[tokio::test(start_paused = true)]
async fn a_reply_the_platform_refuses_for_good_is_given_up_with_its_reason() {
    // Refuses every send: the bot was removed from the chat.
    let kicked = TestPlatform::new();
    kicked.fail_sends(Some(PlatformError::Refused(
        "Forbidden: bot was kicked".into(),
    )));
    let store = Arc::new(MemoryStore::new());
    let manager = plain_manager(store.clone(), kicked);
    manager
        .deliver(msg(1, "alice", "@parlor hi"))
        .await
        .unwrap();
    wait_until("idle", WAIT_LIMIT, || manager.is_idle()).await;
    assert!(store.unsent_outbox().unwrap().is_empty(), "given up");
    assert!(store.pending().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_racing_delivery_runs_each_question_once() {
    let rig = rig_config(
        true,
        SessionConfig {
            // Evict the moment the queue is empty, so that every delivery races eviction.
            idle_timeout: Duration::ZERO,
            turns_per_minute: 1_000_000,
            queue_capacity: 10_000,
            ..SessionConfig::default()
        },
    );
    let rig = Arc::new(rig);
    let mut senders = Vec::new();
    for lane in 0..2u32 {
        let rig = Arc::clone(&rig);
        senders.push(tokio::spawn(async move {
            for i in 0..1500u32 {
                let id = lane * 100_000 + i;
                rig.say(id, &format!("u{lane}"), &format!("@parlor q{id}"))
                    .await;
                // Varying pauses let the actor drain and evict just as the next
                // message arrives; the first sender also waits for the actor to end now
                // and then, so that many evictions happen while the other one sends.
                for _ in 0..(i * 7 + lane) % 40 {
                    tokio::task::yield_now().await;
                }
                if lane == 0 && i % 10 == 0 {
                    for _ in 0..100_000 {
                        if rig.manager.stats().actors_running == 0 {
                            break;
                        }
                        tokio::task::yield_now().await;
                    }
                }
            }
        }));
    }
    for s in senders {
        s.await.unwrap();
    }
    wait_until("every actor ended", Duration::from_secs(30), || {
        rig.manager.is_idle() && rig.manager.stats().actors_running == 0
    })
    .await;
    let stats = rig.manager.stats();
    eprintln!("eviction race: {stats:?}");
    assert!(
        stats.actors_started > 10,
        "eviction really raced delivery: {stats:?}"
    );
    assert!(rig.manager.is_idle(), "every input answered: {stats:?}");
    // Every question reached exactly one turn.
    let turns = rig.llm.user_inputs();
    let mut seen = std::collections::HashSet::new();
    for input in &turns {
        for line in input.lines() {
            assert!(seen.insert(line.to_owned()), "asked twice: {line}");
        }
    }
    assert_eq!(seen.len(), 3000, "every message reached a turn once");
    assert_eq!(rig.platform.sent().len(), turns.len(), "one reply per turn");
}

#[tokio::test(start_paused = true)]
async fn a_kill_after_any_store_write_loses_no_message_and_repeats_none_but_the_send_window() {
    // Five chats, one mention each, plus chatter and a command: the traffic of a restart.
    let traffic: Vec<IncomingMessage> = (1..=5u32)
        .flat_map(|i| {
            let mut chatter = msg(100 + i, "bob", "just talking");
            chatter.chat = ChatRef::new("test", format!("-{i}"));
            let mut help = msg(200 + i, "carol", "/help");
            help.chat = ChatRef::new("test", format!("-{i}"));
            [chatter, mention_in(&format!("-{i}"), i, "alice"), help]
        })
        .collect();
    for limit in 0..40 {
        let inner = Arc::new(MemoryStore::new());
        let crash = CrashStore::new(inner.clone(), limit);
        let before = platform();
        let first = plain_manager(crash.clone(), before.clone());
        for m in &traffic {
            // A failed delivery is not acknowledged; the platform sends it again later.
            let _ = first.deliver(m.clone()).await;
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        first.shutdown(Duration::from_secs(1)).await;
        let killed_after = crash.writes();

        // The restart: what the store kept, and every message delivered again.
        let after = rig_with(
            inner.clone(),
            model(true),
            platform(),
            SessionConfig::default(),
        );
        after.manager.resume().await.unwrap();
        for m in &traffic {
            after.deliver(m.clone()).await;
        }
        wait_until(
            &format!("limit {limit}: everything settles"),
            WAIT_LIMIT,
            || after.manager.is_idle(),
        )
        .await;
        let sent: Vec<_> = before
            .sent()
            .into_iter()
            .chain(after.platform.sent())
            .collect();
        for i in 1..=5u32 {
            let replies = sent
                .iter()
                .filter(|s| s.chat.chat_id == format!("-{i}") && s.text.starts_with("reply:"))
                .count();
            // The one allowed repeat: sent before the kill, not yet marked sent.
            let window = before
                .sent()
                .iter()
                .any(|s| s.chat.chat_id == format!("-{i}") && s.text.starts_with("reply:"))
                && killed_after == limit;
            assert!(
                replies == 1 || (replies == 2 && window),
                "limit {limit}: chat -{i} got {replies} replies: {sent:?}"
            );
            let helps = sent
                .iter()
                .filter(|s| s.chat.chat_id == format!("-{i}") && s.text.starts_with("Mention me"))
                .count();
            assert!(
                helps == 1 || (helps == 2 && killed_after == limit),
                "limit {limit}: chat -{i} got {helps} /help answers"
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_task_notice_into_a_full_queue_is_told_now_not_at_the_next_start() {
    let rig = rig_config(
        false,
        SessionConfig {
            queue_capacity: 1,
            ..SessionConfig::default()
        },
    );
    rig.say(1, "alice", "@parlor first").await;
    rig.llm.wait_requests(1).await;
    // The running turn is busy and the one queue slot is taken.
    rig.say(2, "bob", "@parlor second").await;
    let system = parlor_bot::tool::Caller::default();
    rig.manager
        .submit_notice(&group(), "<R>done</R>".into(), system, Vec::new())
        .await
        .expect("a notice is never refused for a full queue");
    rig.llm.release(3);
    let sent = rig.platform.wait_sent(3).await;
    assert_eq!(sent.len(), 3, "{sent:?}");
    assert!(
        rig.llm
            .user_inputs()
            .iter()
            .any(|i| i.contains("<R>done</R>"))
    );
    assert!(rig.store.pending().unwrap().is_empty());
}

#[tokio::test]
async fn an_edit_while_waiting_changes_the_turn_and_an_edit_after_only_the_log() {
    use parlor_bot::platform::ChatEvent;
    let rig = rig(false);
    rig.say(1, "alice", "@parlor first").await;
    rig.llm.wait_requests(1).await;
    // Waiting behind the running turn: an edit reaches its turn.
    rig.say(2, "bob", "@parlor what is 2+3?").await;
    let mut edited = msg(2, "bob", "@parlor what is 2+2?");
    edited.text = "@parlor what is 2+2?".to_owned();
    rig.manager
        .chat_event(ChatEvent::Edited(edited))
        .await
        .unwrap();
    let key = group().session_key();
    assert_eq!(
        rig.store.get_message(&key, "2").unwrap().unwrap().text,
        "@parlor what is 2+2?"
    );
    rig.llm.release(100);
    rig.platform.wait_sent(2).await;
    let inputs = rig.llm.user_inputs();
    assert!(inputs[1].contains("what is 2+2?"), "{inputs:?}");
    assert!(!inputs[1].contains("2+3"), "{inputs:?}");

    // Answered: the log takes the edit, no new turn starts.
    rig.manager
        .chat_event(ChatEvent::Edited(msg(1, "alice", "@parlor first, edited")))
        .await
        .unwrap();
    assert_eq!(
        rig.store.get_message(&key, "1").unwrap().unwrap().text,
        "@parlor first, edited"
    );
    rig.sentinel(3).await;
    let inputs = rig.llm.user_inputs();
    assert_eq!(inputs.len(), 3, "{inputs:?}");
    assert_eq!(inputs[2], SENTINEL);
    assert!(rig.store.pending().unwrap().is_empty());
}

#[tokio::test]
async fn a_migration_moves_waiting_inputs_and_their_answers_go_to_the_new_chat() {
    use parlor_bot::platform::ChatEvent;
    let rig = rig(false);
    let old = ChatRef::new("test", "-5001");
    let new = ChatRef::new("test", "-1005001");
    rig.deliver(message(&old, 1, "alice", "@parlor first"))
        .await;
    rig.llm.wait_requests(1).await;
    rig.deliver(message(&old, 2, "bob", "@parlor second")).await;
    let event = ChatEvent::Migrated {
        from: old.clone(),
        to: new.clone(),
    };
    rig.manager.chat_event(event.clone()).await.unwrap();
    rig.manager.chat_event(event).await.unwrap();
    rig.llm.release(100);
    rig.platform.wait_sent(2).await;
    // The waiting input was answered in the new chat, unthreaded; the running one, which
    // started before the move, still answers where it was asked.
    let sent = rig.platform.sent_in(&new);
    assert_eq!(sent.len(), 1, "{:?}", rig.platform.sent());
    assert!(sent[0].text.contains("second"), "{sent:?}");
    assert_eq!(sent[0].reply_to, None);
    assert_eq!(rig.llm.user_inputs().len(), 2);
    assert!(rig.store.pending().unwrap().is_empty());
    let log = rig.store.recent_messages(&new.session_key(), 10).unwrap();
    let ids: Vec<&str> = log.iter().map(|m| m.message_id.as_str()).collect();
    assert_eq!(
        ids[..2],
        ["-5001/1", "-5001/2"],
        "then the bot's own reply: {ids:?}"
    );
}

/// The texts of a request's user and assistant messages, in order.
fn conversation(request: &parlor_bot::llm::ChatRequest) -> Vec<String> {
    request
        .messages
        .iter()
        .filter_map(|m| match m {
            parlor_bot::llm::Message::User { content } => Some(content.text()),
            parlor_bot::llm::Message::Assistant { content, .. } => content.clone(),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_chat_moving_in_during_a_turn_shows_its_history_to_the_next_turn() {
    use parlor_bot::platform::ChatEvent;
    let rig = rig(false);
    let old = ChatRef::new("test", "-5002");
    let new = ChatRef::new("test", "-1005002");
    rig.deliver(message(&old, 1, "bob", "@parlor in the old chat"))
        .await;
    rig.llm.wait_requests(1).await;
    rig.llm.release(1);
    rig.platform.wait_sent(1).await;
    // A turn runs in the new chat with another input queued behind it (a busy chat keeps
    // its history in memory for the next turn) when the old chat moves in.
    rig.deliver(message(&new, 1, "alice", "@parlor in the new chat"))
        .await;
    rig.llm.wait_requests(2).await;
    rig.deliver(message(&new, 2, "carol", "@parlor after the move"))
        .await;
    let event = ChatEvent::Migrated {
        from: old.clone(),
        to: new.clone(),
    };
    rig.manager.chat_event(event).await.unwrap();
    rig.llm.release(1);
    let requests = rig.llm.wait_requests(3).await;
    rig.llm.release(1);
    rig.platform.wait_sent(3).await;
    let seen = conversation(&requests[2]).join("\n");
    let (moved, own, now) = (
        seen.find("in the old chat"),
        seen.find("in the new chat"),
        seen.find("after the move"),
    );
    assert!(
        moved.is_some() && moved < own && own < now,
        "the old chat's turn first, then the new chat's, then this input: {seen}"
    );
}

// ---- batches and durability --------------------------------------------------------------

#[tokio::test]
async fn a_batch_is_taken_in_order_with_one_wait_for_durability() {
    let rig = rig(false);
    let mut other = msg(1, "carol", "@parlor in the other chat");
    other.chat = ChatRef::new("test", "-200");
    let batch = vec![
        Delivery::Message(msg(1, "bob", "chatter")),
        Delivery::Message(msg(2, "alice", "@parlor first")),
        Delivery::Message(other),
        Delivery::Message(msg(3, "dave", "/help")),
        Delivery::Message(msg(4, "bob", "@parlor second")),
    ];
    rig.manager.deliver_all(batch).await.unwrap();
    assert_eq!(rig.store.flushes(), 1, "one flush for the whole batch");
    assert_eq!(rig.store.pending().unwrap().len(), 3);
    // The command's answer leaves once durable.
    let sent = rig.platform.wait_sent(1).await;
    assert!(sent[0].text.starts_with("Mention me"), "{sent:?}");

    // Within the group the order is kept: alice's input, then bob's (queued together, they
    // make one turn).
    rig.llm.wait_requests(2).await;
    rig.llm.release(2);
    rig.platform.wait_sent(3).await;
    let group: Vec<String> = rig
        .llm
        .user_inputs()
        .into_iter()
        .filter(|input| !input.contains("carol"))
        .collect();
    assert_eq!(
        group,
        ["alice (test:alice): @parlor first\nbob (test:bob): @parlor second"]
    );
}

#[tokio::test]
async fn a_store_failure_mid_batch_reports_only_the_durable_prefix() {
    let inner = Arc::new(MemoryStore::new());
    // Two writes go through, the third fails.
    let crash = CrashStore::new(inner.clone(), 2);
    let manager = plain_manager(crash.clone(), platform());
    let batch = (1..=4)
        .map(|i| Delivery::Message(mention_in(&format!("-{i}"), i, "alice")))
        .collect();
    let failed = manager.deliver_all(batch).await.unwrap_err();
    assert_eq!(failed.durable, 2, "{failed}");
    assert!(matches!(failed.error, InboxError::Store(_)));
    assert_eq!(
        inner.pending().unwrap().len() + inner.unsent_outbox().unwrap().len(),
        2
    );
    assert_eq!(crash.flushes(), 1, "the prefix was made durable");

    // A flush that fails: nothing is reported taken, though everything was written.
    let inner = Arc::new(MemoryStore::new());
    let crash = CrashStore::new(inner.clone(), usize::MAX);
    crash.fail_flushes();
    // A model that never answers: no turn commits meanwhile (each only marks its start).
    let registry = ToolRegistry::new(vec![]).unwrap();
    let agent = Agent::new(model(false), registry, "test", AgentConfig::default());
    let manager = SessionManager::new(
        crash.clone(),
        agent,
        vec![platform()],
        SessionConfig::default(),
    );
    let batch = (1..=3)
        .map(|i| Delivery::Message(mention_in(&format!("-{i}"), i, "alice")))
        .collect();
    let failed = manager.deliver_all(batch).await.unwrap_err();
    assert_eq!(failed.durable, 0, "{failed}");
    assert_eq!(inner.pending().unwrap().len(), 3, "everything was written");
}

#[tokio::test]
async fn a_duplicate_is_only_acknowledged_once_durable() {
    let inner = Arc::new(MemoryStore::new());
    let crash = CrashStore::new(inner.clone(), usize::MAX);
    let manager = plain_manager(crash.clone(), platform());
    crash.fail_flushes();
    // Recorded and queued, but not durable: the platform is not told.
    let m = mention_in("-1", 1, "alice");
    assert!(manager.deliver(m.clone()).await.is_err());
    // Delivered again, it is a duplicate, and still not durable.
    assert!(manager.deliver(m).await.is_err());
    assert_eq!(
        inner.pending().unwrap().len() + inner.unsent_outbox().unwrap().len(),
        1
    );
}

#[tokio::test]
async fn a_turn_appends_to_the_history_and_the_trim_drops_the_oldest_turns() {
    // A budget of about one turn.
    let config = SessionConfig {
        history_tokens: 30,
        ..SessionConfig::default()
    };
    let rig = rig_config(true, config);
    for i in 1..=3u32 {
        rig.say(i, "alice", &format!("@parlor q{i}")).await;
        rig.platform.wait_sent(i as usize).await;
    }
    let history = rig.store.load_history("test:-100").unwrap();
    let texts: Vec<String> = history
        .iter()
        .map(|m| match m {
            Message::User { content } => content.text(),
            Message::Assistant { content, .. } => content.clone().unwrap_or_default(),
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(
        texts,
        [
            "alice (test:alice): @parlor q3",
            "reply: alice (test:alice): @parlor q3"
        ]
    );
    // Each turn's request carried the history the trim left: the system prompt, the
    // previous turn, the input.
    let requests = rig.llm.requests();
    assert_eq!(requests[2].messages.len(), 4, "{:?}", requests[2].messages);
}

#[tokio::test]
async fn typing_shows_while_the_model_thinks() {
    let rig = rig(false);
    rig.say(1, "alice", "hi @parlor").await;
    rig.llm.wait_requests(1).await;
    tokio::time::timeout(Duration::from_secs(10), async {
        while rig.platform.typing() == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("typing while the model holds the turn");
    assert!(
        rig.platform.sent().is_empty(),
        "no reply before the model answers"
    );
    rig.llm.release(1);
    rig.platform.wait_sent(1).await;
}
