//! systemd integration (`Type=notify`): READY once the adapters poll, WATCHDOG pings while
//! the runtime is alive, STOPPING when shutdown begins. Every call is a no-op outside
//! systemd (no `NOTIFY_SOCKET`), so `parlor run` behaves the same in a terminal.

use std::time::Duration;

use sd_notify::NotifyState;
use tokio_util::sync::CancellationToken;

/// Tells systemd the daemon is ready.
pub fn ready() {
    notify(&[NotifyState::Ready, NotifyState::Status("serving chats")]);
}

/// Tells systemd the daemon is stopping.
pub fn stopping() {
    notify(&[NotifyState::Stopping, NotifyState::Status("draining")]);
}

fn notify(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(false, states) {
        tracing::debug!(error = %e, "sd_notify failed");
    }
}

/// The interval systemd wants watchdog pings at (half its `WatchdogSec`), if it wants any.
pub fn watchdog_interval() -> Option<Duration> {
    let mut usec = 0;
    sd_notify::watchdog_enabled(false, &mut usec).then(|| Duration::from_micros(usec / 2))
}

/// Pings the watchdog every `interval` until `shutdown`. It runs on the same runtime as the
/// sessions, so a wedged runtime stops the pings and systemd restarts the daemon.
pub async fn watchdog(interval: Duration, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(interval);
    loop {
        tokio::select! {
            _ = tick.tick() => notify(&[NotifyState::Watchdog]),
            () = shutdown.cancelled() => return,
        }
    }
}
