//! The gate's own responses: 403 (policy, SSRF guard), 400 (not a proxy request), 502/504
//! (upstream), 503 (the audit log cannot be written).

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Response, StatusCode};

use std::net::IpAddr;

use crate::audit::AuditError;
use crate::policy::ssrf::Class;
use crate::policy::{Decision, Host};

use super::dial::DialError;
use super::target::HostHeaderError;

/// Body type of every response the gate sends (its own text, or an upstream stream).
pub type Body = BoxBody<Bytes, hyper::Error>;

pub const DECISION_HEADER: &str = "x-gatewrap-decision";

pub fn empty() -> Body {
    Empty::<Bytes>::new().map_err(|never| match never {}).boxed()
}

/// A plain-text answer with `status`, the `x-gatewrap-decision` header and `body`.
pub fn text(status: StatusCode, decision: &'static str, body: String) -> Response<Body> {
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
    match &decision.rule {
        // `--deny` flags are checked before everything else: only dropping one helps.
        Some(id) if id.starts_with("--deny") => format!(
            "gatewrap: egress to {hp} was denied (rule {id}).\n\
             To allow it, drop `{id}` from gatewrap's command line.\n"
        ),
        // A file rule may judge methods or paths: point at it rather than at a new rule.
        Some(id) => format!(
            "gatewrap: egress to {hp} was denied (rule {id}).\n\
             To allow it, change that rule in your policy, or run with --allow {hp} \
             (command-line rules are checked before the file's; it allows every method and path).\n"
        ),
        None => format!(
            "gatewrap: egress to {hp} was denied (default deny).\n\
             To allow it, run with --allow {hp} or add to your policy:\n{}",
            rule_block(host, port, "")
        ),
    }
}

pub fn denied(host: &Host, port: u16, decision: &Decision) -> Response<Body> {
    text(StatusCode::FORBIDDEN, "denied", denied_body(host, port, decision))
}

/// A policy snippet that allows `host` on `port`.
fn rule_block(host: &Host, port: u16, extra: &str) -> String {
    format!("  [[rule]]\n  host = \"{host}\"\n  port = {port}\n  action = \"allow\"\n{extra}")
}

/// The text of the SSRF guard's 403: the host, the address and its class, and how to allow
/// it (a rule naming the address; `allow_private` where it applies; `public_ranges` for
/// a test network).
pub fn ssrf_body(host: &Host, port: u16, ip: IpAddr, class: Class, rule: Option<&str>) -> String {
    let hp = host.with_port(port);
    let addr = Host::from(ip);
    let ap = addr.with_port(port);
    let a = if class.as_str().starts_with(['a', 'e', 'i', 'o', 'u']) { "an" } else { "a" };
    let what = match host {
        Host::Name(name) => format!("{name} resolves to {ip}, {a} {class} address"),
        _ => format!("{ip} is {a} {class} address"),
    };
    let mut body = format!(
        "gatewrap: egress to {hp} was denied: {what}, which the gate dials only when a rule \
         allows it (SSRF guard).\n"
    );
    let named = rule_block(&addr, port, "");
    let how = match (class, host) {
        (Class::Metadata, _) => format!(
            "Cloud metadata endpoints hand out credentials; `allow_private` never covers them. \
             If the agent must reach it, run with --allow {ap} or name the address in your policy:\n{named}"
        ),
        (Class::EmbeddedIpv4, _) => format!(
            "An IPv6 address that embeds an IPv4 address can reach any IPv4 host; it is dialled \
             only when a rule names it exactly: run with --allow {ap} or add to your policy:\n{named}"
        ),
        (c, Host::Name(name)) if c.allow_private_covers() => {
            let which = match rule {
                Some(id) => format!("rule {id}"),
                None => format!("a rule for {name}"),
            };
            format!(
                "To allow it, run with --allow-private {hp} or add `allow_private = true` to {which}:\n{}\
                 or allow only this address: run with --allow {ap} or add to your policy:\n{named}",
                rule_block(host, port, "  allow_private = true\n")
            )
        }
        _ => format!("To allow it, run with --allow {ap} or add to your policy:\n{named}"),
    };
    body.push_str(&how);
    if matches!(class, Class::Documentation | Class::Benchmarking | Class::Reserved) {
        body.push_str(
            "If it is part of a test network, count its range as public: run with --public-range CIDR, \
             or put public_ranges = [\"CIDR\"] at the top of your policy.\n",
        );
    }
    body
}

/// One line for gatewrap's stderr (an HTTPS client never shows the 403's body) saying that
/// the SSRF guard refused `host` (in every mode: report mode does not lift it) and the
/// option that allows it.
pub fn ssrf_hint(host: &Host, port: u16, ip: IpAddr, class: Class) -> String {
    let hp = host.with_port(port);
    let ap = Host::from(ip).with_port(port);
    let a = if class.as_str().starts_with(['a', 'e', 'i', 'o', 'u']) { "an" } else { "a" };
    let what = match host {
        Host::Name(name) => format!("{name} resolves to {ip}, {a} {class} address"),
        _ => format!("{ip} is {a} {class} address"),
    };
    let test_net = match class {
        Class::Documentation | Class::Benchmarking | Class::Reserved => " (a test network: --public-range CIDR)",
        _ => "",
    };
    let how = match (class, host) {
        (Class::Metadata | Class::EmbeddedIpv4, _) => format!("only a rule naming the address allows it (--allow {ap})"),
        (c, Host::Name(_)) if c.allow_private_covers() => {
            format!("allow it with --allow-private {hp}, or allow_private = true on its rule")
        }
        _ => format!("allow it with --allow {ap}"),
    };
    format!("gatewrap: {what}, which the SSRF guard refuses; {how}{test_net}")
}

pub fn ssrf_denied(host: &Host, port: u16, ip: IpAddr, class: Class, rule: Option<&str>) -> Response<Body> {
    text(StatusCode::FORBIDDEN, "denied", ssrf_body(host, port, ip, class, rule))
}

/// A 403 with a text of the caller's (an `ask` breakpoint, a spent budget).
pub fn forbidden(body: String) -> Response<Body> {
    text(StatusCode::FORBIDDEN, "denied", body)
}

pub fn upstream_failure(target: &str, err: &DialError) -> Response<Body> {
    text(err.status(), "failed", format!("gatewrap: could not reach {target}: {err}\n"))
}

pub fn bad_gateway(target: &str, cause: &str) -> Response<Body> {
    text(StatusCode::BAD_GATEWAY, "failed", format!("gatewrap: could not reach {target}: {cause}\n"))
}

/// The 503 of a request whose record the audit log cannot take (`err` names the log and
/// the cause): the gate admits nothing it cannot record (DESIGN contract 5).
pub fn audit_unwritable(err: &AuditError) -> Response<Body> {
    text(
        StatusCode::SERVICE_UNAVAILABLE,
        "failed",
        format!(
            "gatewrap: the request was not sent: {err}.\n\
             The gate admits nothing it cannot record; requests pass again once the audit log \
             can be written (free space on its file system, or fix the cause).\n"
        ),
    )
}

/// Messages for requests the gate does not forward.
pub const ORIGIN_FORM: &str =
    "gatewrap gate: this is a forward proxy; set HTTP_PROXY=http://127.0.0.1:3128";
pub const CONNECT_NEEDS_PORT: &str = "gatewrap gate: CONNECT needs HOST:PORT";
pub fn invalid_port(port: &str) -> String {
    format!("gatewrap gate: the port {port:?} in the request target is invalid: expected 1-65535")
}
pub fn host_header(err: &HostHeaderError) -> String {
    format!("gatewrap gate: {err}; send one Host header, naming the target's host and port")
}
pub fn other_scheme(scheme: &str) -> String {
    format!(
        "gatewrap gate: cannot forward {scheme}:// requests; for https set \
         HTTPS_PROXY=http://127.0.0.1:3128 so the client tunnels with CONNECT"
    )
}
