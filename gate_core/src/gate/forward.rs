//! Absolute-form `http://` requests: decide, dial, forward in origin form, stream back;
//! a WebSocket handshake is relayed after the upstream's 101, `Upgrade: h2c` refused (`upgrade`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderName, HeaderValue, CONNECTION, HOST};
use hyper::{Request, Response, Uri, Version};

use crate::audit::fields as f;
use crate::policy::{canonical_host, Host, RequestFacts, Scheme};

use super::admit::admit_request;
use super::hold;
use super::respond::{self, Body};
use super::ctx::Pending;
use super::metered::{Counted, Outcome, Recorded};
use super::target::{
    check_host_header, split_authority, upstream_target, HostHeaderError, InvalidPort, ASTERISK_REASON, ASTERISK_REFUSED,
    HTTP_DEFAULT_PORT,
};
use super::upgrade::{self, Asked};
use super::{pool, secrets, Ctx};

/// Headers that describe one hop and are never forwarded (RFC 9110 §7.6.1), besides the
/// ones the `Connection` header names.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
];

/// Reason and answer for a request whose `Transfer-Encoding` names a coding other than
/// `chunked`: hyper decodes only chunked and the gate re-frames the body, so another coding
/// (`gzip, chunked`) would be dropped on the way and upstream would read another body
/// (RFC 9112 §6.1 lets a server refuse codings it does not understand).
pub const TE_REASON: &str = "protocol: a transfer coding other than one chunked";
pub const TE_REFUSED: &str = "gatewrap gate: only the chunked transfer coding is understood; send the body as it is (Content-Encoding may say it is compressed)";

/// How a request's exchange with upstream ended after the dial, when no response came.
pub enum SendFailure {
    /// The body carried a secret ([`secrets::InBody`]): the screen ended it before that
    /// part left, and hyper aborted the upstream request.
    Secret(secrets::Misuse),
    /// Upstream's fault (it closed, or spoke something else than HTTP/1): decision `failed`.
    Upstream(String),
    /// The client's: its body broke off or was malformed after the head (and maybe some of
    /// the body) had gone upstream, so the decision stays `allowed` with this error.
    Downstream(String),
}

/// Why `e` (from `send_request`, after the dial) ended a request, told by where it came
/// from. hyper reports an error of the client's body stream (the gate's `Incoming`) as a
/// user error whose source is that body's own `hyper::Error`: incomplete when the client
/// left, a parse error when its chunked framing was malformed.
pub fn send_failure(e: &hyper::Error) -> SendFailure {
    if let Some(found) = std::error::Error::source(e).and_then(|s| s.downcast_ref::<secrets::InBody>()) {
        let m = &found.0;
        return SendFailure::Secret(secrets::Misuse { secret: m.secret.clone(), what: m.what, seen: m.seen.clone() });
    }
    if e.is_incomplete_message() || e.is_canceled() {
        return SendFailure::Upstream("upstream: closed the connection before responding".to_string());
    }
    if e.is_user() || e.is_body_write_aborted() {
        let body = std::error::Error::source(e).and_then(|s| s.downcast_ref::<hyper::Error>());
        let why = match body {
            Some(b) if !b.is_incomplete_message() && !client_left(b) => {
                format!("malformed request body ({})", innermost(b))
            }
            _ => "client disconnected before its request body was complete".to_string(),
        };
        return SendFailure::Downstream(format!("downstream: {why}; the head and part of the body were sent upstream"));
    }
    SendFailure::Upstream(format!("upstream: {e}"))
}

/// Whether a body error is the client's connection ending (an I/O error of the kind a closed,
/// reset or TLS-truncated connection gives: rustls reports a missing close_notify as
/// `UnexpectedEof`) rather than malformed framing (hyper's chunked decoder: `InvalidData`).
fn client_left(e: &(dyn std::error::Error + 'static)) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset, UnexpectedEof};
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return matches!(io.kind(), UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe);
        }
        cur = err.source();
    }
    false
}

/// The last error in `e`'s source chain, as text (hyper's own says only "error reading a body").
fn innermost(e: &(dyn std::error::Error + 'static)) -> String {
    let mut last = e;
    while let Some(s) = last.source() {
        last = s;
    }
    last.to_string()
}

/// The refusals both request paths (absolute-form http, and requests in an inspected
/// tunnel) make on a request's headers before deciding: `Upgrade: h2c` (`asked`), and a
/// transfer coding other than one chunked. `Some((reason, body))` to refuse with 400.
pub fn header_refusal(asked: Asked, headers: &HeaderMap) -> Option<(&'static str, &'static str)> {
    if asked == Asked::H2c {
        return Some((upgrade::H2C_REASON, upgrade::H2C_REFUSED));
    }
    other_transfer_coding(headers).then_some((TE_REASON, TE_REFUSED))
}

/// True when the `Transfer-Encoding` headers name anything but one `chunked` (see
/// [`TE_REASON`]; chunked twice is forbidden too, RFC 9112 §6.1).
pub fn other_transfer_coding(headers: &HeaderMap) -> bool {
    let mut chunked = 0;
    for v in headers.get_all(hyper::header::TRANSFER_ENCODING) {
        let Ok(s) = v.to_str() else { return true };
        for coding in s.split(',') {
            if !coding.trim().eq_ignore_ascii_case("chunked") {
                return true;
            }
            chunked += 1;
        }
    }
    chunked > 1
}

/// Remove hop-by-hop headers (Transfer-Encoding is left to hyper, which re-frames bodies).
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    headers.remove(hyper::header::TRANSFER_ENCODING);
}

/// `Host` header value for the upstream request: canonical host, port unless 80.
fn host_header(host: &Host, port: u16) -> Option<HeaderValue> {
    let v = match (host, port) {
        (Host::V6(a), 80) => format!("[{a}]"),
        (h, 80) => h.to_string(),
        (h, p) => h.with_port(p),
    };
    HeaderValue::from_str(&v).ok()
}

/// Refuse (400) a target without a host, with an invalid port, an invalid host or a Host
/// header that disagrees; decide (403 when denied); else write the `admit` record (503 if
/// it cannot be written), dial and forward.
pub async fn handle(ctx: Arc<Ctx>, peer: SocketAddr, req: Request<Incoming>) -> Response<Body> {
    let started = Instant::now();
    let mut rec = ctx.record_for(f::EVENT_REQUEST, f::PROTO_HTTP, peer, &req);
    let Some(authority) = req.uri().authority().cloned() else {
        return ctx.refuse(rec, "protocol: absolute-form request without a host", respond::ORIGIN_FORM);
    };
    let (host, port) = match split_authority(&authority) {
        Ok((host, port)) => (host, port.unwrap_or(HTTP_DEFAULT_PORT)),
        Err(InvalidPort(p)) => return ctx.refuse(rec, "protocol: invalid port", &respond::invalid_port(&p)),
    };
    let host = match canonical_host(host) {
        Ok(host) => host,
        Err(e) => return ctx.refuse(rec, &format!("protocol: {e}"), &format!("gatewrap gate: {e}")),
    };
    // RFC 9112 §3.2.2: the target wins; a Host header that names something else is refused.
    if let Err(e) = check_host_header(req.headers(), &host, port, req.version() == Version::HTTP_11) {
        let reason = match e {
            HostHeaderError::Disagrees => "protocol: host mismatch",
            HostHeaderError::Several => "protocol: more than one Host header",
            HostHeaderError::Missing => "protocol: no Host header",
        };
        return ctx.refuse(rec, reason, &respond::host_header(&e));
    }
    let asked = upgrade::asked(req.headers());
    if let Some((reason, body)) = header_refusal(asked, req.headers()) {
        return ctx.refuse(rec, reason, body);
    }
    let Some(pq) = upstream_target(req.method(), req.uri()) else {
        return ctx.refuse(rec, ASTERISK_REASON, ASTERISK_REFUSED);
    };
    let facts = RequestFacts { host: &host, port, scheme: Scheme::Http, method: req.method().as_str(), path: pq.as_str() };
    let adm = admit_request(&ctx, &facts);
    adm.fill(&mut rec);
    let mut req = req;
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
        Ok(body) => body.boxed(),
        Err(answer) => return answer,
    };
    let mut sending = None;
    let mut req = if held {
        let (body, s) = match hold::hold_request(&ctx, &adm, &mut rec, &mut parts, body, Scheme::Http, pq.as_str(), hold::HOLD_BODY_LIMIT).await {
            Ok(go) => go,
            Err(answer) => return answer,
        };
        sending = s;
        Request::from_parts(parts, Full::new(body).map_err(|never| -> secrets::BoxError { match never {} }).boxed())
    } else {
        Request::from_parts(parts, body)
    };
    if let Err(unrecorded) = ctx.admit(&rec).await {
        return unrecorded;
    }
    let target = adm.host.with_port(port);
    let mut pending = Pending::new(ctx.clone(), rec);
    let conn = match pool::checkout(&ctx, &ctx.upstream, &adm, sending.as_mut().and_then(hold::Sending::early)).await {
        Ok(conn) => conn,
        Err(e) => {
            hold::not_sent(sending, &e);
            return pending.fail(&adm, &e);
        }
    };
    pending.rec().dst_ip = Some(conn.addr().ip().to_string());

    let down_upgrade = (asked == Asked::WebSocket).then(|| hyper::upgrade::on(&mut req));
    let (mut parts, body) = req.into_parts();
    parts.uri = Uri::from(pq);
    parts.version = Version::HTTP_11;
    strip_hop_by_hop(&mut parts.headers);
    if down_upgrade.is_some() {
        upgrade::keep_websocket(&mut parts.headers);
    }
    if let Some(h) = host_header(&adm.host, port) {
        parts.headers.insert(HOST, h);
    }
    secrets::inject(&ctx, &adm, &mut parts);
    let up = Arc::new(AtomicU64::new(0));
    let upstream_req = Request::from_parts(parts, Counted::new(body, up.clone()).boxed());

    match conn.send(upstream_req).await {
        Ok(resp) => {
            pending.rec().status = Some(resp.status().as_u16());
            if let Some(s) = sending.as_mut() {
                s.status = Some(resp.status().as_u16());
            }
            if let Some(down) = down_upgrade.filter(|_| resp.status() == hyper::StatusCode::SWITCHING_PROTOCOLS) {
                pending.finish();
                return upgrade::switch(&ctx, down, resp, target);
            }
            let (mut parts, body) = resp.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            let (body, masked) = secrets::mask(&ctx.secrets, &mut parts.headers, body);
            masked.fetch_add(secrets::mask_reason(&ctx.secrets, &mut parts.extensions), Ordering::Relaxed);
            // The record is written at the body's end, with its bytes and duration.
            let body = Recorded::new(body, Outcome { pending, started, up, masked });
            Response::from_parts(parts, body.boxed())
        }
        Err(failure) => pending.send_failed(&target, failure),
    }
}
