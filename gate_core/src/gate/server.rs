//! Accept loop and the hyper service that routes each request.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};

use crate::audit::fields as f;

use super::client::{Clients, Registration};
use super::respond::{self, Body};
use super::{connect, forward, malformed, Ctx};

/// Largest request head the gate reads, in bytes (hyper's read buffer limit); a larger
/// one gets 431 from hyper and a `malformed request` audit record.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// How long a client may take to send a complete request head (hyper then closes the
/// connection without answering; no decision, no audit record).
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

/// Most connections (tunnels and DNS-over-TCP included) one run's agent may hold open at
/// once, over all the gate's listeners. Beyond it a new connection is closed at once, so a
/// runaway agent cannot use up the gate's file descriptors; the first refusal of each burst
/// is audited.
pub const MAX_CONNECTIONS: usize = 1024;

/// A count of open connections and its cap; `what` names them in the audit record of a
/// refusal (`limit: more than 1024 open connections`).
pub(super) struct Cap {
    open: AtomicUsize,
    max: usize,
    what: &'static str,
}

impl Cap {
    pub(super) fn new(max: usize, what: &'static str) -> Arc<Cap> {
        Arc::new(Cap { open: AtomicUsize::new(0), max, what })
    }
}

/// One open client connection, counted in each of its caps until the last holder drops it
/// (a CONNECT's tunnel holds it after the request that opened it); its client's
/// registration (see `client`) lives as long.
pub(super) struct SlotGuard {
    caps: Vec<Arc<Cap>>,
    client: OnceLock<Registration>,
}

impl SlotGuard {
    fn new(caps: Vec<Arc<Cap>>) -> SlotGuard {
        SlotGuard { caps, client: OnceLock::new() }
    }

    /// Look up the process behind the connection from `peer` (see [`Clients::register`])
    /// and keep it registered while the slot lives.
    pub(super) async fn identify(&self, clients: &Arc<Clients>, stream: &TcpStream, peer: SocketAddr) {
        let Ok(local) = stream.local_addr() else { return };
        if let Some(reg) = clients.register(peer, local).await {
            let _ = self.client.set(reg);
        }
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        for cap in &self.caps {
            cap.open.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

pub(super) type Slot = Arc<SlotGuard>;

/// A slot in every one of `caps`, or the first cap that is full (nothing is taken then).
fn take(caps: &[Arc<Cap>]) -> Result<Slot, &Cap> {
    let mut taken = Vec::with_capacity(caps.len());
    for cap in caps {
        if cap.open.fetch_add(1, Ordering::Relaxed) >= cap.max {
            cap.open.fetch_sub(1, Ordering::Relaxed);
            drop(SlotGuard::new(taken));
            return Err(cap);
        }
        taken.push(cap.clone());
    }
    Ok(Arc::new(SlotGuard::new(taken)))
}

/// Accept connections on `listener` and hand each, with its slot in `caps`, to `serve` on
/// a task of its own. A connection that would exceed a cap is closed at once; the first of
/// each burst is recorded as denied (`event`, `proto`, reason `limit: more than N ...`).
pub(super) async fn accept_capped<F, Fut>(listener: TcpListener, ctx: Arc<Ctx>, caps: Vec<Arc<Cap>>, event: &'static str, proto: &'static str, serve: F)
where
    F: Fn(TcpStream, SocketAddr, Slot) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let mut over = false;
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => match take(&caps) {
                Ok(slot) => {
                    over = false;
                    ctx.spawn(serve(stream, peer, slot));
                }
                Err(full) => {
                    drop(stream);
                    if !over {
                        let mut rec = ctx.bare_record(event, proto, peer);
                        rec.decision = f::DENIED;
                        rec.reason = Some(format!("limit: more than {} {}", full.max, full.what));
                        let _ = ctx.record(rec);
                    }
                    over = true;
                }
            },
            Err(e) => {
                // EMFILE/ENFILE and friends: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Serve the proxy port: HTTP/1 connections, counted in `open` (the run's cap).
pub async fn serve(listener: TcpListener, ctx: Arc<Ctx>, open: Arc<Cap>) {
    let c = ctx.clone();
    accept_capped(listener, ctx, vec![open], f::EVENT_REQUEST, f::PROTO_HTTP, move |stream, peer, slot| {
        connection(stream, peer, c.clone(), slot)
    })
    .await
}

/// The gate's HTTP/1 server settings: head limit [`MAX_HEAD_BYTES`], head timeout
/// [`HEAD_TIMEOUT`].
pub(super) fn builder() -> http1::Builder {
    let mut b = http1::Builder::new();
    b.timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .max_buf_size(MAX_HEAD_BYTES)
        .max_header_size(MAX_HEAD_BYTES);
    b
}

async fn connection(stream: TcpStream, peer: SocketAddr, ctx: Arc<Ctx>, slot: Slot) {
    let _ = stream.set_nodelay(true);
    slot.identify(&ctx.clients, &stream, peer).await;
    let ctx_for_record = ctx.clone();
    let service = service_fn(move |mut req: Request<Incoming>| {
        let ctx = ctx.clone();
        req.extensions_mut().insert(slot.clone());
        async move { Ok::<_, Infallible>(route(ctx, peer, req).await) }
    });
    let conn = builder().serve_connection(TokioIo::new(stream), service).with_upgrades();
    if let Err(e) = conn.await {
        tracing::debug!(client = %peer, error = %e, "client connection ended with an error");
        if let Some(m) = malformed::classify(&e) {
            let mut rec = ctx_for_record.bare_record(f::EVENT_REQUEST, f::PROTO_HTTP, peer);
            rec.decision = f::DENIED;
            rec.reason = Some(m.reason());
            rec.status = m.status;
            let _ = ctx_for_record.record(rec);
        }
    }
}

async fn route(ctx: Arc<Ctx>, peer: SocketAddr, req: Request<Incoming>) -> Response<Body> {
    if req.method() == Method::CONNECT {
        return connect::handle(ctx, peer, req).await;
    }
    if super::wait_endpoint::wants(&ctx, &req) {
        return super::wait_endpoint::handle(ctx, req).await;
    }
    match req.uri().scheme_str() {
        Some("http") => forward::handle(ctx, peer, req).await,
        Some(other) => {
            let msg = respond::other_scheme(other);
            let rec = ctx.record_for(f::EVENT_REQUEST, f::PROTO_HTTP, peer, &req);
            ctx.refuse(rec, &format!("protocol: {other}:// is not forwarded"), &msg)
        }
        None => {
            let rec = ctx.record_for(f::EVENT_REQUEST, f::PROTO_HTTP, peer, &req);
            ctx.refuse(rec, "protocol: origin-form request to the gate", respond::ORIGIN_FORM)
        }
    }
}
