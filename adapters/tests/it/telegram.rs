//! The Telegram adapter against `parlor_testkit::FakeTelegram`: a real HTTP Bot API fake on
//! 127.0.0.1, spoken to through teloxide exactly as in production.
//!
//! Real time throughout (the fake's docs: a paused clock would end long polls early); the
//! adapter's backoff is configured in milliseconds and long polls to one second, so only
//! the `retry_after` test waits a real second.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parlor_adapters::Receiver;
use parlor_adapters::telegram::webhook::{WebhookAnswer, WebhookReceiver};
use parlor_adapters::telegram::{Backoff, TelegramAdapter, TelegramConfig, WebhookConfig};
use parlor_bot::agent::{Agent, AgentConfig};
use parlor_bot::platform::{
    Button, ButtonPress, ChatEvent, ChatKind, ChatRef, ImageRef, Inbox, Platform, PlatformError,
};
use parlor_bot::session::{SessionConfig, SessionManager};
use parlor_bot::store::{MemoryStore, Store};
use parlor_bot::testing::{CrashStore, InboxMode, ScriptedLlm, TestInbox};
use parlor_bot::tool::ToolRegistry;
use parlor_testkit::{Failure, FakeTelegram, TgUser};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::support::{Running, buttons, eventually};

const TOKEN: &str = "123456:TEST-secret-token";
const GROUP: i64 = -100123;
const WAIT: Duration = Duration::from_secs(5);

fn alice() -> TgUser {
    TgUser::new(1001, "Alice").username("alice")
}

fn config(fake: &FakeTelegram) -> TelegramConfig {
    let mut config = TelegramConfig::new(TOKEN);
    config.api_url = fake.api_url();
    config.poll_timeout_secs = 1;
    config.backoff = Backoff {
        initial: Duration::from_millis(10),
        max: Duration::from_millis(50),
    };
    config
}

/// A fake and the adapter connected to it with [`config`].
async fn connected() -> (FakeTelegram, TelegramAdapter) {
    let fake = FakeTelegram::start(TOKEN).await;
    let adapter = TelegramAdapter::connect(config(&fake))
        .await
        .expect("connects to the fake");
    (fake, adapter)
}

/// The id of the oldest update the fake holds for the bot.
fn first_pending_update(fake: &FakeTelegram) -> i64 {
    fake.pending_updates()[0]["update_id"]
        .as_i64()
        .expect("an update id")
}

fn group() -> ChatRef {
    ChatRef::new("telegram", GROUP.to_string())
}

/// How long `run()` may take to stop: promptly, an in-flight long poll is abandoned.
const STOP: Duration = Duration::from_secs(2);

fn start(adapter: &TelegramAdapter, inbox: Arc<TestInbox>) -> Running {
    Running::spawn(adapter, inbox, || {})
}

fn start_into(adapter: &TelegramAdapter, inbox: Arc<dyn Inbox>) -> Running {
    Running::spawn(adapter, inbox, || {})
}

// --- connect -----------------------------------------------------------------------------

#[tokio::test]
async fn connect_asks_who_we_are() {
    let (fake, adapter) = connected().await;
    assert_eq!(adapter.identity().id, 4242);
    assert_eq!(adapter.identity().username.as_deref(), Some("parlor_bot"));
    assert_eq!(adapter.name(), "telegram");
    assert_eq!(fake.calls("getMe"), 1);
    let shown = format!("{adapter:?}");
    assert!(!shown.contains("secret"), "Debug leaks the token: {shown}");
}

#[tokio::test]
async fn a_wrong_token_is_unauthorized_at_once() {
    let fake = FakeTelegram::start(TOKEN).await;
    let mut config = config(&fake);
    config.token = "999:wrong".into();
    let result = TelegramAdapter::connect(config).await;
    assert!(
        matches!(result, Err(PlatformError::Unauthorized)),
        "{result:?}"
    );
    assert_eq!(
        fake.calls("getMe"),
        0,
        "the fake records only the right token"
    );
}

#[tokio::test]
async fn a_token_file_newline_is_ignored() {
    let fake = FakeTelegram::start(TOKEN).await;
    let mut config = config(&fake);
    config.token = format!("{TOKEN}\n").into();
    assert!(TelegramAdapter::connect(config).await.is_ok());
}

#[tokio::test]
async fn bad_config_is_refused_before_any_request() {
    let fake = FakeTelegram::start(TOKEN).await;
    let mut bad_url = config(&fake);
    bad_url.api_url = "not a url".to_owned();
    assert!(matches!(
        TelegramAdapter::connect(bad_url).await,
        Err(PlatformError::Refused(message)) if message.contains("api_url")
    ));
    let mut bad_update = config(&fake);
    bad_update.allowed_updates = vec!["messages".to_owned()];
    assert!(matches!(
        TelegramAdapter::connect(bad_update).await,
        Err(PlatformError::Refused(message)) if message.contains("messages")
    ));
    let mut empty = config(&fake);
    empty.token = "  ".into();
    assert!(matches!(
        TelegramAdapter::connect(empty).await,
        Err(PlatformError::Unauthorized)
    ));
    assert!(fake.requests().is_empty());
}

#[tokio::test]
async fn unreachable_api_errors_never_show_the_token() {
    // A port nobody listens on.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    let mut config = TelegramConfig::new(TOKEN);
    config.api_url = format!("http://{addr}");
    config.backoff = Backoff {
        initial: Duration::from_millis(5),
        max: Duration::from_millis(10),
    };
    match TelegramAdapter::connect(config).await {
        Err(PlatformError::Unavailable(message)) => {
            assert!(!message.contains(TOKEN), "{message}");
            assert!(message.to_lowercase().contains("connect"), "{message}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

// --- receiving ---------------------------------------------------------------------------

#[tokio::test]
async fn a_group_mention_is_delivered_and_acknowledged_only_afterwards() {
    let (fake, adapter) = connected().await;
    let message_id = fake
        .group_message(GROUP, alice().last_name("Liddell"), "what is 2+2?")
        .mention_bot()
        .push();
    let update_id = first_pending_update(&fake);

    let inbox = TestInbox::new(InboxMode::Gate(tokio::sync::Semaphore::new(0)));
    let ready = Arc::new(AtomicBool::new(false));
    let run = Running::spawn(&adapter, inbox.clone(), {
        let ready = ready.clone();
        move || ready.store(true, Ordering::SeqCst)
    });

    // The inbox holds the message; Telegram must not have been told it is done.
    eventually("a delivery attempt", || {
        (inbox.attempts() == 1).then_some(())
    })
    .await;
    assert!(ready.load(Ordering::SeqCst));
    // The poll loop waits in that delivery now: no later getUpdates can have moved the
    // offset past the message.
    assert!(
        fake.acked_offset().is_none_or(|offset| offset <= update_id),
        "acknowledged before delivery: {:?}",
        fake.acked_offset()
    );

    let InboxMode::Gate(gate) = &inbox.mode else {
        unreachable!()
    };
    gate.add_permits(1);
    fake.wait_for_ack(update_id, WAIT)
        .await
        .expect("acknowledged after delivery");

    let messages = inbox.messages();
    assert_eq!(messages.len(), 1);
    let message = &messages[0];
    assert_eq!(message.chat.session_key(), "telegram:-100123");
    assert_eq!(message.kind, ChatKind::Group);
    assert_eq!(message.message_id, message_id.to_string());
    assert_eq!(message.sender.id, "telegram:1001");
    assert_eq!(message.sender.name, "Alice Liddell");
    assert_eq!(message.sender.username.as_deref(), Some("alice"));
    assert!(!message.sender.is_bot);
    assert_eq!(message.text, "@parlor_bot what is 2+2?");
    assert!(message.mentions_bot);
    assert!(!message.reply_to_bot);
    assert_eq!(message.reply_to, None);

    let stopped = run.stop(STOP).await;
    assert!(stopped.is_ok(), "{stopped:?}");
    let calls = fake.get_updates_calls();
    assert_eq!(calls[0].timeout, Some(1));
    assert_eq!(
        calls[0].allowed_updates,
        Some(vec![
            "message".to_owned(),
            "edited_message".to_owned(),
            "my_chat_member".to_owned(),
            "callback_query".to_owned(),
        ])
    );
}

#[tokio::test]
async fn a_failing_inbox_gets_no_acknowledgement_and_the_next_run_receives_it_again() {
    let (fake, adapter) = connected().await;
    fake.group_message(GROUP, alice(), "remember this")
        .mention_bot()
        .push();
    let update_id = first_pending_update(&fake);

    let failing = TestInbox::new(InboxMode::FailStore);
    let run = start(&adapter, failing.clone());
    // Backs off and tries the same update again, without acknowledging it.
    eventually("three delivery attempts", || {
        (failing.attempts() >= 3).then_some(())
    })
    .await;
    assert!(run.stop(STOP).await.is_ok());
    assert!(
        fake.acked_offset().is_none_or(|offset| offset <= update_id),
        "a failed delivery was acknowledged: {:?}",
        fake.acked_offset()
    );
    assert_eq!(fake.pending_updates().len(), 1);

    let working = TestInbox::new(InboxMode::Accept);
    let run = start(&adapter, working.clone());
    let messages = working.wait_for(1).await;
    assert_eq!(messages[0].text, "@parlor_bot remember this");
    fake.wait_for_ack(update_id, WAIT)
        .await
        .expect("acknowledged now");
    assert!(run.stop(STOP).await.is_ok());
}

#[tokio::test]
async fn an_inbox_shutting_down_ends_the_run_without_acknowledging() {
    let (fake, adapter) = connected().await;
    fake.private_message(alice(), "hello").push();
    let update_id = first_pending_update(&fake);

    let inbox = TestInbox::new(InboxMode::ShuttingDown);
    let result = tokio::time::timeout(WAIT, adapter.run(inbox.clone(), CancellationToken::new()))
        .await
        .expect("run() ends by itself");
    assert!(result.is_ok());
    assert_eq!(inbox.attempts(), 1);
    assert!(fake.acked_offset().is_none_or(|offset| offset <= update_id));
}

#[tokio::test]
async fn what_cannot_be_represented_is_skipped_but_acknowledged() {
    let (fake, adapter) = connected().await;
    let skipped = [
        // A service message (no text, no image).
        fake.push_update(json!({"message": {
            "message_id": 1, "date": 1_700_000_000,
            "chat": {"id": GROUP, "type": "supergroup", "title": "t"},
            "from": {"id": 1001, "is_bot": false, "first_name": "Alice"},
            "new_chat_title": "renamed"
        }})),
        // A message teloxide cannot read at all.
        fake.push_update(json!({"message": {"message_id": "not a number"}})),
    ];
    let last = fake.private_message(alice(), "still here").push();
    let last_update = fake
        .pending_updates()
        .last()
        .map(|u| u["update_id"].clone());
    let last_update = last_update.and_then(|id| id.as_i64()).expect("pending");

    let inbox = TestInbox::new(InboxMode::Accept);
    let run = start(&adapter, inbox.clone());
    let messages = inbox.wait_for(1).await;
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0].message_id, last.to_string());
    assert_eq!(messages[0].kind, ChatKind::Private);
    assert_eq!(messages[0].chat.session_key(), "telegram:1001");
    fake.wait_for_ack(last_update, WAIT)
        .await
        .expect("everything acknowledged");
    assert!(skipped.iter().all(|id| *id < last_update));
    assert!(run.stop(STOP).await.is_ok());
}

// --- batches into the session layer ------------------------------------------------------

/// The real session layer behind the adapter, over `store`, with a model that never answers
/// (so no turn commits and the only flushes are intake's).
fn session_layer(adapter: &TelegramAdapter, store: Arc<CrashStore>) -> SessionManager {
    let registry = ToolRegistry::new(Vec::new()).expect("an empty registry");
    let llm = Arc::new(ScriptedLlm::echo().gated());
    let agent = Agent::new(llm, registry, "test", AgentConfig::default());
    SessionManager::new(
        store as Arc<dyn Store>,
        agent,
        vec![Arc::new(adapter.clone()) as Arc<dyn Platform>],
        SessionConfig::default(),
    )
}

/// Mentions in `chats` groups (two in the first), and a line of chatter; their update ids.
fn push_mentions(fake: &FakeTelegram, chats: i64) -> Vec<i64> {
    fake.group_message(GROUP, alice(), "just chatting").push();
    for chat in 0..chats {
        fake.group_message(GROUP - chat, alice(), format!("question {chat}"))
            .mention_bot()
            .push();
    }
    fake.group_message(GROUP, alice(), "and one more")
        .mention_bot()
        .push();
    fake.pending_updates()
        .iter()
        .map(|u| u["update_id"].as_i64().expect("an update id"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_updates_costs_one_flush_and_is_acknowledged_only_after_it() {
    let (fake, adapter) = connected().await;
    let fake = Arc::new(fake);
    let updates = push_mentions(&fake, 3);
    let last = *updates.last().unwrap();

    let inner = Arc::new(MemoryStore::new());
    let store = CrashStore::new(inner.clone(), usize::MAX);
    // What the world looks like inside each flush: what is recorded, what acknowledged.
    let inside = Arc::new(std::sync::Mutex::new(Vec::new()));
    store.on_flush({
        let (fake, inner, inside) = (fake.clone(), inner.clone(), inside.clone());
        move || {
            let pending = inner.pending().unwrap().len();
            inside.lock().unwrap().push((pending, fake.acked_offset()));
        }
    });
    let manager = session_layer(&adapter, store.clone());
    let run = start_into(&adapter, Arc::new(manager.clone()));

    fake.wait_for_ack(last, WAIT).await.expect("acknowledged");
    assert_eq!(store.flushes(), 1, "one flush for the batch");
    // The four mentions were all recorded when it ran, and nothing was acknowledged yet.
    assert_eq!(*inside.lock().unwrap(), [(4, None)]);
    assert_eq!(
        inner.recent_messages("telegram:-100123", 10).unwrap().len(),
        3
    );

    assert!(run.stop(STOP).await.is_ok());
    manager.shutdown(Duration::from_millis(100)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_failure_mid_batch_acknowledges_only_the_durable_prefix() {
    let (fake, adapter) = connected().await;
    let updates = push_mentions(&fake, 3);
    // The chatter and the first mention are written; the second mention fails.
    let store = CrashStore::new(Arc::new(MemoryStore::new()), 2);
    let manager = session_layer(&adapter, store.clone());
    let run = start_into(&adapter, Arc::new(manager.clone()));

    fake.wait_for_ack(updates[1], WAIT)
        .await
        .expect("the prefix is acknowledged");
    // The adapter keeps fetching the rest again (and failing); it never acknowledges it.
    let polls = fake.get_updates_calls().len();
    fake.wait_for_calls("getUpdates", polls + 3, WAIT)
        .await
        .expect("polls again");
    let prefix = updates[1] + 1;
    assert_eq!(fake.acked_offset(), Some(prefix));
    assert!(
        fake.get_updates_calls()
            .iter()
            .all(|call| call.offset.is_none_or(|offset| offset <= prefix)),
        "{:?}",
        fake.get_updates_calls()
    );
    assert_eq!(fake.pending_updates().len(), updates.len() - 2);

    assert!(run.stop(STOP).await.is_ok());
    manager.shutdown(Duration::from_millis(100)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_flush_fails_is_not_acknowledged_at_all() {
    let (fake, adapter) = connected().await;
    let updates = push_mentions(&fake, 2);
    let inner = Arc::new(MemoryStore::new());
    let store = CrashStore::new(inner.clone(), usize::MAX);
    store.fail_flushes();
    let manager = session_layer(&adapter, store.clone());
    let run = start_into(&adapter, Arc::new(manager.clone()));

    // Recorded, fetched again, deduped, still not durable: never acknowledged.
    fake.wait_for_calls("getUpdates", 3, WAIT)
        .await
        .expect("polls again");
    assert!(run.stop(STOP).await.is_ok());
    assert_eq!(inner.pending().unwrap().len(), 3, "written once");
    assert!(
        fake.acked_offset()
            .is_none_or(|offset| offset <= updates[0]),
        "acknowledged without a durable write: {:?}",
        fake.acked_offset()
    );
    assert_eq!(fake.pending_updates().len(), updates.len());
    manager.shutdown(Duration::from_millis(100)).await;
}

#[tokio::test]
async fn commands_topics_replies_and_photos_arrive_normalized() {
    let (fake, adapter) = connected().await;
    let ours = fake
        .group_message(GROUP, alice(), "")
        .command("/help@parlor_bot")
        .push();
    let other = fake
        .group_message(GROUP, alice(), "")
        .command("/help@other_bot")
        .push();
    let in_topic = fake
        .group_message(GROUP - 1, alice(), "in the topic")
        .topic(7)
        .push();
    let reply = fake
        .group_message(GROUP, alice(), "and then?")
        .reply_to(500, true)
        .push();
    let photo = fake
        .group_message(GROUP, alice(), "what is this?")
        .mention_bot()
        .photo("photo-1", 2048)
        .push();

    let inbox = TestInbox::new(InboxMode::Accept);
    let run = start(&adapter, inbox.clone());
    let messages = inbox.wait_for(5).await;
    assert!(run.stop(STOP).await.is_ok());
    let by_id = |id: i64| {
        messages
            .iter()
            .find(|m| m.message_id == id.to_string())
            .unwrap_or_else(|| panic!("message {id} delivered"))
    };

    assert_eq!(by_id(ours).text, "/help");
    assert!(by_id(ours).mentions_bot);
    assert_eq!(by_id(other).text, "/help@other_bot");
    assert!(!by_id(other).mentions_bot);

    let topic = by_id(in_topic);
    assert_eq!(topic.chat.session_key(), "telegram:-100124/topic:7");
    assert_eq!(topic.reply_to, None, "the topic root is no reply");

    let reply = by_id(reply);
    assert_eq!(
        reply.chat.session_key(),
        "telegram:-100123",
        "a reply thread is no topic"
    );
    assert_eq!(reply.reply_to.as_deref(), Some("500"));
    assert!(reply.reply_to_bot);

    let photo = by_id(photo);
    assert_eq!(photo.text, "@parlor_bot what is this?");
    assert!(photo.mentions_bot);
    assert_eq!(
        photo.images,
        vec![ImageRef {
            file_id: "photo-1".to_owned(),
            mime_type: Some("image/jpeg".to_owned()),
            size: Some(2048),
        }]
    );
}

#[tokio::test]
async fn an_edited_message_arrives_as_an_edit_event() {
    let (fake, adapter) = connected().await;
    let asked = fake
        .group_message(GROUP, alice(), "what is 2+3?")
        .mention_bot()
        .build();
    let message_id = asked["message_id"].as_i64().unwrap();
    let update = fake
        .edit_message(GROUP, message_id, "@parlor_bot what is 2+2?")
        .unwrap();

    let inbox = TestInbox::new(InboxMode::Accept);
    let run = start(&adapter, inbox.clone());
    let events = inbox.wait_for_events(1).await;
    fake.wait_for_ack(update, WAIT).await.unwrap();
    assert!(run.stop(STOP).await.is_ok());
    let ChatEvent::Edited(edited) = &events[0] else {
        panic!("not an edit: {events:?}");
    };
    assert_eq!(edited.message_id, message_id.to_string());
    assert_eq!(edited.text, "@parlor_bot what is 2+2?");
    assert!(edited.mentions_bot, "the handle in the text still counts");
    assert!(inbox.messages().is_empty(), "an edit is not a new message");
}

#[tokio::test]
async fn the_bot_added_and_removed_arrive_as_join_and_removal() {
    let (fake, adapter) = connected().await;
    let carol = TgUser::new(1003, "Carol");
    fake.bot_added(-100777, &carol, "member");
    fake.bot_added(-100778, &carol, "administrator");
    fake.bot_removed(-100777, &carol, "kicked");
    let last = fake.bot_removed(-100778, &carol, "left");
    // Another member's change is none of the bot's business.
    fake.push_update(json!({"my_chat_member": {
        "chat": {"id": -100779, "type": "supergroup", "title": "x"},
        "from": {"id": 1003, "is_bot": false, "first_name": "Carol"},
        "date": 1_700_000_000,
        "old_chat_member": {"status": "left", "user": {"id": 77, "is_bot": true, "first_name": "other"}},
        "new_chat_member": {"status": "member", "user": {"id": 77, "is_bot": true, "first_name": "other"}},
    }}));

    let inbox = TestInbox::new(InboxMode::Accept);
    let run = start(&adapter, inbox.clone());
    let events = inbox.wait_for_events(4).await;
    fake.wait_for_ack(last + 1, WAIT).await.unwrap();
    assert!(run.stop(STOP).await.is_ok());
    assert_eq!(inbox.events().len(), 4, "{:?}", inbox.events());
    let summary: Vec<(String, &str)> = events
        .iter()
        .map(|e| match e {
            ChatEvent::Joined { chat, by, .. } => {
                assert_eq!(by.id, "telegram:1003");
                (chat.session_key(), "joined")
            }
            ChatEvent::Removed { chat, status, .. } => (chat.session_key(), status.as_str()),
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            ("telegram:-100777".to_owned(), "joined"),
            ("telegram:-100778".to_owned(), "joined"),
            ("telegram:-100777".to_owned(), "kicked"),
            ("telegram:-100778".to_owned(), "left"),
        ]
    );
}

#[tokio::test]
async fn a_group_upgrade_arrives_as_one_migration_from_either_side() {
    let (fake, adapter) = connected().await;
    fake.basic_group(-5001, "book club");
    let (from_old, from_new) = fake.upgrade_group(-5001, -1005001, &alice());

    let inbox = TestInbox::new(InboxMode::Accept);
    let run = start(&adapter, inbox.clone());
    let events = inbox.wait_for_events(2).await;
    fake.wait_for_ack(from_new, WAIT).await.unwrap();
    assert!(run.stop(STOP).await.is_ok());
    assert!(from_old < from_new);
    let migration = ChatEvent::Migrated {
        from: ChatRef::new("telegram", "-5001"),
        to: ChatRef::new("telegram", "-1005001"),
    };
    assert_eq!(events, vec![migration.clone(), migration]);
    assert!(inbox.messages().is_empty());
}

#[tokio::test]
async fn a_conflict_on_get_updates_is_logged_and_polling_continues() {
    let logs = capture::Logs::default();
    let _guard = tracing::subscriber::set_default(logs.clone());

    let (fake, adapter) = connected().await;
    fake.fail_next("getUpdates", Failure::Conflict);
    fake.fail_next("getUpdates", Failure::Conflict);
    fake.private_message(alice(), "still polling?").push();

    let inbox = TestInbox::new(InboxMode::Accept);
    let run = start(&adapter, inbox.clone());
    let messages = inbox.wait_for(1).await;
    assert_eq!(messages[0].text, "still polling?");
    assert!(run.stop(STOP).await.is_ok());
    assert!(fake.calls("getUpdates") >= 3);

    let errors = logs.errors();
    assert_eq!(
        errors
            .iter()
            .filter(|line| line.contains("another process is polling with this bot token"))
            .count(),
        2,
        "{errors:#?}"
    );
    assert!(logs.all().iter().all(|line| !line.contains(TOKEN)));
}

#[tokio::test]
async fn retry_after_on_get_updates_is_waited_out() {
    let (fake, adapter) = connected().await;
    fake.fail_next("getUpdates", Failure::RetryAfter(1));
    fake.private_message(alice(), "patience").push();
    let started = Instant::now();
    let inbox = TestInbox::new(InboxMode::Accept);
    let run = start(&adapter, inbox.clone());
    inbox.wait_for(1).await;
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert!(run.stop(STOP).await.is_ok());
}

#[tokio::test]
async fn shutdown_ends_a_waiting_long_poll_within_a_second() {
    let fake = FakeTelegram::start(TOKEN).await;
    let mut config = config(&fake);
    config.poll_timeout_secs = 30;
    let adapter = TelegramAdapter::connect(config).await.expect("connects");
    let run = start(&adapter, TestInbox::new(InboxMode::Accept));
    fake.wait_for_calls("getUpdates", 1, WAIT)
        .await
        .expect("polling");

    let stopping = Instant::now();
    let result = run.stop(Duration::from_secs(1)).await;
    assert!(result.is_ok(), "{result:?}");
    assert!(stopping.elapsed() < Duration::from_secs(1));
}

#[tokio::test]
async fn a_token_revoked_while_polling_ends_the_run() {
    let (fake, adapter) = connected().await;
    fake.fail_next(
        "getUpdates",
        Failure::Status(401, "Unauthorized".to_owned()),
    );
    let result = tokio::time::timeout(
        WAIT,
        adapter.run(TestInbox::new(InboxMode::Accept), CancellationToken::new()),
    )
    .await
    .expect("run() ends by itself");
    assert!(matches!(result, Err(PlatformError::Unauthorized)));
}

// --- sending -----------------------------------------------------------------------------

#[tokio::test]
async fn a_long_answer_is_split_and_threaded_to_the_question() {
    let (fake, adapter) = connected().await;
    let asked = fake
        .group_message(GROUP, alice(), "tell me everything")
        .mention_bot()
        .push();
    let text = "all work and no play makes a long answer ".repeat(225); // 9225 chars

    let sent = adapter
        .send(
            &group(),
            &text,
            Some(&asked.to_string()),
            None,
            &mut Vec::new(),
        )
        .await
        .expect("sent");
    assert_eq!(sent.message_ids.len(), 3);

    let recorded = fake.sent_messages();
    assert_eq!(recorded.len(), 3);
    assert_eq!(recorded[0].reply_to_message_id, Some(asked));
    assert!(
        recorded[1..]
            .iter()
            .all(|m| m.reply_to_message_id.is_none())
    );
    assert!(recorded.iter().all(|m| m.chat_id == GROUP));
    assert!(
        recorded
            .iter()
            .all(|m| m.text.encode_utf16().count() <= 4096)
    );
    assert!(recorded.iter().all(|m| m.parse_mode.is_none()));
    let ids: Vec<String> = recorded.iter().map(|m| m.message_id.to_string()).collect();
    assert_eq!(sent.message_ids, ids);
    let words: Vec<&str> = text.split_whitespace().collect();
    let sent_words: Vec<&str> = recorded
        .iter()
        .flat_map(|m| m.text.split_whitespace())
        .collect();
    assert_eq!(sent_words, words);
}

#[tokio::test]
async fn a_retried_long_reply_sends_only_the_parts_that_are_missing() {
    let (fake, adapter) = connected().await;
    fake.group_message(GROUP, alice(), "tell me everything")
        .mention_bot()
        .push();
    let text = "all work and no play makes a long answer ".repeat(225); // 3 parts
    // The second part is held by flood control: one attempt, reported with the part sent.
    fake.fail_after("sendMessage", 1, Failure::RetryAfter(3600));
    let mut progress = Vec::new();
    let first = adapter
        .send(&group(), &text, None, Some("o7"), &mut progress)
        .await;
    assert!(
        matches!(first, Err(PlatformError::RateLimited(_))),
        "{first:?}"
    );
    let before: Vec<_> = fake.sent_messages();
    assert_eq!(before.len(), 1, "the first part went out");
    assert_eq!(progress, [before[0].message_id.to_string()]);

    // The outbox retries the same reply with that progress: only parts two and three now.
    let sent = adapter
        .send(&group(), &text, None, Some("o7"), &mut progress)
        .await
        .expect("sent");
    let recorded = fake.sent_messages();
    assert_eq!(recorded.len(), 3, "no part twice");
    let ids: Vec<String> = recorded.iter().map(|m| m.message_id.to_string()).collect();
    assert_eq!(
        sent.message_ids, ids,
        "every part's id, the first one included"
    );
    let words: Vec<&str> = text.split_whitespace().collect();
    let sent_words: Vec<&str> = recorded
        .iter()
        .flat_map(|m| m.text.split_whitespace())
        .collect();
    assert_eq!(sent_words, words);

    // Another reply starts from its own first part.
    adapter
        .send(&group(), "short", None, Some("o8"), &mut Vec::new())
        .await
        .expect("sent");
    assert_eq!(fake.sent_messages().len(), 4);
}

#[tokio::test]
async fn answers_go_to_the_topic_and_survive_a_deleted_original() {
    let (fake, adapter) = connected().await;
    fake.forum_topic(GROUP, 7);
    let topic = group().in_thread("7");
    // Message 999 does not exist (deleted): the answer still goes out.
    adapter
        .send(&topic, "here you go", Some("999"), None, &mut Vec::new())
        .await
        .expect("sent without the reply");
    let sent = fake.sent_messages();
    assert_eq!(sent[0].thread_id, Some(7));
    assert_eq!(sent[0].text, "here you go");
    assert_eq!(
        sent[0].params["reply_parameters"]["allow_sending_without_reply"],
        json!(true)
    );

    adapter.send_typing(&topic).await.expect("typing");
    let actions = fake.chat_actions();
    assert_eq!(actions.len(), 1);
    assert_eq!(
        (
            actions[0].chat_id,
            actions[0].action.as_str(),
            actions[0].thread_id
        ),
        (GROUP, "typing", Some(7))
    );
}

#[tokio::test]
async fn retry_after_on_send_message_is_reported_for_the_outbox_to_wait() {
    let (fake, adapter) = connected().await;
    fake.group_chat(GROUP, "Parlor test");
    fake.fail_next("sendMessage", Failure::RetryAfter(1));
    // One attempt: the wait is the caller's (the outbox lane's), not the adapter's.
    let refused = adapter
        .send(&group(), "after the flood", None, None, &mut Vec::new())
        .await;
    assert!(
        matches!(refused, Err(PlatformError::RateLimited(wait)) if wait == Duration::from_secs(1)),
        "{refused:?}"
    );
    assert_eq!(fake.calls("sendMessage"), 1);
    let sent = adapter
        .send(&group(), "after the flood", None, None, &mut Vec::new())
        .await
        .expect("sent on the second try");
    assert_eq!(sent.message_ids.len(), 1);
    assert_eq!(fake.sent_messages().len(), 1);
}

#[tokio::test]
async fn send_errors_map_to_platform_errors() {
    let (fake, adapter) = connected().await;
    // Never seen: Telegram answers "chat not found".
    let unknown = ChatRef::new("telegram", "-100999");
    assert!(matches!(
        adapter
            .send(&unknown, "hello?", None, None, &mut Vec::new())
            .await,
        Err(PlatformError::NotFound(_))
    ));
    fake.group_chat(GROUP, "Parlor test");
    fake.fail_next(
        "sendMessage",
        Failure::BadRequest("not enough rights to send text messages to the chat".to_owned()),
    );
    assert!(matches!(
        adapter.send(&group(), "hello?", None, None, &mut Vec::new()).await,
        Err(PlatformError::Refused(message)) if message.contains("not enough rights")
    ));
    assert!(matches!(
        adapter
            .send(&group(), " \n ", None, None, &mut Vec::new())
            .await,
        Err(PlatformError::Refused(_))
    ));
    assert!(matches!(
        adapter
            .send(
                &ChatRef::new("discord", "1"),
                "hi",
                None,
                None,
                &mut Vec::new()
            )
            .await,
        Err(PlatformError::Refused(_))
    ));
    assert!(matches!(
        adapter
            .send(
                &ChatRef::new("telegram", "abc"),
                "hi",
                None,
                None,
                &mut Vec::new()
            )
            .await,
        Err(PlatformError::NotFound(_))
    ));
}

// --- admins and images -------------------------------------------------------------------

#[tokio::test]
async fn chat_admins_are_platform_qualified_and_private_chats_have_none() {
    let (fake, adapter) = connected().await;
    fake.set_admins(GROUP, vec![1001, 1002]);
    let admins = adapter.chat_admins(&group()).await.expect("admins");
    assert_eq!(
        admins,
        ["telegram:1001", "telegram:1002", "telegram:-100123"],
        "users, then the group itself (anonymous admins write as the group)"
    );
    let private = ChatRef::new("telegram", "1001");
    assert!(
        adapter
            .chat_admins(&private)
            .await
            .expect("none")
            .is_empty()
    );
    assert_eq!(fake.calls("getChatAdministrators"), 1);
}

#[tokio::test]
async fn download_image_returns_the_bytes() {
    let (fake, adapter) = connected().await;
    let bytes: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    fake.add_file("photo-1", bytes.clone());
    let image = ImageRef {
        file_id: "photo-1".to_owned(),
        mime_type: Some("image/jpeg".to_owned()),
        size: Some(70_000),
    };
    assert_eq!(
        adapter.download_image(&image).await.expect("downloaded"),
        bytes
    );
    assert_eq!(fake.downloads().len(), 1);

    let missing = ImageRef {
        file_id: "gone".to_owned(),
        mime_type: None,
        size: None,
    };
    assert!(matches!(
        adapter.download_image(&missing).await,
        Err(PlatformError::NotFound(_))
    ));
}

#[tokio::test]
async fn download_image_refuses_oversize_files() {
    let fake = FakeTelegram::start(TOKEN).await;
    let mut config = config(&fake);
    config.max_image_bytes = 1000;
    let adapter = TelegramAdapter::connect(config).await.expect("connects");
    fake.add_file("big", vec![7u8; 5000]);

    // The message said how big it is: refused without asking Telegram.
    let announced = ImageRef {
        file_id: "big".to_owned(),
        mime_type: None,
        size: Some(5000),
    };
    assert!(matches!(
        adapter.download_image(&announced).await,
        Err(PlatformError::Refused(message)) if message.contains("1000")
    ));
    assert_eq!(fake.calls("getFile"), 0);

    // Size unknown in the message: getFile tells, and nothing is downloaded.
    let unannounced = ImageRef {
        size: None,
        ..announced
    };
    assert!(matches!(
        adapter.download_image(&unannounced).await,
        Err(PlatformError::Refused(_))
    ));
    assert_eq!(fake.calls("getFile"), 1);
    assert!(fake.downloads().is_empty());
}

/// A minimal `tracing` subscriber that keeps every event's fields as text.
mod capture {
    use std::fmt::{self, Write as _};
    use std::sync::{Arc, Mutex};

    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Level, Metadata, Subscriber};

    #[derive(Clone, Default)]
    pub struct Logs(Arc<Mutex<Vec<(Level, String)>>>);

    impl Logs {
        fn lines(&self) -> Vec<(Level, String)> {
            self.0
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .clone()
        }

        pub fn errors(&self) -> Vec<String> {
            self.lines()
                .into_iter()
                .filter(|(level, _)| *level == Level::ERROR)
                .map(|(_, line)| line)
                .collect()
        }

        pub fn all(&self) -> Vec<String> {
            self.lines().into_iter().map(|(_, line)| line).collect()
        }
    }

    struct Line(String);

    impl Visit for Line {
        fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
            let _ = write!(self.0, "{}={value:?} ", field.name());
        }
    }

    impl Subscriber for Logs {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &Attributes<'_>) -> Id {
            Id::from_u64(1)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, event: &Event<'_>) {
            let mut line = Line(String::new());
            event.record(&mut line);
            self.0
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .push((*event.metadata().level(), line.0));
        }
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }
}

// --- webhook ---------------------------------------------------------------------------

const WEBHOOK_SECRET: &str = "hook_Secret-42";

fn webhook_config(fake: &FakeTelegram) -> TelegramConfig {
    let mut config = config(fake);
    config.webhook = Some(WebhookConfig {
        // Nobody listens there: the receiver is driven directly below.
        url: "http://127.0.0.1:9/telegram/3f9c2a7d0b6e41c8a5d2".to_owned(),
        secret_token: WEBHOOK_SECRET.into(),
    });
    config
}

/// A fake, an adapter in webhook mode, and its receiver, delivering into an accepting inbox.
async fn webhook_receiver() -> (
    FakeTelegram,
    TelegramAdapter,
    Arc<TestInbox>,
    WebhookReceiver,
) {
    let fake = FakeTelegram::start(TOKEN).await;
    let adapter = TelegramAdapter::connect(webhook_config(&fake))
        .await
        .unwrap();
    let inbox = TestInbox::new(InboxMode::Accept);
    let receiver = WebhookReceiver::new(&adapter, inbox.clone())
        .unwrap()
        .expect("webhook mode");
    (fake, adapter, inbox, receiver)
}

/// `update` posted to `receiver` with the right secret, as Telegram posts it.
async fn post_update(receiver: &WebhookReceiver, update: &serde_json::Value) -> WebhookAnswer {
    let body = serde_json::to_vec(update).unwrap();
    receiver
        .receive(Some(WEBHOOK_SECRET.as_bytes()), &body)
        .await
}

#[tokio::test]
async fn polling_first_removes_a_webhook_and_keeps_its_pending_updates() {
    let (fake, adapter) = connected().await;
    fake.set_webhook("https://old.example.com/hook", Some("old"));
    let id = fake
        .group_message(GROUP, alice(), "@parlor_bot still there?")
        .mention_bot()
        .push();
    let inbox = TestInbox::new(InboxMode::Accept);
    let run = start(&adapter, inbox.clone());
    let got = inbox.wait_for(1).await;
    assert_eq!(got[0].message_id, id.to_string());
    assert_eq!(fake.webhook(), None);
    let deleted = fake.wait_for_calls("deleteWebhook", 1, WAIT).await.unwrap();
    let drop_pending = &deleted[0].params["drop_pending_updates"];
    assert!(
        drop_pending == &json!(false) || drop_pending == &json!("false"),
        "{drop_pending}"
    );
    run.stop(STOP).await.unwrap();
}

#[tokio::test]
async fn webhook_mode_sets_the_webhook_retrying_and_never_polls() {
    let fake = FakeTelegram::start(TOKEN).await;
    let adapter = TelegramAdapter::connect(webhook_config(&fake))
        .await
        .unwrap();
    fake.fail_next(
        "setWebhook",
        Failure::BadRequest("bad webhook: Failed to resolve host".to_owned()),
    );
    let ready = Arc::new(AtomicBool::new(false));
    let run = Running::spawn(&adapter, TestInbox::new(InboxMode::Accept), {
        let ready = ready.clone();
        move || ready.store(true, Ordering::SeqCst)
    });
    let webhook = fake.wait_for_webhook(WAIT).await.unwrap();
    assert_eq!(
        webhook.url,
        "http://127.0.0.1:9/telegram/3f9c2a7d0b6e41c8a5d2"
    );
    assert_eq!(webhook.secret_token.as_deref(), Some(WEBHOOK_SECRET));
    assert_eq!(webhook.drop_pending_updates, Some(false));
    assert_eq!(fake.calls("setWebhook"), 2, "the refused call was retried");
    eventually("ready", || ready.load(Ordering::SeqCst).then_some(())).await;
    run.stop(STOP).await.unwrap();
    assert_eq!(fake.calls("getUpdates"), 0);
    assert!(
        fake.webhook().is_some(),
        "left in place for the next instance"
    );
}

#[tokio::test]
async fn the_webhook_receiver_records_an_update_only_with_the_secret() {
    let (fake, adapter, inbox, receiver) = webhook_receiver().await;
    assert_eq!(receiver.path(), "/telegram/3f9c2a7d0b6e41c8a5d2");
    let update = fake
        .group_message(GROUP, alice(), "hi")
        .mention_bot()
        .webhook_update();
    let body = serde_json::to_vec(&update).unwrap();

    for secret in [
        None,
        Some(&b"hook_Secret-43"[..]),
        Some(&b"hook_Secret-4"[..]),
    ] {
        assert_eq!(
            receiver.receive(secret, &body).await,
            WebhookAnswer::Unauthorized
        );
    }
    assert_eq!(inbox.attempts(), 0, "nothing read without the secret");

    let secret = Some(WEBHOOK_SECRET.as_bytes());
    assert_eq!(
        receiver.receive(secret, &body).await,
        WebhookAnswer::Accepted
    );
    let got = inbox.messages();
    assert_eq!(got.len(), 1);
    assert!(got[0].mentions_bot);
    assert_eq!(got[0].chat, group());

    // Signed but unreadable: skipped like a broken polled update, or refused if not one.
    let broken = br#"{"update_id":7,"message":"not an object"}"#;
    assert_eq!(
        receiver.receive(secret, broken).await,
        WebhookAnswer::Accepted
    );
    assert_eq!(
        receiver.receive(secret, b"<html>").await,
        WebhookAnswer::BadRequest
    );
    assert_eq!(inbox.messages().len(), 1);

    for (mode, answer) in [
        (InboxMode::FailStore, WebhookAnswer::StoreFailed),
        (InboxMode::ShuttingDown, WebhookAnswer::ShuttingDown),
    ] {
        let receiver = WebhookReceiver::new(&adapter, TestInbox::new(mode))
            .unwrap()
            .expect("webhook mode");
        assert_eq!(receiver.receive(secret, &body).await, answer);
    }
    assert_eq!(WebhookAnswer::StoreFailed.status(), 500);
}

// --- buttons -----------------------------------------------------------------------------

/// The one button press among `events`.
fn the_press(events: &[ChatEvent]) -> ButtonPress {
    match events {
        [ChatEvent::Button(press)] => press.clone(),
        other => panic!("expected one button press, got {other:?}"),
    }
}

#[tokio::test]
async fn buttons_go_under_the_last_part_only() {
    let (fake, adapter) = connected().await;
    fake.group_chat(GROUP, "Parlor test");
    let text = "all work and no play makes a long answer ".repeat(225); // 3 parts
    let sent = adapter
        .send_buttons(&group(), &text, None, None, &mut Vec::new(), &buttons())
        .await
        .expect("sent");
    assert_eq!(sent.message_ids.len(), 3);
    let recorded = fake.sent_messages();
    assert_eq!(recorded.len(), 3);
    assert!(recorded[..2].iter().all(|m| m.reply_markup.is_none()));
    let keyboard = recorded[2].inline_keyboard();
    assert_eq!(keyboard.len(), 1, "one row: {keyboard:?}");
    let row: Vec<(&str, Option<&str>)> = keyboard[0]
        .iter()
        .map(|b| (b.text.as_str(), b.callback_data.as_deref()))
        .collect();
    assert_eq!(
        row,
        [
            ("Approve", Some("approve:7f3a")),
            ("Deny", Some("deny:7f3a"))
        ]
    );

    // Plain sends carry no keyboard.
    adapter
        .send(&group(), "no buttons", None, None, &mut Vec::new())
        .await
        .expect("sent");
    assert!(fake.sent_messages()[3].reply_markup.is_none());

    // Data Telegram would refuse is refused before any part goes out.
    let too_long = [Button {
        label: "Too long".to_owned(),
        data: "x".repeat(Button::MAX_DATA + 1),
    }];
    let refused = adapter
        .send_buttons(&group(), &text, None, None, &mut Vec::new(), &too_long)
        .await;
    assert!(
        matches!(refused, Err(PlatformError::Refused(_))),
        "{refused:?}"
    );
    assert_eq!(fake.sent_messages().len(), 4, "nothing more was sent");
}

#[tokio::test]
async fn a_button_press_arrives_as_an_event_and_is_answered_with_an_alert() {
    let (fake, adapter) = connected().await;
    fake.group_chat(GROUP, "Parlor test");
    let sent = adapter
        .send_buttons(&group(), "May I?", None, None, &mut Vec::new(), &buttons())
        .await
        .expect("sent");
    let message_id: i64 = sent.message_ids[0].parse().unwrap();
    let update = fake
        .callback_query(
            alice().last_name("Liddell"),
            GROUP,
            message_id,
            "approve:7f3a",
        )
        .id("cbq-alice-1")
        .push();

    let inbox = TestInbox::new(InboxMode::Accept);
    let run = start(&adapter, inbox.clone());
    let press = the_press(&inbox.wait_for_events(1).await);
    fake.wait_for_ack(update, WAIT).await.unwrap();
    assert_eq!(press.chat, group());
    assert_eq!(press.sender.id, "telegram:1001");
    assert_eq!(press.sender.name, "Alice Liddell");
    assert_eq!(press.sender.username.as_deref(), Some("alice"));
    assert_eq!(press.data, "approve:7f3a");
    assert_eq!(press.answer, "cbq-alice-1");
    assert_eq!(press.message_id, Some(message_id.to_string()));
    assert!(inbox.messages().is_empty(), "a press is not a message");

    // The runtime's answer: an alert, cut to Telegram's 200 characters.
    let long = "é".repeat(250);
    adapter
        .answer_button(&press, Some(&long))
        .await
        .expect("answered");
    let answers = fake.wait_for_callback_answers(1, WAIT).await.unwrap();
    assert_eq!(answers[0].callback_query_id, "cbq-alice-1");
    assert_eq!(answers[0].text.as_deref(), Some("é".repeat(200).as_str()));
    assert!(answers[0].show_alert);

    // Without text it only acknowledges.
    fake.callback_query(alice(), GROUP, message_id, "deny:7f3a")
        .id("cbq-alice-2")
        .push();
    let events = inbox.wait_for_events(2).await;
    let ChatEvent::Button(second) = &events[1] else {
        panic!("not a press: {events:?}");
    };
    adapter.answer_button(second, None).await.expect("answered");
    let answers = fake.wait_for_callback_answers(2, WAIT).await.unwrap();
    assert_eq!(answers[1].callback_query_id, "cbq-alice-2");
    assert_eq!(answers[1].text, None);
    assert!(!answers[1].show_alert);
    run.stop(STOP).await.unwrap();
}

#[tokio::test]
async fn a_callback_without_data_is_skipped_but_acknowledged() {
    let (fake, adapter) = connected().await;
    fake.group_chat(GROUP, "Parlor test");
    let game = fake
        .callback_query(alice(), GROUP, 1, "unused")
        .without_data()
        .push();
    // A press after it: once the press is in, the query before it was handled.
    fake.callback_query(alice(), GROUP, 1, "approve:1")
        .id("sentinel")
        .push();

    let inbox = TestInbox::new(InboxMode::Accept);
    let run = start(&adapter, inbox.clone());
    let press = the_press(&inbox.wait_for_events(1).await);
    assert_eq!(press.answer, "sentinel");
    fake.wait_for_all_taken(WAIT).await.unwrap();
    assert!(fake.acked_offset().is_some_and(|offset| offset > game));
    run.stop(STOP).await.unwrap();
    assert_eq!(
        inbox.events().len(),
        1,
        "the query without data was skipped"
    );
}

#[tokio::test]
async fn a_button_press_through_the_webhook_arrives_in_its_topic() {
    let (fake, adapter, inbox, receiver) = webhook_receiver().await;
    fake.forum_topic(GROUP, 7);
    let topic = group().in_thread("7");
    let sent = adapter
        .send_buttons(&topic, "May I?", None, None, &mut Vec::new(), &buttons())
        .await
        .expect("sent");
    assert_eq!(fake.sent_messages()[0].inline_keyboard()[0].len(), 2);
    let message_id: i64 = sent.message_ids[0].parse().unwrap();
    let update = fake
        .callback_query(alice(), GROUP, message_id, "deny:7f3a")
        .webhook_update();
    assert_eq!(
        post_update(&receiver, &update).await,
        WebhookAnswer::Accepted
    );
    let press = the_press(&inbox.events());
    assert_eq!(
        press.chat, topic,
        "the press belongs to the topic's session"
    );
    assert_eq!(press.data, "deny:7f3a");
    assert_eq!(press.sender.id, "telegram:1001");
    assert_eq!(press.message_id, Some(message_id.to_string()));
    assert_eq!(
        Some(press.answer.as_str()),
        update["callback_query"]["id"].as_str()
    );

    let without_data = fake
        .callback_query(alice(), GROUP, message_id, "x")
        .without_data()
        .webhook_update();
    assert_eq!(
        post_update(&receiver, &without_data).await,
        WebhookAnswer::Accepted,
        "skipped, and acknowledged so Telegram does not send it again"
    );
    assert_eq!(inbox.events().len(), 1);
}
