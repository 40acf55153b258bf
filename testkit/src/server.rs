//! What every fake shares: a server on a loopback port whose tasks live and
//! die with the fake, a recovering lock on its state, and waiting (bounded)
//! for something to be recorded.

use std::fmt;
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long [`Server::shutdown`] waits for each task before aborting it.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Binds `127.0.0.1:0` for the fake called `fake`.
///
/// # Panics
/// If no local port can be bound: every fake's `start` documents this, since
/// a test cannot do anything useful without its server.
pub(crate) async fn loopback(fake: &str) -> (TcpListener, SocketAddr) {
    let bound = match TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await {
        Ok(listener) => listener.local_addr().map(|addr| (listener, addr)),
        Err(e) => Err(e),
    };
    match bound {
        Ok(bound) => bound,
        Err(e) => panic!("fake {fake}: cannot bind 127.0.0.1:0: {e}"),
    }
}

/// A fixed network round trip a fake adds to its answers (the "latency knob"), so that a
/// bench or a test sees what users feel: a real Bot API call from a VPS takes 20–100 ms,
/// and instant fakes hide any design that waits for one round trip after another.
/// Half of it passes before the call is handled (the request travelling), half after (the
/// answer travelling). Zero, the default, adds nothing.
#[derive(Clone, Default)]
pub(crate) struct Latency {
    nanos: Arc<AtomicU64>,
    cancel: CancellationToken,
    /// Calls that never wait (long polls: their wait is not a round trip).
    exempt: Option<fn(&str) -> bool>,
}

impl Latency {
    /// A knob at zero; `exempt(path)` names the calls it never delays.
    pub(crate) fn new(cancel: CancellationToken, exempt: Option<fn(&str) -> bool>) -> Self {
        Latency {
            nanos: Arc::default(),
            cancel,
            exempt,
        }
    }

    /// Sets the round trip every later call gets.
    pub(crate) fn set(&self, round_trip: Duration) {
        let nanos = u64::try_from(round_trip.as_nanos()).unwrap_or(u64::MAX);
        self.nanos.store(nanos, Ordering::Relaxed);
    }

    /// The round trip calls get now.
    pub(crate) fn get(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::Relaxed))
    }

    /// Waits half the round trip, or until the fake stops.
    async fn half(&self) {
        let half = self.get() / 2;
        if !half.is_zero() {
            tokio::select! {
                () = self.cancel.cancelled() => {}
                () = tokio::time::sleep(half) => {}
            }
        }
    }
}

/// The middleware that applies a [`Latency`] (`axum::middleware::from_fn_with_state`).
pub(crate) async fn with_latency(
    State(latency): State<Latency>,
    request: Request,
    next: Next,
) -> Response {
    let exempt = latency.exempt.is_some_and(|f| f(request.uri().path()));
    if exempt {
        return next.run(request).await;
    }
    latency.half().await;
    let response = next.run(request).await;
    latency.half().await;
    response
}

/// The tasks of a running fake. Cancelling `cancel` (which the fake's handlers
/// also watch, to end long polls and stalled streams) stops them; dropping the
/// server cancels and aborts them, so a test that forgets to shut down leaks
/// nothing.
pub(crate) struct Server {
    cancel: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl Server {
    pub(crate) fn new(cancel: CancellationToken) -> Self {
        Self {
            cancel,
            tasks: Vec::new(),
        }
    }

    /// Serves `app` on `listener` until cancelled.
    pub(crate) fn serve(&mut self, listener: TcpListener, app: Router) {
        let serve = axum::serve(listener, app)
            .with_graceful_shutdown(self.cancel.clone().cancelled_owned());
        self.spawn(async move {
            // Accept errors are retried inside axum; an error here means the
            // server is gone, which tests notice through failed requests.
            let _ = serve.await;
        });
    }

    /// Runs `task` until the fake stops.
    pub(crate) fn spawn(&mut self, task: impl Future<Output = ()> + Send + 'static) {
        self.tasks.push(tokio::spawn(task));
    }

    /// Cancels, then waits (bounded) for every task to finish.
    pub(crate) async fn shutdown(&mut self) {
        self.cancel.cancel();
        for mut task in self.tasks.drain(..) {
            if tokio::time::timeout(SHUTDOWN_GRACE, &mut task)
                .await
                .is_err()
            {
                task.abort();
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.cancel.cancel();
        for task in self.tasks.drain(..) {
            task.abort();
        }
    }
}

/// Locks a fake's state. Every critical section is a few pushes and lookups,
/// so a panic inside one (a test's responder, say) cannot leave the state
/// broken in a way that matters to tests: recover from poisoning instead of
/// failing every later call.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `now + timeout`, saturating at a year from now so that a huge timeout
/// cannot overflow the clock.
pub(crate) fn deadline_after(timeout: Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    now.checked_add(timeout.min(Duration::from_secs(365 * 24 * 3600)))
        .unwrap_or(now)
}

/// Returned by the `wait_for_*` methods of the fakes when what they waited
/// for did not happen in time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitTimeout {
    /// What was awaited, e.g. `"3 sent message(s)"`.
    pub wanted: String,
    /// What had happened when the wait gave up, e.g. `"1"`.
    pub seen: String,
    /// How long the wait lasted.
    pub timeout: Duration,
    /// Which fake waited, for the message.
    fake: &'static str,
}

impl fmt::Display for WaitTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "fake {}: waited {:?} for {} but saw {}",
            self.fake, self.timeout, self.wanted, self.seen
        )
    }
}

impl std::error::Error for WaitTimeout {}

/// What a wait's check says while its condition is unmet: `(wanted, seen)`.
pub(crate) type Unmet = (String, String);

/// Waits until `check` returns `Ok`, re-checking whenever `changed` is
/// notified; gives up after `timeout` with what `check` last reported.
pub(crate) async fn wait_until<T>(
    fake: &'static str,
    changed: &Notify,
    timeout: Duration,
    mut check: impl FnMut() -> Result<T, Unmet>,
) -> Result<T, WaitTimeout> {
    let deadline = deadline_after(timeout);
    loop {
        let notified = changed.notified();
        tokio::pin!(notified);
        // Registered before checking, so a change in between still wakes us.
        notified.as_mut().enable();
        let (wanted, seen) = match check() {
            Ok(v) => return Ok(v),
            Err(unmet) => unmet,
        };
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            return Err(WaitTimeout {
                wanted,
                seen,
                timeout,
                fake,
            });
        }
    }
}

/// The check of a wait for at least `n` recorded `items` (`what` names them,
/// e.g. `"sent message(s)"`): all of them once there are enough.
pub(crate) fn at_least<T: Clone>(items: &[T], n: usize, what: &str) -> Result<Vec<T>, Unmet> {
    if items.len() >= n {
        Ok(items.to_vec())
    } else {
        Err((format!("{n} {what}"), items.len().to_string()))
    }
}

/// A recorded payload from a fake's `(file name, JSON text)` table, parsed;
/// `None` for an unknown name.
pub(crate) fn fixture(table: &[(&str, &str)], name: &str) -> Option<Value> {
    table
        .iter()
        .find(|(n, _)| *n == name)
        .and_then(|(_, text)| serde_json::from_str(text).ok())
}
