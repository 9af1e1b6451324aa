//! The agent's wait on an approval, on the gate's own listener:
//! `GET /.well-known/gatewrap/approvals/ID[?wait=SECONDS]` (origin form) answers JSON
//! `{"id", "status", "reason", "version", "deadline"}` of an approval of this run (any other
//! id: 404), at once or, with `wait` (at most 60 s), once it is no longer pending. Nothing
//! else on the gate is reachable in origin form. Not egress, so not an audit record.

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

/// Whether `req` is for this endpoint (GET, origin form, under [`PREFIX`]).
pub fn wants<B>(req: &Request<B>) -> bool {
    req.method() == Method::GET && req.uri().scheme().is_none() && req.uri().path().starts_with(PREFIX)
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
        let _ = tokio::time::timeout((until - now).min(Duration::from_secs(1)), woken).await;
    }
}
