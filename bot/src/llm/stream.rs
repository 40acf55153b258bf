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
//! SSE framing, through [`for_each_data`] (the Anthropic client's too): the usual event, one
//! `data:` line, is read in place; any other shape is left to `sse-parse`.

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
// not agree on are interpreted leniently by their own `Deserialize`.

#[derive(Deserialize)]
struct RawChunk<'a> {
    #[serde(default, borrow)]
    choices: Option<Few<RawChoice<'a>>>,
    #[serde(default)]
    usage: RawUsage,
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
    usage: RawUsage,
}

#[derive(Deserialize)]
struct RawDelta<'a> {
    #[serde(default, borrow)]
    content: Text<'a>,
    #[serde(default, borrow)]
    reasoning_content: Text<'a>,
    #[serde(default, borrow)]
    reasoning: Text<'a>,
    #[serde(default, borrow)]
    tool_calls: Option<Few<RawToolCall<'a>>>,
}

#[derive(Deserialize)]
struct RawToolCall<'a> {
    #[serde(default)]
    index: Option<u32>,
    #[serde(default, borrow)]
    id: Option<Str<'a>>,
    #[serde(default, borrow)]
    function: Option<RawFunction<'a>>,
}

#[derive(Deserialize)]
struct RawFunction<'a> {
    #[serde(default, borrow)]
    name: Option<Str<'a>>,
    #[serde(default, borrow)]
    arguments: Option<Arguments<'a>>,
}

/// The elements of a JSON array that almost always holds one (`choices` without `n`, the
/// tool-call deltas of one chunk), in a vector allocated for one: `Vec`'s own visitor starts
/// empty and grows to four through the general growth path. (Keeping the first element
/// inline measured slower: a choice is large, and it is moved several times while read.)
struct Few<T>(Vec<T>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Few<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Visit<T> {
            type Value = Few<T>;
            // The words of `Vec`'s own visitor, so a malformed chunk reads as it always did.
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a sequence")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Few<T>, A::Error> {
                let Some(first) = seq.next_element()? else {
                    return Ok(Few(Vec::new()));
                };
                let mut items = Vec::with_capacity(1);
                items.push(first);
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(Few(items))
            }
        }
        deserializer.deserialize_seq(Visit(std::marker::PhantomData))
    }
}

/// A string field (a tool call's id or name), read in place when it holds no escapes.
struct Str<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Str<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = Str<'a>;
            // The words of `String`'s own visitor, so a malformed chunk reads as it always did.
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Str<'a>, E> {
                Ok(Str(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Str<'a>, E> {
                Ok(Str(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Str<'a>, E> {
                Ok(Str(Cow::Owned(v)))
            }
        }
        deserializer.deserialize_str(Visit(std::marker::PhantomData))
    }
}

/// A tool call's `arguments`: JSON text, as the API specifies, read in place when it holds no
/// escapes; anything else (arguments sent as an object) is kept as a [`Value`] and appended as
/// its JSON text.
enum Arguments<'a> {
    Text(Cow<'a, str>),
    Other(Value),
}

impl<'de: 'a, 'a> Deserialize<'de> for Arguments<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = Arguments<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("any valid JSON value")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Arguments<'a>, E> {
                Ok(Arguments::Text(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Arguments<'a>, E> {
                Ok(Arguments::Text(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Arguments<'a>, E> {
                Ok(Arguments::Text(Cow::Owned(v)))
            }
            fn visit_unit<E>(self) -> Result<Arguments<'a>, E> {
                Ok(Arguments::Other(Value::Null))
            }
            fn visit_bool<E>(self, v: bool) -> Result<Arguments<'a>, E> {
                Ok(Arguments::Other(Value::Bool(v)))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Arguments<'a>, E> {
                Ok(Arguments::Other(Value::from(v)))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Arguments<'a>, E> {
                Ok(Arguments::Other(Value::from(v)))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Arguments<'a>, E> {
                Ok(Arguments::Other(Value::from(v)))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                seq: A,
            ) -> Result<Arguments<'a>, A::Error> {
                Value::deserialize(serde::de::value::SeqAccessDeserializer::new(seq))
                    .map(Arguments::Other)
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<Arguments<'a>, A::Error> {
                Value::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(Arguments::Other)
            }
        }
        deserializer.deserialize_any(Visit(std::marker::PhantomData))
    }
}

/// A `usage` field, read straight into counts instead of through a [`Value`] tree.
///
/// As lenient as reading [`Usage`] from the `Value` was: anything but an object (`null`
/// included) is no usage; an object whose count fields are not all non-negative integers is
/// a usage not worth failing the completion for, ignored; every other field is skipped. Of a
/// key given twice, the last counts, as in a `Value` map.
///
/// The usage is boxed: it comes once a stream, and every chunk's structs are moved a few
/// times while they are read.
#[derive(Default)]
enum RawUsage {
    #[default]
    Absent,
    Unreadable,
    Read(Box<Usage>),
}

/// The keys of a usage object that are read; the others are skipped.
#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "snake_case")]
enum UsageKey {
    PromptTokens,
    CompletionTokens,
    TotalTokens,
    CacheReadTokens,
    CacheWriteTokens,
    PromptTokensDetails,
    #[serde(other)]
    Other,
}

/// Any JSON value, remembered only as a count when it is a non-negative integer (what a
/// `u64` field accepts); other values are skipped.
enum Count {
    Valid(u64),
    Invalid,
}

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Count;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("any valid JSON value")
            }
            fn visit_u64<E>(self, v: u64) -> Result<Count, E> {
                Ok(Count::Valid(v))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Count, E> {
                Ok(u64::try_from(v).map_or(Count::Invalid, Count::Valid))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Count, E> {
                Ok(Count::Invalid)
            }
            fn visit_bool<E>(self, _: bool) -> Result<Count, E> {
                Ok(Count::Invalid)
            }
            fn visit_str<E>(self, _: &str) -> Result<Count, E> {
                Ok(Count::Invalid)
            }
            fn visit_unit<E>(self) -> Result<Count, E> {
                Ok(Count::Invalid)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Count, A::Error> {
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(Count::Invalid)
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Count, A::Error> {
                while map
                    .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(Count::Invalid)
            }
        }
        deserializer.deserialize_any(Visit)
    }
}

/// `prompt_tokens_details.cached_tokens` (OpenAI's cache hits, already counted in
/// `prompt_tokens`): zero when absent or not a count, never a reason to drop the usage.
struct CachedTokens(u64);

impl<'de> Deserialize<'de> for CachedTokens {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(field_identifier, rename_all = "snake_case")]
        enum Key {
            CachedTokens,
            #[serde(other)]
            Other,
        }
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = CachedTokens;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("any valid JSON value")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<CachedTokens, A::Error> {
                let mut cached = 0;
                while let Some(key) = map.next_key::<Key>()? {
                    match key {
                        Key::CachedTokens => {
                            cached = match map.next_value::<Count>()? {
                                Count::Valid(n) => n,
                                Count::Invalid => 0,
                            };
                        }
                        Key::Other => {
                            map.next_value::<serde::de::IgnoredAny>()?;
                        }
                    }
                }
                Ok(CachedTokens(cached))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<CachedTokens, A::Error> {
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(CachedTokens(0))
            }
            fn visit_u64<E>(self, _: u64) -> Result<CachedTokens, E> {
                Ok(CachedTokens(0))
            }
            fn visit_i64<E>(self, _: i64) -> Result<CachedTokens, E> {
                Ok(CachedTokens(0))
            }
            fn visit_f64<E>(self, _: f64) -> Result<CachedTokens, E> {
                Ok(CachedTokens(0))
            }
            fn visit_bool<E>(self, _: bool) -> Result<CachedTokens, E> {
                Ok(CachedTokens(0))
            }
            fn visit_str<E>(self, _: &str) -> Result<CachedTokens, E> {
                Ok(CachedTokens(0))
            }
            fn visit_unit<E>(self) -> Result<CachedTokens, E> {
                Ok(CachedTokens(0))
            }
        }
        deserializer.deserialize_any(Visit)
    }
}

impl<'de> Deserialize<'de> for RawUsage {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = RawUsage;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("any valid JSON value")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<RawUsage, A::Error> {
                // `None`: absent (zero); `Some(Invalid)`: present but not a count.
                let mut counts: [Option<Count>; 5] = [None, None, None, None, None];
                let mut cached = 0;
                while let Some(key) = map.next_key::<UsageKey>()? {
                    let slot = match key {
                        UsageKey::PromptTokens => 0,
                        UsageKey::CompletionTokens => 1,
                        UsageKey::TotalTokens => 2,
                        UsageKey::CacheReadTokens => 3,
                        UsageKey::CacheWriteTokens => 4,
                        UsageKey::PromptTokensDetails => {
                            cached = map.next_value::<CachedTokens>()?.0;
                            continue;
                        }
                        UsageKey::Other => {
                            map.next_value::<serde::de::IgnoredAny>()?;
                            continue;
                        }
                    };
                    counts[slot] = Some(map.next_value::<Count>()?);
                }
                let mut values = [0u64; 5];
                for (value, count) in values.iter_mut().zip(counts) {
                    match count {
                        None => {}
                        Some(Count::Valid(n)) => *value = n,
                        Some(Count::Invalid) => return Ok(RawUsage::Unreadable),
                    }
                }
                let [
                    prompt_tokens,
                    completion_tokens,
                    total_tokens,
                    _,
                    cache_write_tokens,
                ] = values;
                // The top-level `cache_read_tokens` must be a count for the usage to be read,
                // but OpenAI's `prompt_tokens_details` is what is kept.
                Ok(RawUsage::Read(Box::new(Usage {
                    prompt_tokens,
                    completion_tokens,
                    total_tokens,
                    cache_read_tokens: cached,
                    cache_write_tokens,
                })))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<RawUsage, A::Error> {
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(RawUsage::Absent)
            }
            fn visit_u64<E>(self, _: u64) -> Result<RawUsage, E> {
                Ok(RawUsage::Absent)
            }
            fn visit_i64<E>(self, _: i64) -> Result<RawUsage, E> {
                Ok(RawUsage::Absent)
            }
            fn visit_f64<E>(self, _: f64) -> Result<RawUsage, E> {
                Ok(RawUsage::Absent)
            }
            fn visit_bool<E>(self, _: bool) -> Result<RawUsage, E> {
                Ok(RawUsage::Absent)
            }
            fn visit_str<E>(self, _: &str) -> Result<RawUsage, E> {
                Ok(RawUsage::Absent)
            }
            fn visit_unit<E>(self) -> Result<RawUsage, E> {
                Ok(RawUsage::Absent)
            }
        }
        deserializer.deserialize_any(Visit)
    }
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
        // `trim` walks characters from both ends; a chunk that starts and ends with a visible
        // ASCII character (`{`, `}`) has nothing to trim.
        let bytes = data.as_bytes();
        let untrimmed = |b: Option<&u8>| b.is_some_and(u8::is_ascii_graphic);
        let data = if untrimmed(bytes.first()) && untrimmed(bytes.last()) {
            data
        } else {
            data.trim()
        };
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
        self.record_usage(&chunk.usage);
        // By reference: a choice is a large struct, and moving it out costs a copy.
        for choice in chunk.choices.iter().flat_map(|c| &c.0) {
            self.record_usage(&choice.usage);
            let state = self.choices.entry(choice.index.unwrap_or(0)).or_default();
            // Some servers send `""` instead of `null` while the choice is still running.
            let reason = choice.finish_reason.as_str();
            if let Some(reason) = reason.filter(|r| !r.is_empty()) {
                state.finish_reason = Some(reason.to_owned());
            }
            if let Some(delta) = &choice.delta {
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

    fn record_usage(&mut self, usage: &RawUsage) {
        match usage {
            RawUsage::Absent => {}
            RawUsage::Read(usage) => self.usage = Some(Usage::clone(usage)),
            // A usage of an unexpected shape is not worth failing the completion for.
            RawUsage::Unreadable => {
                tracing::debug!("ignoring unreadable usage in LLM stream: a count is not a u64")
            }
        }
    }
}

impl ChoiceState {
    fn apply(&mut self, delta: &RawDelta) {
        push_text(&mut self.content, &delta.content);
        // Some servers send the same text under both names; take one.
        match (&delta.reasoning_content, &delta.reasoning) {
            (Text::Absent, r) | (r, _) => push_text(&mut self.reasoning, r),
        }
        for call in delta.tool_calls.iter().flat_map(|c| &c.0) {
            self.apply_tool_call(call);
        }
    }

    fn apply_tool_call(&mut self, delta: &RawToolCall) {
        let id = delta
            .id
            .as_ref()
            .map(|id| &*id.0)
            .filter(|id| !id.is_empty());
        let index = delta.index.unwrap_or_else(|| self.infer_index(id));
        let call = self.tool_calls.entry(index).or_default();
        if call.id.is_empty()
            && let Some(id) = id
        {
            call.id = id.to_owned();
        }
        let Some(function) = &delta.function else {
            return;
        };
        if let Some(name) = function
            .name
            .as_ref()
            .map(|n| &*n.0)
            .filter(|n| !n.is_empty())
        {
            // A provider that repeats the whole name in every delta must not double it; a
            // name genuinely streamed as two equal halves is not a real-world case.
            if call.name != name {
                call.name.push_str(name);
            }
        }
        match &function.arguments {
            Some(Arguments::Text(args)) => call.arguments.push_str(args),
            None | Some(Arguments::Other(Value::Null)) => {}
            // Arguments sent as a JSON object instead of JSON text: keep them as text.
            Some(Arguments::Other(other)) => call.arguments.push_str(&other.to_string()),
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
        Text::Str(s) => {
            // A reply arrives a few bytes a chunk: room for a short one at once spares the
            // reallocations of doubling up from eight bytes.
            if out.capacity() == 0 && !s.is_empty() {
                out.reserve(s.len().max(256));
            }
            out.push_str(s);
        }
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

    /// The usage the assembler read from `usage` before it read usage without a `Value`.
    fn usage_through_value(usage: Value) -> Option<Usage> {
        if !usage.is_object() {
            return None;
        }
        let cached = usage
            .pointer("/prompt_tokens_details/cached_tokens")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        serde_json::from_value::<Usage>(usage)
            .ok()
            .map(|usage| Usage {
                cache_read_tokens: cached,
                ..usage
            })
    }

    #[test]
    fn usage_is_read_as_leniently_as_through_a_value() {
        let before = Usage {
            prompt_tokens: 7,
            ..Usage::default()
        };
        for usage in [
            "null",
            "3",
            "\"x\"",
            "[1,2]",
            "true",
            "{}",
            r#"{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}"#,
            r#"{"prompt_tokens":null,"completion_tokens":2}"#,
            r#"{"prompt_tokens":-1}"#,
            r#"{"prompt_tokens":1.0}"#,
            r#"{"prompt_tokens":1e3}"#,
            r#"{"prompt_tokens":-0}"#,
            r#"{"prompt_tokens":18446744073709551615}"#,
            r#"{"prompt_tokens":18446744073709551616}"#,
            r#"{"prompt_tokens":"5"}"#,
            r#"{"prompt_tokens":{"a":1}}"#,
            r#"{"prompt_tokens":[1]}"#,
            r#"{"prompt_tokens":"x","prompt_tokens":5}"#,
            r#"{"prompt_tokens":5,"prompt_tokens":"x"}"#,
            r#"{"prompt_tokens":9,"prompt_tokens_details":{"cached_tokens":4,"audio_tokens":0}}"#,
            r#"{"prompt_tokens_details":{"cached_tokens":"4"}}"#,
            r#"{"prompt_tokens_details":{"cached_tokens":-4}}"#,
            r#"{"prompt_tokens_details":{"cached_tokens":4.5}}"#,
            r#"{"prompt_tokens_details":{"cached_tokens":null}}"#,
            r#"{"prompt_tokens_details":null}"#,
            r#"{"prompt_tokens_details":[4]}"#,
            r#"{"prompt_tokens_details":{"cached_tokens":4},"prompt_tokens_details":{}}"#,
            r#"{"prompt_tokens_details":{"cached_tokens":4,"cached_tokens":6}}"#,
            r#"{"cache_read_tokens":3,"cache_write_tokens":2}"#,
            r#"{"cache_read_tokens":"3","cache_write_tokens":2}"#,
            r#"{"cache_write_tokens":-2}"#,
            r#"{"completion_tokens_details":{"reasoning_tokens":7},"total_tokens":21}"#,
            r#"{"pr\u006fmpt_tokens":4}"#,
        ] {
            let want = usage_through_value(serde_json::from_str(usage).expect("json"))
                .or(Some(before.clone()));
            for chunk in [
                format!(r#"{{"choices":[],"usage":{usage}}}"#),
                format!(r#"{{"choices":[{{"index":0,"delta":{{}},"usage":{usage}}}]}}"#),
            ] {
                let mut asm = StreamAssembler::new();
                asm.usage = Some(before.clone());
                asm.push_data(&chunk).expect("a chunk");
                assert_eq!(asm.usage, want, "{chunk}");
            }
        }
    }

    #[test]
    fn tool_call_fields_are_read_in_place_or_kept_as_json_text() {
        let mut asm = StreamAssembler::new();
        for chunk in [
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c\u0031","function":{"name":"f\"n","arguments":"{\"a\":"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c2","function":{"name":"","arguments":1}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":null,"function":{"name":null,"arguments":null}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":1,"function":{"arguments":{"q":[1,true,null]}}},{"index":2,"function":{"arguments":[2.5,-1,"s"]}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":2,"function":{"arguments":false}}]}}]}"#,
        ] {
            asm.push_data(chunk).expect("a chunk");
        }
        let calls = asm.finish().tool_calls;
        assert_eq!(
            calls,
            [
                ToolCall::new("c1", "f\"n", "{\"a\":1"),
                ToolCall::new("call_1", "", r#"{"q":[1,true,null]}"#),
                ToolCall::new("call_2", "", r#"[2.5,-1,"s"]false"#),
            ]
        );
        for (chunk, message) in [
            (
                r#"{"choices":[{"delta":{"tool_calls":[{"id":5}]}}]}"#,
                "invalid type: integer `5`, expected a string",
            ),
            (
                r#"{"choices":[{"delta":{"tool_calls":{"id":"a"}}}]}"#,
                "invalid type: map, expected a sequence",
            ),
            (r#"{"choices":"nope"}"#, "expected a sequence"),
        ] {
            let err = StreamAssembler::new()
                .push_data(chunk)
                .expect_err("malformed");
            assert!(
                matches!(&err, LlmError::Malformed(m) if m.contains(message)),
                "{chunk}: {err}"
            );
        }
    }
}
