//! End-to-end tests of the `parlor` binary: the real executable, a config file in a temp
//! dir, and an in-process fake OpenAI-compatible server on 127.0.0.1.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use parlor_testkit::{FakeLlm, Reply, ToolCallSpec};
use serde_json::{Value, json};

use crate::support;

fn parlor() -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_parlor"));
    // Only the variables each test sets: no key or config leaks in from the developer's shell.
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .kill_on_drop(true);
    cmd
}

async fn run(cmd: &mut tokio::process::Command) -> Output {
    tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("parlor did not finish within 60 s")
        .expect("parlor could not be started")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `text` holds `part`; the message shows all of `text`.
fn assert_contains(text: &str, part: &str) {
    assert!(text.contains(part), "{text}");
}

fn write_config(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("config.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// `parlor tools --config CONFIG --json`, which must succeed: the tools.
async fn tools_json(config: &Path) -> Value {
    let out = run(parlor()
        .arg("tools")
        .arg("--config")
        .arg(config)
        .arg("--json"))
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_str(&stdout(&out)).unwrap()
}

/// A validator for one schema of OpenAI's published API schemas.
fn openai_validator(name: &str) -> jsonschema::Validator {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/openai/openai-chat-completions-schemas.json"
    );
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let root = json!({
        "$ref": format!("#/components/schemas/{name}"),
        "components": doc["components"],
    });
    jsonschema::validator_for(&root).unwrap()
}

fn assert_no_refs(value: &Value, at: &str) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                assert!(
                    !["$ref", "$defs", "definitions"].contains(&k.as_str()),
                    "{k} found at {at}"
                );
                assert_no_refs(v, &format!("{at}/{k}"));
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                assert_no_refs(v, &format!("{at}/{i}"));
            }
        }
        _ => {}
    }
}

#[tokio::test]
async fn tools_json_lists_the_default_tools_with_valid_ref_free_schemas() {
    let out = run(parlor().args(["tools", "--json"])).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let tools: Value = serde_json::from_str(&stdout(&out)).expect("tools --json is JSON");
    let names: Vec<&str> = tools
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "todo_list",
            "time_now",
            "get_message",
            "get_group_context",
            "send_markdown",
            "memory_write",
            "memory_read",
            "memory_search",
            "memory_delete",
            "clock_create",
            "clock_list",
            "clock_get",
            "clock_update",
            "clock_delete",
            "clock_log",
            "web_search",
            "web_fetch"
        ]
    );

    let tool_schema = openai_validator("ChatCompletionTool");
    for tool in tools.as_array().unwrap() {
        let errors: Vec<String> = tool_schema
            .iter_errors(tool)
            .map(|e| e.to_string())
            .collect();
        assert!(
            errors.is_empty(),
            "{} is not a valid OpenAI tool: {errors:?}",
            tool["function"]["name"]
        );
        assert_no_refs(tool, "");
        // The parameters are themselves a usable JSON Schema.
        jsonschema::validator_for(&tool["function"]["parameters"]).unwrap();
        assert_eq!(tool["function"]["parameters"]["type"], "object");
        // Beside what the model is sent, the role the registry enforces.
        let role = tool["x-parlor"]["role"].as_str().unwrap();
        let name = tool["function"]["name"].as_str().unwrap();
        let expected = match name {
            "clock_create" | "clock_update" | "clock_delete" => "chat_admin",
            _ => "member",
        };
        assert_eq!(role, expected, "{name}");
    }
}

#[tokio::test]
async fn tools_markdown_shows_risk_role_parameters_and_failure_codes() {
    let out = run(parlor().arg("tools")).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let md = stdout(&out);
    for needle in [
        "## `todo_list`",
        "risk `write` · role `member`",
        "## `clock_create`",
        "role `chat_admin` (also in the chat `target_chat` names)",
        "| `plan` | array of object | yes |",
        "## `time_now`",
        "risk `read`",
        "| `timezone` | string | no |",
        "`UNKNOWN_TIMEZONE`",
        "`PERMISSION_DENIED`",
    ] {
        assert!(md.contains(needle), "missing {needle:?} in:\n{md}");
    }
}

#[tokio::test]
async fn tools_follow_the_config() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        r#"
[toolsets]
enabled = ["time"]
[[toolsets.prompt]]
name = "house_rules"
prompt = "Be brief."
"#,
    );
    let tools = tools_json(&config).await;
    assert_eq!(tools.as_array().unwrap().len(), 1);
    assert_eq!(tools[0]["function"]["name"], "time_now");
}

#[tokio::test]
async fn the_terminal_tools_need_an_operator_in_the_catalog() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "[toolsets]\nenabled = []\n[terminal]\nenabled = true\nsandbox = \"none\"\n",
    );
    let tools = tools_json(&config).await;
    let policy: Vec<(&str, &str, &str)> = tools
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["function"]["name"].as_str().unwrap(),
                t["x-parlor"]["risk"].as_str().unwrap(),
                t["x-parlor"]["role"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        policy,
        [
            ("shell", "dangerous", "operator"),
            ("task_output", "read", "operator"),
            ("task_stop", "write", "operator"),
            ("task_list", "read", "operator"),
        ]
    );
    let out = run(parlor().arg("tools").arg("--config").arg(&config)).await;
    assert_contains(
        &stdout(&out),
        "Toolset `terminal` · risk `dangerous` · role `operator`",
    );
}

#[tokio::test]
async fn the_catalog_names_the_tools_that_wait_for_approval() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "[toolsets]\nenabled = [\"time\", \"todo_list\"]\n[approvals]\ntools = { time = \"chat_admin\" }\n",
    );
    let tools = tools_json(&config).await;
    let approval = |name: &str| {
        tools
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["function"]["name"] == name)
            .map(|t| t["x-parlor"]["approval"].clone())
            .unwrap()
    };
    assert_eq!(
        approval("time_now"),
        "chat_admin",
        "a toolset's name covers its tools"
    );
    assert!(approval("todo_list").is_null());
    let out = run(parlor().arg("tools").arg("--config").arg(&config)).await;
    assert_contains(
        &stdout(&out),
        "runs only once approved by an admin of the chat",
    );
}

#[tokio::test]
async fn a_broken_config_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("[llm]\nmodle = \"x\"\n", "unknown field `modle`"),
        (
            "[toolsets]\nenabled = [\"teleport\"]\n",
            "unknown toolset \"teleport\"",
        ),
        (
            "[toolsets.time]\ndefault_timezone = \"Mars/Olympus\"\n",
            "not an IANA time zone",
        ),
        (
            "[llm]\nmax_concurrent_tool_calls = 0\n",
            "llm.max_concurrent_tool_calls must be at least 1",
        ),
        ("[bot]\nadmins = [\"1001\"]\n", "platform-qualified"),
        (
            "[telegram]\npoll_timeout_secs = 90\n",
            "telegram.poll_timeout_secs must be at most 50",
        ),
        ("[bot]\nqueue_capacity = \"lots\"\n", "queue_capacity"),
        (
            "[llm]\nbase_url = \"api.openai.com\"\n",
            "must start with http",
        ),
        ("this is not toml", "invalid"),
        (
            "[terminal]\npolicy = \"admins\"\n",
            "only operators (bot.admins) may use it, never a chat's own admins",
        ),
        (
            "[terminal.chat_policies]\n\"telegram:-100123\" = \"everyone\"\n",
            "terminal policy \"everyone\" is no longer supported",
        ),
        (
            "[terminal]\npolicy = \"sometimes\"\n",
            "use \"operators\" or \"off\"",
        ),
        (
            "[terminal]\nenabled = true\n",
            "[terminal] enabled = true needs an explicit sandbox",
        ),
    ];
    for (text, expected) in cases {
        let config = write_config(dir.path(), text);
        let out = run(parlor().arg("--config").arg(&config).arg("check-config")).await;
        assert!(!out.status.success(), "{text:?} was accepted");
        let err = stderr(&out);
        assert!(
            err.contains(expected),
            "{text:?}: expected {expected:?} in {err}"
        );
        assert!(
            err.contains("config.toml"),
            "the error names the file: {err}"
        );
    }
    let out = run(parlor()
        .arg("--config")
        .arg(dir.path().join("missing.toml"))
        .arg("tools"))
    .await;
    assert!(!out.status.success());
    assert_contains(&stderr(&out), "cannot read config file");
}

fn llm_config(fake: &FakeLlm, extra: &str) -> String {
    format!(
        r#"
[llm]
base_url = "{}"
model = "test-model"
max_retries = 0
{extra}
[toolsets.time]
default_timezone = "Europe/Berlin"
"#,
        fake.base_url()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ask_runs_a_whole_turn_with_a_tool_call_through_the_real_binary() {
    let fake = FakeLlm::start().await;
    fake.push(Reply::tool_calls(vec![ToolCallSpec::new(
        "call_1",
        "time_now",
        json!({"timezone": "Asia/Tokyo"}),
    )]));
    fake.push(Reply::text("It is late in Tokyo."));
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &llm_config(&fake, ""));

    let out = run(parlor()
        .arg("--config")
        .arg(&config)
        .args(["ask", "--as", "alice", "what time is it in Tokyo?"])
        .env("OPENAI_API_KEY", "sk-test-123"))
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "It is late in Tokyo.");
    assert!(
        !stderr(&out).contains("sk-test-123"),
        "the key leaked: {}",
        stderr(&out)
    );

    let requests = fake.requests();
    assert_eq!(requests.len(), 2);
    let first = &requests[0];
    assert_eq!(first.authorization(), Some("Bearer sk-test-123"));
    assert_eq!(first.model(), Some("test-model"));
    assert!(first.is_stream());
    assert_eq!(first.body["stream_options"]["include_usage"], true);
    let offered = first.tool_names();
    // `ask` runs outside any chat, so the clock (which fires into chats) is not offered.
    assert_eq!(offered.len(), 11, "{offered:?}");
    assert!(offered.iter().any(|t| t == "time_now"), "{offered:?}");
    assert_eq!(
        first.last_user_text().as_deref(),
        Some("alice (console:alice): what time is it in Tokyo?")
    );
    let request_schema = openai_validator("CreateChatCompletionRequest");
    for request in &requests {
        let errors: Vec<String> = request_schema
            .iter_errors(&request.body)
            .map(|e| e.to_string())
            .collect();
        assert!(
            errors.is_empty(),
            "request body is not valid for OpenAI: {errors:?}"
        );
    }

    // The second request carries the tool call and its result, answered in Tokyo time.
    let messages = requests[1].messages();
    let call = &messages[messages.len() - 2];
    assert_eq!(call["role"], "assistant");
    assert_eq!(call["tool_calls"][0]["function"]["name"], "time_now");
    let result = &messages[messages.len() - 1];
    assert_eq!(result["role"], "tool");
    assert_eq!(result["tool_call_id"], "call_1");
    let result: Value = serde_json::from_str(result["content"].as_str().unwrap()).unwrap();
    assert_eq!(result["success"], true, "{result}");
    assert_eq!(result["data"]["timezone"], "Asia/Tokyo");
    assert_eq!(result["data"]["utc_offset"], "+09:00");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ask_reports_an_unreachable_or_failing_model_clearly() {
    let fake = FakeLlm::start().await;
    fake.push(Reply::status(401).body(json!({"error": {"message": "Incorrect API key provided"}})));
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &llm_config(&fake, ""));
    let out = run(parlor().arg("--config").arg(&config).args(["ask", "hi"])).await;
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("401") && err.contains("Incorrect API key"),
        "{err}"
    );
    assert_eq!(fake.request_count(), 1, "a 401 is not retried");
}

/// Runs `parlor chat` with `input` on stdin and only the environment as configuration.
/// `parlor chat ARGS` against the model at `llm_url`, on the data dir `data`, with every
/// stream piped.
fn chat_command(llm_url: &str, data: &Path, args: &[&str]) -> tokio::process::Command {
    let mut cmd = parlor();
    cmd.arg("chat")
        .args(args)
        .env("OPENAI_BASE_URL", llm_url)
        .env("PARLOR_DATA_DIR", data)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    cmd
}

/// Writes `input` to the child's stdin, closes it and waits for the child's end.
async fn finish(mut child: tokio::process::Child, input: &str) -> Output {
    use tokio::io::AsyncWriteExt;
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).await.unwrap();
    drop(stdin);
    child.wait_with_output().await.unwrap()
}

async fn chat(fake: &FakeLlm, data: &Path, args: &[&str], input: &str) -> Output {
    let child = chat_command(&fake.base_url(), data, args)
        .env("OPENAI_API_KEY", "sk-test")
        .env("PARLOR_MODEL", "env-model")
        .spawn()
        .unwrap();
    tokio::time::timeout(Duration::from_secs(60), finish(child, input))
        .await
        .expect("parlor chat did not finish")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_plays_a_group_with_only_an_llm_endpoint_configured() {
    let fake = FakeLlm::start().await;
    support::echo(&fake);
    let data = tempfile::tempdir().unwrap();
    let out = chat(
        &fake,
        data.path(),
        &[],
        "bob: just chatting\nalice: hi @parlor\n/status\n",
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("parlor: echo <alice (console:alice): hi @parlor>"),
        "{text}"
    );
    assert!(text.contains("Session console:local"), "{text}");
    assert_eq!(fake.request_count(), 1, "only the mention starts a turn");
    assert_eq!(fake.requests()[0].model(), Some("env-model"));

    // A second run on the same data dir continues the conversation.
    let out = chat(&fake, data.path(), &["--dm"], "what did I say?\n").await;
    assert!(out.status.success(), "{}", stderr(&out));
    let second = &fake.requests()[1];
    let texts: Vec<String> = second
        .messages()
        .iter()
        .filter_map(|m| m["content"].as_str().map(str::to_owned))
        .collect();
    assert!(
        texts
            .iter()
            .any(|t| t == "alice (console:alice): hi @parlor"),
        "{texts:?}"
    );
    assert_contains(
        &stdout(&out),
        "parlor: echo <you (console:you): what did I say?>",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_daemon_on_the_same_data_dir_is_refused() {
    let fake = FakeLlm::start().await;
    // The first chat holds the store while its turn waits on a slow model.
    fake.push(Reply::text("slow").delay(Duration::from_secs(3)));
    let data = tempfile::tempdir().unwrap();
    let first = {
        let fake_url = fake.base_url();
        let dir = data.path().to_owned();
        tokio::spawn(async move {
            let child = chat_command(&fake_url, &dir, &["--dm"]).spawn().unwrap();
            finish(child, "hello\n").await
        })
    };
    fake.wait_for_requests(1, Duration::from_secs(30))
        .await
        .unwrap();
    let second = chat(&fake, data.path(), &["--dm"], "me too\n").await;
    assert!(!second.status.success());
    assert_contains(&stderr(&second), "in use by another parlor process");
    let first = first.await.unwrap();
    assert_contains(&stdout(&first), "parlor: slow");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_systemd_credential_is_the_key_and_an_empty_one_is_an_error() {
    let fake = FakeLlm::start().await;
    fake.push(Reply::text("ok"));
    let dir = tempfile::tempdir().unwrap();
    let creds = dir.path().join("credentials");
    std::fs::create_dir(&creds).unwrap();
    std::fs::write(creds.join("llm_api_key"), "sk-from-credential-2718\n").unwrap();
    let config = write_config(dir.path(), &llm_config(&fake, ""));
    let out = run(parlor()
        .arg("--config")
        .arg(&config)
        .args(["ask", "hi"])
        .env("CREDENTIALS_DIRECTORY", &creds)
        .env("OPENAI_API_KEY", "sk-from-env"))
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        fake.requests()[0].authorization(),
        Some("Bearer sk-from-credential-2718"),
        "the credential wins over the environment"
    );

    std::fs::write(creds.join("telegram_token"), "").unwrap();
    let out = run(parlor()
        .arg("--config")
        .arg(&config)
        .arg("check-config")
        .env("CREDENTIALS_DIRECTORY", &creds))
    .await;
    assert!(!out.status.success());
    assert_contains(&stderr(&out), "telegram_token is empty");
}

/// The effective user id of this test process.
fn euid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").unwrap().uid()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_is_not_dumpable_so_its_own_user_cannot_read_its_environment() {
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::process::CommandExt;
    use tokio::io::AsyncWriteExt;
    // As root every process's /proc is readable; the protection is for a daemon under an
    // unprivileged user (systemd's DynamicUser=), so the test plays one.
    const NOBODY: u32 = 65534;
    let as_other = euid() == 0;
    let fake = FakeLlm::start().await;
    fake.push(Reply::text("hello"));
    let data = tempfile::tempdir().unwrap();
    if as_other {
        std::os::unix::fs::chown(data.path(), Some(NOBODY), Some(NOBODY)).unwrap();
    }
    let mut cmd = chat_command(&fake.base_url(), data.path(), &["--dm"]);
    cmd.env("OPENAI_API_KEY", "sk-dumpable-check-1618");
    if as_other {
        cmd.as_std_mut().uid(NOBODY).gid(NOBODY);
    }
    let mut child = cmd.spawn().unwrap();
    let pid = child.id().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"hi\n").await.unwrap();
    // Its first model call comes long after start-up, where the process protects itself.
    fake.wait_for_requests(1, Duration::from_secs(30))
        .await
        .unwrap();
    let environ = format!("/proc/{pid}/environ");
    let owner = std::fs::metadata(&environ).unwrap().uid();
    assert_eq!(
        owner, 0,
        "a dumpable process's /proc files belong to its own user"
    );
    let mut reader = std::process::Command::new("cat");
    reader.arg(&environ);
    if as_other {
        reader.uid(NOBODY).gid(NOBODY);
    }
    let read = reader.output().unwrap();
    assert!(!read.status.success(), "its own user read {environ}");
    assert!(
        String::from_utf8_lossy(&read.stderr).contains("Permission denied"),
        "{}",
        String::from_utf8_lossy(&read.stderr)
    );
    drop(stdin);
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_contains(&stdout(&out), "hello");
}

#[tokio::test]
async fn tools_and_mcp_list_an_mcp_servers_tools_with_server_risk_role_and_schema() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &format!(
            r#"
[toolsets]
enabled = []
[[mcp.servers]]
name = "kb"
command = "{}"
risk = "read"
tools = ["echo", "delete_file", "lookup"]
"#,
            parlor_testkit::mcp_server_bin().display()
        ),
    );
    let tools = tools_json(&config).await;
    let names: Vec<&str> = tools
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["kb__echo", "kb__delete_file", "kb__lookup"]);
    let echo = &tools[0];
    assert_eq!(echo["x-parlor"]["toolset"], "mcp:kb");
    assert_eq!(echo["x-parlor"]["risk"], "read");
    assert_eq!(echo["x-parlor"]["role"], "member");
    assert_eq!(tools[1]["x-parlor"]["role"], "operator", "destructive");
    assert_no_refs(&tools[2]["function"]["parameters"], "kb__lookup");

    let out = run(parlor().arg("mcp").arg("--config").arg(&config)).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert_contains(&text, "kb (connected): 3 tool(s)");
    assert_contains(&text, "kb__delete_file  risk dangerous · role operator");
}

/// A loopback address nothing listens on: bound, then released.
async fn closed_url() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}")
}

/// A stand-in for a local Ollama: answers every request with `200 {}`.
async fn fake_local_server() -> (String, tokio::task::JoinHandle<()>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut buf = [0u8; 4096];
            let _ = socket.read(&mut buf).await;
            let _ = socket
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
                .await;
        }
    });
    (url, server)
}

#[tokio::test]
async fn a_first_run_without_a_key_explains_what_is_missing() {
    let data = tempfile::tempdir().unwrap();
    let out = run(parlor()
        .args(["ask", "hello"])
        .env("PARLOR_DATA_DIR", data.path())
        .env("PARLOR_LOCAL_LLM_PROBE", closed_url().await))
    .await;
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_contains(&err, "no API key is set");
    assert_contains(&err, "OPENAI_API_KEY");
    assert_contains(&err, "OPENAI_BASE_URL");
    assert_contains(&err, "PARLOR_MODEL");
    assert_contains(&err, "http://127.0.0.1:11434/v1");
    assert!(!err.contains("WARN"), "{err}");
    assert!(!err.contains("A local model server answers"), "{err}");
    assert!(stdout(&out).is_empty(), "{}", stdout(&out));

    // `chat` stops the same way, before any conversation starts.
    let out = run(parlor()
        .arg("chat")
        .env("PARLOR_DATA_DIR", data.path())
        .env("PARLOR_LOCAL_LLM_PROBE", closed_url().await)
        .stdin(std::process::Stdio::null()))
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_contains(&stderr(&out), "no API key is set");
}

#[tokio::test]
async fn a_first_run_offers_a_local_server_that_answers() {
    let (url, server) = fake_local_server().await;
    let data = tempfile::tempdir().unwrap();
    let out = run(parlor()
        .args(["ask", "hello"])
        .env("PARLOR_DATA_DIR", data.path())
        .env("PARLOR_LOCAL_LLM_PROBE", &url))
    .await;
    server.abort();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_contains(&err, &format!("A local model server answers at {url}"));
    assert_contains(&err, &format!("base_url = \"{url}/v1\""));
    assert_contains(&err, &format!("OPENAI_BASE_URL={url}/v1"));
}

#[tokio::test]
async fn an_unreachable_endpoint_is_explained_without_a_warn_stack() {
    let data = tempfile::tempdir().unwrap();
    let endpoint = format!("{}/v1", closed_url().await);
    let out = run(parlor()
        .args(["ask", "hello"])
        .env("PARLOR_DATA_DIR", data.path())
        .env("OPENAI_API_KEY", "sk-test")
        .env("OPENAI_BASE_URL", &endpoint)
        .env("PARLOR_LOCAL_LLM_PROBE", closed_url().await))
    .await;
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_contains(&err, &format!("could not reach the model at {endpoint}"));
    assert_contains(&err, "OPENAI_API_KEY");
    assert!(!err.contains("WARN"), "{err}");
    assert!(!err.contains("Retrying") && !err.contains("retry"), "{err}");

    // `chat` says the same before the conversation starts, instead of failing each turn.
    let out = run(parlor()
        .arg("chat")
        .env("PARLOR_DATA_DIR", data.path())
        .env("OPENAI_API_KEY", "sk-test")
        .env("OPENAI_BASE_URL", &endpoint)
        .env("PARLOR_LOCAL_LLM_PROBE", closed_url().await)
        .stdin(std::process::Stdio::null()))
    .await;
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_contains(&err, &format!("could not reach the model at {endpoint}"));
    assert_contains(&err, "Connection refused");
    assert!(stdout(&out).is_empty(), "{}", stdout(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_prints_each_chat_and_member_by_day_from_the_store() {
    let fake = FakeLlm::start().await;
    support::echo(&fake);
    let data = tempfile::tempdir().unwrap();
    // One run each, so that no two mentions merge into one turn.
    for line in [
        "alice: hi @parlor\n",
        "bob: and me @parlor\n",
        "alice: again @parlor\n",
    ] {
        let out = chat(&fake, data.path(), &[], line).await;
        assert!(out.status.success(), "{}", stderr(&out));
    }
    assert_eq!(fake.request_count(), 3);

    let usage = |args: &[&str]| {
        let mut cmd = parlor();
        cmd.arg("usage")
            .args(args)
            .env("PARLOR_DATA_DIR", data.path());
        cmd
    };
    let out = run(&mut usage(&[])).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let today = chrono::Utc::now().date_naive().to_string();
    // Each reply of the fake reports 10 + 5 tokens.
    let has = |text: &str, cells: &[&str]| {
        text.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == cells)
    };
    let line = |cells: &[&str]| has(&text, cells);
    // No `[llm.prices]`: nothing costs; the fake reports no cache reads.
    assert!(
        line(&[&today, "console:local", "3", "45", "0%", "$0"]),
        "{text}"
    );
    assert!(
        line(&[
            &today,
            "alice",
            "(console:alice)",
            "console:local",
            "2",
            "30",
            "$0"
        ]),
        "{text}"
    );
    assert!(
        line(&[
            &today,
            "bob",
            "(console:bob)",
            "console:local",
            "1",
            "15",
            "$0"
        ]),
        "{text}"
    );

    let out = run(&mut usage(&["--member", "console:bob", "--days", "1"])).await;
    let text = stdout(&out);
    assert!(!text.contains("alice"), "{text}");
    assert!(has(&text, &["Total", "1", "15", "$0"]), "{text}");
}

#[tokio::test]
async fn check_config_prints_the_fixed_prompt_and_warns_when_it_fills_the_compaction_share() {
    let dir = tempfile::tempdir().unwrap();
    let roomy = write_config(dir.path(), "[llm]\ncontext_window = 128000\n");
    let out = run(parlor().arg("--config").arg(&roomy).arg("check-config")).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert_contains(&text, "every request starts with about ");
    assert!(!text.contains("warning:"), "{text}");

    // A 4,000-token window at 0.5: the default prompt and tools alone fill the share.
    let small = write_config(
        dir.path(),
        "[bot]\ncompact_ratio = 0.5\n[llm]\ncontext_window = 4000\n",
    );
    let out = run(parlor().arg("--config").arg(&small).arg("check-config")).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_contains(
        &stdout(&out),
        "warning: the system prompt and tool schemas alone (about ",
    );
}

/// The fixed prompt's size as `check-config` prints it.
fn fixed_tokens(out: &str) -> usize {
    let line = out
        .lines()
        .find(|l| l.starts_with("every request starts with about "))
        .unwrap_or_else(|| panic!("{out}"));
    line["every request starts with about ".len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn the_compact_tool_profile_shrinks_the_prompt_and_keeps_the_tools_contract() {
    let dir = tempfile::tempdir().unwrap();
    let full = write_config(dir.path(), "[llm]\ntool_profile = \"full\"\n");
    let out = run(parlor().arg("--config").arg(&full).arg("check-config")).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let full_size = fixed_tokens(&stdout(&out));
    let full_tools = tools_json(&full).await;

    let compact = write_config(dir.path(), "[llm]\ntool_profile = \"compact\"\n");
    let out = run(parlor().arg("--config").arg(&compact).arg("check-config")).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let compact_size = fixed_tokens(&stdout(&out));
    // About 3,900 tokens against about 2,000 with the default toolsets.
    assert!(
        compact_size * 3 < full_size * 2,
        "compact {compact_size} vs full {full_size}"
    );
    // The tools it keeps are the same tools: names and arguments, only shorter words.
    let compact_tools = tools_json(&compact).await;
    let names = |tools: &Value| -> Vec<String> {
        tools
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
            .collect()
    };
    let kept = names(&compact_tools);
    assert!(kept.iter().any(|n| n == "memory_write"), "{kept:?}");
    assert!(!kept.iter().any(|n| n.starts_with("web_")), "{kept:?}");
    for tool in compact_tools.as_array().unwrap() {
        let name = tool["function"]["name"].as_str().unwrap();
        let same = full_tools
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["function"]["name"] == name)
            .unwrap();
        let properties = |t: &Value| -> Vec<String> {
            t["function"]["parameters"]["properties"]
                .as_object()
                .map(|p| p.keys().cloned().collect())
                .unwrap_or_default()
        };
        assert_eq!(properties(tool), properties(same), "{name}");
        assert_eq!(
            tool["function"]["parameters"]["required"], same["function"]["parameters"]["required"],
            "{name}"
        );
    }
}

#[tokio::test]
async fn check_config_names_the_store_and_postgres_needs_its_url() {
    let dir = tempfile::tempdir().unwrap();
    let sled = write_config(dir.path(), "[bot]\ndata_dir = \"/var/lib/parlor-test\"\n");
    let out = run(parlor().arg("--config").arg(&sled).arg("check-config")).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_contains(&stdout(&out), "store: sled in /var/lib/parlor-test/db");

    let pg = write_config(dir.path(), "[store]\nbackend = \"postgres\"\n");
    let out = run(parlor().arg("--config").arg(&pg).arg("check-config").env(
        "PARLOR_DATABASE_URL",
        "postgresql://parlor:hunter2-secret@db.internal:6543/chats",
    ))
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert_contains(&text, "store: postgres at db.internal:6543/chats");
    assert!(!text.contains("hunter2"), "never the password: {text}");

    // Without a URL: a clear error naming where it is read from.
    let out = run(parlor().arg("--config").arg(&pg).arg("check-config")).await;
    assert!(!out.status.success());
    assert_contains(&stderr(&out), "PARLOR_DATABASE_URL");

    // From a file named by url_file, and url_env naming another variable.
    let url_file = dir.path().join("database_url");
    std::fs::write(&url_file, "postgresql://parlor@127.0.0.1:5433/fromfile\n").unwrap();
    let from_file = write_config(
        dir.path(),
        &format!(
            "[store]\nbackend = \"postgres\"\nurl_file = \"{}\"\n",
            url_file.display()
        ),
    );
    let out = run(parlor().arg("--config").arg(&from_file).arg("check-config")).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_contains(&stdout(&out), "store: postgres at 127.0.0.1:5433/fromfile");
    let other_env = write_config(
        dir.path(),
        "[store]\nbackend = \"postgres\"\nurl_env = \"MY_DB\"\n",
    );
    let out = run(parlor()
        .arg("--config")
        .arg(&other_env)
        .arg("check-config")
        .env("MY_DB", "host=127.0.0.1 port=5434 dbname=fromenv"))
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_contains(&stdout(&out), "store: postgres at 127.0.0.1:5434/fromenv");
}
