//! Shared layout: [`Document`] -> [`Rich`] (one text plus entity ranges) for one platform
//! flavor. Telegram, Discord and the console differ only in a few choices made here (how a
//! quote, a link or a code block is marked); splitting and serialization come after.
//!
//! The text is written char by char through [`Writer::put`], which applies block separation
//! and line prefixes (list indentation, `> `) lazily, at the first content of a line. Entities
//! are opened and closed like tags; an entity's range starts at the first content char after
//! it opens and ends after the last non-newline char before it closes. Opening and closing in
//! stack order therefore always yields properly nested ranges with no leading or trailing
//! newlines and never an empty one.

use std::borrow::Cow;

use super::ir::{Block, Document, List, Span, SpanKind, Table};
use super::table::{aligned, display_width};

/// The platform a layout is made for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flavor {
    /// Entities; quotes as a blockquote entity; only http, https and tg links.
    Telegram,
    /// Markdown source: text is escaped, structure uses Markdown markers.
    Discord,
    /// No markup at all: links as `text (url)`, quotes as `> `, code indented.
    Plain,
}

/// A formatting range kind. Telegram maps them to entities, Discord to Markdown markers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Kind {
    Bold,
    Italic,
    Strike,
    Code,
    Link(String),
    Pre(Option<String>),
    Quote,
}

impl Kind {
    /// Nesting preference when several ranges start together and last equally long: the
    /// smaller number goes outside.
    fn priority(&self) -> u8 {
        match self {
            Kind::Quote => 0,
            Kind::Pre(_) => 1,
            Kind::Link(_) => 2,
            Kind::Bold => 3,
            Kind::Italic => 4,
            Kind::Strike => 5,
            Kind::Code => 6,
        }
    }
}

/// A range of [`Rich::text`] in bytes (always on char boundaries).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ent {
    pub kind: Kind,
    pub start: usize,
    pub end: usize,
}

/// Laid-out text with properly nested, non-empty formatting ranges.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Rich {
    pub text: String,
    /// Sorted by start, then outer before inner.
    pub entities: Vec<Ent>,
}

impl Rich {
    /// Sorts entities by start, longer (outer) first, then by nesting priority.
    pub fn sort(&mut self) {
        self.entities.sort_by(|a, b| {
            a.start
                .cmp(&b.start)
                .then(b.end.cmp(&a.end))
                .then(a.kind.priority().cmp(&b.kind.priority()))
        });
    }
}

/// Lays out a document for a flavor.
pub(crate) fn layout(doc: &Document, flavor: Flavor) -> Rich {
    let mut writer = Writer::new(flavor);
    // Growing the text step by step cost more than the rest of a short reply's layout.
    writer.text.reserve(text_len(&doc.blocks));
    writer.blocks(&doc.blocks, 2);
    writer.finish()
}

/// About how long a layout of `blocks` is: their text plus a little for markers and breaks.
fn text_len(blocks: &[Block]) -> usize {
    let spans = |spans: &[Span]| spans.iter().map(|s| s.text.len()).sum::<usize>();
    blocks
        .iter()
        .map(|block| {
            2 + match block {
                Block::Paragraph(content) | Block::Heading { content, .. } => spans(content),
                Block::CodeBlock { code, .. } => code.len(),
                Block::Quote(blocks) => text_len(blocks),
                Block::List(list) => list
                    .items
                    .iter()
                    .map(|item| 4 + text_len(&item.blocks))
                    .sum(),
                Block::Table(table) => table
                    .header
                    .iter()
                    .chain(table.rows.iter().flatten())
                    .map(|cell| 3 + spans(cell))
                    .sum(),
                Block::ThematicBreak => "———".len(),
            }
        })
        .sum()
}

/// Longest link destination Telegram gets as a `text_link`; longer ones stay plain text.
const TELEGRAM_MAX_URL: usize = 2048;
/// Longest link destination Discord gets as a masked link; bounded so that one character
/// with all its markers always fits a 2000-character message.
const DISCORD_MAX_URL: usize = 1000;

/// How [`Writer::write`] treats a piece of text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Reader-visible text: escaped for Discord, bare URLs made explicit.
    Text,
    /// The text of a link: escaped for Discord, no URL detection inside.
    LinkText,
    /// Structure (markers, emoji) or inline code: written as is.
    Raw,
    /// Code block content: as is, but a Discord fence inside it is broken up.
    Pre,
}

/// The formatting ranges a [`Seg`] can carry, by index in nesting priority order (the
/// smaller goes outside, as [`Kind::priority`]): a link, then bold, italic, strike, code.
const MARKS: usize = 5;
const LINK: usize = 0;
const BOLD: u8 = 1 << 1;
const ITALIC: u8 = 1 << 2;
const STRIKE: u8 = 1 << 3;
const CODE: u8 = 1 << 4;

/// One run of inline text with the formatting ranges that cover it. The ranges are a bit
/// set plus the link's destination rather than a `Vec<Kind>`: a reply has a segment per
/// styled run, and an allocation (and a URL copy) for each was most of the layout's cost.
struct Seg<'a> {
    text: Cow<'a, str>,
    /// `BOLD | ITALIC | STRIKE | CODE` bits.
    styles: u8,
    /// The link's destination (normalized), if the segment is inside one.
    link: Option<Cow<'a, str>>,
    mode: Mode,
    /// Per mark index: how many consecutive segments from this one carry the same range
    /// (0 when this one does not carry it). Filled by [`Writer::write_segments`].
    run: [u32; MARKS],
}

impl<'a> Seg<'a> {
    fn new(text: Cow<'a, str>, styles: u8, link: Option<Cow<'a, str>>, mode: Mode) -> Self {
        Self {
            text,
            styles,
            link,
            mode,
            run: [0; MARKS],
        }
    }

    /// Structure with no formatting (separators, destinations).
    fn raw(text: Cow<'a, str>) -> Self {
        Self::new(text, 0, None, Mode::Raw)
    }

    fn marked(&self) -> bool {
        self.styles != 0 || self.link.is_some()
    }

    fn has(&self, mark: usize) -> bool {
        if mark == LINK {
            self.link.is_some()
        } else {
            self.styles & (1 << mark) != 0
        }
    }

    /// Whether `self` and `other` both carry mark `mark` as the same range.
    fn shares(&self, other: &Seg<'_>, mark: usize) -> bool {
        if mark == LINK {
            self.link.is_some() && self.link == other.link
        } else {
            self.has(mark) && other.has(mark)
        }
    }

    /// The range kind of mark `mark`.
    fn kind(&self, mark: usize) -> Kind {
        match mark {
            LINK => Kind::Link(self.link.as_deref().unwrap_or_default().to_string()),
            1 => Kind::Bold,
            2 => Kind::Italic,
            3 => Kind::Strike,
            _ => Kind::Code,
        }
    }
}

/// Builds a [`Rich`] block by block; see the module documentation.
struct Writer {
    flavor: Flavor,
    text: String,
    entities: Vec<Ent>,
    /// Open ranges by id: kind and start (None until the first content char).
    open: Vec<Option<(Kind, Option<usize>)>>,
    /// How many open ranges have not seen content yet.
    unstarted: usize,
    /// Written before the first content char of every line (list indentation, `> `).
    prefix: String,
    /// Inside a code block of Telegram or Discord: no prefix (it would become code).
    in_pre: bool,
    /// The current line has content (markers count).
    line_has_content: bool,
    /// The current line has reader text (markers do not count); Discord escapes line-start
    /// markers before it.
    line_text_started: bool,
    /// Written before the next content char if it is on the same line (the space after a
    /// list marker, dropped on an empty item).
    pending: String,
    /// Newlines wanted before the next content (1: new line, 2: blank line).
    pending_break: usize,
    /// Set after a list marker: the item's first block continues on the marker's line.
    glue: bool,
    /// Byte length of the text up to its last non-newline char.
    content_end: usize,
    /// Quotes open around the current block: only the outermost is marked on Telegram and
    /// Discord, which cannot nest them.
    quote_depth: usize,
    /// Lists open around the current item: picks the bullet (`•`, `◦`, `▪`).
    list_depth: usize,
}

impl Writer {
    fn new(flavor: Flavor) -> Self {
        Self {
            flavor,
            text: String::new(),
            entities: Vec::new(),
            open: Vec::new(),
            unstarted: 0,
            prefix: String::new(),
            in_pre: false,
            line_has_content: false,
            line_text_started: false,
            pending: String::new(),
            pending_break: 0,
            glue: false,
            content_end: 0,
            quote_depth: 0,
            list_depth: 0,
        }
    }

    fn finish(mut self) -> Rich {
        for id in 0..self.open.len() {
            self.close(id);
        }
        // Only newlines follow the last content; trailing spaces are trimmed too.
        let end = self.text[..self.content_end].trim_end().len();
        self.text.truncate(end);
        let mut rich = Rich {
            text: self.text,
            entities: self
                .entities
                .into_iter()
                .filter_map(|mut e| {
                    e.end = e.end.min(end);
                    (e.start < e.end).then_some(e)
                })
                .collect(),
        };
        rich.sort();
        rich
    }

    // ---- the character sink -------------------------------------------------------------

    /// Writes one char: applies a pending block break, the line prefix and the pending
    /// marker space before the first content of a line, and starts waiting ranges.
    fn put(&mut self, c: char) {
        if c != '\n' && self.mid_line() {
            self.text.push(c);
            self.content_end = self.text.len();
            return;
        }
        if self.pending_break > 0 {
            let wanted = std::mem::take(&mut self.pending_break);
            if !self.text.is_empty() {
                let have = self.text.len() - self.content_end;
                for _ in have..wanted {
                    self.text.push('\n');
                }
                self.new_line();
            }
        }
        if c == '\n' {
            self.text.push('\n');
            self.new_line();
            return;
        }
        if !self.line_has_content {
            if !self.in_pre {
                self.text.push_str(&self.prefix);
            }
            self.line_has_content = true;
        }
        if !self.pending.is_empty() {
            let pending = std::mem::take(&mut self.pending);
            self.text.push_str(&pending);
        }
        if self.unstarted > 0 {
            let here = self.text.len();
            for (_, start) in self.open.iter_mut().flatten() {
                start.get_or_insert(here);
            }
            self.unstarted = 0;
        }
        self.glue = false;
        self.text.push(c);
        self.content_end = self.text.len();
    }

    /// In the middle of a line with nothing waiting: a char is only appended.
    fn mid_line(&self) -> bool {
        self.line_has_content
            && self.pending_break == 0
            && self.pending.is_empty()
            && self.unstarted == 0
    }

    fn new_line(&mut self) {
        self.line_has_content = false;
        self.line_text_started = false;
        self.pending.clear();
    }

    /// Asks for `n` newlines before the next content (ignored right after a list marker).
    fn request_break(&mut self, n: usize) {
        if !self.glue {
            self.pending_break = self.pending_break.max(n);
        }
    }

    /// Like [`Self::request_break`], also right after a list marker.
    fn force_break(&mut self, n: usize) {
        self.glue = false;
        self.pending_break = self.pending_break.max(n);
    }

    fn open(&mut self, kind: Kind) -> usize {
        let id = self.open.len();
        self.open.push(Some((kind, None)));
        self.unstarted += 1;
        id
    }

    fn close(&mut self, id: usize) {
        let Some((kind, start)) = self.open.get_mut(id).and_then(Option::take) else {
            return;
        };
        match start {
            Some(start) if self.content_end > start => self.entities.push(Ent {
                kind,
                start,
                end: self.content_end,
            }),
            Some(_) => {}
            None => self.unstarted = self.unstarted.saturating_sub(1),
        }
        while matches!(self.open.last(), Some(None)) {
            self.open.pop();
        }
    }

    /// Writes text in a mode (escaping for Discord where needed). Control characters other
    /// than newline and tab are dropped: Telegram strips them and would shift entities.
    fn write(&mut self, s: &str, mode: Mode) {
        match (self.flavor, mode) {
            (Flavor::Discord, Mode::Text) => self.write_discord_text(s, true),
            (Flavor::Discord, Mode::LinkText) => self.write_discord_text(s, false),
            (Flavor::Discord, Mode::Pre) => {
                // A fence inside code would end the code block early.
                if s.contains("```") {
                    self.write_chars(&s.replace("```", "``\u{200B}`"));
                } else {
                    self.write_chars(s);
                }
            }
            _ => self.write_chars(s),
        }
    }

    /// Writes `s` as if char by char through [`Self::put`], without the control chars
    /// [`keep_char`] drops. Past the first char of a line `put` only appends, so each run up
    /// to the next newline or control char goes in whole.
    fn write_chars(&mut self, s: &str) {
        let mut rest = s;
        loop {
            // Control chars are below 0x20, 0x7F, or U+0080–U+009F (0xC2 0x80–0x9F); 0xC2
            // also starts printable chars, which the slow step below keeps.
            let stop = rest
                .bytes()
                .position(|b| (b < 0x20 && b != b'\t') || b == 0x7F || b == 0xC2)
                .unwrap_or(rest.len());
            let (run, tail) = rest.split_at(stop);
            if let Some(first) = run.chars().next() {
                let rest = if self.mid_line() {
                    run
                } else {
                    self.put(first);
                    &run[first.len_utf8()..]
                };
                self.text.push_str(rest);
                self.content_end = self.text.len();
            }
            let Some(c) = tail.chars().next() else {
                return;
            };
            if keep_char(c) {
                self.put(c);
            }
            rest = &tail[c.len_utf8()..];
        }
    }

    /// Discord text: Markdown specials are backslash-escaped, line-start markers (`#`, `>`,
    /// `-`, `+`, `1.`) too. A bare URL becomes an explicit `<url>`: Discord takes everything
    /// up to a space as the URL, so a closing `**` right after it would be swallowed, and
    /// escaping inside it would break the link (angle brackets also stop the preview embed).
    fn write_discord_text(&mut self, s: &str, detect_urls: bool) {
        const ALWAYS: &[char] = &['\\', '*', '_', '~', '`', '|', '[', ']'];
        const LINE_START: &[char] = &['#', '>', '-', '+', '='];
        let mut skip_until = 0;
        let mut escape_at = None;
        let mut prev: Option<char> = None;
        for (i, c) in s.char_indices() {
            if i < skip_until || !keep_char(c) {
                continue;
            }
            if c == '\n' {
                self.put('\n');
                prev = Some(c);
                continue;
            }
            if detect_urls && !prev.is_some_and(char::is_alphanumeric) {
                let url = bare_url(&s[i..]);
                if !url.is_empty() {
                    self.put('<');
                    for u in url.chars().filter(|&u| keep_char(u)) {
                        if u == '`' {
                            self.write_chars("%60");
                        } else {
                            self.put(u);
                        }
                    }
                    self.put('>');
                    self.line_text_started = true;
                    skip_until = i + url.len();
                    prev = url.chars().next_back();
                    continue;
                }
            }
            let mut escape = ALWAYS.contains(&c) || escape_at == Some(i);
            if !escape && !self.line_text_started {
                if LINE_START.contains(&c) {
                    escape = true;
                } else if c.is_ascii_digit() {
                    let rest = &s[i..];
                    let digits =
                        rest.len() - rest.trim_start_matches(|d: char| d.is_ascii_digit()).len();
                    if rest[digits..].starts_with(['.', ')']) {
                        escape_at = Some(i + digits);
                    }
                }
            }
            if escape {
                self.put('\\');
            }
            self.put(c);
            self.line_text_started = true;
            prev = Some(c);
        }
    }

    // ---- blocks ---------------------------------------------------------------------------

    fn blocks(&mut self, blocks: &[Block], gap: usize) {
        for block in blocks {
            self.request_break(gap);
            self.block(block);
        }
    }

    fn block(&mut self, block: &Block) {
        match block {
            Block::Paragraph(spans) => self.inlines(spans, false),
            Block::Heading { content, .. } => self.inlines(content, true),
            Block::CodeBlock { language, code } => self.code_block(language.as_deref(), code),
            Block::Quote(blocks) => self.quote(blocks),
            Block::List(list) => self.list(list),
            Block::Table(table) => self.table(table),
            Block::ThematicBreak => self.write("———", Mode::Raw),
        }
    }

    fn code_block(&mut self, language: Option<&str>, code: &str) {
        if code.is_empty() {
            return;
        }
        // A code block starts on its own line, also as the first block of a list item.
        self.force_break(1);
        let saved = self.prefix.len();
        let id = if self.flavor == Flavor::Plain {
            self.prefix.push_str("    ");
            None
        } else {
            self.in_pre = true;
            Some(self.open(Kind::Pre(language.map(str::to_string))))
        };
        self.write(code, Mode::Pre);
        if let Some(id) = id {
            self.close(id);
        }
        self.in_pre = false;
        self.prefix.truncate(saved);
    }

    fn quote(&mut self, blocks: &[Block]) {
        let saved = self.prefix.len();
        let mut id = None;
        match self.flavor {
            // Telegram quotes cannot nest: the outermost one carries the entity.
            Flavor::Telegram if self.quote_depth == 0 => id = Some(self.open(Kind::Quote)),
            Flavor::Telegram => {}
            // Discord quotes cannot nest either; the outermost `> ` marks them all.
            Flavor::Discord if self.quote_depth == 0 => self.prefix.push_str("> "),
            Flavor::Discord => {}
            Flavor::Plain => self.prefix.push_str("> "),
        }
        self.quote_depth += 1;
        self.blocks(blocks, 2);
        self.quote_depth -= 1;
        if let Some(id) = id {
            self.close(id);
        }
        self.prefix.truncate(saved);
    }

    fn list(&mut self, list: &List) {
        let gap = if list.tight { 1 } else { 2 };
        self.list_depth += 1;
        for (i, item) in list.items.iter().enumerate() {
            if i > 0 {
                self.request_break(gap);
            }
            let number = list.start.saturating_add(i as u64);
            let bullet = match self.flavor {
                Flavor::Discord => "-",
                _ => match self.list_depth {
                    1 => "•",
                    2 => "◦",
                    _ => "▪",
                },
            };
            let marker = match (list.ordered, item.task, self.flavor) {
                (false, Some(done), Flavor::Telegram | Flavor::Plain) => checkbox(done).to_string(),
                (false, Some(done), Flavor::Discord) => format!("{bullet} {}", checkbox(done)),
                (false, None, _) => bullet.to_string(),
                (true, Some(done), _) => format!("{number}. {}", checkbox(done)),
                (true, None, _) => format!("{number}."),
            };
            self.write(&marker, Mode::Raw);
            self.pending = " ".to_string();
            let saved = self.prefix.len();
            let indent = display_width(&marker) + 1;
            self.prefix.extend(std::iter::repeat_n(' ', indent));
            self.glue = true;
            self.blocks(&item.blocks, gap);
            self.glue = false;
            self.prefix.truncate(saved);
        }
        self.list_depth -= 1;
    }

    fn table(&mut self, table: &Table) {
        let grid = grid(table);
        if grid.is_empty() {
            return;
        }
        if let Some(lines) = aligned(&table.alignments, &grid) {
            self.force_break(1);
            let saved = self.prefix.len();
            let id = if self.flavor == Flavor::Plain {
                None
            } else {
                self.in_pre = true;
                Some(self.open(Kind::Pre(None)))
            };
            self.write(&lines, Mode::Pre);
            if let Some(id) = id {
                self.close(id);
            }
            self.in_pre = false;
            self.prefix.truncate(saved);
            return;
        }
        // Records: one `Header: value` line per cell, a blank line between rows.
        let columns = grid.first().map_or(0, Vec::len);
        if table.rows.is_empty() {
            // A wide header without rows: its cells on one line.
            let mut segs = Vec::new();
            for (c, cell) in table.header.iter().enumerate() {
                if c > 0 {
                    segs.push(Seg::raw(Cow::Borrowed(" │ ")));
                }
                segs.extend(self.segments(cell, true));
            }
            self.write_segments(&mut segs);
            return;
        }
        for (r, row) in table.rows.iter().enumerate() {
            if r > 0 {
                self.request_break(2);
            }
            for c in 0..columns {
                let header = table.header.get(c).map(Vec::as_slice).unwrap_or(&[]);
                let value = row.get(c).map(Vec::as_slice).unwrap_or(&[]);
                if c > 0 {
                    self.request_break(1);
                }
                let mut segs = self.segments(header, true);
                if !segs.is_empty() {
                    segs.push(Seg::raw(Cow::Borrowed(": ")));
                }
                segs.extend(self.segments(value, false));
                self.write_segments(&mut segs);
            }
        }
    }

    // ---- inline ---------------------------------------------------------------------------

    fn inlines(&mut self, spans: &[Span], heading: bool) {
        let mut segs = self.segments(spans, heading);
        self.write_segments(&mut segs);
    }

    /// Turns spans into segments with the flavor's formatting ranges.
    fn segments<'a>(&self, spans: &'a [Span], bold: bool) -> Vec<Seg<'a>> {
        let flavor = self.flavor;
        let mut segs = Vec::with_capacity(spans.len());
        // Plain: the link being read, to append its destination when it ends.
        let mut group: Option<(&str, String)> = None;
        // The spans of one link share its destination: checked once.
        let mut checked: Option<(&str, Option<Cow<'a, str>>)> = None;
        for span in spans {
            if flavor == Flavor::Plain {
                let url = span.style.link.as_deref();
                if group.as_ref().map(|g| g.0) != url {
                    if let Some((url, text)) = group.take() {
                        push_url_suffix(&mut segs, url, &text);
                    }
                    group = url.map(|u| (u, String::new()));
                }
                if let Some((_, text)) = &mut group {
                    text.push_str(&span.text);
                }
            }
            let link = match (span.style.link.as_deref(), &checked) {
                (None, _) => None,
                (Some(url), Some((seen, target))) if *seen == url => target.clone(),
                (Some(url), _) => {
                    let target = link_target(url, flavor);
                    checked = Some((url, target.clone()));
                    target
                }
            };
            let mut styles = 0;
            if flavor != Flavor::Plain {
                if span.style.bold || bold {
                    styles |= BOLD;
                }
                if span.style.italic {
                    styles |= ITALIC;
                }
                if span.style.strikethrough {
                    styles |= STRIKE;
                }
            }
            let text_mode = if link.is_some() {
                Mode::LinkText
            } else {
                Mode::Text
            };
            match &span.kind {
                // Discord: a link showing its own URL is an autolink.
                SpanKind::Text
                    if flavor == Flavor::Discord
                        && link.is_some()
                        && span.style.link.as_deref().map(str::trim) == Some(span.text.trim()) =>
                {
                    let target = link.as_deref().unwrap_or_default();
                    let mut text = String::with_capacity(target.len() + 2);
                    text.push('<');
                    text.push_str(target);
                    text.push('>');
                    segs.push(Seg::new(Cow::Owned(text), styles, None, Mode::Raw));
                }
                SpanKind::Text => {
                    segs.push(Seg::new(Cow::Borrowed(&span.text), styles, link, text_mode));
                }
                // Telegram: code can be inside nothing but a quote, so inside a link it is
                // text, and bold/italic around it are split.
                SpanKind::Code if link.is_some() || flavor == Flavor::Plain => {
                    segs.push(Seg::new(Cow::Borrowed(&span.text), styles, link, text_mode));
                }
                SpanKind::Code => {
                    segs.push(Seg::new(Cow::Borrowed(&span.text), CODE, None, Mode::Raw));
                }
                SpanKind::Image { url } => {
                    let alt = if span.text.trim().is_empty() {
                        "image"
                    } else {
                        span.text.as_str()
                    };
                    let inside_link = span.style.link.is_some();
                    segs.push(Seg::new(
                        Cow::Borrowed("🖼 "),
                        styles,
                        link.clone(),
                        Mode::Raw,
                    ));
                    let target = if inside_link {
                        link
                    } else {
                        link_target(url, flavor)
                    };
                    let mode = if target.is_some() {
                        Mode::LinkText
                    } else {
                        Mode::Text
                    };
                    segs.push(Seg::new(Cow::Borrowed(alt), styles, target, mode));
                    if flavor == Flavor::Plain && !inside_link {
                        push_url_suffix(&mut segs, url, alt);
                    }
                }
            }
        }
        if let Some((url, text)) = group {
            push_url_suffix(&mut segs, url, &text);
        }
        segs
    }

    /// Writes segments, opening and closing their ranges so that they nest: a range that
    /// ends closes everything opened after it (reopening what continues); ranges starting
    /// together open longest-lasting first. Adjacent segments sharing a range share one.
    fn write_segments(&mut self, segs: &mut [Seg]) {
        for i in (0..segs.len()).rev() {
            let (head, tail) = segs.split_at_mut(i + 1);
            let Some(seg) = head.last_mut() else { continue };
            // Runs of a segment without marks stay 0, as made.
            if !seg.marked() {
                continue;
            }
            for mark in 0..MARKS {
                seg.run[mark] = match tail.first() {
                    _ if !seg.has(mark) => 0,
                    Some(next) if seg.shares(next, mark) => 1 + next.run[mark],
                    _ => 1,
                };
            }
        }
        let segs: &[Seg] = segs;
        // The open ranges, outermost first: mark index and range id. One mark is open at most
        // once, so MARKS entries always suffice.
        let mut stack = [(0, 0); MARKS];
        let mut depth = 0;
        // The segment whose link is open, to tell one link from the next.
        let mut link_seg = 0;
        for (i, seg) in segs.iter().enumerate() {
            let carried = |mark: usize| {
                if mark == LINK {
                    segs.get(link_seg)
                        .is_some_and(|open| open.shares(seg, LINK))
                } else {
                    seg.has(mark)
                }
            };
            if let Some(j) = stack[..depth].iter().position(|&(mark, _)| !carried(mark)) {
                while depth > j {
                    depth -= 1;
                    self.close(stack[depth].1);
                }
            }
            if !seg.marked() {
                self.write(&seg.text, seg.mode);
                continue;
            }
            let mut to_open = [0; MARKS];
            let mut count = 0;
            for mark in 0..MARKS {
                if seg.has(mark) && !stack[..depth].iter().any(|&(m, _)| m == mark) {
                    to_open[count] = mark;
                    count += 1;
                }
            }
            to_open[..count].sort_unstable_by(|&a, &b| seg.run[b].cmp(&seg.run[a]).then(a.cmp(&b)));
            for &mark in &to_open[..count] {
                let id = self.open(seg.kind(mark));
                if mark == LINK {
                    link_seg = i;
                }
                stack[depth] = (mark, id);
                depth += 1;
            }
            self.write(&seg.text, seg.mode);
        }
        while depth > 0 {
            depth -= 1;
            self.close(stack[depth].1);
        }
    }
}

fn checkbox(done: bool) -> &'static str {
    if done { "☑" } else { "☐" }
}

/// Plain flavor: ` (url)` after a link whose destination is worth showing.
fn push_url_suffix(segs: &mut Vec<Seg<'_>>, url: &str, text: &str) {
    let shown = url.trim();
    let displayable = shown.split_once(':').is_some_and(|(scheme, _)| {
        ["http", "https", "tg", "mailto"]
            .iter()
            .any(|s| scheme.eq_ignore_ascii_case(s))
    });
    let same = shown == text.trim() || shown.strip_prefix("mailto:") == Some(text.trim());
    if displayable && !same {
        let mut suffix = String::with_capacity(shown.len() + 3);
        suffix.push_str(" (");
        suffix.push_str(shown);
        suffix.push(')');
        segs.push(Seg::raw(Cow::Owned(suffix)));
    }
}

/// Keeps printable text, newlines and tabs.
fn keep_char(c: char) -> bool {
    !c.is_control() || c == '\n' || c == '\t'
}

/// The bare `http://` / `https://` URL at the start of `s` (empty if none): up to a space or
/// angle bracket, without trailing sentence punctuation (a closing parenthesis stays when it
/// balances one inside the URL, as in Wikipedia links).
fn bare_url(s: &str) -> &str {
    let starts = |scheme: &str| {
        s.as_bytes()
            .get(..scheme.len())
            .is_some_and(|b| b.eq_ignore_ascii_case(scheme.as_bytes()))
    };
    if !(starts("http://") || starts("https://")) {
        return "";
    }
    let end = s
        .find(|c: char| c.is_whitespace() || c == '<' || c == '>' || !keep_char(c))
        .unwrap_or(s.len());
    let mut url = &s[..end];
    while let Some(last) = url.chars().next_back() {
        let balanced = last == ')' && url.matches('(').count() >= url.matches(')').count();
        if !".,:;!?\"')]*_~|".contains(last) || balanced {
            break;
        }
        url = &url[..url.len() - last.len_utf8()];
    }
    if url.len() <= "https://".len() {
        ""
    } else {
        url
    }
}

/// The bytes [`link_target`] keeps as they are: printable ASCII but `"<>\\^`{|}`. A table:
/// testing each byte against the list cost more than the rest of the check.
static URL_AS_IS: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = b'!';
    while b <= b'~' {
        table[b as usize] = !matches!(
            b,
            b'"' | b'<' | b'>' | b'\\' | b'^' | b'`' | b'{' | b'|' | b'}'
        );
        b += 1;
    }
    table
};

/// The destination a flavor links to, normalized, or `None` when the link stays plain text.
///
/// Telegram: http, https and tg; Discord: http and https; plain: never (plain text shows
/// destinations itself). An http(s) URL needs a host of letters, digits, `-`, `.`, `_` and an
/// optional port (no credentials): Telegram refuses a whole message whose `text_link` it
/// cannot parse. Spaces, controls and `"<>\^`{|}` are percent-encoded.
pub(crate) fn link_target(url: &str, flavor: Flavor) -> Option<Cow<'_, str>> {
    let url = url.trim();
    let max = match flavor {
        Flavor::Telegram => TELEGRAM_MAX_URL,
        Flavor::Discord => DISCORD_MAX_URL,
        Flavor::Plain => return None,
    };
    if url.len() > max {
        return None;
    }
    // Byte searches: a `char` pattern's searcher costs more than these few bytes.
    let colon = url.bytes().position(|b| b == b':')?;
    let (scheme, rest) = (&url[..colon], &url[colon + 1..]);
    let is = |name: &str| scheme.eq_ignore_ascii_case(name);
    if is("http") || is("https") {
        let after = rest.strip_prefix("//")?;
        let authority = after
            .bytes()
            .position(|b| matches!(b, b'/' | b'?' | b'#'))
            .map_or(after, |end| &after[..end]);
        let host = match authority.bytes().rposition(|b| b == b':') {
            Some(colon) => {
                let (host, port) = (&authority[..colon], &authority[colon + 1..]);
                if port.is_empty() || port.len() > 5 || !port.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                host
            }
            None => authority,
        };
        // Bytes when ASCII (the same test, without decoding chars).
        let host_ok = if host.is_ascii() {
            let (mut alphanumeric, mut allowed) = (false, true);
            for &b in host.as_bytes() {
                alphanumeric |= b.is_ascii_alphanumeric();
                allowed &= b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_');
            }
            alphanumeric && allowed
        } else {
            host.chars().any(char::is_alphanumeric)
                && host
                    .chars()
                    .all(|c| c.is_alphanumeric() || matches!(c, '-' | '.' | '_'))
        };
        if !host_ok {
            return None;
        }
    } else if is("tg") && flavor == Flavor::Telegram {
        let after = rest.trim_start_matches('/');
        if !after.starts_with(|c: char| c.is_ascii_alphanumeric()) {
            return None;
        }
    } else {
        return None;
    }
    let encoded = |c: char| {
        c.is_whitespace()
            || c.is_control()
            || matches!(c, '"' | '<' | '>' | '\\' | '^' | '`' | '{' | '|' | '}')
    };
    // Most destinations are already normal (lowercase scheme, printable ASCII but the bytes
    // `encoded` escapes): they are used as written, without a copy.
    if !scheme.bytes().any(|b| b.is_ascii_uppercase())
        && rest.bytes().all(|b| URL_AS_IS[usize::from(b)])
    {
        return Some(Cow::Borrowed(url));
    }
    let mut out = String::with_capacity(url.len() + 8);
    out.push_str(&scheme.to_ascii_lowercase());
    out.push(':');
    for c in rest.chars() {
        if encoded(c) {
            let mut buf = [0u8; 4];
            for &b in c.encode_utf8(&mut buf).as_bytes() {
                const HEX: &[u8; 16] = b"0123456789ABCDEF";
                out.push('%');
                out.push(char::from(HEX[usize::from(b >> 4)]));
                out.push(char::from(HEX[usize::from(b & 0xF)]));
            }
        } else {
            out.push(c);
        }
    }
    Some(Cow::Owned(out))
}

// ---- tables ---------------------------------------------------------------------------------

/// Header row then body rows, each cell flattened to one line of plain text, every row
/// padded to the same number of columns. Empty when the table has no columns.
fn grid(table: &Table) -> Vec<Vec<String>> {
    let columns = table
        .rows
        .iter()
        .map(Vec::len)
        .chain([table.header.len(), table.alignments.len()])
        .max()
        .unwrap_or(0);
    if columns == 0 {
        return Vec::new();
    }
    std::iter::once(&table.header)
        .chain(&table.rows)
        .map(|row| {
            (0..columns)
                .map(|c| row.get(c).map(|cell| plain_line(cell)).unwrap_or_default())
                .collect()
        })
        .collect()
}

/// A cell as one line of plain text: links and images as `text (url)`, breaks as spaces.
fn plain_line(spans: &[Span]) -> String {
    let writer = Writer::new(Flavor::Plain);
    writer
        .segments(spans, false)
        .iter()
        .flat_map(|seg| seg.text.chars())
        .filter(|&c| keep_char(c))
        .map(|c| if c == '\n' || c == '\t' { ' ' } else { c })
        .collect::<String>()
        .trim()
        .to_string()
}
