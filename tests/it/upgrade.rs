//! A store written by the landed release (a271e69, `tests/fixtures/store-landed-a271e69`,
//! whose README says what each chat holds) under `parlor run` of this one: its history is
//! migrated to parlor's own form, and every chat goes on where it was left.

use std::path::Path;

use parlor_bot::llm::{Content, ContentPart, Message};
use parlor_bot::store::{SledStore, Store, StoreOptions};
use parlor_bot::testing::copy_dir;
use parlor_testkit::{DaemonProcess, FakeLlm, FakeTelegram};

use crate::support::{self, WAIT};

/// The chats of the fixture: A (two text turns), B (a photo and a tool round trip),
/// C (compacted), D (an input left pending), E (a reply left unsent).
const A: i64 = -100_123;
const B: i64 = -100_456;
const C: i64 = -100_789;
const D: i64 = -100_321;
const E: i64 = -100_654;

fn session(chat: i64) -> String {
    format!("telegram:{chat}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_written_by_the_landed_release_is_migrated_and_its_chats_go_on() {
    let llm = FakeLlm::start().await;
    support::echo(&llm);
    let telegram = FakeTelegram::start(support::TOKEN).await;
    for (chat, name) in [(A, "A"), (B, "B"), (C, "C"), (D, "D"), (E, "E")] {
        telegram.group_chat(chat, name);
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("data").join("db");
    // A copy: opening a store writes to it.
    copy_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/store-landed-a271e69/db"),
        &db,
    );
    let config = support::config(dir.path(), &telegram, "");
    let mut daemon =
        DaemonProcess::spawn_polling(support::daemon_command(&config, &llm), &telegram, WAIT).await;

    // E's reply, left unsent, goes out threaded as it was queued.
    let unsent = telegram
        .wait_for_sent_where(WAIT, |m| {
            m.chat_id == E && m.reply_to_message_id == Some(51)
        })
        .await;
    // D's input, left pending, gets its turn.
    let pending = telegram
        .wait_for_sent_where(WAIT, |m| {
            m.chat_id == D && m.reply_to_message_id == Some(41)
        })
        .await;
    // A mention in B: the model sees B's stored history, tool round trip included.
    let asked = telegram
        .group_message(B, support::alice(), "@parlor_bot what did you remember?")
        .mention_bot()
        .push();
    let answered = telegram
        .wait_for_sent_where(WAIT, |m| {
            m.chat_id == B && m.reply_to_message_id == Some(asked)
        })
        .await;
    let exit = daemon.terminate(WAIT).await;
    let log = daemon.log();
    let sent = unsent.unwrap_or_else(|_| panic!("E's unsent reply never went out\n{log}"));
    assert!(
        sent.iter().any(|m| m.chat_id == E
            && m.text == "reply: carol (telegram:carol): @parlor send this later"),
        "{sent:?}"
    );
    let sent = pending.unwrap_or_else(|_| panic!("D's pending input never ran\n{log}"));
    assert!(
        sent.iter().any(|m| m.chat_id == D
            && m.text == "echo <dave (telegram:dave): @parlor are you still there?>"),
        "{sent:?}"
    );
    answered.unwrap_or_else(|_| panic!("no answer in B\n{log}"));
    assert!(exit.success(), "{log}");
    assert!(
        log.contains("history migrated to parlor's own form"),
        "{log}"
    );

    let request = llm
        .requests()
        .into_iter()
        .find(|r| {
            r.last_user_text()
                .is_some_and(|t| t.contains("what did you remember?"))
        })
        .unwrap_or_else(|| panic!("B's mention never reached the model\n{log}"));
    let messages = request.messages();
    let call = messages
        .iter()
        .find(|m| m["role"] == "assistant" && m["tool_calls"].is_array())
        .unwrap_or_else(|| panic!("no stored tool call in {messages:?}"));
    assert_eq!(call["tool_calls"][0]["id"], "call_b1");
    assert_eq!(call["tool_calls"][0]["function"]["name"], "remember");
    assert!(
        messages
            .iter()
            .any(|m| m["role"] == "tool" && m["tool_call_id"] == "call_b1"),
        "{messages:?}"
    );

    // The store is at the new schema, and each chat's history went on from where it was.
    let store = SledStore::open(&db, StoreOptions::default()).unwrap();
    assert_eq!(
        store.get_meta("schema.history").unwrap().as_deref(),
        Some("2")
    );
    let b = store.load_history(&session(B)).unwrap();
    assert_eq!(b.len(), 6, "{b:?}");
    let Message::User {
        content: Content::Parts(parts),
    } = &b[0]
    else {
        panic!("B's first message lost its image: {:?}", b[0]);
    };
    assert!(
        parts.iter().any(|p| matches!(p,
            ContentPart::ImageRef { image, message_id }
                if image.file_id == "photo-file-1" && message_id.as_deref() == Some("21"))),
        "{parts:?}"
    );
    assert!(
        matches!(&b[1], Message::Assistant { tool_calls, content: None, model: None, .. }
            if tool_calls[0].function.name == "remember"),
        "{:?}",
        b[1]
    );
    assert!(
        matches!(&b[5], Message::Assistant { model: Some(_), .. }),
        "the new answer names its model: {:?}",
        b[5]
    );
    assert_eq!(store.load_history(&session(A)).unwrap().len(), 4);
    assert_eq!(store.load_history(&session(C)).unwrap().len(), 2);
    assert_eq!(
        store.load_summary(&session(C)).unwrap().map(|s| s.messages),
        Some(4)
    );
    assert_eq!(store.load_history(&session(D)).unwrap().len(), 2);
    assert!(store.pending().unwrap().is_empty());
    assert!(store.unsent_outbox().unwrap().is_empty());
}
