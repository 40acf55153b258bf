//! The failover chain on scripted backends: which errors move on to the next provider,
//! the model each provider is asked for, and the circuit breaker on paused time.

use std::sync::Arc;
use std::time::Duration;

use parlor_bot::llm::{ChatRequest, Completion, Failover, Link, LlmBackend, LlmError, Message};
use parlor_bot::testing::{ScriptedLlm, chat_request};
use tokio_util::sync::CancellationToken;

fn ok(text: &str) -> Result<Completion, LlmError> {
    Ok(Completion {
        content: text.into(),
        ..Completion::default()
    })
}

fn status(status: u16, body: &str) -> LlmError {
    LlmError::Status {
        status,
        body: body.to_owned(),
        retry_after: None,
    }
}

fn request() -> ChatRequest {
    chat_request("primary-model", vec![Message::user("hi")])
}

/// A chain of `primary` and one fallback that always answers `fallback`.
fn chain(primary: &Arc<ScriptedLlm>, fallback: &Arc<ScriptedLlm>) -> Failover {
    Failover::new(vec![
        Link {
            name: "primary-model".into(),
            model: None,
            llm: primary.clone(),
        },
        Link {
            name: "backup-model".into(),
            model: Some("backup-model".into()),
            llm: fallback.clone(),
        },
    ])
}

fn answering(text: &'static str) -> Arc<ScriptedLlm> {
    ScriptedLlm::answering(move |_, _| ok(text)).shared()
}

async fn ask(chain: &Failover) -> Result<Completion, LlmError> {
    chain.stream(&request(), &CancellationToken::new()).await
}

#[tokio::test]
async fn provider_failures_go_to_the_fallback_with_its_own_model() {
    for error in [
        status(500, "internal error"),
        status(
            529,
            r#"{"type":"error","error":{"type":"overloaded_error"}}"#,
        ),
        status(404, r#"{"error":{"code":"model_not_found"}}"#),
        status(429, "rate limited"),
        LlmError::Timeout(Duration::from_secs(60)),
    ] {
        let primary = ScriptedLlm::results(vec![Err(error)]).shared();
        let fallback = answering("from the fallback");
        let answer = ask(&chain(&primary, &fallback)).await.unwrap();
        assert_eq!(answer.content, "from the fallback");
        assert_eq!(primary.requests()[0].model, "primary-model");
        let asked = fallback.requests();
        assert_eq!(asked.len(), 1);
        assert_eq!(asked[0].model, "backup-model", "the fallback's own model");
        assert_eq!(asked[0].messages, request().messages);
    }
}

#[tokio::test]
async fn a_request_the_provider_refused_does_not_fail_over() {
    let primary = ScriptedLlm::results(vec![Err(status(
        400,
        r#"{"error":{"code":"context_length_exceeded"}}"#,
    ))])
    .shared();
    let fallback = answering("never");
    let refused = ask(&chain(&primary, &fallback)).await;
    assert!(
        matches!(refused, Err(LlmError::Status { status: 400, .. })),
        "{refused:?}"
    );
    assert!(fallback.requests().is_empty(), "the fallback was not asked");
}

#[tokio::test]
async fn the_last_error_is_returned_when_every_provider_fails() {
    let primary = ScriptedLlm::results(vec![Err(status(500, "down"))]).shared();
    let fallback = ScriptedLlm::results(vec![Err(status(503, "down too"))]).shared();
    let failed = ask(&chain(&primary, &fallback)).await;
    assert!(
        matches!(failed, Err(LlmError::Status { status: 503, .. })),
        "{failed:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn the_breaker_leaves_a_failing_provider_out_then_probes_it() {
    // Down for its first four requests, then up.
    let primary = ScriptedLlm::answering(|_, n| {
        if n <= 4 {
            Err(status(502, "bad gateway"))
        } else {
            ok("primary again")
        }
    })
    .shared();
    let fallback = answering("from the fallback");
    let chain = chain(&primary, &fallback);
    for _ in 0..3 {
        assert_eq!(ask(&chain).await.unwrap().content, "from the fallback");
    }
    assert_eq!(primary.requests().len(), 3);
    // Open: the next requests go straight to the fallback.
    assert_eq!(ask(&chain).await.unwrap().content, "from the fallback");
    assert_eq!(primary.requests().len(), 3, "left out while open");

    // After the open while, one request probes the primary; it fails, so the breaker
    // opens again, twice as long.
    tokio::time::advance(Duration::from_secs(30)).await;
    assert_eq!(ask(&chain).await.unwrap().content, "from the fallback");
    assert_eq!(primary.requests().len(), 4, "one probe");
    tokio::time::advance(Duration::from_secs(30)).await;
    ask(&chain).await.unwrap();
    assert_eq!(
        primary.requests().len(),
        4,
        "still open after a failed probe"
    );

    // The next probe succeeds: closed, the primary answers again.
    tokio::time::advance(Duration::from_secs(30)).await;
    assert_eq!(ask(&chain).await.unwrap().content, "primary again");
    assert_eq!(ask(&chain).await.unwrap().content, "primary again");
    assert_eq!(primary.requests().len(), 6);
}

#[tokio::test(start_paused = true)]
async fn with_every_provider_left_out_all_are_tried_anyway() {
    let primary = ScriptedLlm::answering(|_, n| {
        if n <= 3 {
            Err(status(500, "down"))
        } else {
            ok("primary")
        }
    })
    .shared();
    let fallback = ScriptedLlm::answering(|_, n| {
        if n <= 3 {
            Err(status(500, "down"))
        } else {
            ok("fallback")
        }
    })
    .shared();
    let chain = chain(&primary, &fallback);
    for _ in 0..3 {
        assert!(ask(&chain).await.is_err());
    }
    // Both open: silence is worse than a slow answer, so the primary is asked first again.
    assert_eq!(ask(&chain).await.unwrap().content, "primary");
}

#[tokio::test]
async fn a_cancelled_request_ends_the_chain() {
    let primary = ScriptedLlm::default().gated().shared();
    let fallback = answering("never");
    let chain = chain(&primary, &fallback);
    let cancel = CancellationToken::new();
    cancel.cancel();
    let result = chain.stream(&request(), &cancel).await;
    assert!(matches!(result, Err(LlmError::Cancelled)), "{result:?}");
    assert!(fallback.requests().is_empty());
}
