//! The policy model (independent of the file format) and the one decision function.

use std::net::IpAddr;

use super::canon::{Host, HostPattern};

/// Ports a rule without `port`/`ports` applies to: plain HTTP and HTTPS.
pub const WEB_PORTS: [u16; 2] = [80, 443];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Allow,
    Deny,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Allow => "allow",
            Action::Deny => "deny",
        }
    }
}

/// `enforce`: the decision is carried out. `report`: everything is let through and the
/// audit record says what enforce would have done (`would = "deny"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Enforce,
    Report,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Report => "report",
        }
    }
}

/// Where a rule came from: a command-line flag or the policy file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Cli,
    File,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ports {
    /// No port given: [`WEB_PORTS`].
    Web,
    List(Vec<u16>),
}

impl Ports {
    pub fn contains(&self, port: u16) -> bool {
        match self {
            Ports::Web => WEB_PORTS.contains(&port),
            Ports::List(list) => list.contains(&port),
        }
    }

    pub fn to_vec(&self) -> Vec<u16> {
        match self {
            Ports::Web => WEB_PORTS.to_vec(),
            Ports::List(list) => list.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Rule {
    /// `FILE:rule[N]` for file rules, the flag (e.g. `--allow pypi.org`) for CLI rules.
    pub id: String,
    pub host: HostPattern,
    pub ports: Ports,
    pub action: Action,
    pub origin: Origin,
    /// 1-based line of the `[[rule]]` header, for file rules.
    pub line: Option<usize>,
    /// `allow_private = true`: the names this (allow) rule matches may resolve to
    /// loopback, private, link-local, CGNAT, documentation, benchmarking and reserved
    /// addresses (never metadata nor embedded IPv4; see `ssrf::Class::allow_private_covers`).
    pub allow_private: bool,
    /// `inspect = true`: an https CONNECT this rule matches is TLS-inspected (the gate
    /// terminates TLS with a leaf certificate of its own CA) so that each inner request is
    /// decided by [`Policy::decide_request`] on its method and path.
    pub inspect: bool,
}

impl Rule {
    pub fn matches(&self, host: &Host, port: u16) -> bool {
        self.ports.contains(port) && self.host.matches(host)
    }
}

/// The outcome of [`Policy::decide`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub action: Action,
    /// `policy: rule ID`, `policy: default deny|allow` or [`REASON_UNSPECIFIED`].
    pub reason: String,
    /// The matching rule's id; `None` when the default applied (or the decision is fixed).
    pub rule: Option<String>,
    /// True when no rule and no mode can change the outcome: the destination is one the
    /// gate never dials (an unspecified address). `report` mode does not override it.
    pub fixed: bool,
    /// The matching rule allows and has `allow_private = true` (see [`Rule::allow_private`]).
    pub allow_private: bool,
    /// Only from [`Policy::decide_connect`]: the tunnel is to be TLS-inspected, and each
    /// inner request decided by [`Policy::decide_request`] (see [`Rule::inspect`]).
    pub inspect: bool,
}

/// The scheme of a request the gate decides on: `http` for an absolute-form request,
/// `https` for a request inside an inspected CONNECT tunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
}

impl Scheme {
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }
}

/// One HTTP request as the gate will carry it out: canonical host, port, scheme, method
/// (as sent, e.g. `"POST"`) and the path of the request target (origin form, with query).
#[derive(Debug, Clone, Copy)]
pub struct RequestFacts<'a> {
    pub host: &'a Host,
    pub port: u16,
    pub scheme: Scheme,
    pub method: &'a str,
    pub path: &'a str,
}

/// Reason of the fixed denial of an unspecified address (`0.0.0.0`, `::`).
pub const REASON_UNSPECIFIED: &str = "policy: unspecified address";

impl Decision {
    pub fn default_applied(&self) -> bool {
        self.rule.is_none() && !self.fixed
    }
}

#[derive(Debug, Clone)]
pub struct Policy {
    pub default: Action,
    pub mode: Mode,
    /// Rules from `--allow`/`--deny`, in the order added.
    pub cli_rules: Vec<Rule>,
    /// Rules from the policy file, in file order.
    pub file_rules: Vec<Rule>,
}

impl Policy {
    pub fn new(default: Action) -> Self {
        Policy { default, mode: Mode::Enforce, cli_rules: Vec::new(), file_rules: Vec::new() }
    }

    /// All rules in evaluation order.
    pub fn rules(&self) -> impl Iterator<Item = &Rule> {
        self.cli_rules.iter().chain(self.file_rules.iter())
    }

    /// Decide on a canonical destination.
    ///
    /// An unspecified address (`0.0.0.0`, `::`, `::ffff:0.0.0.0`) is denied before any rule
    /// is looked at (reason [`REASON_UNSPECIFIED`], [`Decision::fixed`]): dialled, it would
    /// reach the gate's own host. Otherwise the evaluation order is:
    /// 1. Command-line rules (`--allow`/`--deny`), in the order they were added.
    /// 2. Policy-file rules, in file order.
    /// 3. The first rule whose host pattern matches `host` and whose ports include `port`
    ///    (no ports given = 80 and 443) decides; its id is the reason.
    /// 4. No rule matched: the policy's `default` decides (reason `policy: default ...`).
    ///
    /// `mode` is not applied here: the decision is what `enforce` would do; the gate lets a
    /// denied destination through in `report` mode (unless the denial is fixed) and records
    /// `would = "deny"`.
    pub fn decide(&self, host: &Host, port: u16) -> Decision {
        if host.is_unspecified() {
            return Decision {
                action: Action::Deny,
                reason: REASON_UNSPECIFIED.into(),
                rule: None,
                fixed: true,
                allow_private: false,
                inspect: false,
            };
        }
        match self.rules().find(|r| r.matches(host, port)) {
            Some(rule) => Decision {
                action: rule.action,
                reason: format!("policy: rule {}", rule.id),
                rule: Some(rule.id.clone()),
                fixed: false,
                allow_private: rule.allow_private && rule.action == Action::Allow,
                inspect: false,
            },
            None => Decision {
                action: self.default,
                reason: format!("policy: default {}", self.default.as_str()),
                rule: None,
                fixed: false,
                allow_private: false,
                inspect: false,
            },
        }
    }

    /// Decide on a CONNECT to `host:port` (the tunnel as a whole). When the decision allows
    /// and the matching rule has `inspect = true`, [`Decision::inspect`] is set: the gate
    /// terminates TLS and decides each inner request with [`Policy::decide_request`].
    pub fn decide_connect(&self, host: &Host, port: u16) -> Decision {
        let mut d = self.decide(host, port);
        d.inspect = d.action == Action::Allow
            && self.rules().find(|r| r.matches(host, port)).is_some_and(|r| r.inspect);
        d
    }

    /// Decide on one HTTP request: an absolute-form `http://` request, or a request inside
    /// an inspected tunnel (`scheme = https`).
    pub fn decide_request(&self, req: &RequestFacts<'_>) -> Decision {
        self.decide(req.host, req.port)
    }

    /// The id of the rule that allows `ip` on `port` by naming it: the first rule matching
    /// the IP literal is an `allow` rule (only an exact rule can match a literal). The SSRF
    /// guard lets a non-public address through when a rule names it, whatever its class and
    /// whichever host resolved to it: the agent could ask for the address directly anyway.
    pub fn names_ip(&self, ip: IpAddr, port: u16) -> Option<&str> {
        let host = Host::from(ip);
        self.rules()
            .find(|r| r.matches(&host, port))
            .filter(|r| r.action == Action::Allow && r.host == HostPattern::Exact(host.clone()))
            .map(|r| r.id.as_str())
    }
}
