//! Assembles streamed chat-completion chunks into a [`Completion`].
//!
//! Providers that claim OpenAI compatibility disagree in the details, so the assembler is
//! deliberately lenient about shape and strict only where leniency would corrupt the result:
//!
//! - tool-call deltas are keyed by their `index`, which need not start at 0 (Anthropic's
//!   compatibility layer starts at 1); a delta without `index` continues the call with the
//!   same id, or the last call when it carries no id;
//! - names and arguments are appended, the first non-empty id is kept (Alibaba and Mistral
//!   repeat `"id":""` / `"name":""` in later deltas);
//! - `choices` may be empty or absent (usage-only chunks, Azure's filter-results chunk);
//! - `reasoning_content` (DeepSeek, xAI, Moonshot) or `reasoning` (OpenRouter, vLLM) is kept
//!   apart from the visible text;
//! - unknown fields are ignored, `null` is the same as absent, the last `usage` seen wins
//!   (Perplexity repeats a growing usage in every chunk);
//! - `{"error": ...}` is an error, never text; data that is not JSON is [`LlmError::Malformed`].
//!
//! SSE framing is left to `sse-parse`, through [`for_each_data`] (the Anthropic client's too).

use std::borrow::Cow;
use std::collections::BTreeMap;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use serde::Deserialize;
use serde_json::Value;
use sse_parse::SseParser;

use super::LlmError;
use super::wire::{Completion, ToolCall, Usage};

/// Upper bound on the bytes one response may carry. A completion is at most a few hundred
/// kilobytes; anything far beyond is a misbehaving server, not an answer worth buffering.
pub const MAX_STREAM_BYTES: usize = 32 * 1024 * 1024;

/// How much of offending data an error message quotes: enough to recognise it in the log,
/// not enough to flood it.
const PREVIEW_CHARS: usize = 200;

/// Accumulates the chunks of one streamed completion, every choice separately.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StreamAssembler {
    choices: BTreeMap<u32, ChoiceState>,
    usage: Option<Usage>,
    chunks: usize,
    done: bool,
}

/// What has arrived so far for one choice.
#[derive(Debug, Clone, Default, PartialEq)]
struct ChoiceState {
    content: String,
    reasoning: String,
    tool_calls: BTreeMap<u32, PartialCall>,
    finish_reason: Option<String>,
}

/// A tool call whose name and arguments may still be growing.
#[derive(Debug, Clone, Default, PartialEq)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

// The raw chunk is read into typed structs rather than a `Value` tree: unknown fields are
// skipped without allocating, which matters for long streams. Fields whose type providers do
// not agree on stay `Value` and are interpreted leniently below.

#[derive(Deserialize)]
struct RawChunk<'a> {
    #[serde(default, borrow)]
    choices: Option<Vec<RawChoice<'a>>>,
    #[serde(default)]
    usage: Option<Value>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Deserialize)]
struct RawChoice<'a> {
    #[serde(default)]
    index: Option<u32>,
    // A non-streaming `chat.completion` carries `message` where a chunk carries `delta`; the
    // alias lets a server that ignored `stream: true` go through the same code.
    #[serde(default, alias = "message", borrow)]
    delta: Option<RawDelta<'a>>,
    #[serde(default, borrow)]
    finish_reason: Text<'a>,
    // Moonshot puts usage inside the choice.
    #[serde(default)]
    usage: Option<Value>,
}

#[derive(Deserialize)]
struct RawDelta<'a> {
    #[serde(default, borrow)]
    content: Text<'a>,
    #[serde(default, borrow)]
    reasoning_content: Text<'a>,
    #[serde(default, borrow)]
    reasoning: Text<'a>,
    #[serde(default)]
    tool_calls: Option<Vec<RawToolCall>>,
}

#[derive(Deserialize)]
struct RawToolCall {
    #[serde(default)]
    index: Option<u32>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<RawFunction>,
}

#[derive(Deserialize)]
struct RawFunction {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<Value>,
}

/// A text field of a delta: most chunks carry a string, read in place when it holds no
/// escapes (no allocation per chunk); some providers send content parts instead. Any
/// other JSON (a number, an object) carries no text and is skipped.
#[derive(Default)]
enum Text<'a> {
    #[default]
    Absent,
    Str(Cow<'a, str>),
    Parts(Vec<Value>),
}

impl Text<'_> {
    fn as_str(&self) -> Option<&str> {
        match self {
            Text::Str(s) => Some(s),
            Text::Absent | Text::Parts(_) => None,
        }
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = Text<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string, content parts or null")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Text<'a>, E> {
                Ok(Text::Str(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Text<'a>, E> {
                Ok(Text::Str(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Text<'a>, E> {
                Ok(Text::Str(Cow::Owned(v)))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Text<'a>, A::Error> {
                let mut parts = Vec::new();
                while let Some(part) = seq.next_element::<Value>()? {
                    parts.push(part);
                }
                Ok(Text::Parts(parts))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Text<'a>, A::Error> {
                while map
                    .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(Text::Absent)
            }
            fn visit_unit<E>(self) -> Result<Text<'a>, E> {
                Ok(Text::Absent)
            }
            fn visit_none<E>(self) -> Result<Text<'a>, E> {
                Ok(Text::Absent)
            }
            fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Text<'a>, D::Error> {
                d.deserialize_any(self)
            }
            fn visit_bool<E>(self, _: bool) -> Result<Text<'a>, E> {
                Ok(Text::Absent)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Text<'a>, E> {
                Ok(Text::Absent)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Text<'a>, E> {
                Ok(Text::Absent)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Text<'a>, E> {
                Ok(Text::Absent)
            }
        }
        deserializer.deserialize_any(Visit(std::marker::PhantomData))
    }
}

impl StreamAssembler {
    /// An assembler that has seen nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Consumes the `data` field of one SSE event. Returns `Ok(true)` once `[DONE]` has
    /// arrived (later data is ignored), `Ok(false)` otherwise.
    ///
    /// # Errors
    /// [`LlmError::Stream`] for an `{"error": ...}` chunk, [`LlmError::Malformed`] for data
    /// that is not a JSON object of the chunk shape.
    pub fn push_data(&mut self, data: &str) -> Result<bool, LlmError> {
        if self.done {
            return Ok(true);
        }
        let data = data.trim();
        if data.is_empty() {
            return Ok(false);
        }
        if data == "[DONE]" {
            self.done = true;
            return Ok(true);
        }
        let chunk: RawChunk = serde_json::from_str(data).map_err(|e| {
            LlmError::Malformed(format!(
                "not a chat-completion chunk ({e}): {}",
                preview(data)
            ))
        })?;
        if let Some(error) = chunk.error.filter(|e| !e.is_null()) {
            return Err(LlmError::Stream(error_message(&error)));
        }
        self.chunks += 1;
        self.record_usage(chunk.usage);
        for choice in chunk.choices.unwrap_or_default() {
            self.record_usage(choice.usage);
            let state = self.choices.entry(choice.index.unwrap_or(0)).or_default();
            // Some servers send `""` instead of `null` while the choice is still running.
            let reason = choice.finish_reason.as_str();
            if let Some(reason) = reason.filter(|r| !r.is_empty()) {
                state.finish_reason = Some(reason.to_owned());
            }
            if let Some(delta) = choice.delta {
                state.apply(delta);
            }
        }
        Ok(false)
    }

    /// How many chunk JSONs were consumed (`[DONE]` is not a chunk).
    pub fn chunks(&self) -> usize {
        self.chunks
    }

    /// Whether `[DONE]` has arrived.
    pub fn done(&self) -> bool {
        self.done
    }

    /// The last usage the provider reported, if any.
    pub fn usage(&self) -> Option<&Usage> {
        self.usage.as_ref()
    }

    /// Every choice assembled so far, by its `index` (several only when `n > 1`). Each
    /// carries the response's usage, which providers report for the whole response.
    pub fn completions(&self) -> BTreeMap<u32, Completion> {
        self.choices
            .iter()
            .map(|(&index, state)| (index, state.to_completion(self.usage.clone())))
            .collect()
    }

    /// The completion of choice 0 (of the lowest index present, should a provider not
    /// start at 0); an empty completion when no choice arrived.
    pub fn finish(self) -> Completion {
        let usage = self.usage;
        match self.choices.into_iter().next() {
            Some((_, state)) => state.to_completion(usage),
            None => Completion {
                usage,
                ..Completion::default()
            },
        }
    }

    fn record_usage(&mut self, usage: Option<Value>) {
        let Some(usage) = usage.filter(Value::is_object) else {
            return;
        };
        // OpenAI reports cache hits inside `prompt_tokens_details` (already counted in
        // `prompt_tokens`); the typed read below does not look there.
        let cached = usage
            .pointer("/prompt_tokens_details/cached_tokens")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        // A usage of an unexpected shape is not worth failing the completion for.
        match serde_json::from_value::<Usage>(usage) {
            Ok(usage) => {
                self.usage = Some(Usage {
                    cache_read_tokens: cached,
                    ..usage
                });
            }
            Err(e) => tracing::debug!(error = %e, "ignoring unreadable usage in LLM stream"),
        }
    }
}

impl ChoiceState {
    fn apply(&mut self, delta: RawDelta) {
        push_text(&mut self.content, &delta.content);
        // Some servers send the same text under both names; take one.
        match (&delta.reasoning_content, &delta.reasoning) {
            (Text::Absent, r) | (r, _) => push_text(&mut self.reasoning, r),
        }
        for call in delta.tool_calls.unwrap_or_default() {
            self.apply_tool_call(call);
        }
    }

    fn apply_tool_call(&mut self, delta: RawToolCall) {
        let id = delta.id.filter(|id| !id.is_empty());
        let index = delta
            .index
            .unwrap_or_else(|| self.infer_index(id.as_deref()));
        let call = self.tool_calls.entry(index).or_default();
        if call.id.is_empty()
            && let Some(id) = id
        {
            call.id = id;
        }
        let Some(function) = delta.function else {
            return;
        };
        if let Some(name) = function.name.filter(|n| !n.is_empty()) {
            // A provider that repeats the whole name in every delta must not double it; a
            // name genuinely streamed as two equal halves is not a real-world case.
            if call.name != name {
                call.name.push_str(&name);
            }
        }
        match function.arguments {
            Some(Value::String(args)) => call.arguments.push_str(&args),
            None | Some(Value::Null) => {}
            // Arguments sent as a JSON object instead of JSON text: keep them as text.
            Some(other) => call.arguments.push_str(&other.to_string()),
        }
    }

    /// Where a tool-call delta without `index` belongs: the call with the same id, a new call
    /// for a new id, otherwise the call being streamed.
    fn infer_index(&self, id: Option<&str>) -> u32 {
        let last = self.tool_calls.keys().next_back().copied();
        match id {
            Some(id) => self
                .tool_calls
                .iter()
                .find(|(_, call)| call.id == id)
                .map(|(&index, _)| index)
                .unwrap_or_else(|| last.map_or(0, |i| i.saturating_add(1))),
            None => last.unwrap_or(0),
        }
    }

    fn to_completion(&self, usage: Option<Usage>) -> Completion {
        Completion {
            model: None,
            content: self.content.clone(),
            reasoning: self.reasoning.clone(),
            tool_calls: self
                .tool_calls
                .iter()
                .map(|(index, call)| {
                    // The tool message answering a call must name its id; a provider that
                    // sent none still gets a stable, unique one.
                    let id = if call.id.is_empty() {
                        format!("call_{index}")
                    } else {
                        call.id.clone()
                    };
                    ToolCall::new(id, call.name.clone(), call.arguments.clone())
                })
                .collect(),
            finish_reason: self.finish_reason.clone(),
            usage,
            thinking: Vec::new(),
        }
    }
}

/// Appends text that a provider sent as a string, or as content parts (`[{"type":"text",
/// "text":...}]`); other part types (images, "thinking" blocks) are not visible text.
fn push_text(out: &mut String, value: &Text) {
    match value {
        Text::Str(s) => out.push_str(s),
        Text::Parts(parts) => {
            for part in parts {
                let is_text = part
                    .get("type")
                    .and_then(Value::as_str)
                    .is_none_or(|t| t == "text");
                if let (true, Some(text)) = (is_text, part.get("text").and_then(Value::as_str)) {
                    out.push_str(text);
                }
            }
        }
        Text::Absent => {}
    }
}

/// A one-line description of an `error` object as providers send it (`{"message", "type",
/// "code"}`, or just a string).
pub(crate) fn error_message(error: &Value) -> String {
    let message = match error {
        Value::String(s) => return s.clone(),
        Value::Object(map) => map.get("message").and_then(Value::as_str),
        _ => None,
    };
    let Some(message) = message else {
        return preview(&error.to_string());
    };
    let mut out = message.to_owned();
    for key in ["type", "code"] {
        match error.get(key) {
            Some(Value::String(s)) => out.push_str(&format!(" ({key}: {s})")),
            Some(Value::Number(n)) => out.push_str(&format!(" ({key}: {n})")),
            _ => {}
        }
    }
    out
}

/// The first [`PREVIEW_CHARS`] characters of `text`, marked when cut.
pub(crate) fn preview(text: &str) -> String {
    crate::text::ellipsize(text, PREVIEW_CHARS).into_owned()
}

/// Reads an SSE byte stream to its end (or to `[DONE]`) and returns the assembler holding
/// every choice. Chunk boundaries may fall anywhere, also inside a UTF-8 character.
///
/// A stream that ends without `[DONE]` is accepted (several providers never send it); a
/// last line missing only its blank-line terminator still counts. A cut-off final line is
/// dropped.
///
/// # Errors
/// The transport's own error, converted; [`LlmError::Stream`] for an error chunk;
/// [`LlmError::Malformed`] for data that is not a chunk, more than [`MAX_STREAM_BYTES`], or a
/// stream that carried no chunk at all. Bytes that are not UTF-8 are read as U+FFFD.
pub async fn assemble<S, E>(bytes: S) -> Result<StreamAssembler, LlmError>
where
    S: Stream<Item = Result<Bytes, E>>,
    E: Into<LlmError>,
{
    let mut assembler = StreamAssembler::new();
    for_each_data(bytes, |data| assembler.push_data(data)).await?;
    if assembler.chunks() == 0 {
        return Err(LlmError::Malformed(
            "empty response: the stream ended before any chat-completion chunk".to_owned(),
        ));
    }
    Ok(assembler)
}

/// Reads the server-sent events of `bytes` and hands each event's data to `on_data`, until
/// `on_data` says it has seen the last one (`Ok(true)`, then this returns `Ok(true)`) or the
/// stream ends (`Ok(false)`). Each read is fed to `sse-parse` as it comes: it finds the lines
/// with `memchr` and keeps only an unfinished line between reads.
///
/// A stream that ends on a complete line but without the blank line that dispatches its
/// last event still dispatches it; a cut-off final line is dropped. Bytes that are not UTF-8
/// are read as U+FFFD (the data is then no valid chunk, or the text shows the mark).
///
/// # Errors
/// The transport's own error, converted; [`LlmError::Malformed`] past [`MAX_STREAM_BYTES`];
/// whatever `on_data` returns.
pub(crate) async fn for_each_data<S, E, F>(bytes: S, mut on_data: F) -> Result<bool, LlmError>
where
    S: Stream<Item = Result<Bytes, E>>,
    E: Into<LlmError>,
    F: FnMut(&str) -> Result<bool, LlmError>,
{
    let mut bytes = std::pin::pin!(bytes);
    let mut parser = SseParser::new();
    let mut total = 0usize;
    let mut last_byte = None;
    while let Some(read) = bytes.next().await {
        let read = read.map_err(Into::into)?;
        total = total.saturating_add(read.len());
        if total > MAX_STREAM_BYTES {
            return Err(LlmError::Malformed(format!(
                "the response exceeds {MAX_STREAM_BYTES} bytes"
            )));
        }
        parser.feed(&read);
        if let Some(&byte) = read.last() {
            last_byte = Some(byte);
        }
        if dispatch(&mut parser, &mut on_data)? {
            return Ok(true);
        }
    }
    if last_byte == Some(b'\n') {
        parser.feed(b"\n");
        return dispatch(&mut parser, &mut on_data);
    }
    Ok(false)
}

/// Hands the events `parser` completed to `on_data`; `Ok(true)` once it saw the last one.
fn dispatch(
    parser: &mut SseParser,
    on_data: &mut impl FnMut(&str) -> Result<bool, LlmError>,
) -> Result<bool, LlmError> {
    while let Some(event) = parser.next_event() {
        if on_data(&event.data)? {
            return Ok(true);
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The data of the events `for_each_data` finds in `reads`, and whether it stopped early
    /// (at data `stop`).
    fn events(reads: &[&[u8]]) -> (Vec<String>, bool) {
        let stream = futures::stream::iter(
            reads
                .iter()
                .map(|r| Ok::<_, LlmError>(Bytes::copy_from_slice(r)))
                .collect::<Vec<_>>(),
        );
        let mut got = Vec::new();
        let stopped = futures::executor::block_on(for_each_data(stream, |data| {
            got.push(data.to_owned());
            Ok(data == "stop")
        }))
        .expect("events");
        (got, stopped)
    }

    #[test]
    fn events_are_found_across_reads_and_with_crlf() {
        let (got, stopped) = events(&[
            b"data: a\n\ndata: b\n",
            b"\n: a comment\ndata: c\r\n\r\ndat",
            b"a: d\ndata\n",
        ]);
        // The last event had no dispatching blank line; a line without a colon is a field
        // with an empty value.
        assert_eq!(got, ["a", "b", "c", "d\n"]);
        assert!(!stopped);
    }

    #[test]
    fn a_cut_off_line_is_dropped_and_a_character_may_be_split() {
        let (got, _) = events(&[b"data: \xc3", b"\xa9\n\ndata: cut"]);
        assert_eq!(got, ["\u{e9}"]);
        let (got, _) = events(&[b"data: \xff\n\n"]);
        assert_eq!(got, ["\u{fffd}"]);
    }

    #[test]
    fn reading_stops_where_the_data_says_so() {
        let (got, stopped) = events(&[b"data: a\n\ndata: stop\n\ndata: b\n\n"]);
        assert_eq!(got, ["a", "stop"]);
        assert!(stopped);
    }

    #[test]
    fn a_response_past_the_bound_is_refused() {
        let big = Bytes::from(vec![b'x'; MAX_STREAM_BYTES]);
        let stream = futures::stream::iter([Ok::<_, LlmError>(big), Ok(Bytes::from_static(b"y"))]);
        let err = futures::executor::block_on(for_each_data(stream, |_| Ok(false)))
            .expect_err("too long");
        assert!(err.to_string().contains("exceeds"), "{err}");
    }
}
