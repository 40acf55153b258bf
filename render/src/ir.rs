//! The intermediate representation every renderer reads: a small, platform-free tree of blocks
//! whose leaves are runs of text with a style.
//!
//! It holds what a reader sees, not how the Markdown spelled it: line breaks are `'\n'` inside
//! span text, adjacent runs of the same style are already merged, raw HTML is plain text and
//! link reference definitions are resolved away.

/// A parsed Markdown reply: a sequence of blocks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Document {
    /// Top-level blocks in reading order.
    pub blocks: Vec<Block>,
}

impl Document {
    /// Whether the document has no blocks at all (empty or whitespace-only input, or input
    /// made only of link reference definitions).
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }
}

/// One block of a document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Block {
    /// A paragraph of inline runs. Raw HTML blocks of the input also become paragraphs of
    /// plain text: parlor never interprets HTML.
    Paragraph(Vec<Span>),
    /// A heading (`level` 1–6) with its inline runs.
    Heading {
        /// 1 for `#`, up to 6 for `######`.
        level: u8,
        /// The heading's text.
        content: Vec<Span>,
    },
    /// A fenced or indented code block.
    CodeBlock {
        /// First word of the fence's info string (`rust` in ```` ```rust ````), if any.
        language: Option<String>,
        /// The code, verbatim, without its final newline.
        code: String,
    },
    /// A block quote and the blocks inside it.
    Quote(Vec<Block>),
    /// A bullet or ordered list.
    List(List),
    /// A GFM table.
    Table(Table),
    /// A thematic break (`---`).
    ThematicBreak,
}

/// A bullet or ordered list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct List {
    /// `true` for `1.` lists, `false` for `-`/`*`/`+` lists.
    pub ordered: bool,
    /// Number of the first item of an ordered list (1 for bullet lists).
    pub start: u64,
    /// A tight list has no blank lines between its items; renderers keep items on
    /// consecutive lines then, and separate them by a blank line otherwise.
    pub tight: bool,
    /// The items, in order.
    pub items: Vec<ListItem>,
}

/// One item of a [`List`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListItem {
    /// `Some(checked)` for a GFM task item (`- [ ]` / `- [x]`), `None` otherwise.
    pub task: Option<bool>,
    /// The item's content (paragraphs, nested lists, code, ...).
    pub blocks: Vec<Block>,
}

/// A GFM table. Rows may have fewer or more cells than the header; renderers pad.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    /// Column alignment from the delimiter row, one per header cell.
    pub alignments: Vec<Alignment>,
    /// Header cells.
    pub header: Vec<Cell>,
    /// Body rows.
    pub rows: Vec<Vec<Cell>>,
}

/// The inline runs of one table cell.
pub type Cell = Vec<Span>;

/// Column alignment of a [`Table`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Alignment {
    /// No alignment given (`---`): rendered left-aligned.
    #[default]
    None,
    /// `:---`
    Left,
    /// `:---:`
    Center,
    /// `---:`
    Right,
}

/// A run of inline content with one style.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    /// The visible text. For an image, its alt text (possibly empty). Line breaks (soft and
    /// hard) are `'\n'`: chat clients show a newline where the author typed one.
    pub text: String,
    /// Emphasis and link that apply to the whole run.
    pub style: Style,
    /// What kind of run this is.
    pub kind: SpanKind,
}

impl Span {
    /// An unstyled text run.
    pub fn plain(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            style: Style::default(),
            kind: SpanKind::Text,
        }
    }
}

/// The style of a [`Span`].
///
/// Markdown has no underline and no spoiler syntax, so neither appears here; raw HTML such as
/// `<u>` is shown as text.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Style {
    /// `**strong**`
    pub bold: bool,
    /// `*emphasis*`
    pub italic: bool,
    /// `~~strikethrough~~`
    pub strikethrough: bool,
    /// Destination of the link this run is part of, exactly as written (any scheme; renderers
    /// decide which they make clickable).
    pub link: Option<String>,
}

/// The kind of a [`Span`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpanKind {
    /// Ordinary text.
    Text,
    /// `` `inline code` ``.
    Code,
    /// An image; the span's text is its alt text, flattened to plain text.
    Image {
        /// The image source, exactly as written.
        url: String,
    },
}
