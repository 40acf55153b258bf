//! `AnthropicClient` against `parlor_testkit::FakeAnthropic` on 127.0.0.1: the request it
//! writes (tool pairs, thinking replay, cache breakpoints, images), every event type it
//! reads, retries, cancellation; and the recorded Anthropic streams of
//! `tests/fixtures/anthropic/` reassembled whole and cut at every byte offset.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use parlor_bot::agent::{Agent, AgentConfig, TurnInput};
use parlor_bot::llm::anthropic::{self, AnthropicClient, AnthropicConfig, CacheTtl};
use parlor_bot::llm::{
    ChatRequest, Completion, Content, ContentPart, ImageUrl, LlmBackend, LlmError, Message,
    RetryPolicy, ThinkingBlock, ToolCall, ToolChoice, ToolDef, Usage,
};
use parlor_bot::platform::ImageRef;
use parlor_bot::testing::{WAIT_LIMIT, chat_request};
use parlor_bot::tool::{
    Caller, Risk, Role, ToolContext, ToolInvocation, ToolRegistry, ToolResult, ToolSet, ToolSpec,
};
use parlor_testkit::{AnthropicReply, AnthropicRequest, BlockSpec, FakeAnthropic};
use secrecy::SecretString;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/anthropic");
const KEY: &str = "sk-ant-test-0123456789abcdef";

fn config(fake: &FakeAnthropic) -> AnthropicConfig {
    AnthropicConfig {
        base_url: fake.base_url(),
        api_key: Some(SecretString::from(KEY)),
        retry: RetryPolicy {
            max_retries: 2,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(5),
        },
        ..AnthropicConfig::default()
    }
}

fn tools() -> Vec<ToolDef> {
    vec![
        ToolDef::function(
            "time_now",
            "The time.",
            json!({"type": "object", "properties": {}}),
        ),
        ToolDef::function(
            "get_weather",
            "The weather in a city.",
            json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
        ),
    ]
}

fn request(messages: Vec<Message>) -> ChatRequest {
    ChatRequest {
        tools: tools().into(),
        tool_choice: Some(ToolChoice::Auto),
        ..chat_request("claude-test", messages)
    }
}

async fn run(client: &impl LlmBackend, request: &ChatRequest) -> Result<Completion, LlmError> {
    client.stream(request, &CancellationToken::new()).await
}

async fn requests(fake: &FakeAnthropic, n: usize) -> Vec<AnthropicRequest> {
    let got = fake.wait_for_requests(n, WAIT_LIMIT).await.unwrap();
    assert_eq!(got.len(), n, "exactly {n} request(s)");
    got
}

// ---------------------------------------------------------------------------------------
// The request
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn a_tool_round_trip_pairs_tool_use_with_tool_result() {
    let fake = FakeAnthropic::start().await;
    fake.push(
        AnthropicReply::text("Let me check.")
            .tool_use("toolu_1", "get_weather", json!({"city": "Paris"}))
            .tool_use("toolu_2", "time_now", json!({})),
    );
    fake.push(AnthropicReply::text("18°C at noon."));
    let client = AnthropicClient::new(config(&fake)).unwrap();

    let mut messages = vec![
        Message::system("You are terse."),
        Message::user("alice: weather?"),
    ];
    let first = run(&client, &request(messages.clone())).await.unwrap();
    assert_eq!(first.content, "Let me check.");
    assert_eq!(first.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(
        first.tool_calls,
        [
            ToolCall::new("toolu_1", "get_weather", r#"{"city":"Paris"}"#),
            ToolCall::new("toolu_2", "time_now", "{}"),
        ]
    );
    messages.push(first.to_message());
    messages.push(Message::tool(
        "toolu_1",
        r#"{"success":true,"data":"18°C"}"#,
    ));
    messages.push(Message::tool(
        "toolu_2",
        r#"{"success":true,"data":"12:00"}"#,
    ));
    let second = run(&client, &request(messages)).await.unwrap();
    assert_eq!(second.content, "18°C at noon.");
    assert_eq!(second.finish_reason.as_deref(), Some("stop"));

    let sent = requests(&fake, 2).await;
    for r in &sent {
        assert_eq!(r.path, "/v1/messages");
        assert_eq!(r.header("x-api-key"), Some(KEY));
        assert_eq!(r.header("anthropic-version"), Some("2023-06-01"));
        assert_eq!(r.body["stream"], json!(true));
        assert_eq!(r.body["max_tokens"], json!(4096));
        assert_eq!(r.body["tool_choice"], json!({"type": "auto"}));
    }
    let messages = sent[1].messages();
    assert_eq!(messages.len(), 3, "{messages:#?}");
    assert_eq!(
        messages[1],
        json!({"role": "assistant", "content": [
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "toolu_2", "name": "time_now", "input": {}},
        ]})
    );
    // Both results in one user message, in the order of the calls.
    assert_eq!(messages[2]["role"], "user");
    let results = messages[2]["content"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    assert_eq!(results[0]["type"], "tool_result");
    assert_eq!(results[0]["tool_use_id"], "toolu_1");
    assert_eq!(results[0]["content"], r#"{"success":true,"data":"18°C"}"#);
    assert_eq!(results[1]["tool_use_id"], "toolu_2");
    assert_eq!(
        sent[1].tools()[1],
        json!({
            "name": "get_weather",
            "description": "The weather in a city.",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            "cache_control": {"type": "ephemeral"},
        })
    );
    fake.shutdown().await;
}

#[tokio::test]
async fn thinking_is_replayed_with_its_signature() {
    let fake = FakeAnthropic::start().await;
    fake.push(
        AnthropicReply::thinking("The user wants the time; ask the tool.", "c2lnbmF0dXJl+/=")
            .tool_use("toolu_9", "time_now", json!({})),
    );
    fake.push(AnthropicReply::thinking("It is noon.", "sig-2").then_text("Noon."));
    let client = AnthropicClient::new(AnthropicConfig {
        thinking_budget: Some(2048),
        ..config(&fake)
    })
    .unwrap();

    let mut req = request(vec![Message::system("S"), Message::user("time?")]);
    req.temperature = Some(0.7);
    req.tool_choice = Some(ToolChoice::Required);
    let first = run(&client, &req).await.unwrap();
    assert_eq!(first.reasoning, "The user wants the time; ask the tool.");
    let thought = ThinkingBlock::Thinking {
        thinking: "The user wants the time; ask the tool.".into(),
        signature: "c2lnbmF0dXJl+/=".into(),
    };
    assert_eq!(first.thinking, std::slice::from_ref(&thought));
    let assistant = first.to_message();
    let Message::Assistant { thinking, .. } = &assistant else {
        panic!("{assistant:?}");
    };
    assert_eq!(thinking, &[thought]);

    req.messages.push(assistant);
    req.messages.push(Message::tool("toolu_9", "12:00"));
    let second = run(&client, &req).await.unwrap();
    assert_eq!(second.content, "Noon.");
    assert_eq!(second.reasoning, "It is noon.");

    let sent = requests(&fake, 2).await;
    let body = &sent[1].body;
    assert_eq!(
        body["thinking"],
        json!({"type": "enabled", "budget_tokens": 2048})
    );
    // The budget comes on top of the answer's limit; temperature and a forced tool call
    // are refused with thinking, so they are left out.
    assert_eq!(body["max_tokens"], json!(4096 + 2048));
    assert!(body.get("temperature").is_none(), "{body}");
    assert_eq!(body["tool_choice"], json!({"type": "auto"}));
    assert_eq!(
        sent[1].messages()[1]["content"],
        json!([
            {"type": "thinking", "thinking": "The user wants the time; ask the tool.", "signature": "c2lnbmF0dXJl+/="},
            {"type": "tool_use", "id": "toolu_9", "name": "time_now", "input": {}},
        ])
    );
    fake.shutdown().await;
}

#[test]
fn thinking_and_temperature_without_a_budget() {
    let client = AnthropicClient::new(AnthropicConfig::default()).unwrap();
    let mut req = request(vec![
        Message::user("q"),
        Message::Assistant {
            content: Some("a".into()),
            tool_calls: Vec::new(),
            thinking: vec![ThinkingBlock::RedactedThinking { data: "xx".into() }],
            model: None,
        },
        Message::user("q2"),
    ]);
    req.temperature = Some(0.7);
    req.tool_choice = Some(ToolChoice::Required);
    req.parallel_tool_calls = Some(false);
    let body = client.request_body(&req);
    // Thinking off: the blocks of an earlier answer stay out.
    assert_eq!(
        body["messages"][1]["content"],
        json!([{"type": "text", "text": "a"}])
    );
    assert!(body.get("thinking").is_none());
    assert_eq!(body["temperature"], json!(0.7));
    assert_eq!(
        body["tool_choice"],
        json!({"type": "any", "disable_parallel_tool_use": true})
    );
    req.tool_choice = Some(ToolChoice::None);
    assert_eq!(
        client.request_body(&req)["tool_choice"],
        json!({"type": "none"})
    );
    req.tools = Vec::new().into();
    let body = client.request_body(&req);
    assert!(body.get("tools").is_none() && body.get("tool_choice").is_none());
}

fn long_conversation() -> ChatRequest {
    request(vec![
        Message::system("You are parlor."),
        Message::system("Chat rules."),
        Message::user("alice: hi"),
        Message::assistant("hello"),
        Message::user("bob: weather?"),
        Message::Assistant {
            content: None,
            tool_calls: vec![ToolCall::new(
                "toolu_1",
                "get_weather",
                r#"{"city":"Oslo"}"#,
            )],
            thinking: Vec::new(),
            model: None,
        },
        Message::tool("toolu_1", "rain"),
    ])
}

#[test]
fn cache_breakpoints_sit_on_the_system_the_tools_and_the_newest_user_turn() {
    let client = AnthropicClient::new(AnthropicConfig::default()).unwrap();
    let record = |body: Value| AnthropicRequest {
        path: String::new(),
        headers: Default::default(),
        body,
    };
    let body = client.request_body(&long_conversation());
    let r = record(body.clone());
    assert_eq!(
        r.cache_breakpoints(),
        ["/system/1", "/tools/1", "/messages/4/content/0"]
    );
    assert_eq!(
        body["system"],
        json!([
            {"type": "text", "text": "You are parlor."},
            {"type": "text", "text": "Chat rules.", "cache_control": {"type": "ephemeral"}},
        ])
    );
    // The newest user message is the tool result.
    assert_eq!(body["messages"][4]["content"][0]["type"], "tool_result");

    // A plain user turn last: its last block.
    let mut req = long_conversation();
    req.messages.push(Message::assistant("It rains."));
    req.messages.push(Message::User {
        content: Content::Parts(vec![
            ContentPart::Text {
                text: "carol: and now?".into(),
            },
            ContentPart::Text {
                text: "(sent at noon)".into(),
            },
        ]),
    });
    let r = record(client.request_body(&req));
    assert_eq!(
        r.cache_breakpoints(),
        ["/system/1", "/tools/1", "/messages/6/content/1"]
    );

    let hour = AnthropicClient::new(AnthropicConfig {
        cache_ttl: CacheTtl::OneHour,
        ..AnthropicConfig::default()
    })
    .unwrap();
    let body = hour.request_body(&long_conversation());
    for pointer in ["/system/1", "/tools/1", "/messages/4/content/0"] {
        assert_eq!(
            body.pointer(&format!("{pointer}/cache_control")),
            Some(&json!({"type": "ephemeral", "ttl": "1h"})),
            "{pointer}"
        );
    }
    assert!(record(body).cache_breakpoints().len() <= 4);
}

#[test]
fn messages_are_merged_to_alternate_and_images_become_image_blocks() {
    let client = AnthropicClient::new(AnthropicConfig::default()).unwrap();
    let req = chat_request(
        "m",
        vec![
            Message::user("alice: look"),
            Message::User {
                content: Content::Parts(vec![
                    ContentPart::ImageUrl {
                        image_url: ImageUrl {
                            url: "data:image/png;base64,iVBORw0KGgo=".into(),
                            detail: None,
                        },
                    },
                    ContentPart::ImageUrl {
                        image_url: ImageUrl {
                            url: "https://example.com/cat.jpg".into(),
                            detail: Some("low".into()),
                        },
                    },
                    ContentPart::ImageRef {
                        image: ImageRef {
                            file_id: "f1".into(),
                            mime_type: None,
                            size: None,
                        },
                        message_id: None,
                    },
                    ContentPart::Text {
                        text: String::new(),
                    },
                ]),
            },
            // Empty: left out, so the two user messages around it merge too.
            Message::Assistant {
                content: Some(String::new()),
                tool_calls: Vec::new(),
                thinking: Vec::new(),
                model: None,
            },
            Message::user("bob: and?"),
            Message::Assistant {
                content: None,
                tool_calls: vec![ToolCall::new("t1", "x", "not json {")],
                thinking: Vec::new(),
                model: None,
            },
        ],
    );
    let body = client.request_body(&req);
    assert!(body.get("system").is_none());
    assert_eq!(
        body["messages"],
        json!([
            {"role": "user", "content": [
                {"type": "text", "text": "alice: look"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
                {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
                {"type": "text", "text": "[an image was attached here but could not be shown]"},
                {"type": "text", "text": "bob: and?", "cache_control": {"type": "ephemeral"}},
            ]},
            // Arguments that are no JSON object go as an empty input.
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "t1", "name": "x", "input": {}},
            ]},
        ])
    );
    assert_eq!(body["model"], "m");
    assert_eq!(body["max_tokens"], 4096);
}

#[test]
fn the_request_limit_wins_over_the_configured_one() {
    let client = AnthropicClient::new(AnthropicConfig::default()).unwrap();
    let mut req = chat_request("m", vec![Message::user("q")]);
    req.max_completion_tokens = Some(400);
    assert_eq!(client.request_body(&req)["max_tokens"], 400);
}

#[test]
fn the_key_never_shows() {
    let client = AnthropicClient::new(AnthropicConfig {
        api_key: Some(SecretString::from(KEY)),
        extra_headers: vec![("anthropic-beta".into(), "secret-beta-value".into())],
        ..AnthropicConfig::default()
    })
    .unwrap();
    let debug = format!("{client:?}");
    assert!(!debug.contains(KEY), "{debug}");
    assert!(!debug.contains("secret-beta-value"), "{debug}");
    assert_eq!(client.endpoint(), "https://api.anthropic.com/v1/messages");
}

// ---------------------------------------------------------------------------------------
// The answer
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn every_event_type_is_mapped() {
    let fake = FakeAnthropic::start().await;
    fake.push(
        AnthropicReply::blocks(vec![
            BlockSpec::Thinking {
                thinking: "First, think. Then answer.".into(),
                signature: "EqQBCkYIBRgCIkB".into(),
            },
            BlockSpec::RedactedThinking("EmwKAhgBEgy3va3pzix".into()),
            BlockSpec::Text("Here is ".into()),
            BlockSpec::ToolUse {
                id: "toolu_a".into(),
                name: "get_weather".into(),
                input: r#"{"city": "Zürich, 🇨🇭"}"#.into(),
            },
            BlockSpec::Text("the rest.".into()),
            BlockSpec::ToolUse {
                id: "toolu_b".into(),
                name: "time_now".into(),
                input: String::new(),
            },
        ])
        .usage(20, 77)
        .cache(1500, 300),
    );
    fake.push(AnthropicReply::text("cut").stop_reason("max_tokens"));
    let client = AnthropicClient::new(config(&fake)).unwrap();
    let req = request(vec![Message::user("q")]);

    let c = run(&client, &req).await.unwrap();
    assert_eq!(c.content, "Here is the rest.");
    assert_eq!(c.reasoning, "First, think. Then answer.");
    assert_eq!(
        c.thinking,
        [
            ThinkingBlock::Thinking {
                thinking: "First, think. Then answer.".into(),
                signature: "EqQBCkYIBRgCIkB".into(),
            },
            ThinkingBlock::RedactedThinking {
                data: "EmwKAhgBEgy3va3pzix".into()
            },
        ]
    );
    assert_eq!(
        c.tool_calls,
        [
            ToolCall::new("toolu_a", "get_weather", r#"{"city": "Zürich, 🇨🇭"}"#),
            ToolCall::new("toolu_b", "time_now", "{}"),
        ]
    );
    assert_eq!(c.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(
        c.usage,
        Some(Usage {
            prompt_tokens: 20 + 1500 + 300,
            completion_tokens: 77,
            total_tokens: 20 + 1500 + 300 + 77,
            cache_read_tokens: 1500,
            cache_write_tokens: 300,
        })
    );

    let c = run(&client, &req).await.unwrap();
    assert_eq!(c.content, "cut");
    assert_eq!(c.finish_reason.as_deref(), Some("length"));
    fake.shutdown().await;
}

fn sse(events: &[&str]) -> String {
    events
        .iter()
        .map(|data| {
            let kind = serde_json::from_str::<Value>(data).unwrap()["type"]
                .as_str()
                .unwrap()
                .to_owned();
            format!("event: {kind}\ndata: {data}\n\n")
        })
        .collect()
}

#[tokio::test]
async fn unknown_events_blocks_and_deltas_are_skipped() {
    let fake = FakeAnthropic::start().await;
    fake.push(AnthropicReply::raw_sse(sse(&[
        r#"{"type":"message_start","message":{"usage":{"input_tokens":3,"output_tokens":1}}}"#,
        r#"{"type":"ping"}"#,
        r#"{"type":"some_future_event","x":1}"#,
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"server_tool_use","id":"srvtoolu_1","name":"web_search","input":{}}}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"q\":1}"}}"#,
        r#"{"type":"content_block_stop","index":0}"#,
        r#"{"type":"content_block_start","index":1,"content_block":{"type":"text","text":"A"}}"#,
        r#"{"type":"content_block_delta","index":1,"delta":{"type":"citations_delta","citation":{}}}"#,
        r#"{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"B"}}"#,
        r#"{"type":"content_block_stop","index":1}"#,
        r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":9}}"#,
        r#"{"type":"message_stop"}"#,
        r#"{"type":"ping"}"#,
    ])));
    let client = AnthropicClient::new(config(&fake)).unwrap();
    let c = run(&client, &request(vec![Message::user("q")]))
        .await
        .unwrap();
    assert_eq!(c.content, "AB");
    assert!(c.tool_calls.is_empty());
    assert_eq!(c.usage.unwrap().total_tokens, 12);
    fake.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// Failures and retries
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn overloaded_529_is_retried_and_the_retry_succeeds() {
    let fake = FakeAnthropic::start().await;
    fake.push(AnthropicReply::overloaded().retry_after(0));
    fake.push(AnthropicReply::text("made it"));
    let client = AnthropicClient::with_retries(config(&fake)).unwrap();
    let c = run(&client, &request(vec![Message::user("q")]))
        .await
        .unwrap();
    assert_eq!(c.content, "made it");
    requests(&fake, 2).await;

    // One attempt alone reports the status, retryable.
    fake.push(AnthropicReply::overloaded());
    let e = run(client.inner(), &request(vec![Message::user("q")]))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, LlmError::Status { status: 529, body, .. } if body.contains("overloaded_error")),
        "{e:?}"
    );
    assert!(e.is_retryable());
    fake.shutdown().await;
}

#[tokio::test]
async fn retry_after_is_read_from_the_status_answer() {
    let fake = FakeAnthropic::start().await;
    fake.push(AnthropicReply::status(429).retry_after(17));
    let client = AnthropicClient::new(config(&fake)).unwrap();
    let e = run(&client, &request(vec![Message::user("q")]))
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            LlmError::Status {
                status: 429,
                retry_after: Some(d),
                ..
            } if d == Duration::from_secs(17)
        ),
        "{e:?}"
    );
    fake.shutdown().await;
}

#[tokio::test]
async fn an_overloaded_error_inside_the_stream_is_retried() {
    let fake = FakeAnthropic::start().await;
    fake.push(AnthropicReply::text("half an ans").then_error("overloaded_error", "Overloaded"));
    fake.push(AnthropicReply::text("whole answer"));
    let client = AnthropicClient::with_retries(config(&fake)).unwrap();
    let c = run(&client, &request(vec![Message::user("q")]))
        .await
        .unwrap();
    assert_eq!(c.content, "whole answer");
    requests(&fake, 2).await;

    fake.push(AnthropicReply::text("x").then_error("overloaded_error", "Overloaded"));
    let e = run(client.inner(), &request(vec![Message::user("q")]))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, LlmError::Interrupted(m) if m.contains("Overloaded") && m.contains("overloaded_error")),
        "{e:?}"
    );
    assert!(e.is_retryable());
    fake.shutdown().await;
}

#[tokio::test]
async fn a_request_error_inside_the_stream_is_not_retried() {
    let fake = FakeAnthropic::start().await;
    fake.push(AnthropicReply::text("x").then_error("invalid_request_error", "bad"));
    let client = AnthropicClient::with_retries(config(&fake)).unwrap();
    let e = run(&client, &request(vec![Message::user("q")]))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, LlmError::Stream(m) if m.contains("bad")),
        "{e:?}"
    );
    assert!(!e.is_retryable());
    requests(&fake, 1).await;
    fake.shutdown().await;
}

#[tokio::test]
async fn a_400_is_not_retried() {
    let fake = FakeAnthropic::start().await;
    fake.push(AnthropicReply::status(400));
    fake.push(AnthropicReply::text("never asked for"));
    let client = AnthropicClient::with_retries(config(&fake)).unwrap();
    let e = run(&client, &request(vec![Message::user("q")]))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, LlmError::Status { status: 400, body, .. } if body.contains("invalid_request_error")),
        "{e:?}"
    );
    // The next request gets the reply the retry would have taken.
    let c = run(&client, &request(vec![Message::user("q")]))
        .await
        .unwrap();
    assert_eq!(c.content, "never asked for");
    requests(&fake, 2).await;
    fake.shutdown().await;
}

#[test]
fn a_prompt_too_long_is_a_context_overflow() {
    let e = LlmError::Status {
        status: 400,
        body: r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 208431 tokens > 200000 maximum"}}"#.into(),
        retry_after: None,
    };
    assert!(e.is_context_length_exceeded());
}

#[tokio::test]
async fn a_stream_cut_before_message_stop_is_interrupted() {
    let fake = FakeAnthropic::start().await;
    fake.push(AnthropicReply::tool_call("toolu_1", "time_now", json!({})).cut_before_stop());
    fake.push(AnthropicReply::text("again, whole"));
    let client = AnthropicClient::new(config(&fake)).unwrap();
    let e = run(&client, &request(vec![Message::user("q")]))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, LlmError::Interrupted(m) if m.contains("message_stop")),
        "{e:?}"
    );
    assert!(e.is_retryable());
    let retrying = AnthropicClient::with_retries(config(&fake)).unwrap();
    fake.push(AnthropicReply::text("x").cut_before_stop());
    fake.push(AnthropicReply::text("y"));
    // The second scripted reply of the first pair answers first.
    assert_eq!(
        run(&retrying, &request(vec![Message::user("q")]))
            .await
            .unwrap()
            .content,
        "again, whole"
    );
    assert_eq!(
        run(&retrying, &request(vec![Message::user("q")]))
            .await
            .unwrap()
            .content,
        "y"
    );
    requests(&fake, 4).await;
    fake.shutdown().await;
}

#[tokio::test]
async fn a_cancel_mid_stream_is_cancelled_and_returns_no_partial_call() {
    let fake = FakeAnthropic::start().await;
    // message_start, ping, the tool_use start and one piece of its input; then silence.
    fake.push(
        AnthropicReply::tool_call("toolu_1", "get_weather", json!({"city": "Paris"}))
            .stall_after(4),
    );
    let client = AnthropicClient::with_retries(config(&fake)).unwrap();
    let cancel = CancellationToken::new();
    let req = request(vec![Message::user("q")]);
    let call = client.stream(&req, &cancel);
    let mut call = std::pin::pin!(call);
    tokio::select! {
        r = &mut call => panic!("the stalled stream ended: {r:?}"),
        r = fake.wait_for_requests(1, WAIT_LIMIT) => { r.unwrap(); }
    }
    cancel.cancel();
    let result = call.await;
    assert!(matches!(result, Err(LlmError::Cancelled)), "{result:?}");
    fake.wait_for_dropped_streams(1, WAIT_LIMIT).await.unwrap();
    assert_eq!(fake.requests().len(), 1, "a cancel is never retried");
    fake.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// Through the agent
// ---------------------------------------------------------------------------------------

/// One tool, `clock`, which says it is noon.
struct Clock;

#[async_trait]
impl ToolSet for Clock {
    fn name(&self) -> &str {
        "clock"
    }

    fn tools(&self) -> Vec<ToolSpec> {
        vec![ToolSpec {
            name: "clock".into(),
            description: "The time.".into(),
            parameters: json!({"type": "object", "properties": {}}),
            result: "the time".into(),
            risk: Risk::Read,
            role: Role::Member,
            role_in_chat_arg: None,
            failure_codes: vec![],
            offer: Default::default(),
        }]
    }

    async fn invoke(&self, _call: ToolInvocation, _cx: ToolContext) -> ToolResult {
        ToolResult::ok("noon")
    }

    fn fork(&self) -> Arc<dyn ToolSet> {
        Arc::new(Clock)
    }
}

/// The agent's own loop carries the thinking of a tool-use answer into its next request,
/// and keeps it in the turn's messages (the history the store writes).
#[tokio::test]
async fn the_agent_replays_thinking_through_its_tool_loop() {
    let fake = FakeAnthropic::start().await;
    fake.push(
        AnthropicReply::thinking("Ask the clock.", "sig-clock").tool_use(
            "toolu_c",
            "clock",
            json!({}),
        ),
    );
    fake.push(AnthropicReply::text("It is noon.").cache(900, 0));
    let client = AnthropicClient::with_retries(AnthropicConfig {
        thinking_budget: Some(1024),
        ..config(&fake)
    })
    .unwrap();
    let agent = Agent::new(
        Arc::new(client),
        ToolRegistry::new(vec![Arc::new(Clock)]).unwrap(),
        "You are a test bot.",
        AgentConfig {
            model: "claude-test".into(),
            ..AgentConfig::default()
        },
    );
    let caller = Caller {
        user_id: "console:alice".into(),
        name: "alice".into(),
        role: Role::Member,
        grants: Vec::new(),
    };
    let turn = agent
        .run_turn(
            &[],
            TurnInput::text("console:local", caller, "time?"),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(turn.reply, "It is noon.");
    assert_eq!(turn.usage.cache_read_tokens, 900);
    let thought = ThinkingBlock::Thinking {
        thinking: "Ask the clock.".into(),
        signature: "sig-clock".into(),
    };
    assert!(
        turn.messages.iter().any(
            |m| matches!(m, Message::Assistant { thinking, .. } if thinking == std::slice::from_ref(&thought))
        ),
        "{:#?}",
        turn.messages
    );

    let sent = requests(&fake, 2).await;
    let messages = sent[1].messages();
    assert_eq!(messages[1]["role"], "assistant");
    assert_eq!(
        messages[1]["content"][0],
        json!({"type": "thinking", "thinking": "Ask the clock.", "signature": "sig-clock"})
    );
    assert_eq!(messages[1]["content"][1]["id"], "toolu_c");
    assert_eq!(messages[2]["content"][0]["type"], "tool_result");
    assert_eq!(messages[2]["content"][0]["tool_use_id"], "toolu_c");
    assert_eq!(sent[1].system().len(), 1);
    fake.shutdown().await;
}

/// History written before these fields existed reads as before and is written back the
/// same: no `thinking` on assistant messages, no cache counts in usage.
#[test]
fn stored_records_without_the_new_fields_read_and_write_the_same() {
    let stored = r#"{"role":"assistant","tool_calls":[{"id":"c1","type":"function","function":{"name":"clock","arguments":"{}"}}]}"#;
    let message: Message = serde_json::from_str(stored).unwrap();
    assert!(matches!(&message, Message::Assistant { thinking, .. } if thinking.is_empty()));
    assert_eq!(serde_json::to_string(&message).unwrap(), stored);

    let stored = r#"{"prompt_tokens":10,"completion_tokens":2,"total_tokens":12}"#;
    let usage: Usage = serde_json::from_str(stored).unwrap();
    assert_eq!(usage.cache_read_tokens + usage.cache_write_tokens, 0);
    assert_eq!(serde_json::to_string(&usage).unwrap(), stored);

    // And with thinking, it round-trips with its signature.
    let message = Message::Assistant {
        content: Some("a".into()),
        tool_calls: Vec::new(),
        thinking: vec![
            ThinkingBlock::Thinking {
                thinking: "t".into(),
                signature: "s".into(),
            },
            ThinkingBlock::RedactedThinking { data: "d".into() },
        ],
        model: None,
    };
    let json = serde_json::to_string(&message).unwrap();
    assert_eq!(
        json,
        r#"{"role":"assistant","content":"a","thinking":[{"type":"thinking","thinking":"t","signature":"s"},{"type":"redacted_thinking","data":"d"}]}"#
    );
    assert_eq!(serde_json::from_str::<Message>(&json).unwrap(), message);
}

// ---------------------------------------------------------------------------------------
// Recorded streams
// ---------------------------------------------------------------------------------------

/// Every recording as wire bytes: vercel-ai's `*.chunks.txt` hold one event JSON per line,
/// framed here as the API frames them (`event: TYPE\ndata: JSON\n\n`).
fn recordings() -> Vec<(String, Bytes)> {
    let mut out = Vec::new();
    let mut paths: Vec<_> = std::fs::read_dir(Path::new(FIXTURES))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".chunks.txt"))
        .collect();
    paths.sort();
    for path in paths {
        let text = std::fs::read_to_string(&path).unwrap();
        let framed: String = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                let kind = serde_json::from_str::<Value>(l).unwrap()["type"]
                    .as_str()
                    .unwrap()
                    .to_owned();
                format!("event: {kind}\ndata: {l}\n\n")
            })
            .collect();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        out.push((name, Bytes::from(framed)));
    }
    out
}

fn assemble(pieces: Vec<Bytes>) -> Result<Completion, LlmError> {
    futures::executor::block_on(anthropic::assemble(futures::stream::iter(
        pieces.into_iter().map(Ok::<_, LlmError>),
    )))
}

fn usage(input: u64, output: u64) -> Option<Usage> {
    Some(Usage {
        prompt_tokens: input,
        completion_tokens: output,
        total_tokens: input + output,
        ..Usage::default()
    })
}

fn expected(name: &str) -> Completion {
    match name {
        "anthropic-clear-thinking.1.chunks.txt" => Completion {
            content: "925 ÷ 5 = 185".into(),
            reasoning: "The previous result was 925. Now I need to divide that by 5.\n\n925 ÷ 5 = 185".into(),
            thinking: vec![ThinkingBlock::Thinking {
                thinking: "The previous result was 925. Now I need to divide that by 5.\n\n925 ÷ 5 = 185".into(),
                signature: "EvQBCkYICxgCKkAxhD4NUKFzudtZ6NzbZdEiBACIScTzqjPViM596iWLZIk4EFKYYBj3B6Ptl3b0dcQv/VeJBNbejNWIWRBn+KPNEgz6HWtKx7p+QRgKsEoaDGjsiqfht7gTRFYHiyIwD1VSmNqHxv3wy8KEMP+LYb/TC4UH3H97tuoaADARFFcA0phdfxnzKQxFnc9lwY+dKlzUsaKSUAFeu1bDL5ikZJ1vL0Fkz6JjoFke0L/wOJRIUDUlDUOFJ1tZ3ea7g6LGE/5hwuvWgLwewdcm64d+43l7F57XrOmqNd6flI2K/oPr/4yzNgvi/EhT6Ca17BgB".into(),
            }],
            finish_reason: Some("stop".into()),
            usage: usage(69, 53),
            ..Completion::default()
        },
        "anthropic-json-tool.2.chunks.txt" => Completion {
            content: "I'll invoke the JSON response tool.".into(),
            tool_calls: vec![ToolCall::new(
                "toolu_01KFbKqPYSuAKujiL6mTfzYA",
                "json",
                r#"{"elements": [{"location": "San Francisco", "temperature": 58, "condition": "sunny"}]}"#,
            )],
            finish_reason: Some("tool_calls".into()),
            usage: usage(849, 47),
            ..Completion::default()
        },
        "anthropic-text.chunks.txt" => Completion {
            content: "Hello! I'm doing well, thank you for asking. How are you doing today? Is there anything I can help you with?".into(),
            finish_reason: Some("stop".into()),
            usage: usage(12, 30),
            ..Completion::default()
        },
        "anthropic-tool-no-args.chunks.txt" => Completion {
            content: "I'll update the issue list for you.".into(),
            tool_calls: vec![ToolCall::new(
                "toolu_01QE1WLsSVp5hy5Q3GmGTmjP",
                "updateIssueList",
                "{}",
            )],
            finish_reason: Some("tool_calls".into()),
            usage: usage(565, 48),
            ..Completion::default()
        },
        other => panic!("no expectation for {other}"),
    }
}

#[test]
fn recorded_streams_assemble_to_the_expected_completions() {
    let recordings = recordings();
    assert_eq!(recordings.len(), 4);
    for (name, bytes) in recordings {
        let got = assemble(vec![bytes]).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(got, expected(&name), "{name}");
    }
}

/// Each recording cut in two at every byte offset (inside UTF-8 characters too: `÷`,
/// `°`), and fed one byte at a time: the completion is always the same. The recordings
/// are small (under 4 KB framed), so every cut is of the whole stream.
#[test]
fn a_cut_at_every_byte_offset_changes_nothing() {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut utf8_cuts = 0;
    for (name, bytes) in recordings() {
        let reference = expected(&name);
        std::thread::scope(|scope| {
            for t in 0..threads {
                let (bytes, reference, name) = (&bytes, &reference, &name);
                scope.spawn(move || {
                    for i in (t..=bytes.len()).step_by(threads) {
                        let got = assemble(vec![bytes.slice(..i), bytes.slice(i..)])
                            .unwrap_or_else(|e| panic!("{name} cut at {i}: {e}"));
                        assert!(got == *reference, "{name} cut at {i}: {got:?}");
                    }
                });
            }
        });
        let bytewise = (0..bytes.len()).map(|i| bytes.slice(i..=i)).collect();
        assert_eq!(
            assemble(bytewise).unwrap(),
            reference,
            "{name}: one byte at a time"
        );
        utf8_cuts += bytes.iter().filter(|&&b| (b & 0xC0) == 0x80).count();
    }
    assert!(utf8_cuts > 0, "some cut falls inside a UTF-8 character");
}

/// A recording cut short anywhere before its `message_stop` is never a completion.
#[test]
fn a_recording_cut_short_is_interrupted_not_half_an_answer() {
    for (name, bytes) in recordings() {
        let stop = bytes.len() - "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n".len();
        // Before the first whole event there is nothing at all: malformed, not cut.
        let first = bytes.windows(2).position(|w| w == b"\n\n").unwrap() + 2;
        for end in (first..stop).step_by(7) {
            match assemble(vec![bytes.slice(..end)]) {
                Err(LlmError::Interrupted(_)) => {}
                other => panic!("{name} cut at {end}: {other:?}"),
            }
        }
    }
}
