//! The MCP toolset against a real MCP server (the testkit's, built with rmcp's server
//! side): over streamable HTTP on 127.0.0.1 in-process, and over stdio as a child process.
//! Every call goes through the registry, the one gate.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use parlor_bot::backoff::Backoff;
use parlor_bot::llm::{Message, ToolCall};
use parlor_bot::testing::{WAIT_LIMIT, group, tool_context};
use parlor_bot::tool::schema::check_parameters;
use parlor_bot::tool::{Risk, Role, ToolContext, ToolRegistry, ToolResult, ToolSet};
use parlor_testkit::{McpHttpServer, mcp_server_bin};
use parlor_toolsets::mcp::{
    DEFAULT_ENV_ALLOW, McpOptions, McpServerConfig, McpService, McpTransport, ServerStatus,
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

fn cx(role: Role) -> ToolContext {
    tool_context(&group(), &format!("test:{}", role.as_str()), role)
}

fn server(name: &str, transport: McpTransport) -> McpServerConfig {
    McpServerConfig {
        name: name.to_owned(),
        transport,
        tools: None,
        disabled_tools: Vec::new(),
        risk: None,
        tool_risk: BTreeMap::new(),
        timeout: Duration::from_secs(20),
        chats: None,
    }
}

fn http(url: &str) -> McpTransport {
    McpTransport::Http {
        url: url.to_owned(),
        headers: BTreeMap::new(),
        bearer_token: None,
    }
}

fn stdio(env: &[(&str, &str)]) -> McpTransport {
    McpTransport::Stdio {
        command: mcp_server_bin(),
        args: Vec::new(),
        env: env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        cwd: None,
    }
}

fn options() -> McpOptions {
    McpOptions {
        // Restarts in a test come quickly; the delays' growth is `Backoff`'s own test.
        backoff: Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(200),
        },
        ..McpOptions::default()
    }
}

async fn start(configs: Vec<McpServerConfig>, options: McpOptions) -> (McpService, ToolRegistry) {
    let service = McpService::new(configs, options).unwrap();
    service.start().await.unwrap();
    let toolsets: Vec<Arc<dyn ToolSet>> = service
        .toolsets()
        .into_iter()
        .map(|t| Arc::new(t) as Arc<dyn ToolSet>)
        .collect();
    let registry = ToolRegistry::new(toolsets).unwrap();
    (service, registry)
}

async fn call(registry: &ToolRegistry, cx: ToolContext, tool: &str, args: Value) -> ToolResult {
    registry
        .call(&ToolCall::new("c1", tool, args.to_string()), cx)
        .await
}

fn spec(registry: &ToolRegistry, name: &str) -> parlor_bot::tool::ToolSpec {
    registry
        .specs()
        .find(|(_, s)| s.name == name)
        .unwrap_or_else(|| panic!("no tool {name}"))
        .1
}

#[tokio::test]
async fn tools_arrive_with_wire_names_descriptions_and_provider_safe_schemas() {
    let fake = McpHttpServer::start().await;
    let (service, registry) = start(vec![server("kb", http(fake.url()))], options()).await;
    let names = registry.names();
    for tool in ["echo", "delete_file", "lookup", "fail", "slow", "picture"] {
        assert!(names.contains(&format!("kb__{tool}")), "{names:?}");
    }
    let lookup = spec(&registry, "kb__lookup");
    assert!(
        lookup.description.starts_with("Looks a term up"),
        "{}",
        lookup.description
    );
    check_parameters(&lookup.parameters).unwrap();
    let text = lookup.parameters.to_string();
    assert!(!text.contains("$ref") && !text.contains("$defs"), "{text}");
    let query = &lookup.parameters["properties"]["query"];
    assert_eq!(query["properties"]["term"]["type"], "string");
    assert_eq!(query["required"], json!(["term"]));
    // `Topic` recurses into itself: inlined once, then cut to "any value".
    let topic = &query["properties"]["within"];
    assert_eq!(topic["properties"]["name"]["type"], "string");
    assert_eq!(topic["properties"]["children"]["items"], json!({}));
    // The catalog's registry shows the server as the toolset.
    let (toolset, _) = registry
        .specs()
        .find(|(_, s)| s.name == "kb__echo")
        .unwrap();
    assert_eq!(toolset, "mcp:kb");
    service.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test]
async fn arguments_are_validated_before_anything_reaches_the_server() {
    let fake = McpHttpServer::start().await;
    let mut config = server("kb", http(fake.url()));
    config.risk = Some(Risk::Read);
    let (service, registry) = start(vec![config], options()).await;
    let calls = fake.handler().calls();
    let r = call(
        &registry,
        cx(Role::Member),
        "kb__lookup",
        json!({"query": {"limit": 0}}),
    )
    .await;
    assert_eq!(r.code(), Some("INVALID_ARGUMENTS"), "{r:?}");
    assert!(r.message.contains("term"), "{r:?}");
    assert_eq!(*calls.borrow(), 0, "the call never left parlor");
    let r = call(
        &registry,
        cx(Role::Member),
        "kb__lookup",
        json!({"query": {"term": "otters", "within": {"name": "animals"}}}),
    )
    .await;
    assert!(r.success, "{r:?}");
    assert!(r.message.contains("found 3 entries for otters"), "{r:?}");
    assert_eq!(*calls.borrow(), 1);
    service.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test]
async fn risk_decides_the_role_and_destructive_tools_are_for_operators_only() {
    let fake = McpHttpServer::start().await;
    let mut config = server("kb", http(fake.url()));
    // The operator vouches for the whole server as read-only; the server's own
    // destructiveHint still wins for delete_file.
    config.risk = Some(Risk::Read);
    config.tool_risk.insert("slow".to_owned(), Risk::Write);
    let (service, registry) = start(vec![config], options()).await;
    assert_eq!(spec(&registry, "kb__echo").role, Role::Member);
    assert_eq!(spec(&registry, "kb__slow").role, Role::ChatAdmin);
    let delete = spec(&registry, "kb__delete_file");
    assert_eq!(
        (delete.risk, delete.role),
        (Risk::Dangerous, Role::Operator)
    );
    let calls = fake.handler().calls();
    for role in [Role::Member, Role::ChatAdmin] {
        let r = call(
            &registry,
            cx(role),
            "kb__delete_file",
            json!({"path": "/etc/passwd"}),
        )
        .await;
        assert_eq!(r.code(), Some("PERMISSION_DENIED"), "{role:?}: {r:?}");
    }
    assert_eq!(*calls.borrow(), 0);
    let r = call(
        &registry,
        cx(Role::Operator),
        "kb__delete_file",
        json!({"path": "/tmp/x"}),
    )
    .await;
    assert!(r.success, "{r:?}");
    assert!(r.message.contains("deleted /tmp/x"), "{r:?}");

    // Text fenced as the server's, structured content kept.
    let r = call(
        &registry,
        cx(Role::Member),
        "kb__echo",
        json!({"text": "hi"}),
    )
    .await;
    assert!(r.success, "{r:?}");
    assert_eq!(
        r.message,
        "<mcp_result server=\"kb\" tool=\"echo\">\n  echo: hi\n</mcp_result>"
    );
    assert_eq!(r.data.unwrap()["structured"], json!({"echoed": "hi"}));
    service.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test]
async fn a_tool_the_server_says_writes_is_never_below_write_whatever_the_config_says() {
    let fake = McpHttpServer::start().await;
    let mut config = server("kb", http(fake.url()));
    // The operator calls the whole server read-only, and even lowers move_file and
    // delete_file by name: the server's own word that they write wins.
    config.risk = Some(Risk::Read);
    for tool in ["move_file", "delete_file"] {
        config.tool_risk.insert(tool.to_owned(), Risk::Read);
    }
    let (service, registry) = start(vec![config], options()).await;
    let moving = spec(&registry, "kb__move_file");
    assert_eq!((moving.risk, moving.role), (Risk::Write, Role::ChatAdmin));
    let delete = spec(&registry, "kb__delete_file");
    assert_eq!(
        (delete.risk, delete.role),
        (Risk::Dangerous, Role::Operator)
    );
    // A tool that says it only reads may still be lowered.
    assert_eq!(spec(&registry, "kb__echo").role, Role::Member);

    let calls = fake.handler().calls();
    let args = json!({"from": "/srv/shared/a", "to": "/srv/shared/b"});
    let r = call(&registry, cx(Role::Member), "kb__move_file", args.clone()).await;
    assert_eq!(r.code(), Some("PERMISSION_DENIED"), "{r:?}");
    assert_eq!(*calls.borrow(), 0);
    let r = call(&registry, cx(Role::ChatAdmin), "kb__move_file", args).await;
    assert!(
        r.message.contains("moved /srv/shared/a to /srv/shared/b"),
        "{r:?}"
    );
    service.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test]
async fn without_a_risk_setting_every_tool_needs_an_operator() {
    let fake = McpHttpServer::start().await;
    let (service, registry) = start(vec![server("kb", http(fake.url()))], options()).await;
    for (_, spec) in registry.specs() {
        assert_eq!(
            (spec.risk, spec.role),
            (Risk::Dangerous, Role::Operator),
            "{}",
            spec.name
        );
    }
    let r = call(
        &registry,
        cx(Role::ChatAdmin),
        "kb__echo",
        json!({"text": "hi"}),
    )
    .await;
    assert_eq!(r.code(), Some("PERMISSION_DENIED"), "{r:?}");
    service.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test]
async fn allow_list_disabled_tools_and_per_chat_enablement() {
    let fake = McpHttpServer::start().await;
    let mut config = server("kb", http(fake.url()));
    config.risk = Some(Risk::Read);
    config.tools = Some(vec!["echo".to_owned(), "fail".to_owned()]);
    config.disabled_tools = vec!["fail".to_owned()];
    config.chats = Some(vec!["test:-200".to_owned()]);
    let (service, registry) = start(vec![config], options()).await;
    assert_eq!(registry.names(), ["kb__echo"]);
    let r = call(
        &registry,
        cx(Role::Member),
        "kb__echo",
        json!({"text": "hi"}),
    )
    .await;
    assert_eq!(r.code(), Some("MCP_NOT_ENABLED_HERE"), "{r:?}");
    let mut elsewhere = cx(Role::Member);
    elsewhere.session = "test:-200".to_owned();
    let r = call(&registry, elsewhere, "kb__echo", json!({"text": "hi"})).await;
    assert!(r.success, "{r:?}");
    service.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test]
async fn is_error_is_tool_error_and_images_reach_a_vision_model_or_are_named() {
    let fake = McpHttpServer::start().await;
    let mut config = server("kb", http(fake.url()));
    config.risk = Some(Risk::Read);
    let (service, registry) = start(vec![config.clone()], options()).await;
    let r = call(&registry, cx(Role::Member), "kb__fail", json!({})).await;
    assert_eq!(r.code(), Some("TOOL_ERROR"), "{r:?}");
    assert!(r.message.contains("the widget is broken"), "{r:?}");
    assert!(!r.success);

    let blind = cx(Role::Member);
    let r = call(&registry, blind.clone(), "kb__picture", json!({})).await;
    assert!(r.success, "{r:?}");
    assert!(r.message.contains("a red dot"), "{r:?}");
    assert_eq!(
        r.data.unwrap()["images"],
        json!(["an image (image/png) this model cannot see"])
    );
    assert!(blind.appender.drain().is_empty());
    service.shutdown().await;

    let (service, registry) = start(
        vec![config],
        McpOptions {
            vision: true,
            ..options()
        },
    )
    .await;
    let seeing = cx(Role::Member);
    let r = call(&registry, seeing.clone(), "kb__picture", json!({})).await;
    assert!(r.success, "{r:?}");
    let appended = seeing.appender.drain();
    assert_eq!(appended.len(), 1);
    let Message::User { content } = &appended[0] else {
        panic!("{appended:?}")
    };
    let body = serde_json::to_string(content).unwrap();
    assert!(body.contains("data:image/png;base64,"), "{body}");
    service.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test]
async fn a_slow_call_times_out() {
    let fake = McpHttpServer::start().await;
    let mut config = server("kb", http(fake.url()));
    config.risk = Some(Risk::Read);
    let (service, registry) = start(vec![config], options()).await;
    // Paused only now: connecting needed real I/O. From here the clock jumps whenever the
    // runtime waits, so the 20-second timeout passes without a real wait.
    tokio::time::pause();
    let r = call(&registry, cx(Role::Member), "kb__slow", json!({})).await;
    assert_eq!(r.code(), Some("TIMEOUT"), "{r:?}");
    assert!(r.message.contains("20s"), "{r:?}");
    tokio::time::resume();
    service.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test]
async fn a_cancelled_turn_sends_notifications_cancelled() {
    let fake = McpHttpServer::start().await;
    let mut config = server("kb", http(fake.url()));
    config.risk = Some(Risk::Read);
    let (service, registry) = start(vec![config], options()).await;
    let mut calls = fake.handler().calls();
    let mut cancelled = fake.handler().cancelled();
    let turn = CancellationToken::new();
    let mut context = cx(Role::Member);
    context.cancel = turn.clone();
    let running = tokio::spawn({
        let registry = registry.clone();
        async move { call(&registry, context, "kb__slow", json!({})).await }
    });
    tokio::time::timeout(WAIT_LIMIT, calls.wait_for(|n| *n == 1))
        .await
        .unwrap()
        .unwrap();
    turn.cancel();
    let r = running.await.unwrap();
    assert_eq!(r.code(), Some("CANCELLED"), "{r:?}");
    tokio::time::timeout(WAIT_LIMIT, cancelled.wait_for(|n| *n == 1))
        .await
        .expect("the server saw notifications/cancelled")
        .unwrap();
    service.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test]
async fn list_changed_refreshes_the_tools_the_model_is_offered() {
    let fake = McpHttpServer::start().await;
    let mut config = server("kb", http(fake.url()));
    config.risk = Some(Risk::Read);
    let (service, registry) = start(vec![config], options()).await;
    let toolset = service.toolsets().remove(0);
    let before = toolset.generation();
    assert!(!registry.names().contains(&"kb__late_tool".to_owned()));
    let r = call(&registry, cx(Role::Member), "kb__add_tool", json!({})).await;
    assert!(r.success, "{r:?}");
    assert!(
        toolset.wait_for_generation(before, WAIT_LIMIT).await,
        "the list_changed notification led to a new tool list"
    );
    let defs = serde_json::to_string(&registry.defs()).unwrap();
    assert!(defs.contains("kb__late_tool"), "{defs}");
    // A fork (another session) shares the rebuilt definitions.
    assert!(
        registry
            .fork()
            .names()
            .contains(&"kb__late_tool".to_owned())
    );
    let r = call(&registry, cx(Role::Member), "kb__late_tool", json!({})).await;
    assert!(r.message.contains("late and here"), "{r:?}");
    service.shutdown().await;
    fake.shutdown().await;
}

/// The child's pid and environment, from its `whoami` tool; `None` while it is down.
async fn try_whoami(registry: &ToolRegistry) -> Option<(u32, serde_json::Map<String, Value>)> {
    let r = call(registry, cx(Role::Operator), "child__whoami", json!({})).await;
    if !r.success {
        return None;
    }
    let body = r.message.lines().nth(1)?;
    let v: Value = serde_json::from_str(body).ok()?;
    let pid = u32::try_from(v["pid"].as_u64()?).ok()?;
    Some((pid, v["env"].as_object()?.clone()))
}

async fn whoami(registry: &ToolRegistry) -> (u32, serde_json::Map<String, Value>) {
    try_whoami(registry).await.expect("whoami answered")
}

#[tokio::test]
async fn a_stdio_child_gets_the_allow_list_and_its_own_env_and_no_secret() {
    // Cargo sets these for every test process: present here, and not on the allow-list.
    assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some());
    let (service, registry) = start(
        vec![server("child", stdio(&[("GREETING", "hello")]))],
        options(),
    )
    .await;
    let (_, env) = whoami(&registry).await;
    assert_eq!(env.get("GREETING"), Some(&json!("hello")));
    assert!(env.contains_key("PATH"), "{env:?}");
    for name in env.keys() {
        assert!(
            name == "GREETING" || DEFAULT_ENV_ALLOW.contains(&name.as_str()),
            "the child got {name}, which nobody passed it"
        );
    }
    service.shutdown().await;
}

#[tokio::test]
async fn a_server_killed_mid_call_answers_unavailable_then_comes_back() {
    let (service, registry) = start(vec![server("child", stdio(&[]))], options()).await;
    let toolset = service.toolsets().remove(0);
    let (pid, _) = whoami(&registry).await;
    let slow = tokio::spawn({
        let registry = registry.clone();
        async move { call(&registry, cx(Role::Operator), "child__slow", json!({})).await }
    });
    // The slow call is on its way (or about to be); kill -9 needs no cooperation.
    let killed = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let r = slow.await.unwrap();
    assert_eq!(r.code(), Some("UNAVAILABLE"), "{r:?}");
    // Restarted with backoff: connected again, by a new child.
    let mut status = toolset.watch_status();
    let new_pid = tokio::time::timeout(WAIT_LIMIT, async {
        loop {
            // Connected may still be the old connection's, not yet seen closed.
            if *status.borrow_and_update() == ServerStatus::Connected
                && let Some((new_pid, _)) = try_whoami(&registry).await
                && new_pid != pid
            {
                return new_pid;
            }
            status.changed().await.unwrap();
        }
    })
    .await
    .expect("the server came back");
    let r = call(
        &registry,
        cx(Role::Operator),
        "child__echo",
        json!({"text": "back"}),
    )
    .await;
    assert!(r.message.contains("echo: back"), "{r:?}");
    service.shutdown().await;
    assert!(
        !parlor_toolsets::terminal::process_alive(new_pid),
        "no child outlives the service"
    );
}

#[tokio::test]
async fn a_server_that_fails_at_start_is_logged_and_the_rest_runs() {
    let fake = McpHttpServer::start().await;
    let mut broken = server(
        "broken",
        McpTransport::Stdio {
            command: "/nonexistent/mcp-server".into(),
            args: Vec::new(),
            env: BTreeMap::new(),
            cwd: None,
        },
    );
    broken.timeout = Duration::from_secs(5);
    let (service, registry) = start(vec![broken, server("kb", http(fake.url()))], options()).await;
    let statuses = service.statuses();
    assert!(
        matches!(&statuses[0], (name, ServerStatus::Down(why)) if name == "broken" && why.contains("cannot start")),
        "{statuses:?}"
    );
    assert_eq!(statuses[1], ("kb".to_owned(), ServerStatus::Connected));
    assert!(registry.names().iter().all(|n| n.starts_with("kb__")));
    service.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test]
async fn two_tools_with_one_wire_name_are_a_startup_error_naming_both() {
    let fake = McpHttpServer::start().await;
    // 62 characters and `__` fill the 64 of a wire name: every tool becomes the same name.
    let name = "a".repeat(62);
    let service = McpService::new(vec![server(&name, http(fake.url()))], options()).unwrap();
    let error = service.start().await.unwrap_err().to_string();
    assert!(
        error.contains("\"echo\"") && error.contains("\"delete_file\""),
        "{error}"
    );
    service.shutdown().await;
    fake.shutdown().await;
}
