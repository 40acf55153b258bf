//! The group's memory through `parlor run` and a fake Telegram: an entry keeps the member
//! and the message it came from, `/memory` shows it, a member sees and forgets what came
//! from them, only a chat admin forgets someone else's, and a DM's memory never shows in a
//! group.

use parlor_testkit::{FakeEmbeddings, FakeLlm, FakeTelegram, Reply, ToolCallSpec};

use crate::support::{self, WAIT, alice, bob, zed};

const GROUP: i64 = -100_888;

/// `who` says `text` in the group; the message threaded to it.
async fn say(telegram: &FakeTelegram, who: parlor_testkit::TgUser, text: &str) -> String {
    support::say_in(telegram, GROUP, who, text).await
}

/// The model saves `key` = `content`, then answers "Saved.".
fn saves(llm: &FakeLlm, key: &str, content: &str) {
    llm.push(Reply::tool_calls(vec![ToolCallSpec::new(
        "m1",
        "memory_write",
        serde_json::json!({"key": key, "content": content}),
    )]));
    llm.push(Reply::text("Saved."));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_keep_their_source_and_members_see_and_forget_what_came_from_them() {
    let llm = FakeLlm::start().await;
    let (telegram, _dir, _config, daemon) = support::telegram_bot(
        &llm,
        GROUP,
        &[1001],
        "commands_per_member_per_minute = 20\n",
    )
    .await;

    saves(&llm, "bob.birthday", "Bob's birthday is May 3rd");
    let saved = say(
        &telegram,
        bob(),
        "@parlor_bot my birthday is May 3rd, remember it",
    )
    .await;
    assert_eq!(saved, "Saved.");
    let result = llm.requests()[1].messages().last().unwrap()["content"].to_string();
    assert!(result.contains("\\\"unconfirmed\\\":false"), "{result}");
    // The model's own reading is kept, and marked.
    saves(&llm, "bob.cake", "Bob loves chocolate cake");
    say(&telegram, bob(), "@parlor_bot what do you think I like?").await;
    // A DM's memory stays in the DM.
    saves(&llm, "bob.secret", "Bob's locker code is 4711");
    let dm = telegram
        .private_message(bob(), "my locker code is 4711")
        .push();
    telegram
        .wait_for_sent_where(WAIT, |m| m.reply_to_message_id == Some(dm))
        .await
        .unwrap();

    let listed = say(&telegram, zed(), "/memory").await;
    assert!(
        listed.contains("bob.birthday (from Bob): Bob's birthday is May 3rd"),
        "{listed}"
    );
    assert!(
        listed.contains("bob.cake (from Bob, unconfirmed)"),
        "{listed}"
    );
    assert!(!listed.contains("locker"), "a DM's memory: {listed}");
    let refused = say(&telegram, zed(), "/forget bob.cake").await;
    assert!(
        refused.contains("Only an admin of the chat may use /forget"),
        "{refused}"
    );
    let zeds = say(&telegram, zed(), "/forget me").await;
    assert!(zeds.contains("Forgot 0 entries"), "{zeds}");
    let admin = say(&telegram, alice(), "/forget bob.cake").await;
    assert_eq!(admin, "Forgot bob.cake.");
    let mine = say(&telegram, bob(), "/memory me").await;
    assert!(mine.contains("(1 entries)"), "{mine}");
    let status = say(&telegram, zed(), "/status").await;
    assert!(
        status.contains("Memory: 1 entries (0 unconfirmed), 25 characters; search index "),
        "{status}"
    );
    assert!(status.contains(" terms, 1 KB"), "{status}");
    let forgot = say(&telegram, bob(), "/forget me").await;
    assert!(forgot.contains("Forgot 1 entries"), "{forgot}");
    let empty = say(&telegram, zed(), "/memory").await;
    assert_eq!(empty, "I remember nothing in this chat yet.");
    assert_eq!(llm.request_count(), 6, "commands ask no model");
    let mut daemon = daemon;
    let exit = daemon.terminate(WAIT).await;
    assert!(exit.success(), "{}", daemon.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_embeddings_configured_the_model_finds_a_fact_asked_in_other_words() {
    let llm = FakeLlm::start().await;
    let embeddings =
        FakeEmbeddings::start(vec![vec!["car".to_owned(), "automobile".to_owned()]]).await;
    let extra = format!(
        "[toolsets.memory]\nembeddings = \"fake-embed\"\nembeddings_base_url = \"{}\"\n",
        embeddings.base_url()
    );
    let (telegram, _dir, _config, mut daemon) =
        support::telegram_bot(&llm, GROUP, &[1001], &extra).await;

    saves(&llm, "bob.ride", "Bob drives a red car");
    say(
        &telegram,
        bob(),
        "@parlor_bot I drive a red car, remember that",
    )
    .await;
    assert_eq!(embeddings.inputs(), 1, "the entry's vector");

    llm.push(Reply::tool_calls(vec![ToolCallSpec::new(
        "s1",
        "memory_search",
        serde_json::json!({"query": "automobile"}),
    )]));
    llm.push(Reply::text("A red one."));
    let answer = say(
        &telegram,
        zed(),
        "@parlor_bot what automobile does Bob have?",
    )
    .await;
    assert_eq!(answer, "A red one.");
    let requests = llm.requests();
    let result = requests.last().unwrap().messages().last().unwrap()["content"].to_string();
    assert!(result.contains("bob.ride"), "{result}");
    assert!(result.contains("bm25+embeddings"), "{result}");
    let exit = daemon.terminate(WAIT).await;
    assert!(exit.success(), "{}", daemon.log());
}
