//! The gate's own responses: 403 (policy), 400 (not a proxy request), 502/504 (upstream).

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Response, StatusCode};

use crate::policy::{Decision, Host};

use super::dial::DialError;
use super::target::HostHeaderError;

/// Body type of every response the gate sends (its own text, or an upstream stream).
pub type Body = BoxBody<Bytes, hyper::Error>;

pub const DECISION_HEADER: &str = "x-gatewrap-decision";

pub fn empty() -> Body {
    Empty::<Bytes>::new().map_err(|never| match never {}).boxed()
}

fn text(status: StatusCode, decision: &'static str, body: String) -> Response<Body> {
    let mut resp = Response::new(Full::new(Bytes::from(body)).map_err(|never| match never {}).boxed());
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    h.insert(DECISION_HEADER, HeaderValue::from_static(decision));
    resp
}

/// The text of a 403, naming the rule (or the default) and how to allow the destination;
/// a fixed denial (an unspecified address) says why no rule can allow it.
pub fn denied_body(host: &Host, port: u16, decision: &Decision) -> String {
    let hp = host.with_port(port);
    if decision.fixed {
        return format!(
            "gatewrap: egress to {hp} was denied (unspecified address).\n\
             0.0.0.0 and :: are not destinations: dialled, they reach the gate's own host. \
             No rule can allow them; name the host you mean.\n"
        );
    }
    let why = match &decision.rule {
        Some(id) => format!("rule {id}"),
        None => "default deny".to_string(),
    };
    format!(
        "gatewrap: egress to {hp} was denied ({why}).\n\
         To allow it, run with --allow {hp} or add to your policy:\n  \
         [[rule]]\n  host = \"{host}\"\n  port = {port}\n  action = \"allow\"\n"
    )
}

pub fn denied(host: &Host, port: u16, decision: &Decision) -> Response<Body> {
    text(StatusCode::FORBIDDEN, "denied", denied_body(host, port, decision))
}

pub fn bad_request(msg: &str) -> Response<Body> {
    text(StatusCode::BAD_REQUEST, "denied", format!("{msg}\n"))
}

pub fn upstream_failure(target: &str, err: &DialError) -> Response<Body> {
    text(err.status(), "failed", format!("gatewrap: could not reach {target}: {err}\n"))
}

pub fn bad_gateway(target: &str, cause: &str) -> Response<Body> {
    text(StatusCode::BAD_GATEWAY, "failed", format!("gatewrap: could not reach {target}: {cause}\n"))
}

/// Messages for requests the gate does not forward.
pub const ORIGIN_FORM: &str =
    "gatewrap gate: this is a forward proxy; set HTTP_PROXY=http://127.0.0.1:3128";
pub const CONNECT_NEEDS_PORT: &str = "gatewrap gate: CONNECT needs HOST:PORT";
pub fn invalid_port(port: &str) -> String {
    format!("gatewrap gate: the port {port:?} in the request target is invalid: expected 1-65535")
}
pub fn host_header(err: &HostHeaderError) -> String {
    format!("gatewrap gate: {err}; send at most one Host header, naming the target's host and port")
}
pub fn other_scheme(scheme: &str) -> String {
    format!(
        "gatewrap gate: cannot forward {scheme}:// requests; for https set \
         HTTPS_PROXY=http://127.0.0.1:3128 so the client tunnels with CONNECT"
    )
}
