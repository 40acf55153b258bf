//! What the root package's tests of `parlor run` share: the token, the users, the config
//! file against the fakes, the command line with only the environment a test gives it, and
//! the sentinel that shows nothing else happened in a chat.

// Each module uses only some of these.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use parlor_testkit::{
    DaemonProcess, FakeLlm, FakeTelegram, Reply, SentMessage, TgUser, ToolCallSpec,
};

/// The bot token the fake Telegram accepts.
pub const TOKEN: &str = "123456:TEST-token";

/// How long a test waits for the daemon or a fake.
pub const WAIT: Duration = Duration::from_secs(30);

/// Alice (telegram:1001), `@alice`.
pub fn alice() -> TgUser {
    TgUser::new(1001, "Alice").username("alice")
}

/// Bob (telegram:1002), `@bob`.
pub fn bob() -> TgUser {
    TgUser::new(1002, "Bob").username("bob")
}

/// Zed (telegram:1999), who says the sentinels.
pub fn zed() -> TgUser {
    TgUser::new(1999, "Zed").username("zed")
}

/// The sentinel's text as the model sees it.
pub const SENTINEL: &str = "Zed (telegram:1999): @parlor_bot sentinel";

/// Zed mentions the bot in group `chat` (`@parlor_bot sentinel`); waits for the reply
/// threaded to it and returns every message sent so far. A chat's inputs are served and its
/// replies sent in order, so whatever came before in that chat is done by then: how a test
/// sees that nothing else happened. The model must answer it.
pub async fn sentinel(telegram: &FakeTelegram, chat: i64) -> Vec<SentMessage> {
    let id = telegram
        .group_message(chat, zed(), "@parlor_bot sentinel")
        .mention_bot()
        .push();
    telegram
        .wait_for_sent_where(WAIT, |m| {
            m.chat_id == chat && m.reply_to_message_id == Some(id)
        })
        .await
        .unwrap()
}

/// The model answers every request `echo <its last user text>` (lines joined by ` | `),
/// after what `llm` already holds.
pub fn echo(llm: &FakeLlm) {
    llm.respond_with(|body| {
        let last = parlor_testkit::last_user_text(body).unwrap_or_default();
        Reply::text(format!("echo <{}>", last.replace('\n', " | ")))
    });
}

/// Writes `dir/config.toml`: data in `dir/data`, the fake Telegram, no LLM retries; `extra`
/// lines go into `[bot]` (and may open further sections).
pub fn config(dir: &Path, telegram: &FakeTelegram, extra: &str) -> PathBuf {
    let path = dir.join("config.toml");
    let text = format!(
        r#"
[bot]
data_dir = "{data}"
shutdown_grace_secs = 2
{extra}
[llm]
max_retries = 0
[telegram]
api_url = "{api}"
poll_timeout_secs = 1
"#,
        data = dir.join("data").display(),
        api = telegram.api_url(),
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// `parlor run` against `llm` with the key `sk-test`.
pub fn daemon_command(config: &Path, llm: &FakeLlm) -> tokio::process::Command {
    parlor_command(config, &llm.base_url(), "sk-test")
}

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

/// The model's answers to a request for a stand-up reminder: `clock_create` of a task firing
/// into the Telegram chat `target` at `due`, then "Scheduled."; the fired task's turn is
/// answered "Stand-up in 5 minutes!".
pub fn schedule_into(llm: &FakeLlm, target: i64, due: chrono::DateTime<chrono::Utc>) {
    llm.push(Reply::tool_calls(vec![ToolCallSpec::new(
        "c1",
        "clock_create",
        serde_json::json!({
            "name": "standup",
            "schedule": due.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            "content": "Post the stand-up reminder.",
            "target_chat": format!("telegram:{target}"),
        }),
    )]));
    llm.push(Reply::text("Scheduled."));
    llm.respond_with(|body| {
        let last = parlor_testkit::last_user_text(body).unwrap_or_default();
        Reply::text(if last.contains("Scheduled task") {
            "Stand-up in 5 minutes!"
        } else {
            "unexpected"
        })
    });
}

/// Appends a `[[llm.vision_models]]` entry (`eyes-1` at `base_url`) to the config at `path`.
pub fn add_vision_model(path: &Path, base_url: &str) {
    let mut text = std::fs::read_to_string(path).unwrap();
    text.push_str(&format!(
        "[[llm.vision_models]]\nmodel = \"eyes-1\"\nbase_url = \"{base_url}\"\n"
    ));
    std::fs::write(path, text).unwrap();
}

/// The address the daemon's `[http]` listener bound (`listen = "127.0.0.1:0"` picks a port),
/// from its log, waiting up to 30 s for the line.
pub async fn http_addr(daemon: &DaemonProcess) -> String {
    let log = daemon.wait_for_log("serving /healthz", WAIT).await;
    listen_addr(&log).unwrap_or_else(|| panic!("no [http] address in the log:\n{log}"))
}

fn listen_addr(log: &str) -> Option<String> {
    let line = log.lines().find(|l| l.contains("serving /healthz"))?;
    let start = line.find("127.0.0.1:")?;
    Some(
        line[start..]
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':')
            .collect(),
    )
}

/// The address the daemon's OneBot listener bound, from its log.
pub async fn onebot_addr(daemon: &DaemonProcess) -> String {
    let log = daemon
        .wait_for_log("waiting for the OneBot implementation", WAIT)
        .await;
    log.lines()
        .find(|l| l.contains("waiting for the OneBot implementation"))
        .and_then(|line| line.find("127.0.0.1:").map(|at| &line[at..]))
        .map(|at| {
            at.chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':')
                .collect()
        })
        .unwrap_or_else(|| panic!("the OneBot listener never said where it is\n{log}"))
}

/// `who` says `text` in Telegram chat `chat`; waits for the message threaded to it and
/// returns its text.
pub async fn say_in(
    telegram: &FakeTelegram,
    chat: i64,
    who: parlor_testkit::TgUser,
    text: &str,
) -> String {
    let id = telegram.group_message(chat, who, text).push();
    let sent = telegram
        .wait_for_sent_where(WAIT, |m| {
            m.chat_id == chat && m.reply_to_message_id == Some(id)
        })
        .await
        .unwrap();
    sent.iter()
        .rev()
        .find(|m| m.reply_to_message_id == Some(id))
        .map(|m| m.text.clone())
        .unwrap_or_default()
}

/// A daemon against `llm` and a new fake Telegram, where `admins` administer group `group`;
/// `extra` lines go into `[bot]` (and may open further sections).
pub async fn telegram_bot(
    llm: &FakeLlm,
    group: i64,
    admins: &[i64],
    extra: &str,
) -> (
    FakeTelegram,
    tempfile::TempDir,
    std::path::PathBuf,
    DaemonProcess,
) {
    let telegram = FakeTelegram::start(TOKEN).await;
    if !admins.is_empty() {
        telegram.set_admins(group, admins.to_vec());
    }
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), &telegram, extra);
    let daemon = DaemonProcess::spawn_polling(daemon_command(&config, llm), &telegram, WAIT).await;
    (telegram, dir, config, daemon)
}
