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
    writer.blocks(&doc.blocks, 2);
    writer.finish()
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

/// One run of inline text with the formatting ranges that cover it.
struct Seg<'a> {
    text: Cow<'a, str>,
    marks: Vec<Kind>,
    mode: Mode,
}

/// Builds a [`Rich`] block by block; see the module documentation.
struct Writer {
    flavor: Flavor,
    text: String,
    entities: Vec<Ent>,
    /// Open ranges by id: kind and start (None until the first content char).
    open: Vec<Option<(Kind, Option<usize>)>>,
    /// Ids of open ranges that have not seen content yet.
    unstarted: Vec<usize>,
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
            unstarted: Vec::new(),
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
        // Fast path: the middle of a line, nothing waiting.
        if c != '\n'
            && self.line_has_content
            && self.pending_break == 0
            && self.pending.is_empty()
            && self.unstarted.is_empty()
        {
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
        let here = self.text.len();
        for &id in &self.unstarted {
            if let Some(Some((_, start @ None))) = self.open.get_mut(id) {
                *start = Some(here);
            }
        }
        self.unstarted.clear();
        self.glue = false;
        self.text.push(c);
        self.content_end = self.text.len();
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
        self.unstarted.push(id);
        id
    }

    fn close(&mut self, id: usize) {
        let Some((kind, start)) = self.open.get_mut(id).and_then(Option::take) else {
            return;
        };
        self.unstarted.retain(|&u| u != id);
        if let Some(start) = start
            && self.content_end > start
        {
            self.entities.push(Ent {
                kind,
                start,
                end: self.content_end,
            });
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
                let s = s.replace("```", "``\u{200B}`");
                self.write_chars(&s);
            }
            _ => self.write_chars(s),
        }
    }

    fn write_chars(&mut self, s: &str) {
        for (n, line) in s.split('\n').enumerate() {
            if n > 0 {
                self.put('\n');
            }
            // The first char sets the line up (break, prefix, ranges); the rest just follow.
            if line.contains(|c: char| !keep_char(c)) {
                let mut chars = line.chars().filter(|&c| keep_char(c));
                if let Some(first) = chars.next() {
                    self.put(first);
                    self.text.extend(chars);
                    self.content_end = self.text.len();
                }
            } else if let Some(first) = line.chars().next() {
                self.put(first);
                self.text.push_str(&line[first.len_utf8()..]);
                self.content_end = self.text.len();
            }
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
                    segs.push(Seg {
                        text: Cow::Borrowed(" │ "),
                        marks: Vec::new(),
                        mode: Mode::Raw,
                    });
                }
                segs.extend(self.segments(cell, true));
            }
            self.write_segments(&segs);
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
                    segs.push(Seg {
                        text: Cow::Borrowed(": "),
                        marks: Vec::new(),
                        mode: Mode::Raw,
                    });
                }
                segs.extend(self.segments(value, false));
                self.write_segments(&segs);
            }
        }
    }

    // ---- inline ---------------------------------------------------------------------------

    fn inlines(&mut self, spans: &[Span], heading: bool) {
        let segs = self.segments(spans, heading);
        self.write_segments(&segs);
    }

    /// Turns spans into segments with the flavor's formatting ranges.
    fn segments<'a>(&self, spans: &'a [Span], bold: bool) -> Vec<Seg<'a>> {
        let flavor = self.flavor;
        let mut segs = Vec::new();
        // Plain: the link being read, to append its destination when it ends.
        let mut group: Option<(&str, String)> = None;
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
            let link = span
                .style
                .link
                .as_deref()
                .and_then(|u| link_target(u, flavor));
            let mut styles = Vec::new();
            if flavor != Flavor::Plain {
                if span.style.bold || bold {
                    styles.push(Kind::Bold);
                }
                if span.style.italic {
                    styles.push(Kind::Italic);
                }
                if span.style.strikethrough {
                    styles.push(Kind::Strike);
                }
            }
            let with_link = |link: Option<String>| -> Vec<Kind> {
                link.map(Kind::Link)
                    .into_iter()
                    .chain(styles.iter().cloned())
                    .collect()
            };
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
                    segs.push(Seg {
                        text: Cow::Owned(format!("<{}>", link.unwrap_or_default())),
                        marks: styles.clone(),
                        mode: Mode::Raw,
                    });
                }
                SpanKind::Text => segs.push(Seg {
                    text: Cow::Borrowed(&span.text),
                    marks: with_link(link),
                    mode: text_mode,
                }),
                // Telegram: code can be inside nothing but a quote, so inside a link it is
                // text, and bold/italic around it are split.
                SpanKind::Code if link.is_some() || flavor == Flavor::Plain => segs.push(Seg {
                    text: Cow::Borrowed(&span.text),
                    marks: with_link(link),
                    mode: text_mode,
                }),
                SpanKind::Code => segs.push(Seg {
                    text: Cow::Borrowed(&span.text),
                    marks: vec![Kind::Code],
                    mode: Mode::Raw,
                }),
                SpanKind::Image { url } => {
                    let alt = if span.text.trim().is_empty() {
                        "image"
                    } else {
                        span.text.as_str()
                    };
                    let inside_link = span.style.link.is_some();
                    segs.push(Seg {
                        text: Cow::Borrowed("🖼 "),
                        marks: with_link(link.clone()),
                        mode: Mode::Raw,
                    });
                    let target = if inside_link {
                        link
                    } else {
                        link_target(url, flavor)
                    };
                    segs.push(Seg {
                        text: Cow::Borrowed(alt),
                        mode: if target.is_some() {
                            Mode::LinkText
                        } else {
                            Mode::Text
                        },
                        marks: with_link(target),
                    });
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
    fn write_segments(&mut self, segs: &[Seg]) {
        // run[i][k]: how many consecutive segments from i carry segs[i].marks[k].
        let mut run: Vec<Vec<usize>> = segs.iter().map(|s| vec![1; s.marks.len()]).collect();
        for i in (0..segs.len().saturating_sub(1)).rev() {
            for k in 0..segs[i].marks.len() {
                if let Some(p) = segs[i + 1]
                    .marks
                    .iter()
                    .position(|m| *m == segs[i].marks[k])
                {
                    run[i][k] = 1 + run[i + 1][p];
                }
            }
        }
        let mut stack: Vec<(Kind, usize)> = Vec::new();
        for (i, seg) in segs.iter().enumerate() {
            if let Some(j) = stack.iter().position(|(k, _)| !seg.marks.contains(k)) {
                while stack.len() > j {
                    if let Some((_, id)) = stack.pop() {
                        self.close(id);
                    }
                }
            }
            let mut to_open: Vec<usize> = (0..seg.marks.len())
                .filter(|&k| !stack.iter().any(|(m, _)| *m == seg.marks[k]))
                .collect();
            to_open.sort_by(|&a, &b| {
                run[i][b]
                    .cmp(&run[i][a])
                    .then(seg.marks[a].priority().cmp(&seg.marks[b].priority()))
            });
            for k in to_open {
                let id = self.open(seg.marks[k].clone());
                stack.push((seg.marks[k].clone(), id));
            }
            self.write(&seg.text, seg.mode);
        }
        while let Some((_, id)) = stack.pop() {
            self.close(id);
        }
    }
}

fn checkbox(done: bool) -> &'static str {
    if done { "☑" } else { "☐" }
}

/// Plain flavor: ` (url)` after a link whose destination is worth showing.
fn push_url_suffix(segs: &mut Vec<Seg<'_>>, url: &str, text: &str) {
    let shown = url.trim();
    let scheme = shown.split_once(':').map(|(s, _)| s.to_ascii_lowercase());
    let displayable = matches!(scheme.as_deref(), Some("http" | "https" | "tg" | "mailto"));
    let same = shown == text.trim() || shown.strip_prefix("mailto:") == Some(text.trim());
    if displayable && !same {
        segs.push(Seg {
            text: Cow::Owned(format!(" ({shown})")),
            marks: Vec::new(),
            mode: Mode::Raw,
        });
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

/// The destination a flavor links to, normalized, or `None` when the link stays plain text.
///
/// Telegram: http, https and tg; Discord: http and https; plain: never (plain text shows
/// destinations itself). An http(s) URL needs a host of letters, digits, `-`, `.`, `_` and an
/// optional port (no credentials): Telegram refuses a whole message whose `text_link` it
/// cannot parse. Spaces, controls and `"<>\^`{|}` are percent-encoded.
pub(crate) fn link_target(url: &str, flavor: Flavor) -> Option<String> {
    let url = url.trim();
    let max = match flavor {
        Flavor::Telegram => TELEGRAM_MAX_URL,
        Flavor::Discord => DISCORD_MAX_URL,
        Flavor::Plain => return None,
    };
    if url.len() > max {
        return None;
    }
    let (scheme, rest) = url.split_once(':')?;
    let scheme = scheme.to_ascii_lowercase();
    match (scheme.as_str(), flavor) {
        ("http" | "https", _) => {
            let after = rest.strip_prefix("//")?;
            let authority = after.split(['/', '?', '#']).next().unwrap_or("");
            let host = match authority.rsplit_once(':') {
                Some((host, port)) => {
                    if port.is_empty()
                        || port.len() > 5
                        || !port.chars().all(|c| c.is_ascii_digit())
                    {
                        return None;
                    }
                    host
                }
                None => authority,
            };
            let host_ok = host.chars().any(char::is_alphanumeric)
                && host
                    .chars()
                    .all(|c| c.is_alphanumeric() || matches!(c, '-' | '.' | '_'));
            if !host_ok {
                return None;
            }
        }
        ("tg", Flavor::Telegram) => {
            let after = rest.trim_start_matches('/');
            if !after.starts_with(|c: char| c.is_ascii_alphanumeric()) {
                return None;
            }
        }
        _ => return None,
    }
    let mut out = String::with_capacity(url.len());
    out.push_str(&scheme);
    out.push(':');
    for c in rest.chars() {
        if c.is_whitespace() || c.is_control() || "\"<>\\^`{|}".contains(c) {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    Some(out)
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
