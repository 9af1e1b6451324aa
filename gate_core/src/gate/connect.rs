//! CONNECT tunnels: decide, dial, answer 200, then copy bytes both ways.

use std::net::SocketAddr;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONNECTION};
use hyper::upgrade::OnUpgrade;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::audit::fields as f;

use super::admit::admit_connect;
use super::server::Slot;
use super::respond::{self, Body};
use super::ctx::Pending;
use super::target::{split_authority, InvalidPort};
use super::{guard, Ctx};

/// A CONNECT that did not open a tunnel ends the connection: what the client sends next
/// (typically a TLS ClientHello) is not HTTP.
pub async fn handle(ctx: Arc<Ctx>, peer: SocketAddr, req: Request<Incoming>) -> Response<Body> {
    let mut resp = open(ctx, peer, req).await;
    if !resp.status().is_success() {
        resp.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

async fn open(ctx: Arc<Ctx>, peer: SocketAddr, mut req: Request<Incoming>) -> Response<Body> {
    let mut rec = ctx.record_for(f::EVENT_CONNECT, f::PROTO_CONNECT, peer, &req);
    let (host, port) = match req.uri().authority().map(split_authority) {
        Some(Ok((host, Some(port)))) => (host.to_string(), port),
        Some(Err(InvalidPort(p))) => return ctx.refuse(rec, "protocol: invalid port", &respond::invalid_port(&p)),
        Some(Ok((_, None))) | None => {
            return ctx.refuse(rec, "protocol: CONNECT without HOST:PORT", respond::CONNECT_NEEDS_PORT)
        }
    };
    let adm = match admit_connect(&ctx, &host, port) {
        Ok(adm) => adm,
        Err(e) => return ctx.refuse(rec, &format!("protocol: {e}"), &format!("gatewrap gate: {e}")),
    };
    adm.fill(&mut rec);
    if !adm.proceed {
        return adm.forbid(&ctx, rec);
    }
    let target = adm.host.with_port(port);
    let mut pending = Pending::new(ctx.clone(), rec);
    match guard::dial(&ctx, &adm).await {
        Err(e) => pending.fail(&adm, &e),
        Ok((upstream, addr)) => {
            let rec = pending.rec();
            rec.dst_ip = Some(addr.ip().to_string());
            rec.status = Some(StatusCode::OK.as_u16());
            pending.finish();
            let slot = req.extensions().get::<Slot>().cloned();
            tokio::spawn(tunnel(hyper::upgrade::on(&mut req), upstream, peer, target, slot));
            Response::new(respond::empty())
        }
    }
}

/// Runs until either side closes; `Gate::stop` aborts it with the runtime.
/// `_slot` counts the tunnel against [`super::server::MAX_CONNECTIONS`] until it ends.
async fn tunnel(upgrade: OnUpgrade, mut upstream: TcpStream, peer: SocketAddr, target: String, _slot: Option<Slot>) {
    let upgraded = match upgrade.await {
        Ok(u) => u,
        Err(e) => {
            tracing::debug!(client = %peer, dst = %target, error = %e, "downstream: client left before the tunnel opened");
            return;
        }
    };
    let mut client = TokioIo::new(upgraded);
    match tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
        Ok((up, down)) => tracing::debug!(client = %peer, dst = %target, bytes.up = up, bytes.down = down, "tunnel closed"),
        Err(e) => tracing::debug!(client = %peer, dst = %target, error = %e, "tunnel ended with an error"),
    }
}
