//! OneBot message segments and their CQ-code string form, both ways.
//!
//! A message reaches parlor either as an array of segments (`{"type","data"}`) or as one
//! string in which text and `[CQ:type,key=value,...]` codes alternate; implementations differ
//! (and some let the user choose), so both become [`Segment`]s here. Text outside a code
//! escapes `&`, `[` and `]` (`&amp;`, `&#91;`, `&#93;`); a parameter value escapes `,` as
//! well (`&#44;`). Parsing never fails: what is not a well-formed code is text, so a user
//! who types `[CQ:` sees it back as typed.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// One segment of a OneBot message: `text`, `at`, `reply`, `image`, `face`, or any other
/// type the implementation sends (kept, so nothing is lost when it is written back).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Segment {
    /// The segment type (`text`, `at`, ...).
    #[serde(rename = "type")]
    pub kind: String,
    /// Its parameters. Values are strings in the CQ form; the array form may carry numbers.
    #[serde(default)]
    pub data: Map<String, Value>,
}

impl Segment {
    /// A segment of type `kind` with string parameters.
    pub fn new<'a>(kind: &str, data: impl IntoIterator<Item = (&'a str, String)>) -> Segment {
        Segment {
            kind: kind.to_owned(),
            data: data
                .into_iter()
                .map(|(key, value)| (key.to_owned(), Value::String(value)))
                .collect(),
        }
    }

    /// A `text` segment.
    pub fn text(text: impl Into<String>) -> Segment {
        Segment::new("text", [("text", text.into())])
    }

    /// Parameter `key` as text: a string as is, a number or boolean written out. `None`
    /// when absent or null.
    pub fn param(&self, key: &str) -> Option<String> {
        match self.data.get(key)? {
            Value::String(text) => Some(text.clone()),
            Value::Null => None,
            Value::Number(number) => Some(number.to_string()),
            Value::Bool(flag) => Some(flag.to_string()),
            other => Some(other.to_string()),
        }
    }
}

/// The escapes of plain text in a CQ string.
pub fn escape_text(text: &str) -> String {
    escape(text, false)
}

/// The escapes of a CQ parameter value (those of text, and `,`).
pub fn escape_value(value: &str) -> String {
    escape(value, true)
}

fn escape(text: &str, comma: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '[' => out.push_str("&#91;"),
            ']' => out.push_str("&#93;"),
            ',' if comma => out.push_str("&#44;"),
            c => out.push(c),
        }
    }
    out
}

/// Undoes [`escape_text`] and [`escape_value`]; any other `&` is left as it stands.
pub fn unescape(text: &str) -> String {
    const ESCAPES: [(&str, char); 4] = [
        ("&amp;", '&'),
        ("&#91;", '['),
        ("&#93;", ']'),
        ("&#44;", ','),
    ];
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        match ESCAPES
            .iter()
            .find(|(escaped, _)| rest.starts_with(escaped))
        {
            Some((escaped, plain)) => {
                out.push(*plain);
                rest = &rest[escaped.len()..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Reads a CQ string into segments. Text between codes becomes `text` segments
/// (unescaped; adjacent text merged); `[CQ:type,k=v,...]` becomes a segment of that type.
/// A `[CQ:` that does not close, or whose type is empty, is text.
pub fn parse(message: &str) -> Vec<Segment> {
    let mut segments: Vec<Segment> = Vec::new();
    let mut text = String::new();
    let mut rest = message;
    while let Some(start) = rest.find("[CQ:") {
        let code = &rest[start + 4..];
        // A value cannot hold a raw `]` (it is escaped), so the first one closes the code.
        let parsed = code
            .find(']')
            .and_then(|end| Some((parse_code(&code[..end])?, end)));
        match parsed {
            Some((segment, end)) => {
                text.push_str(&rest[..start]);
                flush_text(&mut segments, &mut text);
                segments.push(segment);
                rest = &code[end + 1..];
            }
            None => {
                text.push_str(&rest[..start + 4]);
                rest = code;
            }
        }
    }
    text.push_str(rest);
    flush_text(&mut segments, &mut text);
    segments
}

/// `type,k=v,...` (the inside of a code) as a segment; `None` when the type is empty or
/// holds what a type cannot (a raw `[`, whitespace).
fn parse_code(inside: &str) -> Option<Segment> {
    let mut parts = inside.split(',');
    let kind = parts.next().unwrap_or_default();
    if kind.is_empty() || kind.contains(['[', '&']) || kind.chars().any(char::is_whitespace) {
        return None;
    }
    let mut data = Map::new();
    for part in parts {
        // "The part before the first `=` is the name"; a part without one names a flag.
        let (key, value) = part.split_once('=').unwrap_or((part, ""));
        data.insert(unescape(key), Value::String(unescape(value)));
    }
    Some(Segment {
        kind: kind.to_owned(),
        data,
    })
}

/// Moves collected raw text into `segments` as one unescaped `text` segment.
fn flush_text(segments: &mut Vec<Segment>, text: &mut String) {
    if text.is_empty() {
        return;
    }
    let plain = unescape(text);
    text.clear();
    if let Some(last) = segments.last_mut()
        && last.kind == "text"
        && let Some(Value::String(previous)) = last.data.get_mut("text")
    {
        previous.push_str(&plain);
        return;
    }
    segments.push(Segment::text(plain));
}

/// Writes segments as a CQ string: `text` escaped, every other segment as a code with its
/// parameters in order, values escaped.
pub fn to_string(segments: &[Segment]) -> String {
    let mut out = String::new();
    for segment in segments {
        if segment.kind == "text" {
            out.push_str(&escape_text(&segment.param("text").unwrap_or_default()));
            continue;
        }
        out.push_str("[CQ:");
        out.push_str(&escape_value(&segment.kind));
        for key in segment.data.keys() {
            out.push(',');
            out.push_str(&escape_value(key));
            out.push('=');
            out.push_str(&escape_value(&segment.param(key).unwrap_or_default()));
        }
        out.push(']');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_standards_examples_read_as_meant() {
        let segments = parse("[CQ:face,id=178]看看我刚拍的照片[CQ:image,file=123.jpg]");
        assert_eq!(
            segments,
            vec![
                Segment::new("face", [("id", "178".to_owned())]),
                Segment::text("看看我刚拍的照片"),
                Segment::new("image", [("file", "123.jpg".to_owned())]),
            ]
        );
        let share = parse("[CQ:share,title=震惊&#44;小伙=睡觉,url=http://x/?a=1&amp;b=2]");
        assert_eq!(share[0].param("title").as_deref(), Some("震惊,小伙=睡觉"));
        assert_eq!(share[0].param("url").as_deref(), Some("http://x/?a=1&b=2"));
        assert_eq!(parse("[CQ:shake]"), vec![Segment::new("shake", [])]);
    }

    #[test]
    fn text_escapes_both_ways() {
        let plain = "- [x] 使用 `&data` 获取地址, ok";
        let escaped = escape_text(plain);
        assert_eq!(escaped, "- &#91;x&#93; 使用 `&amp;data` 获取地址, ok");
        assert_eq!(parse(&escaped), vec![Segment::text(plain)]);
        assert_eq!(escape_value("a,b&[c]"), "a&#44;b&amp;&#91;c&#93;");
        assert_eq!(unescape("&amp;#91; &lt; &"), "&#91; &lt; &");
    }

    #[test]
    fn broken_codes_are_text() {
        for raw in [
            "[CQ:",
            "[CQ:face,id=1",
            "[CQ:]",
            "a [CQ: x] b",
            "[CQ:[CQ:at,qq=1]",
        ] {
            let text: String = parse(raw)
                .iter()
                .filter(|s| s.kind == "text")
                .filter_map(|s| s.param("text"))
                .collect();
            assert!(
                raw.starts_with(&text) || text.starts_with("[CQ:"),
                "{raw:?} -> {text:?}"
            );
        }
        assert_eq!(
            parse("[CQ:[CQ:at,qq=1]"),
            vec![
                Segment::text("[CQ:"),
                Segment::new("at", [("qq", "1".to_owned())])
            ]
        );
    }

    #[test]
    fn segments_written_and_read_back_are_the_same() {
        let segments = vec![
            Segment::new("reply", [("id", "-12".to_owned())]),
            Segment::new("at", [("qq", "10001".to_owned())]),
            Segment::text(" a [b], c & d"),
            Segment::new(
                "image",
                [
                    ("file", "x,y].png".to_owned()),
                    ("url", "http://h/?a=1&b=2".to_owned()),
                ],
            ),
        ];
        let text = to_string(&segments);
        assert_eq!(
            text,
            "[CQ:reply,id=-12][CQ:at,qq=10001] a &#91;b&#93;, c &amp; d\
             [CQ:image,file=x&#44;y&#93;.png,url=http://h/?a=1&amp;b=2]"
        );
        assert_eq!(parse(&text), segments);
    }

    #[test]
    fn numbers_in_the_array_form_read_as_text() {
        let segment: Segment =
            serde_json::from_str(r#"{"type":"at","data":{"qq":10001}}"#).expect("a segment");
        assert_eq!(segment.param("qq").as_deref(), Some("10001"));
        assert_eq!(to_string(&[segment]), "[CQ:at,qq=10001]");
    }

    /// The property `fuzz/fuzz_targets/onebot.rs` checks, on inputs that tempt it.
    #[test]
    fn writing_what_was_read_reads_back_the_same() {
        for raw in [
            "[CQ:reply,id=7][CQ:at,qq=42] /help &#91;x&#93; &amp; [CQ:face,id=178]",
            "[CQ:a,]",
            "[CQ:a,=,==,k=v=w]",
            "&amp;#91; &#9 && [CQ:",
            "[CQ:x=y,k]]",
            "[CQ:a,k=1,k=2]",
            "[[CQ:b]]",
            "[CQ:a\n,b=c]",
            "]]&#93;[",
        ] {
            let segments = parse(raw);
            let written = to_string(&segments);
            assert_eq!(parse(&written), segments, "{raw:?} -> {written:?}");
        }
    }
}
