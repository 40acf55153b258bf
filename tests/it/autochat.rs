//! Auto-chat through the real binary: in a group named in `[[bot.auto_chat]]`, messages
//! nobody addressed to the bot become one auto-chat turn, whose `send_message` is posted to the
//! fake Telegram once and whose final answer is not; a mention afterwards is answered as
//! usual.

use parlor_bot::store::{SledStore, Store, StoreOptions};
use parlor_testkit::{DaemonProcess, FakeLlm, FakeTelegram, Reply, TgUser, ToolCallSpec};

use crate::support::{self, TOKEN, WAIT, config, daemon_command};

const GROUP: i64 = -100_123;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unaddressed_messages_lead_to_one_send_message_post() {
    let llm = FakeLlm::start().await;
    let telegram = FakeTelegram::start(TOKEN).await;
    let dir = tempfile::tempdir().unwrap();
    let config = config(
        dir.path(),
        &telegram,
        &format!(
            "[[bot.auto_chat]]\nchat = \"telegram:{GROUP}\"\nbatch_messages = 2\n\
             batch_seconds = 600\n"
        ),
    );
    let mut daemon =
        DaemonProcess::spawn_polling(daemon_command(&config, &llm), &telegram, WAIT).await;

    llm.push(Reply::tool_calls(vec![ToolCallSpec::new(
        "c1",
        "send_message",
        serde_json::json!({"text": "How about the ramen place on Main Street?"}),
    )]));
    llm.push(Reply::text("I suggested the ramen place."));
    support::echo(&llm);
    telegram
        .group_message(
            GROUP,
            TgUser::new(1002, "Bob"),
            "where should we eat tonight?",
        )
        .push();
    telegram
        .group_message(GROUP, TgUser::new(1003, "Carol"), "no idea, somewhere warm")
        .push();
    let sent = telegram.wait_for_sent(1, WAIT).await.unwrap();
    assert_eq!(sent[0].chat_id, GROUP);
    assert_eq!(sent[0].text, "How about the ramen place on Main Street?");
    assert_eq!(sent[0].reply_to_message_id, None);

    let first = &llm.requests()[0];
    let input = first.last_user_text().unwrap();
    assert!(input.contains("Overheard in this group"), "{input}");
    assert!(
        input.contains("Bob (telegram:1002): where should we eat tonight?")
            && input.contains("Carol (telegram:1003): no idea, somewhere warm"),
        "{input}"
    );
    let tools = first.tool_names();
    assert!(tools.iter().any(|t| t == "send_message"), "{tools:?}");
    assert!(!tools.iter().any(|t| t == "send_markdown"), "{tools:?}");

    // The mention is answered after the auto-chat turn (one actor per chat), so once its reply
    // is in, the auto-chat turn's final answer would have been too.
    telegram
        .group_message(GROUP, TgUser::new(1001, "Alice"), "@parlor_bot thanks")
        .mention_bot()
        .push();
    let sent = telegram.wait_for_sent(2, WAIT).await.unwrap();
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert_eq!(
        sent[1].text,
        "echo <Alice (telegram:1001): @parlor_bot thanks>"
    );
    assert_eq!(llm.request_count(), 3);

    let exit = daemon.terminate(WAIT).await;
    let log = daemon.log();
    assert!(exit.success(), "{log}");
    assert!(log.contains("auto-chat: the bot speaks up"), "{log}");
    let store =
        SledStore::open(&dir.path().join("data").join("db"), StoreOptions::default()).unwrap();
    assert!(store.pending().unwrap().is_empty());
    assert!(store.unsent_outbox().unwrap().is_empty());
}
