//! OneBot events -> parlor's messages and chat events ([`convert_event`]).
//!
//! Events arrive as JSON objects with a `post_type`: `message` (group or private, the message
//! as segments or as a CQ string), `notice` (members joining and leaving; only the bot's
//! own arrival and departure matter here), `meta_event` (heartbeats and the lifecycle
//! `connect`), `message_sent` (the bot's own messages, echoed by some implementations),
//! `request` (ignored). Everything is read leniently: fields implementations leave out or
//! type differently (ids as strings) do not make an event unreadable.

use chrono::{DateTime, Utc};
use parlor_bot::platform::{ChatEvent, ChatKind, ChatRef, ImageRef, IncomingMessage, Sender};
use serde_json::Value;

use super::cq::{self, Segment};

/// The platform name: the prefix of every session key (`qq:group:123`) and user id
/// (`qq:10001`).
pub const PLATFORM: &str = "qq";

/// Who the bot is on QQ: the account the implementation is logged in as.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BotIdentity {
    /// The QQ number (`self_id`); 0 until the implementation has said.
    pub self_id: i64,
    /// The account's nickname (`get_login_info`), for how a mention of the bot reads.
    pub nickname: Option<String>,
}

/// A member's standing in a QQ group, from `sender.role`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupRole {
    /// The group's owner.
    Owner,
    /// One of its administrators.
    Admin,
    /// Anyone else.
    Member,
}

impl GroupRole {
    fn parse(role: &str) -> GroupRole {
        match role {
            "owner" => GroupRole::Owner,
            "admin" => GroupRole::Admin,
            _ => GroupRole::Member,
        }
    }

    /// Whether the role administers the group (owner or admin).
    pub fn is_admin(self) -> bool {
        matches!(self, GroupRole::Owner | GroupRole::Admin)
    }
}

/// A message as converted, with the facts the adapter keeps beside it.
#[derive(Debug, Clone, PartialEq)]
pub struct ConvertedMessage {
    /// The normalized message.
    pub message: IncomingMessage,
    /// The group and the sender's role in it (`None` for a private message or when the
    /// implementation did not say).
    pub role: Option<(i64, i64, GroupRole)>,
}

/// What one event is, for the adapter.
#[derive(Debug, Clone, PartialEq)]
pub enum Received {
    /// A message for the inbox.
    Message(Box<ConvertedMessage>),
    /// A chat event for the inbox (the bot joined or left a group).
    Chat(Box<ChatEvent>),
    /// A heartbeat: the connection is alive, and says when the next one is due.
    Heartbeat {
        /// The implementation's heartbeat interval, when it gave one.
        interval_ms: Option<u64>,
    },
    /// The bot posted a message (`message_sent`): its id, to know replies to it.
    Own(String),
    /// Nothing parlor acts on (lifecycle, requests, other notices, empty messages).
    Ignored,
}

/// An integer field that may come as a number or a numeric string.
pub(crate) fn int(value: Option<&Value>) -> Option<i64> {
    match value? {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn text_field<'a>(value: &'a Value, key: &str) -> Option<&'a str> {
    value
        .get(key)
        .and_then(Value::as_str)
        .filter(|s| !s.trim().is_empty())
}

/// A message field as segments: an array of segments or a CQ string.
pub fn segments_of(message: Option<&Value>) -> Vec<Segment> {
    match message {
        Some(Value::String(text)) => cq::parse(text),
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(|item| serde_json::from_value(item.clone()).ok())
            .collect(),
        _ => Vec::new(),
    }
}

/// The session of a group.
pub fn group_chat(group_id: i64) -> ChatRef {
    ChatRef::new(PLATFORM, format!("group:{group_id}"))
}

/// The session of a private conversation with a user.
pub fn private_chat(user_id: i64) -> ChatRef {
    ChatRef::new(PLATFORM, format!("private:{user_id}"))
}

/// Converts one event. `me` is the bot (an event's own `self_id` wins over it); `own`
/// says whether a message id is one the bot posted (a reply to it is addressed to the bot).
///
/// - Group messages go to `qq:group:{group_id}`, private ones (friends and temporary
///   chats) to `qq:private:{user_id}`; the sender is `qq:{user_id}`, named by group card,
///   else nickname. The bot's own messages are dropped.
/// - `at` of the bot sets `mentions_bot` and reads `@nickname`; a leading one before a
///   command is dropped (`@bot /help` -> `/help`), so the runtime sees the command. Other
///   `at`s read `@name`; `reply` sets `reply_to` (and `reply_to_bot` through `own`);
///   `image`s become [`ImageRef`]s by URL (else by file); `face` reads `[face N]`.
/// - `notice` `group_increase` / `group_decrease` of the bot itself become
///   [`ChatEvent::Joined`] / [`ChatEvent::Removed`] (`kicked`, or `left` when it left).
pub fn convert_event(event: &Value, me: &BotIdentity, own: impl Fn(&str) -> bool) -> Received {
    let self_id = int(event.get("self_id")).unwrap_or(me.self_id);
    let time = int(event.get("time"))
        .and_then(|t| DateTime::<Utc>::from_timestamp(t, 0))
        .unwrap_or_else(Utc::now);
    match event.get("post_type").and_then(Value::as_str) {
        Some("message") => convert_message(event, self_id, me, time, own),
        Some("message_sent") => match int(event.get("message_id")) {
            Some(id) => Received::Own(id.to_string()),
            None => Received::Ignored,
        },
        Some("notice") => convert_notice(event, self_id, time),
        Some("meta_event") => match event.get("meta_event_type").and_then(Value::as_str) {
            Some("heartbeat") => Received::Heartbeat {
                interval_ms: int(event.get("interval")).and_then(|i| u64::try_from(i).ok()),
            },
            _ => Received::Ignored,
        },
        _ => Received::Ignored,
    }
}

fn convert_message(
    event: &Value,
    self_id: i64,
    me: &BotIdentity,
    time: DateTime<Utc>,
    own: impl Fn(&str) -> bool,
) -> Received {
    let (Some(message_id), Some(user_id)) =
        (int(event.get("message_id")), int(event.get("user_id")))
    else {
        return Received::Ignored;
    };
    if user_id == self_id {
        return Received::Ignored;
    }
    let sender_info = event.get("sender").unwrap_or(&Value::Null);
    let (chat, kind, group) = match event.get("message_type").and_then(Value::as_str) {
        Some("group") => match int(event.get("group_id")) {
            Some(group) => (group_chat(group), ChatKind::Group, Some(group)),
            None => return Received::Ignored,
        },
        Some("private") => (private_chat(user_id), ChatKind::Private, None),
        _ => return Received::Ignored,
    };
    let anonymous = event.get("anonymous").filter(|a| a.is_object());
    let name = anonymous
        .and_then(|a| text_field(a, "name"))
        .or_else(|| text_field(sender_info, "card"))
        .or_else(|| text_field(sender_info, "nickname"))
        .map(str::to_owned)
        .unwrap_or_else(|| user_id.to_string());
    let sender = Sender {
        id: format!("{PLATFORM}:{user_id}"),
        name,
        username: None,
        is_bot: false,
    };
    let segments = segments_of(event.get("message"));
    let shown = Shown::of(&segments, self_id, me, &own);
    if shown.text.trim().is_empty() && shown.images.is_empty() {
        return Received::Ignored;
    }
    let role = match (group, sender_info.get("role").and_then(Value::as_str)) {
        (Some(group), Some(role)) if anonymous.is_none() => {
            Some((group, user_id, GroupRole::parse(role)))
        }
        _ => None,
    };
    Received::Message(Box::new(ConvertedMessage {
        message: IncomingMessage {
            chat,
            kind,
            message_id: message_id.to_string(),
            sender,
            text: shown.text,
            time,
            reply_to: shown.reply_to,
            reply_to_bot: shown.reply_to_bot,
            mentions_bot: shown.mentions_bot,
            images: shown.images,
        },
        role,
    }))
}

/// What a message's segments show.
struct Shown {
    text: String,
    reply_to: Option<String>,
    reply_to_bot: bool,
    mentions_bot: bool,
    images: Vec<ImageRef>,
}

impl Shown {
    fn of(
        segments: &[Segment],
        self_id: i64,
        me: &BotIdentity,
        own: &impl Fn(&str) -> bool,
    ) -> Shown {
        let mut shown = Shown {
            text: String::new(),
            reply_to: None,
            reply_to_bot: false,
            mentions_bot: false,
            images: Vec::new(),
        };
        let is_self = |segment: &Segment| {
            segment.kind == "at"
                && segment.param("qq").and_then(|q| q.parse().ok()) == Some(self_id)
        };
        // `@bot /help`: the mention is how a command is addressed in a group, not text.
        let leading: Vec<usize> = (0..segments.len())
            .filter(|&i| segments[i].kind != "reply")
            .take(2)
            .collect();
        let command_at = match leading.as_slice() {
            [at, next]
                if is_self(&segments[*at])
                    && segments[*next].kind == "text"
                    && segments[*next]
                        .param("text")
                        .is_some_and(|t| t.trim_start().starts_with('/')) =>
            {
                Some((*at, *next))
            }
            _ => None,
        };
        for (index, segment) in segments.iter().enumerate() {
            match segment.kind.as_str() {
                "text" => {
                    let text = segment.param("text").unwrap_or_default();
                    if command_at.is_some_and(|(_, next)| next == index) {
                        shown.text.push_str(text.trim_start());
                    } else {
                        shown.text.push_str(&text);
                    }
                }
                "at" => {
                    if is_self(segment) {
                        shown.mentions_bot = true;
                        if command_at.is_some_and(|(at, _)| at == index) {
                            continue;
                        }
                        let name = me.nickname.clone().unwrap_or_else(|| self_id.to_string());
                        shown.text.push('@');
                        shown.text.push_str(&name);
                    } else {
                        let qq = segment.param("qq").unwrap_or_default();
                        let name = segment.param("name").filter(|n| !n.trim().is_empty());
                        shown.text.push('@');
                        shown.text.push_str(match (&name, qq.as_str()) {
                            (Some(name), _) => name.trim_start_matches('@'),
                            (None, "all") => "all",
                            (None, qq) => qq,
                        });
                    }
                }
                "reply" => {
                    if let Some(id) = segment.param("id").filter(|id| !id.trim().is_empty()) {
                        shown.reply_to_bot = own(&id);
                        shown.reply_to = Some(id);
                    }
                }
                "image" => {
                    let file_id = segment
                        .param("url")
                        .filter(|u| u.starts_with("http://") || u.starts_with("https://"))
                        .or_else(|| segment.param("file"));
                    if let Some(file_id) = file_id {
                        shown.images.push(ImageRef {
                            file_id,
                            mime_type: None,
                            size: segment.param("file_size").and_then(|s| s.parse().ok()),
                        });
                    }
                }
                "face" => {
                    shown.text.push_str(&format!(
                        "[face {}]",
                        segment.param("id").unwrap_or_default()
                    ));
                }
                other => {
                    shown.text.push_str(&format!("[{other}]"));
                }
            }
        }
        shown
    }
}

fn convert_notice(event: &Value, self_id: i64, time: DateTime<Utc>) -> Received {
    let notice = event.get("notice_type").and_then(Value::as_str);
    let (Some(group), Some(user)) = (int(event.get("group_id")), int(event.get("user_id"))) else {
        return Received::Ignored;
    };
    let sub_type = event.get("sub_type").and_then(Value::as_str);
    let operator = int(event.get("operator_id"))
        .filter(|&o| o != 0)
        .unwrap_or(user);
    let by = Sender {
        id: format!("{PLATFORM}:{operator}"),
        name: operator.to_string(),
        username: None,
        is_bot: operator == self_id,
    };
    let chat = group_chat(group);
    match notice {
        Some("group_increase") if user == self_id => Received::Chat(Box::new(ChatEvent::Joined {
            chat,
            title: None,
            by,
            time,
        })),
        Some("group_decrease") if user == self_id || sub_type == Some("kick_me") => {
            let status = if sub_type == Some("leave") || operator == self_id {
                "left"
            } else {
                "kicked"
            };
            Received::Chat(Box::new(ChatEvent::Removed {
                chat,
                status: status.to_owned(),
                by,
                time,
            }))
        }
        _ => Received::Ignored,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn me() -> BotIdentity {
        BotIdentity {
            self_id: 42,
            nickname: Some("parlor".to_owned()),
        }
    }

    fn group_message(message: Value) -> Value {
        json!({
            "post_type": "message", "message_type": "group", "sub_type": "normal",
            "time": 1_700_000_000, "self_id": 42, "message_id": 7, "group_id": 555,
            "user_id": 1001, "message": message,
            "sender": {"user_id": 1001, "nickname": "alice", "card": "Alice", "role": "admin"}
        })
    }

    fn message(received: Received) -> ConvertedMessage {
        match received {
            Received::Message(m) => *m,
            other => panic!("not a message: {other:?}"),
        }
    }

    #[test]
    fn a_command_after_a_mention_reads_as_the_command() {
        let m = message(convert_event(
            &group_message(json!("[CQ:at,qq=42] /help")),
            &me(),
            |_| false,
        ));
        assert_eq!(m.message.text, "/help");
        assert!(m.message.mentions_bot);
        let m = message(convert_event(
            &group_message(json!("[CQ:at,qq=42] hi")),
            &me(),
            |_| false,
        ));
        assert_eq!(m.message.text, "@parlor hi");
        assert_eq!(m.role, Some((555, 1001, GroupRole::Admin)));
        assert_eq!(m.message.chat.session_key(), "qq:group:555");
        assert_eq!(m.message.sender.name, "Alice");
    }

    #[test]
    fn the_bots_own_messages_and_empty_ones_are_ignored() {
        let mut own = group_message(json!("hi"));
        own["user_id"] = json!(42);
        assert_eq!(convert_event(&own, &me(), |_| false), Received::Ignored);
        assert_eq!(
            convert_event(&group_message(json!([])), &me(), |_| false),
            Received::Ignored
        );
        assert_eq!(
            convert_event(&json!({"post_type": 3}), &me(), |_| false),
            Received::Ignored
        );
    }
}
