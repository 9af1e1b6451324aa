//! Accept loop and the hyper service that routes each request.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};

use super::respond::{self, Body};
use super::{connect, forward, Ctx};

/// Largest request head the gate reads (hyper's read buffer limit).
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// How long a client may take to send a complete request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

pub async fn serve(listener: TcpListener, ctx: Arc<Ctx>) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                tokio::spawn(connection(stream, peer, ctx.clone()));
            }
            Err(e) => {
                // EMFILE/ENFILE and friends: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn connection(stream: TcpStream, peer: SocketAddr, ctx: Arc<Ctx>) {
    let _ = stream.set_nodelay(true);
    let service = service_fn(move |req| {
        let ctx = ctx.clone();
        async move { Ok::<_, Infallible>(route(ctx, peer, req).await) }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .max_buf_size(MAX_HEAD_BYTES)
        .max_header_size(MAX_HEAD_BYTES)
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    if let Err(e) = conn.await {
        tracing::debug!(client = %peer, error = %e, "client connection ended with an error");
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
            let rec = ctx.record_for(crate::audit::fields::EVENT_REQUEST, crate::audit::fields::PROTO_HTTP, peer, &req);
            ctx.refuse(rec, &format!("protocol: {other}:// is not forwarded"), &msg)
        }
        None => {
            let rec = ctx.record_for(crate::audit::fields::EVENT_REQUEST, crate::audit::fields::PROTO_HTTP, peer, &req);
            ctx.refuse(rec, "protocol: origin-form request to the gate", respond::ORIGIN_FORM)
        }
    }
}
