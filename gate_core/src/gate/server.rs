//! Accept loop and the hyper service that routes each request.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};

use crate::audit::fields as f;

use super::respond::{self, Body};
use super::{connect, forward, malformed, Ctx};

/// Largest request head the gate reads, in bytes (hyper's read buffer limit); a larger
/// one gets 431 from hyper and a `malformed request` audit record.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// How long a client may take to send a complete request head (hyper then closes the
/// connection without answering; no decision, no audit record).
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

/// Most connections (tunnels included) one run's agent may hold open at once. Beyond it
/// a new connection is closed at once, so a runaway agent cannot use up the gate's file
/// descriptors; the first refusal of each burst is audited.
pub const MAX_CONNECTIONS: usize = 1024;

/// One open client connection; shared with its tunnel after CONNECT, and counted in the
/// gate's open connections until the last holder drops it.
pub(super) struct SlotGuard(Arc<AtomicUsize>);

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

pub(super) type Slot = Arc<SlotGuard>;

pub async fn serve(listener: TcpListener, ctx: Arc<Ctx>, open: Arc<AtomicUsize>) {
    let mut over = false;
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                if open.load(Ordering::Relaxed) >= MAX_CONNECTIONS {
                    drop(stream);
                    if !over {
                        let mut rec = ctx.bare_record(f::EVENT_REQUEST, f::PROTO_HTTP, peer);
                        rec.decision = f::DENIED;
                        rec.reason = Some(format!("limit: more than {MAX_CONNECTIONS} open connections"));
                        ctx.record(rec);
                    }
                    over = true;
                    continue;
                }
                over = false;
                open.fetch_add(1, Ordering::Relaxed);
                let slot = Arc::new(SlotGuard(open.clone()));
                tokio::spawn(connection(stream, peer, ctx.clone(), slot));
            }
            Err(e) => {
                // EMFILE/ENFILE and friends: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
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
            ctx_for_record.record(rec);
        }
    }
}

async fn route(ctx: Arc<Ctx>, peer: SocketAddr, req: Request<Incoming>) -> Response<Body> {
    if req.method() == Method::CONNECT {
        return connect::handle(ctx, peer, req).await;
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
