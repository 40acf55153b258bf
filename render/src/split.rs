//! Cutting laid-out text into message-sized parts: at a paragraph break, else a line break,
//! else a word boundary, else anywhere between two chars. Every range is clipped to each part
//! it touches, so a range crossing a cut becomes one range per part (a code block is closed
//! and reopened).

use super::layout::{Ent, Kind, Rich};

/// Splits `rich` into parts of at most `limit` UTF-16 code units (Telegram's unit; Discord
/// counts no more than that).
///
/// A cut prefers the last paragraph break, then line break, then space that keeps the part
/// at least half full; failing that, any such boundary; failing that, a hard cut between two
/// chars (with `protect_escapes`, never right after a `\`, which would escape the next
/// part's first char or a closing marker). Parts are trimmed at the end and skip the
/// separator at the start (leading spaces inside a code block are kept: they are
/// indentation). Whitespace-only parts are dropped. A part holds at least one char, so a
/// char larger than `limit` still makes progress.
pub(crate) fn split(rich: Rich, limit: usize, protect_escapes: bool) -> Vec<Rich> {
    let mut start = first_start(&rich);
    // Most replies fit one part: the layout's text (already trimmed at the end) is that
    // part as it is, with no copy of its text and ranges.
    // A char has no more UTF-16 units than bytes, so most texts need no counting.
    let fits = rich.text.len() <= limit || utf16_len(&rich.text) <= limit;
    if start == 0 && !rich.text.is_empty() && fits {
        return vec![rich];
    }
    let mut parts = Vec::new();
    while let Some((part, next)) = next_part(&rich, start, limit, protect_escapes) {
        parts.extend(part);
        start = next;
    }
    parts
}

/// Where the first part begins (leading separators skipped).
pub(crate) fn first_start(rich: &Rich) -> usize {
    skip_separator(rich, 0)
}

/// The part beginning at byte `start` (`None` if only whitespace remains there) and where
/// the following one begins; `None` once `start` is at the end. See [`split`].
pub(crate) fn next_part(
    rich: &Rich,
    start: usize,
    limit: usize,
    protect_escapes: bool,
) -> Option<(Option<Rich>, usize)> {
    let text = rich.text.as_str();
    if start >= text.len() {
        return None;
    }
    let (hard, half) = measure(text, start, limit);
    if hard >= text.len() {
        return Some((part(rich, start, text.len()), text.len()));
    }
    let end = cut(text, start, hard, half, protect_escapes);
    Some((part(rich, start, end), skip_separator(rich, end)))
}

/// Total size of `s` in UTF-16 code units.
pub(crate) fn utf16_len(s: &str) -> usize {
    // Every char but a UTF-8 continuation byte starts a unit; four-byte chars take two.
    let mut units = 0;
    for &b in s.as_bytes() {
        units += usize::from(b & 0xC0 != 0x80) + usize::from(b >= 0xF0);
    }
    units
}

/// From `start`: the byte index of the first char that does not fit in `limit` UTF-16
/// units, and the byte index where the part would be half full. Reads UTF-8 lead bytes
/// directly: 1 unit per char, 2 for a four-byte char (a surrogate pair).
fn measure(text: &str, start: usize, limit: usize) -> (usize, usize) {
    let bytes = text.as_bytes();
    let mut used = 0;
    let mut half = start;
    let mut i = start;
    while let Some(&lead) = bytes.get(i) {
        let (units, len) = match lead {
            0x00..=0x7F => (1, 1),
            0xF0..=0xFF => (2, 4),
            0xE0..=0xEF => (1, 3),
            _ => (1, 2),
        };
        if used + units > limit {
            // Always take at least one char.
            let at = if i == start { i + len } else { i };
            return (at.min(text.len()), half);
        }
        used += units;
        i += len;
        if used * 2 <= limit {
            half = i;
        }
    }
    (text.len(), half)
}

/// Chooses where the part starting at `start` ends (exclusive), `hard` being the first byte
/// that does not fit.
fn cut(text: &str, start: usize, hard: usize, half: usize, protect_escapes: bool) -> usize {
    // A separator right at `hard` is a fine cut: it is not part of either part.
    let window_end = match text[hard..].chars().next() {
        Some(c) if c.is_whitespace() => hard + c.len_utf8(),
        _ => hard,
    };
    let window = &text[start..window_end];
    let candidates = [
        window.rfind("\n\n"),
        window.rfind('\n'),
        window.rfind([' ', '\t']),
    ];
    let has_content = |p: usize| !text[start..p].trim().is_empty();
    for min in [half, start + 1] {
        for p in candidates.iter().flatten().map(|p| start + p) {
            if p >= min && has_content(p) {
                return p;
            }
        }
    }
    let mut end = hard;
    if protect_escapes && text[..end].ends_with('\\') {
        let back = end - 1;
        if back > start {
            end = back;
        }
    }
    end
}

/// Skips the separator at a cut: newlines, and spaces unless they indent code.
fn skip_separator(rich: &Rich, from: usize) -> usize {
    let text = &rich.text;
    let mut at = from;
    for c in text[from..].chars() {
        let skip = c == '\n' || c == '\r' || ((c == ' ' || c == '\t') && !in_pre(rich, at));
        if !skip {
            break;
        }
        at += c.len_utf8();
    }
    at
}

fn in_pre(rich: &Rich, at: usize) -> bool {
    rich.entities
        .iter()
        .any(|e| matches!(e.kind, Kind::Pre(_)) && e.start <= at && at < e.end)
}

/// `rich.text[start..end]` trimmed at the end, with the ranges clipped and re-based.
fn part(rich: &Rich, start: usize, end: usize) -> Option<Rich> {
    let end = start + rich.text[start..end].trim_end().len();
    if end <= start {
        return None;
    }
    let entities = rich
        .entities
        .iter()
        .filter_map(|e| {
            let s = e.start.max(start);
            let t = e.end.min(end);
            (s < t).then(|| Ent {
                kind: e.kind.clone(),
                start: s - start,
                end: t - start,
            })
        })
        .collect();
    Some(Rich {
        text: rich.text[start..end].to_string(),
        entities,
    })
}
