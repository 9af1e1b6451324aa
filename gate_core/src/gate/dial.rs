//! Resolve (names only, and only after the policy allowed them) and dial upstream. The
//! SSRF guard (`guard.rs`) sits between the two: [`addresses`] gives it what a destination
//! resolves to, and [`connect_any`] dials only what it kept, never looking the name up again.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use hickory_resolver::error::ResolveErrorKind;
use hickory_resolver::{Name, TokioAsyncResolver};
use hyper::StatusCode;
use tokio::net::TcpStream;
use tokio::time::timeout;

use crate::policy::ssrf::Class;
use crate::policy::Host;

/// Why no upstream connection could be made; the text goes to the audit `error` field.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    #[error("dns: no address for {0}")]
    NoAddress(String),
    #[error("dns: {0} resolves only to an unspecified address (0.0.0.0 or ::), which the gate never dials")]
    Unspecified(String),
    #[error("dns: timeout resolving {0}")]
    DnsTimeout(String),
    #[error("dns: lookup of {host} failed: {msg}")]
    Dns { host: String, msg: String },
    #[error("upstream: connection refused")]
    Refused(SocketAddr),
    #[error("upstream: timeout")]
    Timeout(SocketAddr),
    #[error("upstream: {source}")]
    Io { addr: SocketAddr, source: io::Error },
    /// The gate's process is short of descriptors and the run holds its share or more
    /// (`fd_room`), before the lookup or after it: nothing dialled; answered 503.
    #[error("limit: not dialled: the gate's process is short of file descriptors and this run holds {held} connections (its share: {share})", share = super::fd_room::FAIR_SHARE)]
    Short { held: usize },
    /// The SSRF guard refused every address (this one was the first): answered 403.
    #[error("ssrf: {class} address {ip}")]
    Ssrf { ip: IpAddr, class: Class },
}

impl DialError {
    /// 403 for the SSRF guard, 504 for timeouts, 503 when short of descriptors, 502 for everything else.
    pub fn status(&self) -> StatusCode {
        match self {
            DialError::Ssrf { .. } => StatusCode::FORBIDDEN,
            DialError::Timeout(_) | DialError::DnsTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
            DialError::Short { .. } => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::BAD_GATEWAY,
        }
    }

    /// The address that failed, when one was tried.
    pub fn addr(&self) -> Option<SocketAddr> {
        match self {
            DialError::Refused(a) | DialError::Timeout(a) | DialError::Io { addr: a, .. } => Some(*a),
            _ => None,
        }
    }
}

async fn resolve(resolver: &TokioAsyncResolver, name: &str, limit: Duration) -> Result<Vec<IpAddr>, DialError> {
    // Fully qualified, so search domains never turn the name into one the policy did not see.
    let fqdn = Name::from_ascii(format!("{name}.")).map_err(|e| DialError::Dns { host: name.into(), msg: e.to_string() })?;
    let lookup = match timeout(limit, resolver.lookup_ip(fqdn)).await {
        Err(_) => return Err(DialError::DnsTimeout(name.into())),
        Ok(Err(e)) => {
            return Err(match e.kind() {
                ResolveErrorKind::NoRecordsFound { .. } => DialError::NoAddress(name.into()),
                ResolveErrorKind::Timeout => DialError::DnsTimeout(name.into()),
                _ => DialError::Dns { host: name.into(), msg: e.to_string() },
            })
        }
        Ok(Ok(lookup)) => lookup,
    };
    dialable(name, lookup.iter().collect())
}

/// The resolved addresses the gate may dial: an unspecified one (`0.0.0.0`, `::`, as
/// blocklisting resolvers answer) would reach the gate's own host, so it is dropped.
fn dialable(name: &str, mut ips: Vec<IpAddr>) -> Result<Vec<IpAddr>, DialError> {
    if ips.is_empty() {
        return Err(DialError::NoAddress(name.into()));
    }
    ips.retain(|ip| !Host::from(*ip).is_unspecified());
    if ips.is_empty() {
        return Err(DialError::Unspecified(name.into()));
    }
    Ok(ips)
}

/// The addresses `host` stands for: an IP literal itself (never an unspecified one: the
/// policy denies those, and this refuses them again), a name its resolved addresses, in
/// order, the lookup bounded by `limit`.
pub async fn addresses(resolver: &TokioAsyncResolver, host: &Host, limit: Duration) -> Result<Vec<IpAddr>, DialError> {
    match (host, host.ip()) {
        (_, Some(_)) if host.is_unspecified() => Err(DialError::Unspecified(host.to_string())),
        (_, Some(ip)) => Ok(vec![ip]),
        (Host::Name(name), None) => resolve(resolver, name, limit).await,
        (other, None) => Err(DialError::NoAddress(other.to_string())),
    }
}

/// Connect to the first of `ips` (on `port`) that answers, each attempt bounded by
/// `connect_timeout`. Returns the stream and the address it is connected to.
pub async fn connect_any(ips: &[IpAddr], port: u16, connect_timeout: Duration) -> Result<(TcpStream, SocketAddr), DialError> {
    let mut last = DialError::NoAddress(String::from("(no address)"));
    for ip in ips {
        let addr = SocketAddr::new(*ip, port);
        match timeout(connect_timeout, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                return Ok((stream, addr));
            }
            Ok(Err(e)) if e.kind() == io::ErrorKind::ConnectionRefused => last = DialError::Refused(addr),
            Ok(Err(source)) => last = DialError::Io { addr, source },
            Err(_) => last = DialError::Timeout(addr),
        }
        tracing::debug!(dst.ip = %addr, error = %last, "dial attempt failed");
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unspecified_addresses_are_never_dialled() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap_or_else(|e| panic!("{s}: {e}"));
        let kept = dialable("a.test", vec![ip("0.0.0.0"), ip("192.0.2.1"), ip("::"), ip("::ffff:0.0.0.0"), ip("2001:db8::1")]);
        assert_eq!(kept.ok(), Some(vec![ip("192.0.2.1"), ip("2001:db8::1")]));
        let none = dialable("a.test", vec![ip("0.0.0.0"), ip("::")]).err().map(|e| e.to_string());
        assert_eq!(
            none.as_deref(),
            Some("dns: a.test resolves only to an unspecified address (0.0.0.0 or ::), which the gate never dials")
        );
        assert!(matches!(dialable("a.test", vec![]), Err(DialError::NoAddress(_))));
    }
}
