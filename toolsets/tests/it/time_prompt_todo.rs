//! The built-in toolsets through the registry (the path every real call takes), the catalog
//! the operator reads, and the agent's observer events.

use std::sync::{Arc, Mutex};

use chrono::{TimeZone, Utc};
use expect_test::expect;
use parlor_bot::llm::ToolCall;
use parlor_bot::tool::{ToolContext, ToolRegistry, catalog, codes};
use parlor_toolsets::time::{UNKNOWN_TIMEZONE, time_toolset_with_now};
use parlor_toolsets::{PromptToolset, TodoList};
use serde_json::{Value, json};

fn registry() -> ToolRegistry {
    // 2026-03-29 01:30 UTC: Berlin has just switched to summer time (+02:00).
    let clock = Arc::new(|| Utc.with_ymd_and_hms(2026, 3, 29, 1, 30, 0).unwrap());
    let time = time_toolset_with_now(chrono_tz::Europe::Berlin, clock).unwrap();
    ToolRegistry::new(vec![
        Arc::new(TodoList::new()),
        Arc::new(time),
        Arc::new(PromptToolset::new("house_rules", "Be brief.")),
    ])
    .unwrap()
}

async fn call(registry: &ToolRegistry, name: &str, args: Value) -> Value {
    let result = registry
        .call(
            &ToolCall::new("c1", name, args.to_string()),
            ToolContext::default(),
        )
        .await;
    serde_json::from_str(&result.to_json()).unwrap()
}

#[tokio::test]
async fn time_now_answers_in_the_default_or_the_asked_zone() {
    let registry = registry();
    expect![[r#"
        {
          "data": {
            "date": "2026-03-29",
            "datetime": "2026-03-29T03:30:00+02:00",
            "time": "03:30:00",
            "timezone": "Europe/Berlin",
            "unix": 1774747800,
            "utc_offset": "+02:00",
            "weekday": "Sunday"
          },
          "message": "ok",
          "success": true
        }"#]]
    .assert_eq(
        &serde_json::to_string_pretty(&call(&registry, "time_now", json!({})).await).unwrap(),
    );

    let tokyo = call(&registry, "time_now", json!({"timezone": "Asia/Tokyo"})).await;
    assert_eq!(tokyo["data"]["datetime"], "2026-03-29T10:30:00+09:00");
    // A null timezone from the model means "not given".
    let null = call(&registry, "time_now", json!({"timezone": null})).await;
    assert_eq!(null["data"]["timezone"], "Europe/Berlin");
}

#[tokio::test]
async fn time_now_refuses_an_unknown_zone_with_its_own_code() {
    let result = call(&registry(), "time_now", json!({"timezone": "Mars/Olympus"})).await;
    assert_eq!(result["success"], false);
    assert_eq!(result["error_code"], UNKNOWN_TIMEZONE);
    assert!(result["message"].as_str().unwrap().contains("Mars/Olympus"));

    let wrong_type = call(&registry(), "time_now", json!({"timezone": 9})).await;
    assert_eq!(wrong_type["error_code"], codes::INVALID_ARGUMENTS);
}

#[tokio::test]
async fn todo_list_stores_the_plan_and_reports_counts() {
    let registry = registry();
    let result = call(
        &registry,
        "todo_list",
        json!({"plan": [{"step": "a", "status": "completed"}, {"step": "b", "status": "pending"}]}),
    )
    .await;
    assert_eq!(result["data"]["completed"], 1);
    assert_eq!(result["data"]["pending"], 1);
    assert_eq!(registry.injections("s").len(), 1);
    let cleared = call(&registry, "todo_list", json!({"plan": []})).await;
    assert_eq!(cleared["message"], "plan cleared");
    assert!(registry.injections("s").is_empty());
}

#[test]
fn prompt_only_toolsets_add_prompt_but_no_tools() {
    let registry = registry();
    assert_eq!(registry.names(), ["todo_list", "time_now"]);
    assert!(registry.prompts().iter().any(|p| p == "Be brief."));
}

#[test]
fn catalog_markdown_snapshot() {
    expect![[r##"
        # Tools

        Every tool answers `{"success": true, "message", "data"}` or `{"success": false, "error_code", "message", "data"}`.
        Any tool may fail with the shared codes: `TOOL_NOT_FOUND`, `INVALID_ARGUMENTS`, `PERMISSION_DENIED`, `TIMEOUT`, `CANCELLED`, `RATE_LIMITED`, `UNAVAILABLE`, `INTERNAL`.
        Risk: `read` only reads; `write` changes state the bot keeps; `dangerous` reaches the host.
        Role, the least a caller needs (anyone else gets `PERMISSION_DENIED`): `member` is anyone in the chat; `chat_admin` an administrator of the chat, by the platform; `operator` one of the config's `bot.admins`. A chat admin is never an operator. An unattended turn (a clock task firing, a background job's result) runs as a `member` whoever started it, offered only member tools and the grants of its job (reading or stopping that one job), never a `dangerous` tool.

        ## `todo_list`

        Toolset `todo_list` · risk `write` · role `member`

        Keep a step-by-step plan for work that takes several steps. Each call replaces the whole plan (send every step, in order, with its status); at most one step may be in_progress. Send an empty plan to clear it. Skip it for simple one-step requests.

        | parameter | type | required | description |
        |---|---|---|---|
        | `explanation` | string | no | Why the plan changed, in a sentence. |
        | `plan` | array of object | yes | The whole plan, in order. It replaces the previous plan; send an empty list to clear it. |

        Result: `data.plan`: the stored plan; `data.pending`, `data.in_progress`, `data.completed`: step counts.

        Failure codes: shared only.

        ## `time_now`

        Toolset `time` · risk `read` · role `member`

        Get the current date, time and weekday in a time zone. Use it whenever the answer depends on today's date or the time of day.

        | parameter | type | required | description |
        |---|---|---|---|
        | `timezone` | string | no | IANA time zone name such as "Europe/Berlin" or "America/New_York"; the operator's default zone when omitted. |

        Result: `data`: `timezone`, `datetime` (RFC 3339), `date`, `time`, `weekday`, `utc_offset`, `unix`.

        Failure codes: `UNKNOWN_TIMEZONE` and the shared ones.
    "##]]
    .assert_eq(&catalog::to_markdown(&registry()));
    expect![[r#"
        • todo_list — Keep a step-by-step plan for work that takes several steps. (everyone)
        • time_now — Get the current date, time and weekday in a time zone. (everyone)"#]]
    .assert_eq(&catalog::to_help(&registry()));
}

#[tokio::test]
async fn the_observer_sees_tools_usage_and_the_end_of_the_turn() {
    use parlor_bot::agent::{Agent, AgentConfig, AgentEvent, AgentObserver, TurnInput};
    use parlor_bot::llm::{Completion, Usage};
    use parlor_bot::testing::ScriptedLlm;
    use tokio_util::sync::CancellationToken;

    // A tool call, then the answer; each with 5 + 1 tokens.
    let usage = Some(Usage {
        prompt_tokens: 5,
        completion_tokens: 1,
        total_tokens: 6,
        ..Usage::default()
    });
    let llm = ScriptedLlm::new(vec![
        Completion {
            tool_calls: vec![ToolCall::new(
                "c1",
                "time_now",
                "{\"timezone\":\"Nowhere\"}",
            )],
            usage: usage.clone(),
            ..Completion::default()
        },
        Completion {
            content: "done".into(),
            usage,
            ..Completion::default()
        },
    ]);
    #[derive(Default)]
    struct Log(Mutex<Vec<String>>);
    impl AgentObserver for Log {
        fn on_event(&self, event: &AgentEvent<'_>) {
            let line = match event {
                AgentEvent::LlmRequest { iteration, .. } => format!("request {iteration}"),
                AgentEvent::Usage { usage, .. } => format!("usage {}", usage.total_tokens),
                AgentEvent::ToolStarted { call, .. } => format!("start {}", call.function.name),
                AgentEvent::ToolFinished { call, result, .. } => {
                    format!(
                        "finish {} {}",
                        call.function.name,
                        result.code().unwrap_or("ok")
                    )
                }
                AgentEvent::TurnFinished { end, usage, .. } => {
                    format!("end {end:?} {}", usage.total_tokens)
                }
            };
            self.0.lock().unwrap().push(line);
        }
    }
    let log = Arc::new(Log::default());
    let agent =
        Agent::new(llm, registry(), "base", AgentConfig::default()).with_observer(log.clone());
    let turn = agent
        .run_turn(
            &[],
            TurnInput::text("s", Default::default(), "hi"),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(turn.reply, "done");
    assert_eq!(
        *log.0.lock().unwrap(),
        [
            "request 1",
            "usage 6",
            "start time_now",
            "finish time_now UNKNOWN_TIMEZONE",
            "request 2",
            "usage 6",
            "end Answered 12"
        ]
    );
}

#[tokio::test]
async fn a_stored_plan_survives_a_new_toolset_stays_in_its_session_and_resets() {
    use parlor_bot::store::{MemoryStore, Store};
    use parlor_bot::tool::ToolSet;
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let registry = ToolRegistry::new(vec![Arc::new(TodoList::stored(store.clone()))]).unwrap();
    let cx = ToolContext {
        session: "telegram:-1".into(),
        ..ToolContext::default()
    };
    let args = json!({"plan": [{"step": "read the logs", "status": "in_progress"}]});
    let result = registry
        .call(&ToolCall::new("c1", "todo_list", args.to_string()), cx)
        .await;
    assert!(
        result.to_json().contains("\"success\":true"),
        "{}",
        result.to_json()
    );

    // A new toolset on the same store (a restart, or a session that left memory).
    let after = TodoList::stored(store.clone());
    let reminder = after
        .iteration_prompt_injection("telegram:-1")
        .expect("the plan is still there");
    assert!(
        reminder.contains("1. [in_progress] read the logs"),
        "{reminder}"
    );
    assert_eq!(after.iteration_prompt_injection("telegram:-2"), None);
    assert!(
        !after.fork().holds_session_state(),
        "nothing only in memory"
    );
    after.reset("telegram:-1");
    assert_eq!(after.iteration_prompt_injection("telegram:-1"), None);
}
