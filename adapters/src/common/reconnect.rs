//! One reconnect loop for the receivers that hold a connection: Discord's gateway client and
//! OneBot's forward WebSocket. Each run of the connection is one call of the caller's
//! `session`; between runs the loop waits a backoff that doubles per failure up to its cap
//! (deterministic steps, no jitter: one daemon holds one connection per platform, so there is
//! no herd to spread), starts over after a run that lasted, and ends on shutdown.
//!
//! Logging follows the state, not the attempts: a dropped connection is logged, and so is
//! the first failure to reconnect and every change of its reason; the same failure again is
//! only a debug line, so an endpoint that stays away does not fill the log.
//!
//! What those connections' deliveries share lives here too: how patiently a failing store is
//! retried ([`DELIVERY_ATTEMPTS`], [`DELIVERY_BACKOFF`]) and a wait that ends on shutdown
//! ([`pause`], which Telegram's loop uses as well).
//!
//! Telegram's long poll is not a connection and does not run here (see `telegram/poll.rs`):
//! every poll is an attempt of its own, each answer is acknowledged through the offset the
//! loop carries, a `retry_after` is waited exactly, and every refusal is logged with its own
//! advice (two conflicts in a row are two errors an operator must see).

use std::future::Future;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use parlor_bot::backoff::Backoff;
use parlor_bot::platform::PlatformError;
use tokio_util::sync::CancellationToken;

/// Attempts to store what a connection delivered before it is given up: neither Discord's
/// gateway nor OneBot sends an event again.
pub(crate) const DELIVERY_ATTEMPTS: u32 = 5;

/// Waits between those attempts: a store that fails is usually busy for a moment, and the
/// connection keeps sending meanwhile, so the waits stay short.
pub(crate) const DELIVERY_BACKOFF: Backoff = Backoff {
    initial: Duration::from_millis(400),
    max: Duration::from_millis(3200),
};

/// Waits `wait`; `false` when `shutdown` came first.
pub(crate) async fn pause(wait: Duration, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        biased;
        () = shutdown.cancelled() => false,
        () = tokio::time::sleep(wait) => true,
    }
}

/// How one run of a connection ended.
#[derive(Debug)]
pub(crate) enum Session {
    /// Shutdown: the loop returns `Ok(())`.
    Shutdown,
    /// Retrying cannot help (the token was refused): the loop returns it.
    Fatal(PlatformError),
    /// The connection was up and is gone: reconnect.
    Dropped(String),
    /// No connection came up: try again.
    Unreachable(String),
}

/// How a connection is kept up.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reconnect {
    /// The connection as the logs name it (`the Discord gateway`).
    pub what: &'static str,
    /// The waits between runs: `initial`, doubled per failure, at most `max`.
    pub backoff: Backoff,
    /// A run that lasted this long was healthy: the next failure waits `initial` again.
    pub healthy_after: Duration,
}

impl Reconnect {
    /// The wait after `failures` consecutive failures (0: the first).
    pub(crate) fn delay(&self, failures: u32) -> Duration {
        self.backoff
            .initial
            .saturating_mul(2u32.saturating_pow(failures.min(31)))
            .min(self.backoff.max)
    }
}

/// Runs `session` until it ends for good or `shutdown` is cancelled, waiting the backoff
/// between runs. `session` watches `shutdown` itself (so it can close its connection
/// properly) and answers [`Session::Shutdown`]; the waits here end on it too.
pub(crate) async fn supervise<F, Fut>(
    policy: &Reconnect,
    shutdown: &CancellationToken,
    mut session: F,
) -> Result<(), PlatformError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Session>,
{
    let mut failures = 0u32;
    // The reason last logged while the connection is down; `None` while it is (or was) up.
    let mut logged: Option<String> = None;
    loop {
        let started = tokio::time::Instant::now();
        let ended = session().await;
        if started.elapsed() > policy.healthy_after {
            failures = 0;
        }
        let wait = policy.delay(failures);
        failures = failures.saturating_add(1);
        match ended {
            Session::Shutdown => return Ok(()),
            Session::Fatal(error) => return Err(error),
            Session::Dropped(why) => {
                tracing::warn!(error = %why, ?wait, "{} was lost; reconnecting", policy.what);
                logged = Some(why);
            }
            Session::Unreachable(why) if logged.as_deref() == Some(why.as_str()) => {
                tracing::debug!(error = %why, ?wait, attempt = failures, "still no connection to {}", policy.what);
            }
            Session::Unreachable(why) => {
                tracing::warn!(error = %why, ?wait, attempt = failures, "no connection to {}; retrying", policy.what);
                logged = Some(why);
            }
        }
        if !pause(wait, shutdown).await {
            return Ok(());
        }
    }
}

/// A receiver's `ready` callback, shared by its runs: called once, by the first run that
/// gets messages flowing.
pub(crate) struct ReadyOnce<R>(Mutex<Option<R>>);

impl<R: FnOnce()> ReadyOnce<R> {
    pub(crate) fn new(ready: R) -> Self {
        ReadyOnce(Mutex::new(Some(ready)))
    }

    /// Calls the callback unless a run did already.
    pub(crate) fn call(&self) {
        let ready = self.0.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(ready) = ready {
            ready();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    fn policy() -> Reconnect {
        Reconnect {
            what: "the test server",
            backoff: Backoff {
                initial: Duration::from_secs(1),
                max: Duration::from_secs(8),
            },
            healthy_after: Duration::from_secs(60),
        }
    }

    /// Runs `supervise` over `runs` (each lasting its duration, then ending as given),
    /// returning what it returned and when each run started, relative to the start.
    async fn script(runs: Vec<(Duration, Session)>) -> (Result<(), PlatformError>, Vec<Duration>) {
        let started = tokio::time::Instant::now();
        let mut runs = VecDeque::from(runs);
        let mut starts = Vec::new();
        let result = supervise(&policy(), &CancellationToken::new(), || {
            starts.push(started.elapsed());
            let (lasts, ended) = runs
                .pop_front()
                .unwrap_or((Duration::ZERO, Session::Shutdown));
            async move {
                tokio::time::sleep(lasts).await;
                ended
            }
        })
        .await;
        (result, starts)
    }

    fn secs(list: &[u64]) -> Vec<Duration> {
        list.iter().map(|s| Duration::from_secs(*s)).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn failures_wait_doubling_steps_up_to_the_cap() {
        let down = || (Duration::ZERO, Session::Unreachable("refused".into()));
        let (result, starts) = script(vec![down(), down(), down(), down(), down()]).await;
        assert!(result.is_ok());
        // Waits of 1, 2, 4, 8 and 8 s.
        assert_eq!(starts, secs(&[0, 1, 3, 7, 15, 23]));
    }

    #[tokio::test(start_paused = true)]
    async fn a_run_that_lasted_starts_the_backoff_over() {
        let down = || (Duration::ZERO, Session::Unreachable("refused".into()));
        let lasted = (Duration::from_secs(61), Session::Dropped("closed".into()));
        let (_, starts) = script(vec![down(), down(), lasted, down()]).await;
        // 1 and 2 s, then the run of 61 s and a wait of 1 s again, then 2 s.
        assert_eq!(starts, secs(&[0, 1, 3, 65, 67]));
    }

    #[tokio::test(start_paused = true)]
    async fn a_fatal_end_is_returned_at_once() {
        let (result, starts) = script(vec![
            (Duration::ZERO, Session::Unreachable("refused".into())),
            (Duration::ZERO, Session::Fatal(PlatformError::Unauthorized)),
        ])
        .await;
        assert!(matches!(result, Err(PlatformError::Unauthorized)));
        assert_eq!(starts.len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_ends_a_wait() {
        let shutdown = CancellationToken::new();
        let runs = AtomicU32::new(0);
        let result = supervise(&policy(), &shutdown, || async {
            runs.fetch_add(1, Ordering::SeqCst);
            shutdown.cancel();
            Session::Unreachable("refused".into())
        })
        .await;
        assert!(result.is_ok());
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn ready_is_called_once() {
        let calls = AtomicU32::new(0);
        let ready = ReadyOnce::new(|| {
            calls.fetch_add(1, Ordering::SeqCst);
        });
        ready.call();
        ready.call();
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}
