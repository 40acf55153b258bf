//! Character-safe cutting of text: every place that bounds a text for the model, a log line
//! or an error message cuts it here, never inside a UTF-8 character.

use std::borrow::Cow;

/// The first `max` characters of `text`, and the rest after them (empty when nothing was
/// cut).
pub fn split_chars(text: &str, max: usize) -> (&str, &str) {
    match text.char_indices().nth(max) {
        Some((at, _)) => text.split_at(at),
        None => (text, ""),
    }
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
        assert_eq!(ellipsize("héllo wörld", 2), "hé…");
        assert_eq!(ellipsize("hé", 2), "hé");
        assert_eq!(
            clip_with("abcdef", 2, |rest| format!(" [+{}]", rest.chars().count())),
            "ab [+4]"
        );
    }
}
