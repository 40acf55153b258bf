//! Telegram `Message` -> `IncomingMessage`, against real payloads (teloxide's test fixtures,
//! see `fixtures/telegram/README.md`) and hand-written ones for the rules parlor adds.

use chrono::{TimeZone, Utc};
use parlor_adapters::telegram::{BotIdentity, convert_message};
use parlor_bot::platform::{ChatEvent, ChatKind, ImageRef, IncomingMessage};
use serde_json::{Value, json};
use teloxide_core::types::{Message, Update, UpdateKind};

const BOT_ID: u64 = 4242;

fn me() -> BotIdentity {
    BotIdentity {
        id: BOT_ID,
        username: Some("parlor_bot".to_owned()),
    }
}

fn fixture(name: &str) -> String {
    let path = format!(
        "{}/tests/fixtures/telegram/teloxide-update-json/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{path}: {error}"))
}

fn message_fixture(name: &str) -> Message {
    serde_json::from_str(&fixture(name)).unwrap_or_else(|error| panic!("{name}: {error}"))
}

fn convert_fixture(name: &str) -> Option<IncomingMessage> {
    convert_message(&message_fixture(name), &me())
}

/// A supergroup message from alice (1001), with `extra` merged over the defaults.
fn group_message(extra: Value) -> Message {
    let mut base = json!({
        "message_id": 77,
        "date": 1_700_000_000,
        "chat": {"id": -100123, "title": "Parlor test", "type": "supergroup"},
        "from": {"id": 1001, "is_bot": false, "first_name": "Alice", "last_name": "Liddell",
                 "username": "alice"},
    });
    let (Value::Object(base_map), Value::Object(extra)) = (&mut base, extra) else {
        panic!("objects expected");
    };
    base_map.extend(extra);
    serde_json::from_value(base).expect("a valid Telegram message")
}

fn convert(extra: Value) -> IncomingMessage {
    convert_message(&group_message(extra), &me()).expect("a representable message")
}

fn utf16_len(text: &str) -> usize {
    text.encode_utf16().count()
}

/// A `{type, offset, length}` entity over `needle` in `text`, offsets in UTF-16 units.
fn entity(kind: &str, text: &str, needle: &str) -> Value {
    let at = text.find(needle).expect("needle in text");
    json!({"type": kind, "offset": utf16_len(&text[..at]), "length": utf16_len(needle)})
}

// --- real payloads ---------------------------------------------------------------------

#[test]
fn private_text_message() {
    let message = convert_fixture("message.de_text.L2263.json").expect("text message");
    assert_eq!(message.chat.session_key(), "telegram:250918540");
    assert_eq!(message.kind, ChatKind::Private);
    assert_eq!(message.message_id, "199785");
    assert_eq!(message.sender.id, "telegram:250918540");
    assert_eq!(message.sender.name, "Андрей Власов");
    assert_eq!(message.sender.username.as_deref(), Some("aka_dude"));
    assert!(!message.sender.is_bot);
    assert_eq!(message.text, "Лол кек 😂");
    assert_eq!(
        message.time,
        Utc.timestamp_opt(1_568_289_890, 0).single().expect("valid")
    );
    assert_eq!(message.reply_to, None);
    assert!(!message.reply_to_bot && !message.mentions_bot);
    assert!(message.images.is_empty());
}

#[test]
fn photo_takes_the_largest_size() {
    let message = convert_fixture("message.de_image.L2332.json").expect("photo message");
    assert_eq!(message.text, "");
    assert_eq!(
        message.images,
        vec![ImageRef {
            file_id: "AgADAgAD36sxG-PX0UvQSXIn9rccdw-ACA4ABAEAAwIAA3kAAyTcBAABFgQ".to_owned(),
            mime_type: Some("image/jpeg".to_owned()),
            size: Some(75245),
        }]
    );
}

#[test]
fn photo_caption_is_the_text() {
    let message =
        convert_fixture("message.parse_caption_entities.L2538.json").expect("photo message");
    assert_eq!(message.text, "www.example.com");
    assert_eq!(message.images.len(), 1);
    assert_eq!(message.images[0].size, Some(162_061));
    assert!(message.images[0].file_id.ends_with("eQADJAQ"));
    assert!(!message.mentions_bot, "a url entity is no mention");
}

#[test]
fn forum_topic_message_is_its_own_session_and_no_reply() {
    let message = convert_fixture("message.topic_message.L2633.json").expect("topic message");
    assert_eq!(
        message.chat.session_key(),
        "telegram:-1001847508954/topic:4"
    );
    assert_eq!(message.kind, ChatKind::Group);
    assert_eq!(message.text, "blah");
    // Telegram attaches the topic's creation message as `reply_to_message`.
    assert_eq!(message.reply_to, None);
    assert!(!message.reply_to_bot);
}

#[test]
fn anonymous_admin_is_the_sender_chat() {
    let message = convert_fixture("message.issue_419.L2381.json").expect("text message");
    assert_eq!(message.sender.id, "telegram:-1001160242915");
    assert_eq!(message.sender.name, "a");
    assert!(!message.sender.is_bot, "not GroupAnonymousBot");
    assert_eq!(message.text, "text");
    assert_eq!(message.chat.session_key(), "telegram:-1001160242915");
}

#[test]
fn messages_without_text_or_image_are_skipped() {
    for name in [
        "message.topic_created.L2606.json",
        "message.issue_475.L2525.json",
        "message.de_sticker.L2289.json",
        "message.empty_message.L2641.json",
    ] {
        assert_eq!(convert_fixture(name), None, "{name}");
    }
}

#[test]
fn updates_deserialize_and_only_messages_convert() {
    let convert_update = |name: &str| {
        let update: Update =
            serde_json::from_str(&fixture(name)).unwrap_or_else(|error| panic!("{name}: {error}"));
        match update.kind {
            UpdateKind::Message(message) => convert_message(&message, &me()),
            _ => None,
        }
    };
    let message = convert_update("update.message.L558.json").expect("a text message");
    assert_eq!(message.text, "hello there");
    assert_eq!(message.sender.name, "Waffle");
    assert_eq!(message.message_id, "6557");
    let message =
        convert_update("update.de_private_chat_text_message.L745.json").expect("a text message");
    assert_eq!(message.text, "4");
    assert_eq!(
        convert_update("update.pinned_message_works.L778.json"),
        None
    );
    assert_eq!(
        convert_update("update.issue_1107.L646.json"),
        None,
        "a story"
    );

    let unknown: Update =
        serde_json::from_str(&fixture("update.new_update_kind_error.L860.json")).expect("parses");
    assert!(matches!(unknown.kind, UpdateKind::Error(_)));
    assert_eq!(unknown.id.0, 1);
}

// --- button presses ---------------------------------------------------------------------

/// A `callback_query` update of alice pressing a button under `message`, `extra` merged
/// into the query.
fn callback_update(message: Value, extra: Value) -> Update {
    let mut query = json!({
        "id": "4382bfdwdsb323b2d9",
        "from": {"id": 1001, "is_bot": false, "first_name": "Alice", "username": "alice"},
        "message": message,
        "chat_instance": "-7303584462231839117",
        "data": "approve:7f3a",
    });
    let (Value::Object(query_map), Value::Object(extra)) = (&mut query, extra) else {
        panic!("objects expected");
    };
    for (key, value) in extra {
        if value.is_null() {
            query_map.remove(&key);
        } else {
            query_map.insert(key, value);
        }
    }
    // From text, as updates arrive: teloxide's `UpdateKind` cannot read its key from a
    // `serde_json::Value`.
    let text = json!({"update_id": 9, "callback_query": query}).to_string();
    serde_json::from_str(&text).expect("a valid callback query update")
}

fn press_of(update: &Update) -> Option<parlor_bot::platform::ButtonPress> {
    match parlor_adapters::telegram::convert_update(update, &me()) {
        Some(parlor_adapters::telegram::Received::Event(ChatEvent::Button(press))) => Some(press),
        None => None,
        Some(other) => panic!("not a press: {other:?}"),
    }
}

#[test]
fn a_callback_query_is_a_button_press_in_the_chat_of_its_message() {
    let in_topic = json!({
        "message_id": 42,
        "from": {"id": BOT_ID, "is_bot": true, "first_name": "parlor", "username": "parlor_bot"},
        "chat": {"id": -100123, "title": "Parlor test", "type": "supergroup", "is_forum": true},
        "date": 1_700_000_000,
        "message_thread_id": 7,
        "is_topic_message": true,
        "text": "May I run it?",
    });
    let press = press_of(&callback_update(in_topic.clone(), json!({}))).expect("a press");
    assert_eq!(press.chat.session_key(), "telegram:-100123/topic:7");
    assert_eq!(press.sender.id, "telegram:1001");
    assert_eq!(press.sender.name, "Alice");
    assert_eq!(press.data, "approve:7f3a");
    assert_eq!(press.answer, "4382bfdwdsb323b2d9");
    assert_eq!(press.message_id.as_deref(), Some("42"));

    // A message too old to be sent in full (`date: 0`) still names its chat.
    let old = json!({"message_id": 41, "date": 0,
                     "chat": {"id": -100123, "title": "Parlor test", "type": "supergroup"}});
    let press = press_of(&callback_update(old, json!({}))).expect("a press");
    assert_eq!(press.chat.session_key(), "telegram:-100123");
    assert_eq!(press.message_id.as_deref(), Some("41"));

    // A game's query (no data) and an inline-mode button (no message) are not parlor's.
    let game = json!({"data": null, "game_short_name": "chess"});
    assert_eq!(press_of(&callback_update(in_topic.clone(), game)), None);
    let inline = json!({"message": null, "inline_message_id": "AAAA"});
    assert_eq!(press_of(&callback_update(in_topic, inline)), None);
}

// --- mentions --------------------------------------------------------------------------

#[test]
fn mention_after_emoji_uses_utf16_offsets() {
    // The family emoji is 8 UTF-16 units (3 astral characters + 2 ZWJ) but 18 UTF-8 bytes.
    let text = "👩‍👩‍👧 hi @Parlor_Bot, what's up?";
    let message =
        convert(json!({"text": text, "entities": [entity("mention", text, "@Parlor_Bot")]}));
    assert!(message.mentions_bot);
    assert_eq!(message.text, text);
    assert_eq!(message.kind, ChatKind::Group);
    assert_eq!(message.chat.session_key(), "telegram:-100123");
    assert_eq!(message.sender.id, "telegram:1001");
    assert_eq!(message.sender.name, "Alice Liddell");
}

#[test]
fn mention_of_someone_else_is_not_ours() {
    let text = "😀😀 ask @parlor_bot_fan or @bob";
    let message = convert(json!({"text": text, "entities": [
        entity("mention", text, "@parlor_bot_fan"),
        entity("mention", text, "@bob"),
    ]}));
    assert!(!message.mentions_bot);
}

#[test]
fn an_entity_splitting_a_surrogate_pair_is_ignored_not_a_panic() {
    // teloxide's own `parse_entities` asserts on such offsets.
    let text = "😀 @parlor_bot";
    let message = convert(json!({"text": text, "entities": [
        {"type": "mention", "offset": 1, "length": 5},
        {"type": "mention", "offset": 3, "length": 400},
    ]}));
    assert!(!message.mentions_bot);
    assert_eq!(message.text, text);
}

#[test]
fn text_mention_of_the_bot_counts() {
    let text = "🎉 Parlor, summarize please";
    let ours = convert(json!({"text": text, "entities": [{
        "type": "text_mention", "offset": 3, "length": 6,
        "user": {"id": BOT_ID, "is_bot": true, "first_name": "Parlor"}
    }]}));
    assert!(ours.mentions_bot);
    let theirs = convert(json!({"text": text, "entities": [{
        "type": "text_mention", "offset": 3, "length": 6,
        "user": {"id": 1002, "is_bot": false, "first_name": "Parlor"}
    }]}));
    assert!(!theirs.mentions_bot);
}

#[test]
fn handle_without_entities_still_counts() {
    assert!(convert(json!({"text": "hey @PARLOR_BOT look"})).mentions_bot);
    assert!(!convert(json!({"text": "mail x@parlor_bot.example"})).mentions_bot);
}

#[test]
fn handle_in_code_is_no_mention() {
    // Telegram makes no mention entity inside code; the entity list is authoritative.
    let text = "the handle is `@parlor_bot`";
    let message =
        convert(json!({"text": text, "entities": [entity("code", text, "`@parlor_bot`")]}));
    assert!(!message.mentions_bot);
}

// --- commands --------------------------------------------------------------------------

#[test]
fn our_command_loses_its_suffix_and_counts_as_addressed() {
    let text = "/help@Parlor_Bot clock";
    let message = convert(
        json!({"text": text, "entities": [entity("bot_command", text, "/help@Parlor_Bot")]}),
    );
    assert_eq!(message.text, "/help clock");
    assert!(message.mentions_bot);
}

#[test]
fn our_command_after_emoji_is_stripped_at_the_right_place() {
    let text = "🙂🙂 /todo@parlor_bot now";
    let message = convert(
        json!({"text": text, "entities": [entity("bot_command", text, "/todo@parlor_bot")]}),
    );
    assert_eq!(message.text, "🙂🙂 /todo now");
    assert!(message.mentions_bot);
}

#[test]
fn command_for_another_bot_is_left_alone() {
    let text = "/help@other_bot";
    let message = convert(json!({"text": text, "entities": [entity("bot_command", text, text)]}));
    assert_eq!(message.text, "/help@other_bot");
    assert!(!message.mentions_bot);
}

#[test]
fn bare_command_is_kept_as_is() {
    let text = "/reset";
    let message = convert(json!({"text": text, "entities": [entity("bot_command", text, text)]}));
    assert_eq!(message.text, "/reset");
    assert!(
        !message.mentions_bot,
        "the runtime decides about bare commands"
    );
}

// --- replies and threads ---------------------------------------------------------------

fn replied(from_id: u64, is_bot: bool) -> Value {
    json!({
        "message_id": 10,
        "date": 1_699_999_000,
        "chat": {"id": -100123, "title": "Parlor test", "type": "supergroup"},
        "from": {"id": from_id, "is_bot": is_bot, "first_name": "Someone", "username": "someone"},
        "text": "earlier"
    })
}

#[test]
fn reply_to_the_bot() {
    let message = convert(json!({"text": "and then?", "reply_to_message": replied(BOT_ID, true)}));
    assert_eq!(message.reply_to.as_deref(), Some("10"));
    assert!(message.reply_to_bot);
    assert!(!message.mentions_bot);
}

#[test]
fn reply_to_someone_else() {
    let message = convert(json!({"text": "me too", "reply_to_message": replied(1002, false)}));
    assert_eq!(message.reply_to.as_deref(), Some("10"));
    assert!(!message.reply_to_bot);
}

#[test]
fn reply_thread_outside_a_forum_stays_in_the_chat_session() {
    let message = convert(json!({
        "text": "in a thread",
        "message_thread_id": 10,
        "reply_to_message": replied(1002, false),
    }));
    assert_eq!(message.chat.session_key(), "telegram:-100123");
    assert_eq!(message.reply_to.as_deref(), Some("10"));
}

#[test]
fn reply_to_the_bot_inside_a_forum_topic() {
    let forum = json!({"id": -100123, "title": "Forum", "type": "supergroup", "is_forum": true});
    let mut bot_answer = replied(BOT_ID, true);
    bot_answer["chat"] = forum.clone();
    bot_answer["message_thread_id"] = json!(7);
    bot_answer["is_topic_message"] = json!(true);
    let message = convert(json!({
        "chat": forum,
        "text": "thanks",
        "message_thread_id": 7,
        "is_topic_message": true,
        "reply_to_message": bot_answer,
    }));
    assert_eq!(message.chat.session_key(), "telegram:-100123/topic:7");
    assert_eq!(message.reply_to.as_deref(), Some("10"));
    assert!(message.reply_to_bot);
}

// --- images and senders ----------------------------------------------------------------

#[test]
fn photo_with_caption_mentioning_the_bot() {
    let caption = "@parlor_bot what is this?";
    let message = convert(json!({
        "photo": [
            {"file_id": "small", "file_unique_id": "s", "file_size": 1000, "width": 90, "height": 60},
            {"file_id": "large", "file_unique_id": "l", "file_size": 90000, "width": 1280, "height": 853},
            {"file_id": "medium", "file_unique_id": "m", "file_size": 20000, "width": 320, "height": 213},
        ],
        "caption": caption,
        "caption_entities": [entity("mention", caption, "@parlor_bot")],
    }));
    assert!(message.mentions_bot);
    assert_eq!(message.text, caption);
    assert_eq!(
        message.images,
        vec![ImageRef {
            file_id: "large".to_owned(),
            mime_type: Some("image/jpeg".to_owned()),
            size: Some(90000),
        }]
    );
}

#[test]
fn image_documents_are_images_and_other_documents_are_not() {
    let image = convert(json!({"document": {
        "file_id": "doc-png", "file_unique_id": "d", "file_name": "chart.png",
        "mime_type": "image/png", "file_size": 4096
    }}));
    assert_eq!(
        image.images,
        vec![ImageRef {
            file_id: "doc-png".to_owned(),
            mime_type: Some("image/png".to_owned()),
            size: Some(4096),
        }]
    );
    let pdf = convert(json!({
        "document": {"file_id": "doc-pdf", "file_unique_id": "p", "mime_type": "application/pdf"},
        "caption": "the report"
    }));
    assert!(pdf.images.is_empty());
    assert_eq!(pdf.text, "the report");
    let bare_pdf = group_message(json!({
        "document": {"file_id": "doc-pdf", "file_unique_id": "p", "mime_type": "application/pdf"}
    }));
    assert_eq!(convert_message(&bare_pdf, &me()), None);
}

#[test]
fn unknown_file_size_is_none_not_four_gigabytes() {
    let message = convert(json!({"photo": [
        {"file_id": "nosize", "file_unique_id": "n", "width": 100, "height": 100}
    ]}));
    assert_eq!(message.images[0].size, None);
}

#[test]
fn sender_name_falls_back_to_username_then_unknown() {
    let named = convert(
        json!({"text": "x", "from": {"id": 5, "is_bot": false, "first_name": "", "username": "zed"}}),
    );
    assert_eq!(named.sender.name, "zed");
    assert_eq!(named.sender.username.as_deref(), Some("zed"));
    let nameless =
        convert(json!({"text": "x", "from": {"id": 6, "is_bot": true, "first_name": " "}}));
    assert_eq!(nameless.sender.name, "unknown");
    assert!(nameless.sender.is_bot);
}

#[test]
fn linked_channel_post_is_attributed_to_the_channel() {
    let message = convert(json!({
        "text": "new post",
        "from": {"id": 777000, "is_bot": false, "first_name": "Telegram"},
        "sender_chat": {"id": -100999, "title": "News", "username": "news", "type": "channel"},
        "is_automatic_forward": true,
    }));
    assert_eq!(message.sender.id, "telegram:-100999");
    assert_eq!(message.sender.name, "News");
    assert_eq!(message.sender.username.as_deref(), Some("news"));
}

#[test]
fn a_bot_without_username_only_sees_text_mentions() {
    let nameless = BotIdentity {
        id: BOT_ID,
        username: None,
    };
    let text = "/help@parlor_bot @parlor_bot";
    let message = group_message(json!({"text": text, "entities": [
        entity("bot_command", text, "/help@parlor_bot"),
        {"type": "mention", "offset": 17, "length": 11},
    ]}));
    let converted = convert_message(&message, &nameless).expect("text");
    assert!(!converted.mentions_bot);
    assert_eq!(converted.text, text);
}
