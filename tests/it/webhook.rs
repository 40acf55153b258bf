//! Telegram's webhook mode through the real binary: `parlor run` registers
//! `telegram.webhook_url` with its secret token, and the fake Telegram POSTs updates to the
//! daemon's `[http]` listener. A mention is answered, a repeat is answered once, a wrong or
//! missing secret gets 401 and records nothing; `check-config` names the mode and refuses a
//! webhook without a listener.

use std::path::{Path, PathBuf};

use parlor_testkit::{DaemonProcess, FakeLlm, FakeTelegram};
use serde_json::Value;

use crate::support::{self, WAIT, alice, zed};

/// The group the tests talk in.
const GROUP: i64 = -100_777;
/// The webhook's secret token, as `TELEGRAM_WEBHOOK_SECRET` gives it.
const SECRET: &str = "webhook-S3cret_token";
/// The webhook URL's path secret.
const PATH_SECRET: &str = "3f9c2a7d0b6e41c8a5d2";

/// A port on 127.0.0.1 that was free a moment ago: the webhook URL must name the listener's
/// port before the daemon starts, so `listen = "127.0.0.1:0"` will not do.
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// The config of [`support::config`] plus the webhook URL and the listener serving it.
fn webhook_config(dir: &Path, telegram: &FakeTelegram, port: u16) -> (PathBuf, String) {
    let path = support::config(dir, telegram, "");
    let url = format!("http://127.0.0.1:{port}/telegram/{PATH_SECRET}");
    let mut text = std::fs::read_to_string(&path).unwrap();
    // `[telegram]` is the file's last section.
    text.push_str(&format!(
        "webhook_url = \"{url}\"\n[http]\nlisten = \"127.0.0.1:{port}\"\n"
    ));
    std::fs::write(&path, text).unwrap();
    (path, url)
}

struct World {
    daemon: DaemonProcess,
    telegram: FakeTelegram,
    url: String,
    _llm: FakeLlm,
    _dir: tempfile::TempDir,
}

/// The daemon in webhook mode, answering `echo <text>`, once it has set its webhook.
async fn start() -> World {
    let llm = FakeLlm::start().await;
    support::echo(&llm);
    let telegram = FakeTelegram::start(support::TOKEN).await;
    let dir = tempfile::tempdir().unwrap();
    let (config, url) = webhook_config(dir.path(), &telegram, free_port());
    let mut command = support::daemon_command(&config, &llm);
    command.env("TELEGRAM_WEBHOOK_SECRET", SECRET);
    let daemon = DaemonProcess::spawn_webhook(command, &telegram, WAIT).await;
    World {
        daemon,
        telegram,
        url,
        _llm: llm,
        _dir: dir,
    }
}

/// Zed's `@parlor_bot sentinel`, posted to the webhook; waits for its reply and returns
/// every message sent so far (see [`support::sentinel`]).
async fn sentinel(telegram: &FakeTelegram) -> Vec<parlor_testkit::SentMessage> {
    let update = telegram
        .group_message(GROUP, zed(), "@parlor_bot sentinel")
        .mention_bot()
        .webhook_update();
    let id = message_id(&update);
    assert_eq!(telegram.deliver_webhook(&update).await.unwrap(), 200);
    telegram
        .wait_for_sent_where(WAIT, |m| {
            m.chat_id == GROUP && m.reply_to_message_id == Some(id)
        })
        .await
        .unwrap()
}

fn message_id(update: &Value) -> i64 {
    update["message"]["message_id"].as_i64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mention_posted_to_the_webhook_is_answered() {
    let world = start().await;
    let telegram = &world.telegram;

    let webhook = telegram.webhook().unwrap();
    assert_eq!(webhook.url, world.url);
    assert_eq!(webhook.secret_token.as_deref(), Some(SECRET));
    assert_eq!(webhook.drop_pending_updates, Some(false));
    assert_eq!(
        webhook.allowed_updates,
        Some(vec![
            "message".to_owned(),
            "edited_message".to_owned(),
            "my_chat_member".to_owned(),
            "callback_query".to_owned(),
        ])
    );

    let update = telegram
        .group_message(GROUP, alice(), "hello over the webhook")
        .mention_bot()
        .webhook_update();
    assert_eq!(telegram.deliver_webhook(&update).await.unwrap(), 200);
    let sent = telegram.wait_for_sent(1, WAIT).await.unwrap();
    assert_eq!(sent[0].chat_id, GROUP);
    assert_eq!(sent[0].reply_to_message_id, Some(message_id(&update)));
    assert!(
        sent[0].text.contains("hello over the webhook"),
        "{}",
        sent[0].text
    );
    assert_eq!(telegram.calls("getUpdates"), 0, "webhook mode never polls");
    assert_eq!(telegram.calls("deleteWebhook"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_update_posted_twice_is_answered_once() {
    let world = start().await;
    let telegram = &world.telegram;
    let update = telegram
        .group_message(GROUP, alice(), "only once, please")
        .mention_bot()
        .webhook_update();
    assert_eq!(telegram.deliver_webhook(&update).await.unwrap(), 200);
    // Telegram retries when it misses the answer: the repeat is taken, and deduped.
    assert_eq!(telegram.deliver_webhook(&update).await.unwrap(), 200);

    let sent = sentinel(telegram).await;
    let answers = sent
        .iter()
        .filter(|m| m.reply_to_message_id == Some(message_id(&update)))
        .count();
    assert_eq!(answers, 1, "{sent:#?}\n{}", world.daemon.log());
    assert_eq!(sent.len(), 2, "{sent:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_or_missing_secret_gets_401_and_nothing_is_answered() {
    let world = start().await;
    let telegram = &world.telegram;
    let forged = telegram
        .group_message(GROUP, alice(), "forged")
        .mention_bot()
        .webhook_update();
    for secret in [Some("webhook-S3cret_tokeX"), Some(""), None] {
        let status = telegram
            .deliver_webhook_with_secret(&forged, secret)
            .await
            .unwrap();
        assert_eq!(status, 401, "{secret:?}");
    }

    let sent = sentinel(telegram).await;
    assert_eq!(sent.len(), 1, "only the sentinel is answered: {sent:#?}");
    let log = world.daemon.log();
    assert!(!log.contains(SECRET), "the secret is never logged:\n{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_config_names_the_mode_and_refuses_a_webhook_without_a_listener() {
    let telegram = FakeTelegram::start(support::TOKEN).await;
    let dir = tempfile::tempdir().unwrap();
    let check = |config: &Path| {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_parlor"));
        command
            .arg("--config")
            .arg(config)
            .arg("check-config")
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("TELEGRAM_BOT_TOKEN", support::TOKEN)
            .env("TELEGRAM_WEBHOOK_SECRET", SECRET)
            .kill_on_drop(true);
        async move {
            let out = tokio::time::timeout(WAIT, command.output())
                .await
                .unwrap()
                .unwrap();
            (
                out.status.success(),
                String::from_utf8_lossy(&out.stdout).into_owned()
                    + &String::from_utf8_lossy(&out.stderr),
            )
        }
    };

    let polling = support::config(dir.path(), &telegram, "");
    let (ok, said) = check(&polling).await;
    assert!(ok, "{said}");
    assert!(said.contains("telegram: long polling"), "{said}");

    let (webhook, _) = webhook_config(dir.path(), &telegram, 8443);
    let (ok, said) = check(&webhook).await;
    assert!(ok, "{said}");
    assert!(said.contains("telegram: webhook"), "{said}");
    assert!(
        !said.contains(PATH_SECRET),
        "the path secret is not printed: {said}"
    );

    // The same webhook without `[http]`.
    let text = std::fs::read_to_string(&webhook).unwrap();
    let without = text.split("[http]").next().unwrap().to_owned();
    std::fs::write(&webhook, without).unwrap();
    let (ok, said) = check(&webhook).await;
    assert!(!ok, "{said}");
    assert!(
        said.contains("telegram.webhook_url needs [http] listen"),
        "{said}"
    );
}
