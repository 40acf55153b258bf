//! HTTP client settings shared by the clients that talk to one host at a high rate (the
//! model's endpoint, a chat platform's API).

use std::time::Duration;

/// Idle connections each client keeps per host. A burst (hundreds of chats answered at
/// once) opens a connection per request in flight; whatever the pool cannot keep is closed
/// when its request ends and opened again by the next one, and that churn (a connect, a
/// close, a new connection task each time) was about 15 % of the daemon's CPU per turn in a
/// 50-chat burst with a pool of 8 (docs/perf.md). 64 covers such a burst; what a larger one
/// leaves idle holds its buffers only until [`IDLE_CONNECTION_TIMEOUT`].
pub const IDLE_CONNECTIONS_PER_HOST: usize = 64;

/// How long an idle connection is kept: shorter than reqwest's 90 s, so that what a burst
/// opened is closed soon after it, and longer than the gap between turns in a busy chat.
pub const IDLE_CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);

/// `builder` with the pool limits above.
pub fn pooled(builder: reqwest::ClientBuilder) -> reqwest::ClientBuilder {
    builder
        .pool_max_idle_per_host(IDLE_CONNECTIONS_PER_HOST)
        .pool_idle_timeout(IDLE_CONNECTION_TIMEOUT)
}

/// The environment variables through which reqwest sends requests via a proxy.
const PROXY_VARS: [&str; 6] = [
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "ALL_PROXY",
    "all_proxy",
];

/// Whether a proxy is set in the environment (`HTTPS_PROXY` and the like): requests then go
/// through it, and a direct connection proves nothing about reaching an endpoint.
pub fn proxy_set() -> bool {
    PROXY_VARS.iter().any(|v| std::env::var_os(v).is_some())
}
