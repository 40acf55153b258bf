//! Plain text for the console: the Telegram layout without any markup.
//!
//! Bullets, numbers, aligned tables and `———` breaks as on Telegram; links and images show
//! their destination as `text (url)` (http, https, tg and mailto only, and not when the text
//! already is the URL); quotes are prefixed with `> `; code blocks are indented by four
//! spaces. Never split.

use super::ir::Document;
use super::layout::{self, Flavor};

/// Renders Markdown as plain text. Empty when there is nothing to show.
pub fn render(markdown: &str) -> String {
    render_document(&super::parse(markdown))
}

/// Renders a parsed document as plain text.
pub fn render_document(doc: &Document) -> String {
    layout::layout(doc, Flavor::Plain).text
}
