//! Protocol upgrades on allowed requests (RFC 9110 §7.8): WebSocket is relayed both ways
//! (RFC 6455 §4), `h2c` is refused, any other upgrade is dropped (the request goes on as
//! plain HTTP/1.1, as `strip_hop_by_hop` removes `Upgrade`).
//!
//! A WebSocket handshake keeps `Connection: Upgrade` and `Upgrade: websocket` on both hops;
//! the `Sec-WebSocket-*` headers are end-to-end and pass untouched. After the upstream's
//! `101 Switching Protocols`, both connections are taken over from hyper and copied; in a
//! run with secrets, the 101's head and the upstream's frames come masked (`secrets::WsMasked`).

use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderValue, CONNECTION, UPGRADE};
use hyper::upgrade::OnUpgrade;
use hyper::{Response, StatusCode};
use hyper_util::rt::TokioIo;

use super::idle::{self, Ended};
use super::respond::{self, Body};
use super::{secrets, Ctx};

/// What a request's `Upgrade` header asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asked {
    Nothing,
    WebSocket,
    H2c,
    Other,
}

/// Read `Upgrade` (only when `Connection` names it, as RFC 9110 §7.8 requires; `h2c` is
/// refused either way).
pub fn asked(headers: &HeaderMap) -> Asked {
    let tokens = |name| {
        headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(|t| t.trim().to_ascii_lowercase())
            .collect::<Vec<_>>()
    };
    let upgrade = tokens(UPGRADE);
    if upgrade.is_empty() {
        return Asked::Nothing;
    }
    if upgrade.iter().any(|t| t.starts_with("h2c")) {
        return Asked::H2c;
    }
    let connection_names_it = tokens(CONNECTION).iter().any(|t| t == "upgrade");
    match (connection_names_it, upgrade.as_slice()) {
        (true, [only]) if only == "websocket" => Asked::WebSocket,
        _ => Asked::Other,
    }
}

/// Put back the two hop-by-hop headers a WebSocket handshake needs on the next hop.
pub fn keep_websocket(headers: &mut HeaderMap) {
    headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(UPGRADE, HeaderValue::from_static("websocket"));
}

/// The text of the 400 for `Upgrade: h2c`.
pub const H2C_REFUSED: &str =
    "gatewrap gate: Upgrade: h2c is refused (HTTP/2 over cleartext would bypass per-request decisions); send HTTP/1.1";
pub const H2C_REASON: &str = "protocol: Upgrade: h2c is refused";

/// Answer the client with the upstream's 101 and relay both connections once hyper hands
/// them over, as one of the gate's tasks; the relay ends when either side closes, after
/// the gate's idle timeout without traffic, or when the gate stops.
/// `resp` is the upstream's 101; `down` the client's pending upgrade.
pub fn switch(ctx: &Ctx, down: OnUpgrade, mut resp: Response<Incoming>, what: String) -> Response<Body> {
    let up = hyper::upgrade::on(&mut resp);
    let idle_limit = ctx.idle_timeout;
    let mask_with = ctx.secrets.clone();
    let masking = !mask_with.read().unwrap_or_else(|p| p.into_inner()).is_empty();
    ctx.spawn(async move {
        let (down, up) = match tokio::try_join!(down, up) {
            Ok(pair) => pair,
            Err(e) => return tracing::debug!(dst = %what, error = %e, "upgrade: a side left before switching"),
        };
        let up = TokioIo::new(up);
        let ended = if masking {
            let (from, to) = tokio::io::split(up);
            idle::relay(TokioIo::new(down), tokio::io::join(secrets::WsMasked::new(from, mask_with), to), idle_limit).await
        } else {
            idle::relay(TokioIo::new(down), up, idle_limit).await
        };
        match ended {
            Ended::Closed(up, down) => tracing::debug!(dst = %what, bytes.up = up, bytes.down = down, "upgraded connection closed"),
            Ended::Error(e) => tracing::debug!(dst = %what, error = %e, "upgraded connection ended with an error"),
            Ended::Idle => tracing::debug!(dst = %what, "upgraded connection closed: idle"),
        }
    });
    let (mut parts, _) = resp.into_parts();
    if masking {
        ctx.secrets.read().unwrap_or_else(|p| p.into_inner()).mask_headers(&mut parts.headers);
        secrets::mask_reason(&ctx.secrets, &mut parts.extensions);
    }
    super::strip_hop_by_hop(&mut parts.headers);
    keep_websocket(&mut parts.headers);
    debug_assert_eq!(parts.status, StatusCode::SWITCHING_PROTOCOLS);
    Response::from_parts(parts, respond::empty())
}
