//! What the HTTP clients share: POSTing to the model's endpoint ([`Poster`]), reading a
//! response body under an idle timeout, turning a failed response or a transport failure
//! into an [`LlmError`], the server's requested wait, and keeping secrets out of every
//! message.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt, TryStreamExt};
use http_body::{Frame, SizeHint};
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use reqwest::header::HeaderMap;
use secrecy::{ExposeSecret, SecretString};

use super::LlmError;

/// POSTs request bodies to one endpoint, with fixed headers, over a pool of kept-alive
/// connections. hyper's client directly, which does per request only what a POST needs; when
/// a proxy is set in the environment (`HTTPS_PROXY` and the like, with `NO_PROXY`), reqwest,
/// which follows those variables.
pub(super) struct Poster {
    via: Via,
    url: String,
    /// Every header of a request: the client's own and the configured ones.
    headers: HeaderMap,
}

// One `Via` per client, for the process's life: its size does not matter.
#[allow(clippy::large_enum_variant)]
enum Via {
    Direct {
        client: HyperClient<hyper_rustls::HttpsConnector<HttpConnector>, Pieces>,
        uri: http::Uri,
    },
    Proxied(reqwest::Client),
}

impl std::fmt::Debug for Poster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let via = match self.via {
            Via::Direct { .. } => "direct",
            Via::Proxied(_) => "proxy",
        };
        f.debug_struct("Poster")
            .field("url", &self.url)
            .field("via", &via)
            .finish_non_exhaustive()
    }
}

impl Poster {
    /// A poster to `url` sending `headers` (marked sensitive where secret), `Accept:
    /// text/event-stream` and `Content-Type: application/json` with every request.
    ///
    /// # Errors
    /// [`LlmError::Connect`] when the TLS backend cannot be set up.
    pub(super) fn new(
        url: String,
        headers: HeaderMap,
        connect_timeout: Duration,
    ) -> Result<Poster, LlmError> {
        Self::build(url, headers, connect_timeout, crate::net::proxy_set())
    }

    /// [`Poster::new`], through reqwest when `proxied`.
    fn build(
        url: String,
        mut headers: HeaderMap,
        connect_timeout: Duration,
        proxied: bool,
    ) -> Result<Poster, LlmError> {
        use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderValue, USER_AGENT};
        headers.insert(ACCEPT, HeaderValue::from_static("text/event-stream"));
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(
            USER_AGENT,
            HeaderValue::from_static(concat!("parlor/", env!("CARGO_PKG_VERSION"))),
        );
        let uri = url
            .parse::<http::Uri>()
            .ok()
            .filter(|u| matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some());
        let via = match uri {
            Some(uri) if !proxied => {
                let mut http = HttpConnector::new();
                http.set_connect_timeout(Some(connect_timeout));
                http.set_nodelay(true);
                // The TLS layer below takes `https` URLs through this connector.
                http.enforce_http(false);
                let provider = Arc::new(rustls::crypto::ring::default_provider());
                let connector = hyper_rustls::HttpsConnectorBuilder::new()
                    .with_provider_and_webpki_roots(provider)
                    .map_err(|e| LlmError::Connect(format!("cannot set up TLS: {e}")))?
                    .https_or_http()
                    .enable_http1()
                    .wrap_connector(http);
                let client = HyperClient::builder(hyper_util::rt::TokioExecutor::new())
                    .pool_idle_timeout(crate::net::IDLE_CONNECTION_TIMEOUT)
                    .pool_max_idle_per_host(crate::net::IDLE_CONNECTIONS_PER_HOST)
                    .pool_timer(hyper_util::rt::TokioTimer::new())
                    .build(connector);
                Via::Direct { client, uri }
            }
            // A URL hyper cannot take is reqwest's to report, with its own words.
            _ => Via::Proxied(
                crate::net::pooled(reqwest::Client::builder())
                    .connect_timeout(connect_timeout)
                    .build()
                    .map_err(|e| LlmError::Connect(format!("cannot build the HTTP client: {e}")))?,
            ),
        };
        Ok(Poster { via, url, headers })
    }

    /// The URL requests go to.
    pub(super) fn url(&self) -> &str {
        &self.url
    }

    /// POSTs `body`; the answer once its head arrived.
    pub(super) async fn post(&self, body: impl Into<Pieces>) -> Result<Answer, SendError> {
        let body = body.into();
        match &self.via {
            Via::Direct { client, uri } => {
                let mut request = http::Request::new(body);
                *request.method_mut() = http::Method::POST;
                *request.uri_mut() = uri.clone();
                *request.headers_mut() = self.headers.clone();
                let response = client.request(request).await.map_err(SendError::Direct)?;
                let (head, body) = response.into_parts();
                Ok(Answer {
                    status: head.status,
                    headers: head.headers,
                    body: Box::pin(body.into_data_stream().map_err(BodyError::Direct)),
                })
            }
            Via::Proxied(client) => {
                let response = client
                    .post(&self.url)
                    .headers(self.headers.clone())
                    .body(body.to_vec())
                    .send()
                    .await
                    .map_err(SendError::Proxied)?;
                Ok(Answer::from(response))
            }
        }
    }
}

/// A request body in pieces, sent one after another with its whole length announced: the
/// parts written for this request, and the kept JSON it shares with other requests (the
/// system prompt, the tools), which is pointed at rather than copied into each body.
#[derive(Debug, Clone, Default)]
pub(crate) struct Pieces {
    parts: VecDeque<Bytes>,
    len: u64,
}

impl Pieces {
    /// Appends `piece`.
    pub(crate) fn push(&mut self, piece: Bytes) {
        if !piece.is_empty() {
            self.len += piece.len() as u64;
            self.parts.push_back(piece);
        }
    }

    /// The whole body in one buffer (for reqwest, and for tests).
    pub(crate) fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(usize::try_from(self.len).unwrap_or(0));
        for part in &self.parts {
            out.extend_from_slice(part);
        }
        out
    }
}

impl From<Vec<u8>> for Pieces {
    fn from(body: Vec<u8>) -> Self {
        let mut pieces = Pieces::default();
        pieces.push(Bytes::from(body));
        pieces
    }
}

impl http_body::Body for Pieces {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = &mut *self;
        Poll::Ready(this.parts.pop_front().map(|part| {
            this.len -= part.len() as u64;
            Ok(Frame::data(part))
        }))
    }

    fn is_end_stream(&self) -> bool {
        self.parts.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.len)
    }
}

/// A request that got no answer.
#[derive(Debug)]
pub(super) enum SendError {
    Direct(hyper_util::client::legacy::Error),
    Proxied(reqwest::Error),
}

impl From<reqwest::Error> for SendError {
    fn from(error: reqwest::Error) -> Self {
        SendError::Proxied(error)
    }
}

/// A body that broke off.
#[derive(Debug)]
pub(super) enum BodyError {
    Direct(hyper::Error),
    Proxied(reqwest::Error),
}

/// The pieces of a response body as they arrive.
pub(super) type BodyStream = Pin<Box<dyn Stream<Item = Result<Bytes, BodyError>> + Send>>;

/// A response whose head arrived.
pub(super) struct Answer {
    pub(super) status: http::StatusCode,
    pub(super) headers: HeaderMap,
    pub(super) body: BodyStream,
}

impl From<reqwest::Response> for Answer {
    fn from(response: reqwest::Response) -> Self {
        let status = response.status();
        let headers = response.headers().clone();
        Answer {
            status,
            headers,
            body: Box::pin(response.bytes_stream().map_err(BodyError::Proxied)),
        }
    }
}

impl Answer {
    /// Whether the body is JSON (`Content-Type: application/json`).
    pub(super) fn is_json(&self) -> bool {
        self.headers
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| {
                ct.trim_start()
                    .to_ascii_lowercase()
                    .starts_with("application/json")
            })
    }
}

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

    /// Maps a failure to send to [`LlmError::Timeout`] or [`LlmError::Connect`], with the
    /// whole cause chain (the clients' own message is often just "error sending request").
    pub(super) fn error(&self, error: impl Into<SendError>) -> LlmError {
        match error.into() {
            SendError::Proxied(error) => {
                let error = error.without_url();
                if error.is_timeout() {
                    return LlmError::Timeout(if error.is_connect() {
                        self.connect_timeout
                    } else {
                        self.request_timeout
                    });
                }
                LlmError::Connect(self.redact(&chain(&error)))
            }
            SendError::Direct(error) => {
                if error.is_connect() && timed_out(&error) {
                    return LlmError::Timeout(self.connect_timeout);
                }
                LlmError::Connect(self.redact(&chain(&error)))
            }
        }
    }

    /// A body that broke off after the response began: the answer is incomplete.
    fn body_error(&self, error: BodyError) -> LlmError {
        match error {
            BodyError::Proxied(error) => match self.error(error) {
                LlmError::Connect(why) => LlmError::Interrupted(why),
                other => other,
            },
            BodyError::Direct(error) if error.is_timeout() => {
                LlmError::Timeout(self.request_timeout)
            }
            BodyError::Direct(error) => LlmError::Interrupted(self.redact(&chain(&error))),
        }
    }

    /// The response body, failing with [`LlmError::Timeout`] when it falls silent for
    /// longer than `idle_timeout`; with `first`, its first piece waits that long instead.
    pub(super) fn body_stream(
        self: &Arc<Self>,
        body: BodyStream,
        first: Option<FirstPiece>,
    ) -> impl Stream<Item = Result<Bytes, LlmError>> + Send + use<> {
        let idle = self.idle_timeout;
        let transport = Arc::clone(self);
        let inner = body;
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
                    Ok(Some(Err(e))) => Some((Err(transport.body_error(e)), None)),
                }
            }
        })
    }

    /// [`LlmError::Status`] for a non-success response, with a bounded, redacted body.
    pub(super) async fn status_error(&self, answer: impl Into<Answer>) -> LlmError {
        let mut answer = answer.into();
        let status = answer.status.as_u16();
        let retry_after = retry_after(&answer.headers);
        let mut body = Vec::new();
        // A broken or slow error body still leaves the status, which is what matters.
        while body.len() < ERROR_BODY_BYTES {
            match tokio::time::timeout(self.idle_timeout, answer.body.next()).await {
                Ok(Some(Ok(piece))) => body.extend_from_slice(&piece),
                _ => break,
            }
        }
        let mut text = String::from_utf8_lossy(&body).into_owned();
        // Redirects are not followed (a POST's body would be lost or resent elsewhere): the
        // operator is told where the endpoint moved.
        if let Some(to) = answer
            .headers
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .filter(|_| answer.status.is_redirection())
        {
            text = format!("the endpoint moved to {to}: set the base URL to it. {text}");
        }
        let text = crate::text::clip_with(&text, ERROR_BODY_CHARS, |_| "… (truncated)".into());
        LlmError::Status {
            status,
            body: self.redact(text.trim()),
            retry_after,
        }
    }
}

/// `error` and its causes, `: `-separated.
fn chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

/// Whether a cause of `error` is an I/O timeout (the connect timeout of hyper's connector).
fn timed_out(error: &dyn std::error::Error) -> bool {
    let mut source = error.source();
    while let Some(cause) = source {
        if cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::TimedOut)
        {
            return true;
        }
        source = cause.source();
    }
    false
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

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use axum::http::HeaderMap as SeenHeaders;

    use super::*;

    fn transport() -> Transport {
        Transport {
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(2),
            secrets: Vec::new(),
        }
    }

    /// Both ways of posting send the same request and read the same answer; a body in
    /// pieces goes whole, with its length announced.
    #[tokio::test]
    async fn direct_and_proxied_posts_send_and_read_the_same() {
        let seen: Arc<Mutex<Vec<(SeenHeaders, Bytes)>>> = Arc::default();
        let record = Arc::clone(&seen);
        let app = axum::Router::new().route(
            "/v1/x",
            axum::routing::post(move |headers: SeenHeaders, body: Bytes| async move {
                record.lock().unwrap().push((headers, body));
                (
                    [("content-type", "application/json"), ("retry-after", "3")],
                    "{}",
                )
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let mut headers = HeaderMap::new();
        headers.insert("x-extra", reqwest::header::HeaderValue::from_static("yes"));
        for proxied in [false, true] {
            let poster = Poster::build(
                format!("http://{addr}/v1/x"),
                headers.clone(),
                Duration::from_secs(2),
                proxied,
            )
            .unwrap();
            let mut body = Pieces::default();
            for piece in ["{\"a\"", "", ":1", "}"] {
                body.push(Bytes::from_static(piece.as_bytes()));
            }
            let mut answer = poster.post(body).await.unwrap();
            assert_eq!(answer.status, http::StatusCode::OK);
            assert!(answer.is_json());
            assert_eq!(retry_after(&answer.headers), Some(Duration::from_secs(3)));
            let mut body = Vec::new();
            while let Some(piece) = answer.body.next().await {
                body.extend_from_slice(&piece.unwrap());
            }
            assert_eq!(body, b"{}");
        }
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 2);
        for (headers, body) in seen.iter() {
            assert_eq!(body.as_ref(), b"{\"a\":1}");
            assert_eq!(headers["x-extra"], "yes");
            assert_eq!(headers["accept"], "text/event-stream");
            assert_eq!(headers["content-type"], "application/json");
            assert_eq!(headers["content-length"], "7");
            assert!(headers.get("transfer-encoding").is_none());
            assert_eq!(headers["host"], addr.to_string());
            assert!(
                headers["user-agent"]
                    .to_str()
                    .unwrap()
                    .starts_with("parlor/")
            );
        }
    }

    #[tokio::test]
    async fn a_redirect_is_not_followed_and_says_where_the_endpoint_went() {
        let app = axum::Router::new().route(
            "/v1/x",
            axum::routing::post(|| async {
                (
                    axum::http::StatusCode::PERMANENT_REDIRECT,
                    [("location", "https://api.example.com/v1/x")],
                    "",
                )
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let transport = transport();
        // As if no proxy were set, whatever the environment holds.
        let poster = Poster::build(
            format!("http://{addr}/v1/x"),
            HeaderMap::new(),
            Duration::from_secs(2),
            false,
        )
        .unwrap();
        let answer = poster.post(Vec::new()).await.unwrap();
        match transport.status_error(answer).await {
            LlmError::Status { status, body, .. } => {
                assert_eq!(status, 308);
                assert!(
                    body.contains("moved to https://api.example.com/v1/x"),
                    "{body}"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    /// An `https` endpoint is spoken to in TLS: the server sees a ClientHello (a handshake
    /// record, then message type 1), and a server that hangs up is a connect error.
    #[tokio::test]
    async fn an_https_endpoint_gets_a_tls_handshake() {
        use tokio::io::AsyncReadExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut head = [0u8; 6];
            socket.read_exact(&mut head).await.unwrap();
            head
        });
        // As if no proxy were set, whatever the environment holds.
        let poster = Poster::build(
            format!("https://{addr}/v1/x"),
            HeaderMap::new(),
            Duration::from_secs(2),
            false,
        )
        .unwrap();
        assert!(matches!(poster.via, Via::Direct { .. }));
        let (head, posted) = tokio::join!(server, poster.post(Vec::new()));
        let head = head.unwrap();
        assert_eq!(head[0], 0x16, "a TLS handshake record: {head:?}");
        assert_eq!(head[5], 0x01, "a ClientHello: {head:?}");
        let Err(error) = posted else {
            panic!("the server hung up");
        };
        let transport = transport();
        assert!(matches!(transport.error(error), LlmError::Connect(_)));
    }

    #[tokio::test]
    async fn a_refused_connection_is_a_connect_error_either_way() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let transport = transport();
        for proxied in [false, true] {
            let poster = Poster::build(
                format!("http://{addr}/v1/x"),
                HeaderMap::new(),
                Duration::from_secs(2),
                proxied,
            )
            .unwrap();
            let Err(error) = poster.post(Vec::new()).await else {
                panic!("nothing listens there");
            };
            let error = transport.error(error);
            assert!(
                matches!(&error, LlmError::Connect(why) if why.contains("refused")),
                "{error:?}"
            );
        }
    }
}
