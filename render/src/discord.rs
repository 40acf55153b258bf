//! Discord: Markdown source that Discord renders as intended.
//!
//! Bold, italic, strikethrough, inline code, code blocks, quotes (`> `) and lists (`-`,
//! `1.`) use Discord's own syntax; every other Markdown character in the text is
//! backslash-escaped so that nothing renders by accident (bare URLs stay as they are, so that
//! Discord links them). Headings are bold lines (Discord's `#` headings are very large in a
//! chat); tables are aligned code blocks (or `Header: value` records when wider than
//! [`super::TABLE_MAX_WIDTH`] columns); images are `🖼 [alt](<url>)` links; links are masked
//! links `[text](<url>)` (the angle brackets stop Discord from embedding a preview of every
//! link), only for http and https.
//!
//! Parts stay within [`MAX_MESSAGE_CHARS`], counted in UTF-16 code units (never fewer than
//! chars, so the limit holds however Discord counts). A cut closes every open marker and
//! reopens it in the next part, code fences included (with the same language).

use super::ir::Document;
use super::layout::{self, Ent, Flavor, Kind, Rich};
use super::split::{self, utf16_len};

/// Discord's limit for a message's content.
pub const MAX_MESSAGE_CHARS: usize = 2000;

/// Options for [`render`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiscordOptions {
    /// Keep `@everyone`, `@here` and role mentions (`<@&id>`) as written. When `false` (the
    /// default) a zero-width space after the `@` stops them from pinging anyone. User
    /// mentions (`<@id>`) are never touched. The adapter should also send `allowed_mentions`.
    pub allow_mass_mentions: bool,
}

/// Renders Markdown as Discord messages of at most [`MAX_MESSAGE_CHARS`] each. Input that
/// renders to nothing gives no parts.
pub fn render(markdown: &str, options: DiscordOptions) -> Vec<String> {
    render_document(&super::parse(markdown), options)
}

/// Renders a parsed document as Discord messages of at most [`MAX_MESSAGE_CHARS`] each.
pub fn render_document(doc: &Document, options: DiscordOptions) -> Vec<String> {
    let rich = layout::layout(doc, Flavor::Discord);
    let mut parts = Vec::new();
    emit(&rich, options, &mut parts);
    parts
}

/// Cuts the visible text into parts, then serializes each. Markers and escapes make a part
/// longer than its visible text, so when a part comes out too long its cut is chosen again
/// with a proportionally smaller budget (and the next part starts from there with the full
/// budget again). One char with every marker around it stays far below the limit (link
/// destinations and languages are capped), so this ends.
fn emit(rich: &Rich, options: DiscordOptions, out: &mut Vec<String>) {
    let mut start = split::first_start(rich);
    let mut budget = MAX_MESSAGE_CHARS;
    while let Some((part, next)) = split::next_part(rich, start, budget, true) {
        let Some(part) = part else {
            start = next;
            continue;
        };
        let mut markdown = serialize(&part);
        if !options.allow_mass_mentions {
            markdown = neutralize_mentions(&markdown);
        }
        let len = utf16_len(&markdown);
        if len > MAX_MESSAGE_CHARS && budget > 1 {
            budget = (budget * MAX_MESSAGE_CHARS / len).min(budget - 1).max(1);
            continue;
        }
        out.push(markdown);
        start = next;
        budget = MAX_MESSAGE_CHARS;
    }
}

/// Inserts Markdown markers for the part's ranges.
fn serialize(part: &Rich) -> String {
    let text = part.text.as_str();
    // Discord ignores `** x**`: emphasis and links hug their text.
    let mut ents: Vec<Ent> = part
        .entities
        .iter()
        .filter_map(|e| match e.kind {
            Kind::Pre(_) | Kind::Code | Kind::Quote => Some(e.clone()),
            _ => {
                let slice = &text[e.start..e.end];
                let start = e.start + (slice.len() - slice.trim_start().len());
                let end = e.start + slice.trim_end().len();
                (start < end).then(|| Ent {
                    kind: e.kind.clone(),
                    start,
                    end,
                })
            }
        })
        .collect();
    let mut sorted = Rich {
        text: String::new(),
        entities: std::mem::take(&mut ents),
    };
    sorted.sort();
    let ents = sorted.entities;

    // (position, 0 = close / 1 = open, index): closes first, inner closes first, outer
    // opens first.
    let mut events: Vec<(usize, u8, usize)> = Vec::with_capacity(ents.len() * 2);
    for (i, e) in ents.iter().enumerate() {
        events.push((e.start, 1, i));
        events.push((e.end, 0, i));
    }
    events.sort_by(|a, b| {
        a.0.cmp(&b.0).then(a.1.cmp(&b.1)).then(if a.1 == 0 {
            b.2.cmp(&a.2)
        } else {
            a.2.cmp(&b.2)
        })
    });

    let mut out = String::with_capacity(text.len() + 16);
    let mut cursor = 0;
    for (pos, open, i) in events {
        if pos > cursor {
            out.push_str(&text[cursor..pos]);
            cursor = pos;
        }
        let e = &ents[i];
        match (&e.kind, open == 1) {
            (Kind::Bold, _) => out.push_str("**"),
            (Kind::Strike, _) => out.push_str("~~"),
            (Kind::Italic, _) => out.push(italic_marker(text, e)),
            (Kind::Code, true) => {
                out.push_str(&inline_code(&text[e.start..e.end]));
                cursor = cursor.max(e.end);
            }
            (Kind::Code, false) | (Kind::Quote, _) => {}
            (Kind::Link(_), true) => out.push('['),
            (Kind::Link(url), false) => {
                out.push_str("](<");
                out.push_str(url);
                out.push_str(">)");
            }
            (Kind::Pre(language), true) => {
                out.push_str("```");
                out.push_str(&fence_language(language.as_deref()));
                out.push('\n');
            }
            (Kind::Pre(_), false) => out.push_str("\n```"),
        }
    }
    if cursor < text.len() {
        out.push_str(&text[cursor..]);
    }
    out
}

/// `_` reads best and cannot merge with a neighbouring `**`, but Discord only takes it at
/// word boundaries; inside a word `*` it is.
fn italic_marker(text: &str, e: &Ent) -> char {
    let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
    let before = text[..e.start].chars().next_back();
    let after = text[e.end..].chars().next();
    if word(before) || word(after) {
        '*'
    } else {
        '_'
    }
}

/// Inline code with a fence longer than any backtick run inside; Discord has no fence for
/// code containing a double backtick (three would start a code block), so such code becomes
/// escaped text.
fn inline_code(content: &str) -> String {
    if !content.contains('`') {
        format!("`{content}`")
    } else if !content.contains("``") {
        format!("`` {content} ``")
    } else {
        let mut escaped = String::with_capacity(content.len() * 2);
        for c in content.chars() {
            if "\\*_~`|[]".contains(c) {
                escaped.push('\\');
            }
            escaped.push(c);
        }
        escaped
    }
}

/// Discord reads a fence's info as a language only if it is a plain identifier; anything
/// else would become the first line of code.
fn fence_language(language: Option<&str>) -> String {
    match language {
        Some(l)
            if !l.is_empty()
                && l.len() <= 32
                && l.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_+-.#".contains(c)) =>
        {
            l.to_string()
        }
        _ => String::new(),
    }
}

/// A zero-width space after the `@` of `@everyone`, `@here` (any case) and `<@&role>`.
fn neutralize_mentions(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('@') {
        let after = &rest[i + 1..];
        out.push_str(&rest[..=i]);
        let starts = |word: &str| {
            after
                .as_bytes()
                .get(..word.len())
                .is_some_and(|b| b.eq_ignore_ascii_case(word.as_bytes()))
        };
        let role = out.ends_with("<@") && after.starts_with('&');
        if starts("everyone") || starts("here") || role {
            out.push('\u{200B}');
        }
        rest = after;
    }
    out.push_str(rest);
    out
}
