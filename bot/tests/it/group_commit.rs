//! Group commit (`parlor_bot::store::GroupCommit`, docs/contract.md "Storage"): waits queued
//! behind a running flush share the next one, and none returns before a flush that started
//! after its write has completed. The flushes here are test code that blocks until the test
//! lets it go, so every interleaving is chosen by the test, never by timing.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;

use futures::future::join_all;
use parlor_bot::store::{GroupCommit, MemoryStore, SledStore, Store, StoreError, StoreOptions};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    /// A writer wrote and took its ticket.
    Wrote(char),
    FlushStarted(u32),
    FlushEnded(u32),
    /// A writer's wait returned.
    Returned(char),
}

/// A flush the test controls: each one reports its start and then waits for a permit.
struct Flusher {
    log: Mutex<Vec<Event>>,
    started: Mutex<mpsc::Sender<u32>>,
    permits: Mutex<mpsc::Receiver<Result<(), StoreError>>>,
    count: Mutex<u32>,
}

struct Control {
    flusher: Arc<Flusher>,
    started: Mutex<mpsc::Receiver<u32>>,
    permits: mpsc::Sender<Result<(), StoreError>>,
}

impl Control {
    fn new() -> Control {
        let (started_tx, started) = mpsc::channel();
        let (permits, permits_rx) = mpsc::channel();
        Control {
            flusher: Arc::new(Flusher {
                log: Mutex::default(),
                started: Mutex::new(started_tx),
                permits: Mutex::new(permits_rx),
                count: Mutex::new(0),
            }),
            started: Mutex::new(started),
            permits,
        }
    }

    /// Waits until flush number `n` has started (and is held).
    fn wait_started(&self, n: u32) {
        assert_eq!(self.started.lock().unwrap().recv().unwrap(), n);
    }

    /// Lets the held flush end with `result`.
    fn end(&self, result: Result<(), StoreError>) {
        self.permits.send(result).unwrap();
    }

    fn log(&self) -> Vec<Event> {
        self.flusher.log.lock().unwrap().clone()
    }
}

impl Flusher {
    fn record(&self, event: Event) {
        self.log.lock().unwrap().push(event);
    }

    fn flush(&self) -> Result<(), StoreError> {
        let n = {
            let mut count = self.count.lock().unwrap();
            *count += 1;
            *count
        };
        self.record(Event::FlushStarted(n));
        self.started.lock().unwrap().send(n).unwrap();
        let result = self.permits.lock().unwrap().recv().unwrap();
        self.record(Event::FlushEnded(n));
        result
    }
}

/// The flush whose end `writer`'s wait returned after, checking that it started after the
/// writer wrote and ended before the wait returned.
fn covering_flush(log: &[Event], writer: char) -> u32 {
    let at = |event: Event| log.iter().position(|e| *e == event);
    let wrote = at(Event::Wrote(writer)).unwrap();
    let returned = at(Event::Returned(writer)).expect("the wait returned");
    let flush = (1..)
        .take_while(|n| at(Event::FlushStarted(*n)).is_some())
        .filter(|n| {
            at(Event::FlushStarted(*n)).unwrap() > wrote
                && at(Event::FlushEnded(*n)).is_some_and(|end| end < returned)
        })
        .min();
    flush.unwrap_or_else(|| panic!("{writer} returned without a flush after its write: {log:?}"))
}

/// A writer on its own thread: writes (logs), takes a ticket, tells the test, waits.
fn blocking_writer(
    commit: &Arc<GroupCommit>,
    flusher: &Arc<Flusher>,
    name: char,
    ticketed: &mpsc::Sender<char>,
) -> thread::JoinHandle<Result<(), StoreError>> {
    let (commit, flusher, ticketed) = (commit.clone(), flusher.clone(), ticketed.clone());
    thread::spawn(move || {
        flusher.record(Event::Wrote(name));
        let ticket = commit.ticket();
        ticketed.send(name).unwrap();
        let result = commit.wait_blocking(ticket, || flusher.flush());
        flusher.record(Event::Returned(name));
        result
    })
}

#[test]
fn blocking_waits_behind_a_flush_share_the_next_one_and_return_only_after_it() {
    let control = Control::new();
    let commit = Arc::new(GroupCommit::new());
    let (ticketed, tickets) = mpsc::channel();

    // `a` finds no flush running and runs the first itself.
    let a = blocking_writer(&commit, &control.flusher, 'a', &ticketed);
    control.wait_started(1);
    // Three more writers queue up behind it.
    let others: Vec<_> = ['b', 'c', 'd']
        .map(|name| blocking_writer(&commit, &control.flusher, name, &ticketed))
        .into();
    for _ in 0..4 {
        tickets.recv().unwrap();
    }

    control.end(Ok(()));
    a.join().unwrap().unwrap();
    // One of the three runs the second flush, for all three.
    control.wait_started(2);
    assert!(
        !control.log().contains(&Event::Returned('b'))
            && !control.log().contains(&Event::Returned('c'))
            && !control.log().contains(&Event::Returned('d')),
        "a wait returned before the flush covering it: {:?}",
        control.log()
    );
    control.end(Ok(()));
    for writer in others {
        writer.join().unwrap().unwrap();
    }

    assert_eq!(commit.flushes(), 2, "four writers, two flushes");
    let log = control.log();
    assert_eq!(covering_flush(&log, 'a'), 1);
    for writer in ['b', 'c', 'd'] {
        assert_eq!(covering_flush(&log, writer), 2, "{log:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn async_and_blocking_waits_share_flushes_alike() {
    let control = Arc::new(Control::new());
    let commit = Arc::new(GroupCommit::new());
    let (ticketed, tickets) = mpsc::channel();

    let writer = |name: char| {
        let (commit, flusher, ticketed) =
            (commit.clone(), control.flusher.clone(), ticketed.clone());
        tokio::spawn(async move {
            flusher.record(Event::Wrote(name));
            let ticket = commit.ticket();
            ticketed.send(name).unwrap();
            let result = commit.wait(ticket, || flusher.flush()).await;
            flusher.record(Event::Returned(name));
            result
        })
    };

    // The async `a` runs the first flush on its worker; the test's blocking receives run
    // on the blocking pool so that they hold no worker.
    let a = writer('a');
    let started = |n: u32| {
        let control = control.clone();
        tokio::task::spawn_blocking(move || control.wait_started(n))
    };
    started(1).await.unwrap();
    let b = writer('b');
    let c = blocking_writer(&commit, &control.flusher, 'c', &ticketed);
    let d = writer('d');
    let tickets = tokio::task::spawn_blocking(move || {
        for _ in 0..4 {
            tickets.recv().unwrap();
        }
    });
    tickets.await.unwrap();

    control.end(Ok(()));
    a.await.unwrap().unwrap();
    started(2).await.unwrap();
    control.end(Ok(()));
    b.await.unwrap().unwrap();
    d.await.unwrap().unwrap();
    tokio::task::spawn_blocking(move || c.join().unwrap())
        .await
        .unwrap()
        .unwrap();

    assert_eq!(commit.flushes(), 2);
    let log = control.log();
    assert_eq!(covering_flush(&log, 'a'), 1);
    for writer in ['b', 'c', 'd'] {
        assert_eq!(covering_flush(&log, writer), 2, "{log:?}");
    }
}

#[test]
fn a_failed_flush_fails_the_waits_it_covered_and_the_next_flush_serves_the_rest() {
    let control = Control::new();
    let commit = Arc::new(GroupCommit::new());
    let (ticketed, tickets) = mpsc::channel();

    // `early` took its ticket before the first flush began, but waits only after it ended.
    let early = commit.ticket();
    let a = blocking_writer(&commit, &control.flusher, 'a', &ticketed);
    control.wait_started(1);
    tickets.recv().unwrap();
    let b = blocking_writer(&commit, &control.flusher, 'b', &ticketed);
    tickets.recv().unwrap();

    control.end(Err(StoreError::Io("disk full".into())));
    let failed = a.join().unwrap().unwrap_err();
    assert!(matches!(failed, StoreError::Io(ref why) if why == "disk full"));
    // `b` wrote after the failed flush began: a new flush is run for it.
    control.wait_started(2);
    control.end(Ok(()));
    b.join().unwrap().unwrap();
    // A later success covers every earlier write, `early`'s included (the log is ordered).
    assert!(
        commit
            .wait_blocking(early, || panic!("no flush needed"))
            .is_ok()
    );
    assert_eq!(commit.flushes(), 2);
}

#[test]
fn a_wait_covered_by_a_failed_flush_fails_even_when_it_starts_late() {
    let commit = GroupCommit::new();
    let early = commit.ticket();
    let failing = || Err(StoreError::Io("disk full".into()));
    assert!(commit.wait_blocking(commit.ticket(), failing).is_err());
    assert!(commit.wait_blocking(early, || Ok(())).is_err());
    // Whoever comes next gets a fresh flush.
    assert!(commit.wait_blocking(commit.ticket(), || Ok(())).is_ok());
    assert_eq!(commit.flushes(), 2);
}

#[tokio::test]
async fn waits_taken_together_cost_each_store_one_flush() {
    let dir = tempfile::tempdir().unwrap();
    let sled = SledStore::open(dir.path(), StoreOptions::default()).unwrap();
    let memory = MemoryStore::new();
    for store in [&sled as &dyn Store, &memory] {
        let before = store.flushes();
        // Ten chats write and ask for durability before any flush has started: the ticket
        // is taken when `durable` is called.
        let waits: Vec<_> = (0..10)
            .map(|i| {
                store.set_meta(&format!("chat-{i}"), "written").unwrap();
                store.durable()
            })
            .collect();
        for result in join_all(waits).await {
            result.unwrap();
        }
        assert_eq!(store.flushes(), before + 1);
        // One more wait, one more flush; a blocking flush counts the same.
        store.durable().await.unwrap();
        store.flush().unwrap();
        assert_eq!(store.flushes(), before + 3);
    }
}
