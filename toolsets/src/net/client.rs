//! The guarded HTTP client: a pinned resolver, redirects followed by hand, one timeout for
//! the whole exchange, bodies read up to a cap.

use std::error::Error as StdError;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::{StatusCode, Url, header, redirect};

use super::{Guard, NetError};

/// Most redirects followed.
pub const MAX_REDIRECTS: usize = 5;

/// Turns a host name into addresses. The guard vets whatever this answers and the client
/// connects only to those answers; tests put a scripted one in its place to answer names
/// with refused addresses without sending a packet.
#[async_trait]
pub trait Lookup: Send + Sync + fmt::Debug {
    /// The addresses of `host` (a name, never an IP literal).
    async fn lookup(&self, host: &str) -> std::io::Result<Vec<IpAddr>>;
}

/// The system resolver (`getaddrinfo`, through tokio).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemLookup;

#[async_trait]
impl Lookup for SystemLookup {
    async fn lookup(&self, host: &str) -> std::io::Result<Vec<IpAddr>> {
        Ok(tokio::net::lookup_host((host, 0))
            .await?
            .map(|a| a.ip())
            .collect())
    }
}

/// reqwest's resolver hook: one lookup per connection, every answer vetted, only vetted
/// addresses handed to the connector. A name with any refused answer is refused whole: a
/// public name whose records also point inside the network is what a rebinding attack
/// looks like.
struct PinnedResolver {
    guard: Arc<Guard>,
    lookup: Arc<dyn Lookup>,
}

impl Resolve for PinnedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_owned();
        let guard = Arc::clone(&self.guard);
        let lookup = Arc::clone(&self.lookup);
        Box::pin(async move {
            let addresses = vetted(&guard, lookup.as_ref(), &host)
                .await
                .map_err(|e| Box::new(e) as Box<dyn StdError + Send + Sync>)?;
            Ok(Box::new(addresses.into_iter().map(|ip| SocketAddr::new(ip, 0))) as Addrs)
        })
    }
}

/// The addresses of `host`, looked up once, every one vetted.
async fn vetted(guard: &Guard, lookup: &dyn Lookup, host: &str) -> Result<Vec<IpAddr>, NetError> {
    guard.check_host(host)?;
    let addresses = lookup.lookup(host).await.map_err(|e| {
        NetError::Unavailable(format!("the name {host} could not be resolved: {e}"))
    })?;
    if addresses.is_empty() {
        return Err(NetError::Unavailable(format!(
            "the name {host} has no address"
        )));
    }
    for ip in &addresses {
        guard.vet(host, *ip)?;
    }
    Ok(addresses)
}

/// A fetched response: where it came from in the end, what it says it is, its body up to
/// the cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    /// The URL of the last hop (after redirects).
    pub final_url: Url,
    /// The status of the last hop.
    pub status: StatusCode,
    /// The whole `Content-Type` header, if any (parameters included).
    pub content_type: Option<String>,
    /// The body, at most the cap.
    pub bytes: Vec<u8>,
    /// Whether the body went on past the cap (the rest was not read).
    pub truncated: bool,
}

/// The HTTP client every URL tool uses; see the module docs of [`crate::net`].
#[derive(Clone)]
pub struct GuardedClient {
    client: reqwest::Client,
    guard: Arc<Guard>,
    /// The resolver the connections use (kept for [`GuardedClient::resolve`]).
    lookup: Arc<dyn Lookup>,
    /// The whole exchange: lookups, every hop, the body.
    timeout: Duration,
}

impl fmt::Debug for GuardedClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuardedClient")
            .field("guard", &self.guard)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl GuardedClient {
    /// A client enforcing `guard`, resolving with `lookup`, giving up after `timeout` for the
    /// whole exchange, sending `user_agent`.
    pub fn new(
        guard: Guard,
        lookup: Arc<dyn Lookup>,
        timeout: Duration,
        user_agent: &str,
    ) -> Result<Self, reqwest::Error> {
        let guard = Arc::new(guard);
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(10)))
            .redirect(redirect::Policy::none())
            // A proxy would resolve the name out of the guard's sight.
            .no_proxy()
            // Every request resolves afresh and connects to what was vetted; a pooled
            // connection would be safe too, but fetches go to ever other hosts anyway.
            .pool_max_idle_per_host(0)
            .dns_resolver(Arc::new(PinnedResolver {
                guard: Arc::clone(&guard),
                lookup: Arc::clone(&lookup),
            }))
            .user_agent(user_agent)
            .build()?;
        Ok(GuardedClient {
            client,
            guard,
            lookup,
            timeout,
        })
    }

    /// The policy this client enforces.
    pub fn guard(&self) -> &Guard {
        &self.guard
    }

    /// What a connection to `host` would be allowed to use: the one lookup, every answer
    /// vetted, exactly as the connections do it, without connecting.
    pub async fn resolve(&self, host: &str) -> Result<Vec<IpAddr>, NetError> {
        vetted(&self.guard, self.lookup.as_ref(), host).await
    }

    /// Parses and checks `raw` without fetching it.
    pub fn parse(&self, raw: &str) -> Result<Url, NetError> {
        let url = Url::parse(raw.trim())
            .map_err(|e| NetError::BadUrl(format!("{raw:?} is not a valid URL ({e})")))?;
        self.guard.check_url(&url)?;
        Ok(url)
    }

    /// GETs `raw` with `accept`, following redirects (each hop vetted), and reads the body
    /// up to `max_bytes`. `refuse(status, content_type)` may stop before the body is read
    /// (a non-image for `load_image`), with its own error.
    pub async fn fetch<E: From<NetError>>(
        &self,
        raw: &str,
        accept: &str,
        max_bytes: u64,
        refuse: impl Fn(StatusCode, Option<&str>, Option<u64>) -> Result<(), E>,
    ) -> Result<Fetched, E> {
        let exchange = async {
            let (final_url, mut response) = self.get(raw, accept).await?;
            let status = response.status();
            let content_type = response
                .headers()
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            refuse(status, content_type.as_deref(), response.content_length())?;
            let mut bytes = Vec::new();
            let mut truncated = false;
            while let Some(chunk) = response
                .chunk()
                .await
                .map_err(|e| E::from(self.failure(&e)))?
            {
                let room = usize::try_from(max_bytes)
                    .unwrap_or(usize::MAX)
                    .saturating_sub(bytes.len());
                if chunk.len() > room {
                    bytes.extend_from_slice(&chunk[..room]);
                    truncated = true;
                    // Dropping the response closes the connection; the rest is never read.
                    break;
                }
                bytes.extend_from_slice(&chunk);
            }
            Ok(Fetched {
                final_url,
                status,
                content_type,
                bytes,
                truncated,
            })
        };
        match tokio::time::timeout(self.timeout, exchange).await {
            Ok(result) => result,
            Err(_) => Err(E::from(self.timed_out())),
        }
    }

    /// The response of the last hop, redirects followed by hand.
    async fn get(&self, raw: &str, accept: &str) -> Result<(Url, reqwest::Response), NetError> {
        let mut url = self.parse(raw)?;
        let mut hops = 0;
        loop {
            let response = self
                .client
                .get(url.clone())
                .header(header::ACCEPT, accept)
                .send()
                .await
                .map_err(|e| self.failure(&e))?;
            let location = response
                .status()
                .is_redirection()
                .then(|| response.headers().get(header::LOCATION))
                .flatten()
                .and_then(|v| v.to_str().ok());
            let Some(location) = location else {
                return Ok((url, response));
            };
            if hops == MAX_REDIRECTS {
                return Err(NetError::TooManyRedirects(format!(
                    "the URL redirects more than {MAX_REDIRECTS} times"
                )));
            }
            let next = url.join(location).map_err(|e| {
                NetError::BadUrl(format!(
                    "a redirect to {location:?} is not a valid URL ({e})"
                ))
            })?;
            self.guard.check_url(&next)?;
            url = next;
            hops += 1;
        }
    }

    fn timed_out(&self) -> NetError {
        NetError::Timeout(format!(
            "the server did not send the whole answer within {} s",
            self.timeout.as_secs_f64()
        ))
    }

    /// A reqwest failure as the model should see it: the guard's own refusals (raised in
    /// the resolver) come back as they were raised.
    fn failure(&self, error: &reqwest::Error) -> NetError {
        let mut source: Option<&(dyn StdError + 'static)> = Some(error);
        while let Some(e) = source {
            if let Some(ours) = e.downcast_ref::<NetError>() {
                return ours.clone();
            }
            source = e.source();
        }
        if error.is_timeout() {
            return self.timed_out();
        }
        // reqwest's top line ("error sending request for url ...") says little; the innermost
        // cause ("connection refused") is what helps.
        let mut cause = error.to_string();
        let mut source = error.source();
        while let Some(e) = source {
            cause = e.to_string();
            source = e.source();
        }
        NetError::Unavailable(format!("the URL could not be fetched: {cause}"))
    }
}
