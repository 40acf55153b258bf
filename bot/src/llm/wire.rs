//! The conversation types every backend maps from, with serde in OpenAI's chat-completions
//! shape (the request body is checked against OpenAI's own JSON Schemas in the tests).
//!
//! The store does not keep this shape: it keeps history in parlor's own form
//! (`store/history.rs`), so that a provider's wire format can change without a store
//! migration. Some parts are parlor's own and never sent: [`ContentPart::ImageRef`], an
//! image by the platform's reference (history never holds image bytes; the agent turns one
//! into a `data:` URL only for the requests of the turn that needs it), Anthropic's
//! [`ThinkingBlock`]s, and which model answered. [`ChatRequest::wire_form`], which
//! [`OpenAiClient::request_body`](super::OpenAiClient::request_body) serializes, replaces
//! any reference that is left with a text part.

use std::borrow::Cow;
use std::ops::Deref;
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use crate::platform::ImageRef;

/// One message of a conversation, tagged by `role` exactly as the API expects it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "lowercase")]
pub enum Message {
    /// The system prompt.
    System {
        /// Prompt text.
        content: String,
    },
    /// A user's (or the platform's) input; may carry images as content parts.
    User {
        /// Text, or text and image parts.
        content: Content,
    },
    /// The model's answer: text, tool calls, or both.
    Assistant {
        /// Text; `None` when the model only called tools.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        content: Option<String>,
        /// Tool calls, in the order the model made them.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
        /// Anthropic's thinking blocks of this answer, with their signatures: the Messages
        /// API refuses a tool-use turn with thinking on unless the thinking that led to the
        /// calls comes back as it was. Empty for every other provider; never part of an
        /// OpenAI request body (`request_body` and `body.rs` leave it out).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        thinking: Vec<ThinkingBlock>,
        /// The model that wrote this answer, when known: kept in history (the store's own
        /// form carries it) and never sent to a provider.
        #[serde(skip)]
        model: Option<String>,
    },
    /// The result of one tool call.
    Tool {
        /// The `id` of the assistant's tool call this answers.
        tool_call_id: String,
        /// The result JSON, as text.
        content: String,
    },
}

impl Message {
    /// A system message.
    pub fn system(text: impl Into<String>) -> Self {
        Message::System {
            content: text.into(),
        }
    }

    /// A plain-text user message.
    pub fn user(text: impl Into<String>) -> Self {
        Message::User {
            content: Content::Text(text.into()),
        }
    }

    /// An assistant message with text only.
    pub fn assistant(text: impl Into<String>) -> Self {
        Message::Assistant {
            content: Some(text.into()),
            tool_calls: Vec::new(),
            thinking: Vec::new(),
            model: None,
        }
    }

    /// A tool result message.
    pub fn tool(tool_call_id: impl Into<String>, content: impl Into<String>) -> Self {
        Message::Tool {
            tool_call_id: tool_call_id.into(),
            content: content.into(),
        }
    }
}

/// A user message's content: a string, or parts (text and images) for vision models.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Text and image parts, in order.
    Parts(Vec<ContentPart>),
}

impl Content {
    /// The text of this content, parts joined by newlines; images are left out.
    pub fn text(&self) -> String {
        match self {
            Content::Text(t) => t.clone(),
            Content::Parts(parts) => parts
                .iter()
                .filter_map(|p| match p {
                    ContentPart::Text { text } => Some(text.as_str()),
                    ContentPart::ImageUrl { .. } | ContentPart::ImageRef { .. } => None,
                })
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }
}

/// One part of a multi-part user message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentPart {
    /// A text part.
    Text {
        /// The text.
        text: String,
    },
    /// An image, by URL or `data:` URL.
    ImageUrl {
        /// Where the image is.
        image_url: ImageUrl,
    },
    /// parlor-internal, never sent: an image attached to a chat message, by the platform's
    /// reference. This is what history stores instead of the image; the agent resolves it
    /// for a request (a `data:` URL in the turn it arrived with, a short text after that).
    ImageRef {
        /// The platform's file id, MIME type and size.
        image: ImageRef,
        /// The chat message the image is attached to, so the model can name it to
        /// `load_image` in a later turn.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message_id: Option<String>,
    },
}

impl ContentPart {
    /// Whether this part is parlor's own and must not reach the provider.
    pub fn is_internal(&self) -> bool {
        matches!(self, ContentPart::ImageRef { .. })
    }
}

/// An image reference for vision input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImageUrl {
    /// `https://...` or `data:image/png;base64,...`.
    pub url: String,
    /// `auto`, `low` or `high`; left to the provider when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// One block of a model's extended thinking (Anthropic), kept so that it can be sent back
/// exactly as it came: the signature is what lets the provider check the text was its own.
/// Serialized as the Messages API's content block (`{"type":"thinking",...}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ThinkingBlock {
    /// Thinking in clear text.
    Thinking {
        /// The text of the thinking.
        thinking: String,
        /// The provider's signature over it.
        signature: String,
    },
    /// Thinking the provider's safety systems encrypted; opaque, but it must go back too.
    RedactedThinking {
        /// The encrypted thinking.
        data: String,
    },
}

/// A tool call the model made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call's id; the tool message answering it carries the same id.
    pub id: String,
    /// Always `"function"`.
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    /// Which function, with what arguments.
    pub function: FunctionCall,
}

fn function_type() -> String {
    "function".to_owned()
}

impl ToolCall {
    /// A function tool call.
    pub fn new(
        id: impl Into<String>,
        name: impl Into<String>,
        arguments: impl Into<String>,
    ) -> Self {
        ToolCall {
            id: id.into(),
            kind: function_type(),
            function: FunctionCall {
                name: name.into(),
                arguments: arguments.into(),
            },
        }
    }
}

/// The function part of a tool call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    /// The tool's wire name.
    pub name: String,
    /// The arguments as the model wrote them: JSON text, not necessarily valid.
    pub arguments: String,
}

/// A tool offered to the model: `{"type":"function","function":{...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDef {
    /// Always `"function"`.
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    /// Name, description and parameter schema.
    pub function: FunctionDef,
}

impl ToolDef {
    /// A function tool definition.
    pub fn function(
        name: impl Into<String>,
        description: impl Into<String>,
        parameters: Value,
    ) -> Self {
        ToolDef {
            kind: function_type(),
            function: FunctionDef {
                name: name.into(),
                description: description.into(),
                parameters,
            },
        }
    }
}

/// A function offered to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionDef {
    /// Wire name, `^[a-zA-Z0-9_-]{1,64}$`.
    pub name: String,
    /// What the function does, for the model.
    pub description: String,
    /// Self-contained JSON Schema object of the arguments.
    pub parameters: Value,
}

/// The tools offered to the model, shared by every request that offers them: a registry
/// builds them once, and a request holds two `Arc`s, not a copy of every schema. Their wire
/// JSON is serialized once too, here, and written into each request body as it is.
///
/// Dereferences to the definitions; built from a `Vec<ToolDef>` (`.into()`) or collected.
#[derive(Clone)]
pub struct ToolDefs {
    defs: Arc<[ToolDef]>,
    /// `defs` exactly as [`OpenAiClient::request_body`](super::OpenAiClient::request_body)
    /// has them (through a `Value`, whose objects keep their keys sorted), compact.
    json: Arc<str>,
    /// `json` as the piece of a request body that points at it rather than copying it.
    piece: Bytes,
}

/// Text shared as [`Bytes`] without a copy.
struct SharedText(Arc<str>);

impl AsRef<[u8]> for SharedText {
    fn as_ref(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl ToolDefs {
    /// Whether no tool is offered.
    pub fn is_empty(&self) -> bool {
        self.defs.is_empty()
    }

    /// The definitions as the `tools` array of a request body: compact JSON, keys sorted.
    pub fn wire_json(&self) -> &str {
        &self.json
    }

    /// [`ToolDefs::wire_json`] as a piece of a request body, shared, not copied.
    pub(crate) fn wire_piece(&self) -> Bytes {
        self.piece.clone()
    }
}

impl From<Vec<ToolDef>> for ToolDefs {
    fn from(defs: Vec<ToolDef>) -> Self {
        let json = match serde_json::to_value(&defs) {
            Ok(value) => value.to_string(),
            // Unreachable for these types (string keys only); no tools rather than a crash.
            Err(e) => {
                tracing::error!(error = %e, "could not serialize the tool definitions");
                "[]".to_owned()
            }
        };
        let json: Arc<str> = json.into();
        ToolDefs {
            defs: defs.into(),
            piece: Bytes::from_owner(SharedText(json.clone())),
            json,
        }
    }
}

impl FromIterator<ToolDef> for ToolDefs {
    fn from_iter<I: IntoIterator<Item = ToolDef>>(iter: I) -> Self {
        iter.into_iter().collect::<Vec<_>>().into()
    }
}

impl Default for ToolDefs {
    fn default() -> Self {
        Vec::new().into()
    }
}

impl Deref for ToolDefs {
    type Target = [ToolDef];

    fn deref(&self) -> &[ToolDef] {
        &self.defs
    }
}

impl std::fmt::Debug for ToolDefs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.defs.iter()).finish()
    }
}

impl PartialEq for ToolDefs {
    fn eq(&self, other: &Self) -> bool {
        self.defs == other.defs
    }
}

impl Serialize for ToolDefs {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.defs.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for ToolDefs {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Vec::<ToolDef>::deserialize(deserializer).map(ToolDefs::from)
    }
}

/// How the model may use tools.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolChoice {
    /// The model decides.
    Auto,
    /// No tools this time.
    None,
    /// The model must call a tool.
    Required,
}

/// Everything the client needs for one completion; the client adds `stream: true` and
/// `stream_options`, and leaves out tool fields when there are no tools (the API refuses
/// `parallel_tool_calls` without `tools`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    /// Model name, as the provider spells it.
    pub model: String,
    /// The conversation, system prompt first.
    pub messages: Vec<Message>,
    /// Tools offered this time (shared, see [`ToolDefs`]).
    #[serde(default, skip_serializing_if = "ToolDefs::is_empty")]
    pub tools: ToolDefs,
    /// How tools may be used; provider default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoice>,
    /// Whether the model may call several tools in one response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
    /// Sampling temperature; provider default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// Upper bound on generated tokens; provider default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<u32>,
    /// OpenAI's `prompt_cache_key`: requests with the same key are routed to the same
    /// cache, so a chat's turns keep hitting its cached prefix. One per chat, derived from
    /// its session key ([`prompt_cache_key`]); other providers leave it out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_cache_key: Option<String>,
}

/// The prompt-cache key of the chat `session`: a stable hash (FNV-1a, the same in every
/// process), so the provider sees no chat id.
pub fn prompt_cache_key(session: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in session.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("parlor-{hash:016x}")
}

/// The text part that takes the place of an image reference left in a request.
pub(crate) const UNSHOWN_IMAGE: &str = "[an image was attached here but could not be shown]";

impl ChatRequest {
    /// Whether a message still holds a parlor-internal part (see [`ChatRequest::wire_form`]).
    pub(crate) fn holds_internal_parts(&self) -> bool {
        self.messages.iter().any(|m| {
            matches!(m, Message::User { content: Content::Parts(parts) } if parts.iter().any(ContentPart::is_internal))
        })
    }

    /// This request as it may be sent: every parlor-internal part (an unresolved
    /// [`ContentPart::ImageRef`]) replaced by a text part saying an image was not shown.
    /// The agent resolves references before it builds a request, so this is the last line of
    /// defence, not the way images are handled; borrowed when there is nothing to replace.
    pub fn wire_form(&self) -> Cow<'_, ChatRequest> {
        if !self.holds_internal_parts() {
            return Cow::Borrowed(self);
        }
        tracing::warn!("a request still held image references; they are sent as text");
        let mut request = self.clone();
        for message in &mut request.messages {
            if let Message::User {
                content: Content::Parts(parts),
            } = message
            {
                for part in parts.iter_mut().filter(|p| p.is_internal()) {
                    *part = ContentPart::Text {
                        text: UNSHOWN_IMAGE.to_owned(),
                    };
                }
            }
        }
        Cow::Owned(request)
    }
}

/// Token counts the provider reported.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens in the prompt, cached ones included (OpenAI counts them in; for Anthropic,
    /// which does not, the client adds its cache reads and writes).
    #[serde(default)]
    pub prompt_tokens: u64,
    /// Tokens generated.
    #[serde(default)]
    pub completion_tokens: u64,
    /// Their sum, as the provider reported it.
    #[serde(default)]
    pub total_tokens: u64,
    /// Prompt tokens read from the provider's prompt cache (billed at a fraction). Left out
    /// of the stored JSON when zero, so records written before it existed read the same.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_read_tokens: u64,
    /// Prompt tokens written to the provider's prompt cache (Anthropic bills them above the
    /// normal rate); zero for providers that cache on their own.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_write_tokens: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Usage {
    /// Adds another request's usage to this one.
    pub fn add(&mut self, other: &Usage) {
        self.prompt_tokens += other.prompt_tokens;
        self.completion_tokens += other.completion_tokens;
        self.total_tokens += other.total_tokens;
        self.cache_read_tokens += other.cache_read_tokens;
        self.cache_write_tokens += other.cache_write_tokens;
    }
}

/// One assembled completion (choice 0 of the stream).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Completion {
    /// Visible text.
    pub content: String,
    /// `reasoning_content` (DeepSeek, xAI...) or Anthropic's thinking text, kept for the
    /// log, never shown or sent back as text.
    pub reasoning: String,
    /// Anthropic's thinking blocks with their signatures, in order; carried into the
    /// assistant message ([`Completion::to_message`]) so they can be replayed. Empty for
    /// OpenAI-compatible providers.
    pub thinking: Vec<ThinkingBlock>,
    /// Tool calls, ordered by their stream `index`.
    pub tool_calls: Vec<ToolCall>,
    /// `stop`, `tool_calls`, `length`, ... when the stream said.
    pub finish_reason: Option<String>,
    /// Usage, when the provider sent it.
    pub usage: Option<Usage>,
    /// The model that answered, when a [`Failover`](super::Failover) chain says which;
    /// `None`: the one asked for.
    pub model: Option<String>,
}

impl Completion {
    /// The assistant message to store in history for this completion.
    pub fn to_message(&self) -> Message {
        Message::Assistant {
            content: if self.content.is_empty() && !self.tool_calls.is_empty() {
                None
            } else {
                Some(self.content.clone())
            },
            tool_calls: self.tool_calls.clone(),
            thinking: self.thinking.clone(),
            model: self.model.clone(),
        }
    }
}
