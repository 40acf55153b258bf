//! [`GroupCommit`]: many callers, one flush. Every durable step of the session layer ends in
//! a wait for durability; under load many chats reach that point within the same fraction of
//! a millisecond, and one flush makes all their writes durable at once.
//!
//! A caller takes a [`Ticket`] after its writes. A flush covers every ticket taken before it
//! started (the writes before those tickets were in the database's log when it began), so a
//! ticket is done once a flush that *started after it was taken* has completed. One flush
//! runs at a time; whoever waits while none runs starts the next one (on its own thread, in
//! the same call), covering everyone queued behind the previous flush. There is no flusher
//! task to own or stop: an idle store does nothing.
//!
//! Async callers ([`GroupCommit::wait`]) sleep on a `watch` channel while another caller
//! flushes; sync callers ([`GroupCommit::wait_blocking`]) on a condition variable. Both kinds
//! share the same flushes.
//!
//! An async caller that finds no flush running yields to the runtime once before it starts
//! one (unless built [`GroupCommit::immediate`]): the tasks ready to run at that moment
//! (often the very writers the previous flush woke) get to write and queue up first, and
//! the flush covers them too. A flush is a blocking call on the thread of the caller that
//! runs it, so the writers on that thread cannot pile up *during* the flush, only before.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

use tokio::sync::watch;

use super::StoreError;

/// A caller's place in line: every write it made before taking the ticket is covered by the
/// first flush that starts afterwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ticket(u64);

/// Coalesces the flushes of a store (see the module docs). A store owns one and passes it
/// the function that flushes.
#[derive(Debug)]
pub struct GroupCommit {
    state: Mutex<State>,
    /// Wakes the threads in [`GroupCommit::wait_blocking`] when a flush ends.
    ended: Condvar,
    /// Wakes the tasks in [`GroupCommit::wait`] when a flush ends (the value counts ends).
    ended_tx: watch::Sender<u64>,
    /// Flushes run, for tests and the bench.
    flushes: AtomicU64,
    /// Whether an async waiter yields once before it starts a flush (see the module docs).
    gather: bool,
}

#[derive(Debug, Default)]
struct State {
    /// The last ticket handed out.
    issued: u64,
    /// Every ticket up to this one is durable.
    durable: u64,
    /// Whether a flush is running (covering the tickets up to `issued` at its start).
    running: bool,
    /// The newest failed flush: the last ticket it covered, and why it failed.
    failed: Option<(u64, StoreError)>,
}

/// What a waiter does next.
enum Step {
    Done(Result<(), StoreError>),
    /// Run the flush covering tickets up to this one.
    Flush(u64),
    /// No flush runs and the waiter did not ask to start one.
    Idle,
    Wait,
}

impl Default for GroupCommit {
    fn default() -> Self {
        GroupCommit {
            state: Mutex::default(),
            ended: Condvar::new(),
            ended_tx: watch::Sender::new(0),
            flushes: AtomicU64::new(0),
            gather: true,
        }
    }
}

impl GroupCommit {
    /// Nothing flushed yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// For a store whose flush costs nothing ([`MemoryStore`](super::MemoryStore)): an
    /// async waiter starts the flush at once instead of first letting other writers queue
    /// up, so that waiting never yields to the runtime.
    pub fn immediate() -> Self {
        GroupCommit {
            gather: false,
            ..Self::default()
        }
    }

    /// A ticket for the writes the caller made so far; take it after them.
    pub fn ticket(&self) -> Ticket {
        let mut state = self.lock();
        state.issued += 1;
        Ticket(state.issued)
    }

    /// How many flushes have run (failed ones included).
    pub fn flushes(&self) -> u64 {
        self.flushes.load(Ordering::Relaxed)
    }

    /// Waits until `ticket` is durable: returns once a flush that started after the ticket
    /// was taken has completed, running that flush itself (inline, with `flush`) when none
    /// is running. The error of the flush that covered the ticket, if it failed.
    ///
    /// Dropping the future gives up the wait; a flush it runs is synchronous and so never
    /// left half done.
    pub async fn wait(
        &self,
        ticket: Ticket,
        flush: impl Fn() -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        // Subscribed before the state is read: a flush ending after the read marks the
        // channel changed, so its end is never missed.
        let mut ended = self.ended_tx.subscribe();
        let mut yielded = !self.gather;
        loop {
            // A statement of its own, so that the lock is released before any await.
            let step = Self::next_step(&mut self.lock(), ticket, yielded);
            match step {
                Step::Done(result) => return result,
                Step::Flush(covering) => self.run(covering, &flush),
                Step::Idle => {
                    // Once: see the module docs.
                    yielded = true;
                    tokio::task::yield_now().await;
                }
                Step::Wait => {
                    // The sender lives in `self`, so `changed` cannot fail here.
                    let _ = ended.changed().await;
                }
            }
        }
    }

    /// [`GroupCommit::wait`] for synchronous code: blocks the thread.
    pub fn wait_blocking(
        &self,
        ticket: Ticket,
        flush: impl Fn() -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let mut state = self.lock();
        loop {
            match Self::next_step(&mut state, ticket, true) {
                Step::Done(result) => return result,
                Step::Flush(covering) => {
                    drop(state);
                    self.run(covering, &flush);
                    state = self.lock();
                }
                Step::Idle | Step::Wait => {
                    state = self
                        .ended
                        .wait(state)
                        .unwrap_or_else(PoisonError::into_inner);
                }
            }
        }
    }

    /// What a waiter with `ticket` does now; it starts a flush only when `may_start`.
    fn next_step(state: &mut State, Ticket(ticket): Ticket, may_start: bool) -> Step {
        if state.durable >= ticket {
            return Step::Done(Ok(()));
        }
        if let Some((covered, error)) = &state.failed
            && *covered >= ticket
        {
            return Step::Done(Err(error.clone()));
        }
        if state.running {
            return Step::Wait;
        }
        if !may_start {
            return Step::Idle;
        }
        state.running = true;
        Step::Flush(state.issued)
    }

    /// Runs one flush covering the tickets up to `covering` and wakes every waiter.
    fn run(&self, covering: u64, flush: &dyn Fn() -> Result<(), StoreError>) {
        // Should `flush` panic, the guard still ends the flush (as failed), so that the
        // waiters behind it are not stuck forever.
        let mut guard = Running {
            commit: self,
            covering,
            result: Some(Err(StoreError::Io("the flush panicked".to_owned()))),
        };
        guard.result = Some(flush());
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding the lock; a poisoned one is still consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A flush in progress; dropped, it records the outcome and wakes the waiters.
struct Running<'a> {
    commit: &'a GroupCommit,
    covering: u64,
    result: Option<Result<(), StoreError>>,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let commit = self.commit;
        commit.flushes.fetch_add(1, Ordering::Relaxed);
        {
            let mut state = commit.lock();
            state.running = false;
            match self.result.take() {
                Some(Err(error)) => state.failed = Some((self.covering, error)),
                _ => state.durable = state.durable.max(self.covering),
            }
        }
        commit.ended.notify_all();
        commit
            .ended_tx
            .send_modify(|ends| *ends = ends.wrapping_add(1));
    }
}
