//! TLS inspection of CONNECT tunnels whose rule says `inspect = true`: the gate answers
//! 200, accepts TLS from the client with a leaf certificate of its own CA made for the
//! CONNECT target ([`ca`], [`leaf`], [`accept`]), serves the HTTP/1.1 requests inside
//! ([`inner`]), deciding each one, and forwards the allowed ones over TLS it verifies
//! ([`upstream`]), on connections kept between requests and tunnels (`pool`).

pub mod accept;
pub mod ca;
mod inner;
pub mod leaf;
pub mod upstream;

pub(crate) use inner::UpBody;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::upgrade::OnUpgrade;
use hyper::Request;
use hyper_util::rt::TokioIo;
use rustls::ClientConfig;

use crate::audit::fields as f;
use crate::policy::Host;

use super::server::{self, Slot};
use super::Ctx;

/// Largest request body of an inspected request, by default (16 MiB).
pub const DEFAULT_BODY_LIMIT: u64 = 16 * 1024 * 1024;

/// How the gate inspects: where its CA lives, which extra roots it trusts upstream, and
/// the largest request body it forwards.
#[derive(Debug, Clone)]
pub struct InspectSettings {
    /// The CA directory ([`ca::DEFAULT_CA_DIR`] for gatewrap runs); `None`: inspection is
    /// off and a CONNECT an `inspect` rule allows is answered 502.
    pub ca_dir: Option<PathBuf>,
    /// PEM files of CA certificates trusted upstream besides Mozilla's roots.
    pub upstream_ca: Vec<PathBuf>,
    /// Largest request body, in bytes; a larger one gets 413.
    pub body_limit: u64,
}

impl Default for InspectSettings {
    fn default() -> Self {
        InspectSettings { ca_dir: None, upstream_ca: Vec::new(), body_limit: DEFAULT_BODY_LIMIT }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error("{0}")]
    Ca(#[from] ca::CaError),
    #[error("{0}")]
    Roots(#[from] upstream::RootsError),
}

/// What inspected tunnels share: the CA, its leaves, the upstream TLS config.
pub struct Inspector {
    pub ca: ca::Ca,
    pub leaves: leaf::LeafCache,
    upstream: Arc<ClientConfig>,
    body_limit: u64,
}

impl Inspector {
    /// Load (or make) the CA and read the extra upstream roots; `None` when inspection is off.
    pub fn new(s: &InspectSettings) -> Result<Option<Inspector>, InspectError> {
        let Some(dir) = &s.ca_dir else { return Ok(None) };
        Ok(Some(Inspector {
            ca: ca::Ca::load_or_create(dir)?,
            leaves: leaf::LeafCache::default(),
            upstream: upstream::client_config(&s.upstream_ca)?,
            body_limit: s.body_limit,
        }))
    }
}

/// One inspected tunnel: the CONNECT target every inner request must name.
pub(super) struct Tunnel {
    pub host: Host,
    pub port: u16,
    pub peer: SocketAddr,
    pub inspector: Arc<Inspector>,
}

/// Run an inspected tunnel to its end: TLS with the client, then its requests.
/// `_slot` counts it against [`server::MAX_CONNECTIONS`] until it ends.
pub(super) async fn serve(ctx: Arc<Ctx>, upgrade: OnUpgrade, tunnel: Tunnel, _slot: Option<Slot>) {
    let upgraded = match upgrade.await {
        Ok(u) => u,
        Err(e) => return tracing::debug!(client = %tunnel.peer, error = %e, "downstream: client left before the tunnel opened"),
    };
    let tunnel = Arc::new(tunnel);
    let t = tunnel.clone();
    let leaf = move || t.inspector.leaves.get(&t.inspector.ca, &t.host);
    let handshake = accept::accept(TokioIo::new(upgraded), &tunnel.host, leaf);
    let tls = match tokio::time::timeout(server::HEAD_TIMEOUT, handshake).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => return refused_handshake(&ctx, &tunnel, &e),
        Err(_) => return tracing::debug!(client = %tunnel.peer, "downstream: tls handshake timed out"),
    };
    let (c, peer) = (ctx.clone(), tunnel.peer);
    let service = service_fn(move |req: Request<Incoming>| {
        let (ctx, tunnel) = (c.clone(), tunnel.clone());
        async move { Ok::<_, Infallible>(inner::handle(ctx, tunnel, req).await) }
    });
    let conn = server::builder().serve_connection(TokioIo::new(tls), service).with_upgrades();
    if let Err(e) = conn.await {
        tracing::debug!(error = %e, "inspected connection ended with an error");
        if let Some(m) = super::malformed::classify(&e) {
            let mut rec = ctx.bare_record(f::EVENT_REQUEST, f::PROTO_HTTPS, peer);
            rec.decision = f::DENIED;
            rec.reason = Some(m.reason());
            rec.status = m.status;
            let _ = ctx.record(rec);
        }
    }
}

/// Record a handshake that did not finish: an SNI mismatch is a denial, anything else (the
/// client does not trust the gate's CA, or left) a downstream failure.
fn refused_handshake(ctx: &Ctx, tunnel: &Tunnel, e: &accept::AcceptError) {
    let mut rec = ctx.bare_record(f::EVENT_REQUEST, f::PROTO_HTTPS, tunnel.peer);
    rec.target = Some(tunnel.host.with_port(tunnel.port));
    rec.dst_host = Some(tunnel.host.to_string());
    rec.dst_port = Some(tunnel.port);
    match e {
        accept::AcceptError::SniMismatch { .. } => {
            rec.decision = f::DENIED;
            rec.reason = Some(e.to_string());
        }
        _ => {
            rec.decision = f::FAILED;
            rec.error = Some(e.to_string());
        }
    }
    let _ = ctx.record(rec);
}
