//! The OneBot adapter against `parlor_testkit::FakeOneBot`: real WebSockets on 127.0.0.1, in
//! both directions (parlor dialling the fake, the fake dialling parlor).
//!
//! Real time throughout (sockets and heartbeats need a running clock); waits are for
//! events the fake records, never a sleep before asserting that nothing happened.

use std::sync::Arc;
use std::time::Duration;

use parlor_adapters::onebot::{GroupRole, OneBotAdapter, OneBotConfig, OneBotError, Transport};
use parlor_bot::agent::{Agent, AgentConfig};
use parlor_bot::platform::{
    ChatEvent, ChatKind, ChatRef, ImageRef, Inbox, Platform, PlatformError,
};
use parlor_bot::session::{SessionConfig, SessionManager};
use parlor_bot::store::{MemoryStore, Store};
use parlor_bot::testing::{InboxMode, PNG_1X1, ScriptedLlm, TestInbox};
use parlor_bot::tool::ToolRegistry;
use parlor_testkit::{DialError, FakeOneBot, OneBotFailure};

use crate::support::{Running, eventually};

const TOKEN: &str = "onebot-TEST-token";
const SELF_ID: i64 = 42;
const GROUP: i64 = 555;
const ALICE: i64 = 1001;
const BOB: i64 = 1002;
const WAIT: Duration = Duration::from_secs(10);
const STOP: Duration = Duration::from_secs(5);

fn forward(fake: &FakeOneBot) -> OneBotConfig {
    OneBotConfig {
        min_send_interval: Duration::ZERO,
        request_timeout: Duration::from_secs(5),
        ..OneBotConfig::new(Transport::Forward { url: fake.ws_url() }).with_token(TOKEN)
    }
}

fn group() -> ChatRef {
    ChatRef::new("qq", format!("group:{GROUP}"))
}

/// The fake, and an adapter dialling it into `inbox`, connected.
async fn connected(inbox: Arc<dyn Inbox>) -> (FakeOneBot, OneBotAdapter, Running) {
    let fake = FakeOneBot::start(TOKEN, SELF_ID).await;
    let adapter = OneBotAdapter::new(forward(&fake)).unwrap();
    let running = Running::spawn(&adapter, inbox, || {});
    fake.wait_for_connections(1, WAIT).await.unwrap();
    eventually("the identity", || {
        (adapter.identity().self_id == SELF_ID).then_some(())
    })
    .await;
    (fake, adapter, running)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_in_both_formats_arrive_normalized() {
    let inbox = Arc::new(TestInbox::default());
    let (fake, _adapter, running) = connected(inbox.clone()).await;

    let mention = fake
        .group_message(GROUP, ALICE, "alice", " what is [x] & y, z?")
        .mention_bot()
        .role("admin")
        .push();
    let cq = fake
        .group_message(GROUP, BOB, "bob", " /help")
        .mention_bot()
        .as_cq_string()
        .push();
    let faces = fake
        .group_message(GROUP, BOB, "bob", "nice [CQ:fake] & more")
        .face(178)
        .as_cq_string()
        .push();
    fake.private_message(ALICE, "alice", "hello in private")
        .push();

    let messages = inbox.wait_for(4).await;
    assert_eq!(messages[0].message_id, mention.to_string());
    assert_eq!(messages[0].chat.session_key(), "qq:group:555");
    assert_eq!(messages[0].kind, ChatKind::Group);
    assert_eq!(messages[0].sender.id, "qq:1001");
    assert_eq!(messages[0].text, "@parlor what is [x] & y, z?");
    assert!(messages[0].mentions_bot);
    assert_eq!(messages[1].message_id, cq.to_string());
    assert_eq!(
        messages[1].text, "/help",
        "the command after the mention, CQ-decoded"
    );
    assert_eq!(messages[2].message_id, faces.to_string());
    assert_eq!(
        messages[2].text, "nice [CQ:fake] & more[face 178]",
        "escaped text read back as typed"
    );
    assert!(!messages[2].mentions_bot);
    assert_eq!(messages[3].chat.session_key(), "qq:private:1001");
    assert_eq!(messages[3].kind, ChatKind::Private);
    assert!(
        fake.pushed()[1]["message"].is_string(),
        "the second came as a CQ string"
    );
    assert!(running.stop(STOP).await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_is_refused_both_ways() {
    // Forward: the implementation refuses parlor, and the run ends at once.
    let fake = FakeOneBot::start(TOKEN, SELF_ID).await;
    let config = OneBotConfig {
        access_token: Some("wrong".into()),
        ..forward(&fake)
    };
    let adapter = OneBotAdapter::new(config).unwrap();
    let inbox: Arc<dyn Inbox> = Arc::new(TestInbox::default());
    let ended = tokio::time::timeout(WAIT, {
        use parlor_adapters::Receiver;
        adapter.run(inbox.clone(), tokio_util::sync::CancellationToken::new())
    })
    .await
    .unwrap();
    assert!(
        matches!(ended, Err(PlatformError::Unauthorized)),
        "{ended:?}"
    );
    // The fake counts the refusal once its answer is out, which may be after parlor read it.
    fake.wait_for_refusals(1, WAIT).await.unwrap();
    assert_eq!(fake.refused(), 1);

    // Reverse: parlor refuses the implementation, and takes the right one.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let (adapter, inbox, running, url) = listening(port).await;
    assert_eq!(
        fake.dial_reverse(&url, "wrong", &[]).await,
        Err(DialError::Refused(401))
    );
    assert_eq!(
        fake.dial_reverse(&url, "", &[]).await,
        Err(DialError::Refused(401))
    );
    fake.dial_reverse(&url, TOKEN, &[]).await.unwrap();
    fake.group_message(GROUP, ALICE, "alice", " over the reverse link")
        .mention_bot()
        .push();
    let messages = inbox.wait_for(1).await;
    assert_eq!(messages[0].text, "@parlor over the reverse link");
    let sent = adapter
        .send(&group(), "back the same way", None, None, &mut Vec::new())
        .await
        .unwrap();
    assert_eq!(fake.sent()[0].message_id.to_string(), sent.message_ids[0]);
    assert!(running.stop(STOP).await.is_ok());
}

/// A reverse-WebSocket adapter with the token listening on `port`, running into a fresh
/// test inbox; its URL for the fake to dial.
async fn listening(port: std::net::SocketAddr) -> (OneBotAdapter, Arc<TestInbox>, Running, String) {
    let config = OneBotConfig {
        min_send_interval: Duration::ZERO,
        ..OneBotConfig::new(Transport::Reverse { listen: port }).with_token(TOKEN)
    };
    let adapter = OneBotAdapter::new(config).unwrap();
    let inbox = Arc::new(TestInbox::default());
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let running = Running::spawn(&adapter, inbox.clone(), move || {
        let _ = ready_tx.send(());
    });
    ready_rx.await.unwrap();
    (
        adapter,
        inbox,
        running,
        format!("ws://{port}/onebot/v11/ws"),
    )
}

/// Connects `fake` to the reverse listener at `url` once the listener takes it (a refusal
/// with 409 means the connection before is still being let go).
async fn connect_when_free(fake: &FakeOneBot, url: &str) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match fake.dial_reverse(url, TOKEN, &[]).await {
            Ok(()) => return,
            Err(DialError::Refused(409)) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(refused) => panic!("refused with {refused}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reverse_listener_needs_the_token_refuses_browsers_and_keeps_its_first_connection() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let tokenless = OneBotAdapter::new(OneBotConfig::new(Transport::Reverse { listen: port }));
    assert!(
        matches!(tokenless, Err(PlatformError::Refused(_))),
        "{tokenless:?}"
    );
    let (adapter, inbox, running, url) = listening(port).await;
    let first = FakeOneBot::start(TOKEN, SELF_ID).await;
    let second = FakeOneBot::start(TOKEN, SELF_ID).await;

    // A web page's connection carries an Origin: refused even with the token.
    assert_eq!(
        first
            .dial_reverse(&url, TOKEN, &[("Origin", "http://evil.example")])
            .await,
        Err(DialError::Refused(403))
    );
    first.dial_reverse(&url, TOKEN, &[]).await.unwrap();
    first.wait_for_connections(1, WAIT).await.unwrap();
    // The newcomer has the token, and still does not displace the first.
    assert_eq!(
        second.dial_reverse(&url, TOKEN, &[]).await,
        Err(DialError::Refused(409))
    );
    first
        .group_message(GROUP, ALICE, "alice", " still here")
        .mention_bot()
        .push();
    assert_eq!(inbox.wait_for(1).await[0].text, "@parlor still here");
    adapter
        .send(&group(), "to the first", None, None, &mut Vec::new())
        .await
        .unwrap();
    assert_eq!(first.sent()[0].text(), "to the first");
    assert!(second.sent().is_empty());
    assert_eq!(second.connections(), 0);

    // Once the first is gone, the next one is taken.
    assert!(first.disconnect());
    connect_when_free(&second, &url).await;
    second
        .group_message(GROUP, ALICE, "alice", " from the second")
        .mention_bot()
        .push();
    assert_eq!(inbox.wait_for(2).await[1].text, "@parlor from the second");
    adapter
        .send(&group(), "to the second", None, None, &mut Vec::new())
        .await
        .unwrap();
    assert_eq!(second.sent()[0].text(), "to the second");
    assert!(running.stop(STOP).await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_threads_to_the_question_and_ats_the_asker_and_an_answer_to_it_is_addressed() {
    let inbox = Arc::new(TestInbox::default());
    let (fake, adapter, running) = connected(inbox.clone()).await;
    let question = fake
        .group_message(GROUP, ALICE, "alice", " question")
        .mention_bot()
        .push();
    inbox.wait_for(1).await;

    let sent = adapter
        .send(
            &group(),
            "**answer**",
            Some(&question.to_string()),
            Some("o1"),
            &mut Vec::new(),
        )
        .await
        .unwrap();
    let posted = &fake.sent()[0];
    assert_eq!(posted.action, "send_group_msg");
    assert_eq!(posted.group_id, Some(GROUP));
    assert_eq!(posted.reply_to(), Some(question.to_string()));
    assert_eq!(posted.at(), Some(ALICE.to_string()));
    assert_eq!(posted.text(), " answer", "plain text, no Markdown");
    assert_eq!(sent.message_ids, vec![posted.message_id.to_string()]);

    // Bob answers the bot's message without mentioning it: still addressed.
    fake.group_message(GROUP, BOB, "bob", "a follow-up")
        .reply_to(posted.message_id)
        .push();
    let messages = inbox.wait_for(2).await;
    assert_eq!(messages[1].reply_to, Some(posted.message_id.to_string()));
    assert!(messages[1].reply_to_bot);
    assert!(!messages[1].mentions_bot);

    // A private reply has no `at`.
    adapter
        .send(
            &ChatRef::new("qq", "private:1001"),
            "psst",
            Some("77"),
            None,
            &mut Vec::new(),
        )
        .await
        .unwrap();
    let private = &fake.sent()[1];
    assert_eq!(
        (private.action.as_str(), private.user_id),
        ("send_private_msg", Some(ALICE))
    );
    assert_eq!(private.at(), None);
    assert!(running.stop(STOP).await.is_ok());
}

/// The real session layer behind the adapter, over a memory store, with a model that
/// echoes.
fn session_layer(adapter: &OneBotAdapter, store: Arc<MemoryStore>) -> SessionManager {
    let registry = ToolRegistry::new(Vec::new()).expect("an empty registry");
    let agent = Agent::new(
        Arc::new(ScriptedLlm::echo()),
        registry,
        "test",
        AgentConfig::default(),
    );
    SessionManager::new(
        store as Arc<dyn Store>,
        agent,
        vec![Arc::new(adapter.clone()) as Arc<dyn Platform>],
        SessionConfig::default(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mentions_replies_and_commands_are_answered_chatter_and_duplicates_are_not() {
    let fake = FakeOneBot::start(TOKEN, SELF_ID).await;
    let adapter = OneBotAdapter::new(forward(&fake)).unwrap();
    let store = Arc::new(MemoryStore::new());
    let manager = session_layer(&adapter, store.clone());
    let running = Running::spawn(&adapter, Arc::new(manager.clone()), || {});
    fake.wait_for_connections(1, WAIT).await.unwrap();

    fake.group_message(GROUP, BOB, "bob", "just chatting")
        .push();
    let mention = fake
        .group_message(GROUP, ALICE, "alice", " what did bob say?")
        .mention_bot()
        .push();
    // The implementation resends the same event after a reconnect: answered once.
    fake.group_message(GROUP, ALICE, "alice", " what did bob say?")
        .mention_bot()
        .message_id(mention)
        .push();
    let first = fake.wait_for_sent(1, WAIT).await.unwrap();
    assert_eq!(first[0].reply_to(), Some(mention.to_string()));
    assert!(
        first[0].text().contains("what did bob say?"),
        "{}",
        first[0].text()
    );

    let command = fake
        .group_message(GROUP, BOB, "bob", " /help")
        .mention_bot()
        .as_cq_string()
        .push();
    let help = fake.wait_for_sent(2, WAIT).await.unwrap();
    assert_eq!(help[1].reply_to(), Some(command.to_string()));
    assert!(help[1].text().contains("/status"), "{}", help[1].text());

    let follow_up = fake
        .group_message(GROUP, BOB, "bob", "and you?")
        .reply_to(first[0].message_id)
        .push();
    let all = fake.wait_for_sent(3, WAIT).await.unwrap();
    assert_eq!(all[2].reply_to(), Some(follow_up.to_string()));

    // One more mention, so everything before it has been taken in order: nothing else
    // was answered (the chatter and the duplicate).
    let last = fake
        .group_message(GROUP, ALICE, "alice", " last")
        .mention_bot()
        .push();
    let all = fake.wait_for_sent(4, WAIT).await.unwrap();
    assert_eq!(all[3].reply_to(), Some(last.to_string()));
    assert_eq!(all.len(), 4);
    let texts: Vec<String> = store
        .recent_messages("qq:group:555", 20)
        .unwrap()
        .into_iter()
        .filter(|m| !m.from_self)
        .map(|m| m.text)
        .collect();
    assert_eq!(
        texts
            .iter()
            .filter(|t| t.contains("what did bob say?"))
            .count(),
        1,
        "{texts:?}"
    );
    assert!(
        texts.contains(&"just chatting".to_owned()),
        "chatter is recorded"
    );

    assert!(running.stop(STOP).await.is_ok());
    manager.shutdown(Duration::from_millis(200)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admins_come_from_sender_role() {
    let inbox = Arc::new(TestInbox::default());
    let (fake, adapter, running) = connected(inbox.clone()).await;
    fake.group_message(GROUP, ALICE, "alice", "hi")
        .role("owner")
        .push();
    fake.group_message(GROUP, BOB, "bob", "hi")
        .role("admin")
        .push();
    fake.group_message(GROUP, 1003, "carol", "hi")
        .role("member")
        .push();
    fake.group_message(GROUP + 1, 1004, "dave", "hi")
        .role("admin")
        .push();
    inbox.wait_for(4).await;
    assert_eq!(
        adapter.chat_admins(&group()).await.unwrap(),
        ["qq:1001", "qq:1002"]
    );

    // Bob loses his rights: his next message says so.
    fake.group_message(GROUP, BOB, "bob", "demoted")
        .role("member")
        .push();
    inbox.wait_for(5).await;
    assert_eq!(adapter.chat_admins(&group()).await.unwrap(), ["qq:1001"]);
    assert!(
        adapter
            .chat_admins(&ChatRef::new("qq", "private:1001"))
            .await
            .unwrap()
            .is_empty()
    );

    // Asked afresh with get_group_member_info.
    fake.set_role(GROUP, 1003, "admin");
    assert_eq!(
        adapter.member_role(GROUP, 1003).await.unwrap(),
        GroupRole::Admin
    );
    assert_eq!(
        adapter.chat_admins(&group()).await.unwrap(),
        ["qq:1001", "qq:1003"]
    );
    assert!(running.stop(STOP).await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_are_downloaded_by_url_or_by_get_image_within_the_limit() {
    let inbox = Arc::new(TestInbox::default());
    let (fake, adapter, running) = connected(inbox.clone()).await;
    let url = fake.add_image("cat.png", PNG_1X1.to_vec());
    fake.group_message(GROUP, ALICE, "alice", "look")
        .image(&url, PNG_1X1.len())
        .push();
    let messages = inbox.wait_for(1).await;
    let image = &messages[0].images[0];
    assert_eq!(image.file_id, url);
    assert_eq!(image.size, Some(PNG_1X1.len() as u64));
    assert_eq!(adapter.download_image(image).await.unwrap(), PNG_1X1);

    // Known by file name only: the URL comes from get_image.
    let by_name = ImageRef {
        file_id: "cat.png".to_owned(),
        mime_type: None,
        size: None,
    };
    assert_eq!(adapter.download_image(&by_name).await.unwrap(), PNG_1X1);
    assert_eq!(
        fake.wait_for_calls("get_image", 1, WAIT)
            .await
            .unwrap()
            .len(),
        1
    );

    let big = ImageRef {
        size: Some(u64::MAX),
        ..image.clone()
    };
    assert!(matches!(
        adapter.download_image(&big).await,
        Err(PlatformError::Refused(_))
    ));
    assert_eq!(
        fake.downloads(),
        ["cat.png", "cat.png"],
        "the oversize one was never fetched"
    );
    assert!(running.stop(STOP).await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retcode_is_a_typed_error() {
    let inbox = Arc::new(TestInbox::default());
    let (fake, adapter, running) = connected(inbox).await;
    fake.fail_next(
        "send_group_msg",
        OneBotFailure::Retcode(100, "bad group".to_owned()),
    );
    let refused = adapter
        .send(&group(), "hi", None, None, &mut Vec::new())
        .await;
    assert!(
        matches!(&refused, Err(PlatformError::Refused(m)) if m.contains("retcode 100") && m.contains("bad group")),
        "{refused:?}"
    );
    let unknown = adapter.call("no_such_action", serde_json::json!({})).await;
    assert!(
        matches!(unknown, Err(OneBotError::Action { retcode: 1404, .. })),
        "{unknown:?}"
    );
    assert!(matches!(
        PlatformError::from(unknown.unwrap_err()),
        PlatformError::NotFound(_)
    ));
    let bad_chat = adapter
        .send(
            &ChatRef::new("qq", "channel:1"),
            "hi",
            None,
            None,
            &mut Vec::new(),
        )
        .await;
    assert!(
        matches!(bad_chat, Err(PlatformError::NotFound(_))),
        "{bad_chat:?}"
    );
    assert!(fake.sent().is_empty());
    assert!(running.stop(STOP).await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_connection_reconnects_and_loses_no_reply() {
    let inbox = Arc::new(TestInbox::default());
    let (fake, adapter, running) = connected(inbox.clone()).await;
    // The connection drops while the reply is in flight, before it was done: the attempt
    // fails as an outage, and the outbox's retry goes over the new connection.
    fake.fail_next("send_group_msg", OneBotFailure::Drop);
    let dropped = adapter
        .send(&group(), "still here", None, Some("o7"), &mut Vec::new())
        .await;
    assert!(
        matches!(dropped, Err(PlatformError::Unavailable(_))),
        "{dropped:?}"
    );
    fake.wait_for_connections(2, WAIT).await.unwrap();
    let sent = adapter
        .send(&group(), "still here", None, Some("o7"), &mut Vec::new())
        .await
        .unwrap();
    assert_eq!(fake.connections(), 2, "dialled again");
    let posted = fake.sent();
    assert_eq!(posted.len(), 1);
    assert_eq!(posted[0].text(), "still here");
    assert_eq!(sent.message_ids, vec![posted[0].message_id.to_string()]);

    // The implementation closes the connection itself: messages flow again afterwards.
    assert!(fake.disconnect());
    fake.wait_for_connections(3, WAIT).await.unwrap();
    fake.group_message(GROUP, ALICE, "alice", "after the reconnect")
        .push();
    assert_eq!(inbox.wait_for(1).await[0].text, "after the reconnect");
    assert!(running.stop(STOP).await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_runtime_still_sends_its_last_replies_over_the_connection() {
    // The runtime refuses new input while it drains; its last replies go out over this very
    // connection, so refusing must not close it (it closes at shutdown).
    let inbox = TestInbox::new(InboxMode::ShuttingDown);
    let (fake, adapter, running) = connected(inbox.clone()).await;
    fake.group_message(GROUP, ALICE, "alice", "during the drain")
        .push();
    eventually("the refused delivery", || {
        (inbox.attempts() >= 1).then_some(())
    })
    .await;
    let sent = adapter
        .send(
            &group(),
            "the last reply",
            None,
            Some("o9"),
            &mut Vec::new(),
        )
        .await
        .unwrap();
    let posted = fake.sent();
    assert_eq!(posted.len(), 1);
    assert_eq!(posted[0].text(), "the last reply");
    assert_eq!(sent.message_ids, vec![posted[0].message_id.to_string()]);
    assert_eq!(fake.connections(), 1, "over the same connection");
    assert!(inbox.messages().is_empty());
    assert!(running.stop(STOP).await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_silent_past_its_heartbeats_is_dialled_again() {
    let inbox = Arc::new(TestInbox::default());
    let (fake, _adapter, running) = connected(inbox).await;
    // Heartbeats every 100 ms are announced, and then none come.
    fake.heartbeat(100);
    fake.wait_for_connections(2, WAIT).await.unwrap();
    assert!(running.stop(STOP).await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_replies_are_split_and_posts_into_a_group_are_paced() {
    let inbox = Arc::new(TestInbox::default());
    let fake = FakeOneBot::start(TOKEN, SELF_ID).await;
    let interval = Duration::from_millis(300);
    let config = OneBotConfig {
        min_send_interval: interval,
        max_message_chars: 100,
        ..forward(&fake)
    };
    let adapter = OneBotAdapter::new(config).unwrap();
    let running = Running::spawn(&adapter, inbox, || {});
    fake.wait_for_connections(1, WAIT).await.unwrap();

    let text = "word ".repeat(50);
    let other = ChatRef::new("qq", "group:556");
    let chat = group();
    let mut progress = Vec::new();
    let (long, quick) = tokio::join!(
        adapter.send(&chat, &text, Some("9"), Some("o1"), &mut progress),
        async {
            // Another group is not held up by the first one's pacing: posted once the first part
            // is out, it goes before the second.
            fake.wait_for_sent(1, WAIT).await.unwrap();
            adapter
                .send(&other, "elsewhere", None, None, &mut Vec::new())
                .await
        }
    );
    let long = long.unwrap();
    quick.unwrap();
    assert!(long.message_ids.len() >= 3, "{long:?}");
    let sent = fake.sent();
    let parts: Vec<_> = sent.iter().filter(|s| s.group_id == Some(GROUP)).collect();
    assert!(parts.iter().all(|p| p.text().chars().count() <= 100));
    assert_eq!(parts[0].reply_to(), Some("9".to_owned()));
    assert!(parts[1..].iter().all(|p| p.reply_to().is_none()));
    let words: usize = parts
        .iter()
        .map(|p| p.text().split_whitespace().count())
        .sum();
    assert_eq!(words, 50);
    for pair in parts.windows(2) {
        let gap = pair[1].at.duration_since(pair[0].at);
        assert!(gap >= interval - Duration::from_millis(50), "{gap:?}");
    }
    let elsewhere = sent.iter().find(|s| s.group_id == Some(556)).unwrap();
    assert!(
        elsewhere.at < parts[1].at,
        "the other group posted in between"
    );
    assert!(running.stop(STOP).await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bot_joined_and_kicked_arrive_as_chat_events() {
    let inbox = Arc::new(TestInbox::default());
    let (fake, _adapter, running) = connected(inbox.clone()).await;
    fake.bot_joined(GROUP, ALICE);
    fake.bot_kicked(GROUP, BOB);
    let events = inbox.wait_for_events(2).await;
    assert!(
        matches!(&events[0], ChatEvent::Joined { chat, by, .. } if *chat == group() && by.id == "qq:1001")
    );
    assert!(
        matches!(&events[1], ChatEvent::Removed { chat, status, by, .. }
        if *chat == group() && status == "kicked" && by.id == "qq:1002")
    );
    assert!(running.stop(STOP).await.is_ok());
}
