//! The Markdown renderers on arbitrary text: no panic; every Telegram part within its
//! limit (the default 4096 and a small one the input picks, so that short inputs split
//! too), not empty, with every entity non-empty, inside the part and on a character
//! boundary; every Discord part within 2000 UTF-16 units.
#![no_main]

use libfuzzer_sys::fuzz_target;
use parlor_render::discord::{self, DiscordOptions, MAX_MESSAGE_CHARS};
use parlor_render::telegram::{self, MAX_MESSAGE_UTF16, TelegramPart};
use parlor_render::{parse, plain};

fuzz_target!(|data: &[u8]| {
    let Some((&limit, text)) = data.split_first() else {
        return;
    };
    let markdown = String::from_utf8_lossy(text);
    let doc = parse(&markdown);

    check_telegram(&telegram::render_document(&doc), MAX_MESSAGE_UTF16);
    // 2..=257: the renderer raises anything below 2 to 2.
    let small = usize::from(limit) + 2;
    check_telegram(&telegram::render_document_with_limit(&doc, small), small);

    for options in [
        DiscordOptions::default(),
        DiscordOptions {
            allow_mass_mentions: true,
        },
    ] {
        for part in discord::render_document(&doc, options) {
            let units = part.encode_utf16().count();
            assert!(
                units <= MAX_MESSAGE_CHARS,
                "discord part of {units} UTF-16 units: {part:?}"
            );
            assert!(!part.is_empty(), "empty discord part");
        }
    }

    let _ = plain::render_document(&doc);
});

fn check_telegram(parts: &[TelegramPart], limit: usize) {
    for part in parts {
        let len = part.utf16_len();
        assert!(
            len <= limit,
            "telegram part of {len} > {limit} units: {part:?}"
        );
        assert!(len > 0, "empty telegram part");
        // UTF-16 offsets where a character starts, and the end.
        let mut boundaries = vec![false; len + 1];
        let mut at = 0;
        for c in part.text.chars() {
            boundaries[at] = true;
            at += c.len_utf16();
        }
        boundaries[len] = true;
        for e in &part.entities {
            let end = e
                .offset
                .checked_add(e.length)
                .expect("entity end overflows");
            assert!(e.length > 0, "empty entity {e:?} in {part:?}");
            assert!(end <= len, "entity {e:?} past the end ({len}) of {part:?}");
            assert!(
                boundaries[e.offset] && boundaries[end],
                "entity {e:?} cuts a surrogate pair in {part:?}"
            );
        }
    }
}
