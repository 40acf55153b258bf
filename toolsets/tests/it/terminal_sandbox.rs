//! The terminal under the real bubblewrap: what a sandboxed command can and cannot see. When
//! bwrap is missing or cannot run on this host (user namespaces refused), each test says so
//! on stderr and passes without checking anything.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use parlor_bot::platform::ChatRef;
use parlor_bot::store::MemoryStore;
use parlor_bot::testing::{WAIT_LIMIT, tool_context, wait_until};
use parlor_bot::tool::{Role, ToolContext, ToolInvocation, ToolResult, ToolSet};
use parlor_toolsets::terminal::{
    Sandbox, TaskStatus, TerminalConfig, TerminalService, terminal_toolset,
};
use serde_json::{Value, json};

use crate::support::TestNotifier;

/// Why bwrap cannot sandbox here, if it cannot: the namespaces and mounts the terminal's
/// sandbox uses, around `true`.
fn bwrap_unusable() -> Option<String> {
    let out = std::process::Command::new("bwrap")
        .args([
            "--die-with-parent",
            "--new-session",
            "--unshare-pid",
            "--unshare-net",
            "--ro-bind",
            "/",
            "/",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--tmpfs",
            "/tmp",
            "true",
        ])
        .output();
    match out {
        Err(e) => Some(format!("bwrap is not installed ({e})")),
        Ok(out) if !out.status.success() => Some(format!(
            "bwrap cannot create a sandbox here: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Ok(_) => None,
    }
}

/// Skips the test when bwrap cannot run, saying so; `PARLOR_REQUIRE_BWRAP=1` makes that a
/// failure instead, for hosts known to support it.
macro_rules! require_bwrap {
    () => {
        if let Some(why) = bwrap_unusable() {
            if std::env::var_os("PARLOR_REQUIRE_BWRAP").is_some() {
                panic!("{why}");
            }
            eprintln!("SKIPPED: {why}; the sandbox was not tested on this host");
            return;
        }
    };
}

fn chat(id: &str) -> ChatRef {
    ChatRef::new("test", id)
}

fn cx(chat: &ChatRef) -> ToolContext {
    tool_context(chat, "test:alice", Role::Operator)
}

async fn shell(tools: &dyn ToolSet, cx: &ToolContext, args: Value) -> ToolResult {
    tools
        .invoke(
            ToolInvocation {
                id: "c1".into(),
                name: "shell".into(),
                arguments: args,
            },
            cx.clone(),
        )
        .await
}

fn output(r: &ToolResult) -> String {
    r.data
        .as_ref()
        .and_then(|d| d["output"].as_str())
        .unwrap_or_default()
        .to_owned()
}

fn service(data_dir: &Path, hide: Vec<std::path::PathBuf>) -> Arc<TerminalService> {
    TerminalService::new(
        Arc::new(MemoryStore::new()),
        Arc::new(TestNotifier::default()),
        TerminalConfig {
            enabled: true,
            data_dir: data_dir.to_owned(),
            kill_grace: Duration::from_millis(300),
            sandbox: Sandbox::Bwrap {
                network: false,
                hide,
            },
            ..TerminalConfig::default()
        },
    )
}

/// Processes whose command line is exactly `words`, host-wide.
fn processes_running(words: &[&str]) -> Vec<u32> {
    let want: Vec<u8> = words
        .iter()
        .flat_map(|w| [w.as_bytes(), b"\0"].concat())
        .collect();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == want)
                && parlor_toolsets::terminal::process_alive(*pid)
        })
        .collect()
}

#[tokio::test]
async fn a_sandboxed_shell_sees_neither_the_store_nor_other_workspaces_nor_the_daemon() {
    require_bwrap!();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let store = data.join("db");
    std::fs::create_dir_all(&store).unwrap();
    std::fs::write(store.join("conf"), "STORE-CONTENT-4711").unwrap();
    let service = service(&data, Vec::new());
    let tools = terminal_toolset(service.clone()).fork();
    let other_tools = terminal_toolset(service.clone()).fork();
    let (mine, theirs) = (chat("-100"), chat("-200"));

    // The other chat leaves a file in its workspace and state in its shell.
    let r = shell(
        &*other_tools,
        &cx(&theirs),
        json!({"command": "echo OTHER-CHAT-0815 > notes.txt; export THEIRS=OTHER-VAR-42"}),
    )
    .await;
    assert!(r.success, "{r:?}");
    let their_ws = service.workspace(&theirs.session_key());
    assert!(their_ws.join("notes.txt").exists());

    let my_ws = service.workspace(&mine.session_key());
    let daemon_pid = std::process::id();
    let command = format!(
        "echo pid=$$ ppid=$PPID; ls /proc | grep -E '^[0-9]+$' | tr '\\n' ' '; echo; \
         test -e /proc/{daemon_pid}/environ && echo SEES-DAEMON-PROC; \
         ls -a {data} 2>&1; ls {store} 2>&1; cat {store}/conf 2>&1; \
         ls {their} 2>&1; cat {their}/notes.txt 2>&1; \
         grep -rs OTHER {data} 2>&1; \
         cat /etc/shadow 2>&1 | head -c 100; \
         touch /usr/x 2>&1; touch /etc/x 2>&1; \
         echo mine > here.txt && echo wrote-workspace; pwd; echo HOME=$HOME",
        data = data.display(),
        store = store.display(),
        their = their_ws.display(),
    );
    let r = shell(&*tools, &cx(&mine), json!({ "command": command })).await;
    assert!(r.success, "{r:?}");
    let out = output(&r);
    eprintln!("{out}");
    // A PID namespace of its own: the shell's parent is bubblewrap's init, and the daemon's
    // pid means nothing inside.
    assert!(out.contains("ppid=1"), "{out}");
    assert!(!out.contains("SEES-DAEMON-PROC"), "{out}");
    let pids = out.lines().nth(1).unwrap_or_default();
    assert!(
        pids.split_whitespace()
            .all(|p| p.parse::<u32>().unwrap() < 50),
        "the sandbox's /proc shows host processes: {pids}"
    );
    for secret in ["STORE-CONTENT-4711", "OTHER-CHAT-0815", "OTHER-VAR-42"] {
        assert!(
            !out.contains(secret),
            "{secret} leaked into the sandbox: {out}"
        );
    }
    assert!(
        out.contains(&format!("cannot access '{}'", store.display())),
        "the store directory is visible: {out}"
    );
    assert!(out.contains("Read-only file system"), "{out}");
    assert!(out.contains("wrote-workspace"), "{out}");
    assert!(out.contains(&format!("HOME={}", my_ws.display())), "{out}");
    assert_eq!(
        std::fs::read_to_string(my_ws.join("here.txt")).unwrap(),
        "mine\n"
    );

    // The persistent shell keeps its state across calls inside the sandbox.
    let r = shell(
        &*tools,
        &cx(&mine),
        json!({"command": "export MINE=kept; mkdir -p sub; cd sub"}),
    )
    .await;
    assert!(r.success, "{r:?}");
    let r = shell(
        &*tools,
        &cx(&mine),
        json!({"command": "echo $MINE; basename $PWD"}),
    )
    .await;
    assert_eq!(output(&r), "kept\nsub\n", "{r:?}");

    // A background task is sandboxed the same way.
    let r = shell(
        &*tools,
        &cx(&mine),
        json!({
            "command": format!("ls {} 2>&1; echo ppid=$PPID", their_ws.display()),
            "run_in_background": true,
        }),
    )
    .await;
    assert!(r.success, "{r:?}");
    let id = r.data.as_ref().unwrap()["task_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let session = mine.session_key();
    let ended = || {
        service
            .task(&session, &id)
            .filter(|r| r.status != TaskStatus::Running && !service.is_live(&id))
    };
    wait_until("the background task ending", WAIT_LIMIT, || {
        ended().is_some()
    })
    .await;
    let row = ended().unwrap();
    assert_eq!(row.status, TaskStatus::Completed, "{row:?}");
    let log = std::fs::read_to_string(&row.log_path).unwrap();
    assert!(log.contains("ppid=1"), "{log}");
    assert!(log.contains("No such file or directory"), "{log}");
    assert!(!log.contains("notes.txt"), "{log}");
    service.shutdown().await;
}

#[tokio::test]
async fn a_timeout_kills_everything_inside_the_sandbox() {
    require_bwrap!();
    let dir = tempfile::tempdir().unwrap();
    let service = service(dir.path(), Vec::new());
    let tools = terminal_toolset(service.clone()).fork();
    let mine = chat("-100");
    let started = std::time::Instant::now();
    let r = shell(
        &*tools,
        &cx(&mine),
        json!({"command": "sleep 1000.4711 & echo started; sleep 30", "timeout_secs": 1}),
    )
    .await;
    assert_eq!(r.code(), Some("TIMEOUT"), "{r:?}");
    assert_eq!(output(&r), "started\n", "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
    // Polled: the sandbox's processes are not our children.
    wait_until("nothing left running", Duration::from_secs(6), || {
        processes_running(&["sleep", "1000.4711"]).is_empty()
    })
    .await;
    let r = shell(&*tools, &cx(&mine), json!({"command": "echo again"})).await;
    assert_eq!(output(&r), "again\n", "{r:?}");
    service.shutdown().await;
}

#[tokio::test]
async fn hidden_paths_inside_etc_are_masked() {
    require_bwrap!();
    // A path the test may create under a system directory: only as root.
    let probe = Path::new("/etc/parlor-sandbox-test");
    if std::fs::create_dir_all(probe).is_err() {
        assert!(
            std::env::var_os("PARLOR_REQUIRE_BWRAP").is_none(),
            "PARLOR_REQUIRE_BWRAP is set but {} cannot be created (not root)",
            probe.display()
        );
        eprintln!("SKIPPED: cannot create {} (not root)", probe.display());
        return;
    }
    let cleanup = scopeguard(probe);
    std::fs::write(probe.join("config.toml"), "api_key = \"ETC-SECRET-99\"").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let service = service(dir.path(), vec![probe.join("config.toml")]);
    let tools = terminal_toolset(service.clone()).fork();
    let r = shell(
        &*tools,
        &cx(&chat("-100")),
        json!({"command": format!("cat {}/config.toml 2>&1; ls /etc/hostname", probe.display())}),
    )
    .await;
    let out = output(&r);
    assert!(!out.contains("ETC-SECRET-99"), "{out}");
    assert!(
        out.contains("/etc/hostname"),
        "the rest of /etc is visible: {out}"
    );
    service.shutdown().await;
    drop(cleanup);
}

/// Removes `dir` when dropped, also when the test fails.
fn scopeguard(dir: &Path) -> impl Drop {
    struct Remove(std::path::PathBuf);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    Remove(dir.to_owned())
}
