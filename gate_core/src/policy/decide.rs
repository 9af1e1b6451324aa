//! The decisions: a CONNECT tunnel as a whole ([`Policy::decide_connect`]) and one HTTP
//! request ([`Policy::decide_request`]). Both are what `enforce` mode would do; the gate
//! applies `mode`, `ask` and budgets (`gate/admit.rs`).

use std::net::IpAddr;

use super::canon::{Host, HostPattern};
use super::path::{canonical_path, without_query, PathError};
use super::rules::{Action, Decision, Policy, RequestFacts, Rule, Scheme, REASON_UNSPECIFIED};

/// Reason of an `ask` decision after its prefix: the gate holds the request for a human (gate/hold.rs).
pub const ASK_REASON: &str = "is a breakpoint";

impl Decision {
    fn unspecified() -> Decision {
        Decision {
            action: Action::Deny,
            reason: REASON_UNSPECIFIED.into(),
            rule: None,
            fixed: true,
            allow_private: false,
            inspect: false,
            budget: None,
            inject: None,
        }
    }

    /// `rule` decides with its action.
    fn by_rule(rule: &Rule) -> Decision {
        let reason = match rule.action {
            Action::Ask => format!("ask: rule {} {ASK_REASON}", rule.id),
            _ => format!("policy: rule {}", rule.id),
        };
        let allows = rule.action == Action::Allow;
        Decision {
            action: rule.action,
            reason,
            rule: Some(rule.id.clone()),
            fixed: false,
            // An `ask` carries it too: what a human approves is dialled under the same guard.
            allow_private: rule.allow_private && rule.action != Action::Deny,
            inspect: false,
            budget: rule.budget.filter(|_| allows),
            inject: rule.inject.clone().filter(|_| rule.action != Action::Deny),
        }
    }

    fn by_default(default: Action) -> Decision {
        let reason = match default {
            Action::Ask => format!("ask: the default {ASK_REASON}"),
            a => format!("policy: default {}", a.as_str()),
        };
        Decision { action: default, reason, rule: None, fixed: false, allow_private: false, inspect: false, budget: None, inject: None }
    }

    /// A denial by `rule` for a reason other than its action (a request it cannot judge).
    fn refused(rule: &Rule, reason: String) -> Decision {
        Decision { action: Action::Deny, reason, inject: None, ..Decision::by_rule(rule) }
    }
}

/// RFC 9110 §5.6.2 token of upper-case letters, digits and symbols (no lower case).
pub fn is_upper_method(m: &str) -> bool {
    !m.is_empty()
        && m.bytes().all(|b| {
            b.is_ascii_uppercase() || b.is_ascii_digit() || b"!#$%&'*+-.^_`|~".contains(&b)
        })
}

impl Policy {
    /// Decide on a CONNECT tunnel to canonical `host:port`. Its requests cannot be seen unless
    /// it is inspected, nor its scheme: a tunnel to port 443 counts as `https`, a tunnel to any
    /// other port as `http` *and* `https` (it may carry plain http, e.g. to port 80). Order:
    /// 1. An unspecified address (`0.0.0.0`, `::`, `::ffff:0.0.0.0`) is denied before any
    ///    rule ([`REASON_UNSPECIFIED`], [`Decision::fixed`]): dialled, it reaches the gate's host.
    /// 2. Rules in order: command-line `--deny`, then `--allow`, then the file's in file
    ///    order. A rule is considered when its host pattern matches `host`, its ports include
    ///    `port` (none given = 80 and 443) and its `schemes` (if any) cover the tunnel's:
    ///    an `allow` rule must cover every scheme the tunnel may carry, a `deny` or `ask`
    ///    rule any of them (fail closed: `schemes = ["http"]` on a deny rule holds for a
    ///    tunnel to port 80 too).
    /// 3. The first considered rule without `methods`/`path` decides the tunnel with its
    ///    action; an allow rule with `inspect = true` marks it [`Decision::inspect`].
    /// 4. A considered rule with `methods`/`path` and `inspect = true`: the tunnel is
    ///    inspected (allowed, [`Decision::inspect`]) and each inner request is decided by
    ///    [`Policy::decide_request`], from step 1, with scheme `https`.
    /// 5. A considered rule with `methods`/`path` but no `inspect` cannot be evaluated (fail
    ///    closed): an `allow` rule is skipped (it might not match); a `deny` or `ask` rule
    ///    denies the tunnel, the reason saying it needs `inspect = true`.
    /// 6. No rule decided: the policy's `default` (reason `policy: default ...`).
    ///
    /// Rules whose host cannot match are not looked at ([`Policy::candidates`]).
    pub fn decide_connect(&self, host: &Host, port: u16) -> Decision {
        self.decide_connect_among(self.candidates(host), host, port)
    }

    /// [`Policy::decide_connect`] looking at every rule: the oracle of tests_index.rs.
    #[cfg(test)]
    pub(super) fn decide_connect_linear(&self, host: &Host, port: u16) -> Decision {
        self.decide_connect_among(self.rules(), host, port)
    }

    /// [`Policy::decide_connect`] on `rules` (in evaluation order; any rule left out must not
    /// match `host`).
    fn decide_connect_among<'a>(&self, rules: impl Iterator<Item = &'a Rule>, host: &Host, port: u16) -> Decision {
        if host.is_unspecified() {
            return Decision::unspecified();
        }
        let schemes: &[Scheme] = if port == 443 { &[Scheme::Https] } else { &[Scheme::Http, Scheme::Https] };
        let covers = |r: &Rule| match r.action {
            Action::Allow => schemes.iter().all(|s| r.covers_scheme(*s)),
            _ => schemes.iter().any(|s| r.covers_scheme(*s)),
        };
        let considered = rules.filter(|r| r.matches(host, port) && covers(r));
        for rule in considered {
            if !rule.needs_request() && !(rule.inspect && rule.action == Action::Ask) {
                let mut d = Decision::by_rule(rule);
                d.inject = None; // a tunnel's requests carry their own decision
                if rule.inspect && rule.action == Action::Allow {
                    d.inspect = true;
                    d.budget = None;
                }
                return d;
            }
            // Conditions on the request, or an ask rule that inspects: the tunnel opens
            // inspected and each inner request is decided (and, for ask, held) on its own,
            // so the human sees the method, path and body, not only host:port.
            if rule.inspect {
                return Decision {
                    action: Action::Allow,
                    reason: format!("policy: rule {} inspects the tunnel", rule.id),
                    inspect: true,
                    budget: None,
                    inject: None,
                    ..Decision::by_rule(rule)
                };
            }
            if rule.action != Action::Allow {
                return Decision::refused(
                    rule,
                    format!(
                        "policy: rule {} matches methods or paths, which a tunnel hides; it needs `inspect = true`",
                        rule.id
                    ),
                );
            }
        }
        Decision::by_default(self.default)
    }

    /// Decide on one HTTP request: an absolute-form `http://` request, or a request inside
    /// an inspected tunnel (`scheme = https`). Evaluation order:
    /// 1. An unspecified address is denied before any rule, as in [`Policy::decide_connect`].
    /// 2. Rules in order (`--deny`, `--allow`, then the file's). A rule matches when its
    ///    host pattern, ports and `schemes` (if any) match, its `methods` (if any) list the
    ///    request's method exactly (RFC 9110 §9.1: case-sensitive), and its `path` (if any)
    ///    matches the request's path, percent-decoded once ([`canonical_path`]; the query is
    ///    not matched). `inspect` plays no part here.
    /// 3. The first matching rule decides with its action.
    /// 4. A rule that has to look at a method that is not upper case, or at a path that
    ///    [`canonical_path`] refuses (encoded `/`, dot segments, ...), denies the request
    ///    (reason `method: ...` / `path: ...`, naming the rule): fail closed, no guessing.
    /// 5. No rule matched: the policy's `default`.
    ///
    /// Rules whose host cannot match are not looked at ([`Policy::candidates`]).
    pub fn decide_request(&self, req: &RequestFacts<'_>) -> Decision {
        self.decide_request_among(self.candidates(req.host), req)
    }

    /// [`Policy::decide_request`] looking at every rule: the oracle of tests_index.rs.
    #[cfg(test)]
    pub(super) fn decide_request_linear(&self, req: &RequestFacts<'_>) -> Decision {
        self.decide_request_among(self.rules(), req)
    }

    /// [`Policy::decide_request`] on `rules` (as [`Policy::decide_connect_among`]).
    fn decide_request_among<'a>(&self, rules: impl Iterator<Item = &'a Rule>, req: &RequestFacts<'_>) -> Decision {
        if req.host.is_unspecified() {
            return Decision::unspecified();
        }
        let mut path: Option<Result<String, PathError>> = None;
        for rule in rules.filter(|r| r.matches(req.host, req.port) && r.covers_scheme(req.scheme)) {
            if let Some(methods) = &rule.methods {
                if !is_upper_method(req.method) {
                    return Decision::refused(
                        rule,
                        format!("method: {:?} is not upper case; rule {} matches methods exactly", req.method, rule.id),
                    );
                }
                if !methods.iter().any(|m| m == req.method) {
                    continue;
                }
            }
            if let Some(pattern) = &rule.path {
                match path.get_or_insert_with(|| canonical_path(without_query(req.path))) {
                    Err(e) => {
                        return Decision::refused(
                            rule,
                            format!("path: {e}; rule {} matches paths, so the gate refuses it", rule.id),
                        )
                    }
                    Ok(p) if !pattern.matches(p) => continue,
                    Ok(_) => {}
                }
            }
            return Decision::by_rule(rule);
        }
        Decision::by_default(self.default)
    }

    /// The id of the rule that allows `ip` on `port` by naming it: the first rule matching
    /// the IP literal is an `allow` rule (only an exact rule can match a literal) for every
    /// request to it (no `methods`, `path` nor `schemes`). The SSRF guard lets a non-public
    /// address through when a rule names it, whatever its class and whichever host resolved
    /// to it: the agent could ask for the address directly anyway. A rule scoped to some
    /// requests names the address only for the requests it decides itself (the guard's
    /// `named_by_decision`): it must not open the address to a name resolving to it, nor to
    /// the default.
    pub fn names_ip(&self, ip: IpAddr, port: u16) -> Option<&str> {
        let host = Host::from(ip);
        Self::names_ip_among(self.candidates(&host), &host, port)
    }

    /// [`Policy::names_ip`] looking at every rule: the oracle of tests_index.rs.
    #[cfg(test)]
    pub(super) fn names_ip_linear(&self, ip: IpAddr, port: u16) -> Option<&str> {
        let host = Host::from(ip);
        Self::names_ip_among(self.rules(), &host, port)
    }

    fn names_ip_among<'a>(mut rules: impl Iterator<Item = &'a Rule>, host: &Host, port: u16) -> Option<&'a str> {
        rules
            .find(|r| r.matches(host, port))
            .filter(|r| r.action == Action::Allow && matches!(&r.host, HostPattern::Exact(h) if h == host))
            .filter(|r| r.methods.is_none() && r.path.is_none() && r.schemes.is_none())
            .map(|r| r.id.as_str())
    }
}
