//! ToolSetBridge: every function shape through `ToolSet::invoke`, error paths, panics,
//! specs and builder checks.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use expect_test::expect;
use parlor_bot::llm::Message;
use parlor_bot::tool::bridge::{BridgeError, IntoToolResult, ToolError, is_valid_tool_name};
use parlor_bot::tool::{
    Caller, MessageAppender, Risk, Role, ToolContext, ToolInvocation, ToolResult, ToolSet,
    ToolSetBridge, codes,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// Arguments of `echo`.
#[derive(Debug, Deserialize, JsonSchema)]
struct EchoArgs {
    /// Text to send back.
    text: String,
    /// How many times.
    #[serde(default = "one")]
    times: u32,
    /// Optional suffix.
    suffix: Option<String>,
}

fn one() -> u32 {
    1
}

#[derive(Debug, Serialize)]
struct Echoed {
    text: String,
}

async fn echo(args: EchoArgs) -> Result<Echoed, ToolError> {
    if args.times == 0 {
        return Err(
            ToolError::new("ZERO_TIMES", "times must be at least 1").with_data(json!({"min": 1}))
        );
    }
    let mut text = args.text.repeat(args.times as usize);
    if let Some(suffix) = args.suffix {
        text.push_str(&suffix);
    }
    Ok(Echoed { text })
}

#[derive(Debug, Deserialize, JsonSchema)]
struct ImageArgs {
    /// The image URL.
    url: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
struct WaitArgs {
    /// Seconds to wait at most.
    seconds: u64,
}

#[derive(Debug, Deserialize, JsonSchema)]
struct NoArgs;

fn cx() -> ToolContext {
    ToolContext {
        session: "console:local".to_owned(),
        caller: Caller {
            user_id: "console:alice".to_owned(),
            name: "Alice".to_owned(),
            role: Role::Operator,
            grants: Vec::new(),
        },
        cancel: CancellationToken::new(),
        appender: MessageAppender::default(),
        ..ToolContext::default()
    }
}

fn call(name: &str, arguments: Value) -> ToolInvocation {
    ToolInvocation {
        id: "call_1".to_owned(),
        name: name.to_owned(),
        arguments,
    }
}

/// A toolset with one tool of each shape (and a few misbehaving ones).
fn toolset() -> ToolSetBridge {
    ToolSetBridge::builder("demo")
        .prompt("Demo tools.")
        .add_function("echo", "Repeats the text.", echo)
        .failure_codes(&["ZERO_TIMES"])
        .result_doc("`{\"text\": string}`, the repeated text")
        .add_function_with_messages(
            "show_image",
            "Shows an image to the model.",
            |args: ImageArgs, appender: MessageAppender| async move {
                appender.push(Message::user(format!("[image {}]", args.url)));
                ToolResult::ok("the image follows")
            },
        )
        .risk(Risk::Write)
        .add_function_cancellable(
            "wait",
            "Waits until cancelled or the time is up.",
            |args: WaitArgs, cancel: CancellationToken| async move {
                tokio::select! {
                    () = cancel.cancelled() => Err(ToolError::cancelled("stopped while waiting")),
                    () = tokio::time::sleep(Duration::from_secs(args.seconds)) => Ok("waited"),
                }
            },
        )
        .add_function_with_context(
            "whoami",
            "Says who is calling.",
            |_: NoArgs, cx: ToolContext| async move {
                Ok::<_, ToolError>(json!({"session": cx.session, "caller": cx.caller.name}))
            },
        )
        .risk(Risk::Dangerous)
        .role(Role::Operator)
        .add_function("boom", "Panics.", |_: NoArgs| async move {
            if true {
                panic!("secret token sk-12345 leaked in panic");
            }
            ToolResult::ok("unreachable")
        })
        .add_function(
            "unit",
            "Takes no arguments, returns nothing.",
            |(): ()| async { Ok::<(), ToolError>(()) },
        )
        .build()
        .expect("valid toolset")
}

#[tokio::test]
async fn plain_function_runs_and_returns_data() {
    let result = toolset()
        .invoke(call("echo", json!({"text": "ab", "times": 2})), cx())
        .await;
    expect![[r#"{"success":true,"message":"ok","data":{"text":"abab"}}"#]]
        .assert_eq(&result.to_json());
}

#[tokio::test]
async fn defaults_and_null_optionals_are_applied() {
    // `times` absent -> its serde default; `suffix: null` -> None (models send null).
    let result = toolset()
        .invoke(call("echo", json!({"text": "a", "suffix": null})), cx())
        .await;
    assert_eq!(result.data, Some(json!({"text": "a"})));
    // `times: null` for a `#[serde(default)]` field also means the default.
    let result = toolset()
        .invoke(call("echo", json!({"text": "a", "times": null})), cx())
        .await;
    assert_eq!(result.data, Some(json!({"text": "a"})), "{result:?}");
}

#[tokio::test]
async fn tool_error_keeps_its_code_message_and_data() {
    let result = toolset()
        .invoke(call("echo", json!({"text": "a", "times": 0})), cx())
        .await;
    expect![[r#"{"success":false,"error_code":"ZERO_TIMES","message":"times must be at least 1","data":{"min":1}}"#]]
        .assert_eq(&result.to_json());
}

#[tokio::test]
async fn with_messages_appends_to_the_conversation() {
    let context = cx();
    let appender = context.appender.clone();
    let result = toolset()
        .invoke(
            call("show_image", json!({"url": "https://x/cat.png"})),
            context,
        )
        .await;
    assert_eq!(result, ToolResult::ok("the image follows"));
    assert_eq!(
        appender.drain(),
        vec![Message::user("[image https://x/cat.png]")]
    );
}

#[tokio::test(start_paused = true)]
async fn cancellable_sees_the_token_cancelled() {
    let tools = toolset();
    let context = cx();
    let cancel = context.cancel.clone();
    let running = tokio::spawn(async move {
        tools
            .invoke(call("wait", json!({"seconds": 3600})), context)
            .await
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    cancel.cancel();
    let result = running.await.expect("no panic");
    assert_eq!(result.code(), Some(codes::CANCELLED));
    assert_eq!(result.message, "stopped while waiting");

    // Not cancelled: it runs to the end.
    let result = toolset()
        .invoke(call("wait", json!({"seconds": 5})), cx())
        .await;
    assert_eq!(result, ToolResult::ok("waited"));
}

#[tokio::test]
async fn with_context_sees_session_and_caller() {
    let result = toolset().invoke(call("whoami", json!({})), cx()).await;
    expect![[
        r#"{"success":true,"message":"ok","data":{"caller":"Alice","session":"console:local"}}"#
    ]]
    .assert_eq(&result.to_json());
}

#[tokio::test]
async fn unit_arguments_and_unit_result() {
    let result = toolset().invoke(call("unit", json!({})), cx()).await;
    assert_eq!(result, ToolResult::ok("ok"));
}

#[tokio::test]
async fn a_panicking_tool_answers_internal_without_the_panic_text() {
    let result = toolset().invoke(call("boom", json!({})), cx()).await;
    assert_eq!(result.code(), Some(codes::INTERNAL));
    let json = result.to_json();
    assert!(!json.contains("sk-12345"), "{json}");
    assert!(!json.contains("panic"), "{json}");
    expect![[r#"{"success":false,"error_code":"INTERNAL","message":"the tool failed unexpectedly; the error was logged"}"#]]
        .assert_eq(&json);
    // The toolset still works afterwards.
    let result = toolset().invoke(call("unit", json!({})), cx()).await;
    assert!(result.success);
}

#[tokio::test]
async fn a_panic_before_the_first_await_is_caught_too() {
    let tools = ToolSetBridge::builder("sync_panic")
        .add_function("now", "Panics synchronously.", |_: NoArgs| {
            panic!("sync secret");
            #[allow(unreachable_code)]
            async {
                ToolResult::ok("never")
            }
        })
        .build()
        .expect("valid");
    let result = tools.invoke(call("now", json!({})), cx()).await;
    assert_eq!(result.code(), Some(codes::INTERNAL));
    assert!(!result.message.contains("sync secret"));
}

#[tokio::test]
async fn bad_arguments_are_invalid_arguments() {
    let result = toolset()
        .invoke(call("echo", json!({"text": 5})), cx())
        .await;
    expect![[r#"{"success":false,"error_code":"INVALID_ARGUMENTS","message":"the arguments could not be read: invalid type: integer `5`, expected a string"}"#]]
        .assert_eq(&result.to_json());
    let result = toolset().invoke(call("echo", json!({})), cx()).await;
    assert_eq!(result.code(), Some(codes::INVALID_ARGUMENTS));
    assert!(
        result.message.contains("missing field `text`"),
        "{result:?}"
    );
}

#[tokio::test]
async fn unknown_tool_is_tool_not_found() {
    let result = toolset().invoke(call("nope", json!({})), cx()).await;
    expect![[r#"{"success":false,"error_code":"TOOL_NOT_FOUND","message":"the toolset `demo` has no tool `nope`"}"#]]
        .assert_eq(&result.to_json());
}

#[test]
fn tools_lists_specs_with_metadata() {
    let tools = toolset();
    assert_eq!(tools.name(), "demo");
    assert_eq!(tools.prompt().as_deref(), Some("Demo tools."));
    assert_eq!(tools.iteration_prompt_injection("console:local"), None);
    let summary: Vec<Value> = tools
        .tools()
        .iter()
        .map(|spec| {
            json!({
                "name": spec.name,
                "risk": spec.risk.as_str(),
                "role": spec.role.as_str(),
                "role_in_chat_arg": spec.role_in_chat_arg,
                "failure_codes": spec.failure_codes,
                "result": spec.result,
            })
        })
        .collect();
    expect![[r#"
        [
          {
            "failure_codes": [
              "ZERO_TIMES"
            ],
            "name": "echo",
            "result": "`{\"text\": string}`, the repeated text",
            "risk": "read",
            "role": "member",
            "role_in_chat_arg": null
          },
          {
            "failure_codes": [],
            "name": "show_image",
            "result": "see message",
            "risk": "write",
            "role": "member",
            "role_in_chat_arg": null
          },
          {
            "failure_codes": [],
            "name": "wait",
            "result": "see message",
            "risk": "read",
            "role": "member",
            "role_in_chat_arg": null
          },
          {
            "failure_codes": [],
            "name": "whoami",
            "result": "see message",
            "risk": "dangerous",
            "role": "operator",
            "role_in_chat_arg": null
          },
          {
            "failure_codes": [],
            "name": "boom",
            "result": "see message",
            "risk": "read",
            "role": "member",
            "role_in_chat_arg": null
          },
          {
            "failure_codes": [],
            "name": "unit",
            "result": "see message",
            "risk": "read",
            "role": "member",
            "role_in_chat_arg": null
          }
        ]"#]]
    .assert_eq(&serde_json::to_string_pretty(&summary).expect("serializable"));

    let echo = &tools.tools()[0];
    assert_eq!(echo.description, "Repeats the text.");
    expect![[r#"{"type":"function","function":{"name":"echo","description":"Repeats the text.","parameters":{"properties":{"suffix":{"description":"Optional suffix.","type":"string"},"text":{"description":"Text to send back.","type":"string"},"times":{"default":1,"description":"How many times.","maximum":4294967295,"minimum":0,"type":"integer"}},"required":["text"],"type":"object"}}}"#]]
        .assert_eq(&serde_json::to_string(&echo.to_def()).expect("serializable"));
}

#[tokio::test]
async fn fork_shares_the_stateless_toolset_and_its_captures() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    let tools = ToolSetBridge::builder("count")
        .add_function("tick", "Counts calls.", move |_: NoArgs| {
            let counter = Arc::clone(&counter);
            async move { Ok::<_, ToolError>(counter.fetch_add(1, Ordering::SeqCst) + 1) }
        })
        .build()
        .expect("valid");
    let forked = tools.fork();
    assert_eq!(forked.name(), "count");
    assert_eq!(forked.tools(), tools.tools());
    forked.invoke(call("tick", json!({})), cx()).await;
    let result = tools.invoke(call("tick", json!({})), cx()).await;
    assert_eq!(result.data, Some(json!(2)));
    forked.reset("s");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[test]
fn duplicate_names_fail_the_build() {
    let error = ToolSetBridge::builder("dup")
        .add_function("same", "One.", |_: NoArgs| async { ToolResult::ok("1") })
        .add_function("same", "Two.", |_: NoArgs| async { ToolResult::ok("2") })
        .build()
        .unwrap_err();
    assert_eq!(
        error,
        BridgeError::DuplicateName {
            toolset: "dup".to_owned(),
            tool: "same".to_owned()
        }
    );
    expect!["toolset `dup`: the tool name `same` is used twice"].assert_eq(&error.to_string());
}

#[test]
fn bad_names_descriptions_and_misplaced_metadata_fail_the_build() {
    let error = ToolSetBridge::builder("bad")
        .add_function("has.dot", "Dotted.", |_: NoArgs| async {
            ToolResult::ok("")
        })
        .build()
        .unwrap_err();
    assert!(matches!(error, BridgeError::InvalidName { .. }), "{error}");

    let error = ToolSetBridge::builder("bad")
        .add_function("blank", "  ", |_: NoArgs| async { ToolResult::ok("") })
        .build()
        .unwrap_err();
    assert!(
        matches!(error, BridgeError::EmptyDescription { .. }),
        "{error}"
    );

    let error = ToolSetBridge::builder("bad")
        .risk(Risk::Write)
        .add_function("ok", "Fine.", |_: NoArgs| async { ToolResult::ok("") })
        .build()
        .unwrap_err();
    expect!["toolset `bad`: `.risk()` was called before any tool was added"]
        .assert_eq(&error.to_string());
    let error = ToolSetBridge::builder("bad")
        .role(Role::Operator)
        .add_function("ok", "Fine.", |_: NoArgs| async { ToolResult::ok("") })
        .build()
        .unwrap_err();
    expect!["toolset `bad`: `.role()` was called before any tool was added"]
        .assert_eq(&error.to_string());

    // A root that is not an object (a bare string argument) is refused at build time.
    let error = ToolSetBridge::builder("bad")
        .add_function("str", "String args.", |_: String| async {
            ToolResult::ok("")
        })
        .build()
        .unwrap_err();
    assert!(matches!(error, BridgeError::Schema { .. }), "{error}");
}

#[test]
fn a_prompt_only_bridge_is_fine() {
    let tools = ToolSetBridge::builder("style")
        .prompt("Answer briefly.")
        .build()
        .expect("valid");
    assert!(tools.tools().is_empty());
    assert_eq!(tools.prompt().as_deref(), Some("Answer briefly."));
    let silent = ToolSetBridge::builder("none")
        .prompt("  ")
        .build()
        .expect("valid");
    assert_eq!(silent.prompt(), None);
}

#[test]
fn tool_names_follow_the_wire_rule() {
    assert!(is_valid_tool_name("todo_list"));
    assert!(is_valid_tool_name("get-message2"));
    assert!(is_valid_tool_name(&"a".repeat(64)));
    assert!(!is_valid_tool_name(&"a".repeat(65)));
    assert!(!is_valid_tool_name(""));
    assert!(!is_valid_tool_name("memory.save"));
    assert!(!is_valid_tool_name("naïve"));
}

#[test]
fn into_tool_result_conversions() {
    let ok: Result<&str, ToolError> = Ok("Sent.");
    assert_eq!(ok.into_tool_result(), ToolResult::ok("Sent."));
    let unit: Result<(), ToolError> = Ok(());
    assert_eq!(unit.into_tool_result(), ToolResult::ok("ok"));
    let data: Result<Vec<u8>, ToolError> = Ok(vec![1, 2]);
    assert_eq!(
        data.into_tool_result(),
        ToolResult::ok_with("ok", json!([1, 2]))
    );
    let err: Result<(), ToolError> = Err(ToolError::permission_denied("admins only"));
    assert_eq!(
        err.into_tool_result(),
        ToolResult::err(codes::PERMISSION_DENIED, "admins only")
    );
    for (error, code) in [
        (ToolError::invalid_arguments("x"), codes::INVALID_ARGUMENTS),
        (ToolError::unavailable("x"), codes::UNAVAILABLE),
        (ToolError::timeout("x"), codes::TIMEOUT),
        (ToolError::rate_limited("x"), codes::RATE_LIMITED),
        (ToolError::internal("x"), codes::INTERNAL),
    ] {
        assert_eq!(error.code(), code);
        assert_eq!(ToolResult::from(error).code(), Some(code));
    }
    assert_eq!(
        ToolError::new("TASK_NOT_FOUND", "no task 7").to_string(),
        "TASK_NOT_FOUND: no task 7"
    );
}
