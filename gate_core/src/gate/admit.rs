//! From a request's host and port to a carried-out decision: policy, then budgets, then
//! `ask` (denied until approvals exist) and the mode.

use std::time::{Duration, Instant};

use crate::audit::{fields as f, GateRecord};
use crate::policy::budget::{show_budget_spent, REASON_BUDGET};
use crate::policy::duration::show_remaining;
use crate::policy::{canonical_host, Action, Budget, Decision, Host, HostError, Mode, Policy, RequestFacts, Spend};

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
    /// The rule's budget was spent (reason [`REASON_BUDGET`]): the budget and when it resets.
    pub over_budget: Option<(Budget, Duration)>,
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

    /// Record a denial (status 403) and return the 403 that says why and what to do (the
    /// 503 of [`Ctx::answer_recorded`] if the record cannot be written).
    pub fn forbid(&self, ctx: &Ctx, mut rec: GateRecord) -> Response<Body> {
        rec.status = Some(StatusCode::FORBIDDEN.as_u16());
        ctx.answer_recorded(rec, self.forbidden(ctx.allow_hint))
    }

    /// The 403 that says why the destination was denied and what to do (with the settings
    /// `hint` names).
    fn forbidden(&self, hint: respond::AllowHint) -> Response<Body> {
        let hp = self.host.with_port(self.port);
        let d = &self.decision;
        let rule = d.rule.as_deref().unwrap_or("default");
        if let Some((budget, resets)) = self.over_budget {
            return respond::forbidden(format!(
                "gatewrap: egress to {hp} was denied (budget): rule {rule} allows {} and that budget is \
                 spent; the window resets in {}.\nWait, or raise the rule's `budget`.\n",
                budget.describe(),
                show_remaining(resets),
            ));
        }
        if d.action == Action::Ask {
            let who = d.rule.as_ref().map_or("the policy's default".to_string(), |id| format!("rule {id}"));
            return respond::forbidden(format!(
                "gatewrap: egress to {hp} needs approval: {who} is a breakpoint (action = \"ask\").\n\
                 This gate has no approvals store, so it denies it (`gatewrap run` opens one whenever \
                 the policy has an ask rule; --state URL names it).\n"
            ));
        }
        let plain = d.default_applied() || d.fixed || d.rule.as_ref().is_some_and(|id| d.reason == format!("policy: rule {id}"));
        if plain {
            return respond::denied(&self.host, self.port, d, hint);
        }
        respond::forbidden(format!("gatewrap: egress to {hp} was denied ({}).\n", d.reason))
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

/// Decide with the current policy; count an allow against its rule's budget (a spent one
/// turns it into a denial, reason `budget`, told on stderr once per window); then apply
/// the mode: `report` lets a denial (`ask` included) through unless it is fixed.
fn carry_out(ctx: &Ctx, host: Host, port: u16, decide: impl FnOnce(&Policy, &Host) -> Decision) -> Admission {
    let (mut decision, mode) = {
        let policy = ctx.policy.read().unwrap_or_else(|p| p.into_inner());
        (decide(&policy, &host), policy.mode)
    };
    let mut over_budget = None;
    if let (Action::Allow, Some(budget), Some(rule)) = (decision.action, decision.budget, decision.rule.as_deref()) {
        if let Spend::Over { first, resets_in } = ctx.budgets.spend(rule, &budget, Instant::now()) {
            if first {
                ctx.notices.say(&show_budget_spent(rule, &budget, resets_in, mode == Mode::Report));
            }
            decision.action = Action::Deny;
            decision.reason = REASON_BUDGET.into();
            decision.allow_private = false;
            over_budget = Some((budget, resets_in));
        }
    }
    let (proceed, would) = match (decision.action, mode) {
        (Action::Allow, _) => (true, None),
        (Action::Deny | Action::Ask, Mode::Report) if !decision.fixed => (true, Some("deny")),
        (Action::Deny | Action::Ask, _) => (false, None),
    };
    Admission { host, port, decision, proceed, would, over_budget }
}
