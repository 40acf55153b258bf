//! What the adapters' integration tests share: waiting for a condition, an adapter
//! running in a task, and the buttons the button tests send. The inbox double is
//! `parlor_bot::testing::TestInbox`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parlor_adapters::Receiver;
use parlor_bot::platform::{Button, Inbox, PlatformError};
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

/// An approval's two buttons, as every platform's button tests send them.
pub fn buttons() -> Vec<Button> {
    vec![
        Button {
            label: "Approve".to_owned(),
            data: "approve:7f3a".to_owned(),
        },
        Button {
            label: "Deny".to_owned(),
            data: "deny:7f3a".to_owned(),
        },
    ]
}
