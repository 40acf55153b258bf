//! The SSE chunk assembler (`parlor_bot::llm::assemble`) on arbitrary bytes cut at
//! arbitrary places: no panic, and the result (the assembled completions, or that it
//! failed) is the same whatever the cuts.
//!
//! Input: a first byte choosing the mode, then cut lengths and the stream. Mode even: the
//! rest is raw bytes (garbage, or a mutated recording from the seeds). Mode odd: a
//! well-formed stream is built from the bytes (content, reasoning and tool-call deltas on
//! a few choices, usage, `[DONE]`), so that valid streams are exercised as often as
//! garbage.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use parlor_bot::llm::{LlmError, StreamAssembler, assemble};
use serde_json::{Value, json};

fn run(pieces: Vec<Bytes>) -> std::result::Result<StreamAssembler, LlmError> {
    futures::executor::block_on(assemble(futures::stream::iter(
        pieces.into_iter().map(Ok::<_, LlmError>),
    )))
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(mode) = u.arbitrary::<u8>() else {
        return;
    };
    let Ok(cuts) = u.arbitrary::<Vec<u8>>() else {
        return;
    };
    let stream = if mode % 2 == 0 {
        u.take_rest().to_vec()
    } else {
        match valid_stream(&mut u) {
            Ok(s) => s.into_bytes(),
            Err(_) => return,
        }
    };

    let whole = run(vec![Bytes::from(stream.clone())]);
    let mut pieces = Vec::new();
    let mut rest = &stream[..];
    for &cut in &cuts {
        let n = usize::from(cut).min(rest.len());
        let (piece, tail) = rest.split_at(n);
        pieces.push(Bytes::copy_from_slice(piece));
        rest = tail;
    }
    pieces.push(Bytes::copy_from_slice(rest));
    let cut = run(pieces);
    // One byte at a time: every cut at once.
    let bytewise = run(stream
        .iter()
        .map(|&b| Bytes::copy_from_slice(&[b]))
        .collect());

    match (&whole, &cut, &bytewise) {
        (Ok(a), Ok(b), Ok(c)) => {
            assert_eq!(a, b, "cut differently, assembled differently");
            assert_eq!(a, c, "one byte at a time, assembled differently");
            let _ = a.clone().finish();
        }
        (Err(_), Err(_), Err(_)) => {}
        _ => panic!(
            "the cuts decide whether it assembles: whole {:?}, cut {:?}, bytewise {:?}",
            whole.as_ref().map(|_| ()),
            cut.as_ref().map(|_| ()),
            bytewise.as_ref().map(|_| ())
        ),
    }
    if mode % 2 == 1 {
        assert!(whole.is_ok(), "a well-formed stream failed: {whole:?}");
    }
});

/// A short arbitrary string, sometimes with multi-byte characters and SSE's own bytes.
fn text(u: &mut Unstructured) -> Result<String> {
    const PIECES: &[&str] = &[
        "a", " ", "é", "€", "😀", "\n", "\r", ":", "data:", "{", "\"", "\\",
    ];
    let n = u.int_in_range(0..=6)?;
    let mut s = String::new();
    for _ in 0..n {
        if u.ratio(1, 3)? {
            s.push_str(&u.arbitrary::<String>()?);
        } else {
            s.push_str(u.choose(PIECES)?);
        }
    }
    Ok(s)
}

/// A well-formed stream of chat-completion chunks.
fn valid_stream(u: &mut Unstructured) -> Result<String> {
    let mut out = String::new();
    let chunks = u.int_in_range(1..=12)?;
    for _ in 0..chunks {
        let mut choices = Vec::new();
        for _ in 0..u.int_in_range(0..=2)? {
            let index = u.int_in_range(0..=2u32)?;
            let mut delta = serde_json::Map::new();
            if u.arbitrary()? {
                delta.insert("content".into(), json!(text(u)?));
            }
            if u.ratio(1, 4)? {
                let key = if u.arbitrary()? {
                    "reasoning_content"
                } else {
                    "reasoning"
                };
                delta.insert(key.into(), json!(text(u)?));
            }
            if u.ratio(1, 8)? {
                delta.insert("role".into(), json!("assistant"));
            }
            if u.ratio(1, 3)? {
                let mut calls = Vec::new();
                for _ in 0..u.int_in_range(1..=2)? {
                    let mut call = serde_json::Map::new();
                    if u.ratio(3, 4)? {
                        call.insert("index".into(), json!(u.int_in_range(0..=3u32)?));
                    }
                    if u.arbitrary()? {
                        call.insert("id".into(), json!(text(u)?));
                    }
                    let mut function = serde_json::Map::new();
                    if u.arbitrary()? {
                        function.insert("name".into(), json!(text(u)?));
                    }
                    if u.arbitrary()? {
                        function.insert("arguments".into(), json!(text(u)?));
                    }
                    call.insert("function".into(), Value::Object(function));
                    if u.arbitrary()? {
                        call.insert("type".into(), json!("function"));
                    }
                    calls.push(Value::Object(call));
                }
                delta.insert("tool_calls".into(), Value::Array(calls));
            }
            let mut choice = json!({"index": index, "delta": delta});
            if u.ratio(1, 5)? {
                choice["finish_reason"] = json!(text(u)?);
            }
            choices.push(choice);
        }
        let mut chunk = json!({"id": "x", "object": "chat.completion.chunk", "choices": choices});
        if u.ratio(1, 6)? {
            let p = u.int_in_range(0..=1000u64)?;
            let c = u.int_in_range(0..=1000u64)?;
            chunk["usage"] =
                json!({"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c});
        }
        // SSE allows `data:` with or without the space, and comment lines.
        if u.ratio(1, 8)? {
            out.push_str(": keep-alive\n\n");
        }
        let sep = if u.ratio(1, 4)? { "data:" } else { "data: " };
        out.push_str(sep);
        out.push_str(&chunk.to_string());
        out.push_str("\n\n");
    }
    if u.arbitrary()? {
        out.push_str("data: [DONE]\n\n");
    }
    Ok(out)
}
