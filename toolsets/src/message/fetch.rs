//! Fetching an image by URL for `load_image`: the URL comes from the model (and so, perhaps,
//! from anyone in the chat), so the fetch is fenced in.
//!
//! - Only `http` and `https`, without credentials in the URL; redirects at most
//!   [`MAX_REDIRECTS`] times, each hop checked the same way.
//! - Unless `allow_private` is set, no loopback, private, link-local, shared (CGNAT) or
//!   otherwise non-public address: an IP literal is refused up front, a host name is resolved
//!   by [`GuardedResolver`] which drops such addresses, so the connection goes only to an
//!   address that was checked (a name that re-resolves to `127.0.0.1` later cannot slip
//!   through). Without this guard the bot could be made to probe the operator's network or a
//!   cloud metadata service. The environment's HTTP proxy is not used, for the same reason:
//!   a proxy would resolve names where the guard cannot see.
//! - One timeout for the whole exchange (connect, headers, body).
//! - A response that declares a non-image `Content-Type` is refused before its body is read
//!   (`application/octet-stream` and a missing type are let through to the byte check).
//! - The body is read in chunks and abandoned as soon as it passes the size cap, whatever
//!   `Content-Length` said.

use std::error::Error as StdError;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::{Url, header, redirect};

/// Most redirects followed.
pub const MAX_REDIRECTS: usize = 5;

/// Why a URL could not be fetched; each maps to one tool error code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    /// Not an http(s) URL, or otherwise unusable.
    #[error("{0}")]
    BadUrl(String),
    /// The URL points at a non-public address.
    #[error("{0}")]
    Forbidden(String),
    /// Larger than the cap.
    #[error("{0}")]
    TooLarge(String),
    /// The server says it is not an image.
    #[error("{0}")]
    NotAnImage(String),
    /// No complete answer within the timeout.
    #[error("{0}")]
    Timeout(String),
    /// Network trouble or an error status.
    #[error("{0}")]
    Unavailable(String),
}

/// A fetched body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    /// The bytes, at most the cap.
    pub bytes: Vec<u8>,
    /// The declared `Content-Type`, if any.
    pub content_type: Option<String>,
}

/// An HTTP client for image URLs with the limits above.
#[derive(Debug, Clone)]
pub struct Fetcher {
    client: reqwest::Client,
    /// Bodies larger than this are abandoned.
    max_bytes: u64,
    /// For the timeout message.
    timeout: Duration,
    /// Whether non-public addresses may be fetched (tests, trusted setups).
    allow_private: bool,
}

impl Fetcher {
    /// A client with a total `timeout`, a body cap of `max_bytes`, and the address guard
    /// unless `allow_private`.
    pub fn new(
        timeout: Duration,
        max_bytes: u64,
        allow_private: bool,
    ) -> Result<Self, reqwest::Error> {
        let policy = redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() >= MAX_REDIRECTS {
                return attempt.error(FetchError::Unavailable(format!(
                    "the URL redirects more than {MAX_REDIRECTS} times"
                )));
            }
            match check_url(attempt.url(), allow_private) {
                Ok(()) => attempt.follow(),
                Err(error) => attempt.error(error),
            }
        });
        let mut builder = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(10)))
            .redirect(policy)
            .no_proxy()
            .user_agent(concat!(
                "parlor/",
                env!("CARGO_PKG_VERSION"),
                " (load_image)"
            ));
        if !allow_private {
            builder = builder.dns_resolver(Arc::new(GuardedResolver));
        }
        Ok(Fetcher {
            client: builder.build()?,
            max_bytes,
            timeout,
            allow_private,
        })
    }

    /// Parses and checks `raw` without fetching it.
    pub fn parse(&self, raw: &str) -> Result<Url, FetchError> {
        let url = Url::parse(raw.trim())
            .map_err(|e| FetchError::BadUrl(format!("{raw:?} is not a valid URL ({e})")))?;
        check_url(&url, self.allow_private)?;
        Ok(url)
    }

    /// Fetches `raw` within the limits (see the module docs).
    pub async fn fetch(&self, raw: &str) -> Result<Fetched, FetchError> {
        let url = self.parse(raw)?;
        let mut response = self
            .client
            .get(url)
            .header(
                header::ACCEPT,
                "image/png, image/jpeg, image/gif, image/webp",
            )
            .send()
            .await
            .map_err(|e| self.failure(&e))?;
        let status = response.status();
        if !status.is_success() {
            return Err(FetchError::Unavailable(format!(
                "the server answered {status}"
            )));
        }
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| {
                v.split(';')
                    .next()
                    .unwrap_or_default()
                    .trim()
                    .to_ascii_lowercase()
            });
        if let Some(ct) = &content_type
            && !ct.is_empty()
            && !ct.starts_with("image/")
            && ct != "application/octet-stream"
            && ct != "binary/octet-stream"
        {
            return Err(FetchError::NotAnImage(format!(
                "the URL serves {ct}, not an image"
            )));
        }
        let too_large = || {
            FetchError::TooLarge(format!(
                "the image is larger than the limit of {} bytes",
                self.max_bytes
            ))
        };
        if response
            .content_length()
            .is_some_and(|n| n > self.max_bytes)
        {
            return Err(too_large());
        }
        let mut bytes = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| self.failure(&e))? {
            if (bytes.len() + chunk.len()) as u64 > self.max_bytes {
                return Err(too_large());
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok(Fetched {
            bytes,
            content_type,
        })
    }

    /// A reqwest failure as the model should see it: our own refusals (from the redirect
    /// policy or the resolver) come back as they were raised.
    fn failure(&self, error: &reqwest::Error) -> FetchError {
        let mut source: Option<&(dyn StdError + 'static)> = Some(error);
        while let Some(e) = source {
            if let Some(ours) = e.downcast_ref::<FetchError>() {
                return ours.clone();
            }
            source = e.source();
        }
        if error.is_timeout() {
            return FetchError::Timeout(format!(
                "the server did not send the whole image within {} s",
                self.timeout.as_secs_f64()
            ));
        }
        // reqwest's top line ("error sending request for url ...") says little; the innermost
        // cause ("connection refused", "dns error") is what helps.
        let mut cause = error.to_string();
        let mut source = error.source();
        while let Some(e) = source {
            cause = e.to_string();
            source = e.source();
        }
        FetchError::Unavailable(format!("the URL could not be fetched: {cause}"))
    }
}

/// The scheme, credential and address checks every URL (and every redirect) passes.
fn check_url(url: &Url, allow_private: bool) -> Result<(), FetchError> {
    if !matches!(url.scheme(), "http" | "https") {
        return Err(FetchError::BadUrl(format!(
            "only http and https URLs can be loaded, not {}:",
            url.scheme()
        )));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(FetchError::BadUrl(
            "URLs with a user name or password are not loaded".to_owned(),
        ));
    }
    let Some(host) = url.host_str().filter(|h| !h.is_empty()) else {
        return Err(FetchError::BadUrl("the URL has no host".to_owned()));
    };
    // The URL parser has already normalized IPv4 spellings (`2130706433`, `0x7f.1`) to
    // dotted quads; IPv6 literals come in brackets.
    let literal = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>();
    if let Ok(ip) = literal
        && !allow_private
        && !is_public(ip)
    {
        return Err(forbidden(&ip.to_string()));
    }
    Ok(())
}

fn forbidden(host: &str) -> FetchError {
    FetchError::Forbidden(format!(
        "{host} is a local or private network address; only public addresses are loaded"
    ))
}

/// Whether `ip` is an ordinary public unicast address.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => is_public_v4(v4),
            None => is_public_v6(v6),
        },
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_broadcast()
        || ip.is_documentation()
        || ip.is_multicast()
        || a == 0
        // 100.64.0.0/10, shared address space (carrier-grade NAT)
        || (a == 100 && (b & 0xC0) == 64)
        // 192.0.0.0/24, IETF protocol assignments
        || (a == 192 && b == 0 && c == 0)
        // 198.18.0.0/15, benchmarking
        || (a == 198 && (b & 0xFE) == 18)
        // 240.0.0.0/4, reserved
        || a >= 240)
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let first = ip.segments()[0];
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        // fc00::/7, unique local
        || (first & 0xFE00) == 0xFC00
        // fe80::/10, link-local
        || (first & 0xFFC0) == 0xFE80
        // 2001:db8::/32, documentation
        || (first == 0x2001 && ip.segments()[1] == 0x0DB8)
        // 64:ff9b::/96 NAT64 could reach anything; ::/96 IPv4-compatible (deprecated)
        || (first == 0x0064 && ip.segments()[1] == 0xFF9B)
        || ip.segments()[..6].iter().all(|s| *s == 0))
}

/// Resolves host names with the system resolver and keeps only public addresses.
#[derive(Debug, Clone, Copy)]
pub struct GuardedResolver;

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let resolved: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let public: Vec<SocketAddr> = resolved
                .into_iter()
                .filter(|addr| is_public(addr.ip()))
                .collect();
            if public.is_empty() {
                return Err(Box::new(forbidden(&host)) as Box<dyn StdError + Send + Sync>);
            }
            Ok(Box::new(public.into_iter()) as Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_and_private_addresses() {
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "::1",
            "::",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
        ] {
            assert!(!is_public(private.parse().unwrap()), "{private}");
        }
        for public in [
            "1.1.1.1",
            "93.184.216.34",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
        ] {
            assert!(is_public(public.parse().unwrap()), "{public}");
        }
    }

    #[test]
    fn only_http_urls_without_credentials_pass() {
        let check = |url: &str| check_url(&Url::parse(url).unwrap(), false);
        assert!(check("https://example.com/a.png").is_ok());
        assert!(check("http://93.184.216.34/a.png").is_ok());
        assert!(matches!(
            check("file:///etc/passwd"),
            Err(FetchError::BadUrl(_))
        ));
        assert!(matches!(
            check("ftp://example.com/a"),
            Err(FetchError::BadUrl(_))
        ));
        assert!(matches!(
            check("javascript:alert(1)"),
            Err(FetchError::BadUrl(_))
        ));
        assert!(matches!(
            check("data:image/png;base64,AAAA"),
            Err(FetchError::BadUrl(_))
        ));
        assert!(matches!(
            check("https://u:p@example.com/"),
            Err(FetchError::BadUrl(_))
        ));
        assert!(matches!(
            check("http://127.0.0.1:8080/"),
            Err(FetchError::Forbidden(_))
        ));
        assert!(matches!(
            check("http://[::1]/"),
            Err(FetchError::Forbidden(_))
        ));
        assert!(check_url(&Url::parse("http://127.0.0.1/").unwrap(), true).is_ok());
    }
}
