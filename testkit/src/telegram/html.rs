//! Telegram's HTML parse mode: turns `<b>`, `<a href>`, `<pre><code>` and
//! friends into plain text plus entities, rejecting what Telegram rejects.

use serde_json::{Value, json};

use super::builders::{entity, sort_entities, utf16_len};

struct OpenTag {
    name: String,
    start: usize,
    attrs: Vec<(String, String)>,
    /// Language set by a nested `<code class="language-...">`.
    language: Option<String>,
}

impl OpenTag {
    fn attr(&self, key: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

const HTML_TAGS: [&str; 17] = [
    "b",
    "strong",
    "i",
    "em",
    "u",
    "ins",
    "s",
    "strike",
    "del",
    "span",
    "tg-spoiler",
    "a",
    "code",
    "pre",
    "blockquote",
    "tg-emoji",
    "tg-time",
];

/// Parses Telegram's HTML parse mode into plain text and entities (offsets in
/// UTF-16 units), with error messages modelled on Telegram's.
pub(super) fn parse_html(src: &str) -> Result<(String, Vec<Value>), String> {
    let bytes = src.as_bytes();
    let mut out = String::new();
    // Length of `out` in UTF-16 units, kept up to date.
    let mut units = 0;
    let mut stack: Vec<OpenTag> = Vec::new();
    let mut entities: Vec<Value> = Vec::new();
    let mut i = 0;
    while i < src.len() {
        match bytes[i] {
            b'<' => {
                let Some(rel_end) = src[i..].find('>') else {
                    return Err(format!("Unclosed start tag at byte offset {i}"));
                };
                let end = i + rel_end;
                let inner = &src[i + 1..end];
                if let Some(name) = inner.strip_prefix('/') {
                    let name = name.trim().to_ascii_lowercase();
                    let Some(open) = stack.pop() else {
                        return Err(format!("Unexpected end tag at byte offset {i}"));
                    };
                    if open.name != name {
                        return Err(format!(
                            "Unmatched end tag at byte offset {i}, expected \"</{}>\", found \"</{name}>\"",
                            open.name
                        ));
                    }
                    close_tag(open, units, stack.last_mut(), &mut entities);
                } else {
                    let name_len = inner
                        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                        .unwrap_or(inner.len());
                    let name = inner[..name_len].to_ascii_lowercase();
                    if !HTML_TAGS.contains(&name.as_str()) {
                        return Err(format!(
                            "Unsupported start tag \"{name}\" at byte offset {i}"
                        ));
                    }
                    let attrs = parse_attrs(&inner[name_len..]);
                    let tag = OpenTag {
                        name,
                        start: units,
                        attrs,
                        language: None,
                    };
                    if tag.name == "span" && tag.attr("class") != Some("tg-spoiler") {
                        return Err(format!(
                            "Tag \"span\" must have class \"tg-spoiler\" at byte offset {i}"
                        ));
                    }
                    stack.push(tag);
                }
                i = end + 1;
            }
            b'&' => {
                let (decoded, used) = decode_entity(&src[i..]);
                units += utf16_len(&decoded);
                out.push_str(&decoded);
                i += used;
            }
            _ => {
                let ch = src[i..].chars().next().unwrap_or_default();
                out.push(ch);
                units += ch.len_utf16();
                i += ch.len_utf8();
            }
        }
    }
    if let Some(open) = stack.pop() {
        return Err(format!(
            "Can't find end tag corresponding to start tag \"{}\"",
            open.name
        ));
    }
    sort_entities(&mut entities);
    Ok((out, entities))
}

fn close_tag(open: OpenTag, end: usize, parent: Option<&mut OpenTag>, entities: &mut Vec<Value>) {
    let length = end - open.start;
    if open.name == "code"
        && let Some(parent) = parent
        && parent.name == "pre"
    {
        // `<pre><code class="language-x">` is one pre entity.
        if let Some(lang) = open.attr("class").and_then(|c| c.strip_prefix("language-")) {
            parent.language = Some(lang.to_owned());
        }
        return;
    }
    if length == 0 {
        return;
    }
    let mut e = entity("", open.start, length);
    let kind = match open.name.as_str() {
        "b" | "strong" => "bold",
        "i" | "em" => "italic",
        "u" | "ins" => "underline",
        "s" | "strike" | "del" => "strikethrough",
        "span" | "tg-spoiler" => "spoiler",
        "code" => "code",
        "pre" => {
            if let Some(lang) = &open.language {
                e["language"] = json!(lang);
            }
            "pre"
        }
        "blockquote" => {
            if open.attrs.iter().any(|(k, _)| k == "expandable") {
                "expandable_blockquote"
            } else {
                "blockquote"
            }
        }
        "tg-emoji" => {
            let Some(id) = open.attr("emoji-id") else {
                return;
            };
            e["custom_emoji_id"] = json!(id);
            "custom_emoji"
        }
        "tg-time" => {
            let Some(unix) = open.attr("unix").and_then(|u| u.parse::<i64>().ok()) else {
                return;
            };
            e["unix_time"] = json!(unix);
            if let Some(f) = open.attr("format") {
                e["date_time_format"] = json!(f);
            }
            "date_time"
        }
        "a" => {
            let Some(href) = open.attr("href").filter(|h| !h.is_empty()) else {
                return;
            };
            if let Some(id) = href
                .strip_prefix("tg://user?id=")
                .and_then(|id| id.parse::<i64>().ok())
            {
                e["user"] = json!({"id": id, "is_bot": false, "first_name": format!("user{id}")});
                "text_mention"
            } else {
                let url = if href.contains(':') {
                    href.to_owned()
                } else {
                    format!("http://{href}")
                };
                e["url"] = json!(url);
                "text_link"
            }
        }
        _ => return,
    };
    e["type"] = json!(kind);
    entities.push(e);
}

fn parse_attrs(mut s: &str) -> Vec<(String, String)> {
    let mut attrs = Vec::new();
    loop {
        s = s.trim_start();
        let name_len = s
            .find(|c: char| c.is_whitespace() || c == '=')
            .unwrap_or(s.len());
        if name_len == 0 {
            break;
        }
        let name = s[..name_len].to_ascii_lowercase();
        s = s[name_len..].trim_start();
        let value = if let Some(rest) = s.strip_prefix('=') {
            let rest = rest.trim_start();
            let (value, tail) = match rest.chars().next() {
                Some(q @ ('"' | '\'')) => {
                    let body = &rest[1..];
                    let end = body.find(q).unwrap_or(body.len());
                    (&body[..end], body.get(end + 1..).unwrap_or(""))
                }
                _ => {
                    let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
                    (&rest[..end], &rest[end..])
                }
            };
            s = tail;
            let mut decoded = String::new();
            let mut j = 0;
            while j < value.len() {
                if value.as_bytes()[j] == b'&' {
                    let (d, used) = decode_entity(&value[j..]);
                    decoded.push_str(&d);
                    j += used;
                } else {
                    let ch = value[j..].chars().next().unwrap_or_default();
                    decoded.push(ch);
                    j += ch.len_utf8();
                }
            }
            decoded
        } else {
            String::new()
        };
        attrs.push((name, value));
    }
    attrs
}

/// Decodes the HTML entity at the start of `s` (which starts with `&`);
/// returns the text and how many bytes were consumed. Unknown entities are
/// kept literally, as Telegram does.
fn decode_entity(s: &str) -> (String, usize) {
    let Some(semi) = s.find(';').filter(|p| *p <= 12) else {
        return ("&".to_owned(), 1);
    };
    let name = &s[1..semi];
    let decoded = match name {
        "lt" => Some('<'),
        "gt" => Some('>'),
        "amp" => Some('&'),
        "quot" => Some('"'),
        _ => name.strip_prefix('#').and_then(|num| {
            let code = match num.strip_prefix(['x', 'X']) {
                Some(h) => u32::from_str_radix(h, 16).ok(),
                None => num.parse().ok(),
            };
            code.and_then(char::from_u32)
        }),
    };
    match decoded {
        Some(c) => (c.to_string(), semi + 1),
        None => ("&".to_owned(), 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn html_parses_to_plain_text_and_entities() {
        let (text, entities) = parse_html(
            "<b>héllo 👋</b> &lt;x&gt; <pre><code class=\"language-rust\">fn</code></pre>",
        )
        .unwrap();
        assert_eq!(text, "héllo 👋 <x> fn");
        assert_eq!(
            entities,
            vec![
                json!({"type":"bold","offset":0,"length":8}),
                json!({"type":"pre","offset":13,"length":2,"language":"rust"}),
            ]
        );
    }

    #[test]
    fn html_errors_look_like_telegram() {
        assert_eq!(
            parse_html("<b>x").unwrap_err(),
            "Can't find end tag corresponding to start tag \"b\""
        );
        assert!(
            parse_html("a <foo>b</foo>")
                .unwrap_err()
                .starts_with("Unsupported start tag \"foo\"")
        );
        assert!(
            parse_html("<b><i>x</b></i>")
                .unwrap_err()
                .starts_with("Unmatched end tag")
        );
        assert_eq!(parse_html("a & b &amp; c").unwrap().0, "a & b & c");
    }
}
