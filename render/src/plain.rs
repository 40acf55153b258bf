//! Plain text for the console: the Telegram layout without any markup.
//!
//! Bullets, numbers, aligned tables and `———` breaks as on Telegram; links and images show
//! their destination as `text (url)` (http, https, tg and mailto only, and not when the text
//! already is the URL); quotes are prefixed with `> `; code blocks are indented by four
//! spaces. [`render`] never splits; [`render_parts`] cuts for platforms that show only
//! plain text (QQ).

use super::ir::Document;
use super::layout::{self, Flavor};
use super::split;

/// Renders Markdown as plain text. Empty when there is nothing to show.
pub fn render(markdown: &str) -> String {
    render_document(&super::parse(markdown))
}

/// Renders a parsed document as plain text.
pub fn render_document(doc: &Document) -> String {
    layout::layout(doc, Flavor::Plain).text
}

/// Renders Markdown as plain-text parts of at most `limit` UTF-16 units (raised to 2, so
/// any char fits), cut at a paragraph break, else a line break, else a space, else between
/// two chars. Empty when there is nothing to show.
pub fn render_parts(markdown: &str, limit: usize) -> Vec<String> {
    let rich = layout::layout(&super::parse(markdown), Flavor::Plain);
    split::split(rich, limit.max(2), false)
        .into_iter()
        .map(|part| part.text)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_fit_the_limit_and_keep_every_word() {
        let text = "word ".repeat(400);
        let parts = render_parts(&text, 100);
        assert!(parts.len() >= 20, "{}", parts.len());
        assert!(parts.iter().all(|p| p.encode_utf16().count() <= 100));
        assert_eq!(parts.join(" ").split_whitespace().count(), 400);
        assert!(render_parts("  \n", 100).is_empty());
        assert_eq!(render_parts("**hi**", 100), vec!["hi".to_owned()]);
    }
}
