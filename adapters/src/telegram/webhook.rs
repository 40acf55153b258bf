//! Webhook mode: Telegram POSTs each update to a public URL instead of parlor long-polling
//! `getUpdates`, so a load balancer may hand an update to any instance.
//!
//! The adapter's [`Receiver`](crate::Receiver) registers the URL (`setWebhook`) and then
//! only waits for shutdown; the updates arrive through the binary's HTTP listener, which
//! mounts a [`WebhookReceiver`] at [`WebhookReceiver::path`]. This file knows no HTTP
//! framework: it takes the secret header and the body, and answers a [`WebhookAnswer`].
//!
//! Telegram's acknowledgement is the HTTP answer: a 2xx drops the update, anything else
//! makes Telegram send it again later. So an update is answered 200 only once the inbox
//! recorded it durably (or once it is found to be something parlor skips), and 500 when
//! the store failed, for Telegram to retry. A repeat is absorbed by the runtime's dedupe on
//! `(chat, message_id)`, as after a restart in polling mode.
//!
//! The webhook is left in place at shutdown: Telegram keeps the updates until an instance
//! answers again.

use std::sync::Arc;

use parlor_bot::backoff::Failures;
use parlor_bot::platform::{Delivery, Inbox, InboxError, PlatformError};
use secrecy::{ExposeSecret, SecretString};
use subtle::ConstantTimeEq;
use teloxide_core::payloads::{DeleteWebhookSetters, SetWebhookSetters};
use teloxide_core::prelude::Requester;
use teloxide_core::types::Update;
use tokio_util::sync::CancellationToken;

use super::TelegramAdapter;
use super::config::WebhookConfig;
use super::convert::Received;
use crate::common::{pause, with_retries};

/// The header Telegram carries the `secret_token` of `setWebhook` in.
pub const SECRET_HEADER: &str = "X-Telegram-Bot-Api-Secret-Token";

/// The largest update body taken. A message holds at most 4096 characters of text plus
/// entities and a few embedded objects; this leaves a wide margin and still bounds what an
/// unauthenticated sender can make the listener buffer.
pub const MAX_UPDATE_BYTES: usize = 1024 * 1024;

/// What the HTTP route answers Telegram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebhookAnswer {
    /// 200: recorded durably, or skipped as something parlor does not take.
    Accepted,
    /// 401: the secret header is wrong or missing; nothing was read.
    Unauthorized,
    /// 400: the body is not an update at all.
    BadRequest,
    /// 503: the daemon is shutting down; Telegram sends it again, to whoever answers.
    ShuttingDown,
    /// 500: the store could not record it; Telegram sends it again.
    StoreFailed,
}

impl WebhookAnswer {
    /// The HTTP status code of this answer.
    pub fn status(self) -> u16 {
        match self {
            WebhookAnswer::Accepted => 200,
            WebhookAnswer::Unauthorized => 401,
            WebhookAnswer::BadRequest => 400,
            WebhookAnswer::ShuttingDown => 503,
            WebhookAnswer::StoreFailed => 500,
        }
    }
}

/// Takes webhook requests: checks the secret, reads the update, and hands it to the inbox
/// through the same conversion polling uses. Cloning is cheap.
#[derive(Clone)]
pub struct WebhookReceiver {
    adapter: TelegramAdapter,
    inbox: Arc<dyn Inbox>,
    /// The route's path: the path of [`WebhookConfig::url`].
    path: String,
    secret: SecretString,
}

impl std::fmt::Debug for WebhookReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookReceiver")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl WebhookReceiver {
    /// The receiver of `adapter`'s webhook, delivering to `inbox`; `None` when the adapter
    /// long-polls. Errors: [`PlatformError::Refused`] when the URL does not parse.
    pub fn new(
        adapter: &TelegramAdapter,
        inbox: Arc<dyn Inbox>,
    ) -> Result<Option<WebhookReceiver>, PlatformError> {
        let Some(webhook) = &adapter.inner.config.webhook else {
            return Ok(None);
        };
        let url = parse_url(webhook)?;
        Ok(Some(WebhookReceiver {
            adapter: adapter.clone(),
            inbox,
            path: url.path().to_owned(),
            secret: webhook.secret_token.clone(),
        }))
    }

    /// The path to mount the route at (`/telegram/3f9c...`).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Answers one POSTed update: `secret` is the [`SECRET_HEADER`] value, if any, and
    /// `body` the request body (the caller caps it at [`MAX_UPDATE_BYTES`]). Never waits on
    /// the network: it returns once the store write is durable.
    pub async fn receive(&self, secret: Option<&[u8]>, body: &[u8]) -> WebhookAnswer {
        let expected = self.secret.expose_secret().as_bytes();
        // Constant time, so the answer's timing tells nothing about how much of a guess
        // was right. The length is not secret.
        if !secret.is_some_and(|given| bool::from(given.ct_eq(expected))) {
            tracing::warn!("refused a Telegram webhook request without the right secret token");
            return WebhookAnswer::Unauthorized;
        }
        let update = match serde_json::from_slice::<Update>(body) {
            Ok(update) => update,
            Err(error) => {
                // Signed by Telegram but unreadable: skipped, as polling skips it, so one
                // malformed update cannot be retried forever.
                let id = serde_json::from_slice::<serde_json::Value>(body)
                    .ok()
                    .and_then(|value| value.get("update_id").and_then(|id| id.as_u64()));
                return match id {
                    Some(id) => {
                        tracing::warn!(update_id = id, %error, "skipping a webhook update that cannot be read");
                        WebhookAnswer::Accepted
                    }
                    None => {
                        tracing::warn!(%error, "a webhook request that is not a Telegram update");
                        WebhookAnswer::BadRequest
                    }
                };
            }
        };
        let delivery = match self.adapter.incoming(&update) {
            Some(Received::Message(message)) => Delivery::Message(message),
            Some(Received::Event(event)) => Delivery::Event(event),
            None => return WebhookAnswer::Accepted,
        };
        match self.inbox.deliver_all(vec![delivery]).await {
            Ok(()) => {
                tracing::debug!(update_id = update.id.0, "recorded a webhook update");
                WebhookAnswer::Accepted
            }
            Err(failed) => match failed.error {
                InboxError::ShuttingDown => WebhookAnswer::ShuttingDown,
                InboxError::Store(error) => {
                    tracing::error!(update_id = update.id.0, %error, "could not store a webhook update; Telegram sends it again");
                    WebhookAnswer::StoreFailed
                }
            },
        }
    }
}

/// The shortest path secret (the URL's last path segment): random enough that the route
/// cannot be guessed, and long enough never to be one of the listener's own routes.
pub const MIN_PATH_SECRET_CHARS: usize = 16;

/// What [`check_url`] found wrong with a webhook URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WebhookUrlError {
    /// It does not parse.
    #[error("is not a URL ({0})")]
    NotUrl(String),
    /// Not https, and not http to a loopback host.
    #[error(
        "must start with https:// (Telegram posts only over TLS; http:// only to a loopback host)"
    )]
    NotHttps,
    /// A query or fragment, which the route (the path) would not see.
    #[error("must not have a query or a fragment: the route is its path")]
    QueryOrFragment,
    /// A path character outside `A-Za-z0-9-_.~/`.
    #[error("its path may hold only letters, digits and - _ . ~ /")]
    PathChars,
    /// The last path segment is shorter than [`MIN_PATH_SECRET_CHARS`].
    #[error(
        "must end in a random path secret of at least 16 characters, like \
         https://bot.example.com/telegram/3f9c2a7d0b6e41c8a5d2 (`openssl rand -hex 16`)"
    )]
    ShortPathSecret,
}

/// A webhook URL [`check_url`] accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookUrl {
    /// The whole URL, as given to `setWebhook`.
    pub url: reqwest::Url,
    /// The host name, lowercase (an IPv6 address in brackets), as a `Host` header names it.
    pub host: String,
    /// Whether the host is loopback (`localhost`, 127.0.0.0/8, `::1`).
    pub loopback: bool,
    /// The path: the route the listener serves.
    pub path: String,
}

/// Checks a webhook URL: https (http only to a loopback host, for tests and a local Bot API
/// server), no query or fragment, a plain path whose last segment is a path secret of at
/// least [`MIN_PATH_SECRET_CHARS`] characters.
pub fn check_url(url: &str) -> Result<WebhookUrl, WebhookUrlError> {
    let parsed =
        reqwest::Url::parse(url.trim()).map_err(|e| WebhookUrlError::NotUrl(e.to_string()))?;
    let host = parsed.host_str().unwrap_or_default().to_ascii_lowercase();
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = bare == "localhost"
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    match parsed.scheme() {
        "https" if !host.is_empty() => {}
        "http" if loopback => {}
        _ => return Err(WebhookUrlError::NotHttps),
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(WebhookUrlError::QueryOrFragment);
    }
    let path = parsed.path().to_owned();
    if !path
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"/-_.~".contains(&b))
    {
        return Err(WebhookUrlError::PathChars);
    }
    let secret = path.rsplit('/').next().unwrap_or_default();
    if secret.len() < MIN_PATH_SECRET_CHARS {
        return Err(WebhookUrlError::ShortPathSecret);
    }
    Ok(WebhookUrl {
        url: parsed,
        host,
        loopback,
        path,
    })
}

/// Telegram's rule for a webhook's `secret_token`: 1-256 characters of `A-Za-z0-9_-`.
pub fn valid_secret_token(secret: &str) -> bool {
    (1..=256).contains(&secret.len())
        && secret
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn parse_url(webhook: &WebhookConfig) -> Result<reqwest::Url, PlatformError> {
    check_url(&webhook.url)
        .map(|checked| checked.url)
        .map_err(|error| PlatformError::Refused(format!("the Telegram webhook URL {error}")))
}

impl TelegramAdapter {
    /// Webhook mode's [`Receiver`](crate::Receiver) body: `setWebhook` until Telegram takes
    /// it, then `ready`, then nothing but waiting for `shutdown` (updates come in through
    /// [`WebhookReceiver`]). Failures back off and retry, as polling does; only a rejected
    /// token ends it.
    pub(super) async fn run_webhook<R>(
        &self,
        webhook: &WebhookConfig,
        shutdown: CancellationToken,
        ready: R,
    ) -> Result<(), PlatformError>
    where
        R: FnOnce() + Send,
    {
        let url = parse_url(webhook)?;
        let mut failures = Failures::new(self.inner.config.backoff);
        loop {
            let set = tokio::select! {
                biased;
                () = shutdown.cancelled() => return Ok(()),
                set = self.set_webhook(&url, webhook) => set,
            };
            let wait = match set {
                Ok(()) => break,
                Err(PlatformError::Unauthorized) => {
                    tracing::error!("Telegram rejected the bot token; stopping");
                    return Err(PlatformError::Unauthorized);
                }
                Err(error) => {
                    let wait = failures.next_delay();
                    parlor_bot::health::global()
                        .set_down("telegram", format!("setWebhook failed: {error}"));
                    tracing::error!(%error, ?wait, "Telegram did not take the webhook; retrying");
                    wait
                }
            };
            if !pause(wait, &shutdown).await {
                return Ok(());
            }
        }
        tracing::info!(
            username = ?self.inner.me.username,
            path = url.path(),
            "Telegram posts updates to the webhook"
        );
        ready();
        shutdown.cancelled().await;
        Ok(())
    }

    /// One `setWebhook`, with the standard retries. Pending updates are kept: they are
    /// posted to the new URL.
    async fn set_webhook(
        &self,
        url: &reqwest::Url,
        webhook: &WebhookConfig,
    ) -> Result<(), PlatformError> {
        with_retries("setWebhook", &self.policy(), || async {
            self.inner
                .bot
                .set_webhook(url.clone())
                .secret_token(webhook.secret_token.expose_secret())
                .allowed_updates(self.inner.allowed_updates.iter().copied())
                .drop_pending_updates(false)
                .await
                .map(|_| ())
                .map_err(|error| self.fail(&error))
        })
        .await
    }

    /// Polling mode's first step: `getUpdates` fails with 409 while a webhook is set, so a
    /// bot that moves back from webhook mode removes it, keeping the pending updates.
    pub(super) async fn delete_webhook(&self) -> Result<(), PlatformError> {
        with_retries("deleteWebhook", &self.policy(), || async {
            self.inner
                .bot
                .delete_webhook()
                .drop_pending_updates(false)
                .await
                .map(|_| ())
                .map_err(|error| self.fail(&error))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_map_to_the_statuses_telegram_reads() {
        assert_eq!(WebhookAnswer::Accepted.status(), 200);
        assert_eq!(WebhookAnswer::Unauthorized.status(), 401);
        assert_eq!(WebhookAnswer::StoreFailed.status(), 500);
        assert_eq!(WebhookAnswer::ShuttingDown.status(), 503);
    }

    const SECRET: &str = "3f9c2a7d0b6e41c8a5d2";

    #[test]
    fn a_webhook_url_is_https_with_a_path_secret() {
        let good = check_url(&format!("https://Bot.Example.com/telegram/{SECRET}")).expect("valid");
        assert_eq!(good.host, "bot.example.com");
        assert_eq!(good.path, format!("/telegram/{SECRET}"));
        assert!(!good.loopback);
        for loopback in [
            format!("http://127.0.0.1:8080/{SECRET}"),
            format!("http://localhost/{SECRET}"),
            format!("http://[::1]:9/{SECRET}"),
        ] {
            assert!(check_url(&loopback).is_ok_and(|u| u.loopback), "{loopback}");
        }
        let cases = [
            ("not a url".to_owned(), "NotUrl"),
            (format!("http://bot.example.com/{SECRET}"), "NotHttps"),
            (format!("http://10.0.0.1/{SECRET}"), "NotHttps"),
            (format!("ftp://bot.example.com/{SECRET}"), "NotHttps"),
            (
                format!("https://bot.example.com/{SECRET}?a=1"),
                "QueryOrFragment",
            ),
            (
                format!("https://bot.example.com/{SECRET}#x"),
                "QueryOrFragment",
            ),
            (format!("https://bot.example.com/%7B{SECRET}"), "PathChars"),
            (
                "https://bot.example.com/telegram".to_owned(),
                "ShortPathSecret",
            ),
            ("https://bot.example.com/".to_owned(), "ShortPathSecret"),
            (
                format!("https://bot.example.com/{SECRET}/"),
                "ShortPathSecret",
            ),
        ];
        for (url, expected) in cases {
            let kind = match check_url(&url) {
                Err(WebhookUrlError::NotUrl(_)) => "NotUrl",
                Err(WebhookUrlError::NotHttps) => "NotHttps",
                Err(WebhookUrlError::QueryOrFragment) => "QueryOrFragment",
                Err(WebhookUrlError::PathChars) => "PathChars",
                Err(WebhookUrlError::ShortPathSecret) => "ShortPathSecret",
                Ok(_) => "Ok",
            };
            assert_eq!(kind, expected, "{url}");
        }
    }

    #[test]
    fn a_secret_token_follows_telegrams_rule() {
        assert!(valid_secret_token("abc_DEF-123"));
        assert!(valid_secret_token(&"a".repeat(256)));
        assert!(!valid_secret_token(""));
        assert!(!valid_secret_token(&"a".repeat(257)));
        assert!(!valid_secret_token("no spaces"));
        assert!(!valid_secret_token("é"));
    }
}
