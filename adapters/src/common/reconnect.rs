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
use parlor_bot::session::lease::Keeper;
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
/// between runs. `session` watches the token it is given (so it can close its connection
/// properly) and answers [`Session::Shutdown`]; the waits here end on `shutdown` too.
///
/// With `lease` (several daemons on one store), a run starts only while this daemon holds
/// it, and the lease is renewed while the run lasts: a lease lost ends the run (its token
/// is cancelled) and the loop waits to take it again; the last run lets it go.
pub(crate) async fn supervise<F, Fut>(
    policy: &Reconnect,
    lease: Option<&Keeper>,
    shutdown: &CancellationToken,
    mut session: F,
) -> Result<(), PlatformError>
where
    F: FnMut(CancellationToken) -> Fut,
    Fut: Future<Output = Session>,
{
    let ended = supervise_runs(policy, lease, shutdown, &mut session).await;
    if let Some(lease) = lease {
        lease.release();
    }
    ended
}

async fn supervise_runs<F, Fut>(
    policy: &Reconnect,
    lease: Option<&Keeper>,
    shutdown: &CancellationToken,
    session: &mut F,
) -> Result<(), PlatformError>
where
    F: FnMut(CancellationToken) -> Fut,
    Fut: Future<Output = Session>,
{
    let mut failures = 0u32;
    // The reason last logged while the connection is down; `None` while it is (or was) up.
    let mut logged: Option<String> = None;
    loop {
        if let Some(lease) = lease
            && !lease.hold(shutdown).await
        {
            return Ok(());
        }
        let started = tokio::time::Instant::now();
        let run = shutdown.child_token();
        let ended = match lease {
            None => session(run).await,
            Some(lease) => {
                let connection = session(run.clone());
                tokio::pin!(connection);
                loop {
                    tokio::select! {
                        ended = &mut connection => break ended,
                        () = tokio::time::sleep(lease.period()) => {
                            if !lease.renew_now() {
                                // Another daemon holds it now: this connection must close.
                                run.cancel();
                                let _ = (&mut connection).await;
                                break Session::Dropped(format!("{} went to another instance", policy.what));
                            }
                        }
                    }
                }
            }
        };
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
        let result = supervise(&policy(), None, &CancellationToken::new(), |_| {
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
        let result = supervise(&policy(), None, &shutdown, |_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            shutdown.cancel();
            Session::Unreachable("refused".into())
        })
        .await;
        assert!(result.is_ok());
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    /// Two daemons keep one connection: the second connects only once the first is gone,
    /// and a lease lost while connected ends the run.
    #[tokio::test(start_paused = true)]
    async fn with_a_lease_only_its_holder_connects() {
        use std::sync::Arc;

        use parlor_bot::session::lease::{self, Keeper};
        use parlor_bot::store::{MemoryStore, Store};
        use parlor_bot::time::WallTime;

        let store = Arc::new(MemoryStore::new());
        let keeper = |owner: &str| {
            Keeper::new(
                Arc::clone(&store) as Arc<dyn Store>,
                "onebot:1",
                owner,
                Duration::from_secs(9),
                WallTime::tokio_anchored(),
            )
        };
        let (a, b) = (keeper("a"), keeper("b"));
        let stop_a = CancellationToken::new();
        let shutdown = CancellationToken::new();
        let connected = Arc::new(AtomicU32::new(0));
        // A: connected until its shutdown, then lets the lease go.
        let a_runs = Arc::clone(&connected);
        let policy = policy();
        let a_run = supervise(&policy, Some(&a), &stop_a, move |stop| {
            let a_runs = Arc::clone(&a_runs);
            async move {
                a_runs.fetch_add(1, Ordering::SeqCst);
                stop.cancelled().await;
                Session::Shutdown
            }
        });
        let b_connected = Arc::new(AtomicU32::new(0));
        let b_runs = Arc::clone(&b_connected);
        let b_run = supervise(&policy, Some(&b), &shutdown, move |stop| {
            let b_runs = Arc::clone(&b_runs);
            async move {
                b_runs.fetch_add(1, Ordering::SeqCst);
                stop.cancelled().await;
                Session::Shutdown
            }
        });
        let stopper = async {
            // A long while with both running: A renews, B only waits.
            tokio::time::sleep(Duration::from_secs(60)).await;
            assert_eq!(connected.load(Ordering::SeqCst), 1);
            assert_eq!(b_connected.load(Ordering::SeqCst), 0, "B waits");
            stop_a.cancel();
            tokio::time::sleep(Duration::from_secs(10)).await;
            assert_eq!(b_connected.load(Ordering::SeqCst), 1, "B took over");
            let held = lease::holder(store.as_ref(), "onebot:1", WallTime::tokio_anchored().now())
                .unwrap()
                .unwrap();
            assert!(held.0.owner == "b");
            shutdown.cancel();
        };
        let (a_ended, b_ended, ()) = tokio::join!(a_run, b_run, stopper);
        assert!(a_ended.is_ok() && b_ended.is_ok());
        assert_eq!(
            lease::holder(store.as_ref(), "onebot:1", WallTime::tokio_anchored().now()).unwrap(),
            None,
            "let go at the end"
        );
    }

    /// A lease lost while connected (another daemon took it after this one's store went
    /// away) ends the run: the connection is closed and the loop waits to take it again.
    #[tokio::test(start_paused = true)]
    async fn a_lease_lost_while_connected_ends_the_run() {
        use std::sync::Arc;
        use std::sync::atomic::AtomicBool;

        use parlor_bot::session::lease::{self, Keeper};
        use parlor_bot::store::{KvWrite, MemoryStore, Store};
        use parlor_bot::time::WallTime;

        let store = Arc::new(MemoryStore::new());
        let a = Keeper::new(
            Arc::clone(&store) as Arc<dyn Store>,
            "discord:0",
            "a",
            Duration::from_secs(9),
            WallTime::tokio_anchored(),
        );
        let shutdown = CancellationToken::new();
        let closed = Arc::new(AtomicBool::new(false));
        let runs = Arc::new(AtomicU32::new(0));
        let (closed_in, runs_in) = (Arc::clone(&closed), Arc::clone(&runs));
        let policy = policy();
        let supervised = supervise(&policy, Some(&a), &shutdown, move |stop| {
            let (closed, runs) = (Arc::clone(&closed_in), Arc::clone(&runs_in));
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                stop.cancelled().await;
                closed.store(true, Ordering::SeqCst);
                Session::Shutdown
            }
        });
        let thief = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            assert_eq!(runs.load(Ordering::SeqCst), 1);
            // Another daemon's records, as if it had taken the lease over.
            let far = WallTime::tokio_anchored().now() + chrono::Duration::hours(1);
            store
                .kv_write(vec![
                    KvWrite {
                        space: lease::LEASE_SPACE.into(),
                        key: "discord:0".into(),
                        value: Some(r#"{"v":1,"owner":"c","token":9}"#.into()),
                        if_unchanged: None,
                    },
                    KvWrite {
                        space: lease::EXPIRY_SPACE.into(),
                        key: "discord:0".into(),
                        value: Some(format!(r#"{{"v":1,"expires":"{}"}}"#, far.to_rfc3339())),
                        if_unchanged: None,
                    },
                ])
                .unwrap();
            tokio::time::sleep(Duration::from_secs(30)).await;
            assert!(closed.load(Ordering::SeqCst), "the connection was closed");
            assert_eq!(runs.load(Ordering::SeqCst), 1, "and not opened again");
            shutdown.cancel();
        };
        let (ended, ()) = tokio::join!(supervised, thief);
        assert!(ended.is_ok());
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
