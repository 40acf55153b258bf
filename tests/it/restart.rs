//! A start that lands on clock due times, with pending inputs of every kind in the store:
//! `parlor run` against the fake Telegram and the fake LLM on 127.0.0.1. The store is
//! written as a daemon killed at that moment would leave it; the start must queue what the
//! store holds once and fire each due time once, whichever comes first.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use parlor_bot::platform::ChatRef;
use parlor_bot::store::{PendingItem, PendingKind, SledStore, Store, StoreOptions};
use parlor_bot::tool::{Caller, Role};
use parlor_testkit::{DaemonProcess, FakeLlm, FakeTelegram, Reply};
use parlor_toolsets::clock::{ClockHandle, ClockOptions, MissedPolicy, NewClock};

use crate::support;

const TEAM: i64 = -100_777;
const WAIT: Duration = Duration::from_secs(60);
/// Clock tasks due at the moment of the start.
const TASKS: usize = 12;

fn team() -> ChatRef {
    ChatRef::new("telegram", TEAM.to_string())
}

fn alice() -> Caller {
    Caller {
        user_id: "1001".into(),
        name: "alice".into(),
        role: Role::Member,
        grants: Vec::new(),
    }
}

fn pending(kind: PendingKind, text: &str) -> PendingItem {
    let chat = team();
    PendingItem {
        id: 0,
        session: chat.session_key(),
        chat,
        kind,
        caller: alice(),
        text: text.to_owned(),
        reply_to: None,
        images: Vec::new(),
        received: chrono::Utc::now(),
        private: false,
    }
}

/// The store a daemon killed at this moment leaves: `TASKS` one-shot clock tasks due in a
/// second, and one pending input of every kind whose turn never committed.
fn prepare(dir: &Path) -> chrono::DateTime<chrono::Utc> {
    let store: Arc<dyn Store> =
        Arc::new(SledStore::open(&dir.join("data").join("db"), StoreOptions::default()).unwrap());
    let clocks = ClockHandle::new(Arc::clone(&store), ClockOptions::default());
    let due = chrono::Utc::now() + chrono::Duration::seconds(1);
    for i in 0..TASKS {
        clocks
            .create(NewClock {
                name: format!("task {i}"),
                schedule: due.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                content: format!("Post marker due-{i}."),
                timezone: None,
                target: team(),
                creator: alice(),
                created_in: team().session_key(),
                missed: MissedPolicy::Skip,
            })
            .unwrap();
    }
    // `/compact` and `/reset` first: run on an empty history, they ask the model nothing.
    for (kind, text) in [
        (PendingKind::Compact, ""),
        (PendingKind::Reset, ""),
        (
            PendingKind::UserMessage,
            "alice (telegram:1001): @parlor_bot ping-1",
        ),
        (
            PendingKind::UserMessage,
            "alice (telegram:1001): @parlor_bot ping-2",
        ),
        (
            PendingKind::TaskResult,
            "<TASK_RESULT>notice-1</TASK_RESULT>",
        ),
        (PendingKind::ClockFire, "[Scheduled task] marker fire-0"),
        (PendingKind::AutoChat, "bob (telegram:1002): chatter-1"),
        (PendingKind::AutoChat, "bob (telegram:1002): chatter-2"),
    ] {
        store
            .add_pending_with(pending(kind, text), Vec::new())
            .unwrap();
    }
    store.flush().unwrap();
    due
}

/// Every marker (`due-N`, `ping-N`, `notice-N`, `fire-N`, `chatter-N`, `sentinel`) in `text`.
fn markers(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for word in text.split(|c: char| !(c.is_alphanumeric() || c == '-')) {
        let marked = ["due-", "ping-", "notice-", "fire-", "chatter-"]
            .iter()
            .any(|p| word.starts_with(p) && word[p.len()..].parse::<u32>().is_ok());
        if marked || word == "sentinel" {
            found.push(word.to_owned());
        }
    }
    found
}

/// Waits (up to `WAIT`) until the posts hold every one of `markers`; returns all posts.
async fn posts_with(
    telegram: &FakeTelegram,
    wanted: &[String],
) -> Result<Vec<parlor_testkit::SentMessage>, tokio::time::error::Elapsed> {
    tokio::time::timeout(WAIT, async {
        let mut n = 1;
        loop {
            let sent = telegram.wait_for_sent(n, WAIT).await.unwrap();
            let seen: Vec<String> = sent.iter().flat_map(|s| markers(&s.text)).collect();
            if wanted.iter().all(|m| seen.contains(m)) {
                return sent;
            }
            n = sent.len() + 1;
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_on_clock_due_times_posts_each_once_and_runs_each_pending_input_once() {
    let llm = FakeLlm::start().await;
    let telegram = FakeTelegram::start(support::TOKEN).await;
    telegram.group_chat(TEAM, "team");
    let dir = tempfile::tempdir().unwrap();
    let due = prepare(dir.path());
    // Each turn answers with the markers of its input, so the posts say which input ran.
    llm.respond_with(|body| {
        let last = parlor_testkit::last_user_text(body).unwrap_or_default();
        let found = markers(&last);
        Reply::text(if found.is_empty() {
            "nothing marked".to_owned()
        } else {
            format!("seen {}", found.join(" "))
        })
    });
    let config = support::config(
        dir.path(),
        &telegram,
        &format!(
            "turns_per_minute = 1000\n\
             [[bot.auto_chat]]\nchat = \"telegram:{TEAM}\"\nbatch_messages = 2\n\
             batch_seconds = 600\n"
        ),
    );
    // Starts when the due time has come, as a restart landing on it would.
    let until_due = (due - chrono::Utc::now()).to_std().unwrap_or_default();
    tokio::time::sleep(until_due).await;
    let mut daemon =
        DaemonProcess::spawn_polling(support::daemon_command(&config, &llm), &telegram, WAIT).await;

    // The due times, the user messages, the notice and the old fire each post; the
    // auto-chat batch is an auto-chat turn (its answer is not posted). Once all of them have,
    // a mention is sent: it is answered after anything the start queued twice.
    let mut expected: Vec<String> = (0..TASKS).map(|i| format!("due-{i}")).collect();
    expected.extend(["ping-1", "ping-2", "notice-1", "fire-0"].map(String::from));
    let all_posted = posts_with(&telegram, &expected).await;
    assert!(all_posted.is_ok(), "{}", daemon.log());
    telegram
        .group_message(TEAM, support::alice(), "@parlor_bot sentinel")
        .mention_bot()
        .push();
    let sentinel = posts_with(&telegram, &["sentinel".to_owned()]).await;
    let exit = daemon.terminate(WAIT).await;
    let log = daemon.log();
    let sent = sentinel.unwrap_or_else(|_| panic!("no answer to the sentinel\n{log}"));
    assert!(exit.success(), "{log}");

    // How often each marker reached the model, and was posted.
    let mut asked: BTreeMap<String, usize> = BTreeMap::new();
    for request in llm.requests() {
        for m in markers(&request.last_user_text().unwrap_or_default()) {
            *asked.entry(m).or_default() += 1;
        }
    }
    let mut posted: BTreeMap<String, usize> = BTreeMap::new();
    for s in &sent {
        for m in markers(&s.text) {
            *posted.entry(m).or_default() += 1;
        }
    }
    for m in &expected {
        assert_eq!(asked.get(m), Some(&1), "{m} asked: {asked:?}\n{log}");
        assert_eq!(posted.get(m), Some(&1), "{m} posted: {posted:?}\n{log}");
    }
    for m in ["chatter-1", "chatter-2"] {
        assert_eq!(asked.get(m), Some(&1), "{m} asked: {asked:?}\n{log}");
        assert_eq!(
            posted.get(m),
            None,
            "an auto-chat turn posts nothing: {posted:?}"
        );
    }
    let store =
        SledStore::open(&dir.path().join("data").join("db"), StoreOptions::default()).unwrap();
    assert!(store.pending().unwrap().is_empty(), "{log}");
    assert!(store.unsent_outbox().unwrap().is_empty(), "{log}");
}
