//! The Telegram webhook's route (`telegram.webhook_url`): a POST at the URL's path, handed
//! to the adapter's [`WebhookReceiver`], which checks the secret header, reads the update
//! and records it. The body is capped at [`MAX_UPDATE_BYTES`] (413 beyond). Like every
//! route it answers only a `Host` in loopback or `[http] allowed_hosts`: the webhook's
//! host must be listed there, which `check-config` warns of.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use parlor_adapters::telegram::webhook::{
    MAX_UPDATE_BYTES, SECRET_HEADER, WebhookReceiver, check_url,
};

use crate::config::Config;

/// The webhook's route alone, merged into the listener's router.
pub fn router(receiver: WebhookReceiver) -> Router {
    let path = receiver.path().to_owned();
    Router::new()
        .route(&path, post(receive))
        .layer(DefaultBodyLimit::max(MAX_UPDATE_BYTES))
        .with_state(Arc::new(receiver))
}

async fn receive(
    State(receiver): State<Arc<WebhookReceiver>>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let secret = headers.get(SECRET_HEADER).map(|value| value.as_bytes());
    let answer = receiver.receive(secret, &body).await;
    StatusCode::from_u16(answer.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// The ports Telegram posts webhooks to.
const TELEGRAM_PORTS: [u16; 4] = [443, 80, 88, 8443];

/// What `check-config` says of the Telegram adapter: its mode and, in webhook mode, what
/// would keep Telegram's posts from arriving. Nothing when no token is configured.
pub fn telegram_lines(config: &Config) -> Vec<String> {
    if config.telegram_token().is_none() {
        return Vec::new();
    }
    let Some(url) = &config.telegram.webhook_url else {
        return vec!["telegram: long polling (getUpdates)".to_owned()];
    };
    // `Config::check` accepted the URL, so it parses.
    let Ok(checked) = check_url(url) else {
        return Vec::new();
    };
    // The path secret stays out of the output.
    let mut lines = vec![format!(
        "telegram: webhook: Telegram posts to {}://{}/… with the secret token; the \
         listener {} serves it",
        checked.url.scheme(),
        checked.host,
        config.http.listen.as_deref().unwrap_or("(none)"),
    )];
    let listed = config
        .http
        .allowed_hosts
        .iter()
        .any(|host| super::host_name(host).eq_ignore_ascii_case(&checked.host));
    if !checked.loopback && !listed {
        lines.push(format!(
            "warning: the webhook's host {} is not in http.allowed_hosts: the listener answers \
             421 to a Host it does not list, unless the proxy in front rewrites Host to a \
             loopback name",
            checked.host
        ));
    }
    let port = checked.url.port_or_known_default().unwrap_or(443);
    if !checked.loopback && !TELEGRAM_PORTS.contains(&port) {
        lines.push(format!(
            "warning: Telegram posts webhooks only to ports 443, 80, 88 and 8443, not {port}"
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `check-config`'s lines for a webhook at `url` with `allowed_hosts`.
    fn lines(url: &str, allowed_hosts: &str) -> Vec<String> {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "s3cret").unwrap();
        let mut config = Config::parse(&format!(
            "[telegram]\ntoken = \"123:abc\"\nwebhook_url = \"{url}\"\n\
             webhook_secret_file = \"{}\"\n\
             [http]\nlisten = \"127.0.0.1:9464\"\nallowed_hosts = {allowed_hosts}\n",
            secret.display()
        ))
        .unwrap();
        config.resolve_secrets().unwrap();
        telegram_lines(&config)
    }

    #[test]
    fn check_config_warns_of_an_unlisted_host_and_a_port_telegram_does_not_post_to() {
        let url = "https://bot.example.com/telegram/3f9c2a7d0b6e41c8a5d2";
        let listed = lines(url, "[\"Bot.Example.com:443\"]");
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert!(listed[0].starts_with("telegram: webhook"), "{listed:?}");
        assert!(!listed[0].contains("3f9c2a7d0b6e41c8a5d2"), "{listed:?}");

        let unlisted = lines(url, "[]");
        assert!(
            unlisted[1].contains("not in http.allowed_hosts"),
            "{unlisted:?}"
        );

        let odd_port = lines(
            "https://bot.example.com:9000/telegram/3f9c2a7d0b6e41c8a5d2",
            "[\"bot.example.com\"]",
        );
        assert!(odd_port[1].contains("443, 80, 88 and 8443"), "{odd_port:?}");

        let loopback = lines("http://127.0.0.1:8080/telegram/3f9c2a7d0b6e41c8a5d2", "[]");
        assert_eq!(loopback.len(), 1, "{loopback:?}");
    }
}
