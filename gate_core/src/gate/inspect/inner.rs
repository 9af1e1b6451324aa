//! One request inside an inspected tunnel: check that it names the tunnel's host, decide
//! it ([`admit_request`], scheme https), write its `admit` record (503 if it cannot be
//! written), and forward it over verified TLS; or answer 4xx.
//!
//! Refusals, each audited: another host in `Host` or the target (421 Misdirected
//! Request, RFC 9110 §15.5.20), a CONNECT (400), `Upgrade: h2c` (400), a declared body
//! over the limit (413). A streamed body found over the limit also gets 413, but its
//! record stays `allowed` (with the limit as `error`): part of it has reached upstream.

use std::error::Error as _;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HeaderValue, CONTENT_LENGTH, HOST};
use hyper::http::uri::Authority;
use hyper::{Method, Request, Response, StatusCode, Uri, Version};
use hyper_util::rt::TokioIo;

use crate::audit::fields as f;
use crate::policy::{canonical_host, Host, RequestFacts, Scheme};

use super::super::admit::admit_request;
use super::super::hold;
use super::super::metered::{Counted, Outcome, Recorded};
use super::super::dial::{self, DialError};
use super::super::pool::Key;
use super::super::ctx::Pending;
use super::super::respond::{self, Body};
use super::super::target::{split_authority, upstream_target, ASTERISK_REASON, ASTERISK_REFUSED};
use super::super::upgrade::{self, Asked};
use super::super::{forward, guard, secrets, strip_hop_by_hop, Ctx};
use super::{upstream, Tunnel};

/// The body of a request to upstream: the agent's, streamed under the limit, or a held
/// request's, approved and whole.
pub(crate) type UpBody = http_body_util::combinators::UnsyncBoxBody<bytes::Bytes, Box<dyn std::error::Error + Send + Sync>>;
pub(crate) type Sender = SendRequest<UpBody>;

const HTTPS_DEFAULT_PORT: u16 = 443;
/// The audit `error` of an upstream that did not finish its TLS handshake within the
/// gate's connect timeout (answered 504).
const TLS_TIMEOUT: &str = "upstream: tls: timeout during the handshake";

/// `host[:port]` as the tunnel's requests name it (port omitted when 443).
fn authority_of(host: &Host, port: u16) -> String {
    match (host, port) {
        (Host::V6(a), HTTPS_DEFAULT_PORT) => format!("[{a}]"),
        (h, HTTPS_DEFAULT_PORT) => h.to_string(),
        (h, p) => h.with_port(p),
    }
}

/// Whether `value` (a Host header or a target's authority) names `host:port` canonically.
fn names(value: &str, host: &Host, port: u16) -> bool {
    value
        .parse::<Authority>()
        .ok()
        .filter(|a| !a.as_str().contains('@'))
        .and_then(|a| {
            let (h, p) = split_authority(&a).ok()?;
            Some((canonical_host(h).ok()?, p.unwrap_or(HTTPS_DEFAULT_PORT)))
        })
        .is_some_and(|(h, p)| h == *host && p == port)
}

/// `None` when the request names the tunnel's host (exactly one Host header, and the
/// target's authority if it has one); else what it names instead.
fn misdirected<B>(req: &Request<B>, host: &Host, port: u16) -> Option<String> {
    let hosts: Vec<&str> = req.headers().get_all(HOST).iter().map(|v| v.to_str().unwrap_or("(not text)")).collect();
    if let Some(a) = req.uri().authority() {
        if !names(a.as_str(), host, port) {
            return Some(format!("target {a}"));
        }
    }
    match hosts.as_slice() {
        [one] if names(one, host, port) => None,
        [one] => Some(format!("Host {one}")),
        [] => Some("no Host header".into()),
        _ => Some("more than one Host header".into()),
    }
}

fn too_large(limit: u64) -> (String, String) {
    (
        format!("limit: request body over {limit} bytes"),
        format!("gatewrap gate: the request body is over the gate's limit of {limit} bytes for inspected https requests\n"),
    )
}

pub(super) async fn handle(ctx: Arc<Ctx>, tunnel: Arc<Tunnel>, req: Request<Incoming>) -> Response<Body> {
    let started = Instant::now();
    let (host, port) = (&tunnel.host, tunnel.port);
    let mut rec = ctx.record_for(f::EVENT_REQUEST, f::PROTO_HTTPS, tunnel.peer, &req);
    let target = upstream_target(req.method(), req.uri());
    // `OPTIONS *` is recorded as the bare origin (RFC 9112 §3.2.4: the URI it stands for).
    rec.target = Some(match &target {
        Some(pq) if pq.as_str() != "*" => format!("https://{}{pq}", authority_of(host, port)),
        _ => format!("https://{}", authority_of(host, port)),
    });
    rec.dst_host = Some(host.to_string());
    rec.dst_port = Some(port);
    let Some(pq) = target else {
        return ctx.refuse_with(rec, StatusCode::BAD_REQUEST, ASTERISK_REASON.into(), format!("{ASTERISK_REFUSED}\n"));
    };
    if let Some(other) = misdirected(&req, host, port) {
        let hp = host.with_port(port);
        let body = format!("gatewrap gate: this tunnel is to {hp}; the request names {other}. Open a tunnel (CONNECT) to the host you mean\n");
        return ctx.refuse_with(rec, StatusCode::MISDIRECTED_REQUEST, format!("protocol: host mismatch ({other}, tunnel to {hp})"), body);
    }
    if req.method() == Method::CONNECT {
        let body = "gatewrap gate: CONNECT inside an inspected tunnel is refused; send the request itself\n".to_string();
        return ctx.refuse_with(rec, StatusCode::BAD_REQUEST, "protocol: CONNECT inside an inspected tunnel".into(), body);
    }
    let asked = upgrade::asked(req.headers());
    if let Some((reason, body)) = forward::header_refusal(asked, req.headers()) {
        return ctx.refuse_with(rec, StatusCode::BAD_REQUEST, reason.into(), format!("{body}\n"));
    }
    let limit = tunnel.inspector.body_limit;
    let declared = req.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        let (reason, body) = too_large(limit);
        return ctx.refuse_with(rec, StatusCode::PAYLOAD_TOO_LARGE, reason, body);
    }
    let facts = RequestFacts { host, port, scheme: Scheme::Https, method: req.method().as_str(), path: pq.as_str() };
    let adm = admit_request(&ctx, &facts);
    adm.fill(&mut rec);
    let mut req = req.map(|b| Limited::new(b, limit as usize).boxed_unsync());
    let pq = match secrets::screen(&ctx, &adm, &mut rec, req.headers_mut(), pq) {
        Ok(pq) => pq,
        Err(answer) => return answer,
    };
    let held = hold::applies(&ctx, &adm);
    if !held && !adm.proceed {
        return adm.forbid(&ctx, rec);
    }
    let (mut parts, body) = req.into_parts();
    let body = match secrets::screen_body(&ctx, &adm, &mut rec, body).await {
        Ok(body) => body.boxed_unsync(),
        Err(answer) => return answer,
    };
    let mut sending = None;
    let mut req = if held {
        let (body, s) = match hold::hold_request(&ctx, &adm, &mut rec, &mut parts, body, Scheme::Https, pq.as_str(), limit as usize).await {
            Ok(go) => go,
            Err(answer) => return answer,
        };
        sending = s;
        let full = http_body_util::Full::new(body).map_err(|never| -> Box<dyn std::error::Error + Send + Sync> { match never {} });
        Request::from_parts(parts, full.boxed_unsync())
    } else {
        Request::from_parts(parts, body)
    };
    if let Err(unrecorded) = ctx.admit(&rec).await {
        return unrecorded;
    }
    let mut pending = Pending::new(ctx.clone(), rec);
    // The SSRF guard on every request; a kept connection only to an address it kept now.
    let vetted = match guard::vetted(&ctx, &adm, sending.as_mut().and_then(hold::Sending::early)).await {
        Ok(ips) => ips,
        Err(e) => {
            hold::not_sent(sending, &e);
            return pending.fail(&adm, &e);
        }
    };
    let key = |addr| Key { scheme: "https", host: host.clone(), rule: adm.decision.rule.clone(), addr };
    let (sender, key, reused) = match ctx.inspected.take_vetted(&vetted, port, key) {
        Some((key, sender)) => (sender, key, true),
        None => match connect(&ctx, &tunnel, &vetted).await {
            Ok((sender, addr)) => (sender, key(addr), false),
            Err(Failure::Dial(e)) => {
                hold::not_sent(sending, &e);
                return pending.fail(&adm, &e);
            }
            Err(Failure::After(addr, cause)) => return after_dial(pending, &host.with_port(port), addr, cause),
        },
    };
    let addr = key.addr;
    pending.rec().dst_ip = Some(addr.ip().to_string());
    let down_upgrade = (asked == Asked::WebSocket).then(|| hyper::upgrade::on(&mut req));
    let (mut parts, body) = req.into_parts();
    // `Connection: close` from the client ends the client's own connection (hop-by-hop,
    // RFC 9110 §7.6.1): the upstream one is pooled for the run's other tunnels, as on the
    // plain path.
    parts.uri = Uri::from(pq);
    parts.version = Version::HTTP_11;
    strip_hop_by_hop(&mut parts.headers);
    if down_upgrade.is_some() {
        upgrade::keep_websocket(&mut parts.headers);
    }
    if let Ok(h) = HeaderValue::from_str(&authority_of(host, port)) {
        parts.headers.insert(HOST, h);
    }
    secrets::inject(&ctx, &adm, &mut parts);
    let up = Arc::new(AtomicU64::new(0));
    let body = Counted::new(body, up.clone()).boxed_unsync();
    let result = send(&ctx, &tunnel, sender, reused, addr, Request::from_parts(parts, body)).await;
    match result {
        Ok((resp, sender)) => {
            pending.rec().status = Some(resp.status().as_u16());
            if let Some(s) = sending.as_mut() {
                s.status = Some(resp.status().as_u16());
            }
            match down_upgrade {
                Some(down) if resp.status() == StatusCode::SWITCHING_PROTOCOLS => {
                    pending.finish();
                    upgrade::switch(&ctx, down, resp, host.with_port(port))
                }
                _ => {
                    ctx.inspected.give_back(key, sender);
                    let (mut parts, body) = resp.into_parts();
                    strip_hop_by_hop(&mut parts.headers);
                    let (body, masked) = secrets::mask(&ctx.secrets, &mut parts.headers, body);
                    masked.fetch_add(secrets::mask_reason(&ctx.secrets, &mut parts.extensions), Ordering::Relaxed);
                    // The record is written at the body's end, with its bytes and duration.
                    let body = Recorded::new(body, Outcome { pending, started, up, masked });
                    Response::from_parts(parts, body.boxed())
                }
            }
        }
        Err(Sent::Dial(addr, cause)) => after_dial(pending, &host.with_port(port), addr, cause),
        Err(Sent::Http(e)) if e.source().is_some_and(|s| s.downcast_ref::<LengthLimitError>().is_some()) => {
            // Found while streaming: the head and up to `limit` bytes of the body have gone
            // upstream, so the record stays `allowed` (it must not say nothing left).
            let (reason, body) = too_large(limit);
            let rec = pending.rec();
            rec.error = Some(format!("{reason}; its head and up to {limit} bytes of its body were sent upstream"));
            rec.status = Some(StatusCode::PAYLOAD_TOO_LARGE.as_u16());
            pending.finish();
            respond::text(StatusCode::PAYLOAD_TOO_LARGE, "denied", body)
        }
        Err(Sent::Http(e)) => pending.send_failed(&host.with_port(port), forward::send_failure(&e)),
    }
}

/// Why a request got no response: a kept connection upstream had closed and the new one
/// to the same address failed (as [`Failure::After`]), or the exchange itself failed.
enum Sent {
    Dial(SocketAddr, String),
    Http(hyper::Error),
}

/// Send `req` on `sender` (to `addr`); a kept connection (`reused`) that upstream closed
/// before the request was written is replaced by a new one to the same address, once
/// (hyper hands the request back: nothing of it reached upstream). Returns the response
/// head and the connection it came on.
async fn send(ctx: &Ctx, tunnel: &Tunnel, mut sender: Sender, reused: bool, addr: SocketAddr, req: Request<UpBody>)
    -> Result<(Response<Incoming>, Sender), Sent> {
    match sender.try_send_request(req).await {
        Ok(resp) => Ok((resp, sender)),
        Err(mut e) => match e.take_message() {
            Some(req) if reused => {
                tracing::debug!(dst.ip = %addr, error = %e.error(), "kept connection closed; dialling again");
                let (mut fresh, _) = connect(ctx, tunnel, &[addr.ip()]).await.map_err(|f| match f {
                    Failure::Dial(d) => Sent::Dial(addr, d.to_string()),
                    Failure::After(a, cause) => Sent::Dial(a, cause),
                })?;
                let resp = fresh.send_request(req).await.map_err(Sent::Http)?;
                Ok((resp, fresh))
            }
            _ => Err(Sent::Http(e.into_error())),
        },
    }
}

/// Why no upstream connection was made: the dial (or the SSRF guard), or what came after
/// it (TLS, the HTTP/1.1 handshake) with the address that was dialled.
enum Failure {
    Dial(DialError),
    After(SocketAddr, String),
}

/// Dial the first of `vetted` (addresses the SSRF guard kept) that answers, then TLS and an
/// HTTP/1.1 connection to it.
async fn connect(ctx: &Ctx, tunnel: &Tunnel, vetted: &[IpAddr]) -> Result<(Sender, SocketAddr), Failure> {
    let (tcp, addr) = dial::connect_any(vetted, tunnel.port, ctx.connect_timeout).await.map_err(Failure::Dial)?;
    let handshake = upstream::handshake(&tunnel.inspector.upstream, &tunnel.host, tcp);
    let tls = match tokio::time::timeout(ctx.connect_timeout, handshake).await {
        Ok(done) => done.map_err(|cause| Failure::After(addr, cause))?,
        Err(_) => return Err(Failure::After(addr, TLS_TIMEOUT.into())),
    };
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| Failure::After(addr, format!("upstream: {e}")))?;
    ctx.spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "upstream connection ended with an error");
        }
    });
    Ok((sender, addr))
}

/// Record an upstream failure after the dial (decision failed) and answer 502 (504 when
/// the TLS handshake timed out).
fn after_dial(mut pending: Pending, target: &str, addr: SocketAddr, cause: String) -> Response<Body> {
    let status = if cause == TLS_TIMEOUT { StatusCode::GATEWAY_TIMEOUT } else { StatusCode::BAD_GATEWAY };
    pending.rec().dst_ip = Some(addr.ip().to_string());
    pending.fail_after_dial(target, cause, status)
}
