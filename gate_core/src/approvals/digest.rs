//! The canonical URL of a held request and the digests that name it: `body_digest` =
//! SHA-256 of the whole body, `digest` = SHA-256 over `method "\n" url "\n" body_digest`
//! (hex, lower case). The digest is what a human saw: a decision carries it back.

use sha2::{Digest, Sha256};

use crate::policy::{Host, Scheme};

/// Lower-case hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let d = Sha256::digest(bytes);
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// `host` or `host:port` as in a URL: the port only when it is not the scheme's default
/// (80 for http, 443 for https), an IPv6 address in brackets.
pub fn authority(scheme: Scheme, host: &Host, port: u16) -> String {
    let default = match scheme {
        Scheme::Http => 80,
        Scheme::Https => 443,
    };
    match (host, port == default) {
        (Host::V6(a), true) => format!("[{a}]"),
        (h, true) => h.to_string(),
        (h, false) => h.with_port(port),
    }
}

/// The absolute URL of a request: `scheme://authority` + the origin-form target
/// (`path_and_query`, as the gate forwards it; the host is canonical already).
pub fn canonical_url(scheme: Scheme, host: &Host, port: u16, path_and_query: &str) -> String {
    format!("{}://{}{}", scheme.as_str(), authority(scheme, host, port), path_and_query)
}

/// The digest of a request: SHA-256 hex over `method "\n" url "\n" body_digest`.
pub fn request_digest(method: &str, url: &str, body_digest: &str) -> String {
    sha256_hex(format!("{method}\n{url}\n{body_digest}").as_bytes())
}

/// (authority, path without query) of a canonical URL made by [`canonical_url`];
/// `None` for anything else (a CONNECT's `host:port`).
pub fn split_url(url: &str) -> Option<(&str, &str)> {
    let rest = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://"))?;
    let slash = rest.find('/')?;
    let (auth, pq) = rest.split_at(slash);
    Some((auth, pq.split('?').next().unwrap_or(pq)))
}
