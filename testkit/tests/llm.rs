//! Black-box tests of `FakeLlm` through a real HTTP client.

// A failed unwrap in a test is the test failing.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use parlor_testkit::{FakeLlm, Reply, ToolCallSpec};
use serde_json::{Value, json};

mod support;
use support::{WAIT, client};

fn stream_body(user: &str) -> Value {
    json!({
        "model": "test-model",
        "stream": true,
        "stream_options": {"include_usage": true},
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": user},
        ],
    })
}

async fn post(fake: &FakeLlm, body: &Value) -> reqwest::Response {
    client()
        .post(format!("{}/chat/completions", fake.base_url()))
        .bearer_auth("sk-test")
        .json(body)
        .send()
        .await
        .expect("request to fake llm")
}

/// The whole SSE body answering a streamed chat turn from `user`.
async fn stream_turn(fake: &FakeLlm, user: &str) -> String {
    post(fake, &stream_body(user))
        .await
        .text()
        .await
        .expect("body")
}

/// The `data:` payloads of an SSE body, in order.
fn data_events(sse: &str) -> Vec<String> {
    sse.split("\n\n")
        .filter_map(|event| event.strip_prefix("data: "))
        .map(str::to_owned)
        .collect()
}

#[derive(Debug, Default, PartialEq)]
struct Call {
    id: String,
    name: String,
    args: String,
}

#[derive(Debug, Default)]
struct Assembled {
    content: String,
    calls: BTreeMap<u64, Call>,
    finish_reason: Option<String>,
    usage: Option<Value>,
    done: bool,
    chunks: usize,
    models: Vec<String>,
}

fn assemble(sse: &str) -> Assembled {
    let mut out = Assembled::default();
    for data in data_events(sse) {
        assert!(!out.done, "data after [DONE]: {data}");
        if data == "[DONE]" {
            out.done = true;
            continue;
        }
        let chunk: Value = serde_json::from_str(&data).expect("chunk is JSON");
        assert_eq!(chunk["object"], "chat.completion.chunk");
        out.models
            .push(chunk["model"].as_str().unwrap_or_default().to_owned());
        if let Some(usage) = chunk.get("usage").filter(|u| !u.is_null()) {
            assert_eq!(chunk["choices"], json!([]));
            out.usage = Some(usage.clone());
            continue;
        }
        out.chunks += 1;
        let choice = &chunk["choices"][0];
        if let Some(reason) = choice["finish_reason"].as_str() {
            out.finish_reason = Some(reason.to_owned());
        }
        let delta = &choice["delta"];
        if let Some(text) = delta["content"].as_str() {
            out.content.push_str(text);
        }
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            let index = call["index"].as_u64().expect("tool call index");
            let entry = out.calls.entry(index).or_default();
            if let Some(id) = call["id"].as_str() {
                entry.id = id.to_owned();
            }
            if let Some(name) = call["function"]["name"].as_str() {
                entry.name.push_str(name);
            }
            if let Some(args) = call["function"]["arguments"].as_str() {
                entry.args.push_str(args);
            }
        }
    }
    out
}

#[tokio::test]
async fn text_reply_streams_and_reassembles() {
    let fake = FakeLlm::start().await;
    fake.push(Reply::text("hello there, world").usage(42, 7));

    let resp = post(&fake, &stream_body("hi")).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["content-type"].to_str().ok(),
        Some("text/event-stream")
    );
    let sse = resp.text().await.expect("body");
    assert!(sse.ends_with("data: [DONE]\n\n"), "{sse}");
    let got = assemble(&sse);
    assert_eq!(got.content, "hello there, world");
    assert!(got.chunks >= 3, "text should come in several chunks: {sse}");
    assert_eq!(got.finish_reason.as_deref(), Some("stop"));
    assert_eq!(
        got.usage,
        Some(json!({"prompt_tokens": 42, "completion_tokens": 7, "total_tokens": 49}))
    );
    assert!(got.done);
    assert!(got.models.iter().all(|m| m == "test-model"));
    // The first delta carries the role.
    let first: Value = serde_json::from_str(&data_events(&sse)[0]).expect("json");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
}

#[tokio::test]
async fn usage_chunk_only_when_requested() {
    let fake = FakeLlm::start().await;
    fake.push_text("ok");
    let mut body = stream_body("hi");
    body.as_object_mut()
        .expect("object")
        .remove("stream_options");
    let sse = post(&fake, &body).await.text().await.expect("body");
    let got = assemble(&sse);
    assert_eq!(got.content, "ok");
    assert_eq!(got.usage, None);
    assert!(got.done);
}

#[tokio::test]
async fn tool_call_arguments_reassemble() {
    let fake = FakeLlm::start().await;
    let args1 = json!({"items": [{"title": "buy milk", "done": false}], "note": "ünïcödé"});
    let args2 = json!({});
    fake.push(Reply::tool_calls(vec![
        ToolCallSpec::new("call_1", "todo_list", args1.clone()),
        ToolCallSpec::new("call_2", "clock", args2.clone()),
    ]));

    let sse = stream_turn(&fake, "todo?").await;
    let got = assemble(&sse);
    assert_eq!(got.content, "");
    assert_eq!(got.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(got.calls.len(), 2);
    assert_eq!(got.calls[&0].id, "call_1");
    assert_eq!(got.calls[&0].name, "todo_list");
    let parsed: Value = serde_json::from_str(&got.calls[&0].args).expect("args JSON");
    assert_eq!(parsed, args1);
    assert_eq!(got.calls[&1].name, "clock");
    let parsed: Value = serde_json::from_str(&got.calls[&1].args).expect("args JSON");
    assert_eq!(parsed, args2);
    // Arguments of the first call were split across several deltas.
    let arg_deltas = data_events(&sse)
        .iter()
        .filter(|d| d.contains("\"arguments\":\"") && !d.contains("\"arguments\":\"\""))
        .count();
    assert!(arg_deltas >= 3, "{sse}");
}

#[tokio::test]
async fn text_and_tools_and_push_tool_call() {
    let fake = FakeLlm::start().await;
    fake.push(Reply::text_and_tools(
        "let me check",
        vec![ToolCallSpec::new("c1", "search", json!({"q": "rust"}))],
    ));
    fake.push_tool_call("c2", "todo_list", json!({"op": "list"}));

    let got = assemble(&stream_turn(&fake, "a").await);
    assert_eq!(got.content, "let me check");
    assert_eq!(got.calls[&0].name, "search");
    assert_eq!(got.finish_reason.as_deref(), Some("tool_calls"));

    let got = assemble(&stream_turn(&fake, "b").await);
    assert_eq!(got.calls[&0].id, "c2");
    assert_eq!(
        serde_json::from_str::<Value>(&got.calls[&0].args).expect("json"),
        json!({"op": "list"})
    );
    assert_eq!(fake.pending_replies(), 0);
}

#[tokio::test]
async fn status_reply_gives_429_with_retry_after() {
    let fake = FakeLlm::start().await;
    fake.push(
        Reply::status(429)
            .retry_after(7)
            .body(json!({"error": {"message": "slow down", "type": "rate_limit"}})),
    );
    let resp = post(&fake, &stream_body("hi")).await;
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers()["retry-after"].to_str().ok(), Some("7"));
    let body: Value = resp.json().await.expect("json body");
    assert_eq!(body["error"]["message"], "slow down");
}

#[tokio::test]
async fn empty_script_gives_500_and_is_recorded() {
    let fake = FakeLlm::start().await;
    let resp = post(&fake, &stream_body("anyone?")).await;
    assert_eq!(resp.status(), 500);
    let body: Value = resp.json().await.expect("json body");
    assert_eq!(body["error"]["message"], "fake llm: no scripted reply left");
    assert_eq!(fake.request_count(), 1);
}

#[tokio::test]
async fn requests_are_recorded_on_both_paths() {
    let fake = FakeLlm::start().await;
    fake.push_text("one");
    fake.push_text("two");
    let _ = post(&fake, &stream_body("first")).await.text().await;
    let resp = client()
        .post(format!("http://{}/chat/completions", fake.addr()))
        .header("Authorization", "Bearer other")
        .json(&stream_body("second"))
        .send()
        .await
        .expect("request");
    assert_eq!(assemble(&resp.text().await.expect("body")).content, "two");

    let reqs = fake.wait_for_requests(2, WAIT).await.expect("two requests");
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[0].path, "/v1/chat/completions");
    assert_eq!(reqs[0].authorization(), Some("Bearer sk-test"));
    assert_eq!(reqs[0].model(), Some("test-model"));
    assert!(reqs[0].is_stream());
    assert_eq!(reqs[0].messages().len(), 2);
    assert_eq!(reqs[0].last_user_text().as_deref(), Some("first"));
    assert_eq!(reqs[0].body["messages"][1]["content"], "first");
    assert_eq!(reqs[1].path, "/chat/completions");
    assert_eq!(reqs[1].header("AUTHORIZATION"), Some("Bearer other"));
    assert_eq!(
        fake.last_request()
            .and_then(|r| r.last_user_text())
            .as_deref(),
        Some("second")
    );
}

#[tokio::test]
async fn wait_for_requests_times_out() {
    let fake = FakeLlm::start().await;
    let err = fake
        .wait_for_requests(1, Duration::from_millis(50))
        .await
        .expect_err("no request was sent");
    assert_eq!(
        (err.wanted.as_str(), err.seen.as_str()),
        ("1 request(s)", "0")
    );
    assert_eq!(
        err.to_string(),
        "fake llm: waited 50ms for 1 request(s) but saw 0"
    );
}

#[tokio::test]
async fn wait_for_requests_wakes_on_arrival() {
    let fake = FakeLlm::start().await;
    fake.push_text("x");
    let url = fake.base_url();
    let sender = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        client()
            .post(format!("{url}/chat/completions"))
            .json(&stream_body("late"))
            .send()
            .await
            .map(|r| r.status())
    });
    let reqs = fake.wait_for_requests(1, WAIT).await.expect("one request");
    assert_eq!(reqs[0].last_user_text().as_deref(), Some("late"));
    assert_eq!(sender.await.expect("join").expect("send"), 200);
}

#[tokio::test]
async fn responder_answers_when_script_is_empty() {
    let fake = FakeLlm::start().await;
    fake.push_text("scripted");
    fake.respond_with(|body| {
        Reply::text(format!(
            "echo: {}",
            parlor_testkit::last_user_text(body).unwrap_or_default()
        ))
    });
    let a = assemble(&stream_turn(&fake, "one").await);
    let b = assemble(&stream_turn(&fake, "two").await);
    assert_eq!(a.content, "scripted");
    assert_eq!(b.content, "echo: two");

    fake.clear_responder();
    assert_eq!(post(&fake, &stream_body("three")).await.status(), 500);
    assert_eq!(fake.request_count(), 3);
}

#[tokio::test]
async fn panicking_responder_gives_500() {
    let fake = FakeLlm::start().await;
    fake.respond_with(|_| panic!("boom"));
    assert_eq!(post(&fake, &stream_body("x")).await.status(), 500);
}

#[tokio::test]
async fn raw_sse_is_sent_verbatim() {
    let fake = FakeLlm::start().await;
    let raw = "data: {\"not\":\"a chunk\"}\n\n: comment\n\ndata: [DONE]\n\n";
    fake.push(Reply::raw_sse(raw));
    let resp = post(&fake, &stream_body("x")).await;
    assert_eq!(
        resp.headers()["content-type"].to_str().ok(),
        Some("text/event-stream")
    );
    assert_eq!(resp.text().await.expect("body"), raw);
}

#[tokio::test]
async fn stream_error_mid_stream() {
    let fake = FakeLlm::start().await;
    fake.push(Reply::stream_error("overloaded"));
    fake.push(Reply::text("partial answer").then_stream_error("boom"));

    let sse = stream_turn(&fake, "x").await;
    let events = data_events(&sse);
    assert_eq!(events.len(), 2, "{sse}");
    let err: Value = serde_json::from_str(&events[1]).expect("json");
    assert_eq!(err["error"]["message"], "overloaded");
    assert!(!sse.contains("[DONE]"));

    let sse = stream_turn(&fake, "y").await;
    let events = data_events(&sse);
    let last: Value = serde_json::from_str(events.last().expect("events")).expect("json");
    assert_eq!(last["error"]["message"], "boom");
    assert_eq!(
        assemble(&sse.replace(events.last().expect("events"), "[DONE]")).content,
        "partial answer"
    );
}

#[tokio::test]
async fn stall_sends_one_chunk_and_notices_disconnect() {
    let fake = FakeLlm::start().await;
    fake.push(Reply::text("abcdefghi").then_stall());
    let resp = post(&fake, &stream_body("x")).await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.bytes_stream();
    let first = tokio::time::timeout(WAIT, body.next())
        .await
        .expect("first chunk in time")
        .expect("a chunk")
        .expect("chunk ok");
    let first = String::from_utf8(first.to_vec()).expect("utf8");
    let chunk: Value =
        serde_json::from_str(data_events(&first).first().expect("one data event")).expect("json");
    assert_eq!(chunk["choices"][0]["delta"]["content"], "abc");
    // Nothing else arrives.
    assert!(
        tokio::time::timeout(Duration::from_millis(200), body.next())
            .await
            .is_err()
    );
    drop(body);
    let deadline = tokio::time::Instant::now() + WAIT;
    while fake.dropped_streams() == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "server never noticed the disconnect"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn stall_ends_on_shutdown() {
    let fake = FakeLlm::start().await;
    fake.push(Reply::stall_after_first_chunk());
    let resp = post(&fake, &stream_body("x")).await;
    let reader = tokio::spawn(async move { resp.text().await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    tokio::time::timeout(WAIT, fake.shutdown())
        .await
        .expect("shutdown in time");
    let text = tokio::time::timeout(WAIT, reader)
        .await
        .expect("body ends after shutdown")
        .expect("join")
        .unwrap_or_default();
    assert!(!text.contains("[DONE]"));
}

#[tokio::test]
async fn delay_and_chunk_delay() {
    let fake = FakeLlm::start().await;
    fake.push(
        Reply::text("slow text")
            .delay(Duration::from_millis(100))
            .chunk_delay(Duration::from_millis(20)),
    );
    let start = std::time::Instant::now();
    let got = assemble(&stream_turn(&fake, "x").await);
    assert!(start.elapsed() >= Duration::from_millis(140));
    assert_eq!(got.content, "slow text");
}

#[tokio::test]
async fn non_streaming_request_gets_completion_json() {
    let fake = FakeLlm::start().await;
    fake.push(Reply::text_and_tools(
        "sure",
        vec![ToolCallSpec::new("c1", "f", json!({"a": 1}))],
    ));
    let resp = post(&fake, &json!({"model": "m", "messages": []})).await;
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.expect("json");
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "m");
    let message = &body["choices"][0]["message"];
    assert_eq!(message["content"], "sure");
    assert_eq!(
        message["tool_calls"][0]["function"]["arguments"],
        "{\"a\":1}"
    );
    assert_eq!(body["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(body["usage"]["total_tokens"], 15);
}

#[tokio::test]
async fn invalid_json_gives_400_without_consuming_script() {
    let fake = FakeLlm::start().await;
    fake.push_text("kept");
    let resp = client()
        .post(format!("{}/chat/completions", fake.base_url()))
        .body("{not json")
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), 400);
    assert_eq!(fake.pending_replies(), 1);
    assert_eq!(fake.requests()[0].body, json!("{not json"));
}

#[tokio::test]
async fn unknown_path_is_404() {
    let fake = FakeLlm::start().await;
    let resp = client()
        .post(format!("{}/completions", fake.base_url()))
        .json(&json!({}))
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), 404);
    assert_eq!(fake.request_count(), 0);
}

#[tokio::test]
async fn drop_stops_the_server() {
    let fake = FakeLlm::start().await;
    let url = format!("{}/chat/completions", fake.base_url());
    drop(fake);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let result = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .expect("client")
        .post(url)
        .json(&stream_body("x"))
        .send()
        .await;
    assert!(result.is_err(), "server still answering after drop");
}
