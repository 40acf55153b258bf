//! The life of a Telegram group around the bot, end to end: `parlor run` against the fake
//! Telegram and the fake LLM on 127.0.0.1. The bot is added to a basic group (which makes
//! it a chat a clock task may target), the group is upgraded to a supergroup (the task
//! fires into the new id), and the bot is removed (its tasks pause and their creator is
//! told).

use std::path::Path;

use parlor_bot::store::{SledStore, Store, StoreOptions};
use parlor_testkit::{DaemonProcess, FakeLlm, FakeTelegram, TgUser};

use crate::support::{self, TOKEN, WAIT, alice};

/// Where Alice, an operator, talks to the bot.
const HOME: i64 = -100_123;
const OLD: i64 = -5001;
const NEW: i64 = -1_005_001;

async fn start(dir: &Path, llm: &FakeLlm, telegram: &FakeTelegram) -> DaemonProcess {
    let config = support::config(dir, telegram, "admins = [\"telegram:1001\"]");
    DaemonProcess::spawn_polling(support::daemon_command(&config, llm), telegram, WAIT).await
}

/// SIGTERM; the daemon must exit cleanly. Returns its log.
async fn terminate(mut daemon: DaemonProcess) -> String {
    let exit = daemon.terminate(WAIT).await;
    let log = daemon.log();
    assert!(exit.success(), "{log}");
    log
}

/// The `clock_create` result the model received.
fn created(llm: &FakeLlm) -> String {
    llm.requests()[1].messages().last().unwrap()["content"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_aimed_at_a_group_the_bot_just_joined_fires_there_after_the_upgrade() {
    let llm = FakeLlm::start().await;
    let telegram = FakeTelegram::start(TOKEN).await;
    let dir = tempfile::tempdir().unwrap();
    let daemon = start(dir.path(), &llm, &telegram).await;

    // Added to the basic group; nobody has spoken there.
    telegram.basic_group(OLD, "book club");
    let joined = telegram.bot_added(OLD, &alice(), "member");
    telegram.wait_for_ack(joined, WAIT).await.unwrap();

    let due = chrono::Utc::now() + chrono::Duration::seconds(8);
    support::schedule_into(&llm, OLD, due);
    telegram
        .group_message(HOME, alice(), "@parlor_bot remind the book club")
        .mention_bot()
        .push();
    let sent = telegram.wait_for_sent(1, WAIT).await.unwrap();
    assert_eq!(
        (sent[0].chat_id, sent[0].text.as_str()),
        (HOME, "Scheduled.")
    );
    let result = created(&llm);
    assert!(
        result.contains("\"success\":true"),
        "a joined chat is known: {result}"
    );

    // The group becomes a supergroup before the task is due; both service messages come.
    let (_, second) = telegram.upgrade_group(OLD, NEW, &alice());
    telegram.wait_for_ack(second, WAIT).await.unwrap();

    let sent = telegram.wait_for_sent(2, WAIT).await.unwrap();
    assert_eq!(sent[1].chat_id, NEW, "the task fires into the new id");
    assert_eq!(sent[1].text, "Stand-up in 5 minutes!");
    let log = terminate(daemon).await;
    assert!(log.contains("chat moved to a new id"), "{log}");

    let store =
        SledStore::open(&dir.path().join("data").join("db"), StoreOptions::default()).unwrap();
    assert_eq!(
        store.migrated_to(&format!("telegram:{OLD}")).unwrap(),
        Some(format!("telegram:{NEW}"))
    );
    let record = store
        .chat_status(&format!("telegram:{NEW}"))
        .unwrap()
        .unwrap();
    assert!(record.present);
    assert_eq!(record.title.as_deref(), Some("book club"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removed_from_a_group_its_tasks_pause_and_the_creator_is_told_at_home() {
    const TEAM: i64 = -100_555;
    let llm = FakeLlm::start().await;
    let telegram = FakeTelegram::start(TOKEN).await;
    let dir = tempfile::tempdir().unwrap();
    let daemon = start(dir.path(), &llm, &telegram).await;
    let joined = telegram.bot_added(TEAM, &alice(), "administrator");
    telegram.wait_for_ack(joined, WAIT).await.unwrap();

    support::schedule_into(&llm, TEAM, chrono::Utc::now() + chrono::Duration::hours(1));
    telegram
        .group_message(HOME, alice(), "@parlor_bot remind the team")
        .mention_bot()
        .push();
    telegram.wait_for_sent(1, WAIT).await.unwrap();
    assert!(created(&llm).contains("\"success\":true"));

    let kicked = telegram.bot_removed(TEAM, &TgUser::new(1009, "Mallory"), "kicked");
    telegram.wait_for_ack(kicked, WAIT).await.unwrap();
    let sent = telegram.wait_for_sent(2, WAIT).await.unwrap();
    assert_eq!(sent[1].chat_id, HOME, "told where the task was created");
    assert!(sent[1].text.contains("is paused"), "{}", sent[1].text);
    assert!(sent[1].text.contains("kicked"), "{}", sent[1].text);
    // A repeated removal tells nobody again.
    let again = telegram.bot_removed(TEAM, &TgUser::new(1009, "Mallory"), "kicked");
    telegram.wait_for_ack(again, WAIT).await.unwrap();
    terminate(daemon).await;
    assert_eq!(telegram.sent_messages().len(), 2);

    let store =
        SledStore::open(&dir.path().join("data").join("db"), StoreOptions::default()).unwrap();
    let task: serde_json::Value =
        serde_json::from_str(&store.kv_get("clocks", "1").unwrap().unwrap()).unwrap();
    assert_eq!(task["enabled"], false);
    assert!(
        task["paused_reason"].as_str().unwrap().contains("kicked"),
        "{task}"
    );
    let record = store
        .chat_status(&format!("telegram:{TEAM}"))
        .unwrap()
        .unwrap();
    assert!(!record.present);
    assert_eq!(record.status, "kicked");
}
