//! Model text -> the Telegram messages that carry it.
//!
//! Today the text goes out as plain text (no `parse_mode`), split to Telegram's length limit.
//! Rendering Markdown to Telegram HTML belongs here later: [`render`] is the one seam the
//! sender calls, so only this file changes.

/// Telegram's limit for `sendMessage.text`, in UTF-16 code units.
pub const MAX_MESSAGE_UTF16: usize = 4096;

/// Turns the model's text into the parts to send, in order: each non-empty and at most
/// [`MAX_MESSAGE_UTF16`] UTF-16 code units. Empty (or all-whitespace) text gives no parts.
pub fn render(text: &str) -> Vec<String> {
    split_utf16(text, MAX_MESSAGE_UTF16)
}

/// Splits `text` into parts of at most `limit` UTF-16 code units (`limit` >= 2, so that a
/// character outside the BMP always fits).
///
/// A cut prefers, within the second half of the window that fits, a paragraph break, then a
/// line break, then any whitespace; failing that, any whitespace at all; failing that, the
/// last character that fits (never half a surrogate pair: cuts are between `char`s). The
/// whitespace at a cut is dropped, as is trailing whitespace of a part; nothing else is lost,
/// so the parts concatenated equal the input up to whitespace at the cuts.
pub fn split_utf16(text: &str, limit: usize) -> Vec<String> {
    let limit = limit.max(2);
    let mut parts = Vec::new();
    let mut rest = text;
    loop {
        let window_end = fitting_prefix(rest, limit);
        if window_end == rest.len() {
            push_part(&mut parts, rest);
            return parts;
        }
        let (cut, resume) = choose_cut(rest, window_end);
        push_part(&mut parts, &rest[..cut]);
        rest = &rest[resume..];
    }
}

fn push_part(parts: &mut Vec<String>, part: &str) {
    let part = part.trim_end();
    // Telegram refuses an empty or all-whitespace text.
    if !part.trim_start().is_empty() {
        parts.push(part.to_owned());
    }
}

/// The byte length of the longest prefix of `text` within `limit` UTF-16 units.
fn fitting_prefix(text: &str, limit: usize) -> usize {
    let mut units = 0;
    for (byte, ch) in text.char_indices() {
        units += ch.len_utf16();
        if units > limit {
            return byte;
        }
    }
    text.len()
}

/// Where to end this part (`cut`) and where the next begins (`resume`), given that
/// `text[..window_end]` is the most that fits and more follows.
fn choose_cut(text: &str, window_end: usize) -> (usize, usize) {
    // Whitespace right after the window is a fine place to cut too: it is dropped, so the
    // part still fits. Extend the searched region over up to two such characters (`\n\n`).
    let mut region_end = window_end;
    for ch in text[window_end..].chars().take(2) {
        if !ch.is_whitespace() {
            break;
        }
        region_end += ch.len_utf8();
    }
    let region = &text[..region_end];
    // A cut in the first half of the window would leave a needlessly short part.
    let half = floor_char_boundary(text, window_end / 2);
    let tail = &region[half..];

    let newline_run_end = |at: usize| {
        at + text[at..]
            .find(|ch: char| ch != '\n' && ch != '\r')
            .unwrap_or(text.len() - at)
    };
    if let Some(at) = tail.rfind("\n\n") {
        let at = half + at;
        return (at, newline_run_end(at));
    }
    if let Some(at) = tail.rfind('\n') {
        let at = half + at;
        return (at, newline_run_end(at));
    }
    let last_whitespace = |haystack: &str| {
        haystack
            .char_indices()
            .rev()
            .find(|&(_, ch)| ch.is_whitespace())
            .map(|(at, ch)| (at, at + ch.len_utf8()))
    };
    if let Some((at, after)) = last_whitespace(tail) {
        return (half + at, half + after);
    }
    match last_whitespace(region) {
        Some((at, after)) if at > 0 => (at, after),
        _ => (window_end, window_end),
    }
}

/// The largest char boundary of `text` at or before `index`.
fn floor_char_boundary(text: &str, index: usize) -> usize {
    let mut index = index.min(text.len());
    while !text.is_char_boundary(index) {
        index -= 1;
    }
    index
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_one_part_and_empty_text_none() {
        assert_eq!(render("hello"), vec!["hello".to_owned()]);
        assert!(render("").is_empty());
        assert!(render(" \n\n ").is_empty());
    }

    #[test]
    fn prefers_paragraph_then_line_then_word() {
        assert_eq!(
            split_utf16("aaaa bbbb\ncc\n\ndd ee", 12),
            ["aaaa bbbb\ncc", "dd ee"]
        );
        assert_eq!(
            split_utf16("aaaa bbbb\ncc dd ee", 14),
            ["aaaa bbbb", "cc dd ee"]
        );
        assert_eq!(split_utf16("aaaa bbbb cc dd", 12), ["aaaa bbbb cc", "dd"]);
    }

    #[test]
    fn hard_cut_never_splits_a_surrogate_pair() {
        // Five emoji of two units each, limit 5: 2 emoji (4 units) per part.
        assert_eq!(split_utf16("😀😀😀😀😀", 5), ["😀😀", "😀😀", "😀"]);
    }
}
