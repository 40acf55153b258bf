//! Store throughput, printed as figures (never a pass/fail timing):
//! `cargo bench -p parlor-bot --bench store`.

// A failed unwrap in a test is the test failing.
#![allow(clippy::unwrap_used)]

use std::time::Instant;

use chrono::Utc;
use parlor_bot::platform::Sender;
use parlor_bot::store::{SledStore, Store, StoreOptions, StoredMessage};

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
}
