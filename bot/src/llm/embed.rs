//! Embeddings: texts turned into vectors by a provider's OpenAI-compatible `/embeddings`
//! endpoint (OpenAI, Ollama, llama.cpp, vLLM and most gateways speak it). The memory
//! toolset uses them, when configured, to find entries that share a meaning but no words
//! with a question.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::header::HeaderMap;
use secrecy::SecretString;
use serde::Deserialize;
use serde_json::json;

use super::LlmError;
use super::http::Transport;

/// Most texts sent in one request (providers cap a batch; OpenAI at 2,048).
pub const MAX_BATCH: usize = 64;

/// Something that turns texts into vectors: [`OpenAiEmbedder`], or a test's own.
#[async_trait]
pub trait Embedder: Send + Sync + fmt::Debug {
    /// The model's name, stored with each vector: a vector of another model is not compared.
    fn model(&self) -> &str;

    /// One vector per text of `texts`, in order.
    ///
    /// # Errors
    /// [`LlmError`] when the server cannot be reached, answers an error, or sends something
    /// that is not one vector per text.
    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, LlmError>;
}

/// Where and how [`OpenAiEmbedder`] asks.
#[derive(Clone)]
pub struct EmbedderConfig {
    /// API root including the version, e.g. `https://api.openai.com/v1`.
    pub base_url: String,
    /// Sent as `Authorization: Bearer ...` when set. Never logged.
    pub api_key: Option<SecretString>,
    /// The embedding model, e.g. `text-embedding-3-small` or `nomic-embed-text`.
    pub model: String,
    /// Limit for one whole request.
    pub timeout: Duration,
}

impl fmt::Debug for EmbedderConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EmbedderConfig")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "[redacted]"))
            .field("model", &self.model)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// The `/embeddings` client.
pub struct OpenAiEmbedder {
    http: reqwest::Client,
    url: String,
    model: String,
    transport: Arc<Transport>,
}

impl fmt::Debug for OpenAiEmbedder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiEmbedder")
            .field("url", &self.url)
            .field("model", &self.model)
            .finish_non_exhaustive()
    }
}

impl OpenAiEmbedder {
    /// Builds the HTTP client for `config`.
    ///
    /// # Errors
    /// [`LlmError::Connect`] when the key cannot be sent as a header or the TLS backend
    /// cannot be set up.
    pub fn new(config: EmbedderConfig) -> Result<Self, LlmError> {
        let mut headers = HeaderMap::new();
        super::http::bearer(&mut headers, config.api_key.as_ref())?;
        let connect = config.timeout.min(Duration::from_secs(10));
        let http = crate::net::pooled(reqwest::Client::builder())
            .connect_timeout(connect)
            .timeout(config.timeout)
            .default_headers(headers)
            .user_agent(concat!("parlor/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| LlmError::Connect(format!("cannot build the HTTP client: {e}")))?;
        Ok(OpenAiEmbedder {
            http,
            url: format!("{}/embeddings", config.base_url.trim_end_matches('/')),
            model: config.model,
            transport: Arc::new(Transport {
                connect_timeout: connect,
                request_timeout: config.timeout,
                idle_timeout: config.timeout,
                secrets: config.api_key.into_iter().collect(),
            }),
        })
    }
}

/// The part of the answer read.
#[derive(Deserialize)]
struct Answer {
    data: Vec<Datum>,
}

#[derive(Deserialize)]
struct Datum {
    #[serde(default)]
    index: Option<usize>,
    embedding: Vec<f32>,
}

#[async_trait]
impl Embedder for OpenAiEmbedder {
    fn model(&self) -> &str {
        &self.model
    }

    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, LlmError> {
        let mut out = Vec::with_capacity(texts.len());
        for batch in texts.chunks(MAX_BATCH) {
            let response = self
                .http
                .post(&self.url)
                .json(&json!({"model": self.model, "input": batch}))
                .send()
                .await
                .map_err(|e| self.transport.error(e))?;
            if !response.status().is_success() {
                return Err(self.transport.status_error(response).await);
            }
            let answer: Answer = response
                .json()
                .await
                .map_err(|e| LlmError::Malformed(format!("an embeddings answer: {e}")))?;
            out.extend(in_order(answer, batch.len())?);
        }
        Ok(out)
    }
}

/// The vectors of `answer` by their `index` (servers may answer out of order), checked to be
/// one per text, of one length.
fn in_order(answer: Answer, expected: usize) -> Result<Vec<Vec<f32>>, LlmError> {
    if answer.data.len() != expected {
        return Err(LlmError::Malformed(format!(
            "{} embeddings for {expected} texts",
            answer.data.len()
        )));
    }
    let mut slots: Vec<Option<Vec<f32>>> = vec![None; expected];
    for (position, datum) in answer.data.into_iter().enumerate() {
        let index = datum.index.unwrap_or(position);
        match slots.get_mut(index) {
            Some(slot @ None) => *slot = Some(datum.embedding),
            _ => {
                return Err(LlmError::Malformed(format!(
                    "embedding index {index} is out of range or repeated"
                )));
            }
        }
    }
    let vectors: Vec<Vec<f32>> = slots.into_iter().flatten().collect();
    let width = vectors.first().map_or(0, Vec::len);
    if vectors.iter().any(|v| v.len() != width || v.is_empty()) {
        return Err(LlmError::Malformed(
            "the embeddings are empty or of different lengths".into(),
        ));
    }
    if vectors.iter().flatten().any(|x| !x.is_finite()) {
        return Err(LlmError::Malformed(
            "an embedding holds a value that is not a number".into(),
        ));
    }
    Ok(vectors)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(data: serde_json::Value) -> Answer {
        serde_json::from_value(json!({ "data": data })).unwrap()
    }

    #[test]
    fn vectors_come_back_in_the_order_of_their_index() {
        let a = answer(json!([
            {"index": 1, "embedding": [0.0, 1.0]},
            {"index": 0, "embedding": [1.0, 0.0]},
        ]));
        assert_eq!(
            in_order(a, 2).unwrap(),
            vec![vec![1.0, 0.0], vec![0.0, 1.0]]
        );
    }

    #[test]
    fn a_short_repeated_or_ragged_answer_is_malformed() {
        let short = answer(json!([{"index": 0, "embedding": [1.0]}]));
        assert!(matches!(in_order(short, 2), Err(LlmError::Malformed(_))));
        let repeated = answer(json!([
            {"index": 0, "embedding": [1.0]},
            {"index": 0, "embedding": [1.0]},
        ]));
        assert!(matches!(in_order(repeated, 2), Err(LlmError::Malformed(_))));
        let ragged = answer(json!([
            {"index": 0, "embedding": [1.0]},
            {"index": 1, "embedding": [1.0, 2.0]},
        ]));
        assert!(matches!(in_order(ragged, 2), Err(LlmError::Malformed(_))));
    }
}
