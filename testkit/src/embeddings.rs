//! An in-process fake of an OpenAI-compatible embeddings API whose vectors are a *bag of
//! synonyms*: texts that say the same thing in other words point the same way.
//!
//! [`FakeEmbeddings::start`] binds `127.0.0.1:0` and serves `POST /v1/embeddings` (and
//! `POST /embeddings`, so a client's base URL may or may not end in `/v1`). A request is
//! `{"model": "...", "input": "text" | ["a", "b"], "encoding_format"?: "float" | "base64"}`;
//! the answer is OpenAI's
//! `{"object":"list","data":[{"object":"embedding","index":i,"embedding":[...]}],"model":"...","usage":{...}}`,
//! one item per input in input order. A missing or empty input is a `400`, and
//! [`FakeEmbeddings::fail_next`] scripts `500`s, both with an OpenAI-style error body.
//!
//! How a text becomes a vector ([`FakeEmbeddings::embed`]): one dimension per synonym group
//! given to `start`, then [`BUCKETS`] hashed dimensions for every other word.
//! - The text is lower-cased and split into Latin words at anything that is not a letter or
//!   digit, CJK characters included (they are read separately, below).
//! - Stop words ([`STOP_WORDS`]) are skipped.
//! - A word counts once for every group that has it as a member, as it is or with one of
//!   the suffixes `s`, `es`, `ed`, `ing`, `ly` taken off (`cars` → `car`, `booked` →
//!   `book`).
//! - A word of no group counts for the bucket its FNV-1a hash picks (stable across runs
//!   and processes, unlike `RandomState`).
//! - A group member holding a CJK character (U+4E00..U+9FFF) counts for its group once for
//!   every time it occurs in the text, spaces or not (`小明哪天过生日` holds `生日`). Other
//!   CJK text counts for nothing.
//! - The vector is L2-normalized; a text with nothing counted stays all zeros.
//!
//! So `cosine("car", "automobile")` is 1 when both are in one group, while two texts that
//! share only words of no group still look alike through the buckets, as a real model's
//! vectors would for shared words.
//!
//! ```
//! use parlor_testkit::FakeEmbeddings;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let fake = FakeEmbeddings::start(vec![vec!["car".into(), "automobile".into()]]).await;
//! assert_eq!(fake.embed("a red car"), fake.embed("red automobiles"));
//! // Point the client under test at `fake.base_url()`, then:
//! assert_eq!(fake.requests(), 0);
//! fake.shutdown().await;
//! # }
//! ```

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use base64::Engine as _;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::server::{self, Server};

/// Hashed dimensions for the words of no synonym group.
pub const BUCKETS: usize = 64;

/// Words that say nothing about what a text is about, skipped.
pub const STOP_WORDS: &[&str] = &[
    "the", "a", "an", "is", "are", "of", "to", "in", "on", "at", "for", "and", "or", "what", "who",
    "when", "where", "which", "does", "do", "did", "my", "our", "your", "his", "her", "their",
    "about", "with", "how",
];

/// Suffixes taken off a word to find it in a group, the word's simple inflections.
const SUFFIXES: &[&str] = &["s", "es", "ed", "ing", "ly"];

/// Model name echoed when a request has no `model` string.
const DEFAULT_MODEL: &str = "fake-embeddings";

/// The synonym groups, prepared for lookups.
struct Vocab {
    /// Latin member → the groups holding it.
    words: std::collections::HashMap<String, Vec<usize>>,
    /// CJK members with their group, found by substring.
    cjk: Vec<(String, usize)>,
    groups: usize,
}

fn is_cjk(c: char) -> bool {
    ('\u{4e00}'..='\u{9fff}').contains(&c)
}

/// 64-bit FNV-1a: a fixed hash, so a word lands in the same bucket in every run.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl Vocab {
    fn new(synonyms: Vec<Vec<String>>) -> Self {
        let mut words: std::collections::HashMap<String, Vec<usize>> = Default::default();
        let mut cjk = Vec::new();
        let groups = synonyms.len();
        for (group, members) in synonyms.into_iter().enumerate() {
            for member in members {
                let member = member.trim().to_lowercase();
                if member.is_empty() {
                    continue;
                }
                if member.chars().any(is_cjk) {
                    cjk.push((member, group));
                } else {
                    let groups = words.entry(member).or_default();
                    if !groups.contains(&group) {
                        groups.push(group);
                    }
                }
            }
        }
        Vocab { words, cjk, groups }
    }

    fn dimensions(&self) -> usize {
        self.groups + BUCKETS
    }

    /// The groups `word` belongs to, as it is or without one simple suffix.
    fn groups_of(&self, word: &str) -> Vec<usize> {
        let mut found: Vec<usize> = Vec::new();
        let stripped = SUFFIXES
            .iter()
            .filter_map(|suffix| word.strip_suffix(suffix).filter(|base| !base.is_empty()));
        for form in std::iter::once(word).chain(stripped) {
            for &group in self.words.get(form).into_iter().flatten() {
                if !found.contains(&group) {
                    found.push(group);
                }
            }
        }
        found
    }

    fn embed(&self, text: &str) -> Vec<f32> {
        let mut vector = vec![0.0f32; self.dimensions()];
        let lower = text.to_lowercase();
        let latin = lower
            .split(|c: char| !c.is_alphanumeric() || is_cjk(c))
            .filter(|w| !w.is_empty() && !STOP_WORDS.contains(w));
        for word in latin {
            let groups = self.groups_of(word);
            if groups.is_empty() {
                // The remainder is below BUCKETS, so it fits any usize.
                let bucket = (fnv1a(word) % BUCKETS as u64) as usize;
                vector[self.groups + bucket] += 1.0;
            }
            for group in groups {
                vector[group] += 1.0;
            }
        }
        for (member, group) in &self.cjk {
            vector[*group] += lower.matches(member.as_str()).count() as f32;
        }
        let norm = vector.iter().map(|x| x * x).sum::<f32>().sqrt();
        if norm > 0.0 {
            for x in &mut vector {
                *x /= norm;
            }
        }
        vector
    }
}

/// The cosine similarity of two vectors; 0 when either is all zeros or their lengths
/// differ.
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() {
        return 0.0;
    }
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na = a.iter().map(|x| x * x).sum::<f32>().sqrt();
    let nb = b.iter().map(|x| x * x).sum::<f32>().sqrt();
    if na == 0.0 || nb == 0.0 {
        0.0
    } else {
        dot / (na * nb)
    }
}

struct Shared {
    vocab: Vocab,
    /// POSTs to an embeddings path, failed ones included.
    requests: AtomicUsize,
    /// Texts embedded by answered requests.
    inputs: AtomicUsize,
    /// Requests still to answer with a scripted 500.
    fail_next: AtomicUsize,
}

/// A running fake OpenAI-compatible embeddings server; see the module docs.
///
/// The server runs on a tokio task owned by this value; it stops on
/// [`FakeEmbeddings::shutdown`] or when the value is dropped. All methods except `start`
/// and `shutdown` are synchronous and never block on the network.
pub struct FakeEmbeddings {
    shared: Arc<Shared>,
    addr: SocketAddr,
    server: Server,
}

impl fmt::Debug for FakeEmbeddings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeEmbeddings")
            .field("addr", &self.addr)
            .field("dimensions", &self.dimensions())
            .field("requests", &self.requests())
            .finish_non_exhaustive()
    }
}

impl FakeEmbeddings {
    /// Starts the server on `127.0.0.1:0` with these synonym groups (each a list of words
    /// or CJK terms meaning the same; case does not matter).
    ///
    /// # Panics
    /// If no local port can be bound.
    pub async fn start(synonyms: Vec<Vec<String>>) -> Self {
        let (listener, addr) = server::loopback("embeddings").await;
        let shared = Arc::new(Shared {
            vocab: Vocab::new(synonyms),
            requests: AtomicUsize::new(0),
            inputs: AtomicUsize::new(0),
            fail_next: AtomicUsize::new(0),
        });
        let app = Router::new()
            .route("/v1/embeddings", post(embeddings))
            .route("/embeddings", post(embeddings))
            .fallback(unknown_path)
            .layer(DefaultBodyLimit::disable())
            .with_state(Arc::clone(&shared));
        let mut server = Server::new(CancellationToken::new());
        server.serve(listener, app);
        FakeEmbeddings {
            shared,
            addr,
            server,
        }
    }

    /// The base URL to configure a client with: `http://127.0.0.1:PORT/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The bound socket address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// How long every vector is: one dimension per synonym group plus [`BUCKETS`].
    pub fn dimensions(&self) -> usize {
        self.shared.vocab.dimensions()
    }

    /// The vector the server answers for `text`, without a request (not counted).
    pub fn embed(&self, text: &str) -> Vec<f32> {
        self.shared.vocab.embed(text)
    }

    /// How many POSTs to `/v1/embeddings` or `/embeddings` were received, failed ones
    /// included.
    pub fn requests(&self) -> usize {
        self.shared.requests.load(Ordering::SeqCst)
    }

    /// How many texts were embedded, over every answered request.
    pub fn inputs(&self) -> usize {
        self.shared.inputs.load(Ordering::SeqCst)
    }

    /// Answers the next `n` requests with a `500` and an OpenAI-style error body (adds to
    /// failures still scripted).
    pub fn fail_next(&self, n: usize) {
        self.shared.fail_next.fetch_add(n, Ordering::SeqCst);
    }

    /// Stops the server: closes connections and waits (bounded) for its task to finish.
    pub async fn shutdown(mut self) {
        self.server.shutdown().await;
    }
}

/// An OpenAI-style error answer.
fn error_json(status: StatusCode, kind: &str, message: &str) -> Response {
    (
        status,
        axum::Json(json!({
            "error": {"message": message, "type": kind, "param": null, "code": null}
        })),
    )
        .into_response()
}

fn invalid(message: &str) -> Response {
    error_json(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        &format!("fake embeddings: {message}"),
    )
}

async fn unknown_path(uri: Uri) -> Response {
    error_json(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        &format!(
            "fake embeddings: unknown path {}; serving POST /v1/embeddings and /embeddings",
            uri.path()
        ),
    )
}

/// The texts of a request's `input`, or why it is refused.
fn texts(body: &Value) -> Result<Vec<&str>, &'static str> {
    let texts = match body.get("input") {
        None | Some(Value::Null) => return Err("`input` is missing"),
        Some(Value::String(text)) => vec![text.as_str()],
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| item.as_str().ok_or("`input` items must be strings"))
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => return Err("`input` must be a string or an array of strings"),
    };
    if texts.is_empty() || texts.iter().any(|t| t.is_empty()) {
        return Err("`input` is empty");
    }
    Ok(texts)
}

/// A rough token count for `usage`: Latin words and CJK characters.
fn tokens(text: &str) -> usize {
    let words = text
        .split(|c: char| !c.is_alphanumeric() || is_cjk(c))
        .filter(|w| !w.is_empty())
        .count();
    words + text.chars().filter(|&c| is_cjk(c)).count()
}

async fn embeddings(State(shared): State<Arc<Shared>>, raw: Bytes) -> Response {
    shared.requests.fetch_add(1, Ordering::SeqCst);
    let failing = shared
        .fail_next
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok();
    if failing {
        return error_json(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "fake embeddings: scripted failure",
        );
    }
    let body = match serde_json::from_slice::<Value>(&raw) {
        Ok(body) => body,
        Err(e) => return invalid(&format!("request body is not JSON: {e}")),
    };
    let texts = match texts(&body) {
        Ok(texts) => texts,
        Err(why) => return invalid(why),
    };
    let base64 = match body.get("encoding_format").and_then(Value::as_str) {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return invalid(&format!(
                "unknown encoding_format {other:?}; use \"float\" or \"base64\""
            ));
        }
    };
    let model = body
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or(DEFAULT_MODEL);
    let data: Vec<Value> = texts
        .iter()
        .enumerate()
        .map(|(index, text)| {
            let vector = shared.vocab.embed(text);
            let embedding = if base64 {
                // OpenAI's base64: the f32s' little-endian bytes.
                let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(vector)
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    shared.inputs.fetch_add(texts.len(), Ordering::SeqCst);
    let used: usize = texts.iter().map(|t| tokens(t)).sum();
    axum::Json(json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": used, "total_tokens": used},
    }))
    .into_response()
}
