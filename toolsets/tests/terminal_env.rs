//! Secrets in the daemon's environment never reach a command: the child environment is
//! built from the allow-list only. Its own test binary, because it sets process environment
//! variables before any other thread runs.

// A failed unwrap in a test is the test failing.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use parlor_bot::platform::ChatRef;
use parlor_bot::store::MemoryStore;
use parlor_bot::testing::{WAIT_LIMIT, tool_context, wait_until};
use parlor_bot::tool::{Role, ToolInvocation, ToolSet};
use parlor_toolsets::terminal::{TaskStatus, TerminalConfig, TerminalService, terminal_toolset};
use serde_json::json;

#[test]
fn env_inside_the_shell_and_tasks_shows_no_secret() {
    // SAFETY: the only test of this binary; no other thread reads the environment yet.
    #[allow(unsafe_code)]
    unsafe {
        std::env::set_var("OPENAI_API_KEY", "sk-secret-openai");
        std::env::set_var("TELEGRAM_BOT_TOKEN", "123:secret-telegram");
        std::env::set_var("LANG", "C.UTF-8");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let service = TerminalService::new(
            Arc::new(MemoryStore::new()),
            Arc::new(parlor_bot::session::system_inputs().0),
            TerminalConfig {
                enabled: true,
                data_dir: dir.path().to_owned(),
                ..TerminalConfig::default()
            },
        );
        let tools = terminal_toolset(service.clone()).fork();
        let chat = ChatRef::new("test", "-100");
        let cx = tool_context(&chat, "test:alice", Role::Operator);
        let invoke = |args: serde_json::Value| {
            tools.invoke(
                ToolInvocation {
                    id: "1".into(),
                    name: "shell".into(),
                    arguments: args,
                },
                cx.clone(),
            )
        };
        let r = invoke(json!({"command": "env"})).await;
        let env = r.data.as_ref().unwrap()["output"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(!env.contains("secret"), "{env}");
        assert!(!env.contains("OPENAI_API_KEY") && !env.contains("TELEGRAM_BOT_TOKEN"));
        assert!(
            env.contains("LANG=C.UTF-8"),
            "allow-listed variables pass: {env}"
        );
        let home = format!("HOME={}", service.workspace(&chat.session_key()).display());
        assert!(env.lines().any(|l| l == home), "{env}");

        let r =
            invoke(json!({"command": "env; cat /proc/self/environ", "run_in_background": true}))
                .await;
        let id = r.data.as_ref().unwrap()["task_id"]
            .as_str()
            .unwrap()
            .to_owned();
        let ended = || {
            service
                .task(&chat.session_key(), &id)
                .filter(|r| r.status != TaskStatus::Running)
        };
        wait_until("the task ending", WAIT_LIMIT, || ended().is_some()).await;
        let row = ended().unwrap();
        let log = std::fs::read_to_string(&row.log_path).unwrap();
        assert!(log.contains("PATH="), "{log}");
        assert!(!log.contains("secret"), "{log}");
        service.shutdown().await;
    });
}
