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

/// Which settings the gate's 403 bodies and notices name to allow a destination: those of
/// `gatewrap run` (`--allow`, `--allow-private`, `--public-range`, the policy file of
/// `--policy`), or, for a container's run (gatewrap-oci), the container's: its annotations
/// `gatewrap.allow` and `gatewrap.policy`, else its runtime's flags `--gatewrap-allow` and
/// `--gatewrap-public-range` (docs/guide/containers.md; a container has no `--allow-private`,
/// only a policy rule's `allow_private = true`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AllowHint {
    #[default]
    Run,
    Container,
}

impl AllowHint {
    /// `"run"` or `"container"` (the Python `Gate(allow_hint=...)`); `None` for another name.
    pub fn from_name(name: &str) -> Option<AllowHint> {
        match name {
            "run" => Some(AllowHint::Run),
            "container" => Some(AllowHint::Container),
            _ => None,
        }
    }

    /// How to add an allow rule for `what` (`host:port`) ahead of the policy file's rules.
    fn allow(self, what: &str) -> String {
        match self {
            AllowHint::Run => format!("run with --allow {what}"),
            AllowHint::Container => format!(
                "create the container with the annotation gatewrap.allow={what} (or its runtime with --gatewrap-allow={what})"
            ),
        }
    }

    /// The same in a few words, for a notice line.
    fn allow_short(self, what: &str) -> String {
        match self {
            AllowHint::Run => format!("--allow {what}"),
            AllowHint::Container => format!("the annotation gatewrap.allow={what}"),
        }
    }

    /// The policy file a rule goes into.
    fn policy(self) -> &'static str {
        match self {
            AllowHint::Run => "your policy",
            AllowHint::Container => "its policy file (annotation gatewrap.policy)",
        }
    }

    /// How to count a test network's range as public.
    fn public_range(self) -> &'static str {
        match self {
            AllowHint::Run => "run with --public-range CIDR, or put public_ranges = [\"CIDR\"] at the top of your policy",
            AllowHint::Container => {
                "give the container's runtime --gatewrap-public-range=CIDR, or put public_ranges = [\"CIDR\"] at the \
                 top of its policy file"
            }
        }
    }
}

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

/// The text of a 403, naming the rule (or the default) and how to allow the destination
/// (the settings `hint` names); a fixed denial (an unspecified address) says why no rule can
/// allow it.
pub fn denied_body(host: &Host, port: u16, decision: &Decision, hint: AllowHint) -> String {
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
             To allow it, change that rule in {}, or {}{}",
            hint.policy(),
            hint.allow(&hp),
            match hint {
                AllowHint::Run => " (command-line rules are checked before the file's; it allows every method and path).\n",
                AllowHint::Container => ": those rules are checked before the file's, and allow every method and path.\n",
            }
        ),
        None => format!(
            "gatewrap: egress to {hp} was denied (default deny).\n\
             To allow it, {} or add to {}:\n{}",
            hint.allow(&hp),
            hint.policy(),
            rule_block(host, port, "")
        ),
    }
}

pub fn denied(host: &Host, port: u16, decision: &Decision, hint: AllowHint) -> Response<Body> {
    text(StatusCode::FORBIDDEN, "denied", denied_body(host, port, decision, hint))
}

/// A policy snippet that allows `host` on `port`.
fn rule_block(host: &Host, port: u16, extra: &str) -> String {
    format!("  [[rule]]\n  host = \"{host}\"\n  port = {port}\n  action = \"allow\"\n{extra}")
}

/// The text of the SSRF guard's 403: the host, the address and its class, and how to allow
/// it (a rule naming the address; `allow_private` where it applies; `public_ranges` for
/// a test network), with the settings `hint` names.
pub fn ssrf_body(host: &Host, port: u16, ip: IpAddr, class: Class, rule: Option<&str>, hint: AllowHint) -> String {
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
    let (allow, policy) = (hint.allow(&ap), hint.policy());
    let how = match (class, host) {
        (Class::Metadata, _) => format!(
            "Cloud metadata endpoints hand out credentials; `allow_private` never covers them. \
             If the agent must reach it, {allow} or name the address in {policy}:\n{named}"
        ),
        (Class::EmbeddedIpv4, _) => format!(
            "An IPv6 address that embeds an IPv4 address can reach any IPv4 host; it is dialled \
             only when a rule names it exactly: {allow} or add to {policy}:\n{named}"
        ),
        (c, Host::Name(name)) if c.allow_private_covers() => {
            let which = match rule {
                Some(id) => format!("rule {id}"),
                None => format!("a rule for {name}"),
            };
            let (flag, file) = match hint {
                AllowHint::Run => (format!("run with --allow-private {hp} or "), String::new()),
                AllowHint::Container => (String::new(), format!(" in {policy}")), // no flag: a rule of its file only
            };
            format!(
                "To allow it, {flag}add `allow_private = true` to {which}{file}:\n{}\
                 or allow only this address: {allow} or add to {policy}:\n{named}",
                rule_block(host, port, "  allow_private = true\n")
            )
        }
        _ => format!("To allow it, {allow} or add to {policy}:\n{named}"),
    };
    body.push_str(&how);
    if matches!(class, Class::Documentation | Class::Benchmarking | Class::Reserved) {
        body.push_str(&format!("If it is part of a test network, count its range as public: {}.\n", hint.public_range()));
    }
    body
}

/// One line for gatewrap's stderr (an HTTPS client never shows the 403's body) saying that
/// the SSRF guard refused `host` (in every mode: report mode does not lift it) and the
/// setting (of those `hint` names) that allows it.
pub fn ssrf_hint(host: &Host, port: u16, ip: IpAddr, class: Class, hint: AllowHint) -> String {
    let hp = host.with_port(port);
    let ap = Host::from(ip).with_port(port);
    let a = if class.as_str().starts_with(['a', 'e', 'i', 'o', 'u']) { "an" } else { "a" };
    let what = match host {
        Host::Name(name) => format!("{name} resolves to {ip}, {a} {class} address"),
        _ => format!("{ip} is {a} {class} address"),
    };
    let test_net = match (class, hint) {
        (Class::Documentation | Class::Benchmarking | Class::Reserved, AllowHint::Run) => " (a test network: --public-range CIDR)",
        (Class::Documentation | Class::Benchmarking | Class::Reserved, AllowHint::Container) => {
            " (a test network: the runtime's --gatewrap-public-range=CIDR)"
        }
        _ => "",
    };
    let how = match (class, host) {
        (Class::Metadata | Class::EmbeddedIpv4, _) => {
            format!("only a rule naming the address allows it ({})", hint.allow_short(&ap))
        }
        (c, Host::Name(_)) if c.allow_private_covers() => match hint {
            AllowHint::Run => format!("allow it with --allow-private {hp}, or allow_private = true on its rule"),
            AllowHint::Container => "allow it with allow_private = true on its rule (the container's policy file)".into(),
        },
        _ => format!("allow it with {}", hint.allow_short(&ap)),
    };
    format!("gatewrap: {what}, which the SSRF guard refuses; {how}{test_net}")
}

pub fn ssrf_denied(host: &Host, port: u16, ip: IpAddr, class: Class, rule: Option<&str>, hint: AllowHint) -> Response<Body> {
    text(StatusCode::FORBIDDEN, "denied", ssrf_body(host, port, ip, class, rule, hint))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::file::from_toml;
    use crate::policy::{canonical_host, Action, Policy};

    fn host(name: &str) -> Host {
        canonical_host(name).expect("a host")
    }

    /// (case, the body a run gets, the body a container's run gets, what each must say)
    fn bodies() -> Vec<(&'static str, String, String, &'static str, &'static str)> {
        let open = Policy::new(Action::Deny).decide_connect(&host("denied.test"), 80);
        let file = from_toml("[[rule]]\nhost = \"denied.test\"\naction = \"deny\"\n", "p.toml").expect("parses");
        let ruled = file.decide_connect(&host("denied.test"), 80);
        let ip: IpAddr = "10.0.0.7".parse().expect("an address");
        let doc: IpAddr = "192.0.2.7".parse().expect("an address");
        let meta: IpAddr = "169.254.169.254".parse().expect("an address");
        let both = |f: &dyn Fn(AllowHint) -> String| (f(AllowHint::Run), f(AllowHint::Container));
        let mut out = vec![];
        let mut add = |case, (run, container): (String, String), says_run, says_container| {
            out.push((case, run, container, says_run, says_container))
        };
        add(
            "the default denied",
            both(&|h| denied_body(&host("denied.test"), 80, &open, h)),
            "To allow it, run with --allow denied.test:80 or add to your policy:\n",
            "To allow it, create the container with the annotation gatewrap.allow=denied.test:80 (or its runtime with \
             --gatewrap-allow=denied.test:80) or add to its policy file (annotation gatewrap.policy):\n",
        );
        add(
            "a file rule denied",
            both(&|h| denied_body(&host("denied.test"), 80, &ruled, h)),
            "To allow it, change that rule in your policy, or run with --allow denied.test:80 (command-line rules",
            "To allow it, change that rule in its policy file (annotation gatewrap.policy), or create the container with \
             the annotation gatewrap.allow=denied.test:80 (or its runtime with --gatewrap-allow=denied.test:80): \
             those rules are checked before the file's",
        );
        add(
            "a name resolved to a private address",
            both(&|h| ssrf_body(&host("db.test"), 80, ip, Class::Private, None, h)),
            "To allow it, run with --allow-private db.test:80 or add `allow_private = true` to a rule for db.test:\n",
            "To allow it, add `allow_private = true` to a rule for db.test in its policy file (annotation gatewrap.policy):\n",
        );
        add(
            "a documentation address",
            both(&|h| ssrf_body(&Host::from(doc), 80, doc, Class::Documentation, None, h)),
            "count its range as public: run with --public-range CIDR,",
            "count its range as public: give the container's runtime --gatewrap-public-range=CIDR,",
        );
        add(
            "a metadata address",
            both(&|h| ssrf_body(&Host::from(meta), 80, meta, Class::Metadata, None, h)),
            "If the agent must reach it, run with --allow 169.254.169.254:80 or name the address in your policy:",
            "If the agent must reach it, create the container with the annotation gatewrap.allow=169.254.169.254:80",
        );
        add(
            "the notice of a private address",
            both(&|h| ssrf_hint(&host("db.test"), 80, ip, Class::Private, h)),
            "allow it with --allow-private db.test:80, or allow_private = true on its rule",
            "allow it with allow_private = true on its rule (the container's policy file)",
        );
        add(
            "the notice of a documentation address",
            both(&|h| ssrf_hint(&Host::from(doc), 80, doc, Class::Documentation, h)),
            "allow it with --allow 192.0.2.7:80 (a test network: --public-range CIDR)",
            "allow it with the annotation gatewrap.allow=192.0.2.7:80 (a test network: the runtime's \
             --gatewrap-public-range=CIDR)",
        );
        out
    }

    #[test]
    fn a_containers_refusals_name_its_annotations_and_runtime_flags_and_a_runs_its_flags() {
        for (case, run, container, says_run, says_container) in bodies() {
            assert!(run.contains(says_run), "{case}, a run's: {run}");
            assert!(container.contains(says_container), "{case}, a container's: {container}");
            // gatewrap run's flags (--allow, --allow-private, --public-range) are not a container's
            assert!(!container.contains("--allow") && !container.contains(" --public-range"), "{case}: {container}");
        }
    }

    #[test]
    fn allow_hint_names() {
        let cases = [("run", Some(AllowHint::Run)), ("container", Some(AllowHint::Container)), ("oci", None), ("", None)];
        for (name, want) in cases {
            assert_eq!(AllowHint::from_name(name), want, "{name:?}");
        }
    }
}
