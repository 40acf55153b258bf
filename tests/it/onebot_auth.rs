//! The OneBot reverse WebSocket (`[onebot] listen`) of the real `parlor` binary: a config
//! without an access token is refused; the running listener refuses a wrong token and a
//! browser's `Origin`, keeps its first connection when a second presents the right token
//! (events and replies still flow over the first), and takes a new one once the first is
//! gone. All on loopback, against `parlor_testkit::FakeOneBot`.

use std::time::Duration;

use parlor_testkit::onebot::DialError;
use parlor_testkit::{DaemonProcess, FakeLlm, FakeOneBot, FakeTelegram};

use crate::support::{self, WAIT, config, daemon_command};

const ONEBOT_TOKEN: &str = "onebot-TEST-token";
const QQ_GROUP: i64 = 555;

/// `parlor --config <dir>/config.toml check-config` with `env` only.
async fn check_config(text: &str, env: &[(&str, &str)]) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    std::fs::write(&path, text).unwrap();
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_parlor"));
    command
        .arg("--config")
        .arg(&path)
        .arg("check-config")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default());
    for (name, value) in env {
        command.env(name, value);
    }
    tokio::time::timeout(WAIT, command.output())
        .await
        .unwrap()
        .unwrap()
}

#[tokio::test]
async fn check_config_refuses_a_reverse_listener_without_an_access_token() {
    let reverse = "[onebot]\nlisten = \"127.0.0.1:6700\"\n";
    let out = check_config(reverse, &[]).await;
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("onebot.listen needs an access token"),
        "{said}"
    );
    assert!(said.contains("ONEBOT_ACCESS_TOKEN"), "{said}");

    let out = check_config(reverse, &[("ONEBOT_ACCESS_TOKEN", ONEBOT_TOKEN)]).await;
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("configuration is valid"), "{said}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_connection_does_not_displace_the_first_and_is_taken_once_the_first_is_gone() {
    let llm = FakeLlm::start().await;
    support::echo(&llm);
    let telegram = FakeTelegram::start(support::TOKEN).await;
    let dir = tempfile::tempdir().unwrap();
    let onebot = "\n[onebot]\nlisten = \"127.0.0.1:0\"\nmin_send_interval_ms = 0\n";
    let mut command = daemon_command(&config(dir.path(), &telegram, onebot), &llm);
    command.env("ONEBOT_ACCESS_TOKEN", ONEBOT_TOKEN);
    let mut daemon = DaemonProcess::spawn_polling(command, &telegram, WAIT).await;
    let url = format!("ws://{}/", support::onebot_addr(&daemon).await);

    let first = FakeOneBot::start(ONEBOT_TOKEN, 42).await;
    let second = FakeOneBot::start(ONEBOT_TOKEN, 42).await;
    assert_eq!(
        first.dial_reverse(&url, "wrong-token", &[]).await,
        Err(DialError::Refused(401))
    );
    assert_eq!(
        first
            .dial_reverse(&url, ONEBOT_TOKEN, &[("Origin", "http://evil.example")])
            .await,
        Err(DialError::Refused(403))
    );
    first.dial_reverse(&url, ONEBOT_TOKEN, &[]).await.unwrap();
    first.wait_for_connections(1, WAIT).await.unwrap();

    // The newcomer has the token and is still refused; the first keeps serving.
    assert_eq!(
        second.dial_reverse(&url, ONEBOT_TOKEN, &[]).await,
        Err(DialError::Refused(409))
    );
    first
        .group_message(QQ_GROUP, 1001, "alice", " over the first")
        .mention_bot()
        .push();
    let sent = first.wait_for_sent(1, WAIT).await.unwrap();
    assert!(sent[0].text().contains("over the first"), "{:?}", sent[0]);
    assert!(second.sent().is_empty());
    assert!(first.is_connected());
    let log = daemon.log();
    assert!(
        log.lines()
            .any(|l| l.contains("refused a second OneBot connection") && l.contains("127.0.0.1:")),
        "the refusal is logged with the peer: {log}"
    );

    // The first goes away: the next attempt is taken.
    assert!(first.disconnect());
    daemon
        .wait_for_log("the OneBot connection ended", WAIT)
        .await;
    // The slot is given back just after that line: a connect in between is still refused
    // (409), and retried.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match second.dial_reverse(&url, ONEBOT_TOKEN, &[]).await {
            Ok(()) => break,
            Err(DialError::Refused(409)) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(status) => panic!("refused with {status}\n{}", daemon.log()),
        }
    }
    second
        .group_message(QQ_GROUP, 1001, "alice", " over the second")
        .mention_bot()
        // Both fakes number from the same start; the daemon drops a message id it saw.
        .message_id(5000)
        .push();
    let sent = second.wait_for_sent(1, WAIT).await.unwrap();
    assert!(sent[0].text().contains("over the second"), "{:?}", sent[0]);

    let exit = daemon.terminate(WAIT).await;
    assert!(exit.success(), "{}", daemon.log());
    assert!(!daemon.log().contains(ONEBOT_TOKEN), "the token leaked");
}
