//! The policy model (independent of the file format); the decisions are in `decide.rs`.

use std::time::Duration;

use super::budget::Budget;
use super::canon::{Host, HostPattern};
use super::index::{HostIndex, Slot};
use super::path::PathPattern;
use super::sandbox::Sandbox;

/// Ports a rule without `port`/`ports` applies to: plain HTTP and HTTPS.
pub const WEB_PORTS: [u16; 2] = [80, 443];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Allow,
    Deny,
    /// A breakpoint: the gate holds the request until a human approves, edits or rejects it,
    /// or its timeout denies it (gate/hold.rs); a gate without an approvals store denies it.
    Ask,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Allow => "allow",
            Action::Deny => "deny",
            Action::Ask => "ask",
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

/// How long an approval of an `ask` rule waits when the rule sets no `timeout`.
pub const DEFAULT_ASK_TIMEOUT: Duration = Duration::from_secs(600);

/// What the gate does with a request an `ask` rule holds (with approvals on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// Keep the agent's request open until the approval is decided or expires.
    Wait,
    /// Answer 409 at once (`Retry-After`, the approval id); the retry of the same request
    /// (same digest or Idempotency-Key) goes through once it is approved.
    Return,
}

impl Hold {
    pub fn as_str(self) -> &'static str {
        match self {
            Hold::Wait => "wait",
            Hold::Return => "return",
        }
    }
}

/// Default of `[approvals] held_bytes`: 256 MiB.
pub const DEFAULT_HELD_BYTES: u64 = 256 * 1024 * 1024;

/// Default of `[approvals] reread`: 1 s.
pub const DEFAULT_REREAD: std::time::Duration = std::time::Duration::from_secs(1);

/// The policy's `[approvals]` table: limits of the gate's holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApprovalLimits {
    /// `held_bytes = N`: most bytes of request bodies one gate holds in memory for
    /// approvals at once, over all its pending holds ([`DEFAULT_HELD_BYTES`]).
    pub held_bytes: u64,
    /// `max_pending = N`: most pending approvals of one run
    /// ([`crate::approvals::DEFAULT_MAX_PENDING`]).
    pub max_pending: i64,
    /// `max_pending_store = N`: most pending approvals in the store, all runs together
    /// ([`crate::approvals::DEFAULT_MAX_PENDING_STORE`]).
    pub max_pending_store: i64,
    /// `reread = "1s"`: how often a held request (and the wait endpoint) re-reads the store
    /// when no wake-up came ([`DEFAULT_REREAD`]). A decision wakes its run's holds at once
    /// (`approvals::wake`); the re-read only bounds the wait of a lost wake-up, and costs a
    /// store read per held request each time: longer for many holds on a busy store.
    pub reread: std::time::Duration,
}

impl Default for ApprovalLimits {
    fn default() -> Self {
        ApprovalLimits {
            held_bytes: DEFAULT_HELD_BYTES,
            max_pending: crate::approvals::DEFAULT_MAX_PENDING,
            max_pending_store: crate::approvals::DEFAULT_MAX_PENDING_STORE,
            reread: DEFAULT_REREAD,
        }
    }
}

/// The policy's `[notify]` table (used by gatewrap's Python side).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Notify {
    /// `webhook = "https://..."`: where approvals are posted.
    pub webhook: Option<String>,
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
    /// `methods = [..]`: upper-case HTTP method tokens (RFC 9110 §9); `None` = any method.
    pub methods: Option<Vec<String>>,
    /// `path = ".."`: see [`PathPattern`]; `None` = any path.
    pub path: Option<PathPattern>,
    /// `schemes = [..]`: `None` = both. A CONNECT tunnel counts as `https`.
    pub schemes: Option<Vec<Scheme>>,
    /// `timeout = "10m"` of an `ask` rule: how long an approval may wait (default
    /// [`DEFAULT_ASK_TIMEOUT`]); a timeout is a denial.
    pub timeout: Option<Duration>,
    /// `hold = "wait" | "return"` of an `ask` rule.
    pub hold: Hold,
    /// `grants = false` of an `ask` rule: its approvals may not carry a grant.
    pub grants: bool,
    /// `budget = { count, per }` of an allow rule.
    pub budget: Option<Budget>,
    /// `inject = { secret, .. }`: the gate puts that secret's value in the requests this
    /// rule allows (see `secret.rs`).
    pub inject: Option<std::sync::Arc<super::secret::Inject>>,
}

impl Rule {
    /// A rule for `host` on `ports` with `action` and nothing else.
    pub fn new(id: String, host: HostPattern, ports: Ports, action: Action, origin: Origin) -> Rule {
        Rule {
            id,
            host,
            ports,
            action,
            origin,
            line: None,
            allow_private: false,
            inspect: false,
            methods: None,
            path: None,
            schemes: None,
            timeout: None,
            hold: Hold::Wait,
            grants: true,
            budget: None,
            inject: None,
        }
    }

    /// Host and port match (the destination; methods, path and scheme aside).
    pub fn matches(&self, host: &Host, port: u16) -> bool {
        self.ports.contains(port) && self.host.matches(host)
    }

    /// The rule looks inside requests (`methods` or `path`): a tunnel hides both.
    pub fn needs_request(&self) -> bool {
        self.methods.is_some() || self.path.is_some()
    }

    /// `schemes` is absent or lists `scheme`.
    pub fn covers_scheme(&self, scheme: Scheme) -> bool {
        self.schemes.as_ref().is_none_or(|s| s.contains(&scheme))
    }
}

/// The outcome of [`Policy::decide_connect`] or [`Policy::decide_request`].
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
    /// The allowing rule's budget: the gate counts this request against it (never set on
    /// a tunnel that is inspected: its inner requests are counted instead).
    pub budget: Option<Budget>,
    /// The deciding rule's `inject` (allow and ask rules; on requests, not tunnels).
    pub inject: Option<std::sync::Arc<super::secret::Inject>>,
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
    cli_rules: Vec<Rule>,
    /// Rules from the policy file, in file order.
    file_rules: Vec<Rule>,
    /// Both lists by host; [`Policy::push_rule`], the only way a rule comes in, keeps it.
    index: HostIndex,
    /// The file's `[sandbox]` paths (for the jail, not for decisions).
    pub sandbox: Sandbox,
    /// The file's `[notify]` table.
    pub notify: Notify,
    /// The file's `[approvals]` table.
    pub approvals: ApprovalLimits,
    /// The file's top-level `public_ranges`: ranges the SSRF guard counts as public, on top
    /// of the gate's own (`--public-range`); see [`super::ssrf::PublicRanges`].
    pub public_ranges: super::ssrf::PublicRanges,
    /// The `[[secret]]` tables: the policy file's, then the host's secrets file's.
    pub secrets: Vec<super::secret::SecretDef>,
}

impl Policy {
    pub fn new(default: Action) -> Self {
        Policy {
            default,
            mode: Mode::Enforce,
            cli_rules: Vec::new(),
            file_rules: Vec::new(),
            index: HostIndex::default(),
            sandbox: Sandbox::default(),
            notify: Notify::default(),
            approvals: ApprovalLimits::default(),
            public_ranges: super::ssrf::PublicRanges::default(),
            secrets: Vec::new(),
        }
    }

    /// The rule with id `id`.
    pub fn rule(&self, id: &str) -> Option<&Rule> {
        self.rules().find(|r| r.id == id)
    }

    /// All rules in evaluation order.
    pub fn rules(&self) -> impl Iterator<Item = &Rule> {
        self.cli_rules.iter().chain(self.file_rules.iter())
    }

    /// Rules from `--allow`/`--deny`, in the order added.
    pub fn cli_rules(&self) -> &[Rule] {
        &self.cli_rules
    }

    /// Rules from the policy file, in file order.
    pub fn file_rules(&self) -> &[Rule] {
        &self.file_rules
    }

    /// Make room for `n` more file rules (a file's, before [`Policy::push_rule`]s them).
    pub(super) fn reserve_file_rules(&mut self, n: usize) {
        self.file_rules.reserve_exact(n);
    }

    /// Add `rule` after the others of its [`Origin`] (a command-line rule still comes before
    /// every file rule), and index it by host.
    pub(super) fn push_rule(&mut self, rule: Rule) {
        let (list, slot): (_, fn(usize) -> Slot) = match rule.origin {
            Origin::Cli => (&mut self.cli_rules, Slot::Cli),
            Origin::File => (&mut self.file_rules, Slot::File),
        };
        self.index.insert(slot(list.len()), &rule.host);
        list.push(rule);
    }

    pub(super) fn index(&self) -> &HostIndex {
        &self.index
    }

    /// The rule at `slot` (a slot from [`Policy::index`]).
    pub(super) fn at(&self, slot: Slot) -> &Rule {
        match slot {
            Slot::Cli(i) => &self.cli_rules[i],
            Slot::File(i) => &self.file_rules[i],
        }
    }
}
