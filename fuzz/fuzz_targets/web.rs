//! Web pages and search results on arbitrary bytes: decoding with the charset a header,
//! byte-order mark or `<meta>` names, HTML to Markdown, paging, and DuckDuckGo's result
//! page. Nothing panics, and reading a text page by page gives back the whole text.
#![no_main]

use libfuzzer_sys::fuzz_target;
use parlor_toolsets::web::page::{self, Kind};
use parlor_toolsets::web::search::parse_duckduckgo;

fuzz_target!(|data: &[u8]| {
    // The first byte picks the content type the "server" sent.
    let (pick, body) = data.split_first().map_or((0, data), |(p, b)| (*p, b));
    let content_type = match pick % 4 {
        0 => None,
        1 => Some("text/html; charset=shift_jis"),
        2 => Some("text/plain"),
        _ => Some("text/html"),
    };
    let kind = match page::kind_of(content_type) {
        Ok(Some(kind)) => kind,
        Ok(None) => page::sniff(body).unwrap_or(Kind::Text),
        Err(_) => Kind::Text,
    };
    let (text, _charset) = page::decode(body, content_type, kind);
    let readable = match kind {
        Kind::Html => page::html_to_markdown(&text, "https://example.org/a/b"),
        Kind::Text => page::Readable {
            title: None,
            text: text.clone(),
        },
    };
    let mut read = String::new();
    let mut start = 0;
    loop {
        let (part, next) = page::page(&readable.text, start, 97);
        read.push_str(&part);
        match next {
            Some(n) => start = n,
            None => break,
        }
    }
    assert_eq!(read, readable.text);
    let _ = parse_duckduckgo(&text);
});
