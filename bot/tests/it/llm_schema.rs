//! What parlor sends and what it parses, checked against OpenAI's own JSON Schemas
//! (openai-openapi 2.3.0): every request body shape `OpenAiClient::request_body` builds,
//! and every recorded stream chunk.

use std::path::Path;

use parlor_bot::llm::{
    ChatRequest, Content, ContentPart, ImageUrl, Message, OpenAiClient, ThinkingBlock, ToolCall,
    ToolChoice, ToolDef,
};
use parlor_bot::platform::ImageRef;
use parlor_bot::testing::chat_request;
use serde_json::{Value, json};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures");

/// The schemas are OpenAPI 3.0: `nullable: true` means "or null", which JSON Schema spells
/// as a `null` type (and a `null` enum member). Without this, every `"finish_reason":null`
/// would be refused although OpenAI itself sends it.
fn translate_nullable(schema: &mut Value) {
    match schema {
        Value::Object(map) => {
            if map.remove("nullable") == Some(Value::Bool(true)) {
                if let Some(t) = map.get_mut("type") {
                    match t {
                        Value::String(s) => *t = json!([s.clone(), "null"]),
                        Value::Array(types) if !types.contains(&json!("null")) => {
                            types.push(json!("null"));
                        }
                        _ => {}
                    }
                }
                if let Some(Value::Array(values)) = map.get_mut("enum")
                    && !values.contains(&Value::Null)
                {
                    values.push(Value::Null);
                }
                // A nullable `$ref`/`allOf` without `type`: allow null beside it.
                if !map.contains_key("type") && !map.contains_key("enum") {
                    let inner = Value::Object(std::mem::take(map));
                    map.insert("anyOf".into(), json!([inner, {"type": "null"}]));
                }
            }
            for value in map.values_mut() {
                translate_nullable(value);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(translate_nullable),
        _ => {}
    }
}

/// A validator for one named schema of the file: the file's `components` become part of a
/// root document whose `$ref` points at the schema, so every `#/components/schemas/...`
/// reference resolves locally (no network, no file resolver).
fn validator(name: &str) -> jsonschema::Validator {
    let text = std::fs::read_to_string(format!(
        "{FIXTURES}/openai/openai-chat-completions-schemas.json"
    ))
    .unwrap();
    let file: Value = serde_json::from_str(&text).unwrap();
    let mut components = file["components"].clone();
    assert!(
        components["schemas"].get(name).is_some(),
        "{name} is in the file"
    );
    translate_nullable(&mut components);
    let root = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$ref": format!("#/components/schemas/{name}"),
        "components": components,
    });
    jsonschema::validator_for(&root).unwrap()
}

fn errors(v: &jsonschema::Validator, instance: &Value) -> Vec<String> {
    v.iter_errors(instance)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect()
}

fn weather_tool() -> ToolDef {
    ToolDef::function(
        "get_weather",
        "Current weather of a city.",
        json!({
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name"}},
            "required": ["city"],
            "additionalProperties": false
        }),
    )
}

fn conversation() -> Vec<Message> {
    vec![
        Message::system("You are parlor, a helpful group member."),
        Message::User {
            content: Content::Parts(vec![
                ContentPart::Text {
                    text: "What is in this picture, and what's the weather in Paris?".into(),
                },
                ContentPart::ImageUrl {
                    image_url: ImageUrl {
                        url: "data:image/png;base64,iVBORw0KGgo=".into(),
                        detail: Some("low".into()),
                    },
                },
                ContentPart::ImageUrl {
                    image_url: ImageUrl {
                        url: "https://example.com/cat.jpg".into(),
                        detail: None,
                    },
                },
            ]),
        },
        Message::Assistant {
            content: None,
            tool_calls: vec![
                ToolCall::new("call_1", "get_weather", r#"{"city":"Paris"}"#),
                ToolCall::new("call_2", "get_weather", r#"{"city":"Lyon"}"#),
            ],
            thinking: Vec::new(),
            model: None,
        },
        Message::tool("call_1", r#"{"success":true,"message":"18°C, cloudy"}"#),
        Message::tool(
            "call_2",
            r#"{"success":false,"error_code":"TIMEOUT","message":"no answer"}"#,
        ),
        Message::Assistant {
            content: Some("A cat. Paris: 18°C.".into()),
            tool_calls: vec![ToolCall::new("call_3", "get_weather", "{}")],
            thinking: Vec::new(),
            model: None,
        },
        Message::tool("call_3", "{}"),
        Message::assistant("Anything else?"),
        Message::user("No, thanks."),
    ]
}

fn requests() -> Vec<(&'static str, ChatRequest)> {
    let base = ChatRequest {
        model: "gpt-4o-mini".into(),
        messages: conversation(),
        tools: vec![weather_tool()].into(),
        tool_choice: Some(ToolChoice::Auto),
        parallel_tool_calls: Some(true),
        temperature: Some(0.7),
        max_completion_tokens: Some(1024),
        prompt_cache_key: Some(parlor_bot::llm::wire::prompt_cache_key("telegram:-100")),
    };
    let mut required = base.clone();
    required.tool_choice = Some(ToolChoice::Required);
    required.parallel_tool_calls = Some(false);
    let mut none = base.clone();
    none.tool_choice = Some(ToolChoice::None);
    none.temperature = None;
    none.max_completion_tokens = None;
    let mut no_tools = base.clone();
    no_tools.tools = Default::default();
    let minimal = chat_request("gpt-4o-mini", vec![Message::user("hi")]);
    // parlor's own image reference, which the agent resolves before a request: should one be
    // left, the body must still be valid.
    let mut unresolved = minimal.clone();
    unresolved.messages = vec![Message::User {
        content: Content::Parts(vec![
            ContentPart::Text {
                text: "look".into(),
            },
            ContentPart::ImageRef {
                image: ImageRef {
                    file_id: "AgACAgQAAxkBAAIB".into(),
                    mime_type: Some("image/jpeg".into()),
                    size: Some(12_345),
                },
                message_id: Some("42".into()),
            },
        ]),
    }];
    vec![
        ("tools, auto, parallel", base),
        ("an unresolved image reference", unresolved),
        ("tools, required, not parallel", required),
        ("tools, none", none),
        ("no tools but tool fields set", no_tools),
        ("minimal", minimal),
    ]
}

#[test]
fn every_request_body_is_a_valid_create_chat_completion_request() {
    let v = validator("CreateChatCompletionRequest");
    for (name, request) in requests() {
        let body = OpenAiClient::request_body(&request);
        assert_eq!(errors(&v, &body), Vec::<String>::new(), "{name}: {body:#}");
        assert_eq!(body["stream"], json!(true), "{name}");
        assert_eq!(
            body["stream_options"],
            json!({"include_usage": true}),
            "{name}"
        );
        let has_tools = !request.tools.is_empty();
        for key in ["tools", "tool_choice", "parallel_tool_calls"] {
            if has_tools {
                assert!(body.get(key).is_some(), "{name}: {key}");
            } else {
                assert!(body.get(key).is_none(), "{name}: {key} must be left out");
            }
        }
    }
}

/// What is POSTed is `request_body` serialized, byte for byte, though written without it:
/// for every request shape, and for text that needs escaping, numbers, and every optional
/// field present or absent.
#[test]
fn the_posted_bytes_are_the_request_body_serialized() {
    let mut shapes = requests();
    let mut odd = requests()[0].1.clone();
    odd.messages.extend([
        Message::user("quotes \" and \\ backslashes, \u{1} control, tab\t, newline\n, é ✓ 🎉"),
        Message::Assistant {
            content: None,
            tool_calls: Vec::new(),
            thinking: Vec::new(),
            model: None,
        },
        Message::Assistant {
            content: Some(String::new()),
            tool_calls: vec![ToolCall::new("", "x", "not json {")],
            // Anthropic's; never in an OpenAI body (checked below).
            thinking: vec![ThinkingBlock::Thinking {
                thinking: "hm".into(),
                signature: "sig".into(),
            }],
            model: None,
        },
        Message::tool("call_\"odd\"", "</script>"),
        Message::User {
            content: Content::Parts(Vec::new()),
        },
    ]);
    odd.temperature = Some(1.1);
    odd.max_completion_tokens = Some(u32::MAX);
    odd.tool_choice = None;
    odd.parallel_tool_calls = None;
    shapes.push(("escapes and edge cases", odd));
    for temperature in [0.0, -0.0, 2.0, 0.3, f32::NAN, f32::INFINITY] {
        let mut r = requests()[0].1.clone();
        r.temperature = Some(temperature);
        shapes.push(("temperature", r));
    }
    // Every ASCII character and a few others, at every offset of a word and past it.
    let mut every_char = requests()[5].1.clone();
    for c in (0u8..0x80)
        .map(char::from)
        .chain(['é', '\u{2028}', '✓', '🎉'])
    {
        for at in 0..18 {
            let mut text = "a".repeat(20);
            text.insert(at, c);
            every_char.messages.push(Message::user(text));
        }
    }
    shapes.push(("every character at every offset", every_char));
    // Strings mixing characters that are escaped with ones next to them in value, ASCII and
    // not, in every arrangement a simple generator comes up with.
    let alphabet = [
        'a', '"', '\\', '\n', '\u{1}', '\u{1f}', ' ', '!', '#', ']', '\u{7f}', 'é', 'Ģ',
    ];
    let mut mixed = requests()[5].1.clone();
    let mut seed = 0x2545_f491_u64;
    for _ in 0..3000 {
        let mut text = String::new();
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        for _ in 0..(seed >> 59) * 3 {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            text.push(alphabet[(seed >> 33) as usize % alphabet.len()]);
        }
        mixed.messages.push(Message::user(text));
    }
    shapes.push(("mixed escapes", mixed));
    for (name, request) in shapes {
        let expected = serde_json::to_vec(&OpenAiClient::request_body(&request)).unwrap();
        let posted = OpenAiClient::request_bytes(&request);
        let posted = String::from_utf8(posted).unwrap();
        // Anthropic's thinking blocks never reach an OpenAI-compatible server.
        assert!(!posted.contains("\"thinking\""), "{name}: {posted}");
        assert_eq!(posted, String::from_utf8(expected).unwrap(), "{name}");
    }
}

/// The schema itself must not be so loose that anything passes.
#[test]
fn the_request_schema_refuses_broken_bodies() {
    let v = validator("CreateChatCompletionRequest");
    let good = OpenAiClient::request_body(&requests()[0].1);
    let mut no_messages = good.clone();
    no_messages["messages"] = json!([]);
    let mut bad_role = good.clone();
    bad_role["messages"][0]["role"] = json!("wizard");
    let mut bad_tool = good.clone();
    bad_tool["tools"][0]["type"] = json!("procedure");
    let mut bad_choice = good.clone();
    bad_choice["tool_choice"] = json!("sometimes");
    for (name, body) in [
        ("no messages", no_messages),
        ("bad role", bad_role),
        ("bad tool type", bad_tool),
        ("bad tool_choice", bad_choice),
    ] {
        assert!(!v.is_valid(&body), "{name} must be refused");
    }
}

#[test]
fn the_exact_body_for_a_tool_conversation() {
    let mut request = requests()[0].1.clone();
    request.messages.truncate(4);
    let body = OpenAiClient::request_body(&request);
    expect_test::expect![[r#"
        {
          "max_completion_tokens": 1024,
          "messages": [
            {
              "content": "You are parlor, a helpful group member.",
              "role": "system"
            },
            {
              "content": [
                {
                  "text": "What is in this picture, and what's the weather in Paris?",
                  "type": "text"
                },
                {
                  "image_url": {
                    "detail": "low",
                    "url": "data:image/png;base64,iVBORw0KGgo="
                  },
                  "type": "image_url"
                },
                {
                  "image_url": {
                    "url": "https://example.com/cat.jpg"
                  },
                  "type": "image_url"
                }
              ],
              "role": "user"
            },
            {
              "role": "assistant",
              "tool_calls": [
                {
                  "function": {
                    "arguments": "{\"city\":\"Paris\"}",
                    "name": "get_weather"
                  },
                  "id": "call_1",
                  "type": "function"
                },
                {
                  "function": {
                    "arguments": "{\"city\":\"Lyon\"}",
                    "name": "get_weather"
                  },
                  "id": "call_2",
                  "type": "function"
                }
              ]
            },
            {
              "content": "{\"success\":true,\"message\":\"18°C, cloudy\"}",
              "role": "tool",
              "tool_call_id": "call_1"
            }
          ],
          "model": "gpt-4o-mini",
          "parallel_tool_calls": true,
          "prompt_cache_key": "parlor-d91e5475eade29be",
          "stream": true,
          "stream_options": {
            "include_usage": true
          },
          "temperature": 0.7,
          "tool_choice": "auto",
          "tools": [
            {
              "function": {
                "description": "Current weather of a city.",
                "name": "get_weather",
                "parameters": {
                  "additionalProperties": false,
                  "properties": {
                    "city": {
                      "description": "City name",
                      "type": "string"
                    }
                  },
                  "required": [
                    "city"
                  ],
                  "type": "object"
                }
              },
              "type": "function"
            }
          ]
        }"#]]
    .assert_eq(&serde_json::to_string_pretty(&body).unwrap());
}

/// Every chunk of every recording, as JSON: (recording, line number, chunk).
fn recorded_chunks(dir: &str) -> Vec<(String, usize, Value)> {
    let mut paths: Vec<_> = std::fs::read_dir(Path::new(FIXTURES).join("sse").join(dir))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    paths.sort();
    let mut out = Vec::new();
    for path in paths {
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        let text = std::fs::read_to_string(&path).unwrap();
        for (n, line) in text.lines().enumerate() {
            let data = line.strip_prefix("data: ").unwrap_or(line).trim();
            if data.is_empty() || data == "[DONE]" {
                continue;
            }
            out.push((name.clone(), n + 1, serde_json::from_str(data).unwrap()));
        }
    }
    out
}

#[test]
fn every_openai_recorded_chunk_is_a_valid_stream_response() {
    let v = validator("CreateChatCompletionStreamResponse");
    let chunks = recorded_chunks("openai-python");
    assert!(chunks.len() > 300);
    for (file, line, chunk) in &chunks {
        assert_eq!(errors(&v, chunk), Vec::<String>::new(), "{file}:{line}");
    }
}

/// Other providers' chunks deviate from OpenAI's schema in ways the assembler must
/// tolerate; this records which, per recording: valid chunks / all, and the distinct
/// reasons for the rest.
#[test]
fn other_providers_chunks_against_the_openai_schema() {
    let v = validator("CreateChatCompletionStreamResponse");
    let mut report = std::collections::BTreeMap::<String, (usize, usize, Vec<String>)>::new();
    for (file, _, chunk) in recorded_chunks("vercel-ai") {
        let entry = report.entry(file).or_default();
        entry.1 += 1;
        let errs: Vec<String> = v
            .iter_errors(&chunk)
            .map(|e| {
                // The reason without the offending value (which may be a long chunk).
                let path = e.instance_path().to_string();
                let reason = match e.kind() {
                    jsonschema::error::ValidationErrorKind::Required { property } => {
                        format!("missing {property}")
                    }
                    jsonschema::error::ValidationErrorKind::Type { kind } => {
                        format!("not of type {kind:?}")
                    }
                    jsonschema::error::ValidationErrorKind::Enum { .. } => "not in enum".into(),
                    jsonschema::error::ValidationErrorKind::Constant { .. } => {
                        "wrong constant".into()
                    }
                    other => format!("{other:?}").chars().take(60).collect(),
                };
                // Array indices vary from chunk to chunk; the reason does not.
                let path: String = path
                    .split('/')
                    .map(|p| if p.parse::<u64>().is_ok() { "N" } else { p })
                    .collect::<Vec<_>>()
                    .join("/");
                format!("{path}: {reason}")
            })
            .collect();
        if errs.is_empty() {
            entry.0 += 1;
        }
        for e in errs {
            if !entry.2.contains(&e) {
                entry.2.push(e);
            }
        }
    }
    let text: String = report
        .iter()
        .map(|(file, (ok, all, reasons))| {
            let mut s = format!("{file}: {ok}/{all} valid\n");
            for r in reasons {
                s.push_str(&format!("    {r}\n"));
            }
            s
        })
        .collect();
    eprintln!("{text}");
    expect_test::expect![[r#"
        alibaba__alibaba-tool-call.chunks.txt: 0/6 valid
            /system_fingerprint: not of type Single(String)
            /choices/N: missing "finish_reason"
        deepseek__deepseek-tool-call.chunks.txt: 52/52 valid
        groq__groq-tool-call.chunks.txt: 3/3 valid
        mistral__mistral-incremental-tool-call.chunks.txt: 3/3 valid
        moonshotai__moonshotai-stream.chunks.txt: 0/4 valid
            : missing "object"
        openai-compatible__anthropic-fallback-tool-call.sse: 8/8 valid
        openai-compatible__xai-tool-call.chunks.txt: 2/230 valid
            /choices/N: missing "finish_reason"
        openai__azure-model-router.1.chunks.txt: 0/8 valid
            /object: not in enum
            /system_fingerprint: not of type Single(String)
        perplexity__perplexity-citations.chunks.txt: 0/8 valid
            /choices/N: missing "finish_reason"
            /object: not in enum
        xai__xai-tool-call.chunks.txt: 2/8 valid
            /choices/N: missing "finish_reason"
    "#]]
    .assert_eq(&text);
}
