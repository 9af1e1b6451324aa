//! TLS to the real destination of an inspected tunnel: rustls client, verified against
//! Mozilla's roots compiled into the gate (webpki-roots) plus the PEM files the gate was
//! given (`upstream_ca`). Never the environment (`SSL_CERT_FILE` and friends are the
//! agent's business, and tests set them in gatewrap's own environment).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::policy::Host;

/// ALPN protocol the gate offers on both sides (RFC 7301): it speaks HTTP/1.1 only.
pub const HTTP11: &[u8] = b"http/1.1";

#[derive(Debug, thiserror::Error)]
pub enum RootsError {
    #[error("upstream CA file {path}: {msg}; give a PEM file of CA certificates")]
    Bad { path: PathBuf, msg: String },
}

/// The ring provider, which every TLS config of the gate uses.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn add_pem(roots: &mut RootCertStore, path: &Path) -> Result<(), RootsError> {
    let bad = |msg: String| RootsError::Bad { path: path.to_path_buf(), msg };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad("no certificate in it".into()));
    }
    for c in certs {
        roots.add(c).map_err(|e| bad(e.to_string()))?;
    }
    Ok(())
}

/// The client config: webpki roots plus `extra` PEM files; TLS 1.2 and 1.3; ALPN http/1.1.
pub fn client_config(extra: &[PathBuf]) -> Result<Arc<ClientConfig>, RootsError> {
    let mut roots = RootCertStore::from_iter(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    for path in extra {
        add_pem(&mut roots, path)?;
    }
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| RootsError::Bad { path: PathBuf::new(), msg: e.to_string() })?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![HTTP11.to_vec()];
    Ok(Arc::new(config))
}

/// Why the upstream TLS handshake failed, for the audit `error` (`upstream: tls: ...`).
pub fn describe(e: &io::Error) -> String {
    match e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) {
        Some(tls) => format!("upstream: tls: {tls}"),
        None if e.kind() == io::ErrorKind::UnexpectedEof => "upstream: tls: closed during the handshake".into(),
        None => format!("upstream: tls: {e}"),
    }
}

/// TLS over `tcp` to `host` (server name: the canonical host; an IP literal is checked
/// against the certificate's iPAddress entries).
pub async fn handshake(config: &Arc<ClientConfig>, host: &Host, tcp: TcpStream) -> Result<TlsStream<TcpStream>, String> {
    let name = match host.ip() {
        Some(ip) => ServerName::IpAddress(ip.into()),
        None => ServerName::try_from(host.to_string()).map_err(|e| format!("upstream: tls: {e}"))?,
    };
    TlsConnector::from(config.clone()).connect(name, tcp).await.map_err(|e| describe(&e))
}
