//! Splitting outgoing text to Telegram's 4096 UTF-16 unit limit.

use parlor_adapters::telegram::{MAX_MESSAGE_UTF16, render, split_utf16};

fn utf16_len(text: &str) -> usize {
    text.encode_utf16().count()
}

/// Every part fits and is non-empty, and the parts appear in the input in order with only
/// whitespace between them: nothing but whitespace at the cuts is lost.
fn assert_faithful_split(input: &str, parts: &[String], limit: usize) {
    let mut cursor = 0;
    for (index, part) in parts.iter().enumerate() {
        assert!(!part.trim().is_empty(), "part {index} is empty");
        assert!(
            utf16_len(part) <= limit,
            "part {index} has {} units",
            utf16_len(part)
        );
        let found = input[cursor..]
            .find(part.as_str())
            .unwrap_or_else(|| panic!("part {index} is not in the input after byte {cursor}"));
        let gap = &input[cursor..cursor + found];
        assert!(
            gap.chars().all(char::is_whitespace),
            "non-whitespace lost before part {index}: {gap:?}"
        );
        cursor += found + part.len();
    }
    assert!(
        input[cursor..].chars().all(char::is_whitespace),
        "text lost at the end"
    );
}

/// ~10k characters: words, emoji (astral and ZWJ sequences), CJK, lines and paragraphs.
fn mixed_text() -> String {
    let words = [
        "parlor",
        "😀",
        "agent",
        "👩‍👩‍👧",
        "群聊",
        "message",
        "🇺🇦",
        "tool",
        "schedule",
        "é",
    ];
    let mut text = String::new();
    let mut i = 0usize;
    while text.chars().count() < 10_000 {
        text.push_str(words[i % words.len()]);
        text.push(match i % 37 {
            0 => '\n',
            18 => '\t',
            _ => ' ',
        });
        if i % 151 == 150 {
            text.push('\n');
        }
        i += 1;
    }
    text
}

#[test]
fn ten_thousand_mixed_characters() {
    let text = mixed_text();
    let parts = render(&text);
    assert!(parts.len() >= 3, "{} parts", parts.len());
    assert_faithful_split(&text, &parts, MAX_MESSAGE_UTF16);
    // Cuts fall on whitespace, never inside a word or an emoji sequence.
    for pair in parts.windows(2) {
        let (end, start) = (
            pair[0].chars().last().unwrap_or(' '),
            pair[1].chars().next().unwrap_or(' '),
        );
        assert!(!end.is_whitespace() && !start.is_whitespace());
    }
    let words: Vec<&str> = text.split_whitespace().collect();
    let rejoined: Vec<&str> = parts
        .iter()
        .flat_map(|part| part.split_whitespace())
        .collect();
    assert_eq!(rejoined, words);
}

#[test]
fn emoji_only_text_never_splits_a_surrogate_pair() {
    let text = "😀".repeat(5000); // 10,000 UTF-16 units, no whitespace at all
    let parts = render(&text);
    assert_eq!(parts.len(), 3);
    assert_eq!(utf16_len(&parts[0]), 4096);
    assert_eq!(parts.concat(), text);
    assert_faithful_split(&text, &parts, MAX_MESSAGE_UTF16);
}

#[test]
fn exact_limit_boundaries() {
    let exactly = "a".repeat(4096);
    assert_eq!(render(&exactly), vec![exactly.clone()]);

    let one_over = "a".repeat(4097);
    let parts = render(&one_over);
    assert_eq!(parts.iter().map(String::len).collect::<Vec<_>>(), [4096, 1]);

    // An emoji whose second half would be unit 4097 moves whole to the next part.
    let straddling = format!("{}😀", "a".repeat(4095));
    assert_eq!(render(&straddling), vec!["a".repeat(4095), "😀".to_owned()]);

    // ...and one that ends exactly at unit 4096 stays.
    let fitting = format!("{}😀", "a".repeat(4094));
    assert_eq!(render(&fitting), vec![fitting.clone()]);
}

#[test]
fn a_paragraph_break_right_after_the_limit_is_used() {
    let first = "a".repeat(4096);
    let second = "b".repeat(10);
    let text = format!("{first}\n\n{second}");
    assert_eq!(render(&text), vec![first, second]);
}

#[test]
fn paragraphs_beat_lines_beat_words() {
    let paragraph = "word ".repeat(500); // 2500 units
    let text = format!("{}\n\n{}", paragraph.trim_end(), paragraph.trim_end());
    let parts = render(&text);
    assert_eq!(parts, vec![paragraph.trim_end(); 2]);

    let line = format!("{}\n", "x".repeat(1000));
    let text = line.repeat(6); // lines of 1001 units, no paragraph break
    let parts = render(&text);
    assert_eq!(parts.len(), 2);
    assert_eq!(parts[0], line.repeat(4).trim_end());
}

#[test]
fn nine_thousand_characters_make_three_parts() {
    let text = "lorem ipsum dolor sit amet ".repeat(334); // 9018 characters
    let parts = render(&text);
    assert_eq!(parts.len(), 3);
    assert_faithful_split(&text, &parts, MAX_MESSAGE_UTF16);
}

#[test]
fn small_limits_still_make_progress() {
    let text = "ab 😀 c\n\nd";
    for limit in 2..12 {
        let parts = split_utf16(text, limit);
        assert_faithful_split(text, &parts, limit);
    }
}

#[test]
fn whitespace_only_text_gives_nothing() {
    assert!(render("").is_empty());
    assert!(render("\n\n  \t").is_empty());
    assert_eq!(render("  hi  "), vec!["  hi".to_owned()]);
}
