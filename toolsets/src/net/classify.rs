//! Which addresses the guard refuses, as pure functions of the address: the special-purpose
//! registries of IANA (RFC 6890 and its updates) reduced to "may a URL from a chat reach
//! this?". Addresses that carry an IPv4 address inside an IPv6 one (mapped, SIIT
//! translated, compatible, NAT64, 6to4, Teredo) are judged by the IPv4 address they lead
//! to, since that is where the packets end up. Any other IPv6 address outside global
//! unicast `2000::/3` is refused: nothing public lives there, and an embedding form not
//! listed here would otherwise pass as public.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};

/// A refused range: the network and what it is, for the message the model reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    /// The range, in CIDR notation.
    pub network: &'static str,
    /// What the range is (`"loopback"`, `"private network"`...).
    pub what: &'static str,
}

const fn v4(a: u8, b: u8, c: u8, d: u8, prefix: u8) -> Ipv4Net {
    Ipv4Net::new_assert(Ipv4Addr::new(a, b, c, d), prefix)
}

#[allow(clippy::too_many_arguments)]
const fn v6(s: [u16; 8], prefix: u8) -> Ipv6Net {
    Ipv6Net::new_assert(
        Ipv6Addr::new(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]),
        prefix,
    )
}

/// IPv4 ranges no URL from a chat may reach.
const REFUSED_V4: &[(Ipv4Net, Refused)] = &[
    (
        v4(0, 0, 0, 0, 8),
        refused("0.0.0.0/8", "\"this network\" (unspecified)"),
    ),
    (v4(10, 0, 0, 0, 8), refused("10.0.0.0/8", "private network")),
    (
        v4(100, 64, 0, 0, 10),
        refused("100.64.0.0/10", "shared address space (CGNAT)"),
    ),
    (v4(127, 0, 0, 0, 8), refused("127.0.0.0/8", "loopback")),
    (
        v4(169, 254, 0, 0, 16),
        refused(
            "169.254.0.0/16",
            "link-local (cloud metadata services live here)",
        ),
    ),
    (
        v4(172, 16, 0, 0, 12),
        refused("172.16.0.0/12", "private network"),
    ),
    (
        v4(192, 0, 0, 0, 24),
        refused("192.0.0.0/24", "IETF protocol assignments"),
    ),
    (
        v4(192, 0, 2, 0, 24),
        refused("192.0.2.0/24", "documentation"),
    ),
    (
        v4(192, 88, 99, 0, 24),
        refused("192.88.99.0/24", "6to4 relay anycast"),
    ),
    (
        v4(192, 168, 0, 0, 16),
        refused("192.168.0.0/16", "private network"),
    ),
    (
        v4(198, 18, 0, 0, 15),
        refused("198.18.0.0/15", "benchmarking"),
    ),
    (
        v4(198, 51, 100, 0, 24),
        refused("198.51.100.0/24", "documentation"),
    ),
    (
        v4(203, 0, 113, 0, 24),
        refused("203.0.113.0/24", "documentation"),
    ),
    (v4(224, 0, 0, 0, 4), refused("224.0.0.0/4", "multicast")),
    (
        v4(255, 255, 255, 255, 32),
        refused("255.255.255.255/32", "broadcast"),
    ),
    (v4(240, 0, 0, 0, 4), refused("240.0.0.0/4", "reserved")),
];

/// IPv6 ranges no URL from a chat may reach (the ones embedding IPv4 are handled apart).
const REFUSED_V6: &[(Ipv6Net, Refused)] = &[
    (
        v6([0, 0, 0, 0, 0, 0, 0, 0], 128),
        refused("::/128", "unspecified"),
    ),
    (
        v6([0, 0, 0, 0, 0, 0, 0, 1], 128),
        refused("::1/128", "loopback"),
    ),
    (
        v6([0x0100, 0, 0, 0, 0, 0, 0, 0], 64),
        refused("100::/64", "discard-only"),
    ),
    (
        v6([0x0064, 0xff9b, 1, 0, 0, 0, 0, 0], 48),
        refused("64:ff9b:1::/48", "local-use NAT64"),
    ),
    (
        v6([0x2001, 0x0db8, 0, 0, 0, 0, 0, 0], 32),
        refused("2001:db8::/32", "documentation"),
    ),
    (
        v6([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20),
        refused("3fff::/20", "documentation"),
    ),
    (
        v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7),
        refused("fc00::/7", "unique local (IPv6 private)"),
    ),
    (
        v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10),
        refused("fe80::/10", "link-local"),
    ),
    (
        v6([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10),
        refused("fec0::/10", "site-local (deprecated)"),
    ),
    (
        v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8),
        refused("ff00::/8", "multicast"),
    ),
];

const fn refused(network: &'static str, what: &'static str) -> Refused {
    Refused { network, what }
}

/// Why `ip` is refused, or `None` for an ordinary public unicast address.
pub fn classify(ip: IpAddr) -> Option<Refused> {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

/// Whether `ip` is an ordinary public unicast address (nothing in [`classify`] refuses it).
pub fn is_public(ip: IpAddr) -> bool {
    classify(ip).is_none()
}

fn classify_v4(ip: Ipv4Addr) -> Option<Refused> {
    REFUSED_V4
        .iter()
        .find(|(net, _)| net.contains(&ip))
        .map(|(_, why)| *why)
}

fn classify_v6(ip: Ipv6Addr) -> Option<Refused> {
    if let Some(why) = REFUSED_V6
        .iter()
        .find(|(net, _)| net.contains(&ip))
        .map(|(_, why)| *why)
    {
        return Some(why);
    }
    if let Some(embedded) = embedded_v4(ip) {
        return embedded.into_iter().flatten().find_map(classify_v4);
    }
    if GLOBAL_UNICAST.contains(&ip) {
        None
    } else {
        Some(refused(
            "outside 2000::/3",
            "not a global unicast address (reserved by the IETF)",
        ))
    }
}

/// Where every public IPv6 address lives; the embedding forms outside it are judged by
/// their IPv4 address first.
const GLOBAL_UNICAST: Ipv6Net = v6([0x2000, 0, 0, 0, 0, 0, 0, 0], 3);

/// The IPv4 addresses an IPv6 address leads to, for the forms that carry one:
/// `::ffff:a.b.c.d` (mapped), `::ffff:0:a.b.c.d` (SIIT translated, RFC 7915),
/// `::a.b.c.d` (compatible, deprecated), `64:ff9b::a.b.c.d`
/// (NAT64), `2002:AABB:CCDD::/48` (6to4) and `2001:0::/32` (Teredo: the server, and the
/// client address stored inverted in the last 32 bits). `None` for other addresses.
pub fn embedded_v4(ip: Ipv6Addr) -> Option<[Option<Ipv4Addr>; 2]> {
    let s = ip.segments();
    let last = |hi: u16, lo: u16| {
        let [a, b] = hi.to_be_bytes();
        let [c, d] = lo.to_be_bytes();
        Ipv4Addr::new(a, b, c, d)
    };
    if let Some(mapped) = ip.to_ipv4_mapped() {
        return Some([Some(mapped), None]);
    }
    if s[..4].iter().all(|x| *x == 0) && s[4] == 0xffff && s[5] == 0 {
        return Some([Some(last(s[6], s[7])), None]);
    }
    if s[..6].iter().all(|x| *x == 0) {
        return Some([Some(last(s[6], s[7])), None]);
    }
    if s[0] == 0x0064 && s[1] == 0xff9b && s[2..6].iter().all(|x| *x == 0) {
        return Some([Some(last(s[6], s[7])), None]);
    }
    if s[0] == 0x2002 {
        return Some([Some(last(s[1], s[2])), None]);
    }
    if s[0] == 0x2001 && s[1] == 0 {
        return Some([Some(last(s[2], s[3])), Some(last(!s[6], !s[7]))]);
    }
    None
}
