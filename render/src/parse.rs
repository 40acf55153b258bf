//! Markdown -> [`Document`] with pulldown-cmark (CommonMark + GFM tables, strikethrough and
//! task lists).
//!
//! The event stream is folded with an explicit stack, never by recursion, so any input is
//! safe. Containers nested deeper than [`MAX_DEPTH`] are flattened into their parent: the
//! renderers walk the tree recursively and a reply of ten thousand `>` must not overflow the
//! stack.

use pulldown_cmark::{CodeBlockKind, CowStr, Event, LinkType, Options, Parser, Tag, TagEnd};

use super::ir::{Alignment, Block, Cell, Document, List, ListItem, Span, SpanKind, Style, Table};

/// Quotes and lists nested deeper than this are merged into the enclosing container.
pub(crate) const MAX_DEPTH: usize = 16;

/// Spans a paragraph's list starts with: a reply's paragraph rarely has more runs, and
/// growing the list twice (4, then 8) cost more than the spans themselves.
const PARAGRAPH_SPANS: usize = 8;

/// Parses Markdown into a [`Document`].
///
/// CommonMark 0.31.2 with the GFM extensions tables, strikethrough and task lists. Raw HTML
/// (blocks and inline) becomes plain text, never markup. Soft and hard line breaks both become
/// `'\n'`. Never panics.
pub fn parse(markdown: &str) -> Document {
    let options =
        Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH | Options::ENABLE_TASKLISTS;
    let mut builder = Builder::new();
    for event in Parser::new_ext(markdown, options) {
        builder.event(event);
    }
    builder.finish()
}

/// What an open block container will become when it ends.
enum ContainerKind {
    Root,
    Quote,
    Item { task: Option<bool> },
}

/// What an open inline container will become when it ends.
enum InlineKind {
    Paragraph,
    Heading(u8),
    Cell,
}

/// One open element of the block structure.
enum Frame {
    Container {
        kind: ContainerKind,
        blocks: Vec<Block>,
    },
    List(List),
    Inline {
        kind: InlineKind,
        spans: Vec<Span>,
        /// Opened by text directly inside a tight list item (pulldown-cmark emits no
        /// paragraph there); closed by the next block event.
        implicit: bool,
    },
    Code {
        language: Option<String>,
        code: String,
    },
    Html(String),
    Table {
        table: Table,
        row: Vec<Cell>,
    },
    /// A quote, list or item beyond [`MAX_DEPTH`]: its content goes to the parent.
    Flattened,
}

/// An image being read: its alt text collects everything inside it.
struct OpenImage {
    url: String,
    alt: String,
    depth: usize,
}

/// A link being read.
struct OpenLink<'a> {
    /// Borrowed from the input where it can be: each span of the link copies it anyway.
    url: CowStr<'a>,
    /// Whether anything visible was seen inside: an empty link text is replaced by the URL.
    visible: bool,
}

struct Builder<'a> {
    stack: Vec<Frame>,
    strong: usize,
    emphasis: usize,
    strikethrough: usize,
    links: Vec<OpenLink<'a>>,
    image: Option<OpenImage>,
    /// Number of quote/list/item containers currently open (flattened ones excluded).
    depth: usize,
}

impl<'a> Builder<'a> {
    fn new() -> Self {
        // Room for the usual nesting (root, list, item, paragraph) without regrowing.
        let mut stack = Vec::with_capacity(8);
        stack.push(Frame::Container {
            kind: ContainerKind::Root,
            blocks: Vec::new(),
        });
        Self {
            stack,
            strong: 0,
            emphasis: 0,
            strikethrough: 0,
            links: Vec::new(),
            image: None,
            depth: 0,
        }
    }

    fn event(&mut self, event: Event<'a>) {
        match event {
            Event::Start(tag) => self.start(tag),
            Event::End(tag) => self.end(tag),
            Event::Text(text) => self.text(&text, SpanKind::Text),
            Event::Code(code) => self.text(&code, SpanKind::Code),
            // Math is not enabled; shown as written if it ever arrives.
            Event::InlineMath(text) | Event::DisplayMath(text) => {
                self.text(&text, SpanKind::Text);
            }
            Event::Html(html) => match self.stack.last_mut() {
                Some(Frame::Html(buffer)) => buffer.push_str(&html),
                _ => self.text(&html, SpanKind::Text),
            },
            Event::InlineHtml(html) => self.text(&html, SpanKind::Text),
            Event::FootnoteReference(label) => self.text(&format!("[^{label}]"), SpanKind::Text),
            Event::SoftBreak | Event::HardBreak => self.text("\n", SpanKind::Text),
            Event::Rule => {
                self.close_implicit();
                self.add_block(Block::ThematicBreak);
            }
            Event::TaskListMarker(checked) => {
                for frame in self.stack.iter_mut().rev() {
                    match frame {
                        Frame::Container {
                            kind: ContainerKind::Item { task },
                            ..
                        } => {
                            *task = Some(checked);
                            break;
                        }
                        // The marker of a flattened item must not mark an outer one.
                        Frame::Flattened => break,
                        _ => {}
                    }
                }
            }
        }
    }

    fn start(&mut self, tag: Tag<'a>) {
        if let Some(image) = &mut self.image {
            // Inside an image everything is alt text; only nesting depth matters.
            if matches!(tag, Tag::Image { .. }) {
                image.depth += 1;
            }
            return;
        }
        match tag {
            Tag::Emphasis => self.emphasis += 1,
            Tag::Strong => self.strong += 1,
            Tag::Strikethrough => self.strikethrough += 1,
            Tag::Link {
                link_type,
                dest_url,
                ..
            } => {
                let url = if link_type == LinkType::Email {
                    CowStr::from(format!("mailto:{dest_url}"))
                } else {
                    dest_url
                };
                self.links.push(OpenLink {
                    url,
                    visible: false,
                });
            }
            Tag::Image { dest_url, .. } => {
                self.image = Some(OpenImage {
                    // Not `to_string`: that formats through `Display`.
                    url: dest_url.into_string(),
                    alt: String::new(),
                    depth: 1,
                });
            }
            Tag::Paragraph => {
                self.close_implicit();
                self.mark_loose();
                self.stack.push(Frame::Inline {
                    kind: InlineKind::Paragraph,
                    spans: Vec::with_capacity(PARAGRAPH_SPANS),
                    implicit: false,
                });
            }
            Tag::Heading { level, .. } => {
                self.close_implicit();
                self.stack.push(Frame::Inline {
                    kind: InlineKind::Heading(level as u8),
                    spans: Vec::with_capacity(PARAGRAPH_SPANS),
                    implicit: false,
                });
            }
            Tag::BlockQuote(_) => {
                self.close_implicit();
                self.push_container(Frame::Container {
                    kind: ContainerKind::Quote,
                    blocks: Vec::new(),
                });
            }
            Tag::CodeBlock(kind) => {
                self.close_implicit();
                let language = match kind {
                    // Telegram shows the language as a label; a control char has no place
                    // in it.
                    CodeBlockKind::Fenced(info) => info
                        .split_whitespace()
                        .next()
                        .filter(|l| !l.contains(char::is_control))
                        .map(str::to_string),
                    CodeBlockKind::Indented => None,
                };
                self.stack.push(Frame::Code {
                    language,
                    code: String::new(),
                });
            }
            Tag::HtmlBlock => {
                self.close_implicit();
                self.stack.push(Frame::Html(String::new()));
            }
            Tag::List(start) => {
                self.close_implicit();
                self.push_container(Frame::List(List {
                    ordered: start.is_some(),
                    start: start.unwrap_or(1),
                    tight: true,
                    items: Vec::new(),
                }));
            }
            Tag::Item => {
                self.close_implicit();
                if matches!(self.stack.last(), Some(Frame::List(_))) {
                    self.stack.push(Frame::Container {
                        kind: ContainerKind::Item { task: None },
                        blocks: Vec::new(),
                    });
                } else {
                    // The list itself was flattened.
                    self.stack.push(Frame::Flattened);
                }
            }
            Tag::Table(alignments) => {
                self.close_implicit();
                let alignments = alignments
                    .into_iter()
                    .map(|a| match a {
                        pulldown_cmark::Alignment::None => Alignment::None,
                        pulldown_cmark::Alignment::Left => Alignment::Left,
                        pulldown_cmark::Alignment::Center => Alignment::Center,
                        pulldown_cmark::Alignment::Right => Alignment::Right,
                    })
                    .collect();
                self.stack.push(Frame::Table {
                    table: Table {
                        alignments,
                        header: Vec::new(),
                        rows: Vec::new(),
                    },
                    row: Vec::new(),
                });
            }
            Tag::TableHead | Tag::TableRow => {
                if let Some(Frame::Table { row, .. }) = self.stack.last_mut() {
                    row.clear();
                }
            }
            Tag::TableCell => self.stack.push(Frame::Inline {
                kind: InlineKind::Cell,
                spans: Vec::new(),
                implicit: false,
            }),
            // Not enabled in `parse`; their content flows into the enclosing block.
            Tag::FootnoteDefinition(_)
            | Tag::DefinitionList
            | Tag::DefinitionListTitle
            | Tag::DefinitionListDefinition
            | Tag::Superscript
            | Tag::Subscript
            | Tag::MetadataBlock(_) => {}
        }
    }

    fn end(&mut self, tag: TagEnd) {
        if let Some(image) = &mut self.image {
            if tag == TagEnd::Image {
                image.depth -= 1;
                if image.depth == 0
                    && let Some(image) = self.image.take()
                {
                    let span = Span {
                        text: image.alt,
                        style: self.style(),
                        kind: SpanKind::Image { url: image.url },
                    };
                    self.push_span(span);
                }
            }
            return;
        }
        match tag {
            TagEnd::Emphasis => self.emphasis = self.emphasis.saturating_sub(1),
            TagEnd::Strong => self.strong = self.strong.saturating_sub(1),
            TagEnd::Strikethrough => self.strikethrough = self.strikethrough.saturating_sub(1),
            TagEnd::Link => {
                // A link with no visible text shows its destination instead.
                let empty = self.links.last().is_some_and(|link| !link.visible);
                if empty {
                    let url = self
                        .links
                        .last()
                        .map(|l| String::from(&*l.url))
                        .unwrap_or_default();
                    self.text(&url, SpanKind::Text);
                }
                self.links.pop();
            }
            TagEnd::Image => {}
            TagEnd::Paragraph | TagEnd::Heading(_) => {
                self.close_implicit();
                if let Some(Frame::Inline { kind, spans, .. }) = self.pop_frame() {
                    match kind {
                        InlineKind::Heading(level) => self.add_block(Block::Heading {
                            level,
                            content: spans,
                        }),
                        _ if !spans.is_empty() => self.add_block(Block::Paragraph(spans)),
                        _ => {}
                    }
                }
            }
            TagEnd::TableCell => {
                if let Some(Frame::Inline { spans, .. }) = self.pop_frame()
                    && let Some(Frame::Table { row, .. }) = self.stack.last_mut()
                {
                    row.push(spans);
                }
            }
            TagEnd::TableHead => {
                if let Some(Frame::Table { table, row }) = self.stack.last_mut() {
                    table.header = std::mem::take(row);
                }
            }
            TagEnd::TableRow => {
                if let Some(Frame::Table { table, row }) = self.stack.last_mut() {
                    table.rows.push(std::mem::take(row));
                }
            }
            TagEnd::Table => {
                if let Some(Frame::Table { table, .. }) = self.pop_frame() {
                    self.add_block(Block::Table(table));
                }
            }
            TagEnd::CodeBlock => {
                if let Some(Frame::Code { language, code }) = self.pop_frame() {
                    // Blank lines around the code carry no meaning in a chat message.
                    let code = code.trim_start_matches('\n').trim_end_matches('\n');
                    self.add_block(Block::CodeBlock {
                        language,
                        code: code.to_string(),
                    });
                }
            }
            TagEnd::HtmlBlock => {
                if let Some(Frame::Html(html)) = self.pop_frame() {
                    let html = html.trim_end();
                    if !html.is_empty() {
                        self.add_block(Block::Paragraph(vec![Span::plain(html)]));
                    }
                }
            }
            TagEnd::BlockQuote(_) | TagEnd::List(_) | TagEnd::Item => {
                self.close_implicit();
                match self.pop_frame() {
                    Some(Frame::Container {
                        kind: ContainerKind::Quote,
                        blocks,
                    }) => {
                        self.depth -= 1;
                        self.add_block(Block::Quote(blocks));
                    }
                    Some(Frame::List(list)) => {
                        self.depth -= 1;
                        self.add_block(Block::List(list));
                    }
                    Some(Frame::Container {
                        kind: ContainerKind::Item { task },
                        blocks,
                    }) => {
                        if let Some(Frame::List(list)) = self.stack.last_mut() {
                            list.items.push(ListItem { task, blocks });
                        }
                    }
                    Some(Frame::Flattened) | None => {}
                    Some(other) => self.stack.push(other),
                }
            }
            TagEnd::FootnoteDefinition
            | TagEnd::DefinitionList
            | TagEnd::DefinitionListTitle
            | TagEnd::DefinitionListDefinition
            | TagEnd::Superscript
            | TagEnd::Subscript
            | TagEnd::MetadataBlock(_) => {}
        }
    }

    /// Pushes a quote or list, or a [`Frame::Flattened`] placeholder beyond [`MAX_DEPTH`].
    fn push_container(&mut self, frame: Frame) {
        if self.depth >= MAX_DEPTH {
            self.stack.push(Frame::Flattened);
        } else {
            self.depth += 1;
            self.stack.push(frame);
        }
    }

    /// Pops the top frame, never the root.
    fn pop_frame(&mut self) -> Option<Frame> {
        if self.stack.len() > 1 {
            self.stack.pop()
        } else {
            None
        }
    }

    /// A paragraph directly inside a list item makes the list loose.
    fn mark_loose(&mut self) {
        let len = self.stack.len();
        if len >= 2
            && matches!(
                self.stack[len - 1],
                Frame::Container {
                    kind: ContainerKind::Item { .. },
                    ..
                }
            )
            && let Frame::List(list) = &mut self.stack[len - 2]
        {
            list.tight = false;
        }
    }

    /// Ends the implicit paragraph of a tight list item, if one is open.
    fn close_implicit(&mut self) {
        if let Some(Frame::Inline { implicit: true, .. }) = self.stack.last()
            && let Some(Frame::Inline { spans, .. }) = self.pop_frame()
            && !spans.is_empty()
        {
            self.add_block(Block::Paragraph(spans));
        }
    }

    /// Adds a finished block to the innermost open block container.
    fn add_block(&mut self, block: Block) {
        for frame in self.stack.iter_mut().rev() {
            if let Frame::Container { blocks, .. } = frame {
                blocks.push(block);
                return;
            }
        }
    }

    fn style(&self) -> Style {
        Style {
            bold: self.strong > 0,
            italic: self.emphasis > 0,
            strikethrough: self.strikethrough > 0,
            link: self.links.last().map(|link| String::from(&*link.url)),
        }
    }

    fn text(&mut self, text: &str, kind: SpanKind) {
        if let Some(image) = &mut self.image {
            image.alt.push_str(if text == "\n" { " " } else { text });
            return;
        }
        match self.stack.last_mut() {
            Some(Frame::Code { code, .. }) => code.push_str(text),
            Some(Frame::Html(html)) => html.push_str(text),
            _ => {
                // Text of the last span's style is appended to it: no span (nor style, which
                // holds a copy of the link) is made for it.
                if let Some(Frame::Inline { spans, .. }) = self.stack.last_mut()
                    && let Some(last) = spans.last_mut()
                    && !text.is_empty()
                    && mergeable(&last.kind, &kind)
                    && last.style.bold == (self.strong > 0)
                    && last.style.italic == (self.emphasis > 0)
                    && last.style.strikethrough == (self.strikethrough > 0)
                    && last.style.link.as_deref() == self.links.last().map(|l| &*l.url)
                {
                    last.text.push_str(text);
                    if let Some(link) = self.links.last_mut() {
                        link.visible |= !text.trim().is_empty();
                    }
                    return;
                }
                let span = Span {
                    text: text.to_string(),
                    style: self.style(),
                    kind,
                };
                self.push_span(span);
            }
        }
    }

    /// Appends a span to the current inline container (opening an implicit paragraph when
    /// text sits directly in a container), merging it into the previous span of the same
    /// style.
    fn push_span(&mut self, span: Span) {
        let image = matches!(span.kind, SpanKind::Image { .. });
        if let Some(link) = self.links.last_mut() {
            // An image counts as visible link content even with an empty alt.
            link.visible |= image || !span.text.trim().is_empty();
        }
        if span.text.is_empty() && !image {
            return;
        }
        if !matches!(self.stack.last(), Some(Frame::Inline { .. })) {
            self.stack.push(Frame::Inline {
                kind: InlineKind::Paragraph,
                spans: Vec::new(),
                implicit: true,
            });
        }
        if let Some(Frame::Inline { spans, .. }) = self.stack.last_mut() {
            if let Some(last) = spans.last_mut()
                && last.style == span.style
                && mergeable(&last.kind, &span.kind)
            {
                last.text.push_str(&span.text);
            } else {
                spans.push(span);
            }
        }
    }

    fn finish(mut self) -> Document {
        // Well-formed event streams close everything; this is only a guard.
        self.image = None;
        while self.stack.len() > 1 {
            self.close_implicit();
            match self.stack.last() {
                Some(Frame::Inline { .. }) => self.end(TagEnd::Paragraph),
                Some(Frame::Code { .. }) => self.end(TagEnd::CodeBlock),
                Some(Frame::Html(_)) => self.end(TagEnd::HtmlBlock),
                Some(Frame::Table { .. }) => self.end(TagEnd::Table),
                _ => self.end(TagEnd::Item),
            }
        }
        match self.stack.pop() {
            Some(Frame::Container { blocks, .. }) => Document { blocks },
            _ => Document::default(),
        }
    }
}

fn mergeable(a: &SpanKind, b: &SpanKind) -> bool {
    matches!(
        (a, b),
        (SpanKind::Text, SpanKind::Text) | (SpanKind::Code, SpanKind::Code)
    )
}
