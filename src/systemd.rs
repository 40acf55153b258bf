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

/// Sends `states` to systemd's notification socket, if there is one. Non-blocking, unlike
/// `sd_notify::notify`: when the socket's queue is full (systemd hung, or a test that
/// stopped reading) a blocking send would stall the runtime worker it runs on — and at
/// shutdown the main task — for as long as nobody reads; a dropped ping or status is
/// harmless next to that.
fn notify(states: &[NotifyState<'_>]) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let message: String = states.iter().map(|s| format!("{s}\n")).collect();
    if let Err(e) = send_datagram(&path, message.as_bytes()) {
        tracing::debug!(error = %e, "sd_notify failed");
    }
}

fn send_datagram(path: &std::ffi::OsStr, message: &[u8]) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let socket = UnixDatagram::unbound()?;
    socket.set_nonblocking(true)?;
    // `@name` is a socket in the abstract namespace (systemd's own way of naming some).
    let address = match path.as_bytes().strip_prefix(b"@") {
        #[cfg(target_os = "linux")]
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            SocketAddr::from_abstract_name(name)?
        }
        _ => SocketAddr::from_pathname(path)?,
    };
    socket.send_to_addr(message, &address)?;
    Ok(())
}

/// The interval systemd wants watchdog pings at (half its `WatchdogSec`), if it wants any.
pub fn watchdog_interval() -> Option<Duration> {
    let mut usec = 0;
    sd_notify::watchdog_enabled(false, &mut usec)
        .then_some(usec)
        .and_then(ping_interval)
}

/// The shortest ping interval: a `WatchdogSec` of a microsecond or two would otherwise halve
/// to zero, which no timer can tick at.
const MIN_PING_INTERVAL: Duration = Duration::from_millis(1);

/// Half of systemd's `WATCHDOG_USEC`, at least [`MIN_PING_INTERVAL`]; `None` for 0, which
/// systemd itself treats as invalid (no watchdog).
fn ping_interval(usec: u64) -> Option<Duration> {
    (usec > 0).then(|| Duration::from_micros(usec / 2).max(MIN_PING_INTERVAL))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tiny_watchdog_timeout_gives_a_usable_interval() {
        assert_eq!(ping_interval(0), None);
        assert_eq!(ping_interval(1), Some(MIN_PING_INTERVAL));
        assert_eq!(ping_interval(3), Some(MIN_PING_INTERVAL));
        assert_eq!(ping_interval(60_000_000), Some(Duration::from_secs(30)));
    }

    #[tokio::test]
    async fn pinging_at_the_shortest_interval_does_not_panic() {
        // The timer is made on entry: a zero interval would panic right there.
        let shutdown = CancellationToken::new();
        shutdown.cancel();
        watchdog(ping_interval(1).unwrap(), shutdown).await;
    }
}
