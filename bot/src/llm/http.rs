//! What the HTTP clients share: reading a response body under an idle timeout, turning a
//! failed response or a transport failure into an [`LlmError`], the server's requested wait,
//! and keeping secrets out of every message.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use reqwest::header::HeaderMap;
use secrecy::{ExposeSecret, SecretString};

use super::LlmError;

/// Adds `Authorization: Bearer KEY` to `headers` when `key` is set and not empty, marked
/// sensitive (never logged).
pub(super) fn bearer(headers: &mut HeaderMap, key: Option<&SecretString>) -> Result<(), LlmError> {
    let Some(key) = key
        .map(ExposeSecret::expose_secret)
        .filter(|k| !k.is_empty())
    else {
        return Ok(());
    };
    let mut value =
        reqwest::header::HeaderValue::from_str(&format!("Bearer {key}")).map_err(|_| {
            LlmError::Connect("the API key contains characters not allowed in a header".into())
        })?;
    value.set_sensitive(true);
    headers.insert(reqwest::header::AUTHORIZATION, value);
    Ok(())
}

/// How many characters of an error body are kept: enough for the provider's explanation,
/// not a whole HTML error page.
const ERROR_BODY_CHARS: usize = 2000;

/// How many bytes of an error body are read at most before giving up on the rest.
const ERROR_BODY_BYTES: usize = 64 * 1024;

/// A client's timeouts and secrets, shared with every body stream in flight (which needs
/// them to describe its errors).
/// How long a body's first piece may take, and the error it is when it does not come
/// (the OpenAI client's first-token limit).
pub(super) struct FirstPiece {
    /// The wait for the first piece.
    pub(super) limit: Duration,
    /// The error a timeout is, given `reported`.
    pub(super) error: fn(Duration) -> LlmError,
    /// The limit the error names (the whole first-byte limit).
    pub(super) reported: Duration,
}

pub(super) struct Transport {
    /// Reported for a timeout while connecting.
    pub(super) connect_timeout: Duration,
    /// Reported for any other timeout reqwest notices.
    pub(super) request_timeout: Duration,
    /// Longest silence tolerated between two pieces of a body.
    pub(super) idle_timeout: Duration,
    /// Keys and header values that must never reach a log line.
    pub(super) secrets: Vec<SecretString>,
}

impl Transport {
    /// Servers sometimes quote the key they refused; it must not reach the log.
    pub(super) fn redact(&self, text: &str) -> String {
        let mut text = text.to_owned();
        for secret in self
            .secrets
            .iter()
            .map(ExposeSecret::expose_secret)
            .filter(|s| s.len() >= 8)
        {
            text = text.replace(secret, "[redacted]");
        }
        text
    }

    /// Maps a reqwest failure to [`LlmError::Timeout`] or [`LlmError::Connect`], with the
    /// whole cause chain (reqwest's own message is often just "error sending request").
    pub(super) fn error(&self, error: reqwest::Error) -> LlmError {
        let error = error.without_url();
        if error.is_timeout() {
            return LlmError::Timeout(if error.is_connect() {
                self.connect_timeout
            } else {
                self.request_timeout
            });
        }
        let mut message = error.to_string();
        let mut source = std::error::Error::source(&error);
        while let Some(cause) = source {
            message.push_str(": ");
            message.push_str(&cause.to_string());
            source = cause.source();
        }
        LlmError::Connect(self.redact(&message))
    }

    /// The response body, failing with [`LlmError::Timeout`] when it falls silent for
    /// longer than `idle_timeout`; with `first`, its first piece waits that long instead.
    pub(super) fn body_stream(
        self: &Arc<Self>,
        response: reqwest::Response,
        first: Option<FirstPiece>,
    ) -> impl Stream<Item = Result<Bytes, LlmError>> + Send + use<> {
        let idle = self.idle_timeout;
        let transport = Arc::clone(self);
        let inner = Box::pin(response.bytes_stream());
        futures::stream::unfold(Some((inner, first)), move |state| {
            let transport = Arc::clone(&transport);
            async move {
                let (mut inner, first) = state?;
                let limit = first.as_ref().map_or(idle, |f| f.limit);
                match tokio::time::timeout(limit, inner.next()).await {
                    Err(_elapsed) => {
                        let error = match &first {
                            Some(f) => (f.error)(f.reported),
                            None => LlmError::Timeout(idle),
                        };
                        Some((Err(error), None))
                    }
                    Ok(None) => None,
                    Ok(Some(Ok(bytes))) => Some((Ok(bytes), Some((inner, None)))),
                    // The response had begun: whatever broke, the answer is incomplete.
                    Ok(Some(Err(e))) => {
                        let error = match transport.error(e) {
                            LlmError::Connect(why) => LlmError::Interrupted(why),
                            other => other,
                        };
                        Some((Err(error), None))
                    }
                }
            }
        })
    }

    /// [`LlmError::Status`] for a non-success response, with a bounded, redacted body.
    pub(super) async fn status_error(&self, mut response: reqwest::Response) -> LlmError {
        let status = response.status().as_u16();
        let retry_after = retry_after(response.headers());
        let mut body = Vec::new();
        // A broken or slow error body still leaves the status, which is what matters.
        while body.len() < ERROR_BODY_BYTES {
            match tokio::time::timeout(self.idle_timeout, response.chunk()).await {
                Ok(Ok(Some(piece))) => body.extend_from_slice(&piece),
                _ => break,
            }
        }
        let text = String::from_utf8_lossy(&body);
        let text = crate::text::clip_with(&text, ERROR_BODY_CHARS, |_| "… (truncated)".into());
        LlmError::Status {
            status,
            body: self.redact(text.trim()),
            retry_after,
        }
    }
}

/// The wait a server asked for: `retry-after-ms` (OpenAI, Azure), else `Retry-After` as
/// seconds or as an HTTP date.
pub(super) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let get = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    let seconds = |s: f64| Duration::try_from_secs_f64(s).ok();
    if let Some(ms) = get("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        return seconds(ms / 1000.0);
    }
    let value = get("retry-after")?;
    if let Ok(secs) = value.parse::<f64>() {
        return seconds(secs);
    }
    let date = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    // The server's date is real wall time, so it is compared with the real clock; only the
    // seconds forms are tested, and they read no clock.
    let wait = date.with_timezone(&chrono::Utc) - chrono::Utc::now();
    Some(wait.to_std().unwrap_or(Duration::ZERO))
}
