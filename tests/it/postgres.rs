//! `parlor run` with `[store] backend = "postgres"`: the real binary against a database of
//! the test process's throwaway PostgreSQL (`parlor_bot::testing::PgCluster`), the fake
//! Telegram and the fake model. Without PostgreSQL installed the test says SKIPPED (a
//! failure under `PARLOR_REQUIRE_POSTGRES=1`, as in CI).

use std::time::Duration;

use parlor_bot::testing::PgCluster;
use parlor_testkit::{DaemonProcess, FakeLlm, FakeTelegram, Reply};

use crate::support::{self, TOKEN, WAIT, alice, config, daemon_command, echo};

const GROUP: i64 = -100_321;

/// `parlor run` on `config` against `llm`, its store the database at `url`.
async fn start(
    config: &std::path::Path,
    llm: &FakeLlm,
    telegram: &FakeTelegram,
    url: &str,
) -> DaemonProcess {
    let mut command = daemon_command(config, llm);
    command.env("PARLOR_DATABASE_URL", url);
    DaemonProcess::spawn_polling(command, telegram, WAIT).await
}

/// Waits until the daemon has marked every reply sent, read from the database.
pub async fn unsent_outbox_empties(url: &str) {
    let url = url.to_owned();
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let url = url.clone();
        let unsent: i64 = tokio::task::spawn_blocking(move || {
            let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
            client
                .query_one("SELECT count(*) FROM parlor_outbox", &[])
                .unwrap()
                .get(0)
        })
        .await
        .unwrap();
        if unsent == 0 {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "a reply stayed unsent"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_a_turn_killed_with_sigkill_is_answered_once_after_the_restart_from_the_same_history()
 {
    let Some(cluster) = PgCluster::start() else {
        return;
    };
    let url = cluster.database();
    let llm = FakeLlm::start().await;
    llm.push(Reply::text("the first answer"));
    // The second question's turn is still running when the daemon is killed.
    llm.push(Reply::text("never sent").delay(Duration::from_secs(60)));
    let telegram = FakeTelegram::start(TOKEN).await;
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), &telegram, "[store]\nbackend = \"postgres\"\n");
    let mut first = start(&config, &llm, &telegram, &url).await;

    let q1 = telegram
        .group_message(GROUP, alice(), "@parlor_bot first question")
        .mention_bot()
        .push();
    let sent = telegram
        .wait_for_sent_where(WAIT, |m| m.reply_to_message_id == Some(q1))
        .await
        .unwrap();
    assert_eq!(sent.last().unwrap().text, "the first answer");
    // The kill must not fall between Telegram taking the answer and the outbox marking it
    // sent: the Bot API has no idempotency key, so that window resends (docs/operating.md).
    unsent_outbox_empties(&url).await;
    let q2 = telegram
        .group_message(GROUP, alice(), "@parlor_bot second question")
        .mention_bot()
        .push();
    llm.wait_for_requests(2, WAIT).await.unwrap();
    first.kill9().await;
    assert!(
        !dir.path().join("data").join("db").exists(),
        "no sled database: the state is in PostgreSQL"
    );

    let llm2 = FakeLlm::start().await;
    echo(&llm2);
    let mut second = start(&config, &llm2, &telegram, &url).await;
    telegram
        .wait_for_sent_where(WAIT, |m| m.reply_to_message_id == Some(q2))
        .await
        .unwrap();
    // The resumed turn saw the first turn's history, as the killed daemon had stored it.
    let resumed = &llm2.requests()[0];
    let history = serde_json::to_string(resumed.messages()).unwrap();
    assert!(history.contains("first question"), "{history}");
    assert!(history.contains("the first answer"), "{history}");
    assert!(
        resumed
            .last_user_text()
            .is_some_and(|t| t.contains("second question")),
        "{history}"
    );
    // Nothing else happened in the chat: the sentinel's answer comes after everything.
    let sent = support::sentinel(&telegram, GROUP).await;
    let replies_to = |id: i64| {
        sent.iter()
            .filter(|m| m.reply_to_message_id == Some(id))
            .count()
    };
    assert_eq!(replies_to(q1), 1, "{sent:?}");
    assert_eq!(replies_to(q2), 1, "{sent:?}");
    assert!(sent.iter().all(|m| m.text != "never sent"), "{sent:?}");
    assert_eq!(
        llm2.request_count(),
        2,
        "the second turn ran once, then the sentinel"
    );
    let status = second.terminate(WAIT).await;
    assert!(status.success(), "{}", second.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_server_that_cannot_be_reached_stops_the_start_with_a_clear_error() {
    // A port nobody listens on (bound, then let go): the connection is refused at once.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let llm = FakeLlm::start().await;
    let telegram = FakeTelegram::start(TOKEN).await;
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), &telegram, "[store]\nbackend = \"postgres\"\n");
    let mut command = daemon_command(&config, &llm);
    command.env(
        "PARLOR_DATABASE_URL",
        format!("postgresql://parlor:hunter2-secret@127.0.0.1:{port}/parlor"),
    );
    let out = tokio::time::timeout(WAIT, command.output())
        .await
        .unwrap()
        .unwrap();
    assert!(!out.status.success());
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("cannot open the PostgreSQL store"), "{log}");
    assert!(log.contains(&format!("127.0.0.1:{port}/parlor")), "{log}");
    assert!(!log.contains("hunter2"), "never the password: {log}");
}
