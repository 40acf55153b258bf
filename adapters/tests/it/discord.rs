//! The Discord adapter against `parlor_testkit::FakeDiscord`: real serenity (gateway over a
//! WebSocket on 127.0.0.1, REST through `api_url`) and, where it matters, the real
//! `SessionManager` with a `MemoryStore` and an echoing model (`ScriptedLlm::echo`).
//!
//! Real time throughout (sockets and heartbeats need a running clock).

use std::sync::Arc;
use std::time::{Duration, Instant};

use parlor_adapters::Receiver;
use parlor_adapters::discord::{DiscordAdapter, DiscordConfig, MAX_MESSAGE_CHARS};
use parlor_bot::agent::{Agent, AgentConfig};
use parlor_bot::platform::{
    ButtonPress, ChatEvent, ChatKind, ChatRef, ImageRef, Inbox, Platform, PlatformError,
};
use parlor_bot::session::{SessionConfig, SessionManager};
use parlor_bot::store::{MemoryStore, Store};
use parlor_bot::testing::{InboxMode, ScriptedLlm, TestInbox};
use parlor_bot::tool::ToolRegistry;
use parlor_testkit::{DiscordFailure, DiscordSent, DiscordUser, FakeDiscord};
use tokio_util::sync::CancellationToken;

use crate::support::{Running, buttons, eventually};

const TOKEN: &str = "MTEwMA.test.SECRET-token";
const GUILD: u64 = 900_000_000_000_000_001;
const OWNER: u64 = 900_000_000_000_000_002;
const CHANNEL: u64 = 900_000_000_000_000_010;
const THREAD: u64 = 900_000_000_000_000_011;
const DM: u64 = 900_000_000_000_000_020;
const WAIT: Duration = Duration::from_secs(10);

fn alice() -> DiscordUser {
    DiscordUser::new(500_000_000_000_000_001, "alice").global_name("Alice")
}

fn bob() -> DiscordUser {
    DiscordUser::new(500_000_000_000_000_002, "bob")
}

fn channel() -> ChatRef {
    ChatRef::new("discord", CHANNEL.to_string())
}

async fn fake() -> FakeDiscord {
    let fake = FakeDiscord::start(TOKEN).await;
    fake.guild(GUILD, OWNER);
    fake.text_channel(GUILD, CHANNEL);
    fake.thread(GUILD, CHANNEL, THREAD);
    fake.dm_channel(DM);
    fake
}

fn config(fake: &FakeDiscord) -> DiscordConfig {
    let mut config = DiscordConfig::new(TOKEN);
    config.api_url = Some(fake.api_url());
    config.request_timeout = Duration::from_secs(5);
    config
}

async fn connect(fake: &FakeDiscord) -> DiscordAdapter {
    DiscordAdapter::connect(config(fake))
        .await
        .expect("connects to the fake")
}

/// The adapter running against the fake, once the gateway is ready.
async fn start(adapter: &DiscordAdapter, inbox: Arc<dyn Inbox>, fake: &FakeDiscord) -> Running {
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let running = Running::spawn(adapter, inbox, move || {
        let _ = ready_tx.send(());
    });
    tokio::time::timeout(WAIT, ready_rx)
        .await
        .expect("ready is called at READY")
        .expect("ready is called");
    fake.wait_for_ready(WAIT).await.expect("gateway ready");
    running
}

struct Rig {
    fake: FakeDiscord,
    adapter: DiscordAdapter,
    store: Arc<MemoryStore>,
    manager: SessionManager,
    running: Running,
}

async fn rig() -> Rig {
    let fake = fake().await;
    let adapter = connect(&fake).await;
    let store = Arc::new(MemoryStore::new());
    let registry = ToolRegistry::new(Vec::new()).expect("an empty registry");
    let agent = Agent::new(
        ScriptedLlm::echo().shared(),
        registry,
        "test",
        AgentConfig::default(),
    );
    let manager = SessionManager::new(
        store.clone() as Arc<dyn Store>,
        agent,
        vec![Arc::new(adapter.clone()) as Arc<dyn Platform>],
        SessionConfig::default(),
    );
    let running = start(&adapter, Arc::new(manager.clone()), &fake).await;
    Rig {
        fake,
        adapter,
        store,
        manager,
        running,
    }
}

/// No message the adapter sent may ping `@everyone`/`@here` or roles.
fn assert_safe_mentions(sent: &[DiscordSent]) {
    for message in sent {
        let allowed = message
            .allowed_mentions
            .as_ref()
            .unwrap_or_else(|| panic!("allowed_mentions is always explicit: {:?}", message.body));
        assert_eq!(allowed["parse"], serde_json::json!(["users"]), "{allowed}");
        assert!(!message.parses("everyone") && !message.parses("roles"));
        assert!(!message.pings_everyone(), "{message:?}");
    }
}

#[tokio::test]
async fn a_mention_gets_a_reply_in_the_channel_and_chatter_is_only_recorded() {
    let rig = rig().await;
    let chatter = rig
        .fake
        .message_create(CHANNEL, &bob(), "nice weather today");
    let asked = rig
        .fake
        .message(CHANNEL, &alice(), "what is 2+2?")
        .mention_bot()
        .push();
    let sent = rig.fake.wait_for_sent(1, WAIT).await.expect("a reply");
    assert_eq!(sent[0].channel_id, CHANNEL.to_string());
    assert_eq!(sent[0].reply_to().as_deref(), Some(asked.as_str()));
    assert_eq!(
        sent[0].message_reference.as_ref().unwrap()["fail_if_not_exists"],
        false
    );
    // Rendered by the Discord renderer (Markdown characters such as `_` escaped).
    assert!(
        sent[0]
            .content
            .starts_with("reply: Alice (discord:500000000000000001): @parlor"),
        "{:?}",
        sent[0].content
    );
    assert!(
        sent[0].content.ends_with("what is 2+2?"),
        "{:?}",
        sent[0].content
    );
    assert_safe_mentions(&sent);

    // The bot's own MESSAGE_CREATE came back and was not taken as a new message; the chatter
    // was recorded but never answered. A last line of chatter comes after that echo on the
    // gateway: once it is recorded, the echo was handled.
    let last = rig.fake.message_create(CHANNEL, &bob(), "see you");
    let log = eventually("the last chatter recorded", || {
        let log = rig
            .store
            .recent_messages(&channel().session_key(), 10)
            .unwrap();
        log.iter().any(|m| m.message_id == last).then_some(log)
    })
    .await;
    assert_eq!(rig.fake.sent_messages().len(), 1);
    let ids: Vec<&str> = log.iter().map(|m| m.message_id.as_str()).collect();
    assert!(ids.contains(&chatter.as_str()), "{ids:?}");
    assert!(ids.contains(&asked.as_str()), "{ids:?}");
    assert_eq!(log.iter().filter(|m| m.from_self).count(), 1, "{log:?}");

    rig.running.stop(WAIT).await.expect("clean stop");
    rig.manager.shutdown(Duration::from_secs(1)).await;
    drop(rig.adapter);
}

#[tokio::test]
async fn a_gateway_disconnect_loses_and_repeats_nothing() {
    let rig = rig().await;
    let first = rig
        .fake
        .message(CHANNEL, &alice(), "first")
        .mention_bot()
        .push();
    rig.fake.wait_for_sent(1, WAIT).await.expect("first reply");

    assert!(rig.fake.disconnect());
    // Pushed while the connection is down: queued by the fake, replayed after the resume.
    let second = rig
        .fake
        .message(CHANNEL, &alice(), "second")
        .mention_bot()
        .push();
    let resumes = rig.fake.wait_for_resumes(1, WAIT).await.expect("a resume");
    assert!(resumes[0]["session_id"].is_string());
    let sent = rig.fake.wait_for_sent(2, WAIT).await.expect("second reply");
    // And after the resume, a third.
    rig.fake.wait_for_ready(WAIT).await.expect("ready again");
    let third = rig
        .fake
        .message(CHANNEL, &alice(), "third")
        .mention_bot()
        .push();
    let sent_after = rig.fake.wait_for_sent(3, WAIT).await.expect("third reply");
    // A fourth: the chat's turns run in order, so a repeated reply would come before its.
    let fourth = rig
        .fake
        .message(CHANNEL, &alice(), "fourth")
        .mention_bot()
        .push();
    rig.fake.wait_for_sent(4, WAIT).await.expect("fourth reply");
    let all = rig.fake.sent_messages();
    assert_eq!(all.len(), 4, "no reply repeated: {all:?}");
    let replied: Vec<String> = all.iter().filter_map(DiscordSent::reply_to).collect();
    assert_eq!(replied, [first, second, third, fourth]);
    assert!(sent[1].content.ends_with("second"), "{:?}", sent[1].content);
    assert!(
        sent_after[2].content.ends_with("third"),
        "{:?}",
        sent_after[2].content
    );
    assert_eq!(rig.fake.identifies().len(), 1, "resumed, not re-identified");
    assert_safe_mentions(&all);
    drop(rig.running);
}

#[tokio::test]
async fn messages_are_normalized() {
    let fake = fake().await;
    let adapter = connect(&fake).await;
    let inbox = Arc::new(TestInbox::default());
    let running = start(&adapter, inbox.clone(), &fake).await;
    let bot = fake.bot();

    // The bot's own message, even mentioning itself, is never delivered.
    fake.message(CHANNEL, &bot, "I am <@1100>")
        .mention_bot()
        .push();
    let plain = fake.message_create(CHANNEL, &bob(), "just chatting");
    let command = fake
        .message(CHANNEL, &alice(), "/help")
        .mention_bot()
        .push();
    let nick = fake
        .message(CHANNEL, &alice(), "hey <@!1100> and <@500000000000000002>")
        .mention(&bob())
        .push();
    let in_thread = fake.message_create(THREAD, &bob(), "in a thread");
    let direct = fake.message(DM, &alice(), "hello in private").dm().push();
    let reply = adapter
        .send(&channel(), "an answer", None, None, &mut Vec::new())
        .await
        .expect("sent");
    let answer_id = reply.message_ids[0].clone();
    let to_bot = fake
        .message(CHANNEL, &bob(), "about that answer")
        .reply_to(answer_id.clone())
        .push();
    let image = fake
        .message(CHANNEL, &bob(), "")
        .attachment("cat.png", "image/png", vec![1, 2, 3, 4])
        .push();

    inbox.wait_for(7).await;
    // The bot's own "an answer" came back before this last line: once the line is in, the
    // echo was handled, and it must not have been delivered.
    let last = fake.message_create(CHANNEL, &bob(), "the last line");
    let messages = inbox
        .until_delivered("the last line", || {
            let messages = inbox.messages();
            messages
                .iter()
                .any(|m| m.message_id == last)
                .then_some(messages)
        })
        .await;
    assert_eq!(messages.len(), 8, "{messages:#?}");
    let by_id = |id: &str| {
        messages
            .iter()
            .find(|m| m.message_id == id)
            .unwrap_or_else(|| panic!("{id} delivered: {messages:#?}"))
            .clone()
    };

    let m = by_id(&plain);
    assert_eq!(m.chat, channel());
    assert_eq!(m.kind, ChatKind::Group);
    assert!(!m.mentions_bot);
    assert_eq!(m.sender.id, format!("discord:{}", bob().id));
    assert_eq!(m.sender.name, "bob");
    assert_eq!(m.sender.username.as_deref(), Some("bob"));
    assert!(!m.sender.is_bot);
    assert_eq!(m.text, "just chatting");

    let m = by_id(&command);
    assert!(m.mentions_bot);
    assert_eq!(m.text, "/help", "the runtime sees the command");
    assert_eq!(m.sender.name, "Alice");

    let m = by_id(&nick);
    assert!(m.mentions_bot, "<@!id> is a mention");
    assert_eq!(m.text, "hey @parlor_bot and @bob");

    let m = by_id(&in_thread);
    assert_eq!(m.chat, ChatRef::new("discord", THREAD.to_string()));
    assert_eq!(m.kind, ChatKind::Group);

    let m = by_id(&direct);
    assert_eq!(m.chat, ChatRef::new("discord", DM.to_string()));
    assert_eq!(m.kind, ChatKind::Private);

    let m = by_id(&to_bot);
    assert!(!m.mentions_bot);
    assert!(m.reply_to_bot);
    assert_eq!(m.reply_to.as_deref(), Some(answer_id.as_str()));

    let m = by_id(&image);
    assert_eq!(m.text, "");
    assert_eq!(m.images.len(), 1);
    assert_eq!(m.images[0].mime_type.as_deref(), Some("image/png"));
    assert_eq!(m.images[0].size, Some(4));
    let bytes = adapter
        .download_image(&m.images[0])
        .await
        .expect("downloads");
    assert_eq!(bytes, vec![1, 2, 3, 4]);

    running.stop(WAIT).await.expect("clean stop");
}

#[tokio::test]
async fn a_long_reply_arrives_in_parts_of_at_most_2000_characters() {
    let fake = fake().await;
    let adapter = connect(&fake).await;
    let asked = fake.message_create(CHANNEL, &alice(), "tell me everything");
    let paragraph = "All work and no play makes Jack a dull boy. ".repeat(10);
    let text = (0..12)
        .map(|_| paragraph.trim_end().to_owned())
        .collect::<Vec<_>>()
        .join("\n\n");
    assert!(text.chars().count() > 5000);
    let sent = adapter
        .send(&channel(), &text, Some(&asked), None, &mut Vec::new())
        .await
        .expect("sent");
    assert!(sent.message_ids.len() >= 3, "{sent:?}");
    let parts = fake.sent_messages();
    assert_eq!(parts.len(), sent.message_ids.len());
    for (index, part) in parts.iter().enumerate() {
        assert!(part.content.chars().count() <= MAX_MESSAGE_CHARS);
        assert_eq!(part.id, sent.message_ids[index]);
        if index == 0 {
            assert_eq!(part.reply_to().as_deref(), Some(asked.as_str()));
            assert_eq!(
                part.allowed_mentions.as_ref().unwrap()["replied_user"],
                true
            );
        } else {
            assert!(
                part.message_reference.is_none(),
                "only the first part replies"
            );
        }
    }
    let words = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let joined: String = parts
        .iter()
        .map(|p| p.content.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(words(&joined), words(&text), "nothing lost");
    assert_safe_mentions(&parts);
    assert!(
        adapter
            .send(&channel(), "  ", None, None, &mut Vec::new())
            .await
            .is_err(),
        "empty text is refused"
    );
}

#[tokio::test]
async fn everyone_in_a_reply_does_not_ping() {
    let fake = fake().await;
    let adapter = connect(&fake).await;
    adapter
        .send(
            &channel(),
            "@everyone @here look, <@&123> too",
            None,
            None,
            &mut Vec::new(),
        )
        .await
        .expect("sent");
    let sent = fake.sent_messages();
    assert_eq!(sent.len(), 1);
    // Defused twice: the renderer breaks the markup, and allowed_mentions parses users only.
    assert!(sent[0].content.contains("look"), "{:?}", sent[0].content);
    for markup in ["@everyone", "@here", "<@&123>"] {
        assert!(!sent[0].content.contains(markup), "{:?}", sent[0].content);
    }
    assert_safe_mentions(&sent);
    assert_eq!(
        sent[0].allowed_mentions.as_ref().unwrap()["replied_user"],
        false
    );

    // Configured otherwise, mass mentions are let through on purpose.
    let mut config = config(&fake);
    config.allow_mass_mentions = true;
    let loud = DiscordAdapter::connect(config).await.expect("connects");
    loud.send(&channel(), "@everyone meeting", None, None, &mut Vec::new())
        .await
        .expect("sent");
    let sent = fake.sent_messages();
    assert!(sent[1].pings_everyone());
}

#[tokio::test]
async fn a_reply_sent_twice_with_one_key_is_created_once() {
    let fake = fake().await;
    let adapter = connect(&fake).await;
    let asked = fake.message_create(CHANNEL, &alice(), "tell me everything");
    let text = "All work and no play makes Jack a dull boy. ".repeat(60);
    let first = adapter
        .send(
            &channel(),
            &text,
            Some(&asked),
            Some("outbox-7"),
            &mut Vec::new(),
        )
        .await
        .expect("sent");
    assert!(first.message_ids.len() >= 2, "{first:?}");
    let parts = fake.sent_messages();
    assert_eq!(parts.len(), first.message_ids.len());
    let nonces: Vec<&str> = parts
        .iter()
        .map(|p| p.body["nonce"].as_str().expect("a nonce"))
        .collect();
    assert!(nonces.iter().all(|n| n.chars().count() <= 25), "{nonces:?}");
    assert_ne!(nonces[0], nonces[1], "each part has its own");
    assert!(parts.iter().all(|p| p.body["enforce_nonce"] == true));

    // The outbox sends again (its answer was lost, or the daemon restarted): Discord hands
    // back the messages it made the first time.
    let again = adapter
        .send(
            &channel(),
            &text,
            Some(&asked),
            Some("outbox-7"),
            &mut Vec::new(),
        )
        .await
        .expect("sent");
    assert_eq!(again.message_ids, first.message_ids);
    assert_eq!(
        fake.sent_messages().len(),
        parts.len(),
        "nothing created twice"
    );

    // Another reply, even with the same text, is new.
    let other = adapter
        .send(
            &channel(),
            &text,
            Some(&asked),
            Some("outbox-8"),
            &mut Vec::new(),
        )
        .await
        .expect("sent");
    assert!(
        other
            .message_ids
            .iter()
            .all(|id| !first.message_ids.contains(id))
    );
    assert_eq!(fake.sent_messages().len(), 2 * parts.len());
    // Plain sends carry no nonce and are never deduplicated.
    adapter
        .send(&channel(), "hi", None, None, &mut Vec::new())
        .await
        .unwrap();
    adapter
        .send(&channel(), "hi", None, None, &mut Vec::new())
        .await
        .unwrap();
    let sent = fake.sent_messages();
    assert_eq!(sent.len(), 2 * parts.len() + 2);
    assert!(sent.last().unwrap().body.get("nonce").is_none());
}

#[tokio::test]
async fn rate_limits_are_honoured() {
    let fake = fake().await;
    let adapter = connect(&fake).await;
    fake.fail_next("create_message", DiscordFailure::rate_limited(0.3));
    // A send is one attempt: the 429's wait is reported for the outbox lane to honour.
    let refused = adapter
        .send(&channel(), "after the wait", None, None, &mut Vec::new())
        .await;
    assert!(
        matches!(refused, Err(PlatformError::RateLimited(wait)) if wait >= Duration::from_millis(300)),
        "{refused:?}"
    );
    adapter
        .send(&channel(), "after the wait", None, None, &mut Vec::new())
        .await
        .expect("sent after the 429");
    assert_eq!(fake.sent_messages().len(), 1);
    let posts = fake
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/messages"))
        .count();
    assert_eq!(posts, 2, "one refused, one accepted");

    // A server error is reported as an outage (the outbox retries it); an unknown channel
    // as not found (the outbox gives the reply up).
    fake.fail_next("create_message", DiscordFailure::server_error());
    let outage = adapter
        .send(&channel(), "after a 500", None, None, &mut Vec::new())
        .await;
    assert!(
        matches!(outage, Err(PlatformError::Unavailable(_))),
        "{outage:?}"
    );
    let missing = adapter
        .send(
            &ChatRef::new("discord", "123"),
            "x",
            None,
            None,
            &mut Vec::new(),
        )
        .await;
    assert!(
        matches!(missing, Err(PlatformError::NotFound(ref m)) if m.contains("Unknown Channel")),
        "{missing:?}"
    );
}

#[tokio::test]
async fn sends_to_one_channel_are_paced() {
    let fake = fake().await;
    let mut config = config(&fake);
    config.sends_per_window = 2;
    config.send_window = Duration::from_millis(400);
    let adapter = DiscordAdapter::connect(config).await.expect("connects");
    let start = Instant::now();
    for i in 0..3 {
        adapter
            .send(&channel(), &format!("n{i}"), None, None, &mut Vec::new())
            .await
            .expect("sent");
    }
    assert!(start.elapsed() >= Duration::from_millis(400));
    assert_eq!(fake.sent_messages().len(), 3);
}

#[tokio::test]
async fn typing_and_admins() {
    let fake = fake().await;
    fake.role(GUILD, 1, 8); // Administrator
    fake.role(GUILD, 2, 32); // Manage Server
    fake.role(GUILD, 3, 1 << 10); // View Channel only
    let carol = DiscordUser::new(500_000_000_000_000_003, "carol");
    fake.member(GUILD, alice().id, vec![1]);
    fake.member(GUILD, bob().id, vec![3]);
    fake.member(GUILD, carol.id, vec![2, 3]);
    let adapter = connect(&fake).await;
    let inbox = Arc::new(TestInbox::default());
    let running = start(&adapter, inbox.clone(), &fake).await;
    fake.message_create(CHANNEL, &alice(), "a");
    fake.message_create(CHANNEL, &bob(), "b");
    fake.message_create(CHANNEL, &carol, "c");
    inbox.wait_for(3).await;

    adapter.send_typing(&channel()).await.expect("typing");
    assert_eq!(fake.typing_calls()[0].channel_id, CHANNEL.to_string());

    let admins = adapter.chat_admins(&channel()).await.expect("admins");
    let mut expected = vec![
        format!("discord:{}", alice().id),
        format!("discord:{}", carol.id),
        format!("discord:{OWNER}"),
    ];
    expected.sort();
    assert_eq!(admins, expected);
    let dm = adapter
        .chat_admins(&ChatRef::new("discord", DM.to_string()))
        .await
        .expect("no admins in a DM");
    assert!(dm.is_empty());
    running.stop(WAIT).await.expect("clean stop");
}

#[tokio::test]
async fn images_are_bounded_and_only_from_discord() {
    let fake = fake().await;
    let mut config = config(&fake);
    config.max_image_bytes = 3;
    let adapter = DiscordAdapter::connect(config).await.expect("connects");
    let url = fake.add_attachment(CHANNEL, "big.png", vec![0; 10]);
    let unknown_size = ImageRef {
        file_id: url.clone(),
        mime_type: None,
        size: None,
    };
    assert!(matches!(
        adapter.download_image(&unknown_size).await,
        Err(PlatformError::Refused(_))
    ));
    let known_size = ImageRef {
        size: Some(10),
        ..unknown_size
    };
    assert!(matches!(
        adapter.download_image(&known_size).await,
        Err(PlatformError::Refused(_))
    ));
    let elsewhere = ImageRef {
        file_id: "http://169.254.169.254/latest/meta-data".to_owned(),
        mime_type: None,
        size: None,
    };
    assert!(matches!(
        adapter.download_image(&elsewhere).await,
        Err(PlatformError::Refused(_))
    ));
    assert_eq!(fake.downloads().len(), 1, "only the first was fetched");
}

#[tokio::test]
async fn a_wrong_token_is_unauthorized_and_never_shown() {
    let fake = fake().await;
    let mut config = config(&fake);
    config.token = "WRONG-SECRET".into();
    let error = DiscordAdapter::connect(config.clone())
        .await
        .expect_err("refused");
    assert!(matches!(error, PlatformError::Unauthorized));
    assert!(!format!("{config:?}").contains("WRONG-SECRET"));
    config.token = "  ".into();
    assert!(matches!(
        DiscordAdapter::connect(config).await,
        Err(PlatformError::Unauthorized)
    ));
}

#[tokio::test]
async fn the_gateway_rejecting_the_token_ends_the_run() {
    let fake = fake().await;
    let adapter = connect(&fake).await;
    fake.set_reject_identify(true);
    let inbox = Arc::new(TestInbox::default());
    let result = tokio::time::timeout(
        WAIT,
        adapter.run_with_ready(inbox, CancellationToken::new(), || panic!("never ready")),
    )
    .await
    .expect("gives up promptly");
    assert!(
        matches!(result, Err(PlatformError::Unauthorized)),
        "{result:?}"
    );
    assert_eq!(fake.identifies().len(), 1);
}

#[tokio::test]
async fn a_store_failure_is_retried_and_shutting_down_stops() {
    let fake = fake().await;
    let adapter = connect(&fake).await;
    let inbox = TestInbox::default().fail_next(2).shared();
    let running = start(&adapter, inbox.clone(), &fake).await;
    let id = fake.message_create(CHANNEL, &alice(), "keep me");
    let delivered = inbox.wait_for(1).await;
    assert_eq!(delivered[0].message_id, id);
    assert_eq!(inbox.failures_left(), 0);
    running.stop(WAIT).await.expect("clean stop");

    // An inbox that is shutting down ends the run without an error.
    let shutdown = CancellationToken::new();
    let run = tokio::spawn({
        let adapter = adapter.clone();
        async move {
            adapter
                .run(TestInbox::new(InboxMode::ShuttingDown), shutdown)
                .await
        }
    });
    // The second connection (the first one's close may still be in flight).
    eventually("a second ready connection", || {
        (fake.connections() >= 2 && fake.is_ready()).then_some(())
    })
    .await;
    fake.message_create(CHANNEL, &alice(), "too late");
    let result = tokio::time::timeout(WAIT, run)
        .await
        .expect("stops")
        .expect("no panic");
    assert!(result.is_ok(), "{result:?}");
}

// --- buttons -----------------------------------------------------------------------------

/// The button presses among `events`, in order.
fn presses(events: &[ChatEvent]) -> Vec<ButtonPress> {
    events
        .iter()
        .map(|event| match event {
            ChatEvent::Button(press) => press.clone(),
            other => panic!("not a button press: {other:?}"),
        })
        .collect()
}

#[tokio::test]
async fn buttons_go_under_the_last_part_only() {
    let fake = fake().await;
    let adapter = connect(&fake).await;
    let text = "All work and no play makes Jack a dull boy. ".repeat(100);
    let sent = adapter
        .send_buttons(&channel(), &text, None, None, &mut Vec::new(), &buttons())
        .await
        .expect("sent");
    assert!(sent.message_ids.len() >= 3, "{sent:?}");
    let parts = fake.sent_messages();
    let (last, earlier) = parts.split_last().unwrap();
    assert!(earlier.iter().all(|part| part.components().is_none()));
    let shown = last.buttons();
    let row: Vec<(Option<&str>, Option<&str>)> = shown
        .iter()
        .map(|b| (b.label.as_deref(), b.custom_id.as_deref()))
        .collect();
    assert_eq!(
        row,
        [
            (Some("Approve"), Some("approve:7f3a")),
            (Some("Deny"), Some("deny:7f3a"))
        ]
    );
    assert!(last.buttons().iter().all(|b| b.style == 2));
    assert_safe_mentions(&parts);

    // Six buttons do not fit Discord's row: refused before anything is sent.
    let six = vec![buttons()[0].clone(); 6];
    let refused = adapter
        .send_buttons(&channel(), "pick", None, None, &mut Vec::new(), &six)
        .await;
    assert!(
        matches!(refused, Err(PlatformError::Refused(_))),
        "{refused:?}"
    );
    assert_eq!(fake.sent_messages().len(), parts.len());
}

#[tokio::test]
async fn a_press_is_acknowledged_before_the_inbox_sees_it_and_answered_ephemerally() {
    let fake = fake().await;
    let adapter = connect(&fake).await;
    let inbox = Arc::new(TestInbox::default());
    let running = start(&adapter, inbox.clone(), &fake).await;
    let sent = adapter
        .send_buttons(
            &channel(),
            "May I?",
            None,
            None,
            &mut Vec::new(),
            &buttons(),
        )
        .await
        .expect("sent");
    let message_id = sent.message_ids[0].clone();

    let pressed = fake
        .button_press(CHANNEL, &alice(), message_id.clone(), "approve:7f3a")
        .push();
    let events = inbox.wait_for_events(1).await;
    // Checked the moment the inbox has it: the acknowledgement came first.
    let callbacks = fake.interaction_callbacks();
    assert_eq!(callbacks.len(), 1, "acknowledged before delivery");
    assert_eq!(callbacks[0].interaction_id, pressed.id);
    assert_eq!(callbacks[0].kind, 6, "deferred update: the message stays");
    let press = presses(&events).remove(0);
    assert_eq!(press.chat, channel());
    assert_eq!(press.sender.id, format!("discord:{}", alice().id));
    assert_eq!(press.sender.name, "Alice");
    assert_eq!(press.data, "approve:7f3a");
    assert_eq!(press.answer, format!("{}:{}", pressed.id, pressed.token));
    assert_eq!(press.message_id.as_deref(), Some(message_id.as_str()));
    assert!(inbox.messages().is_empty(), "a press is not a message");

    adapter
        .answer_button(&press, Some("Approved."))
        .await
        .expect("answered");
    let followups = fake.wait_for_followups(1, WAIT).await.unwrap();
    assert_eq!(followups[0].interaction_id, pressed.id);
    assert_eq!(followups[0].content, "Approved.");
    assert!(followups[0].is_ephemeral());

    // `None` adds nothing to the acknowledgement; a later answer with text is the sentinel.
    let quiet = fake
        .button_press(CHANNEL, &bob(), message_id.clone(), "deny:7f3a")
        .push();
    let loud = fake
        .button_press(CHANNEL, &bob(), message_id, "deny:7f3a")
        .push();
    let events = presses(&inbox.wait_for_events(3).await);
    adapter
        .answer_button(&events[1], None)
        .await
        .expect("answered");
    adapter
        .answer_button(&events[2], Some("Denied."))
        .await
        .expect("answered");
    let followups = fake.wait_for_followups(2, WAIT).await.unwrap();
    assert_eq!(followups.len(), 2, "{followups:?}");
    assert_eq!(followups[1].interaction_id, loud.id);
    let acknowledged: Vec<String> = fake
        .interaction_callbacks()
        .into_iter()
        .map(|c| c.interaction_id)
        .collect();
    assert_eq!(acknowledged, [pressed.id, quiet.id, loud.id]);
    running.stop(WAIT).await.expect("clean stop");
}

#[tokio::test]
async fn presses_in_a_dm_and_a_thread_keep_their_chat_and_other_components_are_skipped() {
    let fake = fake().await;
    let adapter = connect(&fake).await;
    let inbox = Arc::new(TestInbox::default());
    let running = start(&adapter, inbox.clone(), &fake).await;

    // A select menu (parlor sends none) is skipped; the presses after it arrive.
    fake.button_press(CHANNEL, &alice(), "1", "menu")
        .component_type(3)
        .push();
    let in_dm = fake.button_press(DM, &bob(), "2", "approve:dm").push();
    let in_thread = fake
        .button_press(THREAD, &alice(), "3", "approve:thread")
        .push();
    let events = presses(&inbox.wait_for_events(2).await);
    assert_eq!(events.len(), 2, "{events:?}");

    assert_eq!(events[0].chat, ChatRef::new("discord", DM.to_string()));
    assert_eq!(events[0].sender.id, format!("discord:{}", bob().id));
    assert_eq!(events[0].sender.name, "bob");
    assert_eq!(events[0].data, "approve:dm");
    assert_eq!(events[0].answer, format!("{}:{}", in_dm.id, in_dm.token));
    assert_eq!(events[0].message_id.as_deref(), Some("2"));

    assert_eq!(events[1].chat, ChatRef::new("discord", THREAD.to_string()));
    assert_eq!(events[1].sender.id, format!("discord:{}", alice().id));
    assert_eq!(
        events[1].answer,
        format!("{}:{}", in_thread.id, in_thread.token)
    );

    let acknowledged: Vec<String> = fake
        .interaction_callbacks()
        .into_iter()
        .map(|c| c.interaction_id)
        .collect();
    assert_eq!(acknowledged, [in_dm.id, in_thread.id]);
    running.stop(WAIT).await.expect("clean stop");
}
