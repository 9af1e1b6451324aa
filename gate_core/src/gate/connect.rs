//! CONNECT tunnels: decide (an `ask` is held for a human, `hold`), write the `admit`
//! record, dial, answer 200, then copy bytes both ways; or, when the rule says `inspect = true`, answer 200 and inspect the tunnel
//! (`inspect`).

use std::net::SocketAddr;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONNECTION};
use hyper::upgrade::OnUpgrade;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::audit::{fields as f, GateRecord};

use super::admit::{admit_connect, Admission};
use super::idle::{self, Ended};
use super::server::{Slot, SlotGuard};
use super::respond::{self, Body};
use super::ctx::Pending;
use super::target::{split_authority, InvalidPort};
use super::{guard, hold, inspect, secrets, splice, Ctx};

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
    // Before the host is judged: a placeholder is no valid name (`_`), and must be told as what it is.
    if let Err(answer) = secrets::screen_connect(&ctx, &mut rec, &host) {
        return answer;
    }
    let adm = match admit_connect(&ctx, &host, port) {
        Ok(adm) => adm,
        Err(e) => return ctx.refuse(rec, &format!("protocol: {e}"), &format!("gatewrap gate: {e}")),
    };
    adm.fill(&mut rec);
    // An `ask`: held until a human decides on the tunnel itself (`hold`); a yes opens it once.
    let mut sending = None;
    if hold::applies(&ctx, &adm) {
        match hold::hold_tunnel(&ctx, &adm, &mut rec, req.headers()).await {
            Ok(s) => sending = s,
            Err(answer) => return answer,
        }
    } else if !adm.proceed {
        return adm.forbid(&ctx, rec);
    }
    let target = adm.host.with_port(port);
    if adm.decision.inspect {
        return inspect_tunnel(ctx, peer, req, rec, adm).await;
    }
    if let Err(unrecorded) = ctx.admit(&rec).await {
        return unrecorded;
    }
    let mut pending = Pending::new(ctx.clone(), rec);
    match guard::dial(&ctx, &adm, sending.as_mut().and_then(hold::Sending::early)).await {
        Err(e) => {
            hold::not_sent(sending, &e);
            pending.fail(&adm, &e)
        }
        Ok((upstream, addr)) => {
            let rec = pending.rec();
            rec.dst_ip = Some(addr.ip().to_string());
            rec.status = Some(StatusCode::OK.as_u16());
            pending.finish();
            if let Some(s) = sending.as_mut() {
                s.status = Some(StatusCode::OK.as_u16());
            }
            let slot = req.extensions().get::<Slot>().cloned();
            ctx.spawn(tunnel(ctx.clone(), hyper::upgrade::on(&mut req), upstream, peer, target, slot));
            Response::new(respond::empty())
        }
    }
}

/// An `inspect` rule allowed the CONNECT: write its `admit` record (503 if it cannot be
/// written), answer 200 without dialing (the leaf is made from the CONNECT target) and
/// serve the tunnel's requests (see [`inspect`]), each admitted on its own. Without a CA
/// the gate cannot inspect, and says so (502).
async fn inspect_tunnel(ctx: Arc<Ctx>, peer: SocketAddr, mut req: Request<Incoming>, mut rec: GateRecord, adm: Admission) -> Response<Body> {
    let Some(inspector) = ctx.inspector.clone() else {
        let cause = "tls: inspection is off (the gate has no CA); gatewrap run sets one up when the policy has an inspect rule";
        let resp = respond::bad_gateway(&adm.host.with_port(adm.port), cause);
        rec.decision = f::FAILED;
        rec.error = Some(cause.into());
        rec.status = Some(resp.status().as_u16());
        return ctx.answer_recorded(rec, resp);
    };
    rec.status = Some(StatusCode::OK.as_u16());
    rec.inspected = true;
    if let Err(unrecorded) = ctx.admit(&rec).await {
        return unrecorded;
    }
    ctx.record_queued(rec);
    let slot = req.extensions().get::<Slot>().cloned();
    let tunnel = inspect::Tunnel {
        host: adm.host,
        port: adm.port,
        peer,
        inspector,
    };
    let upgrade = hyper::upgrade::on(&mut req);
    ctx.clone().spawn(inspect::serve(ctx, upgrade, tunnel, slot));
    Response::new(respond::empty())
}

/// Runs until either side closes, or nothing crossed it for `idle` (see [`splice::relay`]);
/// `Gate::stop` drops it (see `tasks`), which closes both sockets.
/// `slot` counts the tunnel against [`super::server::MAX_CONNECTIONS`] until it ends, or
/// until its client has finished sending: from then on it is counted as half-closed while
/// upstream's end is awaited, or, that bound full, the tunnel ends there and the refusal is
/// recorded (see [`super::server::SlotGuard::client_finished`]).
async fn tunnel(ctx: Arc<Ctx>, upgrade: OnUpgrade, upstream: TcpStream, peer: SocketAddr, target: String, slot: Option<Slot>) {
    let idle = ctx.idle_timeout;
    let upgraded = match upgrade.await {
        Ok(u) => u,
        Err(e) => {
            tracing::debug!(client = %peer, dst = %target, error = %e, "downstream: client left before the tunnel opened");
            return;
        }
    };
    // The client's socket as the gate accepted it (server.rs), for splice(2); any other
    // stream, or no pipe to be had, is copied.
    let ended = match upgraded.downcast::<TokioIo<TcpStream>>() {
        Ok(parts) => {
            let down = parts.io.into_inner();
            let finished = || match slot.as_deref().map(SlotGuard::client_finished) {
                Some(Err(full)) => {
                    let mut rec = ctx.bare_record(f::EVENT_CONNECT, f::PROTO_CONNECT, peer);
                    rec.decision = f::DENIED;
                    rec.reason = Some(full.reason());
                    rec.target = Some(target.clone());
                    ctx.record_queued(rec);
                    false
                }
                _ => true,
            };
            // A run over its share while the process is short of descriptors takes no pipes
            // for its tunnel (see `fd_room`): its bytes are copied instead.
            let spliced = match super::fd_room::short_now(ctx.held(), 2) {
                true => Err(std::io::Error::other("the gate's process is short of file descriptors")),
                false => splice::relay(&down, &parts.read_buf, &upstream, idle, finished).await,
            };
            match spliced {
                Ok(ended) => ended,
                Err(e) => {
                    tracing::debug!(client = %peer, dst = %target, error = %e, "tunnel: no pipe for splice; copying");
                    let mut upstream = upstream;
                    match upstream.write_all(&parts.read_buf).await {
                        Ok(()) => idle::relay(down, upstream, idle).await,
                        Err(e) => Ended::Error(e),
                    }
                }
            }
        }
        Err(upgraded) => idle::relay(TokioIo::new(upgraded), upstream, idle).await,
    };
    match ended {
        Ended::Closed(up, down) => tracing::debug!(client = %peer, dst = %target, bytes.up = up, bytes.down = down, "tunnel closed"),
        Ended::Error(e) => tracing::debug!(client = %peer, dst = %target, error = %e, "tunnel ended with an error"),
        Ended::Idle => tracing::debug!(client = %peer, dst = %target, "tunnel closed: idle"),
    }
}
