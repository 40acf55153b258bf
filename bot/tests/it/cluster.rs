//! Several instances on one store (`session/cluster.rs`, `session/lease.rs`): two session
//! managers share a `MemoryStore`, as two daemons share PostgreSQL. A chat runs in the
//! instance holding its lease; input taken by the other is answered by the holder; a
//! holder that stops renewing loses the chat to the other once the lease expires, and its
//! late commit is refused by the fence; a shutdown hands its chats over at once.

use std::sync::Arc;
use std::time::Duration;

use parlor_bot::agent::AgentConfig;
use parlor_bot::platform::Inbox;
use parlor_bot::session::{Cluster, SessionConfig, SessionManager};
use parlor_bot::session::{cluster, lease};
use parlor_bot::store::{MemoryStore, Store};
use parlor_bot::testing::{
    CrashStore, ScriptedLlm, TestPlatform, WAIT_LIMIT, group, message, text, toolless_manager,
    wait_until,
};
use parlor_bot::time::WallTime;

struct Instance {
    manager: SessionManager,
    platform: Arc<TestPlatform>,
    llm: Arc<ScriptedLlm>,
    store: Arc<CrashStore>,
}

fn instance(shared: &Arc<MemoryStore>, name: &str, llm: ScriptedLlm) -> Instance {
    let llm = llm.shared();
    let store = CrashStore::new(Arc::clone(shared), usize::MAX);
    let platform = TestPlatform::new();
    let mut cluster = Cluster::new(format!("{name}-1"));
    cluster.lease_ttl = Duration::from_secs(10);
    cluster.sweep_every = Duration::from_secs(1);
    let manager = toolless_manager(
        Arc::clone(&store) as Arc<dyn Store>,
        llm.clone(),
        &platform,
        SessionConfig {
            cluster: Some(cluster),
            wall_time: WallTime::tokio_anchored(),
            ..SessionConfig::default()
        },
        AgentConfig::default(),
    );
    Instance {
        manager,
        platform,
        llm,
        store,
    }
}

/// Two instances on one fresh store, both resumed (their sweeps and heartbeats running).
async fn pair(a: ScriptedLlm, b: ScriptedLlm) -> (Arc<MemoryStore>, Instance, Instance) {
    let shared = Arc::new(MemoryStore::new());
    let a = instance(&shared, "a", a);
    let b = instance(&shared, "b", b);
    a.manager.resume().await.unwrap();
    b.manager.resume().await.unwrap();
    (shared, a, b)
}

fn answering(word: &'static str) -> ScriptedLlm {
    ScriptedLlm::answering(move |_, _| Ok(text(word)))
}

#[tokio::test(start_paused = true)]
async fn input_taken_by_another_instance_is_answered_once_by_the_chats_holder() {
    let (shared, a, b) = pair(answering("from a"), answering("from b")).await;

    a.manager
        .deliver(message(&group(), 1, "alice", "@parlor hi"))
        .await
        .unwrap();
    a.platform.wait_sent(1).await;
    assert_eq!(a.manager.stats().leases_held, 1);
    // B takes the next message: it records it, and A, the holder, answers it.
    b.manager
        .deliver(message(&group(), 2, "bob", "@parlor and me?"))
        .await
        .unwrap();
    let sent = a.platform.wait_sent(2).await;
    assert_eq!(sent[1].text, "from a");
    assert!(b.platform.sent().is_empty());
    assert!(b.llm.requests().is_empty(), "B never ran the chat");
    assert_eq!(a.llm.requests().len(), 2);
    assert_eq!(b.manager.stats().leases_held, 0);
    let key = group().session_key();
    assert_eq!(
        shared.load_history(&key).unwrap().len(),
        4,
        "each answered once"
    );
}

#[tokio::test(start_paused = true)]
async fn a_holder_that_stops_renewing_loses_the_chat_its_turn_stops_and_the_other_answers_once() {
    let (shared, a, b) = pair(answering("late from a").gated(), answering("from b")).await;
    let key = group().session_key();

    a.manager
        .deliver(message(&group(), 1, "alice", "@parlor hi"))
        .await
        .unwrap();
    wait_until("A asks its model", WAIT_LIMIT, || {
        a.llm.requests().len() == 1
    })
    .await;
    // A hangs (its model never answers) and its heartbeat no longer reaches the store.
    a.store.refuse_space(Some(lease::EXPIRY_SPACE));

    // Once A's lease expired, B's sweep takes the chat and answers the pending input.
    let sent = b
        .platform
        .wait_sent_within(1, Duration::from_secs(60))
        .await;
    assert_eq!(sent[0].text, "from b");
    assert_eq!(b.manager.stats().takeovers, 1);
    let holder = lease::holder(
        shared.as_ref(),
        &cluster::chat_lease(&key),
        WallTime::tokio_anchored().now(),
    )
    .unwrap()
    .unwrap();
    assert!(holder.0.owner.starts_with("b-"), "{holder:?}");
    assert_eq!(holder.0.token, 2);

    // A's turn stopped when its lease lapsed, its input left pending; its model answering
    // at last changes nothing (a commit would carry the old token and be refused).
    a.llm.release(1);
    wait_until("A's turn over", WAIT_LIMIT, || a.manager.is_idle()).await;
    assert!(a.platform.sent().is_empty(), "{:?}", a.platform.sent());
    assert_eq!(
        shared.load_history(&key).unwrap().len(),
        2,
        "answered once, by B"
    );

    // Its heartbeat back, A learns it lost the chat.
    a.store.refuse_space(None);
    wait_until("A counts the lease lost", WAIT_LIMIT * 4, || {
        a.manager.stats().leases_lost == 1
    })
    .await;
    assert_eq!(a.manager.stats().leases_held, 0);
}

#[tokio::test(start_paused = true)]
async fn a_shutdown_hands_the_chats_over_at_once() {
    let (shared, a, b) = pair(answering("from a"), answering("from b")).await;
    let key = group().session_key();
    a.manager
        .deliver(message(&group(), 1, "alice", "@parlor hi"))
        .await
        .unwrap();
    a.platform.wait_sent(1).await;
    let before = WallTime::tokio_anchored().now();
    a.manager.shutdown(Duration::from_secs(5)).await;
    assert_eq!(
        lease::holder(shared.as_ref(), &cluster::chat_lease(&key), before).unwrap(),
        None,
        "let go, not left to expire"
    );

    b.manager
        .deliver(message(&group(), 2, "bob", "@parlor still there?"))
        .await
        .unwrap();
    let sent = b.platform.wait_sent(1).await;
    assert_eq!(sent[0].text, "from b");
    assert_eq!(shared.load_history(&key).unwrap().len(), 4);
}

/// Sized honestly: one instance takes every message (it polls), yet past its share of the
/// chats it leaves a new chat to the other, whose sweep takes it.
#[tokio::test(start_paused = true)]
async fn an_instance_past_its_share_leaves_new_chats_to_the_others() {
    let (_, a, b) = pair(answering("from a"), answering("from b")).await;
    let chat = |n: u32| parlor_bot::platform::ChatRef::new("test", format!("-{n}"));

    a.manager
        .deliver(message(&chat(1), 1, "alice", "@parlor hi"))
        .await
        .unwrap();
    a.platform.wait_sent(1).await;
    // Heartbeats write the loads, sweeps read them: A holds 1 of 1, its share is 1.
    tokio::time::sleep(Duration::from_secs(5)).await;
    a.manager
        .deliver(message(&chat(2), 2, "alice", "@parlor hi"))
        .await
        .unwrap();
    let sent = b.platform.wait_sent(1).await;
    assert_eq!(
        (sent[0].chat.clone(), sent[0].text.as_str()),
        (chat(2), "from b")
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    // One each: A's share is 2 now, and it takes the next chat itself.
    a.manager
        .deliver(message(&chat(3), 3, "alice", "@parlor hi"))
        .await
        .unwrap();
    let sent = a.platform.wait_sent(2).await;
    assert_eq!(sent[1].chat, chat(3));
    assert_eq!(a.manager.stats().leases_held, 2);
    assert_eq!(b.manager.stats().leases_held, 1);
}
