//! The Anthropic event assembler (`parlor_bot::llm::anthropic::assemble`) on arbitrary bytes
//! cut at arbitrary places: no panic, and the result (the completion, or the error's kind)
//! is the same whatever the cuts.
//!
//! Input: a first byte choosing the mode, then cut lengths and the stream. Mode even: the
//! rest is raw bytes (garbage, or a mutated recording from the seeds). Mode odd: a
//! well-formed stream is built from the bytes (text, tool-use, thinking and redacted blocks
//! with their deltas, pings, usage, `message_stop`), so that valid streams are exercised as
//! often as garbage.
#![no_main]

use std::mem::discriminant;

use bytes::Bytes;
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use parlor_bot::llm::anthropic::assemble;
use parlor_bot::llm::{Completion, LlmError};
use serde_json::json;

fn run(pieces: Vec<Bytes>) -> std::result::Result<Completion, LlmError> {
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
    let bytewise = run(stream
        .iter()
        .map(|&b| Bytes::copy_from_slice(&[b]))
        .collect());

    match (&whole, &cut, &bytewise) {
        (Ok(a), Ok(b), Ok(c)) => {
            assert_eq!(a, b, "cut differently, assembled differently");
            assert_eq!(a, c, "one byte at a time, assembled differently");
        }
        (Err(a), Err(b), Err(c)) => {
            assert_eq!(discriminant(a), discriminant(b), "{a:?} / {b:?}");
            assert_eq!(discriminant(a), discriminant(c), "{a:?} / {c:?}");
        }
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

/// A well-formed Messages event stream ending in `message_stop`.
fn valid_stream(u: &mut Unstructured) -> Result<String> {
    let mut events = vec![json!({"type": "message_start", "message": {
        "usage": {"input_tokens": u.int_in_range(0..=1000u64)?, "output_tokens": 1},
    }})];
    for index in 0..u.int_in_range(0..=4u32)? {
        let kind = u.int_in_range(0..=3u8)?;
        let block = match kind {
            0 => json!({"type": "text", "text": text(u)?}),
            1 => json!({"type": "tool_use", "id": text(u)?, "name": text(u)?, "input": {}}),
            2 => json!({"type": "thinking", "thinking": "", "signature": ""}),
            _ => json!({"type": "redacted_thinking", "data": text(u)?}),
        };
        events.push(json!({"type": "content_block_start", "index": index, "content_block": block}));
        for _ in 0..u.int_in_range(0..=4u8)? {
            let delta = match kind {
                0 => json!({"type": "text_delta", "text": text(u)?}),
                1 => json!({"type": "input_json_delta", "partial_json": text(u)?}),
                2 if u.arbitrary()? => json!({"type": "signature_delta", "signature": text(u)?}),
                2 => json!({"type": "thinking_delta", "thinking": text(u)?}),
                _ => continue,
            };
            events.push(json!({"type": "content_block_delta", "index": index, "delta": delta}));
            if u.ratio(1, 6)? {
                events.push(json!({"type": "ping"}));
            }
        }
        events.push(json!({"type": "content_block_stop", "index": index}));
    }
    events.push(
        json!({"type": "message_delta", "delta": {"stop_reason": text(u)?},
        "usage": {"output_tokens": u.int_in_range(0..=1000u64)?}}),
    );
    events.push(json!({"type": "message_stop"}));
    let mut out = String::new();
    for event in events {
        if u.ratio(1, 8)? {
            out.push_str(": keep-alive\n\n");
        }
        // The event line is optional to the assembler, which reads the data's `type`.
        if u.arbitrary()? {
            out.push_str(&format!(
                "event: {}\n",
                event["type"].as_str().unwrap_or("")
            ));
        }
        out.push_str(if u.ratio(1, 4)? { "data:" } else { "data: " });
        out.push_str(&event.to_string());
        out.push_str("\n\n");
    }
    Ok(out)
}
