//! Telegram: plain text plus an explicit entity list, no `parse_mode`.
//!
//! Telegram refuses a whole message when `parse_mode` markup is broken ("can't parse
//! entities"); explicit entities cannot be broken that way, so every reply is accepted. The
//! entities follow the Bot API's rules: offsets and lengths in UTF-16 code units, any two
//! either disjoint or one inside the other, `pre` and `code` contain nothing and lie inside
//! nothing but a blockquote, blockquotes do not nest, `text_link` only for http, https and tg.
//!
//! Layout: headings are bold lines; lists get `•`/`◦`/`▪` bullets or `1.` numbers indented
//! under their parent, task items `☐`/`☑`; tables an aligned `pre` grid (or `Header: value`
//! records when wider than [`super::TABLE_MAX_WIDTH`] columns); images `🖼 alt` linking to
//! the image; a thematic break `———`; a blank line between blocks.

use serde::{Deserialize, Serialize};

use super::ir::Document;
use super::layout::{self, Flavor, Kind, Rich};
use super::split::{self, utf16_len};

/// Telegram's limit for a message text, in UTF-16 code units after entity parsing.
pub const MAX_MESSAGE_UTF16: usize = 4096;

/// One message to send: `text` with `entities`, within [`MAX_MESSAGE_UTF16`] (or the limit
/// given to [`render_document_with_limit`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TelegramPart {
    /// The message text, never empty, no leading or trailing whitespace (except code
    /// indentation at the start).
    pub text: String,
    /// Formatting of `text`, sorted by offset, outer before inner.
    pub entities: Vec<Entity>,
}

impl TelegramPart {
    /// Length of [`Self::text`] in UTF-16 code units, the unit of Telegram's limits.
    pub fn utf16_len(&self) -> usize {
        utf16_len(&self.text)
    }
}

/// One Telegram `MessageEntity`. Serializes exactly as the Bot API expects
/// (`{"type":"text_link","offset":0,"length":4,"url":"..."}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entity {
    /// What the entity does.
    #[serde(flatten)]
    pub kind: EntityKind,
    /// Start in UTF-16 code units from the start of the part's text.
    pub offset: usize,
    /// Length in UTF-16 code units, never 0.
    pub length: usize,
}

/// The entity types parlor produces (a subset of Telegram's).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EntityKind {
    /// Bold text (`**x**`, headings, table record headers).
    Bold,
    /// Italic text (`*x*`).
    Italic,
    /// Underlined text. Markdown has no syntax for it; never produced by the renderer today.
    Underline,
    /// Strikethrough (`~~x~~`).
    Strikethrough,
    /// Spoiler. Not CommonMark; never produced by the renderer today.
    Spoiler,
    /// Inline monospace (`` `x` ``).
    Code,
    /// A monospace block (code blocks, tables).
    Pre {
        /// The code block's language, if given.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        language: Option<String>,
    },
    /// A clickable text linking to an http, https or tg URL.
    TextLink {
        /// The destination.
        url: String,
    },
    /// A block quotation.
    Blockquote,
}

/// Renders Markdown as Telegram messages. Empty or whitespace-only input (or input that
/// renders to nothing, such as only link reference definitions) gives no parts: there is
/// nothing to send.
pub fn render(markdown: &str) -> Vec<TelegramPart> {
    render_document(&super::parse(markdown))
}

/// Renders a parsed document as Telegram messages of at most [`MAX_MESSAGE_UTF16`] units.
pub fn render_document(doc: &Document) -> Vec<TelegramPart> {
    render_document_with_limit(doc, MAX_MESSAGE_UTF16)
}

/// Renders a parsed document into parts of at most `limit` UTF-16 units (e.g. 1024 for a
/// media caption). `limit` is raised to 2 so that any char fits.
///
/// Cuts fall at a paragraph break, else a line break, else a space, else between two chars
/// (never inside a surrogate pair). An entity crossing a cut becomes one entity per part; a
/// code block that must split gets its own `pre` (same language) in each part.
pub fn render_document_with_limit(doc: &Document, limit: usize) -> Vec<TelegramPart> {
    let rich = layout::layout(doc, Flavor::Telegram);
    split::split(rich, limit.max(2), false)
        .into_iter()
        .map(to_part)
        .collect()
}

/// Byte ranges -> UTF-16 entities.
fn to_part(rich: Rich) -> TelegramPart {
    let text = rich.text.as_str();
    // In ASCII text a byte is a unit. Otherwise, ranges coming sorted by start, the offsets
    // are counted in one pass from the last start, each end from its own start.
    let ascii = text.is_ascii();
    let units_of = |s: &str| if ascii { s.len() } else { utf16_len(s) };
    let (mut byte, mut units) = (0, 0);
    let mut entities: Vec<Entity> = rich
        .entities
        .into_iter()
        .filter_map(|e| {
            if e.start < byte {
                (byte, units) = (0, 0);
            }
            units += units_of(text.get(byte..e.start)?);
            byte = e.start;
            let length = units_of(text.get(e.start..e.end)?);
            let kind = match e.kind {
                Kind::Bold => EntityKind::Bold,
                Kind::Italic => EntityKind::Italic,
                Kind::Strike => EntityKind::Strikethrough,
                Kind::Code => EntityKind::Code,
                Kind::Link(url) => EntityKind::TextLink { url },
                Kind::Pre(language) => EntityKind::Pre { language },
                Kind::Quote => EntityKind::Blockquote,
            };
            (length > 0).then_some(Entity {
                kind,
                offset: units,
                length,
            })
        })
        .collect();
    entities.sort_by(|a, b| a.offset.cmp(&b.offset).then(b.length.cmp(&a.length)));
    TelegramPart {
        text: rich.text,
        entities,
    }
}
