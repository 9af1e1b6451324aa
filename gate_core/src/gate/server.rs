//! Accept loop and the hyper service that routes each request.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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

/// Most CONNECT tunnels of one run that are half-closed, counted apart from
/// [`MAX_CONNECTIONS`]: their client has finished sending (the gate read its FIN and passed it
/// upstream) and the gate waits for upstream's end, which a client that closed for good no
/// longer holds. Counted as open, they had a client that opens and closes tunnels quickly
/// (Go's `http.Transport` closes the surplus connections it dialled) refused while it held
/// far fewer than [`MAX_CONNECTIONS`]: every tunnel it had closed waited on a busy upstream
/// (bench/README.md, the kept-alive CONNECT cells). A client that only half-closed still
/// holds its tunnel, so these have a bound too: beyond it a tunnel is closed when its client
/// finishes sending (as Squid's tunnel.cc does with every one, and nginx's stream proxy with
/// `proxy_half_close off`, its default), and that is audited (`limit: more than 1024
/// half-closed tunnels`). A run's connections are thus at most the sum of both bounds.
pub const MAX_HALF_CLOSED: usize = 1024;

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

    /// Take a place; false (nothing taken) when all `max` are taken.
    fn try_take(&self) -> bool {
        if self.open.fetch_add(1, Ordering::Relaxed) >= self.max {
            self.open.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        true
    }

    fn release(&self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }

    /// Places taken now.
    pub(super) fn taken(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// The audit reason of a refusal by this cap: `limit: more than 1024 open connections`.
    pub(super) fn reason(&self) -> String {
        format!("limit: more than {} {}", self.max, self.what)
    }
}

/// One open client connection, counted in each of its caps until the last holder drops it
/// (a CONNECT's tunnel holds it after the request that opened it), or, once its client has
/// finished sending, in `half_closed` instead if that has room (see
/// [`SlotGuard::client_finished`]); its client's registration (see `client`) lives as long.
pub(super) struct SlotGuard {
    caps: Vec<Arc<Cap>>,
    half_closed: Option<Arc<Cap>>,
    /// Counted in `half_closed`, no longer in `caps`.
    moved: AtomicBool,
    client: OnceLock<Registration>,
}

impl SlotGuard {
    fn new(caps: Vec<Arc<Cap>>, half_closed: Option<Arc<Cap>>) -> SlotGuard {
        SlotGuard { caps, half_closed, moved: AtomicBool::new(false), client: OnceLock::new() }
    }

    /// The client finished sending (a tunnel read its FIN and passed it upstream): count the
    /// connection in the listener's half-closed cap ([`MAX_HALF_CLOSED`]) from now on and free
    /// its places in the others. `Err(cap)`: that cap is full, the connection stays counted
    /// as it was and should end (the caller records the refusal, naming `cap`). Idempotent;
    /// without a half-closed cap (DNS over TCP) nothing changes and it is `Ok`.
    pub(super) fn client_finished(&self) -> Result<(), &Cap> {
        let Some(half_closed) = &self.half_closed else { return Ok(()) };
        if self.moved.load(Ordering::Acquire) {
            return Ok(());
        }
        if !half_closed.try_take() {
            return Err(half_closed);
        }
        if self.moved.swap(true, Ordering::AcqRel) {
            half_closed.release();
            return Ok(());
        }
        for cap in &self.caps {
            cap.release();
        }
        Ok(())
    }

    /// Look up the process behind the connection from `peer` (see [`Clients::register`])
    /// and keep it registered while the slot lives.
    pub(super) async fn identify(&self, clients: &Arc<Clients>, stream: &TcpStream, peer: SocketAddr) {
        let Ok(local) = stream.local_addr().map(super::netns::canonical) else { return };
        if let Some(reg) = clients.register(peer, local).await {
            let _ = self.client.set(reg);
        }
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        match &self.half_closed {
            Some(half_closed) if self.moved.load(Ordering::Acquire) => half_closed.release(),
            _ => {
                for cap in &self.caps {
                    cap.release();
                }
            }
        }
    }
}

pub(super) type Slot = Arc<SlotGuard>;

/// A slot in every one of `caps` (later movable to `half_closed`), or the first cap that is
/// full (nothing is taken then).
fn take<'a>(caps: &'a [Arc<Cap>], half_closed: &Option<Arc<Cap>>) -> Result<Slot, &'a Cap> {
    let mut taken = Vec::with_capacity(caps.len());
    for cap in caps {
        if !cap.try_take() {
            drop(SlotGuard::new(taken, None));
            return Err(cap);
        }
        taken.push(cap.clone());
    }
    Ok(Arc::new(SlotGuard::new(taken, half_closed.clone())))
}

/// A slot for the connection just accepted (see [`take`]), or the audit reason of its
/// refusal: a cap is full, or the process is short of descriptors and the run holds its
/// share of them or more (see [`super::fd_room`]; `caps[0]` is the run's own count).
fn admit(caps: &[Arc<Cap>], half_closed: &Option<Arc<Cap>>) -> Result<Slot, String> {
    let held = caps.first().map_or(0, |c| c.taken()) + half_closed.as_ref().map_or(0, |c| c.taken());
    if super::fd_room::short_now(held, 1) {
        return Err(format!(
            "limit: the gate's process is short of file descriptors and this run holds {held} connections (its share: {})",
            super::fd_room::FAIR_SHARE
        ));
    }
    take(caps, half_closed).map_err(Cap::reason)
}

/// Accept connections on `listener` and hand each, with its slot in `caps`, to `serve` on
/// a task of its own; `half_closed`: where a tunnel whose client finished sending is counted
/// instead (see [`SlotGuard::client_finished`]). A connection that would exceed a cap is
/// closed at once and recorded as denied (`event`, `proto`, reason `limit: more than N
/// ...`): a `request` one each, folded with its repeats (see `fold`: one record a second
/// carries their count), a `dns` one the first of each burst.
pub(super) async fn accept_capped<F, Fut>(listener: TcpListener, ctx: Arc<Ctx>, caps: Vec<Arc<Cap>>, half_closed: Option<Arc<Cap>>, event: &'static str, proto: &'static str, serve: F)
where
    F: Fn(TcpStream, SocketAddr, Slot) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let mut over = false;
    loop {
        match listener.accept().await.map(|(stream, peer)| (stream, super::netns::canonical(peer))) {
            Ok((stream, peer)) => match admit(&caps, &half_closed) {
                Ok(slot) => {
                    over = false;
                    ctx.spawn(serve(stream, peer, slot));
                }
                Err(reason) => {
                    drop(stream);
                    // A refused request folds (see `fold`): each is counted in a record. The
                    // DNS stub's records do not fold: the first of a burst stands for it.
                    if !over || event == f::EVENT_REQUEST {
                        let mut rec = ctx.bare_record(event, proto, peer);
                        rec.decision = f::DENIED;
                        rec.reason = Some(reason);
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

/// Serve the proxy port: HTTP/1 connections, counted in `open` (the run's cap), a tunnel
/// whose client finished sending in `half_closed` instead while it has room.
pub async fn serve(listener: TcpListener, ctx: Arc<Ctx>, open: Arc<Cap>, half_closed: Arc<Cap>) {
    let c = ctx.clone();
    accept_capped(listener, ctx, vec![open], Some(half_closed), f::EVENT_REQUEST, f::PROTO_HTTP, move |stream, peer, slot| {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(open: &Arc<Cap>, half_closed: &Arc<Cap>) -> Result<Slot, ()> {
        take(std::slice::from_ref(open), &Some(half_closed.clone())).map_err(|_| ())
    }

    /// A tunnel's place moves to the half-closed cap when its client finished sending; while
    /// that cap is full it stays where it was and the refusal names the cap; each place is
    /// freed once, when its slot ends.
    #[test]
    fn a_finished_client_frees_its_open_place_while_the_half_closed_cap_has_room() {
        let (open, half_closed) = (Cap::new(2, "open connections"), Cap::new(1, "half-closed tunnels"));
        let a = slot(&open, &half_closed).expect("room for the first");
        let b = slot(&open, &half_closed).expect("room for the second");
        assert!(slot(&open, &half_closed).is_err(), "two open: the cap is full");
        assert!(a.client_finished().is_ok(), "a's client finished: a is counted as half-closed");
        assert!(a.client_finished().is_ok(), "told twice, counted once");
        assert_eq!((open.taken(), half_closed.taken()), (1, 1));
        let c = slot(&open, &half_closed).expect("a's open place is free again");
        let full = b.client_finished().map_err(Cap::reason);
        assert_eq!(full, Err("limit: more than 1 half-closed tunnels".to_string()), "the half-closed cap is full");
        assert_eq!((open.taken(), half_closed.taken()), (2, 1), "b stays counted as open until it ends");
        assert!(slot(&open, &half_closed).is_err(), "b and c open: full again");
        drop(a);
        assert_eq!((open.taken(), half_closed.taken()), (2, 0), "a freed its half-closed place, not an open one");
        drop((b, c));
        assert_eq!((open.taken(), half_closed.taken()), (0, 0));
    }

    /// Without a half-closed cap (DNS over TCP) a finished client changes nothing.
    #[test]
    fn without_a_half_closed_cap_a_finished_client_stays_counted() {
        let (open, dns) = (Cap::new(4, "open connections"), Cap::new(2, "open DNS-over-TCP connections"));
        let s = take(&[open.clone(), dns.clone()], &None).map_err(|_| ()).expect("room");
        assert!(s.client_finished().is_ok());
        assert_eq!((open.taken(), dns.taken()), (1, 1));
        drop(s);
        assert_eq!((open.taken(), dns.taken()), (0, 0));
    }
}
