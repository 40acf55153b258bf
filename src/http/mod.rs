//! The operator's HTTP listener (`[http] listen`): `/healthz` (the process answers),
//! `/readyz` (the store is open and every adapter connected; 503 with the reason
//! otherwise) and `/metrics` (Prometheus text format from `parlor_bot::metrics`), which
//! answer without a token (they say nothing about what chats say; keep the listener on
//! loopback); and, with `[http] token_env`, the operator's console behind that token.
//!
//! Every route, probes included, answers only a `Host` that names this machine's loopback
//! (`localhost`, `127.0.0.1`, `[::1]`, any port) or one listed in `[http] allowed_hosts`;
//! any other (or none) gets 421, so a web page that rebinds its DNS name to 127.0.0.1
//! reads nothing. Every answer carries the standard security headers ([`secure`]).
//!
//! # Layout
//! - `mod.rs`: the probes, the router, binding and serving.
//! - [`auth`]: the token, login sessions (cookie + CSRF token), the guard every console
//!   route passes.
//! - [`console`]: the console's pages and actions, server-rendered HTML.
//! - [`errors`]: the ring of recent warnings and errors, filled by a `tracing` layer.
//! - [`webhook`]: the Telegram webhook's route (`telegram.webhook_url`), which answers
//!   without the console's token: Telegram proves itself with the webhook's secret token.

pub mod auth;
pub mod console;
pub mod errors;
pub mod webhook;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
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
    /// Host names answered besides the loopback ones (`[http] allowed_hosts`), lowercase,
    /// without port.
    pub allowed_hosts: Vec<String>,
    /// The Telegram webhook's receiver, in webhook mode.
    pub telegram_webhook: Option<parlor_adapters::telegram::webhook::WebhookReceiver>,
}

/// The routes, for [`serve`] and for tests.
pub fn router(state: HttpState) -> Router {
    let probes = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state.clone());
    let routes = match state.console {
        Some(console) => probes.merge(console::router(console)),
        None => probes,
    };
    let routes = match state.telegram_webhook {
        Some(receiver) => routes.merge(webhook::router(receiver)),
        None => routes,
    };
    let hosts: Arc<[String]> = state
        .allowed_hosts
        .iter()
        .map(|h| host_name(h).to_ascii_lowercase())
        .collect();
    routes.layer(axum::middleware::from_fn_with_state(hosts, guard))
}

/// Every request's way in: its client recorded ([`auth::Client`]), a foreign `Host`
/// refused, and the security headers set on whatever answers.
async fn guard(State(hosts): State<Arc<[String]>>, mut request: Request, next: Next) -> Response {
    let client = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |c| c.0.ip());
    request.extensions_mut().insert(auth::Client(client));
    // HTTP/2 carries the host as the URI's authority instead.
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| request.uri().authority().map(|a| a.as_str().to_owned()));
    let mut response = match host {
        Some(host) if host_allowed(&host, &hosts) => next.run(request).await,
        _ => (
            StatusCode::MISDIRECTED_REQUEST,
            "this host name is not served here (see http.allowed_hosts)\n",
        )
            .into_response(),
    };
    secure(response.headers_mut());
    response
}

/// The host part of a `Host` value (`[::1]:9464` is `[::1]`, `localhost:80` is `localhost`).
fn host_name(host: &str) -> &str {
    let host = host.trim();
    if host.starts_with('[') {
        return match host.find(']') {
            Some(end) => &host[..=end],
            None => host,
        };
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// Whether `host` (a `Host` header) names loopback or one of `allowed` (any port).
fn host_allowed(host: &str, allowed: &[String]) -> bool {
    let name = host_name(host).to_ascii_lowercase();
    matches!(name.as_str(), "localhost" | "127.0.0.1" | "[::1]") || allowed.contains(&name)
}

/// The content security policy of every answer: the console's pages load their style
/// sheet from here and nothing else, run no script, post forms only here, and are framed
/// nowhere.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; style-src 'self'; \
     form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// Sets the standard security headers: no MIME sniffing, no framing, no referrer, the
/// [`CONTENT_SECURITY_POLICY`], and no caching (pages show chats and tokens).
pub fn secure(headers: &mut HeaderMap) {
    for (name, value) in [
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
}

/// Whether `listen` is an address other hosts may reach (not loopback).
fn exposed(listen: &str) -> bool {
    listen
        .parse::<SocketAddr>()
        .is_ok_and(|addr| !addr.ip().is_loopback())
}

/// The warning for a listener other hosts can reach.
fn exposed_warning(listen: &str) -> String {
    format!(
        "warning: http.listen = {listen} is not loopback: put TLS (a reverse proxy) in front, \
         or the console token and its cookie cross the network in clear"
    )
}

/// What `check-config` says of the listener.
pub fn console_line(listen: &str, token: bool) -> String {
    let line = console_summary(listen, token);
    if exposed(listen) {
        format!("{line}\n{}", exposed_warning(listen))
    } else {
        line
    }
}

fn console_summary(listen: &str, token: bool) -> String {
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
    if let Some(addr) = local
        && !addr.ip().is_loopback()
    {
        tracing::warn!("{}", exposed_warning(&addr.to_string()));
    }
    let app = router(state).into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
        .context("the HTTP listener failed")
}

async fn readyz(State(state): State<HttpState>) -> impl IntoResponse {
    // The store answers from memory when it is open; a wedged disk must not wedge the probe.
    let store = Arc::clone(&state.store);
    let asked = std::time::Instant::now();
    let probe = tokio::time::timeout(
        Duration::from_secs(2),
        tokio::task::spawn_blocking(move || store.get_meta("parlor_readyz_probe")),
    )
    .await;
    let round_trip = asked.elapsed();
    let store_down = match probe {
        Ok(Ok(Ok(_))) => {
            parlor_bot::metrics::global()
                .store_round_trip
                .observe(round_trip.as_secs_f64());
            None
        }
        Ok(Ok(Err(e))) => Some(format!("store: {e}")),
        Ok(Err(e)) => Some(format!("store: the probe failed: {e}")),
        Err(_) => Some("store: did not answer within 2 s".to_owned()),
    };
    let adapters = parlor_bot::health::global().check();
    let reasons: Vec<String> = store_down
        .into_iter()
        .chain(adapters.err().map(|down| down.to_string()))
        .collect();
    if reasons.is_empty() {
        let mut body = format!(
            "ready\nstore answered in {:.1} ms\n",
            round_trip.as_secs_f64() * 1000.0
        );
        if let Some(sessions) = &state.sessions
            && let Some(instance) = sessions.instance()
        {
            let stats = sessions.stats();
            body.push_str(&format!(
                "instance {instance}: {} chat leases held, {} taken over, {} lost\n",
                stats.leases_held, stats.takeovers, stats.leases_lost
            ));
        }
        (StatusCode::OK, body)
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
        metrics
            .chat_leases
            .set(i64::try_from(sessions.stats().leases_held).unwrap_or(i64::MAX));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_names_and_the_listed_ones_are_answered() {
        let allowed = vec!["parlor.example.com".to_owned()];
        for host in [
            "localhost",
            "localhost:9464",
            "127.0.0.1:9464",
            "[::1]:9464",
            "[::1]",
            "LocalHost:1",
            "parlor.example.com",
            "Parlor.Example.Com:443",
        ] {
            assert!(host_allowed(host, &allowed), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:9464",
            "127.0.0.1.evil.example",
            "localhost.evil.example:80",
            "[::2]:80",
            "",
        ] {
            assert!(!host_allowed(host, &allowed), "{host}");
        }
    }

    #[test]
    fn check_config_warns_of_a_listener_other_hosts_reach() {
        assert!(console_line("0.0.0.0:9464", false).contains("put TLS"));
        assert!(!console_line("127.0.0.1:9464", true).contains("put TLS"));
    }
}
