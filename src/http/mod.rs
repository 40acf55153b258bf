//! The operator's HTTP listener (`[http] listen`): `/healthz` (the process answers),
//! `/readyz` (the store is open and every adapter connected; 503 with the reason
//! otherwise) and `/metrics` (Prometheus text format from `parlor_bot::metrics`), which
//! answer without a token (they say nothing about what chats say; keep the listener on
//! loopback); and, with `[http] token_env`, the operator's console behind that token.
//!
//! # Layout
//! - `mod.rs`: the probes, the router, binding and serving.
//! - [`auth`]: the token, login sessions (cookie + CSRF token), the guard every console
//!   route passes.
//! - [`console`]: the console's pages and actions, server-rendered HTML.
//! - [`errors`]: the ring of recent warnings and errors, filled by a `tracing` layer.

pub mod auth;
pub mod console;
pub mod errors;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use parlor_bot::session::SessionManager;
use parlor_bot::store::Store;
use tokio_util::sync::CancellationToken;

/// What the routes read.
#[derive(Clone)]
pub struct HttpState {
    /// Checked by `/readyz`.
    pub store: Arc<dyn Store>,
    /// Sessions in memory, read at scrape time.
    pub sessions: Option<SessionManager>,
    /// The console, when `[http] token_env` gives it a token.
    pub console: Option<Arc<console::Console>>,
    /// The terminal's background tasks, counted at scrape time.
    pub terminal: Option<Arc<parlor_toolsets::terminal::TerminalService>>,
}

/// The routes, for [`serve`] and for tests.
pub fn router(state: HttpState) -> Router {
    let probes = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state.clone());
    match state.console {
        Some(console) => probes.merge(console::router(console)),
        None => probes,
    }
}

/// What `check-config` says of the listener.
pub fn console_line(listen: &str, token: bool) -> String {
    if token {
        format!(
            "http: {listen} serves /healthz, /readyz, /metrics (no token) and the console \
             (token from http.token_env)"
        )
    } else {
        format!(
            "http: {listen} serves /healthz, /readyz and /metrics; the console is off (set \
             http.token_env to turn it on)"
        )
    }
}

/// Binds `addr` (a failure stops the start, not the first scrape).
pub async fn bind(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on http.listen = {addr}"))
}

/// Serves until `shutdown`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: HttpState,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let local = listener.local_addr().ok();
    let console = if state.console.is_some() { "on" } else { "off" };
    tracing::info!(addr = ?local, console, "serving /healthz, /readyz and /metrics");
    axum::serve(listener, router(state))
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
        .context("the HTTP listener failed")
}

async fn readyz(State(state): State<HttpState>) -> impl IntoResponse {
    // The store answers from memory when it is open; a wedged disk must not wedge the probe.
    let store = Arc::clone(&state.store);
    let probe = tokio::time::timeout(
        Duration::from_secs(2),
        tokio::task::spawn_blocking(move || store.get_meta("parlor_readyz_probe")),
    )
    .await;
    let store_down = match probe {
        Ok(Ok(Ok(_))) => None,
        Ok(Ok(Err(e))) => Some(format!("store: {e}")),
        Ok(Err(e)) => Some(format!("store: the probe failed: {e}")),
        Err(_) => Some("store: did not answer within 2 s".to_owned()),
    };
    let adapters = parlor_bot::health::global().check();
    let reasons: Vec<String> = store_down.into_iter().chain(adapters.err()).collect();
    if reasons.is_empty() {
        (StatusCode::OK, "ready\n".to_owned())
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready\n{}\n", reasons.join("\n")),
        )
    }
}

async fn metrics(State(state): State<HttpState>) -> impl IntoResponse {
    let metrics = parlor_bot::metrics::global();
    if let Some(sessions) = &state.sessions {
        metrics
            .sessions
            .set(i64::try_from(sessions.live_sessions()).unwrap_or(i64::MAX));
        metrics
            .queued
            .set(i64::try_from(sessions.queued_items()).unwrap_or(i64::MAX));
    }
    if let Some(terminal) = &state.terminal {
        let mut counts: Vec<(&str, usize)> = Vec::new();
        for task in terminal.tasks(None) {
            let status = task.status.as_str();
            match counts.iter_mut().find(|(s, _)| *s == status) {
                Some((_, n)) => *n += 1,
                None => counts.push((status, 1)),
            }
        }
        metrics.set_background_tasks(&counts);
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        metrics.encode(),
    )
}
