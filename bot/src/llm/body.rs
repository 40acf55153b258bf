//! The request body as bytes, written straight from the borrowed [`ChatRequest`].
//!
//! [`OpenAiClient::request_body`] builds the body as a `serde_json::Value`, the plain
//! statement of what is sent. Sending that `Value` copied every message and every tool schema
//! of every request into a tree of maps, only to serialize it and drop it again; writing from
//! the request itself costs a fraction of that. The bytes are exactly those of the `Value`,
//! serialized (the tests compare them for every request shape): a `Value` keeps object keys
//! sorted, so every object here writes its keys in sorted order, and the tools are
//! [`ToolDefs::wire_json`], serialized once through a `Value`.
//!
//! [`OpenAiClient::request_body`]: super::OpenAiClient::request_body
//! [`ToolDefs::wire_json`]: super::ToolDefs::wire_json

use std::sync::{Mutex, PoisonError};

use bytes::Bytes;
use serde::Serialize;
use serde::ser::{SerializeStruct, Serializer};

use super::http::Pieces;
use super::wire::{
    ChatRequest, Content, ContentPart, FunctionCall, ImageUrl, Message, ToolCall, UNSHOWN_IMAGE,
};

/// The system messages written lately, with their JSON: a chat's system prompt is the same
/// request after request, and escaping it was the largest part of writing a body. A few
/// are kept, so that chats whose prompts differ do not evict each other at every turn.
#[derive(Debug, Default)]
pub(crate) struct SystemCache {
    /// (content, its message as JSON), most recently used last.
    kept: Mutex<Vec<(String, Bytes)>>,
}

/// How many system prompts [`SystemCache`] keeps.
const SYSTEM_PROMPTS: usize = 8;

impl SystemCache {
    /// The JSON of the system message `content`: kept, or written and kept.
    fn json(&self, content: &str) -> serde_json::Result<Bytes> {
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(at) = kept.iter().position(|(c, _)| c == content) {
            let entry = kept.remove(at);
            let json = entry.1.clone();
            kept.push(entry);
            return Ok(json);
        }
        let json = Bytes::from(serde_json::to_vec(&WireMessage(&Message::System {
            content: content.to_owned(),
        }))?);
        if kept.len() >= SYSTEM_PROMPTS {
            kept.remove(0);
        }
        kept.push((content.to_owned(), json.clone()));
        Ok(json)
    }
}

/// The JSON body POSTed for `request`, as [`super::OpenAiClient::request_body`] describes it.
pub(crate) fn write(request: &ChatRequest) -> Result<Vec<u8>, serde_json::Error> {
    write_with(request, None).map(|body| body.to_vec())
}

/// [`write`] in pieces, taking the system message's JSON from `cache` when it holds it: the
/// kept JSON of the system message and of the tools is shared by the body, not copied.
pub(crate) fn write_with(
    request: &ChatRequest,
    cache: Option<&SystemCache>,
) -> Result<Pieces, serde_json::Error> {
    if request.holds_internal_parts() {
        tracing::warn!("a request still held image references; they are sent as text");
    }
    let tools = !request.tools.is_empty();
    let mut out = Vec::with_capacity(estimate(request, cache.is_some()));
    // Kept JSON, and where in `out` it goes.
    let mut shared: Vec<(usize, Bytes)> = Vec::new();
    let mut body = Object::start(&mut out);
    if let Some(n) = request.max_completion_tokens {
        body.field("max_completion_tokens", &n)?;
    }
    match (cache, request.messages.split_first()) {
        (Some(cache), Some((Message::System { content }, rest))) => {
            body.key("messages");
            body.out.push(b'[');
            shared.push((body.out.len(), cache.json(content)?));
            for message in rest {
                body.out.push(b',');
                serde_json::to_writer(&mut *body.out, &WireMessage(message))?;
            }
            body.out.push(b']');
        }
        _ => body.field("messages", &Messages(&request.messages))?,
    }
    body.field("model", &request.model)?;
    if tools && let Some(parallel) = request.parallel_tool_calls {
        body.field("parallel_tool_calls", &parallel)?;
    }
    if let Some(key) = &request.prompt_cache_key {
        body.field("prompt_cache_key", key)?;
    }
    body.raw("stream", "true");
    body.raw("stream_options", r#"{"include_usage":true}"#);
    if let Some(t) = request.temperature {
        body.field("temperature", &temperature(t))?;
    }
    if tools {
        if let Some(choice) = &request.tool_choice {
            body.field("tool_choice", choice)?;
        }
        body.key("tools");
        shared.push((body.out.len(), request.tools.wire_piece()));
    }
    body.end();
    let out = Bytes::from(out);
    let mut pieces = Pieces::default();
    let mut at = 0;
    for (to, piece) in shared {
        pieces.push(out.slice(at..to));
        pieces.push(piece);
        at = to;
    }
    pieces.push(out.slice(at..));
    Ok(pieces)
}

/// The temperature as `request_body` sends it: through its decimal text, so that 0.7 is
/// 0.7 and not 0.699999988079071 (f32 -> f64); `null` for a value that is not a number.
fn temperature(t: f32) -> Option<f64> {
    Some(t)
        .filter(|t| t.is_finite())
        .and_then(|t| t.to_string().parse::<f64>().ok())
}

/// About the size of what the body's own buffer holds (not the tools, nor a kept system
/// message), so that it grows once or not at all.
fn estimate(request: &ChatRequest, kept_system: bool) -> usize {
    let text: usize = request
        .messages
        .iter()
        .enumerate()
        .map(|(at, m)| match m {
            Message::System { .. } if at == 0 && kept_system => 0,
            Message::System { content } => content.len(),
            Message::User {
                content: Content::Text(text),
            } => text.len(),
            Message::User {
                content: Content::Parts(parts),
            } => parts
                .iter()
                .map(|p| match p {
                    ContentPart::Text { text } => text.len(),
                    ContentPart::ImageUrl { image_url } => image_url.url.len(),
                    ContentPart::ImageRef { .. } => UNSHOWN_IMAGE.len(),
                })
                .sum(),
            Message::Assistant {
                content,
                tool_calls,
                ..
            } => {
                content.as_ref().map_or(0, String::len)
                    + tool_calls
                        .iter()
                        .map(|c| c.function.arguments.len() + 64)
                        .sum::<usize>()
            }
            Message::Tool { content, .. } => content.len() + 32,
        })
        .sum();
    // Escapes, keys and punctuation: a little over the text.
    text + text / 8 + 64 * request.messages.len() + 256
}

/// A JSON object written key by key; the caller gives the keys in sorted order.
struct Object<'a> {
    out: &'a mut Vec<u8>,
    first: bool,
}

impl<'a> Object<'a> {
    fn start(out: &'a mut Vec<u8>) -> Self {
        out.push(b'{');
        Object { out, first: true }
    }

    /// `key` is one of this module's constant names: plain ASCII, nothing to escape.
    fn key(&mut self, key: &str) {
        if !self.first {
            self.out.push(b',');
        }
        self.first = false;
        self.out.push(b'"');
        self.out.extend_from_slice(key.as_bytes());
        self.out.extend_from_slice(b"\":");
    }

    fn field<T: Serialize + ?Sized>(&mut self, key: &str, value: &T) -> serde_json::Result<()> {
        self.key(key);
        serde_json::to_writer(&mut *self.out, value)
    }

    /// A value that is JSON already.
    fn raw(&mut self, key: &str, json: &str) {
        self.key(key);
        self.out.extend_from_slice(json.as_bytes());
    }

    fn end(self) {
        self.out.push(b'}');
    }
}

// The wire views: each serializes a borrowed wire type with its keys in sorted order (the
// derived `Serialize` of the wire types puts `role` and `type` tags first).

struct Messages<'a>(&'a [Message]);

impl Serialize for Messages<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(WireMessage))
    }
}

struct WireMessage<'a>(&'a Message);

impl Serialize for WireMessage<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut m = serializer.serialize_struct("Message", 3)?;
        match self.0 {
            Message::System { content } => {
                m.serialize_field("content", content)?;
                m.serialize_field("role", "system")?;
            }
            Message::User { content } => {
                m.serialize_field("content", &WireContent(content))?;
                m.serialize_field("role", "user")?;
            }
            Message::Assistant {
                content,
                tool_calls,
                ..
            } => {
                if let Some(content) = content {
                    m.serialize_field("content", content)?;
                }
                m.serialize_field("role", "assistant")?;
                if !tool_calls.is_empty() {
                    m.serialize_field("tool_calls", &ToolCalls(tool_calls))?;
                }
            }
            Message::Tool {
                tool_call_id,
                content,
            } => {
                m.serialize_field("content", content)?;
                m.serialize_field("role", "tool")?;
                m.serialize_field("tool_call_id", tool_call_id)?;
            }
        }
        m.end()
    }
}

struct WireContent<'a>(&'a Content);

impl Serialize for WireContent<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Content::Text(text) => serializer.serialize_str(text),
            Content::Parts(parts) => serializer.collect_seq(parts.iter().map(WirePart)),
        }
    }
}

struct WirePart<'a>(&'a ContentPart);

impl Serialize for WirePart<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut m = serializer.serialize_struct("ContentPart", 2)?;
        match self.0 {
            ContentPart::Text { text } => {
                m.serialize_field("text", text)?;
                m.serialize_field("type", "text")?;
            }
            ContentPart::ImageUrl { image_url } => {
                m.serialize_field("image_url", &WireImageUrl(image_url))?;
                m.serialize_field("type", "image_url")?;
            }
            // What `ChatRequest::wire_form` puts in its place.
            ContentPart::ImageRef { .. } => {
                m.serialize_field("text", UNSHOWN_IMAGE)?;
                m.serialize_field("type", "text")?;
            }
        }
        m.end()
    }
}

struct WireImageUrl<'a>(&'a ImageUrl);

impl Serialize for WireImageUrl<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut m = serializer.serialize_struct("ImageUrl", 2)?;
        if let Some(detail) = &self.0.detail {
            m.serialize_field("detail", detail)?;
        }
        m.serialize_field("url", &self.0.url)?;
        m.end()
    }
}

struct ToolCalls<'a>(&'a [ToolCall]);

impl Serialize for ToolCalls<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(WireToolCall))
    }
}

struct WireToolCall<'a>(&'a ToolCall);

impl Serialize for WireToolCall<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut m = serializer.serialize_struct("ToolCall", 3)?;
        m.serialize_field("function", &WireFunctionCall(&self.0.function))?;
        m.serialize_field("id", &self.0.id)?;
        m.serialize_field("type", &self.0.kind)?;
        m.end()
    }
}

struct WireFunctionCall<'a>(&'a FunctionCall);

impl Serialize for WireFunctionCall<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut m = serializer.serialize_struct("FunctionCall", 2)?;
        m.serialize_field("arguments", &self.0.arguments)?;
        m.serialize_field("name", &self.0.name)?;
        m.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(system: &str, user: &str) -> ChatRequest {
        crate::testing::chat_request("m", vec![Message::system(system), Message::user(user)])
    }

    #[test]
    fn a_kept_system_prompt_writes_the_same_bytes() {
        let cache = SystemCache::default();
        // More prompts than are kept, each asked twice, with escapes in them.
        for round in 0..2 {
            for n in 0..SYSTEM_PROMPTS + 2 {
                let r = request(&format!("You are \"parlor\" #{n}.\n\u{1}\\"), "hi\n");
                let plain = write(&r).unwrap();
                assert_eq!(
                    write_with(&r, Some(&cache)).unwrap().to_vec(),
                    plain,
                    "{round} {n}"
                );
            }
        }
        assert_eq!(cache.kept.lock().unwrap().len(), SYSTEM_PROMPTS);
        // No system message first: written as before.
        let mut r = request("s", "u");
        r.messages.remove(0);
        assert_eq!(
            write_with(&r, Some(&cache)).unwrap().to_vec(),
            write(&r).unwrap()
        );
        r.messages.clear();
        assert_eq!(
            write_with(&r, Some(&cache)).unwrap().to_vec(),
            write(&r).unwrap()
        );
    }
}
