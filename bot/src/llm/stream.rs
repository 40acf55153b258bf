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
//! [`assemble`] does the SSE framing itself (`SseEvents`): only `data` fields matter here.

use std::collections::BTreeMap;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use serde::Deserialize;
use serde_json::Value;

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
struct RawChunk {
    #[serde(default)]
    choices: Option<Vec<RawChoice>>,
    #[serde(default)]
    usage: Option<Value>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Deserialize)]
struct RawChoice {
    #[serde(default)]
    index: Option<u32>,
    // A non-streaming `chat.completion` carries `message` where a chunk carries `delta`; the
    // alias lets a server that ignored `stream: true` go through the same code.
    #[serde(default, alias = "message")]
    delta: Option<RawDelta>,
    #[serde(default)]
    finish_reason: Option<Value>,
    // Moonshot puts usage inside the choice.
    #[serde(default)]
    usage: Option<Value>,
}

#[derive(Deserialize)]
struct RawDelta {
    #[serde(default)]
    content: Option<Value>,
    #[serde(default)]
    reasoning_content: Option<Value>,
    #[serde(default)]
    reasoning: Option<Value>,
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
            let reason = choice.finish_reason.as_ref().and_then(Value::as_str);
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
        // A usage of an unexpected shape is not worth failing the completion for.
        match serde_json::from_value::<Usage>(usage) {
            Ok(usage) => self.usage = Some(usage),
            Err(e) => tracing::debug!(error = %e, "ignoring unreadable usage in LLM stream"),
        }
    }
}

impl ChoiceState {
    fn apply(&mut self, delta: RawDelta) {
        if let Some(content) = &delta.content {
            push_text(&mut self.content, content);
        }
        // Some servers send the same text under both names; take one.
        match (&delta.reasoning_content, &delta.reasoning) {
            (Some(r), _) if !r.is_null() => push_text(&mut self.reasoning, r),
            (_, Some(r)) => push_text(&mut self.reasoning, r),
            _ => {}
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
        }
    }
}

/// Appends text that a provider sent as a string, or as content parts (`[{"type":"text",
/// "text":...}]`); other part types (images, "thinking" blocks) are not visible text.
fn push_text(out: &mut String, value: &Value) {
    match value {
        Value::String(s) => out.push_str(s),
        Value::Array(parts) => {
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
        _ => {}
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
fn preview(text: &str) -> String {
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
/// [`LlmError::Malformed`] for data that is not a chunk, bytes that are not UTF-8, more than
/// [`MAX_STREAM_BYTES`], or a stream that carried no chunk at all.
pub async fn assemble<S, E>(bytes: S) -> Result<StreamAssembler, LlmError>
where
    S: Stream<Item = Result<Bytes, E>>,
    E: Into<LlmError>,
{
    let mut bytes = std::pin::pin!(bytes);
    let mut assembler = StreamAssembler::new();
    let mut events = SseEvents::default();
    let mut total = 0usize;
    let mut on_data = |data: &str| assembler.push_data(data);
    let mut done = false;
    while let Some(piece) = bytes.next().await {
        let piece = piece.map_err(Into::into)?;
        total = total.saturating_add(piece.len());
        if total > MAX_STREAM_BYTES {
            return Err(LlmError::Malformed(format!(
                "the response exceeds {MAX_STREAM_BYTES} bytes"
            )));
        }
        if events.feed(&piece, &mut on_data)? {
            done = true;
            break;
        }
    }
    if !done {
        events.end(&mut on_data)?;
    }
    if assembler.chunks() == 0 {
        return Err(LlmError::Malformed(
            "empty response: the stream ended before any chat-completion chunk".to_owned(),
        ));
    }
    Ok(assembler)
}

/// Server-sent events framing (the HTML standard's "event stream" parsing), reduced to what
/// a completion needs: the `data` of each event. Lines end with LF, CRLF or CR; a line
/// starting with `:` is a comment; `data` lines of one event are joined with LF; a blank
/// line dispatches the event; every other field (`event`, `id`, `retry`) is ignored; a
/// byte order mark at the start is skipped.
///
/// It replaces `eventsource-stream`, whose parser went through the text character by
/// character with parser combinators and allocated several strings per line: the largest
/// cost of reading a stream after the JSON of its chunks. The result does not depend on
/// where the pieces are cut: a line is handled once it is complete, and a CR that ends a
/// piece waits for the next byte (it may be the first half of a CRLF).
#[derive(Default)]
struct SseEvents {
    /// The start of a line whose end has not arrived yet.
    line: Vec<u8>,
    /// `line` ended with a CR, at the end of the last piece.
    cr_pending: bool,
    /// The `data` lines of the event being read, each followed by LF.
    data: String,
    /// Whether a line was handled yet (a byte order mark can only be first).
    started: bool,
    /// Whether the last byte seen was LF: the end of the stream then counts as a blank line.
    ended_with_lf: bool,
}

/// Called with each event's data; `Ok(true)` stops the stream (`[DONE]`).
type OnData<'a> = dyn FnMut(&str) -> Result<bool, LlmError> + 'a;

impl SseEvents {
    /// Consumes one piece of the stream; `Ok(true)` once `on_data` asked to stop.
    fn feed(&mut self, mut piece: &[u8], on_data: &mut OnData<'_>) -> Result<bool, LlmError> {
        let Some(&last) = piece.last() else {
            return Ok(false);
        };
        self.ended_with_lf = last == b'\n';
        if self.cr_pending {
            self.cr_pending = false;
            if let Some(rest) = piece.strip_prefix(b"\n") {
                piece = rest;
            }
            if self.complete_line(&[], on_data)? {
                return Ok(true);
            }
        }
        while let Some(end) = piece.iter().position(|&b| b == b'\n' || b == b'\r') {
            let (line, rest) = piece.split_at(end);
            let eol = match rest {
                [b'\r'] => {
                    self.line.extend_from_slice(line);
                    self.cr_pending = true;
                    return Ok(false);
                }
                [b'\r', b'\n', ..] => 2,
                _ => 1,
            };
            piece = &rest[eol..];
            if self.complete_line(line, on_data)? {
                return Ok(true);
            }
        }
        self.line.extend_from_slice(piece);
        Ok(false)
    }

    /// The stream ended (without `[DONE]`): a cut-off line is dropped, though bytes that are
    /// not UTF-8 are an error there as anywhere; the event being read counts if the stream
    /// ended with a line feed (then nothing is cut off).
    fn end(&mut self, on_data: &mut OnData<'_>) -> Result<(), LlmError> {
        utf8(&self.line)?;
        if self.ended_with_lf {
            self.handle_line(b"", on_data)?;
        }
        Ok(())
    }

    /// `self.line` followed by `tail` is a complete line: handles it and clears `self.line`.
    fn complete_line(&mut self, tail: &[u8], on_data: &mut OnData<'_>) -> Result<bool, LlmError> {
        if self.line.is_empty() {
            return self.handle_line(tail, on_data);
        }
        let mut line = std::mem::take(&mut self.line);
        line.extend_from_slice(tail);
        let stop = self.handle_line(&line, on_data);
        // The buffer is kept for the next line that arrives in pieces.
        line.clear();
        self.line = line;
        stop
    }

    fn handle_line(&mut self, line: &[u8], on_data: &mut OnData<'_>) -> Result<bool, LlmError> {
        let mut line = utf8(line)?;
        if !self.started {
            self.started = true;
            line = line.strip_prefix('\u{feff}').unwrap_or(line);
        }
        if line.is_empty() {
            if self.data.is_empty() {
                return Ok(false);
            }
            self.data.pop();
            let stop = on_data(&self.data);
            self.data.clear();
            return stop;
        }
        if line.starts_with(':') {
            return Ok(false);
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        if field == "data" {
            self.data.push_str(value);
            self.data.push('\n');
        }
        Ok(false)
    }
}

fn utf8(bytes: &[u8]) -> Result<&str, LlmError> {
    std::str::from_utf8(bytes)
        .map_err(|e| LlmError::Malformed(format!("the stream is not UTF-8: {e}")))
}
