//! The agent loop against an in-memory scripted model: concurrency bound, result order,
//! truncation, unknown tools, invalid arguments, panics, timeouts, cancellation, the
//! iteration limit, permissions and the todo reminder.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use parlor_bot::agent::{Agent, AgentConfig, TurnEnd, TurnInput};
use parlor_bot::llm::{Completion, Content, ContentPart, ImageUrl, Message, ToolCall};
use parlor_bot::tool::{
    Caller, Risk, Role, ToolContext, ToolInvocation, ToolRegistry, ToolResult, ToolSet, ToolSpec,
    codes,
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use parlor_bot::testing::{ScriptedLlm, calls, text, tool_results};

/// Tools for the tests: `sleep {ms, tag}` tracks how many run at once; `big {chars}` returns
/// a long result; `boom` panics; `hang` never finishes; `nuke` is dangerous (operators only);
/// `look` appends an image message.
#[derive(Default)]
struct TestTools {
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    started: AtomicUsize,
}

#[async_trait]
impl ToolSet for TestTools {
    fn name(&self) -> &str {
        "test"
    }

    fn tools(&self) -> Vec<ToolSpec> {
        let spec = |name: &str, risk, parameters: Value| ToolSpec {
            name: name.into(),
            description: format!("test tool {name}"),
            parameters,
            result: "test".into(),
            risk,
            role: if risk == Risk::Dangerous {
                Role::Operator
            } else {
                Role::Member
            },
            role_in_chat_arg: None,
            failure_codes: vec![],
            offer: Default::default(),
        };
        vec![
            spec(
                "sleep",
                Risk::Read,
                json!({"type":"object","properties":{"ms":{"type":"integer","minimum":0},"tag":{"type":"string"}},"required":["ms","tag"]}),
            ),
            spec(
                "big",
                Risk::Read,
                json!({"type":"object","properties":{"chars":{"type":"integer"}},"required":["chars"]}),
            ),
            spec("boom", Risk::Read, json!({"type":"object","properties":{}})),
            spec("hang", Risk::Read, json!({"type":"object","properties":{}})),
            spec(
                "nuke",
                Risk::Dangerous,
                json!({"type":"object","properties":{}}),
            ),
            spec("look", Risk::Read, json!({"type":"object","properties":{}})),
        ]
    }

    async fn invoke(&self, call: ToolInvocation, cx: ToolContext) -> ToolResult {
        self.started.fetch_add(1, Ordering::SeqCst);
        match call.name.as_str() {
            "sleep" => {
                let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                self.max_in_flight.fetch_max(now, Ordering::SeqCst);
                let ms = call.arguments["ms"].as_u64().unwrap();
                tokio::time::sleep(Duration::from_millis(ms)).await;
                self.in_flight.fetch_sub(1, Ordering::SeqCst);
                ToolResult::ok(format!("slept {}", call.arguments["tag"].as_str().unwrap()))
            }
            "big" => {
                let n = call.arguments["chars"].as_u64().unwrap() as usize;
                ToolResult::ok("big").with_data(json!("é".repeat(n)))
            }
            "boom" => panic!("secret database password is hunter2"),
            "hang" => {
                cx.cancel.cancelled().await;
                ToolResult::ok("unreachable in these tests")
            }
            "nuke" => ToolResult::ok("nuked"),
            "look" => {
                cx.appender.push(Message::User {
                    content: Content::Parts(vec![
                        ContentPart::Text {
                            text: "image loaded by look".into(),
                        },
                        ContentPart::ImageUrl {
                            image_url: ImageUrl {
                                url: "data:image/png;base64,AAAA".into(),
                                detail: None,
                            },
                        },
                    ]),
                });
                ToolResult::ok("image attached")
            }
            other => ToolResult::err(codes::TOOL_NOT_FOUND, other.to_owned()),
        }
    }

    fn fork(&self) -> Arc<dyn ToolSet> {
        Arc::new(TestTools::default())
    }
}

fn member() -> Caller {
    Caller {
        user_id: "console:alice".into(),
        name: "alice".into(),
        role: Role::Member,
        grants: Vec::new(),
    }
}

fn agent_with(llm: Arc<ScriptedLlm>, tools: Arc<TestTools>, config: AgentConfig) -> Agent {
    let registry = ToolRegistry::new(vec![tools]).unwrap();
    Agent::new(llm, registry, "You are a test bot.", config)
}

fn input(text: &str) -> TurnInput {
    TurnInput::text("console:local", member(), text)
}

/// Every assistant tool call is answered by exactly one tool message, in order.
fn assert_no_dangling_calls(messages: &[Message]) {
    let mut i = 0;
    while i < messages.len() {
        if let Message::Assistant { tool_calls, .. } = &messages[i] {
            for (k, call) in tool_calls.iter().enumerate() {
                match messages.get(i + 1 + k) {
                    Some(Message::Tool { tool_call_id, .. }) => assert_eq!(tool_call_id, &call.id),
                    other => panic!("call {} has no answer, found {other:?}", call.id),
                }
            }
            i += tool_calls.len();
        }
        i += 1;
    }
}

#[tokio::test(start_paused = true)]
async fn concurrency_never_exceeds_the_limit_and_results_keep_call_order() {
    let batch: Vec<(String, Value)> = (0..10)
        .map(|i| {
            // Later calls finish sooner, so completion order is the reverse of call order.
            (
                format!("call_{i}"),
                json!({"ms": 1000 - i * 90, "tag": format!("t{i}")}),
            )
        })
        .collect();
    let batch_refs: Vec<(&str, &str, Value)> = batch
        .iter()
        .map(|(id, args)| (id.as_str(), "sleep", args.clone()))
        .collect();
    let llm = ScriptedLlm::new(vec![calls(&batch_refs), text("all done")]);
    let tools = Arc::new(TestTools::default());
    let agent = agent_with(llm.clone(), tools.clone(), AgentConfig::default());

    let turn = agent
        .run_turn(&[], input("go"), CancellationToken::new())
        .await
        .unwrap();

    assert_eq!(tools.max_in_flight.load(Ordering::SeqCst), 4);
    assert_eq!(tools.started.load(Ordering::SeqCst), 10);
    let results = tool_results(&turn.messages);
    let ids: Vec<_> = results.iter().map(|(id, _)| id.clone()).collect();
    let expected: Vec<_> = (0..10).map(|i| format!("call_{i}")).collect();
    assert_eq!(ids, expected);
    for (i, (_, r)) in results.iter().enumerate() {
        assert_eq!(r["message"], format!("slept t{i}"));
    }
    assert_eq!(turn.reply, "all done");
    assert_eq!(turn.end, TurnEnd::Answered);
    assert_eq!(turn.iterations, 2);
    assert_no_dangling_calls(&turn.messages);

    // The second request carries the assistant's calls and all ten answers.
    let second = &llm.requests()[1];
    assert_eq!(second.messages.len(), 1 + 1 + 1 + 10);
}

#[tokio::test(start_paused = true)]
async fn a_limit_of_one_runs_calls_one_at_a_time() {
    let llm = ScriptedLlm::new(vec![
        calls(&[
            ("a", "sleep", json!({"ms": 10, "tag": "a"})),
            ("b", "sleep", json!({"ms": 10, "tag": "b"})),
            ("c", "sleep", json!({"ms": 10, "tag": "c"})),
        ]),
        text("ok"),
    ]);
    let tools = Arc::new(TestTools::default());
    let config = AgentConfig {
        max_concurrent_tool_calls: 1,
        ..AgentConfig::default()
    };
    let agent = agent_with(llm, tools.clone(), config);
    agent
        .run_turn(&[], input("go"), CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(tools.max_in_flight.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn long_results_are_cut_on_a_char_boundary_with_a_note() {
    let llm = ScriptedLlm::new(vec![
        calls(&[("c1", "big", json!({"chars": 20000}))]),
        text("ok"),
    ]);
    let config = AgentConfig {
        tool_result_max_chars: 1000,
        ..AgentConfig::default()
    };
    let agent = agent_with(llm, Arc::new(TestTools::default()), config);
    let turn = agent
        .run_turn(&[], input("go"), CancellationToken::new())
        .await
        .unwrap();
    let Message::Tool { content, .. } = &turn.messages[2] else {
        panic!("expected a tool message, got {:?}", turn.messages[2]);
    };
    let (kept, note) = content.split_once("\n[truncated: ").unwrap();
    assert_eq!(kept.chars().count(), 1000);
    let total = ToolResult::ok("big")
        .with_data(json!("é".repeat(20000)))
        .to_json()
        .chars()
        .count();
    assert_eq!(note, format!("{} of {total} characters cut]", total - 1000));
}

#[tokio::test]
async fn unknown_tool_names_the_tools_that_exist() {
    let llm = ScriptedLlm::new(vec![calls(&[("c1", "fly", json!({}))]), text("sorry")]);
    let agent = agent_with(llm, Arc::new(TestTools::default()), AgentConfig::default());
    let turn = agent
        .run_turn(&[], input("go"), CancellationToken::new())
        .await
        .unwrap();
    let (_, result) = &tool_results(&turn.messages)[0];
    assert_eq!(result["success"], false);
    assert_eq!(result["error_code"], codes::TOOL_NOT_FOUND);
    let message = result["message"].as_str().unwrap();
    for name in ["sleep", "big", "boom", "hang", "nuke", "look"] {
        assert!(message.contains(name), "{message} should name {name}");
    }
    assert_eq!(turn.reply, "sorry");
}

#[tokio::test]
async fn invalid_arguments_are_refused_before_the_tool_runs() {
    let llm = ScriptedLlm::new(vec![
        calls(&[
            ("c1", "sleep", json!({"ms": "soon", "tag": "x"})),
            ("c2", "sleep", json!({"tag": "x"})),
        ]),
        Completion {
            tool_calls: vec![ToolCall::new("c3", "sleep", "{not json")],
            ..Completion::default()
        },
        text("fixed"),
    ]);
    let tools = Arc::new(TestTools::default());
    let agent = agent_with(llm, tools.clone(), AgentConfig::default());
    let turn = agent
        .run_turn(&[], input("go"), CancellationToken::new())
        .await
        .unwrap();
    let results = tool_results(&turn.messages);
    assert_eq!(results.len(), 3);
    for (_, r) in &results {
        assert_eq!(r["error_code"], codes::INVALID_ARGUMENTS, "{r}");
    }
    assert!(
        results[0].1["message"].as_str().unwrap().contains("/ms"),
        "{}",
        results[0].1
    );
    assert!(
        results[1].1["message"].as_str().unwrap().contains("ms"),
        "{}",
        results[1].1
    );
    assert!(
        results[2].1["message"]
            .as_str()
            .unwrap()
            .contains("not valid JSON"),
        "{}",
        results[2].1
    );
    assert_eq!(
        tools.started.load(Ordering::SeqCst),
        0,
        "no tool may run on bad input"
    );
    assert_eq!(turn.reply, "fixed");
}

#[tokio::test]
async fn a_panicking_tool_becomes_internal_and_the_turn_goes_on() {
    let llm = ScriptedLlm::new(vec![
        calls(&[
            ("c1", "boom", json!({})),
            ("c2", "sleep", json!({"ms": 1, "tag": "after"})),
        ]),
        text("recovered"),
    ]);
    let agent = agent_with(llm, Arc::new(TestTools::default()), AgentConfig::default());
    let turn = agent
        .run_turn(&[], input("go"), CancellationToken::new())
        .await
        .unwrap();
    let results = tool_results(&turn.messages);
    assert_eq!(results[0].1["error_code"], codes::INTERNAL);
    let raw = serde_json::to_string(&turn.messages).unwrap();
    assert!(!raw.contains("hunter2"), "panic text leaked: {raw}");
    assert_eq!(results[1].1["success"], true);
    assert_eq!(turn.reply, "recovered");
}

#[tokio::test(start_paused = true)]
async fn cancelling_mid_batch_answers_every_call_and_leaves_nothing_dangling() {
    let llm = ScriptedLlm::new(vec![calls(&[
        ("fast", "sleep", json!({"ms": 10, "tag": "fast"})),
        ("h1", "hang", json!({})),
        ("h2", "hang", json!({})),
        ("later1", "sleep", json!({"ms": 10, "tag": "l1"})),
        ("later2", "sleep", json!({"ms": 10, "tag": "l2"})),
        ("later3", "sleep", json!({"ms": 10, "tag": "l3"})),
    ])]);
    let tools = Arc::new(TestTools::default());
    let config = AgentConfig {
        max_concurrent_tool_calls: 3,
        ..AgentConfig::default()
    };
    let agent = agent_with(llm.clone(), tools.clone(), config);
    let cancel = CancellationToken::new();
    let stopper = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        stopper.cancel();
    });
    let turn = agent.run_turn(&[], input("go"), cancel).await.unwrap();

    assert_eq!(turn.end, TurnEnd::Cancelled);
    assert_eq!(turn.reply, "");
    assert_no_dangling_calls(&turn.messages);
    let results = tool_results(&turn.messages);
    let summary: Vec<(String, Value)> = results
        .iter()
        .map(|(id, r)| (id.clone(), r["error_code"].clone()))
        .collect();
    assert_eq!(summary[0], ("fast".into(), Value::Null));
    assert_eq!(summary[1], ("h1".into(), json!("CANCELLED")));
    assert_eq!(summary[2], ("h2".into(), json!("CANCELLED")));
    // later1 started when fast finished; later2 and later3 waited behind the hung calls.
    assert_eq!(summary[3].0, "later1");
    assert_eq!(summary[4], ("later2".into(), json!("CANCELLED")));
    assert_eq!(summary[5], ("later3".into(), json!("CANCELLED")));
    assert_eq!(results.len(), 6);
    assert_eq!(llm.requests().len(), 1, "no request after the cancel");
}

#[tokio::test(start_paused = true)]
async fn a_slow_tool_times_out() {
    let llm = ScriptedLlm::new(vec![calls(&[("c1", "hang", json!({}))]), text("it hung")]);
    let config = AgentConfig {
        tool_timeout: Duration::from_secs(5),
        ..AgentConfig::default()
    };
    let agent = agent_with(llm, Arc::new(TestTools::default()), config);
    let started = tokio::time::Instant::now();
    let turn = agent
        .run_turn(&[], input("go"), CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(started.elapsed(), Duration::from_secs(5));
    assert_eq!(
        tool_results(&turn.messages)[0].1["error_code"],
        codes::TIMEOUT
    );
    assert_eq!(turn.reply, "it hung");
}

#[tokio::test]
async fn the_iteration_limit_ends_the_turn_with_a_clear_message() {
    let replies = (0..5)
        .map(|i| calls(&[(&*format!("c{i}"), "sleep", json!({"ms": 0, "tag": "loop"}))]))
        .collect();
    let llm = ScriptedLlm::new(replies);
    let config = AgentConfig {
        max_iterations: 3,
        ..AgentConfig::default()
    };
    let agent = agent_with(llm.clone(), Arc::new(TestTools::default()), config);
    let turn = agent
        .run_turn(&[], input("loop"), CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(turn.end, TurnEnd::IterationLimit);
    assert_eq!(llm.requests().len(), 3);
    assert!(
        turn.reply.contains("stopped after 3 steps"),
        "{}",
        turn.reply
    );
    assert_eq!(turn.messages.last(), Some(&Message::assistant(&turn.reply)));
    assert_no_dangling_calls(&turn.messages);
}

#[tokio::test]
async fn operator_tools_need_an_operator() {
    let llm = ScriptedLlm::new(vec![
        calls(&[("c1", "nuke", json!({}))]),
        text("denied"),
        calls(&[("c2", "nuke", json!({}))]),
        text("done"),
    ]);
    let agent = agent_with(llm, Arc::new(TestTools::default()), AgentConfig::default());
    let turn = agent
        .run_turn(&[], input("nuke it"), CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(
        tool_results(&turn.messages)[0].1["error_code"],
        codes::PERMISSION_DENIED
    );

    let admin = Caller {
        role: Role::Operator,
        ..member()
    };
    let turn = agent
        .run_turn(
            &[],
            TurnInput::text("console:local", admin, "nuke it"),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(tool_results(&turn.messages)[0].1["success"], true);
}

#[tokio::test]
async fn appended_messages_follow_the_tool_results() {
    let llm = ScriptedLlm::new(vec![calls(&[("c1", "look", json!({}))]), text("a cat")]);
    let agent = agent_with(
        llm.clone(),
        Arc::new(TestTools::default()),
        AgentConfig::default(),
    );
    let turn = agent
        .run_turn(
            &[],
            input("what is in the picture?"),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert!(matches!(turn.messages[2], Message::Tool { .. }));
    let Message::User {
        content: Content::Parts(parts),
    } = &turn.messages[3]
    else {
        panic!("expected the appended image, got {:?}", turn.messages[3]);
    };
    assert!(matches!(parts[1], ContentPart::ImageUrl { .. }));
    // ...and the model saw it in the next request.
    assert_eq!(llm.requests()[1].messages.last(), Some(&turn.messages[3]));
}

#[test]
fn registry_refuses_bad_and_duplicate_names() {
    struct Named(&'static str);
    #[async_trait]
    impl ToolSet for Named {
        fn name(&self) -> &str {
            "named"
        }
        fn tools(&self) -> Vec<ToolSpec> {
            vec![ToolSpec {
                name: self.0.into(),
                description: "x".into(),
                parameters: json!({"type":"object","properties":{}}),
                result: "x".into(),
                risk: Risk::Read,
                role: Role::Member,
                role_in_chat_arg: None,
                failure_codes: vec![],
                offer: Default::default(),
            }]
        }
        async fn invoke(&self, _: ToolInvocation, _: ToolContext) -> ToolResult {
            ToolResult::ok("x")
        }
        fn fork(&self) -> Arc<dyn ToolSet> {
            Arc::new(Named(self.0))
        }
    }
    for bad in ["memory.save", "", "has space", &"x".repeat(65)] {
        let name: &'static str = Box::leak(bad.to_owned().into_boxed_str());
        let err = ToolRegistry::new(vec![Arc::new(Named(name))]).unwrap_err();
        assert!(err.to_string().contains("invalid"), "{bad:?}: {err}");
    }
    assert!(ToolRegistry::new(vec![Arc::new(Named("ok-name_1"))]).is_ok());
    let err =
        ToolRegistry::new(vec![Arc::new(Named("same")), Arc::new(Named("same"))]).unwrap_err();
    assert!(err.to_string().contains("declared by both"), "{err}");
}

/// Stray tool calls (`agent/stray.rs`): an answer that writes a call as text is retried
/// once with a nudge and never posted or stored.
mod stray_calls {
    use super::*;
    use parlor_bot::agent::stray::{APOLOGY, NUDGE};

    const CALL: &str = r#"{"name": "sleep", "arguments": {"ms": 0, "tag": "x"}}"#;

    fn patterns() -> Vec<String> {
        vec![
            format!("<tool_call>\n{CALL}\n</tool_call>"),
            format!("I will wait.\n<tool_call>\n{CALL}\n</tool_call>"),
            format!("<function_calls>\n<invoke name=\"sleep\">\n</invoke>\n</function_calls>"),
            format!("Sure:\n<function_calls><invoke name=\"sleep\"></invoke></function_calls>"),
            CALL.to_owned(),
            format!("Waiting now:\n{CALL}"),
            format!("```json\n{CALL}\n```"),
            format!("<|python_tag|>{CALL}"),
            format!("Let me check. <|python_tag|>{CALL}"),
            format!("<|tool_call|>{CALL}"),
            format!("One moment. <|tool_call|>{CALL}"),
            format!("[TOOL_CALLS] [{CALL}]"),
            format!("On it.\n[TOOL_CALLS] [{CALL}]"),
            r#"{"name": "sleep", "parameters": {"ms": 0, "tag": "x"}}"#.to_owned(),
            "On it:\n```json\n{\"name\": \"sleep\", \"parameters\": {\"ms\": 0}}\n```".to_owned(),
        ]
    }

    /// One turn on an empty history, with the test tools and default limits.
    async fn run_once(llm: &Arc<ScriptedLlm>, text: &str) -> parlor_bot::agent::Turn {
        agent_with(
            Arc::clone(llm),
            Arc::new(TestTools::default()),
            AgentConfig::default(),
        )
        .run_turn(&[], input(text), CancellationToken::new())
        .await
        .unwrap()
    }

    fn all_text(messages: &[Message]) -> String {
        messages
            .iter()
            .map(|m| format!("{m:?}"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[tokio::test]
    async fn a_stray_call_is_retried_with_a_nudge_and_never_posted() {
        for stray in patterns() {
            let llm = ScriptedLlm::new(vec![
                text(&stray),
                calls(&[("c1", "sleep", json!({"ms": 0, "tag": "x"}))]),
                text("Done waiting."),
            ]);
            let turn = run_once(&llm, "wait a bit").await;
            assert_eq!(turn.reply, "Done waiting.", "{stray}");
            assert_eq!(turn.end, TurnEnd::Answered);
            let requests = llm.requests();
            assert_eq!(requests.len(), 3, "{stray}");
            // The retry carries the stray answer and the nudge; the request after it does not.
            let retry = &requests[1].messages;
            assert_eq!(retry.last(), Some(&Message::user(NUDGE)), "{stray}");
            assert!(!all_text(&requests[2].messages).contains(NUDGE));
            // Neither is stored with the turn.
            let stored = all_text(&turn.messages);
            assert!(
                !stored.contains(NUDGE) && !stored.contains("python_tag"),
                "{stored}"
            );
            assert!(
                !stored.contains("<tool_call>")
                    && !stored.contains("<invoke")
                    && !stored.contains("TOOL_CALLS")
                    && !stored.contains("|tool_call|")
                    && !stored.contains("parameters"),
                "{stored}"
            );
            assert_no_dangling_calls(&turn.messages);
        }
    }

    #[tokio::test]
    async fn a_second_stray_answer_becomes_an_apology() {
        for stray in patterns() {
            let llm = ScriptedLlm::new(vec![text(&stray), text(&stray)]);
            let turn = run_once(&llm, "wait a bit").await;
            assert_eq!(turn.reply, APOLOGY, "{stray}");
            assert_eq!(llm.requests().len(), 2, "retried once only: {stray}");
            assert_eq!(turn.messages.len(), 2);
            assert_eq!(turn.messages.last(), Some(&Message::assistant(APOLOGY)));
        }
    }

    #[tokio::test]
    async fn ordinary_answers_and_requests_without_tools_are_left_alone() {
        let mention = format!("You could send {CALL} to the API, as its docs show.");
        let llm = ScriptedLlm::new(vec![text(&mention)]);
        let turn = run_once(&llm, "how?").await;
        assert_eq!(turn.reply, mention);
        assert_eq!(llm.requests().len(), 1);

        // Without tools in the request, JSON is what the user asked for.
        let llm = ScriptedLlm::new(vec![text(CALL)]);
        let agent = Agent::new(
            llm.clone(),
            ToolRegistry::new(vec![]).unwrap(),
            "You are a test bot.",
            AgentConfig::default(),
        );
        let turn = agent
            .run_turn(&[], input("json please"), CancellationToken::new())
            .await
            .unwrap();
        assert_eq!(turn.reply, CALL);
        assert_eq!(llm.requests().len(), 1);
    }
}
