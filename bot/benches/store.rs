//! Store throughput, printed as figures (never a pass/fail timing):
//! `cargo bench -p parlor-bot --bench store`.

// A failed unwrap in a test is the test failing.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Instant;

use chrono::Utc;
use parlor_bot::agent::{Agent, AgentConfig};
use parlor_bot::llm::Message;
use parlor_bot::platform::{ChatRef, Delivery, Inbox, Platform, Sender};
use parlor_bot::session::{SessionConfig, SessionManager};
use parlor_bot::store::{
    HistoryChange, PgStore, SledStore, Store, StoreOptions, StoredMessage, TurnCommit,
};
use parlor_bot::testing::{PgCluster, ScriptedLlm, TestPlatform};
use parlor_bot::tool::ToolRegistry;

fn message(id: usize) -> StoredMessage {
    StoredMessage {
        message_id: id.to_string(),
        sender: Sender {
            id: "telegram:1001".into(),
            name: "Alice".into(),
            username: None,
            is_bot: false,
        },
        text: "a typical group message of a few dozen characters".into(),
        time: Utc::now(),
        reply_to: None,
        images: Vec::new(),
        from_self: false,
    }
}

fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SledStore::open(dir.path(), StoreOptions::default()).expect("open");
    let n = 10_000;
    let start = Instant::now();
    for i in 0..n {
        let session = if i % 2 == 0 {
            "telegram:-1001"
        } else {
            "telegram:-1002"
        };
        store.record_message(session, &message(i)).expect("record");
    }
    let recorded = start.elapsed();
    let flush = Instant::now();
    store.flush().expect("flush");
    println!(
        "record_message: {n} in {recorded:?} ({:.1} µs each); flush {:?}",
        recorded.as_secs_f64() * 1e6 / n as f64,
        flush.elapsed()
    );
    let start = Instant::now();
    for _ in 0..1000 {
        store.recent_messages("telegram:-1001", 50).expect("recent");
    }
    println!(
        "recent_messages(50): {:.1} µs each",
        start.elapsed().as_secs_f64() * 1e3
    );
    let start = Instant::now();
    for _ in 0..100 {
        store.flush().expect("flush");
    }
    println!(
        "flush with nothing new: {:.1} µs each",
        start.elapsed().as_secs_f64() * 1e4
    );
    // What the session layer pays per addressed message: one record and one flush.
    let start = Instant::now();
    for i in 0..100 {
        store
            .record_message("telegram:-1003", &message(n + i))
            .expect("record");
        store.flush().expect("flush");
    }
    println!(
        "record + flush (durable intake): {:.2} ms each",
        start.elapsed().as_secs_f64() * 10.0
    );

    concurrent_intake(&store, n + 100);
    concurrent_async_intake(&store, n + 100);
    turn_commits(&store);
    drop(store);
    let dir = tempfile::tempdir().expect("tempdir");
    session_burst("SledStore", || {
        Arc::new(SledStore::open(dir.path(), StoreOptions::default()).unwrap())
    });
    postgres();
}

/// The same on a [`PgStore`] on a throwaway local PostgreSQL (fsync off: the figures are
/// round trips and the store's own work, not the disk), when PostgreSQL is installed.
/// Process CPU leaves out the server's.
fn postgres() {
    let Some(cluster) = PgCluster::start() else {
        println!("PostgreSQL: not installed, no figures");
        return;
    };
    let store = PgStore::open(&cluster.database(), StoreOptions::default()).expect("open");
    println!("PostgreSQL ({}):", store.server());
    let n = 2000;
    let start = Instant::now();
    for i in 0..n {
        let session = if i % 2 == 0 {
            "telegram:-1001"
        } else {
            "telegram:-1002"
        };
        store.record_message(session, &message(i)).expect("record");
    }
    println!(
        "record_message (durable at once): {n} in {:?} ({:.1} µs each)",
        start.elapsed(),
        start.elapsed().as_secs_f64() * 1e6 / n as f64
    );
    let start = Instant::now();
    for _ in 0..200 {
        store.recent_messages("telegram:-1001", 50).expect("recent");
    }
    println!(
        "recent_messages(50): {:.1} µs each",
        start.elapsed().as_secs_f64() * 1e6 / 200.0
    );
    concurrent_intake(&store, n + 100);
    concurrent_async_intake(&store, n + 100);
    turn_commits(&store);
    let url = cluster.database();
    session_burst("PgStore", || {
        Arc::new(PgStore::open(&url, StoreOptions::default()).unwrap())
    });
}

/// The session layer on a store `open` makes, with an instant model and an instant
/// platform: a burst of mentions in as many chats, taken as one batch (as a `getUpdates`
/// answer is), until every reply is sent and marked sent. Flushes and process CPU per turn.
fn session_burst<S: Store>(name: &str, open: impl FnOnce() -> Arc<S>) {
    const CHATS: u32 = 200;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let store = open();
        let platform = TestPlatform::new();
        let agent = Agent::new(
            ScriptedLlm::echo().shared(),
            ToolRegistry::new(Vec::new()).unwrap(),
            "bench",
            AgentConfig::default(),
        );
        let manager = SessionManager::new(
            store.clone() as Arc<dyn Store>,
            agent,
            vec![platform.clone() as Arc<dyn Platform>],
            SessionConfig::default(),
        );
        let batch = (0..CHATS)
            .map(|i| {
                let chat = ChatRef::new("test", format!("-{i}"));
                Delivery::Message(parlor_bot::testing::message(
                    &chat,
                    i,
                    "alice",
                    "@parlor hi",
                ))
            })
            .collect();
        let flushes_before = store.flushes();
        let (start, cpu_start) = (Instant::now(), cpu_seconds());
        manager.deliver_all(batch).await.unwrap();
        platform.wait_sent(CHATS as usize).await;
        while !store.unsent_outbox().unwrap().is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        let (elapsed, cpu) = (start.elapsed(), cpu_seconds() - cpu_start);
        let flushes = store.flushes() - flushes_before;
        println!(
            "{name}: session burst, {CHATS} mentions in {CHATS} chats, one batch: all sent in \
             {elapsed:?}, CPU {:.0} µs per turn, {:.2} flushes per turn",
            cpu * 1e6 / f64::from(CHATS),
            flushes as f64 / f64::from(CHATS)
        );
        manager.shutdown(std::time::Duration::from_secs(1)).await;
    });
}

/// Durable intake from several chats at once: each of `THREADS` threads records a message
/// and waits for it to be durable (`flush`), `PER_THREAD` times.
fn concurrent_intake<S: Store + Clone>(store: &S, base: usize) {
    const THREADS: usize = 8;
    const PER_THREAD: usize = 200;
    let store = Arc::new(store.clone());
    let flushes_before = store.flushes();
    let (start, cpu_start) = (Instant::now(), cpu_seconds());
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                let session = format!("telegram:-2{t}");
                for i in 0..PER_THREAD {
                    store.record_message(&session, &message(base + i)).unwrap();
                    store.flush().unwrap();
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let writes = THREADS * PER_THREAD;
    let cpu = cpu_seconds() - cpu_start;
    println!(
        "durable intake, {THREADS} threads: {writes} in {:?} ({:.1} µs each, CPU {:.0} µs \
         each){}",
        start.elapsed(),
        start.elapsed().as_secs_f64() * 1e6 / writes as f64,
        cpu * 1e6 / writes as f64,
        flushes(store.flushes() - flushes_before, writes)
    );
}

/// The same from tasks on a two-worker runtime, as the session layer waits
/// (`Store::durable`).
fn concurrent_async_intake<S: Store + Clone>(store: &S, base: usize) {
    const TASKS: usize = 64;
    const PER_TASK: usize = 25;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let store = Arc::new(store.clone());
    let flushes_before = store.flushes();
    let (start, cpu_start) = (Instant::now(), cpu_seconds());
    runtime.block_on(async {
        let tasks: Vec<_> = (0..TASKS)
            .map(|t| {
                let store = store.clone();
                tokio::spawn(async move {
                    let session = format!("telegram:-4{t}");
                    for i in 0..PER_TASK {
                        store.record_message(&session, &message(base + i)).unwrap();
                        store.durable().await.unwrap();
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
    });
    let writes = TASKS * PER_TASK;
    let cpu = cpu_seconds() - cpu_start;
    println!(
        "durable intake, {TASKS} tasks on 2 workers: {writes} in {:?} ({:.1} µs each, CPU \
         {:.0} µs each){}",
        start.elapsed(),
        start.elapsed().as_secs_f64() * 1e6 / writes as f64,
        cpu * 1e6 / writes as f64,
        flushes(store.flushes() - flushes_before, writes)
    );
}

/// What the group commit saved: `, F flushes (F/N per write)`.
fn flushes(flushes: u64, writes: usize) -> String {
    format!(
        ", {flushes} flushes ({:.2} per write)",
        flushes as f64 / writes as f64
    )
}

/// A turn's store work in a long history: `HISTORY` messages stored; each turn loads the
/// history, adds four messages and the trim drops four.
fn turn_commits(store: &dyn Store) {
    const HISTORY: usize = 200;
    const TURNS: usize = 200;
    let session = "telegram:-3000";
    let text = "a message of a typical length, a sentence or two that someone wrote in a \
                group and the model answered at some length as models do";
    let history: Vec<Message> = (0..HISTORY)
        .map(|i| Message::user(format!("{i}: {text}")))
        .collect();
    store.save_history(session, &history).unwrap();
    let start = Instant::now();
    for turn in 0..TURNS {
        let loaded = store.load_history(session).unwrap();
        let new: Vec<Message> = (0..4)
            .map(|i| Message::assistant(format!("turn {turn} part {i}: {text}")))
            .collect();
        store.commit_turn(commit(session, loaded, new)).unwrap();
    }
    let per_turn = start.elapsed().as_secs_f64() * 1e6 / TURNS as f64;
    let start = Instant::now();
    for _ in 0..TURNS {
        assert_eq!(store.load_history(session).unwrap().len(), HISTORY);
    }
    let load = start.elapsed().as_secs_f64() * 1e6 / TURNS as f64;
    println!(
        "a turn in a {HISTORY}-message history (load, +4, trim -4, commit): {per_turn:.0} µs, \
         of which load_history {load:.0} µs"
    );
}

fn commit(session: &str, loaded: Vec<Message>, new: Vec<Message>) -> TurnCommit {
    // The turn read the history; it writes only its own messages.
    drop(loaded);
    TurnCommit {
        session: session.to_owned(),
        history: Some(HistoryChange::Append {
            dropped: new.len(),
            messages: new,
        }),
        answered: Vec::new(),
        reply: None,
        also: Vec::new(),
        summary: None,
    }
}

/// CPU time of the whole process (sled's threads included), from `/proc/self/stat`, in
/// 10 ms ticks.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command name (which may hold spaces), from the state on.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    (ticks(11) + ticks(12)) / 100.0
}
