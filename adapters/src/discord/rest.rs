//! Discord REST calls with parlor's own pacing and retries.
//!
//! serenity's `Http` is not used for REST: with a proxy (`api_url`) its rate limiter must be
//! off, and its error for a 429 keeps only the status and Discord's `code`/`message` (the
//! `retry_after` of the body and the `Retry-After` header are dropped). So requests go through
//! reqwest here, to `{base}/api/v10{path}` with `Authorization: Bot {token}`; [`classify`]
//! maps each answer to a [`Failure`] for the adapters' shared
//! [`with_retries`](crate::common::with_retries): a 429's `retry_after` is honoured, network
//! trouble and 5xx are retried with backoff, other answers map to [`PlatformError`].

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use parlor_bot::backoff::Backoff;
use parlor_bot::platform::PlatformError;
use parlor_bot::ratelimit::SlidingWindow;
use reqwest::{Method, StatusCode};
use secrecy::{ExposeSecret, SecretString};
use serde_json::Value;
use tokio::time::Instant;

use crate::common::{Failure, Token};

/// Waits between transient failures of one call: short, since a turn waits for the answer.
pub(crate) const REST_BACKOFF: Backoff = Backoff {
    initial: Duration::from_millis(500),
    max: Duration::from_secs(10),
};

/// A REST client for one bot: base URL, token, reqwest client.
pub(crate) struct Rest {
    client: reqwest::Client,
    /// `https://discord.com` or the configured `api_url`, without a trailing slash.
    base: String,
    /// `Bot {token}`.
    authorization: SecretString,
    token: Token,
}

impl Rest {
    pub(crate) fn new(base: &str, token: Token) -> Result<Rest, PlatformError> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| {
                PlatformError::Unavailable(format!("cannot build the HTTP client: {e}"))
            })?;
        Ok(Rest {
            client,
            base: base.trim().trim_end_matches('/').to_owned(),
            authorization: format!("Bot {}", token.expose()).into(),
            token,
        })
    }

    pub(crate) fn base(&self) -> &str {
        &self.base
    }

    pub(crate) fn client(&self) -> &reqwest::Client {
        &self.client
    }

    pub(crate) fn token(&self) -> &Token {
        &self.token
    }

    /// One attempt: `method {base}/api/v10{path}` with an optional JSON body. `Ok` carries
    /// the JSON answer (`Null` for an empty one).
    pub(crate) async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, Failure> {
        let url = format!("{}/api/v10{path}", self.base);
        let mut request = self
            .client
            .request(method, &url)
            .header("authorization", self.authorization.expose_secret())
            .header(
                "user-agent",
                concat!(
                    "DiscordBot (https://github.com/parlor, ",
                    env!("CARGO_PKG_VERSION"),
                    ")"
                ),
            );
        request = match body {
            Some(body) => request.json(body),
            None => request.header("content-length", "0"),
        };
        let response = request
            .send()
            .await
            .map_err(|e| Failure::Transient(self.token.describe(&e)))?;
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response
            .bytes()
            .await
            .map_err(|e| Failure::Transient(self.token.describe(&e)))?;
        let json: Value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or_else(|_| {
                Value::String(String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned())
            })
        };
        if status.is_success() {
            return Ok(json);
        }
        Err(classify(status, &headers, &json, path))
    }
}

/// Maps an unsuccessful answer to what to do about it.
pub(crate) fn classify(
    status: StatusCode,
    headers: &reqwest::header::HeaderMap,
    body: &Value,
    path: &str,
) -> Failure {
    let message = match body {
        Value::Object(map) => {
            let text = map.get("message").and_then(Value::as_str).unwrap_or("");
            match map.get("code").and_then(Value::as_u64) {
                Some(code) if code != 0 => format!("{text} (code {code})"),
                _ => text.to_owned(),
            }
        }
        Value::String(text) => text.clone(),
        _ => String::new(),
    };
    let message = format!("{path}: {} {message}", status.as_u16());
    match status.as_u16() {
        429 => Failure::RetryAfter(retry_after(headers, body)),
        401 => Failure::Fatal(PlatformError::Unauthorized),
        403 => Failure::Fatal(PlatformError::Refused(message)),
        404 => Failure::Fatal(PlatformError::NotFound(message)),
        500..=599 => Failure::Transient(message),
        _ => Failure::Fatal(PlatformError::Refused(message)),
    }
}

/// A 429's wait: the body's `retry_after` (seconds, fractional), else the
/// `X-RateLimit-Reset-After` or `Retry-After` header, else one second.
pub(crate) fn retry_after(headers: &reqwest::header::HeaderMap, body: &Value) -> Duration {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    let secs = body
        .get("retry_after")
        .and_then(Value::as_f64)
        .or_else(|| header("x-ratelimit-reset-after"))
        .or_else(|| header("retry-after"))
        .filter(|s| s.is_finite() && *s >= 0.0)
        .unwrap_or(1.0);
    Duration::from_secs_f64(secs.min(3600.0))
}

/// At most `max` sends per `window` per channel: parlor's own pacing, since serenity's limiter
/// is off.
pub(crate) struct SendLimiter {
    max: usize,
    window: Duration,
    sent: Mutex<HashMap<u64, SlidingWindow>>,
}

impl SendLimiter {
    pub(crate) fn new(max: usize, window: Duration) -> Self {
        SendLimiter {
            max: max.max(1),
            window,
            sent: Mutex::new(HashMap::new()),
        }
    }

    /// Waits until `channel` may send, and takes the slot.
    pub(crate) async fn acquire(&self, channel: u64) {
        loop {
            let wait = {
                let mut sent = self.sent.lock().unwrap_or_else(|e| e.into_inner());
                let now = Instant::now();
                // Forget quiet channels so the map stays small.
                if sent.len() > 1024 {
                    sent.retain(|_, times| {
                        times
                            .last()
                            .is_some_and(|t| now.duration_since(t) < self.window)
                    });
                }
                match sent
                    .entry(channel)
                    .or_default()
                    .try_take(now, self.max, self.window)
                {
                    Ok(()) => return,
                    Err(wait) => wait,
                }
            };
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use reqwest::header::{HeaderMap, HeaderValue};
    use serde_json::json;

    use super::*;

    #[test]
    fn retry_after_prefers_the_body() {
        let mut headers = HeaderMap::new();
        headers.insert("retry-after", HeaderValue::from_static("3"));
        assert_eq!(
            retry_after(&headers, &json!({"retry_after": 0.25})),
            Duration::from_millis(250)
        );
        assert_eq!(retry_after(&headers, &json!({})), Duration::from_secs(3));
        assert_eq!(
            retry_after(&HeaderMap::new(), &Value::Null),
            Duration::from_secs(1)
        );
    }

    #[test]
    fn statuses_map_to_platform_errors() {
        let headers = HeaderMap::new();
        let body = json!({"message": "Unknown Channel", "code": 10003});
        assert!(matches!(
            classify(StatusCode::NOT_FOUND, &headers, &body, "/x"),
            Failure::Fatal(PlatformError::NotFound(m)) if m.contains("Unknown Channel")
        ));
        assert!(matches!(
            classify(StatusCode::UNAUTHORIZED, &headers, &body, "/x"),
            Failure::Fatal(PlatformError::Unauthorized)
        ));
        assert!(matches!(
            classify(StatusCode::BAD_GATEWAY, &headers, &body, "/x"),
            Failure::Transient(_)
        ));
        assert!(matches!(
            classify(StatusCode::BAD_REQUEST, &headers, &body, "/x"),
            Failure::Fatal(PlatformError::Refused(_))
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn the_limiter_paces_a_channel_and_not_others() {
        let limiter = SendLimiter::new(2, Duration::from_secs(5));
        let start = Instant::now();
        limiter.acquire(1).await;
        limiter.acquire(1).await;
        limiter.acquire(2).await;
        assert_eq!(start.elapsed(), Duration::ZERO);
        limiter.acquire(1).await;
        assert_eq!(start.elapsed(), Duration::from_secs(5));
    }
}
