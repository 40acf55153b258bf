//! Stream assembly against real recordings (OpenAI and nine other providers), cut at every
//! byte offset, plus the error and edge cases the recordings do not cover.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use bytes::Bytes;
use parlor_bot::llm::{Completion, LlmError, StreamAssembler, ToolCall, Usage, assemble};
use serde_json::Value;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures");

/// One recorded stream as wire bytes, keyed as in `EXPECTED.derived.json`.
struct Fixture {
    key: String,
    bytes: Bytes,
}

/// Every recording under `sse/`, as the bytes a server would send: vercel-ai's
/// `*.chunks.txt` (one JSON per line) framed as `data: LINE\n\n` without `[DONE]`, everything
/// else as recorded.
fn fixtures() -> Vec<Fixture> {
    let mut out = Vec::new();
    for dir in ["sse/openai-python", "sse/vercel-ai"] {
        let mut entries: Vec<_> = std::fs::read_dir(Path::new(FIXTURES).join(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            let name = path.file_name().unwrap().to_str().unwrap().to_owned();
            let raw = std::fs::read(&path).unwrap();
            let bytes = if name.ends_with(".chunks.txt") {
                let text = String::from_utf8(raw).unwrap();
                text.lines()
                    .filter(|l| !l.trim().is_empty())
                    .map(|l| format!("data: {l}\n\n"))
                    .collect::<String>()
                    .into_bytes()
            } else {
                raw
            };
            out.push(Fixture {
                key: format!("{dir}/{name}"),
                bytes: Bytes::from(bytes),
            });
        }
    }
    out
}

fn expected() -> BTreeMap<String, Value> {
    let text = std::fs::read_to_string(format!("{FIXTURES}/sse/EXPECTED.derived.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Runs [`assemble`] over `pieces` on the current thread: no runtime needed, and cheap
/// enough to do tens of thousands of times.
fn run(pieces: Vec<Bytes>) -> Result<StreamAssembler, LlmError> {
    futures::executor::block_on(assemble(futures::stream::iter(
        pieces.into_iter().map(Ok::<_, LlmError>),
    )))
}

fn completion_json(c: &Completion) -> Value {
    serde_json::json!({
        "content": c.content,
        "reasoning": c.reasoning,
        "tool_calls": c.tool_calls.iter().map(|t| serde_json::json!({
            "id": t.id, "name": t.function.name, "arguments": t.function.arguments,
        })).collect::<Vec<_>>(),
        "finish_reason": c.finish_reason,
    })
}

/// Compares an assembler with one entry of `EXPECTED.derived.json`, every choice.
fn assert_matches_expected(key: &str, asm: &StreamAssembler, want: &Value) {
    assert_eq!(
        asm.chunks() as u64,
        want["chunks"].as_u64().unwrap(),
        "{key}: chunk count"
    );
    assert_eq!(asm.done(), want["done"].as_bool().unwrap(), "{key}: [DONE]");
    let want_usage = match &want["usage"] {
        Value::Null => None,
        u => Some(Usage {
            prompt_tokens: u["prompt_tokens"].as_u64().unwrap(),
            completion_tokens: u["completion_tokens"].as_u64().unwrap(),
            total_tokens: u["total_tokens"].as_u64().unwrap(),
            cache_read_tokens: u
                .pointer("/prompt_tokens_details/cached_tokens")
                .and_then(Value::as_u64)
                .unwrap_or(0),
            ..Usage::default()
        }),
    };
    assert_eq!(asm.usage(), want_usage.as_ref(), "{key}: usage");
    let got: BTreeMap<String, Value> = asm
        .completions()
        .iter()
        .map(|(i, c)| {
            assert_eq!(c.usage, want_usage, "{key}: usage of choice {i}");
            (i.to_string(), completion_json(c))
        })
        .collect();
    let want_choices: BTreeMap<String, Value> = want["choices"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(i, c)| {
            let mut c = c.clone();
            for call in c["tool_calls"].as_array_mut().unwrap() {
                call.as_object_mut().unwrap().remove("index");
            }
            (i.clone(), c)
        })
        .collect();
    assert_eq!(got, want_choices, "{key}: choices");
    // finish() is choice 0.
    let first = asm.clone().finish();
    assert_eq!(
        completion_json(&first),
        want_choices["0"],
        "{key}: finish()"
    );
}

#[test]
fn every_recording_assembles_to_the_expected_result() {
    let expected = expected();
    let fixtures = fixtures();
    let keys: Vec<&str> = fixtures.iter().map(|f| f.key.as_str()).collect();
    let want_keys: Vec<&str> = expected.keys().map(String::as_str).collect();
    assert_eq!(keys.len(), 22);
    assert_eq!(
        keys.iter()
            .copied()
            .collect::<std::collections::BTreeSet<_>>(),
        want_keys.iter().copied().collect(),
        "every recording has an expectation and vice versa"
    );
    for f in &fixtures {
        let asm = run(vec![f.bytes.clone()]).unwrap_or_else(|e| panic!("{}: {e}", f.key));
        assert_matches_expected(&f.key, &asm, &expected[&f.key]);
    }
}

/// The n=3 recording: three choices interleaved in one stream, each assembled on its own.
#[test]
fn multiple_choices_are_assembled_separately() {
    let f = fixtures()
        .into_iter()
        .find(|f| f.key.contains("multiple_choices_n3"))
        .unwrap();
    let completions = run(vec![f.bytes]).unwrap().completions();
    assert_eq!(completions.keys().copied().collect::<Vec<_>>(), [0, 1, 2]);
    for c in completions.values() {
        assert!(c.content.starts_with('{'), "{:?}", c.content);
        assert_eq!(c.finish_reason.as_deref(), Some("stop"));
    }
}

/// Byte ranges of the events of an SSE stream: each ends after its blank line.
fn event_spans(bytes: &[u8]) -> Vec<std::ops::Range<usize>> {
    let mut spans = Vec::new();
    let mut start = 0;
    for i in 1..bytes.len() {
        if bytes[i] == b'\n' && bytes[i - 1] == b'\n' {
            spans.push(start..i + 1);
            start = i + 1;
        }
    }
    if start < bytes.len() {
        spans.push(start..bytes.len());
    }
    spans
}

/// A minimal well-formed event, put around the event being cut (see below).
const NEIGHBOUR: &[u8] = b"data: {\"choices\":[]}\n\n";

/// Every recording split into two pieces at every byte offset, inside UTF-8 characters
/// too.
///
/// Feeding the whole 51 KB stream once per offset would be 51 000 full parses (minutes in a
/// debug build). SSE framing keeps no state across an event boundary (after a blank line its
/// buffer is empty and its event builder reset), so a cut can only affect the event it falls
/// in. Each cut is therefore made in that event, framed by a small complete event on either
/// side so that each piece also carries a whole event next to the partial one, and the result
/// must equal the unsplit window's exactly (`PartialEq` over every choice, tool call, usage,
/// chunk count and `[DONE]`). The whole streams are compared with `EXPECTED.derived.json`
/// unsplit and in one-byte pieces, and the small ones are also cut whole at every offset.
#[test]
fn a_cut_at_every_byte_offset_changes_nothing() {
    let expected = expected();
    let fixtures = fixtures();
    let started = Instant::now();
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut cuts = 0usize;
    let mut utf8_cuts = 0usize;
    for f in &fixtures {
        let reference = run(vec![f.bytes.clone()]).unwrap();
        assert_matches_expected(&f.key, &reference, &expected[&f.key]);
        let spans = event_spans(&f.bytes);
        assert_eq!(spans.iter().map(|s| s.len()).sum::<usize>(), f.bytes.len());
        std::thread::scope(|scope| {
            for t in 0..threads {
                let (bytes, spans, key) = (&f.bytes, &spans, &f.key);
                scope.spawn(move || {
                    for span in spans.iter().skip(t).step_by(threads) {
                        let event = &bytes[span.clone()];
                        // The last event of a recording may lack its blank line.
                        let end: &[u8] = if event.ends_with(b"\n\n") {
                            b""
                        } else if event.ends_with(b"\n") {
                            b"\n"
                        } else {
                            b"\n\n"
                        };
                        let window = Bytes::from([NEIGHBOUR, event, end, NEIGHBOUR].concat());
                        let whole = run(vec![window.clone()]).map_err(|e| e.to_string());
                        assert!(whole.is_ok(), "{key} {span:?}: {whole:?}");
                        for i in NEIGHBOUR.len()..NEIGHBOUR.len() + span.len() {
                            let pieces = vec![window.slice(..i), window.slice(i..)];
                            let got = run(pieces).map_err(|e| e.to_string());
                            let at = span.start + i - NEIGHBOUR.len();
                            assert!(got == whole, "{key} cut at {at}: {got:?} != {whole:?}");
                        }
                    }
                });
            }
        });
        // Small recordings are also cut literally, whole stream in two pieces.
        if f.bytes.len() <= SMALL {
            whole_stream_cuts(&f.key, &f.bytes, &reference, threads);
        }
        // The last offset (after the final byte) is a cut too: all in the first piece.
        let all = run(vec![f.bytes.clone(), Bytes::new()]).unwrap();
        assert!(all == reference, "{}: cut at the end", f.key);
        cuts += f.bytes.len() + 1;
        utf8_cuts += f.bytes.iter().filter(|&&b| (b & 0xC0) == 0x80).count();
    }
    assert!(utf8_cuts > 0, "some cut falls inside a UTF-8 character");
    eprintln!(
        "{cuts} cuts ({utf8_cuts} inside a UTF-8 character) over {} recordings in {:?}",
        fixtures.len(),
        started.elapsed()
    );
}

/// Recordings up to this size are also cut literally (whole stream per offset).
const SMALL: usize = 2048;

/// Cuts the whole of `bytes` in two at every offset; each must assemble like `reference`.
fn whole_stream_cuts(key: &str, bytes: &Bytes, reference: &StreamAssembler, threads: usize) {
    std::thread::scope(|scope| {
        for t in 0..threads {
            scope.spawn(move || {
                for i in (t..=bytes.len()).step_by(threads) {
                    let got = run(vec![bytes.slice(..i), bytes.slice(i..)])
                        .unwrap_or_else(|e| panic!("{key} cut at {i}: {e}"));
                    assert!(got == *reference, "{key} cut at {i}: {got:?}");
                }
            });
        }
    });
}

/// The recordings hold few multi-byte characters (seven `°`), so a stream of two-, three-
/// and four-byte characters in content, reasoning and tool arguments is cut at every
/// offset too.
#[test]
fn cuts_inside_multibyte_characters_change_nothing() {
    let bytes = Bytes::from(
        [
            r#"{"choices":[{"index":0,"delta":{"reasoning_content":"думаю… 🤔"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"héllo 世界"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":" 🎉✓"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"say","arguments":"{\"t\":\"日本"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"語🇩🇪\"}"}}]},"finish_reason":"tool_calls"}]}"#,
            "[DONE]",
        ]
        .iter()
        .map(|e| format!("data: {e}\n\n"))
        .collect::<String>(),
    );
    let reference = run(vec![bytes.clone()]).unwrap();
    let c = reference.clone().finish();
    assert_eq!(c.content, "héllo 世界 🎉✓");
    assert_eq!(c.reasoning, "думаю… 🤔");
    assert_eq!(
        c.tool_calls,
        [ToolCall::new("c", "say", r#"{"t":"日本語🇩🇪"}"#)]
    );
    whole_stream_cuts("multibyte", &bytes, &reference, 1);
    let pieces = (0..bytes.len()).map(|i| bytes.slice(i..=i)).collect();
    assert!(run(pieces).unwrap() == reference);
}

/// Every recording fed one byte at a time.
#[test]
fn one_byte_pieces_change_nothing() {
    let expected = expected();
    let started = Instant::now();
    for f in fixtures() {
        let pieces = (0..f.bytes.len()).map(|i| f.bytes.slice(i..=i)).collect();
        let asm = run(pieces).unwrap_or_else(|e| panic!("{}: {e}", f.key));
        assert_matches_expected(&f.key, &asm, &expected[&f.key]);
    }
    eprintln!("one-byte pieces: {:?}", started.elapsed());
}

fn sse(events: &[&str]) -> Vec<Bytes> {
    vec![Bytes::from(
        events
            .iter()
            .map(|e| format!("data: {e}\n\n"))
            .collect::<String>(),
    )]
}

const HELLO: &str = r#"{"choices":[{"index":0,"delta":{"content":"Hel"}}]}"#;
const LO: &str = r#"{"choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"stop"}]}"#;

#[test]
fn an_error_chunk_mid_stream_is_a_stream_error_not_text() {
    let err = run(sse(&[HELLO, r#"{"error":{"message":"overloaded"}}"#, LO])).unwrap_err();
    match err {
        LlmError::Stream(msg) => assert_eq!(msg, "overloaded"),
        other => panic!("{other:?}"),
    }
    // OpenRouter's shape: an error next to a chunk's usual fields, with a numeric code.
    let err = run(sse(&[
        r#"{"id":"x","object":"chat.completion.chunk","error":{"code":502,"message":"upstream died"},"choices":[{"index":0,"delta":{"content":""},"finish_reason":"error"}]}"#,
    ]))
    .unwrap_err();
    assert!(
        matches!(&err, LlmError::Stream(m) if m == "upstream died (code: 502)"),
        "{err:?}"
    );
    assert!(!err.is_retryable());
}

#[test]
fn a_stream_ending_without_done_still_returns_its_content() {
    let asm = run(sse(&[HELLO, LO])).unwrap();
    assert!(!asm.done());
    assert_eq!(asm.chunks(), 2);
    let c = asm.finish();
    assert_eq!(c.content, "Hello");
    assert_eq!(c.finish_reason.as_deref(), Some("stop"));
}

#[test]
fn the_last_event_counts_without_its_blank_line_but_a_cut_off_line_does_not() {
    let bytes = format!("data: {HELLO}\n\ndata: {LO}\n");
    assert_eq!(
        run(vec![Bytes::from(bytes)]).unwrap().finish().content,
        "Hello"
    );
    let bytes = format!("data: {HELLO}\n\ndata: {}", &LO[..20]);
    assert_eq!(
        run(vec![Bytes::from(bytes)]).unwrap().finish().content,
        "Hel"
    );
}

#[test]
fn data_after_done_is_ignored() {
    let asm = run(sse(&[HELLO, "[DONE]", LO, "not json"])).unwrap();
    assert!(asm.done());
    assert_eq!(asm.chunks(), 1);
    assert_eq!(asm.finish().content, "Hel");
}

#[test]
fn garbage_is_malformed() {
    for data in [
        "not json",
        "{\"choices\":[",
        "[1,2]",
        "42",
        r#"{"choices":"nope"}"#,
    ] {
        let err = run(sse(&[HELLO, data])).unwrap_err();
        assert!(matches!(err, LlmError::Malformed(_)), "{data}: {err:?}");
        assert!(!err.is_retryable());
    }
}

#[test]
fn bytes_that_are_not_utf8_are_read_as_replacement_characters() {
    // As a browser reads an event stream: one bad byte does not cost the whole reply.
    let asm = run(vec![Bytes::from_static(
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\xff\xfeb\"}}]}\n\n",
    )])
    .unwrap();
    assert_eq!(asm.finish().content, "a\u{fffd}\u{fffd}b");
}

#[test]
fn a_stream_without_any_chunk_is_an_error() {
    for body in [
        &b""[..],
        b"\n\n",
        b": keep-alive\n\n",
        b"data: [DONE]\n\n",
        b"<html><body>Bad gateway</body></html>",
    ] {
        let err = run(vec![Bytes::from_static(body)]).unwrap_err();
        assert!(
            matches!(&err, LlmError::Malformed(m) if m.contains("empty response")),
            "{:?}: {err:?}",
            String::from_utf8_lossy(body)
        );
    }
}

#[test]
fn a_transport_error_mid_stream_is_passed_through() {
    let pieces = vec![
        Ok(Bytes::from(format!("data: {HELLO}\n\n"))),
        Err(LlmError::Connect("connection reset".into())),
    ];
    let err = futures::executor::block_on(assemble(futures::stream::iter(pieces))).unwrap_err();
    assert!(matches!(err, LlmError::Connect(_)), "{err:?}");
}

#[test]
fn comments_event_names_and_crlf_framing_are_tolerated() {
    let bytes = format!(
        ": OPENROUTER PROCESSING\r\n\r\nevent: message\r\ndata: {HELLO}\r\n\r\ndata:{LO}\r\n\r\ndata: [DONE]\r\n\r\n"
    );
    let asm = run(vec![Bytes::from(bytes)]).unwrap();
    assert!(asm.done());
    assert_eq!(asm.finish().content, "Hello");
}

fn push_all(chunks: &[&str]) -> StreamAssembler {
    let mut asm = StreamAssembler::new();
    for chunk in chunks {
        asm.push_data(chunk).unwrap();
    }
    asm
}

#[test]
fn tool_call_deltas_without_index_follow_their_id() {
    let asm = push_all(&[
        r#"{"choices":[{"delta":{"tool_calls":[{"id":"a","function":{"name":"first","arguments":"{\"x\""}}]}}]}"#,
        r#"{"choices":[{"delta":{"tool_calls":[{"function":{"arguments":":1}"}}]}}]}"#,
        r#"{"choices":[{"delta":{"tool_calls":[{"id":"b","function":{"name":"second","arguments":"{}"}}]}}]}"#,
        r#"{"choices":[{"delta":{"tool_calls":[{"id":"a","function":{"arguments":""}}]}}]}"#,
    ]);
    assert_eq!(
        asm.finish().tool_calls,
        [
            ToolCall::new("a", "first", r#"{"x":1}"#),
            ToolCall::new("b", "second", "{}")
        ]
    );
}

#[test]
fn repeated_names_are_not_doubled_and_odd_shapes_are_tolerated() {
    let asm = push_all(&[
        r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":null,"reasoning":"hmm"},"logprobs":null}],"usage":null}"#,
        r#"{"choices":[{"index":0,"delta":{"reasoning_content":" a","reasoning":" a"}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"content":[{"type":"thinking","thinking":"no"},{"type":"text","text":"Hi"}]}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":2,"function":{"name":"look","arguments":{"q":1}}}]}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":2,"function":{"name":"look"}}]},"finish_reason":"tool_calls","usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}],"brand_new_field":{"x":[1]}}"#,
    ]);
    assert_eq!(asm.chunks(), 5);
    let c = asm.finish();
    assert_eq!(c.reasoning, "hmm a");
    assert_eq!(c.content, "Hi");
    // No id from the provider: a stable one is made up, so the tool message can answer it.
    assert_eq!(
        c.tool_calls,
        [ToolCall::new("call_2", "look", r#"{"q":1}"#)]
    );
    assert_eq!(c.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(c.usage.map(|u| u.total_tokens), Some(5));
}

#[test]
fn a_non_streaming_completion_object_is_understood() {
    let asm = push_all(&[
        r#"{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"a","arguments":"{}"}},{"id":"c2","type":"function","function":{"name":"b","arguments":"{}"}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#,
    ]);
    let c = asm.finish();
    assert_eq!(c.tool_calls.len(), 2);
    assert_eq!(c.tool_calls[1], ToolCall::new("c2", "b", "{}"));
}

#[test]
fn finish_on_nothing_is_an_empty_completion() {
    let c = StreamAssembler::new().finish();
    assert_eq!(c, Completion::default());
}
