//! What the tests of the real binary share: the `parlor run` command with only the
//! environment a test gives it, and starting it until it polls the fake Telegram.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use parlor_testkit::FakeTelegram;
use tokio::io::AsyncBufReadExt;
use tokio::process::Child;

/// The fake Telegram's bot token.
pub const TOKEN: &str = "123456:TEST-token";

/// How long a test waits for the daemon to poll.
const READY: Duration = Duration::from_secs(30);

/// `parlor --config CONFIG run` with a clean environment: `PATH`, the Telegram token, the
/// LLM's base URL and key, and `PARLOR_LOG=info`.
pub fn parlor_command(config: &Path, llm_url: &str, api_key: &str) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_parlor"));
    command
        .arg("--config")
        .arg(config)
        .arg("run")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("TELEGRAM_BOT_TOKEN", TOKEN)
        .env("OPENAI_BASE_URL", llm_url)
        .env("OPENAI_API_KEY", api_key)
        .env("PARLOR_LOG", "info");
    command
}

/// Starts `command` (killed when the child is dropped), collects its stderr into the
/// returned log, and waits until the daemon polls Telegram.
pub async fn spawn_polling(
    mut command: tokio::process::Command,
    telegram: &FakeTelegram,
) -> (Child, Arc<Mutex<String>>) {
    let calls_before = telegram.calls("getUpdates");
    let mut child = command
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let log = Arc::new(Mutex::new(String::new()));
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let sink = Arc::clone(&log);
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            let mut log = sink.lock().unwrap();
            log.push_str(&line);
            log.push('\n');
        }
    });
    // Ready once it polls.
    telegram
        .wait_for_calls("getUpdates", calls_before + 1, READY)
        .await
        .unwrap_or_else(|e| panic!("the daemon never polled: {e}\n{}", log.lock().unwrap()));
    (child, log)
}
