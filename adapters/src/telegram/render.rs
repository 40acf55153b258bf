//! Model text -> the Telegram messages that carry it.
//!
//! The Markdown is rendered by `parlor_render::telegram` (one parser, one intermediate
//! form, one renderer per platform) into parts of plain text plus explicit entities, at most
//! 4096 UTF-16 units each. No `parse_mode` is ever sent, so Telegram cannot refuse a reply
//! for bad markup ("can't parse entities"). This file only maps the renderer's entities onto
//! teloxide's types.

use parlor_render::telegram::{self as renderer, EntityKind};
use teloxide_core::types::{MessageEntity, MessageEntityKind};

/// Telegram's limit for `sendMessage.text`, in UTF-16 code units.
pub const MAX_MESSAGE_UTF16: usize = renderer::MAX_MESSAGE_UTF16;

/// One message to send: its text and the entities that format it.
#[derive(Debug, Clone, PartialEq)]
pub struct RenderedPart {
    /// Plain text, at most [`MAX_MESSAGE_UTF16`] UTF-16 units.
    pub text: String,
    /// Formatting, offsets and lengths in UTF-16 units of `text`.
    pub entities: Vec<MessageEntity>,
}

/// Turns the model's Markdown into the parts to send, in order. Empty (or all-whitespace)
/// text gives no parts.
pub fn render(markdown: &str) -> Vec<RenderedPart> {
    renderer::render(markdown)
        .into_iter()
        .map(|part| RenderedPart {
            entities: part
                .entities
                .iter()
                .filter_map(|e| {
                    entity_kind(&e.kind).map(|kind| MessageEntity::new(kind, e.offset, e.length))
                })
                .collect(),
            text: part.text,
        })
        .collect()
}

fn entity_kind(kind: &EntityKind) -> Option<MessageEntityKind> {
    Some(match kind {
        EntityKind::Bold => MessageEntityKind::Bold,
        EntityKind::Italic => MessageEntityKind::Italic,
        EntityKind::Underline => MessageEntityKind::Underline,
        EntityKind::Strikethrough => MessageEntityKind::Strikethrough,
        EntityKind::Spoiler => MessageEntityKind::Spoiler,
        EntityKind::Code => MessageEntityKind::Code,
        EntityKind::Pre { language } => MessageEntityKind::Pre {
            language: language.clone(),
        },
        EntityKind::Blockquote => MessageEntityKind::Blockquote,
        // The renderer only emits URLs it has checked; one that still does not parse loses
        // its link, never the message.
        EntityKind::TextLink { url } => MessageEntityKind::TextLink {
            url: reqwest::Url::parse(url).ok()?,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_becomes_text_and_entities() {
        let parts = render("**bold** and `code` and [a link](https://example.com/x)");
        assert_eq!(parts.len(), 1);
        assert_eq!(parts[0].text, "bold and code and a link");
        let kinds: Vec<_> = parts[0].entities.iter().map(|e| e.kind.clone()).collect();
        assert_eq!(kinds[0], MessageEntityKind::Bold);
        assert_eq!(kinds[1], MessageEntityKind::Code);
        assert!(
            matches!(&kinds[2], MessageEntityKind::TextLink { url } if url.as_str() == "https://example.com/x")
        );
        assert_eq!(
            (parts[0].entities[2].offset, parts[0].entities[2].length),
            (18, 6)
        );
    }

    #[test]
    fn empty_text_gives_no_parts() {
        assert!(render("").is_empty());
        assert!(render(" \n\n ").is_empty());
    }

    #[test]
    fn long_text_is_split_within_the_limit() {
        let text = "word ".repeat(3000);
        let parts = render(&text);
        assert_eq!(parts.len(), 4);
        assert!(
            parts
                .iter()
                .all(|p| p.text.encode_utf16().count() <= MAX_MESSAGE_UTF16)
        );
    }
}
