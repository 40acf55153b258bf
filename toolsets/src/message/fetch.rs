//! Fetching an image by URL for `load_image`, through the shared guard ([`crate::net`]: http
//! and https only, no credentials, every address vetted and pinned, redirects vetted hop by
//! hop, no proxy, one timeout), plus what is particular to images:
//!
//! - A response that declares a non-image `Content-Type` is refused before its body is read
//!   (`application/octet-stream` and a missing type are let through to the byte check).
//! - The body is read in chunks and abandoned as soon as it passes the size cap, whatever
//!   `Content-Length` said.

use std::sync::Arc;
use std::time::Duration;

use crate::net::{Guard, GuardedClient, Lookup, NetError, SystemLookup};

/// Why a URL could not be fetched; each maps to one tool error code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    /// The guard or the network said no.
    #[error(transparent)]
    Net(#[from] NetError),
    /// Larger than the cap.
    #[error("{0}")]
    TooLarge(String),
    /// The server says it is not an image.
    #[error("{0}")]
    NotAnImage(String),
    /// An error status.
    #[error("{0}")]
    Status(String),
}

/// A fetched body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    /// The bytes, at most the cap.
    pub bytes: Vec<u8>,
    /// The declared `Content-Type` (without parameters, lower case), if any.
    pub content_type: Option<String>,
}

/// An HTTP client for image URLs with the limits above.
#[derive(Debug, Clone)]
pub struct Fetcher {
    client: GuardedClient,
    /// Bodies larger than this are abandoned.
    max_bytes: u64,
}

impl Fetcher {
    /// A client with a total `timeout`, a body cap of `max_bytes`, and `guard`, resolving
    /// with the system resolver.
    pub fn new(timeout: Duration, max_bytes: u64, guard: Guard) -> Result<Self, reqwest::Error> {
        Self::with_lookup(timeout, max_bytes, guard, Arc::new(SystemLookup))
    }

    /// The same, resolving names with `lookup`.
    pub fn with_lookup(
        timeout: Duration,
        max_bytes: u64,
        guard: Guard,
        lookup: Arc<dyn Lookup>,
    ) -> Result<Self, reqwest::Error> {
        let agent = concat!("parlor/", env!("CARGO_PKG_VERSION"), " (load_image)");
        Ok(Fetcher {
            client: GuardedClient::new(guard, lookup, timeout, agent)?,
            max_bytes,
        })
    }

    /// Fetches `raw` within the limits (see the module docs).
    pub async fn fetch(&self, raw: &str) -> Result<Fetched, FetchError> {
        let max = self.max_bytes;
        let too_large =
            || FetchError::TooLarge(format!("the image is larger than the limit of {max} bytes"));
        let fetched = self
            .client
            .fetch(
                raw,
                "image/png, image/jpeg, image/gif, image/webp",
                max,
                |status, content_type, length| {
                    if !status.is_success() {
                        return Err(FetchError::Status(format!("the server answered {status}")));
                    }
                    let ct = essence(content_type);
                    if let Some(ct) = &ct
                        && !ct.is_empty()
                        && !ct.starts_with("image/")
                        && ct != "application/octet-stream"
                        && ct != "binary/octet-stream"
                    {
                        return Err(FetchError::NotAnImage(format!(
                            "the URL serves {ct}, not an image"
                        )));
                    }
                    if length.is_some_and(|n| n > max) {
                        return Err(too_large());
                    }
                    Ok(())
                },
            )
            .await?;
        if fetched.truncated {
            return Err(too_large());
        }
        Ok(Fetched {
            bytes: fetched.bytes,
            content_type: essence(fetched.content_type.as_deref()),
        })
    }
}

/// A media type without its parameters, lower case.
fn essence(content_type: Option<&str>) -> Option<String> {
    content_type.map(|v| {
        v.split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase()
    })
}
