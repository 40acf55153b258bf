//! Character-safe cutting of text: every place that bounds a text for the model, a log line
//! or an error message cuts it here, never inside a UTF-8 character: the first characters
//! ([`split_chars`], [`clip_with`], [`ellipsize`]), the last ones ([`last_chars`]), or up to
//! a byte offset someone else counted ([`up_to_byte`]).

use std::borrow::Cow;

/// The first `max` characters of `text`, and the rest after them (empty when nothing was
/// cut).
pub fn split_chars(text: &str, max: usize) -> (&str, &str) {
    // A text has no more characters than bytes: most texts are short, and need no walk.
    if text.len() <= max {
        return (text, "");
    }
    match text.char_indices().nth(max) {
        Some((at, _)) => text.split_at(at),
        None => (text, ""),
    }
}

/// The last `max` characters of `text` (all of it when it is shorter).
pub fn last_chars(text: &str, max: usize) -> &str {
    match max
        .checked_sub(1)
        .and_then(|skip| text.char_indices().rev().nth(skip))
    {
        Some((at, _)) => &text[at..],
        None if max == 0 => "",
        None => text,
    }
}

/// `text` up to byte `index`, moved back to a character boundary when `index` falls inside
/// a character (or past the end).
pub fn up_to_byte(text: &str, index: usize) -> &str {
    &text[..text.floor_char_boundary(index)]
}

/// `text` cut to `max` characters; when it was cut, `mark` (given the part cut off) says so
/// after the kept part.
pub fn clip_with(text: &str, max: usize, mark: impl FnOnce(&str) -> String) -> Cow<'_, str> {
    match split_chars(text, max) {
        (_, "") => Cow::Borrowed(text),
        (head, rest) => Cow::Owned(format!("{head}{}", mark(rest))),
    }
}

/// `text` cut to `max` characters, with `…` after it when it was cut.
pub fn ellipsize(text: &str, max: usize) -> Cow<'_, str> {
    clip_with(text, max, |_| "…".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_fall_on_character_boundaries() {
        assert_eq!(split_chars("héllo wörld", 5), ("héllo", " wörld"));
        assert_eq!(split_chars("héllo", 5), ("héllo", ""));
        assert_eq!(split_chars("", 0), ("", ""));
        assert_eq!(last_chars("héllo wörld", 5), "wörld");
        assert_eq!(last_chars("hé", 5), "hé");
        assert_eq!(last_chars("hé", 0), "");
        assert_eq!(last_chars("", 3), "");
        assert_eq!(up_to_byte("héllo", 2), "h");
        assert_eq!(up_to_byte("héllo", 3), "hé");
        assert_eq!(up_to_byte("hé", 10), "hé");
        assert_eq!(ellipsize("héllo wörld", 2), "hé…");
        assert_eq!(ellipsize("hé", 2), "hé");
        assert_eq!(
            clip_with("abcdef", 2, |rest| format!(" [+{}]", rest.chars().count())),
            "ab [+4]"
        );
    }
}
