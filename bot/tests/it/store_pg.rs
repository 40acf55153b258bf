//! What only [`PgStore`] has: a database shared by several stores, its migrations, its
//! connections (killed, reconnected) and its calls from inside tokio runtimes. The
//! contract every store keeps is `store.rs`, which runs on PostgreSQL too.
//!
//! Each test takes a database of its own on the test process's [`PgCluster`]; without
//! PostgreSQL installed it says SKIPPED (a failure under `PARLOR_REQUIRE_POSTGRES=1`).

use std::time::{Duration, Instant};

use parlor_bot::store::{PgStore, Store, StoreError, StoreOptions, StoredMessage};
use parlor_bot::testing::PgCluster;

fn open(url: &str) -> PgStore {
    PgStore::open(url, StoreOptions::default()).expect("open PostgreSQL store")
}

/// A database of its own, or `None` (the test skips) without PostgreSQL.
fn database() -> Option<String> {
    PgCluster::start().map(PgCluster::database)
}

/// A direct connection for the test's own SQL, on a thread of its own: the sync client
/// must not run on a tokio thread, and a test's blocking waits must not hold one up.
fn admin(url: &str) -> postgres::Client {
    postgres::Client::connect(url, postgres::NoTls).expect("connect for the test")
}

fn message(id: &str) -> StoredMessage {
    StoredMessage::from_bot("telegram", "parlor", id, "hi", None, chrono::Utc::now())
}

#[test]
fn two_stores_on_one_database_see_each_others_writes() {
    let Some(url) = database() else { return };
    let (a, b) = (open(&url), open(&url));
    a.set_meta("offset", "41").unwrap();
    assert_eq!(b.get_meta("offset").unwrap().as_deref(), Some("41"));
    assert!(a.record_message("telegram:-1", &message("7")).unwrap());
    // The dedupe is the database's, not a process's.
    assert!(!b.record_message("telegram:-1", &message("7")).unwrap());
    // Ids from either store never meet.
    let ids: Vec<u64> = (0..4)
        .flat_map(|_| [a.reserve_id().unwrap(), b.reserve_id().unwrap()])
        .collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
}

#[test]
fn opening_again_applies_no_migration_twice_and_keeps_the_data() {
    let Some(url) = database() else { return };
    let first = open(&url);
    first.kv_put("memory", "k", "v").unwrap();
    let id = first.reserve_id().unwrap();
    drop(first);
    let again = open(&url);
    assert_eq!(again.kv_get("memory", "k").unwrap().as_deref(), Some("v"));
    assert!(again.reserve_id().unwrap() > id, "ids go on past a reopen");
    let mut client = admin(&url);
    let rows = client
        .query("SELECT version FROM parlor_migrations", &[])
        .unwrap();
    assert_eq!(rows.len(), 1, "each migration recorded once");
}

#[test]
fn concurrent_opens_of_a_new_database_all_succeed() {
    let Some(url) = database() else { return };
    let stores: Vec<Result<PgStore, StoreError>> = std::thread::scope(|scope| {
        let opens: Vec<_> = (0..6)
            .map(|_| scope.spawn(|| PgStore::open(&url, StoreOptions::default())))
            .collect();
        opens.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for store in stores {
        let store = store.expect("every open succeeds");
        store.set_meta("opened", "yes").unwrap();
    }
}

#[test]
fn a_connection_killed_mid_call_fails_that_call_and_the_next_one_works() {
    let Some(url) = database() else { return };
    let store = open(&url);
    store.set_meta("k", "0").unwrap();
    // Another session holds the row, so the store's write waits on it mid-call.
    let mut holder = admin(&url);
    let mut hold = holder.transaction().unwrap();
    hold.execute("SELECT 1 FROM parlor_meta WHERE key = 'k' FOR UPDATE", &[])
        .unwrap();
    std::thread::scope(|scope| {
        let write = scope.spawn(|| store.set_meta("k", "1"));
        let mut killer = admin(&url);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let killed = killer
                .query(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                     WHERE application_name = 'parlor' AND wait_event_type = 'Lock'",
                    &[],
                )
                .unwrap();
            if !killed.is_empty() {
                break;
            }
            assert!(Instant::now() < deadline, "the store's write never waited");
            std::thread::sleep(Duration::from_millis(20));
        }
        match write.join().unwrap() {
            Err(StoreError::Io(reason)) => {
                assert!(reason.contains("PostgreSQL"), "a clear message: {reason}");
            }
            other => panic!("the killed call must fail: {other:?}"),
        }
    });
    hold.rollback().unwrap();
    // Every connection of the pool works again (the killed one reconnects).
    for i in 0..8 {
        store.set_meta("k", &format!("v{i}")).unwrap();
    }
    assert_eq!(store.get_meta("k").unwrap().as_deref(), Some("v7"));
}

#[test]
fn an_unreachable_server_is_a_clear_error_at_open() {
    // A port nobody listens on (bound, then let go): connection refused at once.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("postgresql://parlor:secret-password@127.0.0.1:{port}/parlor");
    match PgStore::open(&url, StoreOptions::default()) {
        Err(StoreError::Io(reason)) => {
            assert!(
                reason.contains(&format!("127.0.0.1:{port}/parlor")),
                "{reason}"
            );
            assert!(
                !reason.contains("secret-password"),
                "never the password: {reason}"
            );
        }
        other => panic!("open must fail: {other:?}"),
    }
}

#[test]
fn a_store_is_called_from_both_kinds_of_tokio_runtime() {
    let Some(url) = database() else { return };
    let store = std::sync::Arc::new(open(&url));
    let multi = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let in_multi = std::sync::Arc::clone(&store);
    multi
        .block_on(async move {
            tokio::spawn(async move {
                in_multi.set_meta("flavor", "multi")?;
                in_multi.durable().await
            })
            .await
        })
        .unwrap()
        .unwrap();
    let current = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    current.block_on(async {
        assert_eq!(store.get_meta("flavor").unwrap().as_deref(), Some("multi"));
        store.set_meta("flavor", "current").unwrap();
    });
    assert_eq!(
        store.get_meta("flavor").unwrap().as_deref(),
        Some("current")
    );
}

/// Conditional writes racing on one record from several connections: exactly one of them
/// lands, whether the record existed (its row is locked) or had to stay absent (the
/// placeholder a concurrent insert waits on); every other one is refused whole.
#[test]
fn racing_conditional_writes_let_exactly_one_through() {
    let Some(url) = database() else { return };
    let store = open(&url);
    store.kv_put("clocks", "present", "v0").unwrap();
    for (key, expected) in [("present", Some("v0")), ("absent", None)] {
        let results: Vec<Result<(), StoreError>> = std::thread::scope(|scope| {
            let writers: Vec<_> = (0..8)
                .map(|i| {
                    let store = &store;
                    scope.spawn(move || {
                        store.kv_write(vec![
                            parlor_bot::store::KvWrite {
                                space: "clocks".to_owned(),
                                key: key.to_owned(),
                                value: Some(format!("writer {i}")),
                                if_unchanged: Some(expected.map(str::to_owned)),
                            },
                            // Lands with it or not at all.
                            parlor_bot::store::KvWrite {
                                space: "clock_runs".to_owned(),
                                key: format!("{key} {i}"),
                                value: Some("ran".to_owned()),
                                if_unchanged: None,
                            },
                        ])
                    })
                })
                .collect();
            writers.into_iter().map(|w| w.join().unwrap()).collect()
        });
        let won: Vec<usize> = (0..8).filter(|&i| results[i].is_ok()).collect();
        assert_eq!(won.len(), 1, "{key}: {results:?}");
        assert!(
            results
                .iter()
                .filter(|r| r.is_err())
                .all(|r| matches!(r, Err(StoreError::Changed(_)))),
            "{key}: {results:?}"
        );
        let winner = won[0];
        assert_eq!(
            store.kv_get("clocks", key).unwrap(),
            Some(format!("writer {winner}")),
            "{key}"
        );
        let runs = store.kv_scan("clock_runs", &format!("{key} ")).unwrap();
        assert_eq!(
            runs,
            vec![(format!("{key} {winner}"), "ran".to_owned())],
            "{key}"
        );
    }
}

/// Connections the server ended while they were idle (a restart, an idle timeout) are made
/// again by the next call, which then succeeds: nothing of it had reached the server.
#[test]
fn connections_ended_while_idle_are_made_again_without_an_error() {
    let Some(url) = database() else { return };
    let store = open(&url);
    // Several calls at once, so that more than one connection is open.
    std::thread::scope(|scope| {
        for i in 0..8 {
            let store = &store;
            scope.spawn(move || store.set_meta(&format!("k{i}"), "0").unwrap());
        }
    });
    let mut killer = admin(&url);
    let killed = killer
        .query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE application_name = 'parlor' AND datname = current_database()",
            &[],
        )
        .unwrap();
    assert!(!killed.is_empty(), "the store had connections");
    for i in 0..16 {
        store.set_meta(&format!("k{}", i % 8), "1").unwrap();
        assert_eq!(
            store.get_meta(&format!("k{}", i % 8)).unwrap().as_deref(),
            Some("1")
        );
    }
}
