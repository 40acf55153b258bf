//! serenity's `Message` -> parlor's [`IncomingMessage`], and a component interaction -> a
//! [`ButtonPress`].

use parlor_bot::platform::{ButtonPress, ChatKind, ChatRef, ImageRef, IncomingMessage, Sender};
use serenity::model::application::{ComponentInteraction, ComponentInteractionDataKind};
use serenity::model::channel::{Message, MessageType};
use serenity::model::user::User;

/// The platform name, and the prefix of every chat and user id.
pub(crate) const PLATFORM: &str = "discord";

/// Who the bot is on Discord (`GET /users/@me`, or the gateway's READY).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BotIdentity {
    /// The bot user's snowflake.
    pub id: u64,
    /// The bot's username.
    pub username: String,
}

/// Normalizes a gateway message. `None` for what parlor does not take: the bot's own messages
/// (Discord echoes every sent message as `MESSAGE_CREATE`), system messages (joins, pins,
/// thread starters...), and messages with neither text nor images.
///
/// - The chat is `discord:{channel_id}`: a guild channel, a thread (a thread has its own
///   channel id) and a DM are each their own session. A message without `guild_id` is a DM
///   ([`ChatKind::Private`]); everything else is a group.
/// - The sender is `discord:{user_id}`, named by server nickname, display name or username.
/// - `mentions_bot`: the bot is in `mentions`, or the content has `<@id>` / `<@!id>`.
/// - `reply_to_bot`: the referenced message was written by the bot.
/// - Text: a leading bot mention before a command is dropped (`<@id> /help` -> `/help`), so the
///   runtime sees the command; other user mentions become `@name` (the bot's own `@username`)
///   so the model reads names rather than snowflakes.
/// - Images: attachments with an `image/*` content type (or an image file extension), by URL.
pub fn convert_message(message: &Message, me: &BotIdentity) -> Option<IncomingMessage> {
    if message.author.id.get() == me.id {
        return None;
    }
    if !matches!(
        message.kind,
        MessageType::Regular | MessageType::InlineReply
    ) {
        return None;
    }
    let kind = if message.guild_id.is_some() {
        ChatKind::Group
    } else {
        ChatKind::Private
    };
    let chat = ChatRef::new(PLATFORM, message.channel_id.get().to_string());
    let mentions_bot = message.mentions.iter().any(|user| user.id.get() == me.id)
        || mentions_id(&message.content, me.id);
    let reply_to = message
        .message_reference
        .as_ref()
        .and_then(|reference| reference.message_id)
        .map(|id| id.get().to_string());
    let reply_to_bot = message
        .referenced_message
        .as_ref()
        .is_some_and(|referenced| referenced.author.id.get() == me.id);
    let mut sender = user_sender(
        &message.author,
        message
            .member
            .as_ref()
            .and_then(|member| member.nick.as_deref()),
    );
    sender.is_bot |= message.webhook_id.is_some();
    let mut text = strip_command_mention(&message.content, me.id);
    for user in &message.mentions {
        let shown = if user.id.get() == me.id {
            format!("@{}", me.username)
        } else {
            format!(
                "@{}",
                user.global_name
                    .clone()
                    .unwrap_or_else(|| user.name.clone())
            )
        };
        for markup in [
            format!("<@{}>", user.id.get()),
            format!("<@!{}>", user.id.get()),
        ] {
            text = text.replace(&markup, &shown);
        }
    }
    for markup in [format!("<@{}>", me.id), format!("<@!{}>", me.id)] {
        text = text.replace(&markup, &format!("@{}", me.username));
    }
    let images: Vec<ImageRef> = message
        .attachments
        .iter()
        .filter(|attachment| {
            attachment
                .content_type
                .as_deref()
                .map(|mime| mime.starts_with("image/"))
                .unwrap_or_else(|| has_image_extension(&attachment.filename))
        })
        .map(|attachment| ImageRef {
            file_id: attachment.url.clone(),
            mime_type: attachment.content_type.clone(),
            size: Some(u64::from(attachment.size)),
        })
        .collect();
    if text.trim().is_empty() && images.is_empty() {
        return None;
    }
    Some(IncomingMessage {
        chat,
        kind,
        message_id: message.id.get().to_string(),
        sender,
        text,
        time: *message.timestamp,
        reply_to,
        reply_to_bot,
        mentions_bot,
        images,
    })
}

/// Normalizes a component interaction: a press of a button under one of the bot's messages.
/// `None` for other components (select menus, which parlor never sends).
///
/// - The chat is `discord:{channel_id}`, as for messages: a guild channel, a thread or a DM.
/// - The sender is `discord:{user_id}` of `member.user` in a guild (serenity copies it into
///   `user`) or of `user` in a DM, named as message authors are.
/// - `data` is the button's `custom_id`; `answer` is `{interaction id}:{token}`, what the
///   acknowledgement and the follow-up need; `message_id` the message carrying the button.
pub fn convert_interaction(interaction: &ComponentInteraction) -> Option<ButtonPress> {
    if !matches!(interaction.data.kind, ComponentInteractionDataKind::Button) {
        return None;
    }
    let member = interaction.member.as_ref();
    let user = member.map_or(&interaction.user, |member| &member.user);
    Some(ButtonPress {
        chat: ChatRef::new(PLATFORM, interaction.channel_id.get().to_string()),
        sender: user_sender(user, member.and_then(|member| member.nick.as_deref())),
        data: interaction.data.custom_id.clone(),
        answer: format!("{}:{}", interaction.id.get(), interaction.token),
        message_id: Some(interaction.message.id.get().to_string()),
    })
}

/// `discord:{user_id}`, named by server nickname, display name or username.
fn user_sender(user: &User, nick: Option<&str>) -> Sender {
    let name = nick
        .map(str::to_owned)
        .or_else(|| user.global_name.clone())
        .unwrap_or_else(|| user.name.clone());
    Sender {
        id: format!("{PLATFORM}:{}", user.id.get()),
        name,
        username: Some(user.name.clone()),
        is_bot: user.bot,
    }
}

/// Whether `content` has `<@id>` or `<@!id>`.
fn mentions_id(content: &str, id: u64) -> bool {
    content.contains(&format!("<@{id}>")) || content.contains(&format!("<@!{id}>"))
}

/// `<@id> /cmd ...` -> `/cmd ...`; anything else unchanged.
pub(crate) fn strip_command_mention(content: &str, id: u64) -> String {
    let trimmed = content.trim_start();
    for markup in [format!("<@{id}>"), format!("<@!{id}>")] {
        if let Some(rest) = trimmed.strip_prefix(&markup) {
            let rest = rest.trim_start();
            if rest.starts_with('/') {
                return rest.to_owned();
            }
        }
    }
    content.to_owned()
}

fn has_image_extension(filename: &str) -> bool {
    let lower = filename.to_ascii_lowercase();
    [".png", ".jpg", ".jpeg", ".gif", ".webp"]
        .iter()
        .any(|ext| lower.ends_with(ext))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_mentions_are_stripped_only_before_commands() {
        assert_eq!(strip_command_mention("<@7> /help", 7), "/help");
        assert_eq!(
            strip_command_mention("  <@!7>   /reset now", 7),
            "/reset now"
        );
        assert_eq!(strip_command_mention("<@7> hello", 7), "<@7> hello");
        assert_eq!(strip_command_mention("<@8> /help", 7), "<@8> /help");
        assert_eq!(strip_command_mention("/status", 7), "/status");
    }

    #[test]
    fn mention_markup_is_found() {
        assert!(mentions_id("hi <@7>", 7));
        assert!(mentions_id("hi <@!7>!", 7));
        assert!(!mentions_id("hi <@77>", 7));
        assert!(!mentions_id("hi <@&7>", 7));
    }
}
