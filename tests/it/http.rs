//! `[http] listen`: `/healthz`, `/readyz` and `/metrics` of the real `parlor run` against
//! the fake Telegram and the fake LLM, all on loopback.

use parlor_testkit::{DaemonProcess, Failure, FakeLlm, FakeOneBot, FakeTelegram, Reply, TgUser};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::{self, TOKEN, WAIT, config, daemon_command};

const GROUP: i64 = -100_123;

/// One GET over a fresh connection: (status, body).
async fn get(addr: &str, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    let status = answer[9..12].parse().unwrap();
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// Polls `path` until its status is `want`: the daemon's state changes on its own clock.
/// A failure shows the daemon's log, which says what its connections did.
async fn until_status(daemon: &DaemonProcess, addr: &str, path: &str, want: u16) -> String {
    let last = std::sync::Mutex::new((0, String::new()));
    tokio::time::timeout(WAIT, async {
        loop {
            let (status, body) = get(addr, path).await;
            if status == want {
                return body;
            }
            *last.lock().unwrap() = (status, body);
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap_or_else(|_| {
        let (status, body) = last.into_inner().unwrap();
        panic!(
            "{path} never answered {want}; last {status}: {body}\n{}",
            daemon.log()
        )
    })
}

/// The value of the sample whose line starts with `prefix`, 0 when absent.
fn sample(metrics: &str, prefix: &str) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .map_or(0.0, |v| v.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_the_onebot_connection() {
    let llm = FakeLlm::start().await;
    let telegram = FakeTelegram::start(TOKEN).await;
    let qq = FakeOneBot::start("qq-token", 42).await;
    let dir = tempfile::tempdir().unwrap();
    let extra = format!(
        "[http]\nlisten = \"127.0.0.1:0\"\n[onebot]\nurl = \"{}\"\n",
        qq.ws_url()
    );
    let mut command = daemon_command(&config(dir.path(), &telegram, &extra), &llm);
    command.env("ONEBOT_ACCESS_TOKEN", "qq-token");
    let mut daemon = DaemonProcess::spawn_polling(command, &telegram, WAIT).await;
    let addr = support::http_addr(&daemon).await;
    daemon
        .wait_for_log("connected to the OneBot implementation", WAIT)
        .await;
    until_status(&daemon, &addr, "/readyz", 200).await;
    // The implementation goes away: not ready, naming it, while the adapter redials. Its
    // socket closes at once; should that not reach the daemon, the ping of a quiet
    // connection finds it gone within 25 s, hence the longer wait.
    drop(qq);
    daemon
        .wait_for_log("the OneBot implementation was lost", 2 * WAIT)
        .await;
    let reason = until_status(&daemon, &addr, "/readyz", 503).await;
    assert!(reason.contains("onebot"), "{reason}");
    daemon.terminate(WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_readiness_and_metrics_follow_the_daemon() {
    let llm = FakeLlm::start().await;
    llm.respond_with(|_| Reply::text("hello"));
    let telegram = FakeTelegram::start(TOKEN).await;
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), &telegram, "[http]\nlisten = \"127.0.0.1:0\"\n");
    let mut daemon =
        DaemonProcess::spawn_polling(daemon_command(&config, &llm), &telegram, WAIT).await;
    let addr = support::http_addr(&daemon).await;

    assert_eq!(get(&addr, "/healthz").await.0, 200);
    until_status(&daemon, &addr, "/readyz", 200).await;

    let before = get(&addr, "/metrics").await.1;
    assert!(before.contains("parlor_sessions_in_memory"), "{before}");
    telegram
        .group_message(GROUP, TgUser::new(1001, "Alice"), "@parlor_bot hi")
        .mention_bot()
        .push();
    telegram.wait_for_sent(1, WAIT).await.unwrap();
    let after = get(&addr, "/metrics").await.1;
    assert_eq!(
        sample(
            &after,
            "parlor_turns_total{platform=\"telegram\",outcome=\"answered\"}"
        ),
        1.0,
        "{after}"
    );
    assert!(
        sample(&after, "parlor_llm_requests_total{") >= 1.0,
        "{after}"
    );
    assert!(
        after.contains("parlor_llm_request_seconds_bucket"),
        "{after}"
    );
    assert!(after.contains("parlor_sessions_in_memory 1"), "{after}");

    // Telegram goes down for a few polls: /readyz names it, then recovers.
    for _ in 0..3 {
        telegram.fail_next(
            "getUpdates",
            Failure::BadRequest("down for the test".into()),
        );
    }
    let reason = until_status(&daemon, &addr, "/readyz", 503).await;
    assert!(reason.contains("telegram"), "{reason}");
    until_status(&daemon, &addr, "/readyz", 200).await;

    let exit = daemon.terminate(WAIT).await;
    assert!(exit.success(), "{}", daemon.log());
}
