//! `convert_message` on serenity `Message`s parsed from Discord's own documented example
//! (discord/discord-api-docs, copied into `testkit/fixtures/discord/`), varied field by field.

use parlor_adapters::discord::{BotIdentity, convert_message};
use parlor_bot::platform::{ChatKind, ChatRef};
use parlor_testkit::discord_fixture;
use serde_json::{Value, json};
use serenity::model::channel::Message;

const BOT: u64 = 1100;

fn me() -> BotIdentity {
    BotIdentity {
        id: BOT,
        username: "parlor_bot".to_owned(),
    }
}

/// Discord's example message (a DM-like message without `guild_id`, by "Mason").
fn example() -> Value {
    discord_fixture("message.Example_Message.L167.json").expect("the fixture is copied")
}

fn parse(value: Value) -> Message {
    serde_json::from_value(value).expect("serenity reads the payload")
}

fn in_guild(mut value: Value) -> Value {
    value["guild_id"] = json!("41771983423143937");
    value["member"] = json!({"roles": [], "joined_at": "2020-01-01T00:00:00+00:00",
                             "deaf": false, "mute": false, "nick": "Mase"});
    value
}

fn bot_user() -> Value {
    json!({"id": BOT.to_string(), "username": "parlor_bot", "discriminator": "0",
           "avatar": null, "bot": true})
}

#[test]
fn the_documented_example_converts() {
    let message = parse(example());
    let incoming = convert_message(&message, &me()).expect("a user's text message");
    assert_eq!(incoming.chat, ChatRef::new("discord", "290926798999357250"));
    assert_eq!(incoming.kind, ChatKind::Private, "no guild_id: a DM");
    assert_eq!(incoming.message_id, "334385199974967042");
    assert_eq!(incoming.sender.id, "discord:53908099506183680");
    assert_eq!(incoming.sender.name, "Mason");
    assert_eq!(incoming.sender.username.as_deref(), Some("Mason"));
    assert!(!incoming.sender.is_bot);
    assert_eq!(incoming.text, "Supa Hot");
    assert_eq!(incoming.time.to_rfc3339(), "2017-07-11T17:27:07.299+00:00");
    assert!(!incoming.mentions_bot);
    assert!(!incoming.reply_to_bot);
    assert!(incoming.reply_to.is_none());
    assert!(incoming.images.is_empty());
}

#[test]
fn guild_messages_are_groups_named_by_nickname() {
    let incoming = convert_message(&parse(in_guild(example())), &me()).expect("converts");
    assert_eq!(incoming.kind, ChatKind::Group);
    assert_eq!(incoming.sender.name, "Mase");
}

#[test]
fn mentions_by_array_or_markup_and_commands() {
    let mut value = in_guild(example());
    value["content"] = json!("<@1100> /reset");
    value["mentions"] = json!([bot_user()]);
    let incoming = convert_message(&parse(value.clone()), &me()).expect("converts");
    assert!(incoming.mentions_bot);
    assert_eq!(incoming.text, "/reset");

    value["content"] = json!("hi <@!1100>, how are you?");
    value["mentions"] = json!([]);
    let incoming = convert_message(&parse(value.clone()), &me()).expect("converts");
    assert!(incoming.mentions_bot, "markup alone counts");
    assert_eq!(incoming.text, "hi @parlor_bot, how are you?");

    value["content"] = json!("<@&1100> is a role, <#1100> a channel");
    let incoming = convert_message(&parse(value), &me()).expect("converts");
    assert!(!incoming.mentions_bot);
}

#[test]
fn replies_to_the_bot() {
    let mut referenced = example();
    referenced["id"] = json!("334385199974967000");
    referenced["author"] = bot_user();
    let mut value = in_guild(example());
    value["type"] = json!(19);
    value["message_reference"] = json!({"message_id": "334385199974967000",
                                        "channel_id": "290926798999357250"});
    value["referenced_message"] = referenced.clone();
    let incoming = convert_message(&parse(value.clone()), &me()).expect("converts");
    assert!(incoming.reply_to_bot);
    assert!(!incoming.mentions_bot);
    assert_eq!(incoming.reply_to.as_deref(), Some("334385199974967000"));

    // A reply to someone else; and one whose original was deleted (`referenced_message: null`).
    referenced["author"] = example()["author"].clone();
    value["referenced_message"] = referenced;
    assert!(
        !convert_message(&parse(value.clone()), &me())
            .unwrap()
            .reply_to_bot
    );
    value["referenced_message"] = Value::Null;
    let incoming = convert_message(&parse(value), &me()).unwrap();
    assert!(!incoming.reply_to_bot);
    assert_eq!(incoming.reply_to.as_deref(), Some("334385199974967000"));
}

#[test]
fn own_system_and_empty_messages_are_skipped() {
    let mut own = in_guild(example());
    own["author"] = bot_user();
    own["content"] = json!("<@1100> talking to myself");
    assert!(convert_message(&parse(own), &me()).is_none());

    let mut join = in_guild(example());
    join["type"] = json!(7); // a member joined
    assert!(convert_message(&parse(join), &me()).is_none());

    let mut empty = example();
    empty["content"] = json!("");
    assert!(convert_message(&parse(empty), &me()).is_none());
}

#[test]
fn image_attachments_become_image_refs() {
    let mut value = in_guild(example());
    value["content"] = json!("");
    value["attachments"] = json!([
        {"id": "1", "filename": "cat.PNG", "size": 2048,
         "url": "https://cdn.discordapp.com/attachments/1/1/cat.PNG",
         "proxy_url": "https://media.discordapp.net/attachments/1/1/cat.PNG"},
        {"id": "2", "filename": "notes.txt", "size": 10, "content_type": "text/plain",
         "url": "https://cdn.discordapp.com/attachments/1/2/notes.txt",
         "proxy_url": "https://media.discordapp.net/attachments/1/2/notes.txt"},
        {"id": "3", "filename": "photo", "size": 4096, "content_type": "image/jpeg",
         "url": "https://cdn.discordapp.com/attachments/1/3/photo",
         "proxy_url": "https://media.discordapp.net/attachments/1/3/photo"}
    ]);
    let incoming = convert_message(&parse(value), &me()).expect("an image is content");
    assert_eq!(incoming.images.len(), 2);
    assert_eq!(
        incoming.images[0].file_id,
        "https://cdn.discordapp.com/attachments/1/1/cat.PNG"
    );
    assert_eq!(incoming.images[0].size, Some(2048));
    assert_eq!(incoming.images[1].mime_type.as_deref(), Some("image/jpeg"));
}

#[test]
fn bots_and_webhooks_are_marked() {
    let mut value = in_guild(example());
    value["author"]["bot"] = json!(true);
    assert!(
        convert_message(&parse(value.clone()), &me())
            .unwrap()
            .sender
            .is_bot
    );
    value["author"]["bot"] = json!(false);
    value["webhook_id"] = json!("223704706495545344");
    assert!(convert_message(&parse(value), &me()).unwrap().sender.is_bot);
}
