//! What the adapters' integration tests share: waiting for a condition, an inbox that records
//! (or refuses) deliveries, and an adapter running in a task.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use parlor_adapters::Receiver;
use parlor_bot::platform::{ChatEvent, Inbox, InboxError, IncomingMessage, PlatformError};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The longest [`eventually`] waits: far more than any wait on loopback needs, so only a
/// broken adapter runs into it.
pub const EVENTUALLY: Duration = Duration::from_secs(10);

/// Polls `check` every 10 ms until it answers `Some`, for at most [`EVENTUALLY`].
pub async fn eventually<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + EVENTUALLY;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// What a [`TestInbox`] does with a delivery.
pub enum Mode {
    Accept,
    /// Waits for a permit before accepting: lets a test look at the world mid-delivery.
    Gate(tokio::sync::Semaphore),
    FailStore,
    ShuttingDown,
}

/// Records deliveries, in the mode the test picks.
pub struct TestInbox {
    pub mode: Mode,
    attempts: AtomicUsize,
    messages: Mutex<Vec<IncomingMessage>>,
    events: Mutex<Vec<ChatEvent>>,
    /// Woken at every delivery, for the waits.
    delivered: tokio::sync::Notify,
}

impl Default for TestInbox {
    fn default() -> Self {
        TestInbox {
            mode: Mode::Accept,
            attempts: AtomicUsize::new(0),
            messages: Mutex::new(Vec::new()),
            events: Mutex::new(Vec::new()),
            delivered: tokio::sync::Notify::new(),
        }
    }
}

impl TestInbox {
    pub fn new(mode: Mode) -> Arc<Self> {
        Arc::new(TestInbox {
            mode,
            ..TestInbox::default()
        })
    }

    pub fn messages(&self) -> Vec<IncomingMessage> {
        self.messages
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    pub fn events(&self) -> Vec<ChatEvent> {
        self.events
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    pub async fn wait_for_events(&self, n: usize) -> Vec<ChatEvent> {
        self.until_delivered(&format!("{n} delivered event(s)"), || {
            let events = self.events();
            (events.len() >= n).then_some(events)
        })
        .await
    }

    /// Waits, woken by each delivery, until `check` answers `Some`, for at most
    /// [`EVENTUALLY`].
    pub async fn until_delivered<T>(&self, what: &str, check: impl Fn() -> Option<T>) -> T {
        let waiting = async {
            loop {
                // Registered before the check, so a delivery in between still wakes it.
                let delivered = self.delivered.notified();
                if let Some(value) = check() {
                    return value;
                }
                delivered.await;
            }
        };
        tokio::time::timeout(EVENTUALLY, waiting)
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
    }

    pub fn attempts(&self) -> usize {
        self.attempts.load(Ordering::SeqCst)
    }

    pub async fn wait_for(&self, n: usize) -> Vec<IncomingMessage> {
        self.until_delivered(&format!("{n} delivered message(s)"), || {
            let messages = self.messages();
            (messages.len() >= n).then_some(messages)
        })
        .await
    }
}

#[async_trait]
impl Inbox for TestInbox {
    async fn deliver(&self, message: IncomingMessage) -> Result<(), InboxError> {
        self.admit().await?;
        self.messages
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(message);
        self.delivered.notify_waiters();
        Ok(())
    }

    async fn chat_event(&self, event: ChatEvent) -> Result<(), InboxError> {
        self.admit().await?;
        self.events
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(event);
        self.delivered.notify_waiters();
        Ok(())
    }
}

impl TestInbox {
    /// Counts an attempt and applies the mode.
    async fn admit(&self) -> Result<(), InboxError> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        match &self.mode {
            Mode::Accept => Ok(()),
            Mode::Gate(gate) => {
                gate.acquire().await.expect("the gate stays open").forget();
                Ok(())
            }
            Mode::FailStore => Err(InboxError::Store("disk full".to_owned())),
            Mode::ShuttingDown => Err(InboxError::ShuttingDown),
        }
    }
}

/// An adapter receiving in a task until stopped; dropped, it is cancelled and aborted, so a
/// failing test leaves nothing running.
pub struct Running {
    shutdown: CancellationToken,
    task: Option<JoinHandle<Result<(), PlatformError>>>,
}

impl Running {
    /// Runs `adapter` into `inbox`; `ready` as [`Receiver::run_with_ready`] calls it.
    pub fn spawn<A>(
        adapter: &A,
        inbox: Arc<dyn Inbox>,
        ready: impl FnOnce() + Send + 'static,
    ) -> Running
    where
        A: Receiver + Clone + Send + Sync + 'static,
    {
        let shutdown = CancellationToken::new();
        let task = tokio::spawn({
            let adapter = adapter.clone();
            let shutdown = shutdown.clone();
            async move { adapter.run_with_ready(inbox, shutdown, ready).await }
        });
        Running {
            shutdown,
            task: Some(task),
        }
    }

    /// Cancels the run and returns what it returned, which must come `within` that long.
    pub async fn stop(mut self, within: Duration) -> Result<(), PlatformError> {
        self.shutdown.cancel();
        let task = self.task.take().expect("stopped once");
        tokio::time::timeout(within, task)
            .await
            .expect("the run stops promptly")
            .expect("the run does not panic")
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}
