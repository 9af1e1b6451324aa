//! Canonical destinations: the one spelling of a host that the gate both decides on and dials.
//!
//! A name is lower-case ASCII (IDN as punycode), without a trailing dot, made of labels of
//! `[a-z0-9-]`; an IP literal is printed in its normal form (`::1`, never `0:0::1`). A host
//! whose last label is a number is an IPv4 address in the WHATWG URL Standard's spellings
//! (§3.5 "IPv4 parser": decimal, octal `0`-prefixed, hex `0x`-prefixed parts, 1 to 4 of them,
//! the last filling the remaining bytes: `127.1`, `0x7f.1`, `2130706433`), as URL clients read
//! it, so the gate decides on the address the client means. Anything else is refused rather
//! than guessed at.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Longest host name DNS can carry, in its dotted form.
pub const MAX_NAME_LEN: usize = 253;
/// Longest DNS label.
pub const MAX_LABEL_LEN: usize = 63;

/// Why a host was refused; the text is fixed so tests and audit readers can match it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid host {value:?}: {why}")]
pub struct HostError {
    pub value: String,
    pub why: &'static str,
}

fn bad(value: &str, why: &'static str) -> HostError {
    HostError { value: value.to_string(), why }
}

/// A destination host in canonical form.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    Name(String),
    V4(Ipv4Addr),
    V6(Ipv6Addr),
}

impl Host {
    /// The IP address, for a literal; names are `None` (they must be resolved).
    pub fn ip(&self) -> Option<IpAddr> {
        match self {
            Host::Name(_) => None,
            Host::V4(a) => Some(IpAddr::V4(*a)),
            Host::V6(a) => Some(IpAddr::V6(*a)),
        }
    }

    /// True for an unspecified address in any spelling: `0.0.0.0`, `::`, and the IPv4-mapped
    /// `::ffff:0.0.0.0`. Dialled, these reach the dialling host itself (its loopback), so
    /// they can never be a destination.
    pub fn is_unspecified(&self) -> bool {
        match self {
            Host::Name(_) => false,
            Host::V4(a) => a.is_unspecified(),
            Host::V6(a) => a.is_unspecified() || a.to_ipv4_mapped().is_some_and(|v4| v4.is_unspecified()),
        }
    }

    /// `host:port` as a client writes it (IPv6 in brackets).
    pub fn with_port(&self, port: u16) -> String {
        match self {
            Host::V6(a) => format!("[{a}]:{port}"),
            other => format!("{other}:{port}"),
        }
    }
}

impl From<IpAddr> for Host {
    fn from(ip: IpAddr) -> Host {
        match ip {
            IpAddr::V4(a) => Host::V4(a),
            IpAddr::V6(a) => Host::V6(a),
        }
    }
}

/// Bare form: `example.com`, `192.0.2.1`, `2001:db8::1` (no brackets).
impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::V4(a) => write!(f, "{a}"),
            Host::V6(a) => write!(f, "{a}"),
        }
    }
}

/// Canonicalise a destination host as it appears in a request or a rule.
///
/// Accepts `[v6]` in brackets, a bare IPv6 literal, an IPv4 dotted quad, or a name.
/// Strips one trailing dot, lower-cases, converts IDN to punycode, then checks the result.
pub fn canonical_host(input: &str) -> Result<Host, HostError> {
    if let Some(inner) = input.strip_prefix('[') {
        let inner = inner
            .strip_suffix(']')
            .ok_or_else(|| bad(input, "unbalanced '['"))?;
        return inner
            .parse::<Ipv6Addr>()
            .map(Host::V6)
            .map_err(|_| bad(input, "not an IPv6 address inside brackets"));
    }
    if input.contains(':') {
        return input
            .parse::<Ipv6Addr>()
            .map(Host::V6)
            .map_err(|_| bad(input, "':' outside an IPv6 literal"));
    }
    let trimmed = input.strip_suffix('.').unwrap_or(input);
    if trimmed.is_empty() {
        return Err(bad(input, "empty"));
    }
    if let Ok(a) = trimmed.parse::<Ipv4Addr>() {
        return Ok(Host::V4(a));
    }
    canonical_name(input, trimmed)
}

/// A rule's host pattern, canonicalised: an exact host or `*.suffix` (strict subdomains).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    Exact(Host),
    Subdomains(String),
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostPattern::Exact(h) => write!(f, "{h}"),
            HostPattern::Subdomains(s) => write!(f, "*.{s}"),
        }
    }
}

/// Why a rule may not name an unspecified address (see [`Host::is_unspecified`]).
pub const UNSPECIFIED_RULE: &str =
    "unspecified address (0.0.0.0 or ::) can never be a destination; the gate refuses it regardless of rules";

/// Canonicalise a rule host: like [`canonical_host`], plus a leading `*.` on a name.
/// An unspecified address is refused: no rule can allow (or needs to deny) it.
pub fn canonical_pattern(input: &str) -> Result<HostPattern, HostError> {
    match input.strip_prefix("*.") {
        Some(rest) => match canonical_host(rest) {
            Ok(Host::Name(n)) => Ok(HostPattern::Subdomains(n)),
            Ok(_) => Err(bad(input, "'*.' applies to names, not IP addresses")),
            Err(e) => Err(bad(input, e.why)),
        },
        None => match canonical_host(input)? {
            h if h.is_unspecified() => Err(bad(input, UNSPECIFIED_RULE)),
            h => Ok(HostPattern::Exact(h)),
        },
    }
}

impl HostPattern {
    /// Exact: equal canonical hosts. `*.s`: a name ending in `.s` with at least one more label.
    pub fn matches(&self, host: &Host) -> bool {
        match (self, host) {
            (HostPattern::Exact(h), host) => h == host,
            (HostPattern::Subdomains(suffix), Host::Name(name)) => name
                .strip_suffix(suffix.as_str())
                .and_then(|head| head.strip_suffix('.'))
                .is_some_and(|head| !head.is_empty()),
            (HostPattern::Subdomains(_), _) => false,
        }
    }
}

fn canonical_name(input: &str, trimmed: &str) -> Result<Host, HostError> {
    if trimmed.contains('*') {
        return Err(bad(input, "'*' is only allowed as a leading \"*.\" in rules"));
    }
    if trimmed.split('.').any(str::is_empty) {
        return Err(bad(input, "empty label"));
    }
    let ascii = idna::domain_to_ascii(trimmed).map_err(|_| bad(input, "not a valid IDN"))?;
    if ascii.is_empty() {
        return Err(bad(input, "empty"));
    }
    if ascii.len() > MAX_NAME_LEN {
        return Err(bad(input, "longer than 253 characters"));
    }
    for label in ascii.split('.') {
        if label.is_empty() {
            return Err(bad(input, "empty label"));
        }
        if label.len() > MAX_LABEL_LEN {
            return Err(bad(input, "label longer than 63 characters"));
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return Err(bad(input, "characters outside [a-z0-9-.]"));
        }
    }
    if ends_in_number(&ascii) {
        return ipv4_any_spelling(&ascii).map(Host::V4).ok_or_else(|| bad(input, NUMERIC_NOT_IPV4));
    }
    Ok(Host::Name(ascii))
}

/// Why a host whose last label is a number, but which is no IPv4 address, is refused.
pub const NUMERIC_NOT_IPV4: &str = "numeric last label but not an IPv4 address in any spelling";

/// WHATWG URL §3.5 "ends in a number": the last label (one trailing empty label aside, which
/// the caller has removed) is decimal digits or `0x` + hex digits.
fn ends_in_number(ascii: &str) -> bool {
    let last = ascii.rsplit('.').next().unwrap_or(ascii);
    !last.is_empty()
        && (last.bytes().all(|b| b.is_ascii_digit())
            || last.strip_prefix("0x").is_some_and(|h| h.bytes().all(|b| b.is_ascii_hexdigit())))
}

/// The IPv4 address a URL client reads from `ascii` (WHATWG URL §3.5, implemented by the
/// `url` crate's host parser), or `None` when it is not one (five parts, a part too large,
/// a label that is not a number).
fn ipv4_any_spelling(ascii: &str) -> Option<Ipv4Addr> {
    match url::Host::parse(ascii) {
        Ok(url::Host::Ipv4(a)) => Some(a),
        _ => None,
    }
}

/// Split a CLI spec `HOST[:PORT]` (`[v6]:port`, bare `v6`, `*.name:port`).
/// Returns the host part as written and the port, if given.
pub fn split_spec(spec: &str) -> Result<(&str, Option<&str>), HostError> {
    if spec.starts_with('[') {
        let close = spec.find(']').ok_or_else(|| bad(spec, "unbalanced '['"))?;
        let (host, rest) = spec.split_at(close + 1);
        return match rest {
            "" => Ok((host, None)),
            _ => match rest.strip_prefix(':') {
                Some(port) => Ok((host, Some(port))),
                None => Err(bad(spec, "expected ':PORT' after ']'")),
            },
        };
    }
    match spec.matches(':').count() {
        0 => Ok((spec, None)),
        1 => match spec.split_once(':') {
            Some((h, p)) => Ok((h, Some(p))),
            None => Ok((spec, None)),
        },
        // A bare IPv6 literal has no port; write "[v6]:port" for one.
        _ => Ok((spec, None)),
    }
}
