//! `OpenAiClient` (and `Retrying` around it) against a tiny axum server on 127.0.0.1:
//! what goes over the wire, status handling, retries, timeouts, cancellation.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Response, StatusCode};
use axum::routing::post;
use bytes::Bytes;
use futures::StreamExt;
use parlor_bot::llm::{
    ChatRequest, Completion, LlmBackend, LlmError, Message, OpenAiClient, OpenAiConfig,
    RetryPolicy, Retrying, ToolCall, ToolChoice, ToolDef,
};
use parlor_bot::testing::{WAIT_LIMIT, wait_until};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures");
const KEY: &str = "sk-test-0123456789abcdef";

/// What the fake server answers to one request.
enum Reply {
    /// 200 `text/event-stream` with this body.
    Sse(String),
    /// 200 `application/json` with this body.
    Json(String),
    /// This status, extra headers and body.
    Status(u16, Vec<(&'static str, String)>, String),
    /// 200 SSE: this first piece, then silence with the connection open.
    Stall(String),
    /// 200 SSE: a chunk every `Duration`, forever.
    Trickle(Duration),
    /// 200 SSE at once, then this body after `Duration` (a local model reading the prompt).
    Late(Duration, String),
}

#[derive(Clone, Default)]
struct Fake {
    replies: Arc<Mutex<VecDeque<Reply>>>,
    /// Headers and JSON body of every request received.
    requests: Arc<Mutex<Vec<(HeaderMap, Value)>>>,
}

impl Fake {
    fn hits(&self) -> usize {
        self.requests.lock().unwrap().len()
    }
}

const CHUNK: &str = r#"{"choices":[{"index":0,"delta":{"content":"tick "}}]}"#;

async fn chat(State(fake): State<Fake>, headers: HeaderMap, body: Bytes) -> Response<Body> {
    let json: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    fake.requests.lock().unwrap().push((headers, json));
    let reply = fake.replies.lock().unwrap().pop_front();
    let sse = |body: Body| {
        Response::builder()
            .header("content-type", "text/event-stream")
            .body(body)
            .unwrap()
    };
    match reply {
        Some(Reply::Sse(text)) => sse(Body::from(text)),
        Some(Reply::Json(text)) => Response::builder()
            .header("content-type", "application/json")
            .body(Body::from(text))
            .unwrap(),
        Some(Reply::Status(status, headers, text)) => {
            let mut response = Response::builder().status(status);
            for (name, value) in headers {
                response = response.header(name, value);
            }
            response.body(Body::from(text)).unwrap()
        }
        Some(Reply::Stall(first)) => sse(Body::from_stream(
            futures::stream::once(async move { Ok::<_, Infallible>(Bytes::from(first)) })
                .chain(futures::stream::pending()),
        )),
        Some(Reply::Trickle(every)) => sse(Body::from_stream(futures::stream::unfold(
            (),
            move |()| async move {
                tokio::time::sleep(every).await;
                Some((
                    Ok::<_, Infallible>(Bytes::from(format!("data: {CHUNK}\n\n"))),
                    (),
                ))
            },
        ))),
        Some(Reply::Late(after, text)) => {
            sse(Body::from_stream(futures::stream::once(async move {
                tokio::time::sleep(after).await;
                Ok::<_, Infallible>(Bytes::from(text))
            })))
        }
        None => Response::builder()
            .status(StatusCode::INTERNAL_SERVER_ERROR)
            .body(Body::from("script exhausted"))
            .unwrap(),
    }
}

async fn serve(replies: Vec<Reply>) -> (Fake, SocketAddr) {
    let fake = Fake::default();
    fake.replies.lock().unwrap().extend(replies);
    let app = Router::new()
        .route("/v1/chat/completions", post(chat))
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (fake, addr)
}

fn config(addr: SocketAddr) -> OpenAiConfig {
    OpenAiConfig {
        // The trailing slash must not produce `//chat/completions`.
        base_url: format!("http://{addr}/v1/"),
        api_key: Some(KEY.into()),
        request_timeout: Duration::from_secs(10),
        first_byte_timeout: Some(Duration::from_secs(5)),
        connect_timeout: Duration::from_secs(2),
        idle_timeout: Duration::from_secs(5),
        retry: RetryPolicy {
            max_retries: 3,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(4),
        },
        extra_headers: vec![("x-parlor-test".into(), "yes".into())],
    }
}

fn request() -> ChatRequest {
    ChatRequest {
        model: "gpt-4o-2024-08-06".into(),
        messages: vec![
            Message::system("Be brief."),
            Message::user("Weather in SF and AAPL price?"),
        ],
        tools: vec![ToolDef::function(
            "GetWeatherArgs",
            "Weather",
            json!({"type": "object", "properties": {"city": {"type": "string"}}}),
        )]
        .into(),
        tool_choice: Some(ToolChoice::Auto),
        parallel_tool_calls: Some(true),
        temperature: None,
        max_completion_tokens: None,
        prompt_cache_key: None,
    }
}

/// [`request`] to `client`, never cancelled.
async fn ask(client: &dyn LlmBackend) -> Result<Completion, LlmError> {
    client.stream(&request(), &CancellationToken::new()).await
}

/// A retrying client gets a completion from `replies` after `hits` requests.
async fn assert_retried_to_success(replies: Vec<Reply>, hits: usize) {
    let (fake, addr) = serve(replies).await;
    let client = OpenAiClient::with_retries(config(addr)).unwrap();
    let c = ask(&client).await.unwrap();
    assert!(!c.content.is_empty());
    assert_eq!(fake.hits(), hits);
}

fn recording(name: &str) -> String {
    std::fs::read_to_string(format!("{FIXTURES}/sse/openai-python/{name}")).unwrap()
}

fn hello_sse() -> String {
    recording("parse_nothing.e2aad469b71d.sse.txt")
}

#[tokio::test]
async fn a_streamed_completion_and_exactly_the_expected_request() {
    let sse = recording("parse_multiple_pydantic_tools_PARALLEL.f82268f2fefd.sse.txt");
    let (fake, addr) = serve(vec![Reply::Sse(sse)]).await;
    let client = OpenAiClient::new(config(addr)).unwrap();
    assert_eq!(
        client.endpoint(),
        format!("http://{addr}/v1/chat/completions")
    );
    let req = request();
    let c = client
        .stream(&req, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(c.tool_calls.len(), 2);
    assert_eq!(
        c.tool_calls[0],
        ToolCall::new(
            "call_JMW1whyEaYG438VE1OIflxA2",
            "GetWeatherArgs",
            r#"{"city": "Edinburgh", "country": "GB", "units": "c"}"#
        )
    );
    assert_eq!(c.tool_calls[1].function.name, "get_stock_price");
    assert_eq!(c.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(c.usage.map(|u| u.total_tokens), Some(209));

    let requests = fake.requests.lock().unwrap();
    assert_eq!(requests.len(), 1);
    let (headers, body) = &requests[0];
    assert_eq!(body, &OpenAiClient::request_body(&req));
    assert_eq!(body["stream"], json!(true));
    assert_eq!(headers["authorization"], format!("Bearer {KEY}"));
    assert_eq!(headers["accept"], "text/event-stream");
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(headers["x-parlor-test"], "yes");
}

#[tokio::test]
async fn no_key_means_no_authorization_header() {
    let (fake, addr) = serve(vec![Reply::Sse(hello_sse())]).await;
    let client = OpenAiClient::new(OpenAiConfig {
        api_key: None,
        ..config(addr)
    })
    .unwrap();
    let c = ask(&client).await.unwrap();
    assert!(c.content.contains("San Francisco"), "{c:?}");
    assert!(
        fake.requests.lock().unwrap()[0]
            .0
            .get("authorization")
            .is_none()
    );
}

#[tokio::test]
async fn a_400_is_a_status_error_and_not_retried() {
    let body = format!(
        r#"{{"error":{{"message":"Incorrect API key provided: {KEY}.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}}}"#
    );
    let (fake, addr) = serve(vec![Reply::Status(400, vec![], body)]).await;
    let client = OpenAiClient::with_retries(config(addr)).unwrap();
    let err = ask(&client).await.unwrap_err();
    match &err {
        LlmError::Status {
            status: 400,
            body,
            retry_after: None,
        } => {
            assert!(body.contains("Incorrect API key"), "{body}");
            assert!(!body.contains(KEY), "the key is redacted: {body}");
        }
        other => panic!("{other:?}"),
    }
    assert!(!err.to_string().contains(KEY));
    assert_eq!(fake.hits(), 1);
}

#[tokio::test]
async fn a_429_with_retry_after_zero_is_retried() {
    assert_retried_to_success(
        vec![
            Reply::Status(429, vec![("retry-after", "0".into())], "slow down".into()),
            Reply::Sse(hello_sse()),
        ],
        2,
    )
    .await;
}

#[tokio::test]
async fn two_500s_then_success() {
    assert_retried_to_success(
        vec![
            Reply::Status(500, vec![], "oops".into()),
            Reply::Status(502, vec![], "<html>bad gateway</html>".into()),
            Reply::Sse(hello_sse()),
        ],
        3,
    )
    .await;
}

#[tokio::test]
async fn retries_are_bounded_and_the_last_error_is_returned() {
    let replies = (0..10)
        .map(|i| Reply::Status(503, vec![], format!("down {i}")))
        .collect();
    let (fake, addr) = serve(replies).await;
    let client = OpenAiClient::with_retries(config(addr)).unwrap();
    let err = ask(&client).await.unwrap_err();
    assert!(
        matches!(&err, LlmError::Status { status: 503, body, .. } if body == "down 3"),
        "{err:?}"
    );
    assert_eq!(fake.hits(), 4);
}

#[tokio::test]
async fn retry_after_as_seconds_milliseconds_or_date() {
    let (_fake, addr) = serve(vec![
        Reply::Status(503, vec![("retry-after", "7".into())], String::new()),
        Reply::Status(
            429,
            vec![
                ("retry-after-ms", "1500".into()),
                ("retry-after", "2".into()),
            ],
            String::new(),
        ),
        Reply::Status(
            429,
            vec![("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT".into())],
            String::new(),
        ),
        Reply::Status(429, vec![("retry-after", "soon".into())], String::new()),
    ])
    .await;
    let client = OpenAiClient::new(config(addr)).unwrap();
    let mut got = Vec::new();
    for _ in 0..4 {
        match ask(&client).await.unwrap_err() {
            LlmError::Status { retry_after, .. } => got.push(retry_after),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        got,
        [
            Some(Duration::from_secs(7)),
            Some(Duration::from_millis(1500)),
            Some(Duration::ZERO), // a date in the past
            None,
        ]
    );
}

#[tokio::test]
async fn a_long_error_body_is_truncated() {
    let long = "x".repeat(100_000);
    let (_fake, addr) = serve(vec![Reply::Status(500, vec![], long)]).await;
    let client = OpenAiClient::new(config(addr)).unwrap();
    match ask(&client).await.unwrap_err() {
        LlmError::Status { body, .. } => {
            assert!(body.chars().count() < 2100, "{}", body.len());
            assert!(body.ends_with("(truncated)"));
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn connection_refused_is_a_connect_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let client = OpenAiClient::new(config(addr)).unwrap();
    let err = ask(&client).await.unwrap_err();
    assert!(matches!(err, LlmError::Connect(_)), "{err:?}");
    assert!(err.is_retryable());
}

#[tokio::test]
async fn a_stalled_stream_hits_the_idle_timeout() {
    let (_fake, addr) = serve(vec![Reply::Stall(format!("data: {CHUNK}\n\n"))]).await;
    let idle = Duration::from_millis(200);
    let client = OpenAiClient::new(OpenAiConfig {
        idle_timeout: idle,
        ..config(addr)
    })
    .unwrap();
    let started = Instant::now();
    let err = ask(&client).await.unwrap_err();
    assert!(matches!(err, LlmError::Timeout(d) if d == idle), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(err.is_retryable());
}

#[tokio::test]
async fn a_stream_that_never_ends_hits_the_request_timeout() {
    let (_fake, addr) = serve(vec![Reply::Trickle(Duration::from_millis(20))]).await;
    // The answer begins at once; the whole attempt may take the wait for its first byte
    // and then the request timeout.
    let first_byte = Duration::from_millis(100);
    let total = Duration::from_millis(300) + first_byte;
    let client = OpenAiClient::new(OpenAiConfig {
        request_timeout: Duration::from_millis(300),
        first_byte_timeout: Some(first_byte),
        idle_timeout: Duration::from_secs(5),
        ..config(addr)
    })
    .unwrap();
    let started = Instant::now();
    let err = ask(&client).await.unwrap_err();
    assert!(matches!(err, LlmError::Timeout(d) if d == total), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[tokio::test]
async fn cancelling_ends_the_request_at_once() {
    let (fake, addr) = serve(vec![Reply::Stall(format!("data: {CHUNK}\n\n"))]).await;
    let client = OpenAiClient::with_retries(config(addr)).unwrap();
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    // Cancelled once the request is at the server, which then keeps it open.
    tokio::spawn(async move {
        wait_until("the request reached the fake", WAIT_LIMIT, || {
            fake.hits() == 1
        })
        .await;
        trigger.cancel();
    });
    let started = Instant::now();
    let err = client.stream(&request(), &cancel).await.unwrap_err();
    assert!(matches!(err, LlmError::Cancelled), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(2));
    // Already cancelled: no request at all.
    let err = client.stream(&request(), &cancel).await.unwrap_err();
    assert!(matches!(err, LlmError::Cancelled), "{err:?}");
}

#[tokio::test]
async fn a_200_json_error_or_whole_completion_is_understood() {
    let (_fake, addr) = serve(vec![
        Reply::Json(r#"{"error":{"message":"model overloaded","type":"server_error"}}"#.into()),
        Reply::Json(
            r#"{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hi there"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}"#
                .into(),
        ),
        Reply::Json("<html>".into()),
    ])
    .await;
    let client = OpenAiClient::new(config(addr)).unwrap();
    let cancel = CancellationToken::new();
    let err = client.stream(&request(), &cancel).await.unwrap_err();
    assert!(
        matches!(&err, LlmError::Stream(m) if m == "model overloaded (type: server_error)"),
        "{err:?}"
    );
    let c = client.stream(&request(), &cancel).await.unwrap();
    assert_eq!(c.content, "Hi there");
    assert_eq!(c.usage.map(|u| u.total_tokens), Some(5));
    let err = client.stream(&request(), &cancel).await.unwrap_err();
    assert!(matches!(err, LlmError::Malformed(_)), "{err:?}");
}

#[tokio::test]
async fn an_error_event_mid_stream_is_not_retried() {
    let sse = format!("data: {CHUNK}\n\ndata: {{\"error\":{{\"message\":\"overloaded\"}}}}\n\n");
    let (fake, addr) = serve(vec![Reply::Sse(sse), Reply::Sse(hello_sse())]).await;
    let client = OpenAiClient::with_retries(config(addr)).unwrap();
    let err = ask(&client).await.unwrap_err();
    assert!(
        matches!(&err, LlmError::Stream(m) if m == "overloaded"),
        "{err:?}"
    );
    assert_eq!(fake.hits(), 1);
}

#[test]
fn debug_output_never_shows_secrets() {
    let config = OpenAiConfig {
        api_key: Some(KEY.into()),
        extra_headers: vec![("api-key".into(), "azure-secret-value".into())],
        ..OpenAiConfig::default()
    };
    let client = OpenAiClient::new(config.clone()).unwrap();
    let retrying: Retrying<OpenAiClient> = OpenAiClient::with_retries(config.clone()).unwrap();
    for text in [
        format!("{config:?}"),
        format!("{client:?}"),
        format!("{retrying:?}"),
    ] {
        assert!(!text.contains(KEY), "{text}");
        assert!(!text.contains("azure-secret-value"), "{text}");
        assert!(text.contains("[redacted]"), "{text}");
    }
}

#[test]
fn defaults_and_bad_configuration() {
    let d = OpenAiConfig::default();
    assert_eq!(d.base_url, "https://api.openai.com/v1");
    assert_eq!(d.request_timeout, Duration::from_secs(120));
    assert_eq!(d.connect_timeout, Duration::from_secs(10));
    assert_eq!(d.idle_timeout, Duration::from_secs(60));
    assert_eq!(
        d.retry,
        RetryPolicy {
            max_retries: 3,
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(30),
        }
    );
    for config in [
        OpenAiConfig {
            api_key: Some("sk-bad\nkey".into()),
            ..OpenAiConfig::default()
        },
        OpenAiConfig {
            extra_headers: vec![("bad header".into(), "v".into())],
            ..OpenAiConfig::default()
        },
    ] {
        let err = OpenAiClient::new(config).unwrap_err();
        assert!(!err.to_string().contains("sk-bad"), "{err}");
    }
}

/// A whole answer: one chunk, a finish reason, `[DONE]`.
fn whole_answer() -> String {
    format!(
        "data: {CHUNK}\n\ndata: {}\n\ndata: [DONE]\n\n",
        r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#
    )
}

#[tokio::test]
async fn a_local_server_reading_the_prompt_past_every_other_limit_is_waited_for_once() {
    // 127.0.0.1 is local: without a configured wait the first byte may take minutes.
    let (fake, addr) = serve(vec![Reply::Late(
        Duration::from_millis(800),
        whole_answer(),
    )])
    .await;
    let client = OpenAiClient::with_retries(OpenAiConfig {
        request_timeout: Duration::from_millis(200),
        first_byte_timeout: None,
        idle_timeout: Duration::from_millis(200),
        ..config(addr)
    })
    .unwrap();
    let answer = ask(&client).await.unwrap();
    assert_eq!(answer.content, "tick ");
    assert_eq!(fake.hits(), 1);
}

#[tokio::test]
async fn a_local_server_that_has_not_begun_is_not_asked_again() {
    let (fake, addr) = serve(vec![Reply::Late(Duration::from_secs(3600), whole_answer())]).await;
    let first_byte = Duration::from_millis(300);
    let client = OpenAiClient::with_retries(OpenAiConfig {
        first_byte_timeout: Some(first_byte),
        ..config(addr)
    })
    .unwrap();
    let err = ask(&client).await.unwrap_err();
    assert!(
        matches!(err, LlmError::NoAnswerYet(d) if d == first_byte),
        "{err:?}"
    );
    assert_eq!(
        fake.hits(),
        1,
        "a second request would start its reading over"
    );
}
