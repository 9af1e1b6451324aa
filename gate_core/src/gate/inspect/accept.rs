//! The client's side of an inspected tunnel: read its ClientHello, check the SNI against
//! the CONNECT target, and finish the handshake with the target's leaf certificate.

use std::sync::Arc;

use rustls::server::{Acceptor, ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::server::TlsStream;
use tokio_rustls::LazyConfigAcceptor;

use crate::policy::{canonical_host, Host};

use super::upstream::{provider, HTTP11};

/// Hands rustls one certificate, or none (rustls then ends the handshake with the alert
/// `access_denied`, RFC 8446 §6.2).
#[derive(Debug)]
struct Fixed(Option<Arc<CertifiedKey>>);

impl ResolvesServerCert for Fixed {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0.clone()
    }
}

fn config(leaf: Option<Arc<CertifiedKey>>) -> Arc<ServerConfig> {
    let mut c = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map(|b| b.with_no_client_auth().with_cert_resolver(Arc::new(Fixed(leaf))))
        .unwrap_or_else(|_| unreachable!("ring supports the default protocol versions"));
    c.alpn_protocols = vec![HTTP11.to_vec()];
    Arc::new(c)
}

/// Why an inspected tunnel's handshake did not finish (the audit `reason` or `error`).
#[derive(Debug, thiserror::Error)]
pub enum AcceptError {
    #[error("tls: SNI {sni:?} does not match the CONNECT host {host}")]
    SniMismatch { sni: String, host: String },
    #[error("downstream: tls: {0}")]
    Handshake(std::io::Error),
    #[error("{0}")]
    Leaf(#[from] super::leaf::LeafError),
}

/// Whether the SNI `sni` names `host` (canonically: case and a trailing dot do not matter).
/// Clients send no SNI for an IP literal (RFC 6066 §3), and none is fine.
pub fn sni_matches(sni: Option<&str>, host: &Host) -> bool {
    match sni {
        None => true,
        Some(s) => canonical_host(s).is_ok_and(|h| h == *host),
    }
}

/// Accept TLS on `io` for `host`; `leaf` makes (or fetches) the certificate once the SNI
/// has been checked. On an SNI mismatch the client gets the alert `access_denied`.
pub async fn accept<IO>(
    io: IO,
    host: &Host,
    leaf: impl FnOnce() -> Result<Arc<CertifiedKey>, super::leaf::LeafError>,
) -> Result<TlsStream<IO>, AcceptError>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let start = LazyConfigAcceptor::new(Acceptor::default(), io).await.map_err(AcceptError::Handshake)?;
    let sni = start.client_hello().server_name().map(str::to_string);
    if !sni_matches(sni.as_deref(), host) {
        // Finish with no certificate: rustls sends access_denied and fails.
        let _ = start.into_stream(config(None)).await;
        return Err(AcceptError::SniMismatch { sni: sni.unwrap_or_default(), host: host.to_string() });
    }
    let leaf = leaf()?;
    start.into_stream(config(Some(leaf))).await.map_err(AcceptError::Handshake)
}
