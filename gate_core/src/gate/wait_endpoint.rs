//! The agent's wait on an approval, on the gate's own listener:
//! `GET /.well-known/gatewrap/approvals/ID[?wait=SECONDS]`, in origin form or in absolute
//! form to the gate's own listen address (`GET http://127.0.0.1:3128/.well-known/...`, what
//! a client with `HTTP_PROXY` set sends; any other authority is an ordinary request, for
//! the policy), answers JSON
//! `{"id", "status", "reason", "version", "deadline"}` of an approval of this run (any other
//! id: 404), at once or, with `wait` (at most 60 s), once it is no longer pending. Nothing
//! else on the gate is reachable that way. Not egress, so not an audit record.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};

use crate::approvals::{self, status};

use super::hold::MAX_POLL;
use super::respond::{self, Body};
use super::Ctx;

/// The path prefix of the endpoint.
pub const PREFIX: &str = "/.well-known/gatewrap/approvals/";

/// Whether `req` is for this endpoint: GET under [`PREFIX`], in origin form, or in absolute
/// form `http://` to one of `ctx`'s listen addresses (an IP literal and port, no userinfo).
pub fn wants<B>(ctx: &Ctx, req: &Request<B>) -> bool {
    if req.method() != Method::GET || !req.uri().path().starts_with(PREFIX) {
        return false;
    }
    match (req.uri().scheme_str(), req.uri().authority()) {
        (None, None) => true,
        (Some("http"), Some(a)) => to_gate(a.as_str(), &ctx.listen_addrs),
        _ => false,
    }
}

/// `authority` (`IP:PORT`, `[IPv6]:PORT`, or an IP without port: 80) is one of `listen`.
fn to_gate(authority: &str, listen: &[SocketAddr]) -> bool {
    let addr = authority.parse::<SocketAddr>().ok().or_else(|| {
        let ip = authority.strip_prefix('[').and_then(|a| a.strip_suffix(']')).unwrap_or(authority);
        ip.parse::<IpAddr>().ok().map(|ip| SocketAddr::new(ip, 80))
    });
    addr.is_some_and(|a| listen.contains(&a))
}

fn json(status: StatusCode, v: serde_json::Value) -> Response<Body> {
    let mut resp = Response::new(Full::new(Bytes::from(v.to_string())).map_err(|never| match never {}).boxed());
    *resp.status_mut() = status;
    resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

/// Answer the wait. `?wait=S` is clamped to 0..=[`MAX_POLL`].
pub async fn handle<B>(ctx: Arc<Ctx>, req: Request<B>) -> Response<Body> {
    let Some(ap) = ctx.approvals.clone() else {
        return respond::text(StatusCode::NOT_FOUND, "denied", "gatewrap gate: approvals are off for this run\n".into());
    };
    let id = req.uri().path()[PREFIX.len()..].to_string();
    let wait = req
        .uri()
        .query()
        .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("wait=")))
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|v| v.is_finite())
        .unwrap_or(0.0)
        .clamp(0.0, MAX_POLL);
    let until = Instant::now() + Duration::from_secs_f64(wait);
    let reread = ctx.policy.read().unwrap_or_else(|p| p.into_inner()).approvals.reread;
    loop {
        let woken = ap.wakes.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let q = id.clone();
        let a = match ap.call(move |s| s.get(&q)).await {
            Ok(Some(a)) if a.run_id == ctx.run_id => a,
            Ok(_) => return json(StatusCode::NOT_FOUND, serde_json::json!({"id": id, "error": "no such approval in this run"})),
            Err(e) => return json(StatusCode::SERVICE_UNAVAILABLE, serde_json::json!({"id": id, "error": e.to_string()})),
        };
        let now = Instant::now();
        let pending = a.status == status::PENDING && a.deadline > approvals::now();
        if !pending || now >= until {
            let shown = if a.status == status::PENDING && a.deadline <= approvals::now() { status::EXPIRED } else { a.status.as_str() };
            return json(
                StatusCode::OK,
                serde_json::json!({"id": a.id, "status": shown, "reason": a.reason, "version": a.version,
                                   "deadline": approvals::rfc3339(a.deadline)}),
            );
        }
        let _ = tokio::time::timeout((until - now).min(reread), woken).await;
    }
}

#[cfg(test)]
mod tests {
    use super::to_gate;

    #[test]
    fn only_the_gates_own_address_is_the_gate() {
        let listen = ["127.0.0.1:3128".parse().unwrap(), "[::1]:3128".parse().unwrap()];
        assert!(to_gate("127.0.0.1:3128", &listen));
        assert!(to_gate("[::1]:3128", &listen));
        assert!(!to_gate("127.0.0.1:3129", &listen));
        assert!(!to_gate("127.0.0.1", &listen));
        assert!(!to_gate("localhost:3128", &listen));
        assert!(!to_gate("u@127.0.0.1:3128", &listen));
        assert!(!to_gate("198.51.100.1:3128", &listen));
        assert!(to_gate("[::1]", &["[::1]:80".parse().unwrap()]));
        // Other spellings of the loopback are not the gate's address: ordinary requests,
        // for the policy (and the SSRF guard, which denies loopback).
        for other in ["[::ffff:127.0.0.1]:3128", "127.1:3128", "0x7f000001:3128", "2130706433:3128", "127.0.0.1.:3128",
                      "LOCALHOST:3128", "127.0.0.1:3128@other.test", "[::1%lo]:3128", "[0:0:0:0:0:0:0:1]:3129", "127.0.0.1:"] {
            assert!(!to_gate(other, &listen), "{other}");
        }
    }
}
