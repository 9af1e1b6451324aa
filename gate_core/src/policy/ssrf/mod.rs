//! The SSRF guard's address classes: which resolved (or literal) addresses are public.
//!
//! An address is [`Class::Public`] unless an IANA special-purpose registry (RFC 6890, as
//! updated) says it is not globally reachable, it is a cloud metadata endpoint, or it is an
//! IPv6 form that embeds an IPv4 address. The tables below are checked in order, first
//! match wins; each row cites its RFC. The gate adds `public_ranges` on top (see
//! [`PublicRanges`]) and rules that allow non-public addresses (see `gate::guard`).

mod cidr;
#[cfg(test)]
mod tests;

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub use cidr::{Cidr, CidrError};

/// What kind of address a destination is, for the SSRF guard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// Globally reachable (or listed in the gate's `public_ranges`).
    Public,
    /// 127.0.0.0/8 (RFC 1122 §3.2.1.3), ::1 (RFC 4291 §2.5.3).
    Loopback,
    /// RFC 1918 ranges; IPv6 unique local fc00::/7 (RFC 4193).
    Private,
    /// 169.254.0.0/16 (RFC 3927), fe80::/10 (RFC 4291 §2.5.6).
    LinkLocal,
    /// Shared address space 100.64.0.0/10 (RFC 6598), carrier-grade NAT.
    Cgnat,
    /// 224.0.0.0/4 (RFC 5771), ff00::/8 (RFC 4291 §2.7).
    Multicast,
    /// 0.0.0.0 (RFC 1122), :: (RFC 4291 §2.5.2): dialled, the gate's own host.
    Unspecified,
    /// Limited broadcast 255.255.255.255 (RFC 919, RFC 8190).
    Broadcast,
    /// "This network" 0.0.0.0/8 (RFC 791, RFC 1122 §3.2.1.3).
    ThisNetwork,
    /// 192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24 (RFC 5737), 2001:db8::/32
    /// (RFC 3849), 3fff::/20 (RFC 9637).
    Documentation,
    /// 198.18.0.0/15 (RFC 2544), 2001:2::/48 (RFC 5180).
    Benchmarking,
    /// Any other range the registries mark as not globally reachable, or IPv6 space outside
    /// 2000::/3 that is not allocated for global unicast (RFC 4291 §2.4).
    Reserved,
    /// A cloud metadata endpoint (see [`METADATA`]): hands out credentials.
    Metadata,
    /// An IPv6 form embedding an IPv4 address (mapped, compatible, SIIT, NAT64, 6to4,
    /// Teredo): it can reach any IPv4 address behind the guard's back, whatever it embeds.
    EmbeddedIpv4,
}

impl Class {
    /// The name used in audit reasons (`ssrf: <class> address <ip>`) and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Public => "public",
            Class::Loopback => "loopback",
            Class::Private => "private",
            Class::LinkLocal => "link-local",
            Class::Cgnat => "cgnat",
            Class::Multicast => "multicast",
            Class::Unspecified => "unspecified",
            Class::Broadcast => "broadcast",
            Class::ThisNetwork => "this-network",
            Class::Documentation => "documentation",
            Class::Benchmarking => "benchmarking",
            Class::Reserved => "reserved",
            Class::Metadata => "metadata",
            Class::EmbeddedIpv4 => "embedded-ipv4",
        }
    }

    /// True for the classes a rule's `allow_private = true` lets a name resolve to:
    /// loopback, private, link-local, CGNAT, documentation, benchmarking and reserved.
    /// Never metadata nor embedded IPv4 (nor multicast, broadcast, unspecified, "this
    /// network", which are no unicast destination): only a rule naming the address does.
    pub fn allow_private_covers(self) -> bool {
        matches!(
            self,
            Class::Loopback
                | Class::Private
                | Class::LinkLocal
                | Class::Cgnat
                | Class::Documentation
                | Class::Benchmarking
                | Class::Reserved
        )
    }

    /// True for the classes `public_ranges` can turn public: all but metadata, embedded
    /// IPv4 and unspecified.
    fn may_be_listed_public(self) -> bool {
        !matches!(self, Class::Metadata | Class::EmbeddedIpv4 | Class::Unspecified)
    }
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Cloud metadata endpoints: 169.254.169.254 (AWS, GCP, Azure, OpenStack, Oracle...),
/// fd00:ec2::254 (AWS IMDS over IPv6), 169.254.170.2 (AWS ECS task credentials),
/// 100.100.100.200 (Alibaba Cloud), 168.63.129.16 (Azure WireServer).
pub const METADATA: [IpAddr; 5] = [
    IpAddr::V4(Ipv4Addr::new(169, 254, 169, 254)),
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)),
    IpAddr::V4(Ipv4Addr::new(169, 254, 170, 2)),
    IpAddr::V4(Ipv4Addr::new(100, 100, 100, 200)),
    IpAddr::V4(Ipv4Addr::new(168, 63, 129, 16)),
];

use Class::*;

/// IPv4 special-purpose ranges (IANA IPv4 Special-Purpose Address Registry, RFC 6890).
/// 192.0.0.9/32 and 192.0.0.10/32 (anycast, globally reachable) fall under 192.0.0.0/24
/// here: stricter than the registry, and no agent needs them.
const V4: &[(Cidr, Class)] = &[
    (Cidr::v4([0, 0, 0, 0], 32), Unspecified),       // RFC 1122 §3.2.1.3
    (Cidr::v4([0, 0, 0, 0], 8), ThisNetwork),        // RFC 791, RFC 1122 §3.2.1.3
    (Cidr::v4([10, 0, 0, 0], 8), Private),           // RFC 1918
    (Cidr::v4([100, 64, 0, 0], 10), Cgnat),          // RFC 6598
    (Cidr::v4([127, 0, 0, 0], 8), Loopback),         // RFC 1122 §3.2.1.3
    (Cidr::v4([169, 254, 0, 0], 16), LinkLocal),     // RFC 3927
    (Cidr::v4([172, 16, 0, 0], 12), Private),        // RFC 1918
    (Cidr::v4([192, 0, 0, 0], 24), Reserved),        // RFC 6890 §2.1: IETF protocol assignments
    (Cidr::v4([192, 0, 2, 0], 24), Documentation),   // RFC 5737 TEST-NET-1
    (Cidr::v4([192, 88, 99, 0], 24), Reserved),      // RFC 7526: deprecated 6to4 relay anycast
    (Cidr::v4([192, 168, 0, 0], 16), Private),       // RFC 1918
    (Cidr::v4([198, 18, 0, 0], 15), Benchmarking),   // RFC 2544
    (Cidr::v4([198, 51, 100, 0], 24), Documentation), // RFC 5737 TEST-NET-2
    (Cidr::v4([203, 0, 113, 0], 24), Documentation), // RFC 5737 TEST-NET-3
    (Cidr::v4([224, 0, 0, 0], 4), Multicast),        // RFC 5771
    (Cidr::v4([255, 255, 255, 255], 32), Broadcast), // RFC 919, RFC 8190
    (Cidr::v4([240, 0, 0, 0], 4), Reserved),         // RFC 1112 §4: reserved for future use
];

/// IPv6 special-purpose ranges (IANA IPv6 Special-Purpose Address Registry, RFC 6890).
/// Rows for forms embedding IPv4 come before the ranges that contain them.
const V6: &[(Cidr, Class)] = &[
    (Cidr::v6([0, 0, 0, 0, 0, 0, 0, 0], 128), Unspecified),          // RFC 4291 §2.5.2
    (Cidr::v6([0, 0, 0, 0, 0, 0, 0, 1], 128), Loopback),             // RFC 4291 §2.5.3
    (Cidr::v6([0, 0, 0, 0, 0, 0xffff, 0, 0], 96), EmbeddedIpv4),     // RFC 4291 §2.5.5.2 v4-mapped
    (Cidr::v6([0, 0, 0, 0, 0xffff, 0, 0, 0], 96), EmbeddedIpv4),     // RFC 2765 §2.1 v4-translated (SIIT)
    (Cidr::v6([0, 0, 0, 0, 0, 0, 0, 0], 96), EmbeddedIpv4),          // RFC 4291 §2.5.5.1 v4-compatible
    (Cidr::v6([0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96), EmbeddedIpv4),  // RFC 6052 NAT64 well-known prefix
    (Cidr::v6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48), EmbeddedIpv4),  // RFC 8215 NAT64 local use
    (Cidr::v6([0x100, 0, 0, 0, 0, 0, 0, 0], 64), Reserved),          // RFC 6666 discard-only
    (Cidr::v6([0x100, 0, 0, 1, 0, 0, 0, 0], 64), Reserved),          // RFC 9780 dummy prefix
    (Cidr::v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 32), EmbeddedIpv4),     // RFC 4380 Teredo
    // Globally reachable exceptions inside 2001::/23 (IANA registry).
    (Cidr::v6([0x2001, 1, 0, 0, 0, 0, 0, 1], 128), Public),          // RFC 7723 PCP anycast
    (Cidr::v6([0x2001, 1, 0, 0, 0, 0, 0, 2], 128), Public),          // RFC 8155 TURN anycast
    (Cidr::v6([0x2001, 1, 0, 0, 0, 0, 0, 3], 128), Public),          // RFC 9665 DNS-SD SRP anycast
    (Cidr::v6([0x2001, 3, 0, 0, 0, 0, 0, 0], 32), Public),           // RFC 7450 AMT
    (Cidr::v6([0x2001, 4, 0x112, 0, 0, 0, 0, 0], 48), Public),       // RFC 7535 AS112-v6
    (Cidr::v6([0x2001, 0x20, 0, 0, 0, 0, 0, 0], 28), Public),        // RFC 7343 ORCHIDv2
    (Cidr::v6([0x2001, 0x30, 0, 0, 0, 0, 0, 0], 28), Public),        // RFC 9374 drone remote ID
    (Cidr::v6([0x2001, 2, 0, 0, 0, 0, 0, 0], 48), Benchmarking),     // RFC 5180
    (Cidr::v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 23), Reserved),         // RFC 2928 IETF protocol assignments
    (Cidr::v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32), Documentation), // RFC 3849
    (Cidr::v6([0x2002, 0, 0, 0, 0, 0, 0, 0], 16), EmbeddedIpv4),     // RFC 3056 6to4
    (Cidr::v6([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20), Documentation),    // RFC 9637
    (Cidr::v6([0x5f00, 0, 0, 0, 0, 0, 0, 0], 16), Reserved),         // RFC 9602 SRv6 SIDs
    (Cidr::v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7), Private),           // RFC 4193 unique local
    (Cidr::v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10), LinkLocal),        // RFC 4291 §2.5.6
    (Cidr::v6([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10), Reserved),         // RFC 3879 deprecated site-local
    (Cidr::v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8), Multicast),         // RFC 4291 §2.7
];

/// Global unicast IPv6 space (RFC 4291 §2.4, IANA IPv6 Address Space); the rest is
/// [`Class::Reserved`].
const V6_GLOBAL_UNICAST: Cidr = Cidr::v6([0x2000, 0, 0, 0, 0, 0, 0, 0], 3);

/// The class of `ip` by the registries alone (no `public_ranges`).
pub fn classify(ip: IpAddr) -> Class {
    if METADATA.contains(&ip) {
        return Metadata;
    }
    let table = if ip.is_ipv4() { V4 } else { V6 };
    match table.iter().find(|(range, _)| range.contains(ip)) {
        Some((_, class)) => *class,
        None if ip.is_ipv6() && !V6_GLOBAL_UNICAST.contains(ip) => Reserved,
        None => Public,
    }
}

/// The gate's `public_ranges` setting: extra ranges whose addresses count as public (a
/// test network on documentation addresses, a corporate range the agent may reach).
/// Never covers a metadata address (refused when parsed) and never turns an embedded-IPv4
/// or unspecified address public.
#[derive(Debug, Clone, Default)]
pub struct PublicRanges(Vec<Cidr>);

/// A `public_ranges` entry that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    #[error("public_ranges: {0}")]
    Cidr(#[from] CidrError),
    #[error(
        "public_ranges: {range} covers the cloud metadata address {ip}, which is never public; \
         name the address in a rule if the agent must reach it"
    )]
    Metadata { range: Cidr, ip: IpAddr },
}

impl PublicRanges {
    /// Parse CIDR strings (`"203.0.113.0/24"`, `"2001:db8:100::/48"`).
    pub fn parse<S: AsRef<str>>(list: &[S]) -> Result<PublicRanges, RangeError> {
        let mut ranges = Vec::with_capacity(list.len());
        for s in list {
            let range: Cidr = s.as_ref().parse()?;
            if let Some(ip) = METADATA.iter().find(|ip| range.contains(**ip)) {
                return Err(RangeError::Metadata { range, ip: *ip });
            }
            ranges.push(range);
        }
        Ok(PublicRanges(ranges))
    }

    pub fn ranges(&self) -> &[Cidr] {
        &self.0
    }

    /// These ranges and `more`'s (the gate's `--public-range` and the policy file's).
    pub fn with(&self, more: &PublicRanges) -> PublicRanges {
        PublicRanges(self.0.iter().chain(more.0.iter()).cloned().collect())
    }

    /// The class of `ip` with these ranges counted as public.
    pub fn classify(&self, ip: IpAddr) -> Class {
        match classify(ip) {
            c if c.may_be_listed_public() && self.0.iter().any(|r| r.contains(ip)) => Public,
            c => c,
        }
    }
}
