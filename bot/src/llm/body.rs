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
//! Strings are most of a body (the system prompt, the history) and are written by
//! `write_str`, which escapes exactly what serde_json escapes but finds those bytes eight
//! at a time: serde_json's byte-by-byte table lookup was the largest cost left in a request.
//!
//! [`OpenAiClient::request_body`]: super::OpenAiClient::request_body
//! [`ToolDefs::wire_json`]: super::ToolDefs::wire_json

use serde::Serialize;

use super::wire::{ChatRequest, Content, ContentPart, Message, ToolCall, UNSHOWN_IMAGE};

/// The JSON body POSTed for `request`, as [`super::OpenAiClient::request_body`] describes it.
pub(crate) fn write(request: &ChatRequest) -> Result<Vec<u8>, serde_json::Error> {
    if request.holds_internal_parts() {
        tracing::warn!("a request still held image references; they are sent as text");
    }
    let tools = !request.tools.is_empty();
    let mut out = Vec::with_capacity(estimate(request));
    let mut body = Object::start(&mut out);
    if let Some(n) = request.max_completion_tokens {
        body.field("max_completion_tokens", &n)?;
    }
    body.key("messages");
    write_messages(body.out, &request.messages);
    body.key("model");
    write_str(body.out, &request.model);
    if tools && let Some(parallel) = request.parallel_tool_calls {
        body.field("parallel_tool_calls", &parallel)?;
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
        body.raw("tools", request.tools.wire_json());
    }
    body.end();
    Ok(out)
}

/// The temperature as `request_body` sends it: through its decimal text, so that 0.7 is
/// 0.7 and not 0.699999988079071 (f32 -> f64); `null` for a value that is not a number.
fn temperature(t: f32) -> Option<f64> {
    Some(t)
        .filter(|t| t.is_finite())
        .and_then(|t| t.to_string().parse::<f64>().ok())
}

/// About the size of the body, so that the buffer grows once or not at all.
fn estimate(request: &ChatRequest) -> usize {
    let text: usize = request
        .messages
        .iter()
        .map(|m| match m {
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
    text + text / 8 + 64 * request.messages.len() + request.tools.wire_json().len() + 256
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
    fn key(&mut self, key: &'static str) {
        if !self.first {
            self.out.push(b',');
        }
        self.first = false;
        self.out.push(b'"');
        self.out.extend_from_slice(key.as_bytes());
        self.out.extend_from_slice(b"\":");
    }

    /// A field serialized by serde_json (numbers, `tool_choice`).
    fn field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> serde_json::Result<()> {
        self.key(key);
        serde_json::to_writer(&mut *self.out, value)
    }

    /// A value that is JSON already.
    fn raw(&mut self, key: &'static str, json: &str) {
        self.key(key);
        self.out.extend_from_slice(json.as_bytes());
    }

    /// A string field.
    fn str(&mut self, key: &'static str, value: &str) {
        self.key(key);
        write_str(self.out, value);
    }

    fn end(self) {
        self.out.push(b'}');
    }
}

/// A JSON array of the items `write` writes.
fn write_array<T>(out: &mut Vec<u8>, items: &[T], write: impl Fn(&mut Vec<u8>, &T)) {
    out.push(b'[');
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write(out, item);
    }
    out.push(b']');
}

// The derived `Serialize` of the wire types puts the `role` and `type` tags first; these
// write each object with its keys in sorted order, as a `Value` has them.

fn write_messages(out: &mut Vec<u8>, messages: &[Message]) {
    write_array(out, messages, |out, message| {
        let mut m = Object::start(out);
        match message {
            Message::System { content } => {
                m.str("content", content);
                m.str("role", "system");
            }
            Message::User { content } => {
                m.key("content");
                match content {
                    Content::Text(text) => write_str(m.out, text),
                    Content::Parts(parts) => write_array(m.out, parts, write_part),
                }
                m.str("role", "user");
            }
            Message::Assistant {
                content,
                tool_calls,
            } => {
                if let Some(content) = content {
                    m.str("content", content);
                }
                m.str("role", "assistant");
                if !tool_calls.is_empty() {
                    m.key("tool_calls");
                    write_array(m.out, tool_calls, write_tool_call);
                }
            }
            Message::Tool {
                tool_call_id,
                content,
            } => {
                m.str("content", content);
                m.str("role", "tool");
                m.str("tool_call_id", tool_call_id);
            }
        }
        m.end();
    });
}

fn write_part(out: &mut Vec<u8>, part: &ContentPart) {
    let mut m = Object::start(out);
    match part {
        ContentPart::Text { text } => {
            m.str("text", text);
            m.str("type", "text");
        }
        ContentPart::ImageUrl { image_url } => {
            m.key("image_url");
            let mut url = Object::start(m.out);
            if let Some(detail) = &image_url.detail {
                url.str("detail", detail);
            }
            url.str("url", &image_url.url);
            url.end();
            m.str("type", "image_url");
        }
        // What `ChatRequest::wire_form` puts in its place.
        ContentPart::ImageRef { .. } => {
            m.str("text", UNSHOWN_IMAGE);
            m.str("type", "text");
        }
    }
    m.end();
}

fn write_tool_call(out: &mut Vec<u8>, call: &ToolCall) {
    let mut m = Object::start(out);
    m.key("function");
    let mut function = Object::start(m.out);
    function.str("arguments", &call.function.arguments);
    function.str("name", &call.function.name);
    function.end();
    m.str("id", &call.id);
    m.str("type", &call.kind);
    m.end();
}

/// Writes `s` as a JSON string exactly as serde_json does: `"` and `\` escaped with a
/// backslash, the control characters below U+0020 as `\b \t \n \f \r` or `\u00xx`
/// (lower-case hex), every other byte as it is.
fn write_str(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    let mut run = 0;
    while let Some(i) = next_escape(bytes, run) {
        out.extend_from_slice(&bytes[run..i]);
        let byte = bytes[i];
        match byte {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x09 => out.extend_from_slice(b"\\t"),
            0x0A => out.extend_from_slice(b"\\n"),
            0x0C => out.extend_from_slice(b"\\f"),
            0x0D => out.extend_from_slice(b"\\r"),
            _ => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(byte >> 4)]);
                out.push(HEX[usize::from(byte & 0xF)]);
            }
        }
        run = i + 1;
    }
    out.extend_from_slice(&bytes[run..]);
    out.push(b'"');
}

/// Whether a byte must be escaped in a JSON string.
fn needs_escape(byte: u8) -> bool {
    byte < 0x20 || byte == b'"' || byte == b'\\'
}

/// The index of the first byte at or after `from` that must be escaped. Words of eight bytes
/// are skipped while none of their bytes is below 0x20, `"` or `\`; from the first word that
/// holds one, the bytes are searched one by one.
fn next_escape(bytes: &[u8], from: usize) -> Option<usize> {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    // Whether some byte of `x` is zero, or below `n` (n <= 0x80): subtracting borrows into
    // the high bit of exactly such a byte first (the classic "has zero byte" test).
    let has_zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGH != 0;
    let has_less = |x: u64, n: u8| x.wrapping_sub(ONES * u64::from(n)) & !x & HIGH != 0;
    let rest = bytes.get(from..)?;
    let mut skipped = 0;
    for chunk in rest.chunks_exact(8) {
        let mut word = [0; 8];
        word.copy_from_slice(chunk);
        let x = u64::from_ne_bytes(word);
        if has_less(x, 0x20)
            || has_zero(x ^ (ONES * u64::from(b'"')))
            || has_zero(x ^ (ONES * u64::from(b'\\')))
        {
            break;
        }
        skipped += 8;
    }
    rest[skipped..]
        .iter()
        .position(|&b| needs_escape(b))
        .map(|i| from + skipped + i)
}

