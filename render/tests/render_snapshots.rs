//! Typical replies as a person sees them on each platform.
//!
//! Telegram parts are shown as their text with each entity drawn around the text it covers:
//! `⟦bold:…⟧`, `⟦pre rust:…⟧`, `⟦link https://…:…⟧`; the part's UTF-16 length heads it.

// A failed unwrap in a test is the test failing.
#![allow(clippy::unwrap_used)]

use expect_test::{Expect, expect};
use parlor_render::{
    discord::{self, DiscordOptions},
    plain,
    telegram::{self, EntityKind, TelegramPart},
};

const TYPICAL: &str = r#"# Deploy status

The rollout is **mostly done**, see *details* below.

## Steps
- [x] build the image
- [ ] migrate the database
  - back up first
  - run `migrate --apply`
- notify the team

1. first
2. second

```rust
fn main() {
    println!("hello");
}
```

| service | state | latency |
|:--------|:-----:|--------:|
| api     | ok    | 12 ms   |
| worker  | slow  | 340 ms  |

> Note: the worker needs **more memory**.
"#;

const LINKS: &str = "Docs: [the guide](https://example.com/guide?a=1&b=2), \
[click me](javascript:alert(1)), [relative](/local/path), [bot](tg://resolve?domain=parlor), \
<https://example.org>, <mail@example.com>, ![a chart](https://example.com/chart.png), \
[![badge](https://img.example/b.svg)](https://ci.example/run) and `[not](a link)`.";

#[test]
fn telegram_typical_reply() {
    check_telegram(
        TYPICAL,
        expect![[r#"
            [370 UTF-16 units]
            ⟦bold:Deploy status⟧

            The rollout is ⟦bold:mostly done⟧, see ⟦italic:details⟧ below.

            ⟦bold:Steps⟧

            ☑ build the image
            ☐ migrate the database
              ◦ back up first
              ◦ run ⟦code:migrate --apply⟧
            • notify the team

            1. first
            2. second

            ⟦pre rust:fn main() {
                println!("hello");
            }⟧

            ⟦pre:service │ state │ latency
            ────────┼───────┼────────
            api     │  ok   │   12 ms
            worker  │ slow  │  340 ms⟧

            ⟦quote:Note: the worker needs ⟦bold:more memory⟧.⟧"#]],
    );
}

#[test]
fn discord_typical_reply() {
    check_discord(
        TYPICAL,
        expect![[r#"
            [420 chars]
            **Deploy status**

            The rollout is **mostly done**, see _details_ below.

            **Steps**

            - ☑ build the image
            - ☐ migrate the database
                - back up first
                - run `migrate --apply`
            - notify the team

            1. first
            2. second

            ```rust
            fn main() {
                println!("hello");
            }
            ```

            ```
            service │ state │ latency
            ────────┼───────┼────────
            api     │  ok   │   12 ms
            worker  │ slow  │  340 ms
            ```

            > Note: the worker needs **more memory**."#]],
    );
}

#[test]
fn plain_typical_reply() {
    expect![[r#"
        Deploy status

        The rollout is mostly done, see details below.

        Steps

        ☑ build the image
        ☐ migrate the database
          ◦ back up first
          ◦ run migrate --apply
        • notify the team

        1. first
        2. second

            fn main() {
                println!("hello");
            }

        service │ state │ latency
        ────────┼───────┼────────
        api     │  ok   │   12 ms
        worker  │ slow  │  340 ms

        > Note: the worker needs more memory."#]]
    .assert_eq(&plain::render(TYPICAL));
}

#[test]
fn telegram_links() {
    check_telegram(
        LINKS,
        expect![[r#"
            [120 UTF-16 units]
            Docs: ⟦link https://example.com/guide?a=1&b=2:the guide⟧, click me, relative, ⟦link tg://resolve?domain=parlor:bot⟧, ⟦link https://example.org:https://example.org⟧, mail@example.com, 🖼 ⟦link https://example.com/chart.png:a chart⟧, ⟦link https://ci.example/run:🖼 badge⟧ and ⟦code:[not](a link)⟧."#]],
    );
}

#[test]
fn discord_links() {
    check_discord(
        LINKS,
        expect![[r#"
            [224 chars]
            Docs: [the guide](<https://example.com/guide?a=1&b=2>), click me, relative, bot, <https://example.org>, mail@example.com, 🖼 [a chart](<https://example.com/chart.png>), [🖼 badge](<https://ci.example/run>) and `[not](a link)`."#]],
    );
}

#[test]
fn plain_links() {
    expect!["Docs: the guide (https://example.com/guide?a=1&b=2), click me, relative, bot (tg://resolve?domain=parlor), https://example.org, mail@example.com, 🖼 a chart (https://example.com/chart.png), 🖼 badge (https://ci.example/run) and [not](a link)."]
    .assert_eq(&plain::render(LINKS));
}

#[test]
fn discord_mass_mentions_are_neutralized_unless_allowed() {
    let text = "@everyone and @here, role <@&42>, user <@7>";
    let shown = |options| {
        discord::render(text, options)
            .join("")
            .replace('\u{200B}', "<ZWSP>")
    };
    expect!["@<ZWSP>everyone and @<ZWSP>here, role <@<ZWSP>&42>, user <@7>"]
        .assert_eq(&shown(DiscordOptions::default()));
    expect!["@everyone and @here, role <@&42>, user <@7>"].assert_eq(&shown(DiscordOptions {
        allow_mass_mentions: true,
    }));
}

#[test]
fn telegram_entities_serialize_as_the_bot_api_expects() {
    let parts = telegram::render("**a** [b](https://x.example) `c`\n\n```rust\nd\n```");
    let json = serde_json::to_string(&parts[0].entities).unwrap_or_default();
    expect![[r#"[{"type":"bold","offset":0,"length":1},{"type":"text_link","url":"https://x.example","offset":2,"length":1},{"type":"code","offset":4,"length":1},{"type":"pre","language":"rust","offset":7,"length":1}]"#]]
    .assert_eq(&json);
    let back: Vec<telegram::Entity> = serde_json::from_str(&json).unwrap_or_default();
    assert_eq!(back, parts[0].entities);
}

#[test]
fn empty_input_gives_no_parts() {
    for md in ["", "  \n\n ", "[ref]: https://example.com"] {
        assert!(telegram::render(md).is_empty(), "{md:?}");
        assert!(
            discord::render(md, DiscordOptions::default()).is_empty(),
            "{md:?}"
        );
        assert_eq!(plain::render(md), "", "{md:?}");
    }
}

/// About 10,000 characters: paragraphs with formatting and links around a code block too
/// long for one Telegram message.
fn long_reply() -> String {
    let mut md = String::from("# Long report\n\n");
    for i in 1..=12 {
        md.push_str(&format!(
            "Paragraph {i}: the service handled **{i}00 requests** in the last hour, \
             *mostly* reads; see [run {i}](https://ci.example/runs/{i}) for the full log \
             and the `p99` figures, which stayed within the budget we agreed on.\n\n"
        ));
    }
    md.push_str("```rust\n");
    for i in 1..=140 {
        md.push_str(&format!(
            "let step_{i} = pipeline.run({i}).await?; // stage {i}\n"
        ));
    }
    md.push_str("```\n\n");
    for i in 13..=20 {
        md.push_str(&format!(
            "Paragraph {i}: after the code, more **bold {i}** text with a \
             [link {i}](https://example.com/{i}) and some ~~old~~ *new* wording.\n\n"
        ));
    }
    md
}

#[test]
fn telegram_long_reply_is_split_at_paragraphs_and_lines() {
    let md = long_reply();
    assert!(md.chars().count() >= 10_000, "{}", md.chars().count());
    let parts = telegram::render(&md);
    expect![[r#"
        == part 1 (2084) ==
        ⟦bold:Long report⟧

        …

        Paragraph 12: the service handled ⟦bold:1200 requests⟧ in the last hour, ⟦italic:mostly⟧ reads; see ⟦link https://ci.example/runs/12:run 12⟧ for the full log and the ⟦code:p99⟧ figures, which stayed within the budget we agreed on.
        == part 2 (4052) ==
        ⟦pre rust:let step_1 = pipeline.run(1).await?; // stage 1
        let step_2 = pipeline.run(2).await?; // stage 2
        …
        let step_79 = pipeline.run(79).await?; // stage 79
        let step_80 = pipeline.run(80).await?; // stage 80⟧
        == part 3 (3902) ==
        ⟦pre rust:let step_81 = pipeline.run(81).await?; // stage 81
        let step_82 = pipeline.run(82).await?; // stage 82
        …

        Paragraph 20: after the code, more ⟦bold:bold 20⟧ text with a ⟦link https://example.com/20:link 20⟧ and some ⟦strike:old⟧ ⟦italic:new⟧ wording.
    "#]]
    .assert_eq(&cuts(parts.iter().map(|p| (p.utf16_len(), annotate(p)))));
}

#[test]
fn discord_long_reply_is_split_with_fences_reopened() {
    let parts = discord::render(&long_reply(), DiscordOptions::default());
    expect![[r#"
        == part 1 (1914) ==
        **Long report**

        …

        Paragraph 9: the service handled **900 requests** in the last hour, _mostly_ reads; see [run 9](<https://ci.example/runs/9>) for the full log and the `p99` figures, which stayed within the budget we agreed on.
        == part 2 (1955) ==
        Paragraph 10: the service handled **1000 requests** in the last hour, _mostly_ reads; see [run 10](<https://ci.example/runs/10>) for the full log and the `p99` figures, which stayed within the budget we agreed on.

        …
        let step_26 = pipeline.run(26).await?; // stage 26
        ```
        == part 3 (2000) ==
        ```rust
        let step_27 = pipeline.run(27).await?; // stage 27
        …
        let step_65 = pipeline.run(65).await?; // stage 65
        ```
        == part 4 (1961) ==
        ```rust
        let step_66 = pipeline.run(66).await?; // stage 66
        …
        let step_103 = pipeline.run(103).await?; // stage 103
        ```
        == part 5 (1955) ==
        ```rust
        let step_104 = pipeline.run(104).await?; // stage 104
        …
        let step_139 = pipeline.run(139).await?; // stage 139
        ```
        == part 6 (1089) ==
        ```rust
        let step_140 = pipeline.run(140).await?; // stage 140
        …

        Paragraph 20: after the code, more **bold 20** text with a [link 20](<https://example.com/20>) and some ~~old~~ _new_ wording.
    "#]]
    .assert_eq(&cuts(parts.iter().map(|p| (p.chars().count(), p.clone()))));
}

#[test]
fn plain_long_reply_is_one_text() {
    let text = plain::render(&long_reply());
    let lines: Vec<&str> = text.lines().collect();
    expect![[r#"
        11140 chars, 182 lines
        Long report

        Paragraph 1: the service handled 100 requests in the last hour, mostly reads; see run 1 (https://ci.example/runs/1) for the full log and the p99 figures, which stayed within the budget we agreed on.
        …
        Paragraph 19: after the code, more bold 19 text with a link 19 (https://example.com/19) and some old new wording.

        Paragraph 20: after the code, more bold 20 text with a link 20 (https://example.com/20) and some old new wording."#]]
    .assert_eq(&format!(
        "{} chars, {} lines\n{}\n…\n{}",
        text.chars().count(),
        lines.len(),
        lines[..3].join("\n"),
        lines[lines.len() - 3..].join("\n")
    ));
}

fn check_telegram(markdown: &str, expect: Expect) {
    let shown: Vec<String> = telegram::render(markdown)
        .iter()
        .map(|p| format!("[{} UTF-16 units]\n{}", p.utf16_len(), annotate(p)))
        .collect();
    expect.assert_eq(&shown.join("\n-----\n"));
}

fn check_discord(markdown: &str, expect: Expect) {
    let shown: Vec<String> = discord::render(markdown, DiscordOptions::default())
        .iter()
        .map(|p| format!("[{} chars]\n{p}", p.chars().count()))
        .collect();
    expect.assert_eq(&shown.join("\n-----\n"));
}

/// Each part's length with its first and last two lines: what a reader sees at every cut.
fn cuts(parts: impl Iterator<Item = (usize, String)>) -> String {
    let mut out = String::new();
    for (n, (len, text)) in parts.enumerate() {
        let lines: Vec<&str> = text.lines().collect();
        out.push_str(&format!("== part {} ({len}) ==\n", n + 1));
        if lines.len() <= 4 {
            out.push_str(&lines.join("\n"));
        } else {
            out.push_str(&lines[..2].join("\n"));
            out.push_str("\n…\n");
            out.push_str(&lines[lines.len() - 2..].join("\n"));
        }
        out.push('\n');
    }
    out
}

/// The part's text with `⟦kind:…⟧` drawn around every entity (outer first).
fn annotate(part: &TelegramPart) -> String {
    let mut opens: Vec<(usize, usize, String)> = Vec::new(); // (offset, -length order, label)
    for e in &part.entities {
        let label = match &e.kind {
            EntityKind::Bold => "bold".to_string(),
            EntityKind::Italic => "italic".to_string(),
            EntityKind::Underline => "underline".to_string(),
            EntityKind::Strikethrough => "strike".to_string(),
            EntityKind::Spoiler => "spoiler".to_string(),
            EntityKind::Code => "code".to_string(),
            EntityKind::Pre { language: None } => "pre".to_string(),
            EntityKind::Pre { language: Some(l) } => format!("pre {l}"),
            EntityKind::TextLink { url } => format!("link {url}"),
            EntityKind::Blockquote => "quote".to_string(),
        };
        opens.push((e.offset, e.offset + e.length, label));
    }
    opens.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    let mut out = String::new();
    let mut at = 0; // UTF-16 position
    let mut stack: Vec<usize> = Vec::new(); // ends of open entities
    let mut next = 0;
    let mut chars = part.text.chars().peekable();
    loop {
        while stack.last() == Some(&at) {
            stack.pop();
            out.push('⟧');
        }
        while next < opens.len() && opens[next].0 == at {
            out.push_str(&format!("⟦{}:", opens[next].2));
            stack.push(opens[next].1);
            next += 1;
        }
        let Some(c) = chars.next() else { break };
        out.push(c);
        at += c.len_utf16();
    }
    out
}
