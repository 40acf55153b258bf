//! Incoming traffic the way Telegram shapes it: users, and the message
//! builders behind [`FakeTelegram::group_message`] and
//! [`FakeTelegram::private_message`].

use serde_json::{Map, Value, json};

use super::FakeTelegram;
use super::state::{Compose, now_unix, unique_id};

/// Width and height of the full-size photo produced by
/// [`MessageBuilder::photo`].
pub(super) const PHOTO_SIZE: (i64, i64) = (1280, 960);

/// A (human, by default) Telegram user that sends messages to the bot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TgUser {
    /// The user id; also the chat id of the private chat with the bot.
    pub id: i64,
    /// `first_name`.
    pub first_name: String,
    /// `last_name`, omitted when `None`.
    pub last_name: Option<String>,
    /// `username` without `@`, omitted when `None`.
    pub username: Option<String>,
    /// `is_bot`.
    pub is_bot: bool,
}

impl TgUser {
    /// A human user with only an id and a first name.
    pub fn new(id: i64, first_name: impl Into<String>) -> Self {
        Self {
            id,
            first_name: first_name.into(),
            last_name: None,
            username: None,
            is_bot: false,
        }
    }

    /// Sets `username` (without `@`).
    pub fn username(mut self, username: impl Into<String>) -> Self {
        self.username = Some(username.into());
        self
    }

    /// Sets `last_name`.
    pub fn last_name(mut self, last_name: impl Into<String>) -> Self {
        self.last_name = Some(last_name.into());
        self
    }

    /// The `User` object.
    pub(super) fn to_json(&self) -> Value {
        let mut user = json!({
            "id": self.id,
            "is_bot": self.is_bot,
            "first_name": self.first_name,
        });
        if let Some(v) = &self.last_name {
            user["last_name"] = json!(v);
        }
        if let Some(v) = &self.username {
            user["username"] = json!(v);
        }
        user
    }

    /// The private chat with the bot: the user's names under the user's id.
    pub(super) fn private_chat_json(&self) -> Value {
        let mut chat = self.to_json();
        if let Some(obj) = chat.as_object_mut() {
            obj.remove("is_bot");
            obj.insert("type".into(), json!("private"));
        }
        chat
    }
}

#[derive(Debug, Clone, Copy)]
pub(super) enum Target {
    Group(i64),
    Private,
}

/// Builds an incoming message; created by [`FakeTelegram::group_message`]
/// and [`FakeTelegram::private_message`]. Finish with
/// [`MessageBuilder::push`] (queue it as an update) or
/// [`MessageBuilder::build`].
#[derive(Debug)]
#[must_use = "a message builder does nothing until .push() or .build()"]
pub struct MessageBuilder<'a> {
    fake: &'a FakeTelegram,
    target: Target,
    from: TgUser,
    text: String,
    mention: bool,
    command: Option<String>,
    reply_to: Option<(i64, bool)>,
    topic: Option<i64>,
    photo: Option<(String, u64)>,
}

impl<'a> MessageBuilder<'a> {
    pub(super) fn new(fake: &'a FakeTelegram, target: Target, from: TgUser, text: String) -> Self {
        Self {
            fake,
            target,
            from,
            text,
            mention: false,
            command: None,
            reply_to: None,
            topic: None,
            photo: None,
        }
    }

    /// Mentions the bot with a `mention` entity. If the text already contains
    /// `@{bot username}` the entity covers that; otherwise `"@{username} "`
    /// is prepended.
    pub fn mention_bot(mut self) -> Self {
        self.mention = true;
        self
    }

    /// Makes the message a reply to `message_id` in the same chat. The
    /// embedded `reply_to_message` is the stored message if the fake knows it
    /// (messages it built, received in raw updates or sent for the bot);
    /// otherwise a text message synthesized from the bot (`from_bot`) or from
    /// a user `{"id":1,"first_name":"someone"}`. In a supergroup the reply
    /// also gets `message_thread_id` (the reply thread's root), like
    /// Telegram's.
    pub fn reply_to(mut self, message_id: i64, from_bot: bool) -> Self {
        self.reply_to = Some((message_id, from_bot));
        self
    }

    /// Starts the text with the bot command `command` (e.g. `"/reset"` or
    /// `"/reset@parlor_bot"`) and adds its `bot_command` entity. If the text
    /// already starts with it, only the entity is added.
    pub fn command(mut self, command: impl Into<String>) -> Self {
        self.command = Some(command.into());
        self
    }

    /// Posts the message in forum topic `thread_id`: `message_thread_id`,
    /// `is_topic_message: true`, and the chat becomes a forum
    /// (`is_forum: true`, also for later messages). Without
    /// [`MessageBuilder::reply_to`], `reply_to_message` is the topic's
    /// `forum_topic_created` service message, as Telegram sends it. No-op for
    /// private messages.
    pub fn topic(mut self, thread_id: i64) -> Self {
        self.topic = Some(thread_id);
        self
    }

    /// Makes it a photo message: `photo` holds a 90×90 thumbnail (file id
    /// `"{file_id}-thumb"`, unknown to `getFile` unless added) and then the
    /// full photo (`file_id`, 1280×960, `file_size`); the text becomes the
    /// `caption` (omitted if empty) and entities become `caption_entities`.
    pub fn photo(mut self, file_id: impl Into<String>, file_size: u64) -> Self {
        self.photo = Some((file_id.into(), file_size));
        self
    }

    /// Makes the sender a bot (`from.is_bot: true`), e.g. another bot in the
    /// group. (Telegram never delivers the bot's own messages.)
    pub fn from_bot(mut self) -> Self {
        self.from.is_bot = true;
        self
    }

    /// The fake the message is for.
    pub(super) fn fake(&self) -> &'a FakeTelegram {
        self.fake
    }

    /// Queues the message as `{"update_id":..,"message":..}` and returns its
    /// `message_id`.
    pub fn push(self) -> i64 {
        let fake = self.fake;
        let message = self.build();
        let id = message["message_id"].as_i64().unwrap_or_default();
        fake.push_update(json!({ "message": message }));
        id
    }

    /// Creates the message (assigning its `message_id` and remembering it for
    /// replies) without queuing an update, and returns its JSON, e.g. to wrap
    /// it in an `edited_message` update for [`FakeTelegram::push_update`].
    pub fn build(self) -> Value {
        let bot = self.fake.shared.lock().bot.username.clone();
        let mention = format!("@{bot}");
        let mut text = self.text;
        if self.mention && !text.contains(&mention) {
            text = join_words(&mention, &text);
        }
        let mut entities = Vec::new();
        let mut search_from = 0;
        if let Some(cmd) = &self.command {
            if !text.starts_with(cmd.as_str()) {
                text = join_words(cmd, &text);
            }
            entities.push(entity("bot_command", 0, utf16_len(cmd)));
            search_from = cmd.len();
        }
        if self.mention
            && let Some(pos) = text[search_from..].find(&mention)
        {
            let start = search_from + pos;
            entities.push(entity(
                "mention",
                utf16_len(&text[..start]),
                utf16_len(&mention),
            ));
        }

        let mut content = Map::new();
        match self.photo {
            Some((file_id, size)) => {
                content.insert(
                    "photo".into(),
                    json!([
                        {
                            "file_id": format!("{file_id}-thumb"),
                            "file_unique_id": unique_id(&format!("{file_id}-thumb")),
                            "file_size": size / 40 + 1,
                            "width": 90,
                            "height": 68,
                        },
                        {
                            "file_id": file_id,
                            "file_unique_id": unique_id(&file_id),
                            "file_size": size,
                            "width": PHOTO_SIZE.0,
                            "height": PHOTO_SIZE.1,
                        },
                    ]),
                );
                if !text.is_empty() {
                    content.insert("caption".into(), json!(text));
                }
                if !entities.is_empty() {
                    content.insert("caption_entities".into(), Value::Array(entities));
                }
            }
            None => {
                content.insert("text".into(), json!(text));
                if !entities.is_empty() {
                    content.insert("entities".into(), Value::Array(entities));
                }
            }
        }

        let mut st = self.fake.shared.lock();
        st.remember_user(&self.from.to_json());
        let chat_id = match self.target {
            Target::Group(id) => {
                st.ensure_group(id);
                id
            }
            Target::Private => {
                st.ensure_private(&self.from);
                self.from.id
            }
        };
        let topic = match self.target {
            Target::Group(_) => self.topic,
            Target::Private => None,
        };
        if let Some(thread_id) = topic {
            st.ensure_topic(chat_id, thread_id, &self.from.to_json());
        }
        let reply = self.reply_to.map(|(id, from_bot)| {
            st.message(chat_id, id)
                .unwrap_or_else(|| st.synthesize_message(chat_id, id, from_bot))
        });
        st.compose(Compose {
            chat_id,
            from: self.from.to_json(),
            date: now_unix(),
            reply,
            thread: topic,
            content,
        })
    }
}

fn join_words(first: &str, rest: &str) -> String {
    if rest.is_empty() {
        first.to_owned()
    } else {
        format!("{first} {rest}")
    }
}

pub(super) fn entity(kind: &str, offset: usize, length: usize) -> Value {
    json!({"type": kind, "offset": offset, "length": length})
}

/// Sorts entities like Telegram: by offset, longer (outer) first.
pub(super) fn sort_entities(entities: &mut [Value]) {
    entities.sort_by_key(|e| {
        (
            e["offset"].as_i64().unwrap_or_default(),
            -e["length"].as_i64().unwrap_or_default(),
        )
    });
}

/// The length of `s` in UTF-16 code units, the unit of Telegram's entity
/// offsets and lengths.
pub fn utf16_len(s: &str) -> usize {
    s.encode_utf16().count()
}
