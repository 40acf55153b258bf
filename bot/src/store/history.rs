//! The form a history message is stored in: parlor's own, not a provider's.
//!
//! Releases up to a271e69 stored each message as OpenAI's wire JSON (`{"role":...}`, schema
//! version 1). A provider's shape changes when the provider does, and a second provider's
//! data (Anthropic's thinking blocks with their signatures) had to ride in it as an extra
//! field. Version 2 names what a turn holds in parlor's terms: instructions, a member's input
//! (text, or parts with images by the platform's reference), the model's answer (text, tool
//! calls, thinking, which model wrote it) and a tool's result. Each backend maps
//! [`Message`] to its own wire format; nothing here is sent.
//!
//! [`StoredTurn`] is version 2. Version 1 values are still read (they are [`Message`]'s own
//! serde form), so a store is readable at every moment of its migration
//! ([`SledStore::open`](super::SledStore::open) rewrites them).

use serde::{Deserialize, Serialize};

use crate::llm::{Content, ContentPart, ImageUrl, Message, ThinkingBlock, ToolCall};
use crate::platform::ImageRef;

/// The schema version of a history message in parlor's own form.
pub(crate) const HISTORY_VERSION: u64 = 2;

/// One history message as stored (schema version 2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum StoredTurn {
    /// Instructions to the model (a system message).
    Instructions { text: String },
    /// What the model was given to answer: plain `text`, or `parts` when it holds images.
    Input {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text: Option<String>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        parts: Vec<StoredPart>,
    },
    /// The model's answer.
    Answer {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text: Option<String>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        calls: Vec<StoredCall>,
        /// Thinking with its signature, replayed as it came (Anthropic checks it).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        thinking: Vec<StoredThought>,
        /// The model that wrote it, when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        model: Option<String>,
    },
    /// A tool's result for the call `call_id`.
    ToolResult { call_id: String, text: String },
}

/// One part of an input with images.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum StoredPart {
    Text {
        text: String,
    },
    /// An image by the platform's reference: history never holds image bytes.
    Image {
        image: ImageRef,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message_id: Option<String>,
    },
    /// An image by URL (a `data:` URL only inside one turn's requests, never stored by the
    /// agent, but kept exactly if it is).
    ImageUrl {
        url: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        detail: Option<String>,
    },
}

/// A tool call of an answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct StoredCall {
    pub id: String,
    pub name: String,
    /// The arguments as the model wrote them: JSON text, not necessarily valid.
    pub arguments: String,
}

/// A block of thinking.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum StoredThought {
    Clear {
        text: String,
        signature: String,
    },
    /// Encrypted by the provider; opaque.
    Redacted {
        data: String,
    },
}

impl From<&Message> for StoredTurn {
    fn from(message: &Message) -> Self {
        match message {
            Message::System { content } => StoredTurn::Instructions {
                text: content.clone(),
            },
            Message::User {
                content: Content::Text(text),
            } => StoredTurn::Input {
                text: Some(text.clone()),
                parts: Vec::new(),
            },
            Message::User {
                content: Content::Parts(parts),
            } => StoredTurn::Input {
                text: None,
                parts: parts.iter().map(StoredPart::from).collect(),
            },
            Message::Assistant {
                content,
                tool_calls,
                thinking,
                model,
            } => StoredTurn::Answer {
                text: content.clone(),
                calls: tool_calls
                    .iter()
                    .map(|call| StoredCall {
                        id: call.id.clone(),
                        name: call.function.name.clone(),
                        arguments: call.function.arguments.clone(),
                    })
                    .collect(),
                thinking: thinking.iter().map(StoredThought::from).collect(),
                model: model.clone(),
            },
            Message::Tool {
                tool_call_id,
                content,
            } => StoredTurn::ToolResult {
                call_id: tool_call_id.clone(),
                text: content.clone(),
            },
        }
    }
}

impl From<StoredTurn> for Message {
    fn from(turn: StoredTurn) -> Self {
        match turn {
            StoredTurn::Instructions { text } => Message::System { content: text },
            StoredTurn::Input {
                text: Some(text), ..
            } => Message::User {
                content: Content::Text(text),
            },
            StoredTurn::Input { text: None, parts } => Message::User {
                content: Content::Parts(parts.into_iter().map(ContentPart::from).collect()),
            },
            StoredTurn::Answer {
                text,
                calls,
                thinking,
                model,
            } => Message::Assistant {
                content: text,
                tool_calls: calls
                    .into_iter()
                    .map(|call| ToolCall::new(call.id, call.name, call.arguments))
                    .collect(),
                thinking: thinking.into_iter().map(ThinkingBlock::from).collect(),
                model,
            },
            StoredTurn::ToolResult { call_id, text } => Message::Tool {
                tool_call_id: call_id,
                content: text,
            },
        }
    }
}

impl From<&ContentPart> for StoredPart {
    fn from(part: &ContentPart) -> Self {
        match part {
            ContentPart::Text { text } => StoredPart::Text { text: text.clone() },
            ContentPart::ImageRef { image, message_id } => StoredPart::Image {
                image: image.clone(),
                message_id: message_id.clone(),
            },
            ContentPart::ImageUrl { image_url } => StoredPart::ImageUrl {
                url: image_url.url.clone(),
                detail: image_url.detail.clone(),
            },
        }
    }
}

impl From<StoredPart> for ContentPart {
    fn from(part: StoredPart) -> Self {
        match part {
            StoredPart::Text { text } => ContentPart::Text { text },
            StoredPart::Image { image, message_id } => ContentPart::ImageRef { image, message_id },
            StoredPart::ImageUrl { url, detail } => ContentPart::ImageUrl {
                image_url: ImageUrl { url, detail },
            },
        }
    }
}

impl From<&ThinkingBlock> for StoredThought {
    fn from(block: &ThinkingBlock) -> Self {
        match block {
            ThinkingBlock::Thinking {
                thinking,
                signature,
            } => StoredThought::Clear {
                text: thinking.clone(),
                signature: signature.clone(),
            },
            ThinkingBlock::RedactedThinking { data } => {
                StoredThought::Redacted { data: data.clone() }
            }
        }
    }
}

impl From<StoredThought> for ThinkingBlock {
    fn from(thought: StoredThought) -> Self {
        match thought {
            StoredThought::Clear { text, signature } => ThinkingBlock::Thinking {
                thinking: text,
                signature,
            },
            StoredThought::Redacted { data } => ThinkingBlock::RedactedThinking { data },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_shape() -> Vec<Message> {
        let image = ImageRef {
            file_id: "f1".into(),
            mime_type: Some("image/png".into()),
            size: Some(12),
        };
        vec![
            Message::system("be brief"),
            Message::user("hi"),
            Message::User {
                content: Content::Parts(vec![
                    ContentPart::Text {
                        text: "look".into(),
                    },
                    ContentPart::ImageRef {
                        image,
                        message_id: Some("7".into()),
                    },
                    ContentPart::ImageUrl {
                        image_url: ImageUrl {
                            url: "data:image/png;base64,AA==".into(),
                            detail: Some("low".into()),
                        },
                    },
                ]),
            },
            Message::User {
                content: Content::Parts(Vec::new()),
            },
            Message::assistant("hello"),
            Message::Assistant {
                content: None,
                tool_calls: vec![ToolCall::new("c1", "memory_write", "{\"k\":1")],
                thinking: vec![
                    ThinkingBlock::Thinking {
                        thinking: "why".into(),
                        signature: "sig".into(),
                    },
                    ThinkingBlock::RedactedThinking { data: "xx".into() },
                ],
                model: Some("claude-haiku-4-5".into()),
            },
            Message::Assistant {
                content: Some(String::new()),
                tool_calls: Vec::new(),
                thinking: Vec::new(),
                model: None,
            },
            Message::tool("c1", "{\"ok\":true}"),
        ]
    }

    #[test]
    fn every_message_comes_back_from_its_stored_form_as_it_was() {
        for message in every_shape() {
            let json = serde_json::to_string(&StoredTurn::from(&message)).unwrap();
            let back: StoredTurn = serde_json::from_str(&json).unwrap();
            assert_eq!(Message::from(back), message, "{json}");
        }
    }

    #[test]
    fn the_stored_form_names_no_provider_field() {
        let json = serde_json::to_string(
            &every_shape()
                .iter()
                .map(StoredTurn::from)
                .collect::<Vec<_>>(),
        )
        .unwrap();
        for wire in ["\"role\"", "tool_calls", "\"function\"", "image_url\":{"] {
            assert!(!json.contains(wire), "{wire} in {json}");
        }
    }
}
