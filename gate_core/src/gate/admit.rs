//! From a request's host and port to a carried-out decision (policy + mode).

use crate::audit::{fields as f, GateRecord};
use crate::policy::{canonical_host, Action, Decision, Host, HostError, Mode, Policy, RequestFacts};

use hyper::{Response, StatusCode};

use super::respond::{self, Body};
use super::Ctx;

/// What the gate will do with a destination.
pub struct Admission {
    pub host: Host,
    pub port: u16,
    pub decision: Decision,
    /// True when the gate proceeds: the policy allowed it, or `report` mode overrode a deny.
    pub proceed: bool,
    /// `Some("deny")` when `report` mode let a denied destination through.
    pub would: Option<&'static str>,
}

impl Admission {
    /// Copy the decision into an audit record (destination, reason, rule, `would`).
    pub fn fill(&self, rec: &mut GateRecord) {
        rec.dst_host = Some(self.host.to_string());
        rec.dst_port = Some(self.port);
        rec.reason = Some(self.decision.reason.clone());
        rec.rule = self.decision.rule.clone();
        rec.would = self.would;
        rec.decision = if self.proceed { f::ALLOWED } else { f::DENIED };
    }

    /// Record a denial (status 403) and return the 403 that says how to allow it.
    pub fn forbid(&self, ctx: &Ctx, mut rec: GateRecord) -> Response<Body> {
        rec.status = Some(StatusCode::FORBIDDEN.as_u16());
        ctx.record(rec);
        respond::denied(&self.host, self.port, &self.decision)
    }
}

/// Canonicalise the `host` of a CONNECT and decide on the tunnel ([`Policy::decide_connect`]).
pub fn admit_connect(ctx: &Ctx, host: &str, port: u16) -> Result<Admission, HostError> {
    let host = canonical_host(host)?;
    Ok(carry_out(ctx, host, port, |p, h| p.decide_connect(h, port)))
}

/// Decide on one HTTP request ([`Policy::decide_request`]); `req.host` is canonical.
pub fn admit_request(ctx: &Ctx, req: &RequestFacts<'_>) -> Admission {
    carry_out(ctx, req.host.clone(), req.port, |p, _| p.decide_request(req))
}

/// Decide with the current policy, then apply its mode: `report` lets a denied destination
/// through unless the denial is fixed (an unspecified address).
fn carry_out(ctx: &Ctx, host: Host, port: u16, decide: impl FnOnce(&Policy, &Host) -> Decision) -> Admission {
    let (decision, mode) = {
        let policy = ctx.policy.read().unwrap_or_else(|p| p.into_inner());
        (decide(&policy, &host), policy.mode)
    };
    let (proceed, would) = match (decision.action, mode) {
        (Action::Allow, _) => (true, None),
        (Action::Deny, Mode::Report) if !decision.fixed => (true, Some("deny")),
        (Action::Deny, _) => (false, None),
    };
    Admission { host, port, decision, proceed, would }
}
