//! HTTP client settings shared by the clients that talk to one host at a high rate (the
//! model's endpoint, a chat platform's API).

use std::time::Duration;

/// Idle connections each client keeps per host. A burst (hundreds of chats answered at
/// once) opens a connection per request in flight; kept idle, each holds its buffers and a
/// socket until the pool drops it, which is most of what a burst leaves behind in memory.
/// A handful covers a steady load; a new burst opens what it needs again.
pub const IDLE_CONNECTIONS_PER_HOST: usize = 8;

/// How long an idle connection is kept: shorter than reqwest's 90 s, so that what a burst
/// opened is closed soon after it, and longer than the gap between turns in a busy chat.
pub const IDLE_CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);

/// `builder` with the pool limits above.
pub fn pooled(builder: reqwest::ClientBuilder) -> reqwest::ClientBuilder {
    builder
        .pool_max_idle_per_host(IDLE_CONNECTIONS_PER_HOST)
        .pool_idle_timeout(IDLE_CONNECTION_TIMEOUT)
}
