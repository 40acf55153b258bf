//! A fetched body made readable: the media type decides (HTML, other text, JSON, or
//! unsupported), the charset comes from the header, a byte-order mark or the page's own
//! `<meta>` (decoded with `encoding_rs`), and HTML becomes Markdown of its main content
//! (`dom_smoothie`, a port of Mozilla's Readability, whose Markdown keeps links as
//! `[text](url)` with relative ones made absolute).

use dom_query::Document;
use dom_smoothie::{Config as ReadabilityConfig, Readability, TextMode};
use encoding_rs::{Encoding, UTF_8, WINDOWS_1252};
use parlor_bot::text::split_chars;

/// What kind of body it is, from its `Content-Type` (and a look at the bytes when none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `text/html`, `application/xhtml+xml`.
    Html,
    /// Other `text/*`, JSON, XML: shown as they are.
    Text,
}

/// Why a body is not shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsupported {
    /// The media type, as the server named it (or `unknown binary data`).
    pub media_type: String,
    /// Whether it is an image (`load_image` reads those).
    pub image: bool,
}

/// The media type of a `Content-Type` header, lower case, without parameters.
pub fn essence(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
}

/// The kind of a body with `content_type` (`None`: the server sent none), before its bytes
/// are read.
pub fn kind_of(content_type: Option<&str>) -> Result<Option<Kind>, Unsupported> {
    let Some(ct) = content_type.map(essence).filter(|c| !c.is_empty()) else {
        return Ok(None);
    };
    let kind = match ct.as_str() {
        "text/html" | "application/xhtml+xml" => Kind::Html,
        t if t.starts_with("text/") => Kind::Text,
        "application/json"
        | "application/ld+json"
        | "application/xml"
        | "application/rss+xml"
        | "application/atom+xml"
        | "application/javascript" => Kind::Text,
        t if t.ends_with("+json") || t.ends_with("+xml") => Kind::Text,
        _ => {
            return Err(Unsupported {
                image: ct.starts_with("image/"),
                media_type: ct,
            });
        }
    };
    Ok(Some(kind))
}

/// A body without a declared type: HTML if it looks like markup, text if it has no NUL
/// bytes, otherwise unsupported.
pub fn sniff(bytes: &[u8]) -> Result<Kind, Unsupported> {
    let head = &bytes[..bytes.len().min(1024)];
    if head.contains(&0) {
        return Err(Unsupported {
            media_type: "unknown binary data".to_owned(),
            image: false,
        });
    }
    let start = String::from_utf8_lossy(head)
        .trim_start()
        .to_ascii_lowercase();
    if start.starts_with("<!doctype html") || start.starts_with("<html") {
        Ok(Kind::Html)
    } else {
        Ok(Kind::Text)
    }
}

/// The bytes as text: a byte-order mark first, then the header's `charset`, then (for
/// HTML) the page's `<meta charset>` or `<meta http-equiv="Content-Type">`, then UTF-8.
/// Malformed sequences (a body cut at the cap mid-character, say) become U+FFFD.
pub fn decode(bytes: &[u8], content_type: Option<&str>, kind: Kind) -> (String, &'static str) {
    let declared = content_type
        .and_then(charset_param)
        .and_then(|label| Encoding::for_label(label.as_bytes()));
    let encoding = Encoding::for_bom(bytes)
        .map(|(e, _)| e)
        .or(declared)
        .or_else(|| (kind == Kind::Html).then(|| meta_charset(bytes)).flatten())
        .unwrap_or(UTF_8);
    let (text, used, _) = encoding.decode(bytes);
    (text.into_owned(), used.name())
}

/// The `charset=` parameter of a `Content-Type` value.
fn charset_param(content_type: &str) -> Option<String> {
    content_type.split(';').skip(1).find_map(|param| {
        let (name, value) = param.split_once('=')?;
        name.trim()
            .eq_ignore_ascii_case("charset")
            .then(|| value.trim().trim_matches(['"', '\'']).to_owned())
    })
}

/// The encoding a page declares in its `<meta>` tags. The head is read as windows-1252,
/// which maps every byte and keeps ASCII, so the tags of any ASCII-compatible encoding
/// parse; the HTML parser finds them.
fn meta_charset(bytes: &[u8]) -> Option<&'static Encoding> {
    let head = &bytes[..bytes.len().min(4096)];
    let (text, _, _) = WINDOWS_1252.decode(head);
    let doc = Document::from(text.as_ref());
    // A page saying "utf-16" in an ASCII-readable <meta> is not UTF-16: output_encoding
    // maps that to UTF-8, as browsers do.
    if let Some(label) = doc.select("meta[charset]").attr("charset")
        && let Some(e) = Encoding::for_label(label.trim().as_bytes())
    {
        return Some(e.output_encoding());
    }
    doc.select("meta[http-equiv]")
        .iter()
        .filter(|m| {
            m.attr("http-equiv")
                .is_some_and(|v| v.trim().eq_ignore_ascii_case("content-type"))
        })
        .find_map(|m| m.attr("content").and_then(|c| charset_param(&c)))
        .and_then(|label| Encoding::for_label(label.as_bytes()))
        .map(Encoding::output_encoding)
}

/// A page as the model reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Readable {
    /// The title, if the page has one.
    pub title: Option<String>,
    /// Markdown (HTML) or the text itself.
    pub text: String,
}

/// HTML as Markdown of its main content, links absolute against `url`. Pages Readability
/// finds no article in (a list of links, a tiny page) are converted whole, without their
/// scripts, styles and navigation.
pub fn html_to_markdown(html: &str, url: &str) -> Readable {
    let config = ReadabilityConfig {
        text_mode: TextMode::Markdown,
        ..ReadabilityConfig::default()
    };
    let article = Readability::new(html, Some(url), Some(config)).and_then(|mut r| r.parse());
    match article {
        Ok(article) if !article.text_content.trim().is_empty() => Readable {
            title: Some(article.title.trim().to_owned()).filter(|t| !t.is_empty()),
            text: article.text_content.trim().to_owned(),
        },
        _ => {
            let doc = Document::from(html);
            let title = doc.select("title").text().trim().to_owned();
            let body = doc.select("body");
            let text = match body.nodes().first() {
                Some(node) => node.md(Some(&[
                    "script", "style", "noscript", "nav", "header", "footer", "head", "template",
                ])),
                None => doc.md(None),
            };
            Readable {
                title: Some(title).filter(|t| !t.is_empty()),
                text: text.trim().to_owned(),
            }
        }
    }
}

/// One page of `text`: characters `start..start + max` (cut on character boundaries), and
/// where the next page starts (`None` at the end).
pub fn page(text: &str, start: usize, max: usize) -> (String, Option<usize>) {
    let (_, rest) = split_chars(text, start);
    let (slice, after) = split_chars(rest, max);
    let next = (!after.is_empty()).then(|| start + slice.chars().count());
    (slice.to_owned(), next)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charset_from_header_bom_and_meta() {
        assert_eq!(
            charset_param("text/html; charset=\"ISO-8859-1\"").as_deref(),
            Some("ISO-8859-1")
        );
        let latin1 = b"<html><head><meta charset=\"iso-8859-1\"></head><body>caf\xe9</body></html>";
        let (text, used) = decode(latin1, Some("text/html"), Kind::Html);
        assert!(text.contains("café"), "{text}");
        assert_eq!(used, "windows-1252");
        let equiv =
            b"<meta http-equiv=\"Content-Type\" content=\"text/html; charset=koi8-r\">\xf0\xd2\xc9";
        assert_eq!(decode(equiv, None, Kind::Html).1, "KOI8-R");
        let (text, used) = decode(
            b"\xef\xbb\xbfhi",
            Some("text/plain; charset=latin1"),
            Kind::Text,
        );
        assert_eq!((text.as_str(), used), ("hi", "UTF-8"));
    }

    #[test]
    fn kinds() {
        assert_eq!(
            kind_of(Some("text/html; charset=utf-8")),
            Ok(Some(Kind::Html))
        );
        assert_eq!(kind_of(Some("application/json")), Ok(Some(Kind::Text)));
        assert_eq!(kind_of(None), Ok(None));
        assert!(kind_of(Some("image/png")).is_err_and(|u| u.image));
        assert!(
            kind_of(Some("application/pdf"))
                .is_err_and(|u| !u.image && u.media_type == "application/pdf")
        );
        assert!(sniff(b"\x89PNG\r\n\x1a\n\0\0").is_err());
        assert_eq!(sniff(b"  <!DOCTYPE html><p>x"), Ok(Kind::Html));
    }

    #[test]
    fn paging_is_by_characters() {
        assert_eq!(page("héllo wörld", 0, 5), ("héllo".to_owned(), Some(5)));
        assert_eq!(page("héllo wörld", 5, 10), (" wörld".to_owned(), None));
        assert_eq!(page("abc", 3, 10), (String::new(), None));
        assert_eq!(page("abc", 9, 10), (String::new(), None));
    }
}
