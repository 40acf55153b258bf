//! The `Retrying` decorator on paused time, around a scripted in-memory backend (which
//! records when it was called).

use std::time::Duration;

use parlor_bot::llm::{
    ChatRequest, Completion, LlmBackend, LlmError, Message, RetryPolicy, Retrying,
};
use parlor_bot::testing::{ScriptedLlm, chat_request};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

fn ok() -> Result<Completion, LlmError> {
    Ok(Completion {
        content: "done".into(),
        ..Completion::default()
    })
}

fn status(status: u16, retry_after: Option<Duration>) -> Result<Completion, LlmError> {
    Err(LlmError::Status {
        status,
        body: format!("status {status}"),
        retry_after,
    })
}

fn request() -> ChatRequest {
    chat_request("m", vec![Message::user("hi")])
}

fn policy() -> RetryPolicy {
    RetryPolicy {
        max_retries: 3,
        initial_backoff: Duration::from_secs(1),
        max_backoff: Duration::from_secs(30),
    }
}

async fn run(backend: &Retrying<ScriptedLlm>) -> (Result<Completion, LlmError>, Duration) {
    let started = Instant::now();
    let result = backend.stream(&request(), &CancellationToken::new()).await;
    (result, started.elapsed())
}

#[tokio::test(start_paused = true)]
async fn retry_after_is_honoured_instead_of_the_backoff() {
    let backend = Retrying::new(
        ScriptedLlm::results(vec![status(429, Some(Duration::from_secs(7))), ok()]),
        policy(),
    );
    let (result, elapsed) = run(&backend).await;
    assert_eq!(result.unwrap().content, "done");
    assert!(elapsed >= Duration::from_secs(7), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(8), "{elapsed:?}");
    assert_eq!(backend.inner().request_times().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn an_absurd_retry_after_is_capped() {
    let backend = Retrying::new(
        ScriptedLlm::results(vec![status(503, Some(Duration::from_secs(86_400))), ok()]),
        policy(),
    );
    let (result, elapsed) = run(&backend).await;
    assert!(result.is_ok());
    assert_eq!(elapsed, RetryPolicy::MAX_RETRY_AFTER);
}

#[tokio::test(start_paused = true)]
async fn server_errors_back_off_exponentially_with_jitter() {
    let backend = Retrying::new(
        ScriptedLlm::results(vec![
            status(500, None),
            Err(LlmError::Timeout(Duration::from_secs(60))),
            Err(LlmError::Connect("reset".into())),
            ok(),
        ]),
        policy(),
    );
    let (result, _) = run(&backend).await;
    assert!(result.is_ok());
    let calls = backend.inner().request_times();
    assert_eq!(calls.len(), 4);
    // Retry n waits within [cap/2, cap], cap = 1s * 2^n.
    for (n, pair) in calls.windows(2).enumerate() {
        let gap = pair[1] - pair[0];
        let cap = Duration::from_secs(1 << n);
        assert!(gap >= cap / 2 && gap <= cap, "retry {n}: waited {gap:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn the_backoff_is_capped_at_max_backoff() {
    let policy = RetryPolicy {
        max_retries: 8,
        initial_backoff: Duration::from_secs(1),
        max_backoff: Duration::from_secs(5),
    };
    for n in 0..40 {
        let d = policy.backoff(n);
        let cap = Duration::from_secs(1u64 << n.min(20)).min(Duration::from_secs(5));
        assert!(d >= cap / 2 && d <= cap, "backoff({n}) = {d:?}");
    }
    // Jitter: not every wait the same.
    let waits: std::collections::BTreeSet<_> = (0..20).map(|_| policy.backoff(3)).collect();
    assert!(waits.len() > 1);
}

#[tokio::test(start_paused = true)]
async fn a_401_is_returned_at_once() {
    let backend = Retrying::new(
        ScriptedLlm::results(vec![status(401, None), ok()]),
        policy(),
    );
    let (result, elapsed) = run(&backend).await;
    assert!(
        matches!(result, Err(LlmError::Status { status: 401, .. })),
        "{result:?}"
    );
    assert_eq!(elapsed, Duration::ZERO);
    assert_eq!(backend.inner().request_times().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn malformed_and_stream_errors_are_not_retried() {
    for err in [
        LlmError::Malformed("x".into()),
        LlmError::Stream("overloaded".into()),
        LlmError::Cancelled,
    ] {
        let backend = Retrying::new(ScriptedLlm::results(vec![Err(err), ok()]), policy());
        assert!(run(&backend).await.0.is_err());
        assert_eq!(backend.inner().request_times().len(), 1);
    }
}

#[tokio::test(start_paused = true)]
async fn exhausted_retries_return_the_last_error() {
    let backend = Retrying::new(
        ScriptedLlm::results(vec![
            status(500, None),
            status(502, None),
            status(503, None),
            status(504, None),
            ok(),
        ]),
        policy(),
    );
    let (result, elapsed) = run(&backend).await;
    assert!(
        matches!(result, Err(LlmError::Status { status: 504, .. })),
        "{result:?}"
    );
    assert_eq!(backend.inner().request_times().len(), 4);
    // 1 + 2 + 4 seconds at most, half of that at least.
    assert!(elapsed >= Duration::from_millis(3500) && elapsed <= Duration::from_secs(7));
}

#[tokio::test(start_paused = true)]
async fn zero_retries_means_one_attempt() {
    let backend = Retrying::new(
        ScriptedLlm::results(vec![status(500, None), ok()]),
        RetryPolicy {
            max_retries: 0,
            ..policy()
        },
    );
    assert!(run(&backend).await.0.is_err());
    assert_eq!(backend.inner().request_times().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn cancelling_during_a_wait_returns_cancelled_promptly() {
    let backend = Retrying::new(
        ScriptedLlm::results(vec![status(429, Some(Duration::from_secs(60))), ok()]),
        policy(),
    );
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        trigger.cancel();
    });
    let started = Instant::now();
    let result = backend.stream(&request(), &cancel).await;
    assert!(matches!(result, Err(LlmError::Cancelled)), "{result:?}");
    assert_eq!(started.elapsed(), Duration::from_secs(1));
    assert_eq!(backend.inner().request_times().len(), 1);
}
