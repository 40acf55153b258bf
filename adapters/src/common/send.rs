//! The checks a send starts with, worded alike on every platform.

use std::str::FromStr;

use parlor_bot::platform::{Button, ChatRef, PlatformError};

/// Refuses `chat` unless it belongs to the platform whose session keys start with `key`.
pub(crate) fn ensure_platform(
    chat: &ChatRef,
    key: &str,
    platform: &str,
) -> Result<(), PlatformError> {
    if chat.platform == key {
        Ok(())
    } else {
        Err(PlatformError::Refused(format!(
            "`{chat}` is not a {platform} chat"
        )))
    }
}

/// `text` as one of the platform's ids (`what`: `chat`, `topic`, `channel`). Not one is
/// [`PlatformError::NotFound`]: no such chat can exist.
pub(crate) fn parse_id<T: FromStr>(
    text: &str,
    platform: &str,
    what: &str,
) -> Result<T, PlatformError> {
    text.parse()
        .map_err(|_| PlatformError::NotFound(format!("`{text}` is not a {platform} {what} id")))
}

/// The message a reply threads to, when `reply_to` is one of the platform's message ids. A
/// malformed one is dropped with a warning: losing the threading is better than losing the
/// answer.
pub(crate) fn reply_target<T: FromStr>(
    chat: &ChatRef,
    reply_to: Option<&str>,
    platform: &str,
) -> Option<T> {
    let id = reply_to?;
    let parsed = id.parse().ok();
    if parsed.is_none() {
        tracing::warn!(%chat, reply_to = id, "not a {platform} message id; sending without reply");
    }
    parsed
}

/// The refusal of a text that renders to nothing: no platform sends an empty message.
pub(crate) fn nothing_to_send(platform: &str) -> PlatformError {
    PlatformError::Refused(format!(
        "the message is empty; {platform} cannot send empty text"
    ))
}

/// `buttons` as one row of the platform's buttons, each made by `make`; `None` for no
/// buttons. A button whose data is empty or longer than [`Button::MAX_DATA`] bytes is
/// refused, before anything is sent: no platform could hand that data back in a press.
pub(crate) fn button_row<T>(
    buttons: &[Button],
    make: impl Fn(&Button) -> T,
) -> Result<Option<Vec<T>>, PlatformError> {
    if buttons.is_empty() {
        return Ok(None);
    }
    buttons
        .iter()
        .map(|button| {
            if button.data.is_empty() || button.data.len() > Button::MAX_DATA {
                return Err(PlatformError::Refused(format!(
                    "the data of the button `{}` must be 1 to {} bytes, not {}",
                    button.label,
                    Button::MAX_DATA,
                    button.data.len()
                )));
            }
            Ok(make(button))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chats_and_ids_of_another_kind_are_refused() {
        let chat = ChatRef::new("telegram", "-100");
        assert!(ensure_platform(&chat, "telegram", "Telegram").is_ok());
        assert!(matches!(
            ensure_platform(&chat, "discord", "Discord"),
            Err(PlatformError::Refused(m)) if m == "`telegram:-100` is not a Discord chat"
        ));
        assert_eq!(parse_id::<i64>("-100", "Telegram", "chat").ok(), Some(-100));
        assert!(matches!(
            parse_id::<u64>("general", "Discord", "channel"),
            Err(PlatformError::NotFound(m)) if m == "`general` is not a Discord channel id"
        ));
    }

    #[test]
    fn a_malformed_reply_target_is_dropped() {
        let chat = ChatRef::new("discord", "1");
        assert_eq!(reply_target::<u64>(&chat, Some("42"), "Discord"), Some(42));
        assert_eq!(reply_target::<u64>(&chat, Some("x"), "Discord"), None);
        assert_eq!(reply_target::<u64>(&chat, None, "Discord"), None);
    }
}
