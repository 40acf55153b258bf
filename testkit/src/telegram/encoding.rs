//! Decoding a Bot API call's parameters from wherever the client put them:
//! the query string, a JSON body, a urlencoded form or `multipart/form-data`.

use axum::body::Bytes;
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, Uri};
use serde_json::{Map, Value, json};

/// An uploaded multipart file part.
pub(super) struct Upload {
    pub(super) field: String,
    pub(super) file_name: Option<String>,
    pub(super) bytes: Bytes,
}

/// Decoded request parameters.
pub(super) struct Params {
    pub(super) map: Map<String, Value>,
    pub(super) uploads: Vec<Upload>,
}

impl Params {
    pub(super) fn get(&self, key: &str) -> Option<&Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    pub(super) fn str(&self, key: &str) -> Option<String> {
        match self.get(key)? {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            Value::Bool(b) => Some(b.to_string()),
            _ => None,
        }
    }

    pub(super) fn i64(&self, key: &str) -> Option<i64> {
        as_i64(self.get(key)?)
    }

    pub(super) fn bool(&self, key: &str) -> bool {
        match self.get(key) {
            Some(Value::Bool(b)) => *b,
            Some(Value::String(s)) => s == "true" || s == "1",
            Some(Value::Number(n)) => n.as_i64() == Some(1),
            _ => false,
        }
    }

    /// An object or array parameter, which forms and queries carry as a
    /// JSON-serialized string.
    pub(super) fn json(&self, key: &str) -> Option<Value> {
        match self.get(key)? {
            Value::String(s) => serde_json::from_str(s).ok(),
            v => Some(v.clone()),
        }
    }

    pub(super) fn upload(&self, field: &str) -> Option<&Upload> {
        self.uploads.iter().find(|u| u.field == field)
    }
}

pub(super) fn as_i64(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// Why a request's parameters cannot be read; the text is the Bot API's description after
/// `Bad Request: `.
#[derive(Debug, thiserror::Error)]
pub(super) enum BadParams {
    #[error("multipart body without boundary")]
    NoBoundary,
    #[error("can't parse request JSON object")]
    NotAnObject,
}

pub(super) fn parse_params(
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Params, BadParams> {
    let mut map = Map::new();
    if let Some(query) = uri.query() {
        map.extend(parse_form(query.as_bytes()));
    }
    let mut uploads = Vec::new();
    let content_type = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    let is_blank = body.iter().all(u8::is_ascii_whitespace);
    if content_type.starts_with("multipart/form-data") {
        let raw_ct = headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let boundary = raw_ct
            .split(';')
            .filter_map(|p| p.trim().strip_prefix("boundary="))
            .next()
            .map(|b| b.trim_matches('"').to_owned())
            .ok_or(BadParams::NoBoundary)?;
        for part in parse_multipart(body, &boundary) {
            match part.file_name {
                Some(file_name) => {
                    map.insert(
                        part.name.clone(),
                        json!({"file_name": file_name, "size": part.data.len()}),
                    );
                    uploads.push(Upload {
                        field: part.name,
                        file_name: Some(file_name),
                        bytes: Bytes::from(part.data),
                    });
                }
                None => {
                    map.insert(
                        part.name,
                        Value::String(String::from_utf8_lossy(&part.data).into_owned()),
                    );
                }
            }
        }
    } else if content_type.starts_with("application/x-www-form-urlencoded") {
        map.extend(parse_form(body));
    } else if !is_blank {
        match serde_json::from_slice::<Value>(body) {
            Ok(Value::Object(obj)) => map.extend(obj),
            Ok(_) => return Err(BadParams::NotAnObject),
            Err(_) if !content_type.starts_with("application/json") => {
                map.extend(parse_form(body));
            }
            Err(_) => return Err(BadParams::NotAnObject),
        }
    }
    Ok(Params { map, uploads })
}

/// The pairs of a query string or urlencoded form (`+` is a space).
fn parse_form(raw: &[u8]) -> impl Iterator<Item = (String, Value)> + '_ {
    form_urlencoded::parse(raw).map(|(k, v)| (k.into_owned(), Value::String(v.into_owned())))
}

/// A percent-encoded URL path segment (where `+` stays a plus), as text.
pub(super) fn percent_decode(segment: &str) -> String {
    percent_encoding::percent_decode_str(segment)
        .decode_utf8_lossy()
        .into_owned()
}

struct Part {
    name: String,
    file_name: Option<String>,
    data: Vec<u8>,
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    if needle.is_empty() || from > hay.len() {
        return None;
    }
    hay[from..]
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

/// A minimal `multipart/form-data` parser: enough for the text fields and
/// file parts that Bot API clients send.
fn parse_multipart(body: &[u8], boundary: &str) -> Vec<Part> {
    let delim = format!("--{boundary}");
    let delim = delim.as_bytes();
    let mut parts = Vec::new();
    let Some(mut pos) = find(body, delim, 0) else {
        return parts;
    };
    loop {
        let start = pos + delim.len();
        if body[start..].starts_with(b"--") {
            break;
        }
        let Some(next) = find(body, delim, start) else {
            break;
        };
        let chunk = &body[start..next];
        let chunk = chunk.strip_prefix(b"\r\n").unwrap_or(chunk);
        let chunk = chunk.strip_suffix(b"\r\n").unwrap_or(chunk);
        if let Some(split) = find(chunk, b"\r\n\r\n", 0) {
            let head = String::from_utf8_lossy(&chunk[..split]);
            let data = chunk[split + 4..].to_vec();
            let mut name = None;
            let mut file_name = None;
            for line in head.lines() {
                if !line.to_ascii_lowercase().starts_with("content-disposition") {
                    continue;
                }
                for attr in line.split(';').map(str::trim) {
                    if let Some(v) = attr.strip_prefix("name=") {
                        name = Some(v.trim_matches('"').to_owned());
                    } else if let Some(v) = attr.strip_prefix("filename=") {
                        file_name = Some(v.trim_matches('"').to_owned());
                    }
                }
            }
            if let Some(name) = name {
                parts.push(Part {
                    name,
                    file_name,
                    data,
                });
            }
        }
        pos = next;
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_and_paths_decode_like_telegram_clients_encode() {
        let form: Vec<(String, Value)> =
            parse_form(b"a=1&&b=two+words%21&c&d=%zz&e=%E2%9C%93").collect();
        let text = |s: &str| Value::String(s.to_owned());
        assert_eq!(
            form,
            vec![
                ("a".to_owned(), text("1")),
                ("b".to_owned(), text("two words!")),
                ("c".to_owned(), text("")),
                ("d".to_owned(), text("%zz")),
                ("e".to_owned(), text("\u{2713}")),
            ]
        );
        // A path keeps its `+`: only forms and queries encode spaces so.
        assert_eq!(percent_decode("documents%2Ffile_1+x"), "documents/file_1+x");
    }

    #[test]
    fn multipart_parts() {
        let body = b"--XY\r\nContent-Disposition: form-data; name=\"chat_id\"\r\n\r\n-100\r\n--XY\r\nContent-Disposition: form-data; name=\"photo\"; filename=\"a.png\"\r\nContent-Type: image/png\r\n\r\n\x00\x01\r\n--XY--\r\n";
        let parts = parse_multipart(body, "XY");
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].name, "chat_id");
        assert_eq!(parts[0].data, b"-100");
        assert_eq!(parts[1].file_name.as_deref(), Some("a.png"));
        assert_eq!(parts[1].data, b"\x00\x01");
    }
}
