//! Tool calls written as text. Some models (quantized local ones most of all) answer a
//! request that carried tools with the call spelled out in the message text instead of
//! the tool channel: `<tool_call>{…}</tool_call>`, `<function_calls><invoke …>`, a bare
//! `{"name": …, "arguments": …}`, or a special token such as `<|python_tag|>`. Posted, it
//! is JSON in the group and the tool never runs; the loop retries once instead (see
//! [`NUDGE`]) and, failing that, posts [`APOLOGY`].
//!
//! Only a structure at the start or the end of the answer counts: a reply that mentions a
//! call in the middle of a sentence is an ordinary reply.

use serde_json::Value;

/// What the retried request adds after the stray answer (never stored in history).
pub const NUDGE: &str = "Your last answer wrote a tool call as text, so it was not run and \
nobody saw it. To use a tool, call it through the tool interface (a function call), not in \
the message text. If no tool is needed, answer in plain words.";

/// The reply when the retry wrote a tool call as text again.
pub const APOLOGY: &str = "Sorry, something went wrong on my side: I tried to use a tool in a \
way that did not work. Please ask again, perhaps in other words.";

/// Special tokens of chat templates that never belong in a reply, wherever they are.
const TOKENS: &[&str] = &[
    "<|python_tag|>",
    "<|tool_call|>",
    "<|tool_calls|>",
    "<|tool_call_begin|>",
    "<|tool_calls_section_begin|>",
    "<|function_call|>",
    "<\u{ff5c}tool\u{2581}calls\u{2581}begin\u{ff5c}>",
    "<\u{ff5c}tool\u{2581}call\u{2581}begin\u{ff5c}>",
    "[TOOL_CALLS]",
];

/// Tags that open a written call (the answer starts with one).
const OPENERS: &[&str] = &[
    "<tool_call>",
    "<tool_call ",
    "<tool_calls>",
    "<function_calls",
    "<function_call>",
    "<function=",
    "<invoke",
    "<tool_use>",
];

/// Tags that close a written call (the answer ends with one).
const CLOSERS: &[&str] = &[
    "</tool_call>",
    "</tool_calls>",
    "</function_calls>",
    "</function_call>",
    "</function>",
    "</invoke>",
    "</tool_use>",
];

/// How much of the answer's end is searched for a trailing JSON call.
const TAIL_BYTES: usize = 8 * 1024;

/// Whether `text` starts or ends with a tool call written as text (or holds a template's
/// special token anywhere).
pub fn is_stray_call(text: &str) -> bool {
    let text = text.trim();
    if text.is_empty() {
        return false;
    }
    if TOKENS.iter().any(|t| text.contains(t)) {
        return true;
    }
    let lower = text.to_ascii_lowercase();
    if OPENERS.iter().any(|o| lower.starts_with(o)) || CLOSERS.iter().any(|c| lower.ends_with(c)) {
        return true;
    }
    leading_json_call(text) || trailing_json_call(text)
}

/// The text without a Markdown code fence around it (```json … ``` or ``` … ```), at the
/// start (`start`) or the end.
fn unfence(text: &str, start: bool) -> &str {
    if start {
        match text.strip_prefix("```") {
            // The fence's info string (`json`, `tool_code`...) runs to the end of the line.
            Some(rest) => rest
                .split_once('\n')
                .map_or("", |(_, body)| body)
                .trim_start(),
            None => text,
        }
    } else {
        text.strip_suffix("```").map_or(text, str::trim_end)
    }
}

/// The answer opens with a JSON value that is a call (the rest may be anything).
fn leading_json_call(text: &str) -> bool {
    let body = unfence(text, true);
    if !body.starts_with('{') && !body.starts_with('[') {
        return false;
    }
    let mut values = serde_json::Deserializer::from_str(body).into_iter::<Value>();
    matches!(values.next(), Some(Ok(value)) if is_call_value(&value))
}

/// The answer closes with a JSON value that is a call: one that starts at a line start
/// (or after a fence) and runs exactly to the end.
fn trailing_json_call(text: &str) -> bool {
    let body = unfence(text, false);
    if !body.ends_with('}') && !body.ends_with(']') {
        return false;
    }
    let from = body.len().saturating_sub(TAIL_BYTES);
    body.char_indices()
        .filter(|&(i, c)| i >= from && (c == '{' || c == '['))
        .filter(|&(i, _)| {
            let before = body[..i].trim_end_matches([' ', '\t']);
            before.is_empty()
                || before.ends_with('\n')
                || before.ends_with("```")
                || before.ends_with(':')
        })
        .any(|(i, _)| {
            serde_json::from_str::<Value>(&body[i..]).is_ok_and(|value| is_call_value(&value))
        })
}

/// `{"name": "...", "arguments"|"parameters": ...}`, OpenAI's `{"function": {...}}` or
/// `{"tool_calls": [...]}`, or a list of those.
fn is_call_value(value: &Value) -> bool {
    match value {
        Value::Array(items) => !items.is_empty() && items.iter().all(is_call_value),
        Value::Object(map) => {
            let named = map.get("name").is_some_and(Value::is_string);
            let args = ["arguments", "parameters", "args", "input"]
                .iter()
                .any(|k| map.get(*k).is_some_and(|v| v.is_object() || v.is_string()));
            (named && args)
                || map.get("function").is_some_and(is_call_value)
                || map
                    .get("tool_calls")
                    .is_some_and(|v| v.is_array() && is_call_value(v))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CALL: &str = r#"{"name": "memory_save", "arguments": {"text": "x"}}"#;

    #[test]
    fn each_pattern_at_the_start() {
        for text in [
            format!("<tool_call>\n{CALL}\n</tool_call>\nDone."),
            "<function_calls><invoke name=\"x\"></invoke></function_calls> ok".to_owned(),
            format!("{CALL}\nI saved it."),
            format!("```json\n{CALL}\n```\nSaved."),
            format!("[{CALL}] and more"),
            format!("<|python_tag|>{CALL}"),
            format!("[TOOL_CALLS] [{CALL}]"),
            r#"{"function": {"name": "a", "arguments": "{}"}} then"#.to_owned(),
        ] {
            assert!(is_stray_call(&text), "{text}");
        }
    }

    #[test]
    fn each_pattern_at_the_end() {
        for text in [
            format!("Let me save that.\n<tool_call>\n{CALL}\n</tool_call>"),
            "Sure.\n<function_calls>\n<invoke name=\"x\">\n</invoke>\n</function_calls>".to_owned(),
            format!("Saving it now:\n{CALL}"),
            format!("Saving it now:\n```json\n{CALL}\n```"),
            format!("Here: {CALL}"),
            format!("Calling the tool. <|python_tag|>{CALL}"),
        ] {
            assert!(is_stray_call(&text), "{text}");
        }
    }

    #[test]
    fn ordinary_text_is_not_caught() {
        for text in [
            "Hello! How can I help?",
            r#"Use {"name": "a", "arguments": {}} to call it, as the docs say."#,
            "The JSON is {\"a\": 1}",
            "```json\n{\"city\": \"Paris\", \"temp\": 21}\n```",
            "I can call memory_save for you, just ask.",
            "List: [1, 2, 3]",
            "",
        ] {
            assert!(!is_stray_call(text), "{text}");
        }
    }
}
