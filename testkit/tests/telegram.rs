//! Black-box tests of `FakeTelegram`: plain reqwest against the wire
//! protocol, and the real teloxide client.

// A failed unwrap in a test is the test failing.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use futures::StreamExt;
use parlor_testkit::{Failure, FakeTelegram, TgUser, teloxide_fixture, utf16_len};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

mod support;
use support::{WAIT, client};

const TOKEN: &str = "123456:TEST-token";
const GROUP: i64 = -1_001_234_567_890;

fn alice() -> TgUser {
    TgUser::new(1001, "Alice").username("alice")
}

/// POSTs a JSON body to `method`; returns the status and the parsed body.
async fn api(fake: &FakeTelegram, method: &str, body: Value) -> (u16, Value) {
    let resp = client()
        .post(format!("{}/bot{TOKEN}/{method}", fake.api_url()))
        .json(&body)
        .send()
        .await
        .expect("request to fake telegram");
    let status = resp.status().as_u16();
    (status, resp.json().await.expect("JSON answer"))
}

/// GETs `path` (under the API URL) without parameters.
async fn get(fake: &FakeTelegram, path: &str) -> reqwest::Response {
    client()
        .get(format!("{}{path}", fake.api_url()))
        .send()
        .await
        .expect("request to fake telegram")
}

/// POSTs an urlencoded `form` to `method`.
async fn post_form(fake: &FakeTelegram, method: &str, form: String) -> reqwest::Response {
    client()
        .post(format!("{}/bot{TOKEN}/{method}", fake.api_url()))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form)
        .send()
        .await
        .expect("request to fake telegram")
}

async fn ok_result(fake: &FakeTelegram, method: &str, body: Value) -> Value {
    let (status, answer) = api(fake, method, body).await;
    assert_eq!(status, 200, "{method}: {answer}");
    assert_eq!(answer["ok"], json!(true), "{method}: {answer}");
    answer["result"].clone()
}

/// Starts a 30 s `getUpdates` long poll on a task, and returns once the fake
/// has it; the task ends with the poll's status and answer.
async fn long_poll(fake: &FakeTelegram) -> JoinHandle<(u16, Value)> {
    let url = format!("{}/bot{TOKEN}/getUpdates", fake.api_url());
    let polls = fake.calls("getUpdates");
    let poll = tokio::spawn(async move {
        let resp = client()
            .post(url)
            .json(&json!({"timeout": 30}))
            .send()
            .await
            .unwrap();
        (resp.status().as_u16(), resp.json::<Value>().await.unwrap())
    });
    fake.wait_for_calls("getUpdates", polls + 1, WAIT)
        .await
        .unwrap();
    poll
}

fn update_ids(updates: &Value) -> Vec<i64> {
    updates
        .as_array()
        .expect("updates array")
        .iter()
        .map(|u| u["update_id"].as_i64().expect("update_id"))
        .collect()
}

// ---------------------------------------------------------------------------
// Plain HTTP
// ---------------------------------------------------------------------------

#[tokio::test]
async fn get_me_token_check_and_unknown_methods() {
    let fake = FakeTelegram::start(TOKEN).await;
    assert!(fake.api_url().starts_with("http://127.0.0.1:"));

    let me = ok_result(&fake, "getMe", json!({})).await;
    assert_eq!(me["id"], json!(4242));
    assert_eq!(me["username"], json!("parlor_bot"));
    assert_eq!(me["first_name"], json!("parlor"));
    assert_eq!(me["is_bot"], json!(true));
    assert_eq!(me["can_join_groups"], json!(true));
    assert_eq!(me["can_read_all_group_messages"], json!(true));
    assert_eq!(me["supports_inline_queries"], json!(false));

    // Method names are case-insensitive; GET without a body works too.
    let resp = get(&fake, &format!("/bot{TOKEN}/GETME")).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(fake.calls("getme"), 2);

    let resp = client()
        .post(format!("{}/botWRONG/getMe", fake.api_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    assert_eq!(
        resp.json::<Value>().await.unwrap(),
        json!({"ok": false, "error_code": 401, "description": "Unauthorized"})
    );

    let (status, body) = api(&fake, "sendSticker", json!({"chat_id": 1})).await;
    assert_eq!(status, 404);
    assert_eq!(body["description"], json!("Not Found: method not found"));
    assert_eq!(fake.unknown_methods(), vec!["sendSticker".to_owned()]);
    assert_eq!(fake.calls("sendsticker"), 1);

    let resp = get(&fake, "/nothing/here").await;
    assert_eq!(resp.status(), 404);
}

#[tokio::test]
async fn long_poll_wakes_when_an_update_is_pushed() {
    let fake = FakeTelegram::start(TOKEN).await;
    let started = Instant::now();
    let poll = long_poll(&fake).await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(!poll.is_finished(), "the poll must wait for an update");

    let message_id = fake.group_message(GROUP, alice(), "hello").push();
    let (_, answer) = tokio::time::timeout(Duration::from_secs(2), poll)
        .await
        .expect("the poll wakes on push")
        .unwrap();
    let elapsed = started.elapsed();
    assert!(elapsed < Duration::from_secs(1), "woke after {elapsed:?}");
    let updates = answer["result"].as_array().unwrap();
    assert_eq!(updates.len(), 1);
    assert_eq!(updates[0]["message"]["message_id"], json!(message_id));
    assert_eq!(updates[0]["message"]["text"], json!("hello"));
    assert_eq!(fake.get_updates_calls()[0].timeout, Some(30));
}

#[tokio::test]
async fn long_poll_without_updates_times_out_empty() {
    let fake = FakeTelegram::start(TOKEN).await;
    let started = Instant::now();
    let updates = ok_result(&fake, "getUpdates", json!({"timeout": 1})).await;
    assert_eq!(updates, json!([]));
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(900), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(3), "{elapsed:?}");
}

#[tokio::test]
async fn offsets_acknowledge_and_unacknowledged_updates_are_redelivered() {
    let fake = FakeTelegram::start(TOKEN).await;
    let a = fake.push_update(json!({"message": {
        "message_id": 1, "date": 1, "text": "a",
        "chat": {"id": 7, "type": "private", "first_name": "X"},
    }}));
    let b = fake.group_message(GROUP, alice(), "b").push();
    let c = fake.push_update(json!({"update_id": 500_000, "message": {
        "message_id": 3, "date": 1, "text": "c",
        "chat": {"id": 7, "type": "private", "first_name": "X"},
    }}));
    assert_eq!(c, 500_000);
    let ids = update_ids(&ok_result(&fake, "getUpdates", json!({})).await);
    assert_eq!(ids.len(), 3);
    assert_eq!(ids[0], a);
    assert!(ids[0] < ids[1] && ids[1] < ids[2]);
    let b_update = ids[1];
    let _ = b;

    // Another client calling without offset sees the same updates.
    let again = update_ids(&ok_result(&fake, "getUpdates", json!({"timeout": 0})).await);
    assert_eq!(again, ids);
    assert_eq!(fake.acked_offset(), None);

    // Acknowledge the first one; offsets arrive as numbers or strings.
    let rest = update_ids(&ok_result(&fake, "getUpdates", json!({"offset": b_update})).await);
    assert_eq!(rest, vec![b_update, c]);
    assert_eq!(fake.acked_offset(), Some(b_update));
    assert_eq!(update_ids(&Value::Array(fake.pending_updates())), rest);

    // A restarted client (no offset) gets only the unacknowledged ones.
    let fresh = update_ids(&ok_result(&fake, "getUpdates", json!({"limit": 1})).await);
    assert_eq!(fresh, vec![b_update]);

    // Form-encoded offset acknowledges everything.
    let resp = post_form(&fake, "getUpdates", format!("offset={}&timeout=0", c + 1)).await;
    assert_eq!(resp.json::<Value>().await.unwrap()["result"], json!([]));
    assert!(fake.pending_updates().is_empty());
    fake.wait_for_ack(c, WAIT).await.unwrap();
    let offsets: Vec<Option<i64>> = fake.get_updates_calls().iter().map(|c| c.offset).collect();
    assert_eq!(offsets, vec![None, None, Some(b_update), None, Some(c + 1)]);

    // New updates continue above every id seen.
    let d = fake.push_update(json!({"message": {
        "message_id": 4, "date": 1, "text": "d",
        "chat": {"id": 7, "type": "private", "first_name": "X"},
    }}));
    assert!(d > c);
    // A negative offset keeps only the last N.
    fake.push_update(json!({"message": {
        "message_id": 5, "date": 1, "text": "e",
        "chat": {"id": 7, "type": "private", "first_name": "X"},
    }}));
    let last = update_ids(&ok_result(&fake, "getUpdates", json!({"offset": -1})).await);
    assert_eq!(last, vec![d + 1]);
}

#[tokio::test]
async fn allowed_updates_filters_like_telegram() {
    let fake = FakeTelegram::start(TOKEN).await;
    let reaction = teloxide_fixture("update.message_reaction_updated.L897.json").unwrap();
    let mut reaction_without_id = reaction.clone();
    reaction_without_id
        .as_object_mut()
        .unwrap()
        .remove("update_id");

    // By default message_reaction updates are never created.
    fake.push_update(reaction_without_id.clone());
    assert!(fake.pending_updates().is_empty());
    assert_eq!(fake.filtered_updates().len(), 1);

    ok_result(
        &fake,
        "getUpdates",
        json!({"allowed_updates": ["message", "message_reaction"]}),
    )
    .await;
    assert_eq!(
        fake.get_updates_calls()[0].allowed_updates,
        Some(vec!["message".to_owned(), "message_reaction".to_owned()])
    );
    fake.push_update(reaction_without_id);
    let updates = ok_result(&fake, "getUpdates", json!({})).await;
    assert_eq!(updates[0]["message_reaction"], reaction["message_reaction"]);
}

#[tokio::test]
async fn a_new_poll_ends_a_waiting_one_with_409() {
    let fake = FakeTelegram::start(TOKEN).await;
    let first = long_poll(&fake).await;
    let second = ok_result(&fake, "getUpdates", json!({"timeout": 0})).await;
    assert_eq!(second, json!([]));
    let (status, body) = tokio::time::timeout(WAIT, first).await.unwrap().unwrap();
    assert_eq!(status, 409);
    assert!(
        body["description"]
            .as_str()
            .unwrap()
            .starts_with("Conflict: terminated by other getUpdates request")
    );
}

#[tokio::test]
async fn group_message_builder_produces_telegram_shaped_json() {
    let fake = FakeTelegram::start(TOKEN).await;
    let first = fake.group_message(GROUP, alice(), "hi").push();

    // Mention entity offsets count UTF-16 units: "👋 é " is 5 units.
    let mentioned = fake
        .group_message(GROUP, alice(), "👋 é @parlor_bot what's up")
        .mention_bot()
        .push();
    assert_eq!(
        mentioned,
        first + 1,
        "message ids are per chat and increasing"
    );
    let msg = fake.message(GROUP, mentioned).unwrap();
    assert_eq!(
        msg["chat"],
        json!({"id": GROUP, "type": "supergroup", "title": format!("group {GROUP}")})
    );
    assert_eq!(
        msg["from"],
        json!({"id": 1001, "is_bot": false, "first_name": "Alice", "username": "alice"})
    );
    assert!(msg["date"].as_i64().unwrap() > 1_700_000_000);
    assert_eq!(
        msg["entities"],
        json!([{"type": "mention", "offset": utf16_len("👋 é "), "length": 11}])
    );
    assert_eq!(utf16_len("👋 é "), 5);

    // Without the mention in the text it is prepended.
    let id = fake
        .group_message(GROUP, alice(), "ping")
        .mention_bot()
        .push();
    let msg = fake.message(GROUP, id).unwrap();
    assert_eq!(msg["text"], json!("@parlor_bot ping"));
    assert_eq!(msg["entities"][0]["offset"], json!(0));

    // Commands.
    let id = fake
        .group_message(GROUP, alice(), "")
        .command("/reset@parlor_bot")
        .push();
    let msg = fake.message(GROUP, id).unwrap();
    assert_eq!(msg["text"], json!("/reset@parlor_bot"));
    assert_eq!(
        msg["entities"],
        json!([{"type": "bot_command", "offset": 0, "length": 17}])
    );

    // A reply to a known message embeds it (without its own reply) and gets
    // the reply thread id, as in real supergroups.
    let reply = fake
        .group_message(GROUP, TgUser::new(1002, "Bob"), "agreed")
        .reply_to(mentioned, false)
        .push();
    let msg = fake.message(GROUP, reply).unwrap();
    assert_eq!(msg["reply_to_message"]["message_id"], json!(mentioned));
    assert_eq!(
        msg["reply_to_message"]["text"],
        json!("👋 é @parlor_bot what's up")
    );
    assert_eq!(msg["message_thread_id"], json!(mentioned));
    assert!(msg.get("is_topic_message").is_none());

    // A reply to an unknown bot message is synthesized.
    let id = fake
        .group_message(GROUP, alice(), "yes")
        .reply_to(999, true)
        .push();
    let msg = fake.message(GROUP, id).unwrap();
    assert_eq!(msg["reply_to_message"]["from"]["id"], json!(4242));
    assert_eq!(msg["reply_to_message"]["from"]["is_bot"], json!(true));

    // Forum topics.
    let forum = -1_009_999;
    let in_topic = fake
        .group_message(forum, alice(), "in topic")
        .topic(77)
        .push();
    let msg = fake.message(forum, in_topic).unwrap();
    assert_eq!(msg["message_thread_id"], json!(77));
    assert_eq!(msg["is_topic_message"], json!(true));
    assert_eq!(msg["chat"]["is_forum"], json!(true));
    assert_eq!(msg["reply_to_message"]["message_id"], json!(77));
    assert!(msg["reply_to_message"]["forum_topic_created"].is_object());
    assert!(in_topic > 77);

    // Photo with caption.
    let id = fake
        .group_message(GROUP, alice(), "look")
        .mention_bot()
        .photo("PHOTO1", 4096)
        .push();
    let msg = fake.message(GROUP, id).unwrap();
    assert!(msg.get("text").is_none());
    assert_eq!(msg["caption"], json!("@parlor_bot look"));
    assert_eq!(msg["caption_entities"][0]["type"], json!("mention"));
    let photo = msg["photo"].as_array().unwrap();
    assert_eq!(photo.last().unwrap()["file_id"], json!("PHOTO1"));
    assert_eq!(photo.last().unwrap()["file_size"], json!(4096));

    // Other bots; private chats.
    let id = fake.group_message(GROUP, alice(), "beep").from_bot().push();
    assert_eq!(
        fake.message(GROUP, id).unwrap()["from"]["is_bot"],
        json!(true)
    );
    let id = fake.private_message(alice(), "hello there").push();
    assert_eq!(id, 1);
    assert_eq!(
        fake.message(1001, id).unwrap()["chat"],
        json!({"id": 1001, "type": "private", "first_name": "Alice", "username": "alice"})
    );
}

#[tokio::test]
async fn send_message_is_recorded_and_answered_with_a_message() {
    let fake = FakeTelegram::start(TOKEN).await;
    let asked = fake.group_message(GROUP, alice(), "question").push();

    let sent = ok_result(
        &fake,
        "sendMessage",
        json!({
            "chat_id": GROUP,
            "text": "answer",
            "reply_parameters": {"message_id": asked},
            "reply_markup": {"inline_keyboard": [[{"text": "x", "callback_data": "y"}]]},
        }),
    )
    .await;
    assert_eq!(sent["message_id"], json!(asked + 1));
    assert_eq!(sent["from"]["id"], json!(4242));
    assert_eq!(sent["chat"]["id"], json!(GROUP));
    assert_eq!(sent["text"], json!("answer"));
    assert_eq!(sent["reply_to_message"]["message_id"], json!(asked));

    let records = fake.wait_for_sent(1, WAIT).await.unwrap();
    let record = &records[0];
    assert_eq!(record.chat_id, GROUP);
    assert_eq!(record.text, "answer");
    assert_eq!(record.reply_to_message_id, Some(asked));
    assert_eq!(record.message_id, asked + 1);
    assert_eq!(record.thread_id, None);
    assert!(record.reply_markup.is_some());

    // Form-encoded, with the legacy reply parameter and a JSON string param.
    let form = format!(
        "chat_id={GROUP}&text=two+words%21&reply_parameters=%7B%22message_id%22%3A{asked}%7D"
    );
    let resp = post_form(&fake, "sendMessage", form).await;
    assert_eq!(resp.status(), 200);
    // Query parameters.
    let resp = get(
        &fake,
        &format!("/bot{TOKEN}/sendMessage?chat_id={GROUP}&text=q"),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let all = fake.sent_messages();
    assert_eq!(all[1].text, "two words!");
    assert_eq!(all[1].reply_to_message_id, Some(asked));
    assert_eq!(all[2].text, "q");

    // The bot's messages can be replied to and threaded.
    let reply = fake
        .group_message(GROUP, alice(), "thanks")
        .reply_to(record.message_id, true)
        .push();
    let msg = fake.message(GROUP, reply).unwrap();
    assert_eq!(msg["reply_to_message"]["from"]["id"], json!(4242));
    assert_eq!(msg["reply_to_message"]["text"], json!("answer"));

    // Errors modelled on Telegram's.
    let cases = [
        (
            json!({"chat_id": -42, "text": "x"}),
            400,
            "Bad Request: chat not found",
        ),
        (
            json!({"chat_id": 42, "text": "x"}),
            403,
            "Forbidden: bot can't initiate conversation with a user",
        ),
        (
            json!({"chat_id": GROUP, "text": ""}),
            400,
            "Bad Request: message text is empty",
        ),
        (
            json!({"chat_id": GROUP, "text": "x", "reply_parameters": {"message_id": 9999}}),
            400,
            "Bad Request: message to be replied not found",
        ),
        (
            json!({"chat_id": GROUP, "text": "x", "message_thread_id": asked}),
            400,
            "Bad Request: message thread not found",
        ),
        (
            json!({"chat_id": GROUP, "text": "x".repeat(4097)}),
            400,
            "Bad Request: message is too long",
        ),
        (
            json!({"chat_id": GROUP, "text": "<b>bold", "parse_mode": "HTML"}),
            400,
            "Bad Request: can't parse entities: Can't find end tag corresponding to start tag \"b\"",
        ),
    ];
    for (body, status, description) in cases {
        let (got_status, got) = api(&fake, "sendMessage", body.clone()).await;
        assert_eq!(
            (got_status, got["description"].as_str()),
            (status, Some(description)),
            "{body}"
        );
        assert_eq!(got["ok"], json!(false));
        assert_eq!(got["error_code"], json!(status));
    }
    let lenient = ok_result(
        &fake,
        "sendMessage",
        json!({"chat_id": GROUP, "text": "x",
               "reply_parameters": {"message_id": 9999, "allow_sending_without_reply": true}}),
    )
    .await;
    assert!(lenient.get("reply_to_message").is_none());

    // HTML is parsed into plain text plus entities; 4096 UTF-16 units after
    // parsing is fine.
    let html = ok_result(
        &fake,
        "sendMessage",
        json!({"chat_id": GROUP, "parse_mode": "HTML",
               "text": format!("<b>{}</b>&amp;", "é".repeat(4095))}),
    )
    .await;
    assert_eq!(utf16_len(html["text"].as_str().unwrap()), 4096);
    assert_eq!(
        html["entities"],
        json!([{"type": "bold", "offset": 0, "length": 4095}])
    );
    assert_eq!(
        fake.sent_messages().last().unwrap().parse_mode.as_deref(),
        Some("HTML")
    );

    // Forum topics accept their thread id.
    fake.forum_topic(GROUP, 5000);
    let topic = ok_result(
        &fake,
        "sendMessage",
        json!({"chat_id": GROUP, "text": "in topic", "message_thread_id": 5000}),
    )
    .await;
    assert_eq!(topic["message_thread_id"], json!(5000));
    assert_eq!(topic["is_topic_message"], json!(true));
    assert_eq!(fake.sent_messages().last().unwrap().thread_id, Some(5000));
}

#[tokio::test]
async fn chat_actions_admins_edits_and_commands() {
    let fake = FakeTelegram::start(TOKEN).await;
    fake.group_chat(GROUP, "Parlor HQ");
    fake.private_message(alice(), "hi").push();

    ok_result(
        &fake,
        "sendChatAction",
        json!({"chat_id": GROUP, "action": "typing"}),
    )
    .await;
    let (status, body) = api(
        &fake,
        "sendChatAction",
        json!({"chat_id": GROUP, "action": "dance"}),
    )
    .await;
    assert_eq!(
        (status, body["description"].as_str()),
        (400, Some("Bad Request: wrong parameter action in request"))
    );
    assert_eq!(fake.chat_actions().len(), 1);
    assert_eq!(fake.chat_actions()[0].action, "typing");
    assert_eq!(fake.chat_actions()[0].chat_id, GROUP);

    fake.set_admins(GROUP, vec![1001, 4242]);
    let admins = ok_result(&fake, "getChatAdministrators", json!({"chat_id": GROUP})).await;
    assert_eq!(admins[0]["status"], json!("creator"));
    assert_eq!(admins[0]["user"]["username"], json!("alice"));
    assert_eq!(admins[1]["status"], json!("administrator"));
    assert_eq!(admins[1]["user"]["is_bot"], json!(true));
    let member = ok_result(
        &fake,
        "getChatMember",
        json!({"chat_id": GROUP, "user_id": 5}),
    )
    .await;
    assert_eq!(member["status"], json!("left"));
    let (status, _) = api(&fake, "getChatAdministrators", json!({"chat_id": 1001})).await;
    assert_eq!(status, 400);

    let sent = ok_result(
        &fake,
        "sendMessage",
        json!({"chat_id": 1001, "text": "draft"}),
    )
    .await;
    let id = sent["message_id"].as_i64().unwrap();
    let edited = ok_result(
        &fake,
        "editMessageText",
        json!({"chat_id": 1001, "message_id": id, "text": "final"}),
    )
    .await;
    assert_eq!(edited["text"], json!("final"));
    assert!(edited["edit_date"].is_i64());
    let (status, body) = api(
        &fake,
        "editMessageText",
        json!({"chat_id": 1001, "message_id": id, "text": "final"}),
    )
    .await;
    assert_eq!(status, 400);
    assert!(
        body["description"]
            .as_str()
            .unwrap()
            .starts_with("Bad Request: message is not modified")
    );
    assert_eq!(fake.edits().len(), 1);
    assert_eq!(fake.message(1001, id).unwrap()["text"], json!("final"));

    let commands = json!([{"command": "reset", "description": "Forget the conversation"}]);
    assert_eq!(
        ok_result(&fake, "setMyCommands", json!({"commands": commands})).await,
        json!(true)
    );
    assert_eq!(fake.my_commands(), commands);
    assert_eq!(
        ok_result(&fake, "deleteWebhook", json!({})).await,
        json!(true)
    );
}

#[tokio::test]
async fn scripted_failures_are_consumed_fifo_per_method() {
    let fake = FakeTelegram::start(TOKEN).await;
    fake.group_chat(GROUP, "g");
    fake.fail_next("sendMessage", Failure::RetryAfter(3));
    fake.fail_next("SENDMESSAGE", Failure::BadRequest("chat not found".into()));
    fake.fail_next("getUpdates", Failure::Conflict);
    fake.fail_next("getMe", Failure::Status(502, "Bad Gateway".into()));
    fake.fail_next("getMe", Failure::MigrateToChatId(-100_777));
    assert_eq!(fake.pending_failures("sendmessage"), 2);

    let body = json!({"chat_id": GROUP, "text": "x"});
    let (status, answer) = api(&fake, "sendMessage", body.clone()).await;
    assert_eq!(status, 429);
    assert_eq!(
        answer,
        json!({"ok": false, "error_code": 429,
               "description": "Too Many Requests: retry after 3",
               "parameters": {"retry_after": 3}})
    );
    let (status, answer) = api(&fake, "sendMessage", body.clone()).await;
    assert_eq!(
        (status, answer["description"].as_str()),
        (400, Some("Bad Request: chat not found"))
    );
    ok_result(&fake, "sendMessage", body).await;
    assert_eq!(
        fake.sent_messages().len(),
        1,
        "failed sends are not recorded as sent"
    );
    assert_eq!(fake.calls("sendMessage"), 3);

    fake.group_message(GROUP, alice(), "x").push();
    let (status, answer) = api(&fake, "getUpdates", json!({"offset": 999_999_999})).await;
    assert_eq!(status, 409);
    assert_eq!(
        answer["description"],
        json!(
            "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running"
        )
    );
    assert_eq!(
        fake.pending_updates().len(),
        1,
        "a failed poll acknowledges nothing"
    );
    assert_eq!(fake.acked_offset(), None);

    let (status, answer) = api(&fake, "getMe", json!({})).await;
    assert_eq!(
        (status, answer["description"].as_str()),
        (502, Some("Bad Gateway"))
    );
    let (status, answer) = api(&fake, "getMe", json!({})).await;
    assert_eq!(status, 400);
    assert_eq!(
        answer["parameters"],
        json!({"migrate_to_chat_id": -100_777})
    );
    ok_result(&fake, "getMe", json!({})).await;
}

#[tokio::test]
async fn get_file_and_download() {
    let fake = FakeTelegram::start(TOKEN).await;
    let bytes: Vec<u8> = (0..=255).collect();
    let path = fake.add_file("FILE1", bytes.clone());
    let file = ok_result(&fake, "getFile", json!({"file_id": "FILE1"})).await;
    assert_eq!(file["file_id"], json!("FILE1"));
    assert_eq!(file["file_size"], json!(256));
    assert_eq!(file["file_path"], json!(path));
    assert!(
        file["file_unique_id"]
            .as_str()
            .is_some_and(|u| !u.is_empty())
    );

    for url_path in [path.clone(), path.replace('/', "%2F")] {
        let resp = get(&fake, &format!("/file/bot{TOKEN}/{url_path}")).await;
        assert_eq!(resp.status(), 200, "{url_path}");
        assert_eq!(resp.bytes().await.unwrap().to_vec(), bytes);
    }
    assert_eq!(fake.downloads(), vec![path.clone(), path.clone()]);

    let (status, answer) = api(&fake, "getFile", json!({"file_id": "nope"})).await;
    assert_eq!(
        (status, answer["description"].as_str()),
        (400, Some("Bad Request: invalid file_id"))
    );
    let resp = get(&fake, &format!("/file/bot{TOKEN}/documents/nope")).await;
    assert_eq!(resp.status(), 404);
    let resp = get(&fake, &format!("/file/botWRONG/{path}")).await;
    assert_eq!(resp.status(), 401);
}

#[tokio::test]
async fn waits_time_out_and_shutdown_ends_long_polls() {
    let fake = FakeTelegram::start(TOKEN).await;
    let err = fake
        .wait_for_sent(1, Duration::from_millis(50))
        .await
        .unwrap_err();
    assert_eq!(err.seen, "0");
    assert!(err.to_string().contains("1 sent message(s)"));

    let poll = long_poll(&fake).await;
    fake.shutdown().await;
    let answer = tokio::time::timeout(WAIT, poll).await.unwrap().unwrap();
    assert_eq!(answer, (200, json!({"ok": true, "result": []})));
}

// ---------------------------------------------------------------------------
// The real teloxide client
// ---------------------------------------------------------------------------

mod with_teloxide {
    use super::*;
    use teloxide::ApiError;
    use teloxide::RequestError;
    use teloxide::net::Download;
    use teloxide::prelude::*;
    use teloxide::types::{
        ChatMemberKind, FileId, MessageEntityKind, MessageId, ReplyParameters, UpdateKind,
    };
    use teloxide::update_listeners::{AsUpdateStream, Polling, UpdateListener};

    fn bot(fake: &FakeTelegram) -> Bot {
        Bot::new(TOKEN).set_api_url(reqwest::Url::parse(&fake.api_url()).expect("api url"))
    }

    #[tokio::test]
    async fn teloxide_talks_to_the_fake() {
        let fake = FakeTelegram::start(TOKEN).await;
        let bot = bot(&fake);

        let me = bot.get_me().await.expect("getMe");
        assert_eq!(me.id, UserId(4242));
        assert_eq!(me.username(), "parlor_bot");
        assert!(me.can_read_all_group_messages);
        assert!(!me.supports_inline_queries);

        // A forum-topic message that mentions the bot and replies to it.
        let earlier = fake.group_message(GROUP, alice(), "old").topic(3).push();
        let first_update = fake.pending_updates()[0]["update_id"].as_i64().unwrap();
        let bot_msg = ok_result(
            &fake,
            "sendMessage",
            json!({"chat_id": GROUP, "text": "bot said", "message_thread_id": 3}),
        )
        .await["message_id"]
            .as_i64()
            .unwrap();
        let asked = fake
            .group_message(GROUP, alice(), "é 👋 @parlor_bot help")
            .mention_bot()
            .reply_to(bot_msg, true)
            .topic(3)
            .push();

        let offset = i32::try_from(first_update + 1).unwrap();
        let updates = bot
            .get_updates()
            .offset(offset)
            .timeout(1)
            .await
            .expect("getUpdates");
        assert_eq!(updates.len(), 1);
        assert_eq!(fake.acked_offset(), Some(first_update + 1));
        let UpdateKind::Message(msg) = &updates[0].kind else {
            panic!("not a message: {:?}", updates[0].kind);
        };
        assert_eq!(msg.id, MessageId(i32::try_from(asked).unwrap()));
        assert_eq!(msg.chat.id, ChatId(GROUP));
        assert!(msg.chat.is_supergroup());
        assert_eq!(msg.text(), Some("é 👋 @parlor_bot help"));
        assert_eq!(msg.from.as_ref().map(|u| u.id), Some(UserId(1001)));
        assert!(msg.is_topic_message);
        assert_eq!(msg.thread_id.map(|t| t.0), Some(MessageId(3)));
        let entities = msg.parse_entities().expect("entities");
        assert_eq!(entities.len(), 1);
        assert_eq!(*entities[0].kind(), MessageEntityKind::Mention);
        assert_eq!(entities[0].text(), "@parlor_bot");
        let replied = msg.reply_to_message().expect("reply_to_message");
        assert_eq!(replied.id, MessageId(i32::try_from(bot_msg).unwrap()));
        assert_eq!(replied.from.as_ref().map(|u| u.id), Some(UserId(4242)));
        assert_eq!(replied.text(), Some("bot said"));
        let _ = earlier;

        // Replying.
        let sent = bot
            .send_message(ChatId(GROUP), "hi")
            .reply_parameters(ReplyParameters::new(msg.id))
            .message_thread_id(msg.thread_id.unwrap())
            .await
            .expect("sendMessage");
        assert_eq!(sent.text(), Some("hi"));
        assert_eq!(sent.chat.id, ChatId(GROUP));
        assert_eq!(sent.reply_to_message().map(|m| m.id), Some(msg.id));
        let record = fake.sent_messages().pop().unwrap();
        assert_eq!(
            record.method, "SendMessage",
            "teloxide sends PascalCase names"
        );
        assert_eq!(record.reply_to_message_id, Some(asked));
        assert_eq!(record.thread_id, Some(3));
        assert_eq!(i64::from(sent.id.0), record.message_id);

        // HTML.
        let sent = bot
            .send_message(
                ChatId(GROUP),
                "<b>bold</b> &amp; <a href=\"https://example.com/\">link</a>",
            )
            .parse_mode(teloxide::types::ParseMode::Html)
            .await
            .expect("HTML sendMessage");
        assert_eq!(sent.text(), Some("bold & link"));
        assert_eq!(sent.entities().map(<[_]>::len), Some(2));

        // Chat actions and admins.
        bot.send_chat_action(ChatId(GROUP), teloxide::types::ChatAction::Typing)
            .await
            .expect("sendChatAction");
        assert_eq!(fake.chat_actions()[0].action, "typing");
        fake.set_admins(GROUP, vec![1001, 4242]);
        let admins = bot
            .get_chat_administrators(ChatId(GROUP))
            .await
            .expect("admins");
        assert!(matches!(admins[0].kind, ChatMemberKind::Owner(_)));
        assert!(matches!(admins[1].kind, ChatMemberKind::Administrator(_)));
        assert_eq!(admins[1].user.id, UserId(4242));

        // Errors.
        fake.fail_next("sendMessage", Failure::RetryAfter(7));
        let err = bot.send_message(ChatId(GROUP), "x").await.unwrap_err();
        match err {
            RequestError::RetryAfter(secs) => assert_eq!(secs.seconds(), 7),
            other => panic!("expected RetryAfter, got {other:?}"),
        }
        fake.fail_next("getUpdates", Failure::Conflict);
        let err = bot.get_updates().await.unwrap_err();
        assert!(
            matches!(
                err,
                RequestError::Api(ApiError::TerminatedByOtherGetUpdates)
            ),
            "{err:?}"
        );
        let err = bot.send_message(ChatId(-5), "x").await.unwrap_err();
        assert!(
            matches!(err, RequestError::Api(ApiError::ChatNotFound)),
            "{err:?}"
        );
        let err = bot
            .send_message(ChatId(GROUP), "x")
            .reply_parameters(ReplyParameters::new(MessageId(99_999)))
            .await
            .unwrap_err();
        assert!(
            matches!(err, RequestError::Api(ApiError::MessageToReplyNotFound)),
            "{err:?}"
        );
        fake.fail_next("getMe", Failure::MigrateToChatId(-10_042));
        let err = bot.get_me().await.unwrap_err();
        assert!(
            matches!(err, RequestError::MigrateToChatId(ChatId(-10_042))),
            "{err:?}"
        );
        let wrong = Bot::new("1:wrong").set_api_url(bot.api_url());
        let err = wrong.get_me().await.unwrap_err();
        assert!(
            matches!(err, RequestError::Api(ApiError::InvalidToken)),
            "{err:?}"
        );

        // Files: teloxide percent-encodes the '/' of file_path.
        fake.add_file("DOC1", b"file body".to_vec());
        let file = bot.get_file(FileId("DOC1".into())).await.expect("getFile");
        assert_eq!(file.meta.size, 9);
        let mut bytes = Vec::new();
        bot.download_file(&file.path, &mut bytes)
            .await
            .expect("download");
        assert_eq!(bytes, b"file body");
        let err = bot.get_file(FileId("missing".into())).await.unwrap_err();
        assert!(
            matches!(err, RequestError::Api(ApiError::Unknown(_))),
            "{err:?}"
        );

        assert_eq!(fake.unknown_methods(), Vec::<String>::new());
    }

    #[tokio::test]
    async fn teloxide_parses_photos_private_chats_and_real_fixtures() {
        let fake = FakeTelegram::start(TOKEN).await;
        let bot = bot(&fake);
        fake.group_message(GROUP, alice(), "see")
            .photo("PHOTO9", 1234)
            .push();
        fake.private_message(alice(), "").command("/reset").push();
        fake.push_update(teloxide_fixture("update.message.L558.json").unwrap());
        let topic = teloxide_fixture("message.topic_message.L2633.json").unwrap();
        fake.push_update(json!({ "message": topic }));
        let anonymous = teloxide_fixture("message.issue_475.L2525.json").unwrap();
        fake.push_update(json!({ "message": anonymous }));

        let updates = bot.get_updates().timeout(1).await.expect("getUpdates");
        assert_eq!(updates.len(), 5);
        let messages: Vec<&Message> = updates
            .iter()
            .map(|u| match &u.kind {
                UpdateKind::Message(m) => m,
                other => panic!("not a message: {other:?}"),
            })
            .collect();
        let photo = messages[0].photo().expect("photo");
        assert_eq!(photo.last().unwrap().file.id, FileId("PHOTO9".into()));
        assert_eq!(messages[0].caption(), Some("see"));
        assert!(messages[1].chat.is_private());
        assert_eq!(messages[1].text(), Some("/reset"));
        assert_eq!(
            messages[1].entities().unwrap()[0].kind,
            MessageEntityKind::BotCommand
        );
        assert_eq!(messages[2].text(), Some("hello there"));
        assert_eq!(messages[3].thread_id.map(|t| t.0), Some(MessageId(4)));
        assert!(messages[3].reply_to_message().is_some());

        // The raw fixtures' chats are known now, so the bot can answer there.
        let chat = messages[3].chat.id;
        let sent = bot
            .send_message(chat, "reply")
            .reply_parameters(ReplyParameters::new(messages[3].id))
            .await
            .expect("send into a fixture chat");
        assert_eq!(sent.reply_to_message().map(|m| m.id), Some(messages[3].id));
    }

    #[tokio::test]
    async fn teloxide_polling_listener_acknowledges_updates() {
        let fake = FakeTelegram::start(TOKEN).await;
        let mut listener = Polling::builder(bot(&fake))
            .timeout(Duration::from_secs(1))
            .delete_webhook()
            .await
            .build();
        let stop = listener.stop_token();
        let first = fake.group_message(GROUP, alice(), "one").push();
        let second = fake.group_message(GROUP, alice(), "two").push();
        let stream = listener.as_stream();
        tokio::pin!(stream);
        let mut ids = Vec::new();
        while ids.len() < 2 {
            let update = tokio::time::timeout(WAIT, stream.next())
                .await
                .expect("an update in time")
                .expect("stream open")
                .expect("update ok");
            if let UpdateKind::Message(m) = update.kind {
                ids.push(i64::from(m.id.0));
            }
        }
        assert_eq!(ids, vec![first, second]);
        assert_eq!(fake.calls("getWebhookInfo"), 1);
        assert_eq!(fake.pending_updates().len(), 2, "not acknowledged yet");

        // Stopping makes the listener acknowledge with a last short poll.
        stop.stop();
        let end = tokio::time::timeout(WAIT, stream.next())
            .await
            .expect("the stream ends in time");
        assert!(end.is_none());
        let pending = fake.pending_updates();
        assert!(pending.is_empty(), "{pending:?}");
        let third_update = fake.get_updates_calls().last().cloned().unwrap();
        assert_eq!(third_update.timeout, Some(0));
        assert_eq!(fake.acked_offset(), third_update.offset);
        assert_eq!(fake.unknown_methods(), Vec::<String>::new());
    }

    /// Documents a teloxide 0.17 limitation the daemon must live with: it has no
    /// `date_time` entity kind (Bot API `<tg-time>`), and because `MessageKind`
    /// is an untagged enum ending in `Empty {}`, such a message parses without
    /// error as `MessageKind::Empty`: its text is lost.
    #[tokio::test]
    async fn teloxide_turns_messages_with_unknown_entities_into_empty_ones() {
        use teloxide::types::{MessageKind, ParseMode};
        let fake = FakeTelegram::start(TOKEN).await;
        fake.group_chat(GROUP, "g");
        let bot = bot(&fake);
        let sent = bot
            .send_message(
                ChatId(GROUP),
                "at <tg-time unix=\"1647531900\">noon</tg-time>",
            )
            .parse_mode(ParseMode::Html)
            .await
            .expect("parses, but lossily");
        assert!(matches!(sent.kind, MessageKind::Empty {}));
        assert_eq!(sent.text(), None);
        let record = fake.sent_messages().pop().unwrap();
        assert_eq!(record.message["text"], json!("at noon"));
        assert_eq!(record.message["entities"][0]["type"], json!("date_time"));

        fake.push_update(json!({ "message": record.message }));
        let updates = bot.get_updates().await.expect("getUpdates");
        let UpdateKind::Message(msg) = &updates[0].kind else {
            panic!("{:?}", updates[0].kind);
        };
        assert_eq!(msg.text(), None);
    }
}

#[tokio::test]
async fn latency_delays_every_call_but_get_updates() {
    let fake = FakeTelegram::start(TOKEN).await;
    fake.group_chat(GROUP, "Group");
    fake.set_latency(Duration::from_millis(60));
    assert_eq!(fake.latency(), Duration::from_millis(60));
    let started = Instant::now();
    ok_result(
        &fake,
        "sendMessage",
        json!({"chat_id": GROUP, "text": "hello"}),
    )
    .await;
    // A lower bound only: the knob must hold a call for its whole round trip.
    assert!(started.elapsed() >= Duration::from_millis(60));
    assert_eq!(fake.sent_messages().len(), 1);

    // A round trip of an hour would hold any call that is not exempt past the guard.
    fake.set_latency(Duration::from_secs(3600));
    fake.group_message(GROUP, alice(), "hi").push();
    let polled = tokio::time::timeout(WAIT, ok_result(&fake, "getUpdates", json!({"timeout": 0})))
        .await
        .expect("getUpdates is not delayed");
    assert_eq!(polled.as_array().map(Vec::len), Some(1));
}

#[tokio::test]
async fn a_webhook_refuses_get_updates_and_delivers_with_its_secret() {
    use std::sync::{Arc, Mutex};

    /// What each POST carried: the secret header and the update.
    type Seen = Arc<Mutex<Vec<(Option<String>, Value)>>>;
    // The bot's side: records what each POST carried and answers 200.
    let seen: Seen = Arc::default();
    let app = axum::Router::new().route(
        "/hook/3f9c2a7d0b6e41c8",
        axum::routing::post({
            let seen = Arc::clone(&seen);
            move |headers: axum::http::HeaderMap, axum::Json(update): axum::Json<Value>| async move {
                let secret = headers
                    .get(parlor_testkit::telegram::SECRET_HEADER)
                    .map(|v| v.to_str().unwrap().to_owned());
                seen.lock().unwrap().push((secret, update));
                axum::http::StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "http://{}/hook/3f9c2a7d0b6e41c8",
        listener.local_addr().unwrap()
    );
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let fake = FakeTelegram::start(TOKEN).await;
    let update = fake.group_message(GROUP, alice(), "hi").webhook_update();
    assert!(matches!(
        fake.deliver_webhook(&update).await,
        Err(parlor_testkit::WebhookError::NotSet)
    ));
    let (status, answer) = api(
        &fake,
        "setWebhook",
        json!({"url": url, "secret_token": "bad secret"}),
    )
    .await;
    assert_eq!(status, 400, "{answer}");
    ok_result(
        &fake,
        "setWebhook",
        json!({"url": url, "secret_token": "s3cret", "drop_pending_updates": false}),
    )
    .await;
    let webhook = fake.webhook().unwrap();
    assert_eq!(webhook.secret_token.as_deref(), Some("s3cret"));
    assert_eq!(webhook.drop_pending_updates, Some(false));
    let info = ok_result(&fake, "getWebhookInfo", json!({})).await;
    assert_eq!(info["url"], json!(url));

    let (status, answer) = api(&fake, "getUpdates", json!({})).await;
    assert_eq!(status, 409, "{answer}");
    assert!(
        answer["description"]
            .as_str()
            .unwrap()
            .contains("webhook is active"),
        "{answer}"
    );

    assert_eq!(fake.deliver_webhook(&update).await.unwrap(), 200);
    assert_eq!(
        fake.deliver_webhook_with_secret(&update, None)
            .await
            .unwrap(),
        200
    );
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen[0], (Some("s3cret".to_owned()), update.clone()));
        assert_eq!(seen[1].0, None);
        assert!(seen[0].1["update_id"].as_i64().is_some());
    }
    assert!(
        fake.pending_updates().is_empty(),
        "not queued for getUpdates"
    );

    ok_result(
        &fake,
        "deleteWebhook",
        json!({"drop_pending_updates": false}),
    )
    .await;
    assert_eq!(fake.webhook(), None);
    let (status, _) = api(&fake, "getUpdates", json!({})).await;
    assert_eq!(status, 200);
    server.abort();
}

#[tokio::test]
async fn callback_queries_are_answerable_once_and_button_data_is_checked() {
    let fake = FakeTelegram::start(TOKEN).await;
    fake.group_chat(GROUP, "group");
    let keyboard =
        |data: &str| json!({"inline_keyboard": [[{"text": "Yes", "callback_data": data}]]});
    let (status, answer) = api(
        &fake,
        "sendMessage",
        json!({"chat_id": GROUP, "text": "ok?", "reply_markup": keyboard(&"x".repeat(65))}),
    )
    .await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["description"], "Bad Request: BUTTON_DATA_INVALID");
    let sent = ok_result(
        &fake,
        "sendMessage",
        json!({"chat_id": GROUP, "text": "ok?", "reply_markup": keyboard("yes")}),
    )
    .await;
    let message_id = sent["message_id"].as_i64().unwrap();
    let keyboard = fake.sent_messages()[0].inline_keyboard();
    assert_eq!(keyboard[0][0].text, "Yes");
    assert_eq!(keyboard[0][0].callback_data.as_deref(), Some("yes"));

    fake.callback_query(alice(), GROUP, message_id, "yes")
        .push();
    let updates = ok_result(&fake, "getUpdates", json!({})).await;
    let query = &updates[0]["callback_query"];
    assert_eq!(query["data"], "yes");
    assert_eq!(query["from"]["id"], 1001);
    assert_eq!(query["message"]["message_id"], message_id);
    assert_eq!(query["message"]["reply_markup"], sent["reply_markup"]);
    let id = query["id"].as_str().unwrap().to_owned();

    let answer = json!({"callback_query_id": id, "text": "Done", "show_alert": true});
    ok_result(&fake, "answerCallbackQuery", answer.clone()).await;
    let (status, again) = api(&fake, "answerCallbackQuery", answer).await;
    assert_eq!(status, 400, "answered once: {again}");
    let (status, _) = api(
        &fake,
        "answerCallbackQuery",
        json!({"callback_query_id": "never-issued"}),
    )
    .await;
    assert_eq!(status, 400);
    let answers = fake.wait_for_callback_answers(1, WAIT).await.unwrap();
    assert_eq!(answers.len(), 1);
    assert_eq!(answers[0].callback_query_id, id);
    assert_eq!(answers[0].text.as_deref(), Some("Done"));
    assert!(answers[0].show_alert);
}
