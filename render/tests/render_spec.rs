//! Every CommonMark 0.31.2 and GFM 0.29 spec example through the Telegram and Discord
//! renderers, once as written and once repeated past 10,000 characters so that splitting runs
//! on real inputs.
//!
//! Telegram, per part: non-empty, at most 4096 UTF-16 units; every entity non-empty, inside
//! the part, on char boundaries, properly nested (disjoint or one inside the other) and within
//! the Bot API's rules (`pre`/`code` contain nothing and sit in nothing but a blockquote,
//! blockquotes do not nest, links do not nest, `text_link` only to http/https/tg).
//! Discord, per part: non-empty, at most 2000 chars, code fences balanced, no mass mention.
//! Content: the words of the spec's own HTML rendering appear in order in the text (a word is
//! a maximal run of alphanumeric chars; tags are stripped, `&amp;`-style and numeric character
//! references decoded). For the repeated inputs, the reference is the unsplit rendering: the
//! parts hold exactly its alphanumeric chars (Telegram), or at least them in order (Discord,
//! which adds link destinations).

// A failed unwrap in a test is the test failing.
#![allow(clippy::unwrap_used)]

use std::panic::{AssertUnwindSafe, catch_unwind};

use parlor_render as render;
use parlor_render::{
    discord::{self, DiscordOptions},
    telegram::{self, EntityKind, TelegramPart},
};
use serde::Deserialize;

#[derive(Deserialize)]
struct Example {
    markdown: String,
    html: String,
    example: u32,
}

fn load(name: &str) -> Vec<Example> {
    let path = format!(
        "{}/../tests/fixtures/commonmark/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    let json = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&json).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Examples whose HTML words legitimately do not appear in order in one platform's text:
/// (spec, example, platform, reason). Keep it small: each entry is a deliberate difference.
const WORD_EXCEPTIONS: &[(&str, u32, &str, &str)] = &[
    // `<https://foo.bar.`baz>`: Discord gets the autolink with its backtick percent-encoded
    // (`%60`), so that no triple backtick can ever appear outside a code fence.
    (
        "spec",
        346,
        "discord",
        "backtick in an autolink is percent-encoded",
    ),
    (
        "gfm",
        356,
        "discord",
        "backtick in an autolink is percent-encoded",
    ),
];

#[test]
fn commonmark_examples_render_validly() {
    let examples = load("spec-0.31.2.json");
    assert_eq!(examples.len(), 652);
    check_all("spec", &examples);
}

#[test]
fn gfm_examples_render_validly() {
    let examples = load("gfm-spec-0.29-gfm.json");
    assert_eq!(examples.len(), 671);
    check_all("gfm", &examples);
}

/// Every distinct input (CommonMark's, plus the GFM ones CommonMark lacks) repeated past
/// 10,000 chars; in two halves so that both run at once.
#[test]
fn repeated_examples_split_validly_first_half() {
    check_all_repeated(&repeated_inputs(0));
}

#[test]
fn repeated_examples_split_validly_second_half() {
    check_all_repeated(&repeated_inputs(1));
}

/// Distinct example inputs labelled `spec N` / `gfm N`, every other one from `half`.
fn repeated_inputs(half: usize) -> Vec<(String, Example)> {
    let commonmark = load("spec-0.31.2.json");
    let seen: std::collections::HashSet<String> =
        commonmark.iter().map(|ex| ex.markdown.clone()).collect();
    let gfm_only = load("gfm-spec-0.29-gfm.json")
        .into_iter()
        .filter(|ex| !seen.contains(&ex.markdown));
    commonmark
        .into_iter()
        .map(|ex| ("spec", ex))
        .chain(gfm_only.map(|ex| ("gfm", ex)))
        .enumerate()
        .filter(|(i, _)| i % 2 == half)
        .map(|(_, (spec, ex))| (spec.to_string(), ex))
        .collect()
}

/// Inputs that stress nesting depth, cuts and escaping, and random token soup, at limits
/// down to 2 UTF-16 units: valid parts, and no alphanumeric char lost or added by a cut.
#[test]
fn pathological_and_random_inputs_render_validly() {
    let mut inputs = vec![
        "> ".repeat(5000) + "deep",
        "- ".repeat(5000) + "deep",
        "1. ".repeat(3000) + "deep",
        "*".repeat(3000) + "a" + &"*".repeat(3000),
        "[".repeat(3000) + "a" + &"](http://x.y)".repeat(3000),
        "![".repeat(2000) + "a" + &"](http://x.y)".repeat(2000),
        "\u{0}\u{1}\r\n\u{7f}\u{85}a\u{200B}b\u{feff}".to_string(),
        "😀".repeat(3000),
        "a😀".repeat(3000),
        "word".repeat(3000),
        "`".repeat(3000),
        "```\n".to_string() + &"😀 code line\n".repeat(800),
        "\\".repeat(5000),
        "| a | b |\n|---|:-:|\n".to_string() + &"| x😀 | **y** |\n".repeat(800),
        format!("| {} |\n|---|\n| v |\n", "wide ".repeat(40)),
        "    ".to_string() + &"x ".repeat(3000),
        format!("[link](https://example.com/{})", "p".repeat(5000)),
        "@everyone @here <@&1> ".repeat(300),
        "- [ ] task\n- [x] done\n".repeat(300),
    ];
    let mut rng = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move |n: usize| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % n as u64) as usize
    };
    const TOKENS: &[&str] = &[
        "*",
        "**",
        "_",
        "__",
        "`",
        "```",
        "~~",
        "[",
        "]",
        "(",
        ")",
        "<",
        ">",
        "!",
        "# ",
        "- ",
        "1. ",
        "> ",
        "|",
        "---",
        "\n",
        "\n\n",
        "    ",
        "\\",
        "&amp;",
        "&#x1F600;",
        "http://x.y/",
        "javascript:",
        "tg://resolve",
        "😀",
        "é",
        "中",
        "\u{0}",
        "\t",
        " ",
        " ",
        "word",
        "x",
        "[x] ",
        "<div>",
        "@everyone",
        "](http://a.b)",
        "](<u v>)",
        "- [ ] ",
        "| a |",
        "|---|",
    ];
    for _ in 0..400 {
        let len = next(300);
        inputs.push((0..len).map(|_| TOKENS[next(TOKENS.len())]).collect());
    }
    let mut failures = Vec::new();
    for (n, markdown) in inputs.iter().enumerate() {
        let limit = [2, 3, 7, 50, 300, telegram::MAX_MESSAGE_UTF16][n % 6];
        let result = catch_unwind(AssertUnwindSafe(|| -> Result<(), String> {
            let doc = render::parse(markdown);
            let parts = telegram::render_document_with_limit(&doc, limit);
            check_telegram_limit(&parts, limit)?;
            let whole = telegram::render_document_with_limit(&doc, usize::MAX);
            let reference: Vec<char> = whole.iter().flat_map(|p| alnum(&p.text)).collect();
            let got: Vec<char> = parts.iter().flat_map(|p| alnum(&p.text)).collect();
            if got != reference {
                return Err(format!(
                    "alphanumeric chars changed by splitting at {limit}"
                ));
            }
            check_discord(&discord::render_document(&doc, DiscordOptions::default()))?;
            let _ = render::plain::render_document(&doc);
            Ok(())
        }));
        match result {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failures.push(format!("input {n} {:?}: {e}", abbreviate(markdown))),
            Err(_) => failures.push(format!("input {n} {:?}: panicked", abbreviate(markdown))),
        }
    }
    report(failures);
}

fn abbreviate(s: &str) -> String {
    let head: String = s.chars().take(80).collect();
    if head.len() < s.len() {
        format!("{head}…")
    } else {
        head
    }
}

fn check_all(spec: &str, examples: &[Example]) {
    let mut failures = Vec::new();
    for ex in examples {
        let result = catch_unwind(AssertUnwindSafe(|| check_one(spec, ex)));
        match result {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failures.push(format!("{spec} example {}: {e}", ex.example)),
            Err(_) => failures.push(format!("{spec} example {}: panicked", ex.example)),
        }
    }
    report(failures);
}

fn check_all_repeated(examples: &[(String, Example)]) {
    let mut failures = Vec::new();
    for (spec, ex) in examples {
        let result = catch_unwind(AssertUnwindSafe(|| check_repeated(ex)));
        let label = format!("{spec} example {} repeated", ex.example);
        match result {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failures.push(format!("{label}: {e}")),
            Err(_) => failures.push(format!("{label}: panicked")),
        }
    }
    report(failures);
}

fn report(failures: Vec<String>) {
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures
            .iter()
            .take(30)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

fn check_one(spec: &str, ex: &Example) -> Result<(), String> {
    let doc = render::parse(&ex.markdown);
    let tg = telegram::render_document(&doc);
    check_telegram(&tg)?;
    let dc = discord::render_document(&doc, DiscordOptions::default());
    check_discord(&dc)?;

    let excepted = |platform: &str| {
        WORD_EXCEPTIONS
            .iter()
            .any(|(s, n, p, _)| *s == spec && *n == ex.example && *p == platform)
    };
    let expected = html_words(&ex.html);
    if !excepted("telegram") {
        let tg_text = tg
            .iter()
            .map(|p| p.text.as_str())
            .collect::<Vec<_>>()
            .join("\n");
        subsequence(&expected, &words(&tg_text)).map_err(|e| format!("telegram: {e}"))?;
    }
    if !excepted("discord") {
        let dc_text = dc
            .iter()
            .map(|p| discord_visible(p))
            .collect::<Vec<_>>()
            .join("\n");
        subsequence(&expected, &words(&dc_text)).map_err(|e| format!("discord: {e}"))?;
    }
    Ok(())
}

fn check_repeated(ex: &Example) -> Result<(), String> {
    let mut markdown = String::new();
    while markdown.chars().count() <= 10_000 {
        markdown.push_str(&ex.markdown);
    }
    let doc = render::parse(&markdown);
    let tg = telegram::render_document(&doc);
    check_telegram(&tg)?;
    let dc = discord::render_document(&doc, DiscordOptions::default());
    check_discord(&dc)?;

    let whole = telegram::render_document_with_limit(&doc, usize::MAX);
    if whole.len() > 1 {
        return Err("unlimited rendering split".into());
    }
    let reference: Vec<char> = whole.iter().flat_map(|p| alnum(&p.text)).collect();
    let tg_chars: Vec<char> = tg.iter().flat_map(|p| alnum(&p.text)).collect();
    if tg_chars != reference {
        return Err(format!(
            "telegram parts hold {} alphanumeric chars, the unsplit text {}",
            tg_chars.len(),
            reference.len()
        ));
    }
    let dc_chars: Vec<char> = dc.iter().flat_map(|p| alnum(p)).collect();
    subsequence(&reference, &dc_chars).map_err(|e| format!("discord: {e}"))?;
    Ok(())
}

// ---- Telegram ----------------------------------------------------------------------------

fn check_telegram(parts: &[TelegramPart]) -> Result<(), String> {
    check_telegram_limit(parts, telegram::MAX_MESSAGE_UTF16)
}

fn check_telegram_limit(parts: &[TelegramPart], limit: usize) -> Result<(), String> {
    for (n, part) in parts.iter().enumerate() {
        check_telegram_part(part, limit).map_err(|e| format!("telegram part {n}: {e}"))?;
    }
    Ok(())
}

fn check_telegram_part(part: &TelegramPart, limit: usize) -> Result<(), String> {
    if part.text.trim().is_empty() {
        return Err("empty text".into());
    }
    let len = part.utf16_len();
    if len > limit {
        return Err(format!("{len} UTF-16 units"));
    }
    // UTF-16 offsets that fall between two chars.
    let mut boundaries = vec![false; len + 1];
    let mut at = 0;
    for c in part.text.chars() {
        boundaries[at] = true;
        at += c.len_utf16();
    }
    boundaries[len] = true;
    let ents = &part.entities;
    for e in ents {
        if e.length == 0 {
            return Err(format!("empty entity {e:?}"));
        }
        if e.offset + e.length > len {
            return Err(format!("entity {e:?} past the end ({len})"));
        }
        if !boundaries[e.offset] || !boundaries[e.offset + e.length] {
            return Err(format!("entity {e:?} cuts a surrogate pair"));
        }
        match &e.kind {
            EntityKind::TextLink { url } => {
                let lower = url.to_ascii_lowercase();
                if !(lower.starts_with("http://")
                    || lower.starts_with("https://")
                    || lower.starts_with("tg:"))
                    || url.contains(char::is_whitespace)
                {
                    return Err(format!("bad link {url:?}"));
                }
            }
            EntityKind::Pre { language: Some(l) } if l.is_empty() => {
                return Err("empty pre language".into());
            }
            _ => {}
        }
    }
    // Walk outer-first with a stack of enclosing entities: each entity must end within its
    // innermost encloser (else two entities overlap partially) and fit the rules for every
    // encloser.
    let mut sorted: Vec<&telegram::Entity> = ents.iter().collect();
    sorted.sort_by(|a, b| a.offset.cmp(&b.offset).then(b.length.cmp(&a.length)));
    let mut stack: Vec<&telegram::Entity> = Vec::new();
    for inner in sorted {
        let end = inner.offset + inner.length;
        while stack
            .last()
            .is_some_and(|o| o.offset + o.length <= inner.offset)
        {
            stack.pop();
        }
        if let Some(outer) = stack.last()
            && end > outer.offset + outer.length
        {
            return Err(format!("entities overlap: {outer:?} and {inner:?}"));
        }
        for outer in &stack {
            if !may_contain(outer, inner) {
                return Err(format!(
                    "{:?} must not contain {:?}",
                    outer.kind, inner.kind
                ));
            }
        }
        stack.push(inner);
    }
    Ok(())
}

/// The Bot API's nesting rules: `pre` and `code` contain nothing and lie inside nothing but
/// a blockquote; blockquotes do not nest; links do not nest. (Two entities over the same
/// range count as either containing the other.)
fn may_contain(outer: &telegram::Entity, inner: &telegram::Entity) -> bool {
    let monospace = |k: &EntityKind| matches!(k, EntityKind::Pre { .. } | EntityKind::Code);
    let same_range = outer.offset == inner.offset && outer.length == inner.length;
    match (&outer.kind, &inner.kind) {
        (EntityKind::Blockquote, EntityKind::Blockquote) => false,
        (_, EntityKind::Blockquote) => same_range && !monospace(&outer.kind),
        (EntityKind::Blockquote, _) => true,
        (o, i) if monospace(o) || monospace(i) => false,
        (EntityKind::TextLink { .. }, EntityKind::TextLink { .. }) => false,
        _ => true,
    }
}

// ---- Discord -----------------------------------------------------------------------------

fn check_discord(parts: &[String]) -> Result<(), String> {
    for (n, part) in parts.iter().enumerate() {
        check_discord_part(part).map_err(|e| format!("discord part {n}: {e}\n{part}"))?;
    }
    Ok(())
}

/// A fence is a line starting with three backticks; there must be an even number of them
/// and no triple backtick anywhere else, so every code block opened in a part is closed in
/// that part.
fn check_discord_part(part: &str) -> Result<(), String> {
    if part.trim().is_empty() {
        return Err("empty part".into());
    }
    let chars = part.chars().count();
    if chars > discord::MAX_MESSAGE_CHARS {
        return Err(format!("{chars} chars"));
    }
    let fences = part.lines().filter(|l| l.starts_with("```")).count();
    if fences % 2 != 0 {
        return Err(format!("{fences} fence lines"));
    }
    if part.matches("```").count() != fences {
        return Err("triple backtick outside a fence line".into());
    }
    let lower = part.to_lowercase();
    if lower.contains("@everyone") || lower.contains("@here") || part.contains("<@&") {
        return Err("mass mention survived".into());
    }
    Ok(())
}

/// What Discord shows of a part, near enough for comparing words: fence lines dropped,
/// escapes resolved, emphasis markers and link destinations removed, code kept verbatim.
fn discord_visible(markdown: &str) -> String {
    let mut out = String::new();
    let mut in_fence = false;
    for line in markdown.split('\n') {
        if line.starts_with("```") {
            in_fence = !in_fence;
        } else if in_fence {
            out.push_str(line);
        } else {
            visible_line(line, &mut out);
        }
        out.push('\n');
    }
    out
}

fn visible_line(line: &str, out: &mut String) {
    let chars: Vec<char> = line.chars().collect();
    let run = |i: usize| chars[i..].iter().take_while(|&&c| c == '`').count();
    let alnum_at = |i: Option<usize>| {
        i.and_then(|i| chars.get(i))
            .is_some_and(|c| c.is_alphanumeric())
    };
    let mut code = None;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if let Some(n) = code {
            if c == '`' && run(i) == n {
                code = None;
                i += n;
            } else {
                out.push(c);
                i += 1;
            }
            continue;
        }
        match c {
            '\\' if i + 1 < chars.len() => {
                out.push(chars[i + 1]);
                i += 2;
            }
            '`' => {
                let n = run(i);
                code = Some(n);
                i += n;
            }
            // `_` between two letters is a character, not a marker (e.g. in a bare URL).
            '_' if alnum_at(i.checked_sub(1)) && alnum_at(Some(i + 1)) => {
                out.push(c);
                i += 1;
            }
            // An autolink shows its URL without the brackets.
            '<' if chars[i..]
                .iter()
                .collect::<String>()
                .to_ascii_lowercase()
                .starts_with("<http")
                && chars[i..].contains(&'>') =>
            {
                let close = chars[i..].iter().position(|&c| c == '>').unwrap_or(0);
                out.extend(&chars[i + 1..i + close]);
                i += close + 1;
            }
            '*' | '_' | '~' | '[' => i += 1,
            ']' => {
                let rest: String = chars[i..].iter().collect();
                match rest.strip_prefix("](<").and_then(|r| r.find(">)")) {
                    Some(end) => i += 3 + rest[3..3 + end].chars().count() + 2,
                    None => {
                        out.push(c);
                        i += 1;
                    }
                }
            }
            _ => {
                out.push(c);
                i += 1;
            }
        }
    }
}

// ---- words -------------------------------------------------------------------------------

/// Block-level tags separate words; inline tags (`em`, `a`, `code`, ...) do not.
const BLOCK_TAGS: &[&str] = &[
    "p",
    "li",
    "ul",
    "ol",
    "blockquote",
    "pre",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "hr",
    "br",
    "table",
    "thead",
    "tbody",
    "tr",
    "th",
    "td",
    "div",
    "img",
    "input",
];

fn html_words(html: &str) -> Vec<String> {
    let mut text = String::new();
    let mut rest = html;
    while let Some(i) = rest.find('<') {
        text.push_str(&rest[..i]);
        let tag = &rest[i..];
        match tag.find('>') {
            Some(j) => {
                let name = tag[1..j]
                    .trim_start_matches('/')
                    .split(|c: char| c.is_whitespace() || c == '/')
                    .next()
                    .unwrap_or("")
                    .to_ascii_lowercase();
                if BLOCK_TAGS.contains(&name.as_str()) {
                    text.push(' ');
                }
                rest = &tag[j + 1..];
            }
            None => {
                text.push_str(tag);
                rest = "";
            }
        }
    }
    text.push_str(rest);
    words(&decode_entities(&text))
}

fn decode_entities(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('&') {
        out.push_str(&rest[..i]);
        let after = &rest[i..];
        let end = after.find(';').filter(|&e| e <= 10);
        let decoded = end.and_then(|e| {
            let name = &after[1..e];
            let c = match name {
                "amp" => Some('&'),
                "lt" => Some('<'),
                "gt" => Some('>'),
                "quot" => Some('"'),
                _ => {
                    let num = name.strip_prefix('#')?;
                    let code = match num.strip_prefix(['x', 'X']) {
                        Some(hex) => u32::from_str_radix(hex, 16).ok()?,
                        None => num.parse().ok()?,
                    };
                    Some(char::from_u32(code).unwrap_or('\u{FFFD}'))
                }
            };
            c.map(|c| (c, e))
        });
        match decoded {
            Some((c, e)) => {
                out.push(c);
                rest = &after[e + 1..];
            }
            None => {
                out.push('&');
                rest = &after[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

fn words(s: &str) -> Vec<String> {
    s.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_string)
        .collect()
}

fn alnum(s: &str) -> impl Iterator<Item = char> + '_ {
    s.chars().filter(|c| c.is_alphanumeric())
}

/// `expected` appears in order in `actual` (other items may come between).
fn subsequence<T: PartialEq + std::fmt::Debug>(expected: &[T], actual: &[T]) -> Result<(), String> {
    let mut it = actual.iter();
    for (n, want) in expected.iter().enumerate() {
        if !it.any(|have| have == want) {
            return Err(format!(
                "item {n} ({want:?}) of {expected:?} missing in order from {actual:?}"
            ));
        }
    }
    Ok(())
}
