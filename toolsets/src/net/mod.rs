//! The one guard between a URL the model names and the network, shared by every tool that
//! fetches one (`web_fetch`, `load_image`, any later HTTP tool). A URL in a tool call may
//! come from anyone in the chat, so without it a member could make the bot probe the
//! operator's network or read a cloud metadata service.
//!
//! - [`Guard`]: the policy. Only `http` and `https`, no credentials in the URL, no host or
//!   network the operator denied ([`Denied`]: names by the URL's host, networks by every
//!   address, embedded IPv4 included, denial winning over allowing), and no address
//!   [`classify`] refuses (loopback, private, CGNAT, link-local with the metadata address,
//!   multicast, IPv6 ULA and link-local, the IPv6 forms that embed a refused IPv4
//!   address...) unless the operator allowed its network.
//! - [`GuardedClient`]: the HTTP client that enforces it. Names are resolved once per
//!   connection by its resolver, every answer is vetted, and the connection goes only to the
//!   vetted addresses (no second lookup between check and connect, so a name that answers
//!   a public address and then `127.0.0.1` cannot slip through). Redirects are followed by
//!   the client itself, at most [`MAX_REDIRECTS`], each hop checked like the first. The
//!   environment's `HTTP(S)_PROXY` is ignored: a proxy would resolve the name where the
//!   guard cannot see it.
//! - [`classify`]: the refused ranges as pure functions, for tests and messages.

mod classify;
mod client;

use std::net::IpAddr;

use ipnet::IpNet;
use reqwest::Url;

pub use classify::{Refused, classify, embedded_v4, is_public};
pub use client::{Fetched, GuardedClient, Lookup, MAX_REDIRECTS, SystemLookup};

/// The tool error code of a URL refused by the guard (a refused address, or a denied host).
pub const BLOCKED_ADDRESS: &str = "BLOCKED_ADDRESS";

/// Why a URL was not fetched; each maps to one tool error code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetError {
    /// Not an http(s) URL, credentials in it, or otherwise unusable.
    #[error("{0}")]
    BadUrl(String),
    /// The guard refused the host or one of its addresses (`BLOCKED_ADDRESS`).
    #[error("{0}")]
    Blocked(String),
    /// More redirects than [`MAX_REDIRECTS`].
    #[error("{0}")]
    TooManyRedirects(String),
    /// No complete answer within the timeout.
    #[error("{0}")]
    Timeout(String),
    /// Network trouble: refused connection, unknown name, broken TLS...
    #[error("{0}")]
    Unavailable(String),
}

/// A configuration value the guard cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GuardConfigError {
    /// An `allow_networks` entry is not a CIDR (`10.1.2.0/24`) or an address.
    #[error("{0:?} is not a network in CIDR notation (like \"10.1.2.0/24\") or an IP address")]
    BadNetwork(String),
    /// A `deny_hosts` entry is empty.
    #[error("deny_hosts entries must not be empty")]
    EmptyHost,
    /// A `deny_hosts` entry is neither an IP address, a CIDR nor a host name.
    #[error(
        "deny_hosts entry {0:?} is not a host name (like \"internal.example\"), an IP address \
         or a network in CIDR notation (like \"10.1.2.0/24\")"
    )]
    BadHost(String),
}

/// One `deny_hosts` entry, parsed once at config load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denied {
    /// An address or a network: compared against the URL's IP literal and every address a
    /// name resolves to, each also by the IPv4 address it embeds (`::ffff:127.0.0.1` is
    /// `127.0.0.1`).
    Network(IpNet),
    /// A host name, lower case, without a trailing dot: compared against the URL's host,
    /// and covering its subdomains.
    Name(String),
}

impl Denied {
    /// Parses an entry: an IP address in any spelling the URL parser accepts (`127.1`,
    /// `[::1]`), a CIDR, or a host name (IDNA applied, as URLs are).
    pub fn parse(entry: &str) -> Result<Self, GuardConfigError> {
        let entry = entry.trim();
        if entry.is_empty() {
            return Err(GuardConfigError::EmptyHost);
        }
        let bare = entry.trim_start_matches('[').trim_end_matches(']');
        if let Ok(network) = bare.parse::<IpNet>() {
            return Ok(Denied::Network(network.trunc()));
        }
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return Ok(Denied::Network(IpNet::from(ip)));
        }
        let bad = || GuardConfigError::BadHost(entry.to_owned());
        // Anything that would make the entry more than a host (a port, a path, a user, a
        // scheme) or that a URL host never holds.
        if entry
            .chars()
            .any(|c| c.is_whitespace() || "/:@?#[]\\%*".contains(c))
        {
            return Err(bad());
        }
        // The URL parser's host rules: the same normalization as the hosts it is compared
        // with (lower case, punycode, `127.1` and `0x7f.1` as dotted quads).
        let url = Url::parse(&format!("http://{entry}/")).map_err(|_| bad())?;
        let host = url.host_str().ok_or_else(bad)?;
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return Ok(Denied::Network(IpNet::from(ip)));
        }
        let name = normalize_host(host);
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        {
            return Err(bad());
        }
        Ok(Denied::Name(name))
    }
}

impl std::fmt::Display for Denied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Denied::Network(net) if net.prefix_len() == net.max_prefix_len() => {
                write!(f, "{}", net.addr())
            }
            Denied::Network(net) => write!(f, "{net}"),
            Denied::Name(name) => f.write_str(name),
        }
    }
}

/// What the guard lets through; see the module docs. The default refuses every
/// non-public address and denies no host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Guard {
    /// Networks the operator allowed although [`classify`] refuses them (an intranet wiki).
    allow_networks: Vec<IpNet>,
    /// What the operator refused whatever [`classify`] and `allow_networks` say: names
    /// (with their subdomains) and networks.
    deny_hosts: Vec<Denied>,
}

impl Guard {
    /// A guard allowing `allow_networks` (CIDRs or single addresses) and refusing
    /// `deny_hosts` ([`Denied::parse`]: names, with their subdomains, addresses or CIDRs).
    /// A denied network wins over an allowed one.
    pub fn new(allow_networks: &[String], deny_hosts: &[String]) -> Result<Self, GuardConfigError> {
        let mut guard = Guard::default();
        for network in allow_networks {
            let network = network.trim();
            let parsed = network
                .parse::<IpNet>()
                .or_else(|_| network.parse::<IpAddr>().map(IpNet::from))
                .map_err(|_| GuardConfigError::BadNetwork(network.to_owned()))?;
            guard.allow_networks.push(parsed.trunc());
        }
        for host in deny_hosts {
            guard.deny_hosts.push(Denied::parse(host)?);
        }
        Ok(guard)
    }

    /// The networks allowed beyond the public ones.
    pub fn allow_networks(&self) -> &[IpNet] {
        &self.allow_networks
    }

    /// The parsed `deny_hosts` entries.
    pub fn deny_hosts(&self) -> &[Denied] {
        &self.deny_hosts
    }

    /// Scheme, credentials, a denied host and an IP literal: everything that can be checked
    /// without a lookup. Every hop of a redirect chain passes it.
    pub fn check_url(&self, url: &Url) -> Result<(), NetError> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(NetError::BadUrl(format!(
                "only http and https URLs are fetched, not {}:",
                url.scheme()
            )));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(NetError::BadUrl(
                "URLs with a user name or password are not fetched".to_owned(),
            ));
        }
        let Some(host) = url.host_str().filter(|h| !h.is_empty()) else {
            return Err(NetError::BadUrl("the URL has no host".to_owned()));
        };
        // The URL parser has already normalized IPv4 spellings (`2130706433`, `0x7f.1`,
        // `127.1`) to dotted quads; IPv6 literals come in brackets.
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = bare.parse::<IpAddr>() {
            self.vet(bare, ip)?;
        } else {
            self.check_host(bare)?;
        }
        Ok(())
    }

    /// Refuses the host name `host` when the operator denied it or a domain above it.
    /// Denied addresses are [`Guard::vet`]'s: a name is only known by what it resolves to.
    pub fn check_host(&self, host: &str) -> Result<(), NetError> {
        let host = normalize_host(host);
        let denied = self.deny_hosts.iter().find(|d| match d {
            Denied::Name(d) => {
                host == *d
                    || host
                        .strip_suffix(d.as_str())
                        .is_some_and(|rest| rest.ends_with('.'))
            }
            Denied::Network(_) => false,
        });
        match denied {
            Some(d) => Err(NetError::Blocked(format!(
                "{host} is refused: the operator denied {d} (deny_hosts)"
            ))),
            None => Ok(()),
        }
    }

    /// Whether `host` may be reached at `ip`: not in a denied network (judged also by the
    /// IPv4 address it embeds), and public or in an allowed network.
    pub fn vet(&self, host: &str, ip: IpAddr) -> Result<(), NetError> {
        let shown = || {
            if host == ip.to_string() {
                format!("{ip}")
            } else {
                format!("{host} resolves to {ip}, which")
            }
        };
        let forms = ip_forms(ip);
        let denied = self.deny_hosts.iter().find(|d| match d {
            Denied::Network(net) => forms.iter().any(|f| net.contains(f)),
            Denied::Name(_) => false,
        });
        if let Some(d) = denied {
            return Err(NetError::Blocked(format!(
                "{} is refused: the operator denied {d} (deny_hosts)",
                shown()
            )));
        }
        let canonical = ip.to_canonical();
        if self
            .allow_networks
            .iter()
            .any(|n| n.contains(&ip) || n.contains(&canonical))
        {
            return Ok(());
        }
        match classify(ip) {
            None => Ok(()),
            Some(why) => Err(NetError::Blocked(format!(
                "{} is in {} ({}); only public addresses are fetched",
                shown(),
                why.network,
                why.what
            ))),
        }
    }
}

/// `ip` itself and every IPv4 address it leads to ([`embedded_v4`]), so that a denied
/// `127.0.0.1` also denies `::ffff:127.0.0.1`, `64:ff9b::7f00:1` and the like.
fn ip_forms(ip: IpAddr) -> Vec<IpAddr> {
    let mut forms = vec![ip];
    if let IpAddr::V6(v6) = ip
        && let Some(embedded) = embedded_v4(v6)
    {
        forms.extend(embedded.into_iter().flatten().map(IpAddr::V4));
    }
    forms
}

fn normalize_host(host: &str) -> String {
    host.trim().trim_end_matches('.').to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(raw: &str) -> Url {
        Url::parse(raw).unwrap()
    }

    #[test]
    fn only_http_urls_without_credentials_pass() {
        let guard = Guard::default();
        assert!(guard.check_url(&url("https://example.com/a.png")).is_ok());
        assert!(guard.check_url(&url("http://93.184.216.34/a")).is_ok());
        for bad in [
            "file:///etc/passwd",
            "ftp://example.com/a",
            "javascript:alert(1)",
            "data:image/png;base64,AAAA",
            "https://u:p@example.com/",
            "https://u@example.com/",
        ] {
            assert!(
                matches!(guard.check_url(&url(bad)), Err(NetError::BadUrl(_))),
                "{bad}"
            );
        }
        for blocked in [
            "http://127.0.0.1:8080/",
            "http://[::1]/",
            "http://2130706433/",
            "http://0x7f.1/",
            "http://169.254.169.254/latest/meta-data/",
            "http://[::ffff:10.0.0.1]/",
        ] {
            assert!(
                matches!(guard.check_url(&url(blocked)), Err(NetError::Blocked(_))),
                "{blocked}"
            );
        }
    }

    #[test]
    fn allowed_networks_and_denied_hosts() {
        let guard = Guard::new(
            &["127.0.0.1/32".to_owned(), "10.1.2.0/24".to_owned()],
            &["Intranet.Example.".to_owned()],
        )
        .unwrap();
        assert!(guard.check_url(&url("http://127.0.0.1:9/")).is_ok());
        assert!(guard.check_url(&url("http://10.1.2.77/")).is_ok());
        assert!(guard.check_url(&url("http://127.0.0.2:9/")).is_err());
        assert!(guard.check_url(&url("http://10.1.3.1/")).is_err());
        assert!(guard.check_host("wiki.intranet.example").is_err());
        assert!(guard.check_host("intranet.example").is_err());
        assert!(guard.check_host("notintranet.example").is_ok());
        assert!(Guard::new(&["10.1.2.0/33".to_owned()], &[]).is_err());
        assert!(Guard::new(&[], &[" ".to_owned()]).is_err());
    }
}
