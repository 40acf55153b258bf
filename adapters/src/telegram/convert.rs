//! Telegram `Message` -> [`IncomingMessage`]: a pure function, so every rule is unit-tested
//! against real payloads without a network.
//!
//! Entity offsets are UTF-16 code units. teloxide's `MessageEntityRef::parse` asserts (panics)
//! on an offset that falls inside a surrogate pair, so entities are sliced here with
//! [`utf16_range`], which answers `None` for such platform garbage instead.

use std::ops::Range;

use parlor_bot::platform::{
    ButtonPress, ChatEvent, ChatKind, ChatRef, ImageRef, IncomingMessage, Sender,
};
use teloxide_core::types::{
    CallbackQuery, Chat, ChatKind as TgChatKind, ChatMemberStatus, ChatMemberUpdated, ChatPublic,
    MaybeInaccessibleMessage, Message, MessageEntityKind, PublicChatKind, PublicChatSupergroup,
    Update, UpdateKind, User,
};

/// The platform prefix of every Telegram session key and sender id.
pub(crate) const PLATFORM: &str = "telegram";

/// Who this bot is, as `getMe` answered: needed to recognise mentions of and replies to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BotIdentity {
    /// The bot's user id.
    pub id: u64,
    /// The bot's `@username` without the `@`. Telegram gives every bot one; `None` only
    /// if the server left it out, and then only `text_mention` entities count as mentions.
    pub username: Option<String>,
}

/// Normalizes one Telegram message; `None` for messages parlor cannot represent (service
/// messages, stickers, voice notes...: no text, no caption and no image). The caller still
/// acknowledges those.
///
/// The rules (see also the [module docs](super)):
/// - chat: `telegram:{chat.id}`; a message in a forum topic (the chat is a forum and the
///   message says `is_topic_message`) gets `thread_id` = the topic id, so each topic is its
///   own session. Reply threads of ordinary groups do not.
/// - sender: `telegram:{user.id}` with first + last name; a message sent on behalf of a chat
///   (anonymous admin, linked channel) is attributed to that chat (`sender_chat`).
/// - text: the text or the caption; a `/cmd@this_bot` has its `@this_bot` removed, so the
///   runtime sees `/cmd`; `/cmd@other_bot` is left as it is (and so not addressed to us).
/// - `reply_to` / `reply_to_bot`: the replied-to message, except the implicit "reply" to a
///   topic's root that Telegram attaches to every topic message.
/// - `mentions_bot`: a `mention` entity `@this_bot` (any case), a `text_mention` of the bot,
///   or a `bot_command` addressed `@this_bot`.
/// - images: the largest size of a photo, and a document whose MIME type is `image/*`.
pub fn convert_message(message: &Message, me: &BotIdentity) -> Option<IncomingMessage> {
    let (body, entities) = match (message.text(), message.caption()) {
        (Some(text), _) => (text, message.entities().unwrap_or_default()),
        (None, Some(caption)) => (caption, message.caption_entities().unwrap_or_default()),
        (None, None) => ("", &[][..]),
    };
    let images = images_of(message);
    if body.is_empty() && images.is_empty() {
        return None;
    }

    let username = me.username.as_deref().filter(|name| !name.is_empty());
    let mut mentions_bot = false;
    // Byte ranges of `@this_bot` suffixes of commands, removed from the text below.
    let mut own_command_suffixes: Vec<Range<usize>> = Vec::new();
    for entity in entities {
        let Some(range) = utf16_range(body, entity.offset, entity.length) else {
            tracing::debug!(
                message_id = message.id.0,
                offset = entity.offset,
                length = entity.length,
                "ignoring an entity outside the text"
            );
            continue;
        };
        let slice = &body[range.clone()];
        match &entity.kind {
            MessageEntityKind::Mention
                if username.is_some_and(|name| is_handle_of(slice, name)) =>
            {
                mentions_bot = true;
            }
            MessageEntityKind::TextMention { user } if user.id.0 == me.id => {
                mentions_bot = true;
            }
            MessageEntityKind::BotCommand => {
                if let (Some(name), Some(at)) = (username, slice.find('@'))
                    && slice[at + 1..].eq_ignore_ascii_case(name)
                {
                    mentions_bot = true;
                    own_command_suffixes.push(range.start + at..range.end);
                }
            }
            _ => {}
        }
    }
    // Telegram marks every `@username` it sees with an entity; a message without any entity
    // (e.g. relayed by another tool) still counts when it names the bot as a whole word.
    if !mentions_bot && entities.is_empty() {
        mentions_bot = username.is_some_and(|name| contains_handle(body, name));
    }

    let mut text = body.to_owned();
    own_command_suffixes.sort_by_key(|range| std::cmp::Reverse(range.start));
    for range in own_command_suffixes {
        text.replace_range(range, "");
    }

    let reply = message
        .reply_to_message()
        .filter(|replied| !is_topic_root(message, replied));

    Some(IncomingMessage {
        chat: chat_ref(message),
        kind: if message.chat.is_private() {
            ChatKind::Private
        } else {
            ChatKind::Group
        },
        message_id: message.id.0.to_string(),
        sender: sender_of(message),
        text,
        time: message.date,
        reply_to: reply.map(|replied| replied.id.0.to_string()),
        reply_to_bot: reply
            .and_then(|replied| replied.from.as_ref())
            .is_some_and(|user| user.id.0 == me.id),
        mentions_bot,
        images,
    })
}

/// What one update carries for the runtime, normalized.
#[derive(Debug, Clone, PartialEq)]
pub enum Received {
    /// A message ([`parlor_bot::platform::Inbox::deliver`]).
    Message(IncomingMessage),
    /// Something that happened to a chat ([`parlor_bot::platform::Inbox::chat_event`]).
    Event(ChatEvent),
}

/// Normalizes one update; `None` for what parlor skips (updates of other kinds, messages
/// [`convert_message`] cannot represent, member changes of other users). The caller still
/// acknowledges those.
/// - `message`: a message, or — when it carries `migrate_to_chat_id` (in the old group) or
///   `migrate_from_chat_id` (in the new supergroup) — [`ChatEvent::Migrated`] from the old
///   chat to the new one, the same event from either side;
/// - `edited_message`: [`ChatEvent::Edited`];
/// - `my_chat_member`: the bot's own status changed: [`ChatEvent::Joined`] when it is now
///   `member`, `administrator`, `creator` or a restricted member, [`ChatEvent::Removed`]
///   when it is `left` or `kicked`;
/// - `callback_query`: a press of one of the bot's inline buttons, [`ChatEvent::Button`]
///   (see [`convert_button_press`]).
///
/// The Bot API tells bots nothing of deleted messages, so there is no event for them.
pub fn convert_update(update: &Update, me: &BotIdentity) -> Option<Received> {
    match &update.kind {
        UpdateKind::Message(message) => {
            if let Some(to) = message.migrate_to_chat_id() {
                return Some(Received::Event(ChatEvent::Migrated {
                    from: ChatRef::new(PLATFORM, message.chat.id.0.to_string()),
                    to: ChatRef::new(PLATFORM, to.0.to_string()),
                }));
            }
            if let Some(from) = message.migrate_from_chat_id() {
                return Some(Received::Event(ChatEvent::Migrated {
                    from: ChatRef::new(PLATFORM, from.0.to_string()),
                    to: ChatRef::new(PLATFORM, message.chat.id.0.to_string()),
                }));
            }
            convert_message(message, me).map(Received::Message)
        }
        UpdateKind::EditedMessage(message) => {
            convert_message(message, me).map(|m| Received::Event(ChatEvent::Edited(m)))
        }
        UpdateKind::MyChatMember(change) => member_event(change, me).map(Received::Event),
        UpdateKind::CallbackQuery(query) => {
            convert_button_press(query).map(|press| Received::Event(ChatEvent::Button(press)))
        }
        _ => None,
    }
}

/// Normalizes a `callback_query`: a press of an inline button under one of the bot's
/// messages. `None` for a query parlor never asked for: one without `data` (a game's) or
/// without `message` (a button of an inline-mode message, which has no chat).
///
/// - chat: the chat of the message carrying the button, its forum topic included as for
///   [`convert_message`]; a message too old for Telegram to include in full
///   (`InaccessibleMessage`) still names its chat, without the topic.
/// - sender: `telegram:{from.id}`, named as message senders are.
/// - `answer`: the query id, for `answerCallbackQuery`.
/// - `message_id`: the id of the message carrying the button.
pub fn convert_button_press(query: &CallbackQuery) -> Option<ButtonPress> {
    let data = query.data.as_ref()?;
    let message = query.message.as_ref()?;
    let chat = match message {
        MaybeInaccessibleMessage::Regular(message) => chat_ref(message),
        MaybeInaccessibleMessage::Inaccessible(message) => {
            ChatRef::new(PLATFORM, message.chat.id.0.to_string())
        }
    };
    Some(ButtonPress {
        chat,
        sender: user_sender(&query.from),
        data: data.clone(),
        answer: query.id.0.clone(),
        message_id: Some(message.id().0.to_string()),
    })
}

/// The bot's own membership change, as a join or a removal.
fn member_event(change: &ChatMemberUpdated, me: &BotIdentity) -> Option<ChatEvent> {
    if change.new_chat_member.user.id.0 != me.id {
        return None;
    }
    let chat = ChatRef::new(PLATFORM, change.chat.id.0.to_string());
    let by = user_sender(&change.from);
    let time = change.date;
    let member = &change.new_chat_member;
    if member.is_present() {
        return Some(ChatEvent::Joined {
            chat,
            title: change.chat.title().map(str::to_owned),
            by,
            time,
        });
    }
    let status = match member.status() {
        ChatMemberStatus::Banned => "kicked",
        _ => "left",
    };
    Some(ChatEvent::Removed {
        chat,
        status: status.to_owned(),
        by,
        time,
    })
}

/// The session a message belongs to: the chat, or the forum topic inside it.
fn chat_ref(message: &Message) -> ChatRef {
    let chat = ChatRef::new(PLATFORM, message.chat.id.0.to_string());
    match message.thread_id {
        // `message_thread_id` is also set on replies in ordinary supergroups (the thread's
        // root); only a forum topic is a separate conversation.
        Some(thread) if message.is_topic_message && is_forum(&message.chat) => {
            chat.in_thread(thread.0.0.to_string())
        }
        _ => chat,
    }
}

fn is_forum(chat: &Chat) -> bool {
    matches!(
        &chat.kind,
        TgChatKind::Public(ChatPublic {
            kind: PublicChatKind::Supergroup(PublicChatSupergroup { is_forum: true, .. }),
            ..
        })
    )
}

/// Telegram attaches the topic's creation message as `reply_to_message` of every message in
/// a forum topic; that is where the message lives, not what it answers.
fn is_topic_root(message: &Message, replied: &Message) -> bool {
    message.is_topic_message
        && (message
            .thread_id
            .is_some_and(|thread| thread.0 == replied.id)
            || replied.forum_topic_created().is_some())
}

fn sender_of(message: &Message) -> Sender {
    // Anonymous admins and linked channels write "as a chat": `from` is then a placeholder
    // bot (GroupAnonymousBot), and the chat is the real author.
    if let Some(chat) = &message.sender_chat {
        return Sender {
            id: format!("{PLATFORM}:{}", chat.id.0),
            name: chat
                .title()
                .or_else(|| chat.username())
                .unwrap_or("unknown")
                .to_owned(),
            username: chat.username().map(str::to_owned),
            is_bot: false,
        };
    }
    match &message.from {
        Some(user) => user_sender(user),
        // Only channel posts lack both; attribute them to the chat.
        None => Sender {
            id: format!("{PLATFORM}:{}", message.chat.id.0),
            name: message.chat.title().unwrap_or("unknown").to_owned(),
            username: message.chat.username().map(str::to_owned),
            is_bot: false,
        },
    }
}

fn user_sender(user: &User) -> Sender {
    let full_name = user.full_name();
    let name = match (full_name.trim(), user.username.as_deref()) {
        (name, _) if !name.is_empty() => name.to_owned(),
        (_, Some(username)) if !username.is_empty() => username.to_owned(),
        _ => "unknown".to_owned(),
    };
    Sender {
        id: format!("{PLATFORM}:{}", user.id.0),
        name,
        username: user.username.clone(),
        is_bot: user.is_bot,
    }
}

fn images_of(message: &Message) -> Vec<ImageRef> {
    let mut images = Vec::new();
    // Telegram sends several sizes of one photo; the largest is the one worth reading.
    if let Some(best) = message.photo().and_then(|sizes| {
        sizes.iter().max_by_key(|size| {
            (
                u64::from(size.width) * u64::from(size.height),
                known_size(size.file.size),
            )
        })
    }) {
        images.push(ImageRef {
            file_id: best.file.id.0.clone(),
            // Telegram re-encodes every photo as JPEG.
            mime_type: Some("image/jpeg".to_owned()),
            size: known_size(best.file.size),
        });
    }
    if let Some(document) = message.document()
        && let Some(mime) = &document.mime_type
        && mime.essence_str().starts_with("image/")
    {
        images.push(ImageRef {
            file_id: document.file.id.0.clone(),
            mime_type: Some(mime.essence_str().to_owned()),
            size: known_size(document.file.size),
        });
    }
    images
}

/// teloxide fills a missing `file_size` with `u32::MAX`; that means "unknown", not 4 GB.
fn known_size(size: u32) -> Option<u64> {
    (size != u32::MAX).then_some(u64::from(size))
}

/// `@name` in any case (Telegram usernames are case-insensitive ASCII).
fn is_handle_of(slice: &str, username: &str) -> bool {
    slice
        .strip_prefix('@')
        .is_some_and(|rest| rest.eq_ignore_ascii_case(username))
}

/// Whether `text` contains `@username` as a whole handle (not inside an e-mail address or a
/// longer username).
fn contains_handle(text: &str, username: &str) -> bool {
    let is_name_byte = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let bytes = text.as_bytes();
    let handle_len = username.len() + 1;
    text.match_indices('@').any(|(at, _)| {
        let end = at + handle_len;
        end <= text.len()
            && text.is_char_boundary(end)
            && text[at + 1..end].eq_ignore_ascii_case(username)
            && (at == 0 || !is_name_byte(bytes[at - 1]))
            && bytes.get(end).is_none_or(|&b| !is_name_byte(b))
    })
}

/// The byte range of the UTF-16 span `offset..offset + length` of `text`, or `None` when the
/// span lies outside the text or cuts a character (half a surrogate pair).
pub(crate) fn utf16_range(text: &str, offset: usize, length: usize) -> Option<Range<usize>> {
    let end = offset.checked_add(length)?;
    let mut start_byte = None;
    let mut units = 0usize;
    for (byte, ch) in text
        .char_indices()
        .chain(std::iter::once((text.len(), '\0')))
    {
        if units == offset {
            start_byte = Some(byte);
        }
        if units == end {
            return start_byte.map(|start| start..byte);
        }
        if units > end {
            return None;
        }
        units += ch.len_utf16();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf16_ranges_count_surrogate_pairs_as_two() {
        let text = "😀 @bot x";
        // 😀 is 2 UTF-16 units, then a space: "@bot" starts at unit 3.
        let range = utf16_range(text, 3, 4).expect("valid span");
        assert_eq!(&text[range], "@bot");
        assert_eq!(utf16_range(text, 0, 2).map(|r| &text[r]), Some("😀"));
        assert_eq!(utf16_range(text, 9, 0).map(|r| &text[r]), Some(""));
    }

    #[test]
    fn utf16_ranges_refuse_half_characters_and_overruns() {
        let text = "😀ab";
        assert_eq!(utf16_range(text, 1, 1), None, "inside the surrogate pair");
        assert_eq!(utf16_range(text, 0, 1), None, "ends inside the pair");
        assert_eq!(utf16_range(text, 2, 3), None, "past the end");
        assert_eq!(utf16_range(text, usize::MAX, 2), None, "overflow");
    }

    #[test]
    fn handles_match_whole_words_in_any_case() {
        assert!(contains_handle("hi @Parlor_Bot!", "parlor_bot"));
        assert!(contains_handle("@parlor_bot", "parlor_bot"));
        assert!(!contains_handle("mail me@parlor_bot.org", "parlor_bot"));
        assert!(!contains_handle("@parlor_bots", "parlor_bot"));
        assert!(!contains_handle("@parlor_b", "parlor_bot"));
        assert!(is_handle_of("@PARLOR_BOT", "parlor_bot"));
        assert!(!is_handle_of("parlor_bot", "parlor_bot"));
    }
}
