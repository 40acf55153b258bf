//! Black-box tests of `FakeAnthropic` through a real HTTP client: the wire shape of what it
//! streams and what it records.

// A failed unwrap in a test is the test failing.
#![allow(clippy::unwrap_used)]

use parlor_testkit::{AnthropicReply, FakeAnthropic};
use serde_json::{Value, json};

mod support;
use support::{WAIT, client};

async fn post(fake: &FakeAnthropic) -> reqwest::Response {
    client()
        .post(format!("{}/v1/messages", fake.base_url()))
        .header("x-api-key", "sk-ant-test")
        .header("anthropic-version", "2023-06-01")
        .json(&json!({
            "model": "claude-x",
            "max_tokens": 100,
            "stream": true,
            "system": [{"type": "text", "text": "S", "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        }))
        .send()
        .await
        .unwrap()
}

/// `(event name, data)` of every event of an SSE body.
fn events(sse: &str) -> Vec<(String, Value)> {
    sse.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let (name, data) = e.split_once('\n').unwrap();
            let name = name.strip_prefix("event: ").unwrap().to_owned();
            let data: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
            (name, data)
        })
        .collect()
}

#[tokio::test]
async fn a_tool_call_streams_its_input_in_pieces_and_the_request_is_recorded() {
    let fake = FakeAnthropic::start().await;
    fake.push(
        AnthropicReply::thinking("Think first.", "sig")
            .tool_use(
                "toolu_1",
                "get_weather",
                json!({"city": "Paris", "unit": "C"}),
            )
            .cache(100, 7),
    );
    let response = post(&fake).await;
    assert_eq!(
        response.headers()["content-type"],
        "text/event-stream",
        "{response:?}"
    );
    let events = events(&response.text().await.unwrap());
    for (name, data) in &events {
        assert_eq!(
            data["type"],
            json!(name),
            "the event line names the data's type"
        );
    }
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.first(), Some(&"message_start"));
    assert_eq!(names.last(), Some(&"message_stop"));
    let usage = &events[0].1["message"]["usage"];
    assert_eq!(usage["cache_read_input_tokens"], 100);
    assert_eq!(usage["cache_creation_input_tokens"], 7);
    let partial: Vec<&str> = events
        .iter()
        .filter(|(_, d)| d["delta"]["type"] == "input_json_delta")
        .map(|(_, d)| d["delta"]["partial_json"].as_str().unwrap())
        .collect();
    assert!(partial.len() > 1, "{partial:?}");
    assert_eq!(partial.concat(), r#"{"city":"Paris","unit":"C"}"#);
    assert!(
        events
            .iter()
            .any(|(_, d)| d["delta"] == json!({"type": "signature_delta", "signature": "sig"}))
    );
    let stop = events
        .iter()
        .find(|(n, _)| n == "message_delta")
        .map(|(_, d)| d["delta"]["stop_reason"].clone());
    assert_eq!(stop, Some(json!("tool_use")));

    let recorded = fake.wait_for_requests(1, WAIT).await.unwrap();
    assert_eq!(recorded[0].header("X-Api-Key"), Some("sk-ant-test"));
    assert_eq!(recorded[0].system()[0]["text"], "S");
    assert_eq!(recorded[0].cache_breakpoints(), ["/system/0"]);
    fake.shutdown().await;
}

#[tokio::test]
async fn statuses_errors_and_cuts_look_like_the_api() {
    let fake = FakeAnthropic::start().await;
    fake.push(AnthropicReply::overloaded().retry_after(3));
    fake.push(AnthropicReply::text("x").then_error("overloaded_error", "Overloaded"));
    fake.push(AnthropicReply::text("x").cut_before_stop());

    let response = post(&fake).await;
    assert_eq!(response.status().as_u16(), 529);
    assert_eq!(response.headers()["retry-after"], "3");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "overloaded_error");

    let events_ = events(&post(&fake).await.text().await.unwrap());
    let (name, data) = events_.last().unwrap();
    assert_eq!(name, "error");
    assert_eq!(
        data,
        &json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    );

    let events_ = events(&post(&fake).await.text().await.unwrap());
    assert_eq!(events_.last().unwrap().0, "message_delta");

    // Nothing scripted: the API's 500.
    let response = post(&fake).await;
    assert_eq!(response.status().as_u16(), 500);
    assert_eq!(fake.wait_for_requests(4, WAIT).await.unwrap().len(), 4);
    fake.shutdown().await;
}
