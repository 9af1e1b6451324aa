//! The policy file (TOML, schema `version = 1`), kept apart from the model in `rules.rs`.
//!
//! ```toml
//! version = 1            # optional; only 1 is accepted
//! default = "deny"       # "deny" (default) | "allow"
//! mode = "enforce"       # "enforce" (default) | "report"
//! public_ranges = ["10.20.0.0/16"]  # optional: CIDRs the SSRF guard counts as public, for
//!                        # every rule (as `gatewrap run --public-range`); never metadata
//!
//! [[rule]]
//! host = "*.example.com" # required: exact host, IP literal, or "*." + name (strict subdomains)
//! ports = [443, 8443]    # optional: `port = N`, `port = [..]` or `ports = [..]`; none = 80 and 443
//! action = "allow"       # required: "allow" | "deny"
//! allow_private = true   # optional (allow and ask rules on names only): the names may resolve
//!                        # to loopback/private/link-local/CGNAT/documentation/reserved
//!                        # addresses; never metadata nor IPv6-embedded IPv4
//! inspect = true         # optional: TLS-inspect https CONNECTs this rule matches
//! methods = ["POST"]     # optional: upper-case HTTP method tokens (RFC 9110 §9)
//! path = "/v1/*/files"   # optional: segment prefix, or a glob with * / ** (see `path.rs`)
//! schemes = ["http"]     # optional: "http" and/or "https" (a CONNECT tunnel is https)
//! timeout = "10m"        # optional, "ask" rules only: how long an approval may wait
//! hold = "wait"          # optional, "ask" rules only: "wait" (default: the request is held
//!                        # open until decided) | "return" (409 at once; the retry goes through)
//! grants = false         # optional, "ask" rules only: the human may not answer with a grant
//! budget = { count = 6, per = "10m" }  # optional, "allow" rules only
//! inject = { secret = "github", as = "bearer" }  # optional: see `secret.rs` (with `[[secret]]`)
//!
//! [notify]               # optional: where approvals are announced (gatewrap's Python side)
//! webhook = "https://hooks.example/T0"
//!
//! [approvals]            # optional: limits of the gate's holds
//! held_bytes = 268435456 # most bytes of request bodies held in memory at once (256 MiB)
//! max_pending = 100      # most pending approvals of this run; past it a request is denied (429)
//! max_pending_store = 1000 # most pending approvals in the store, all runs (then 503)
//! reread = "1s"          # how often a held request re-reads the store without a wake-up
//!
//! [sandbox]              # optional: host paths shown in the agent's jail (`sandbox.rs`)
//! ro_bind = ["/opt/tools"]   # read-only, as `gatewrap run --ro-bind`
//! bind = ["/srv/scratch"]    # writable, as `gatewrap run --bind`
//! env = ["OPENAI_API_KEY"]   # the agent's environment, as `gatewrap run --env`
//! unprotect = [".vscode"]    # a protected path left writable, as `gatewrap run --unprotect`
//! ```
//! `default` may also be `"ask"`. Durations are `duration.rs`'s grammar (`30s`, `10m`, `2h`).
//! Any other key is refused with its line, and the nearest known key when one is close
//! (the known keys are the parser's own, as serde lists them in its error).

use serde::Deserialize;
use toml::Spanned;

use super::budget::Budget;
use super::ssrf::PublicRanges;
use super::canon::{canonical_pattern, Host, HostPattern};
use super::decide::is_upper_method;
use super::duration::parse_duration;
use super::path::PathPattern;
use super::rules::{Action, ApprovalLimits, Hold, Mode, Notify, Origin, Policy, Ports, Rule, Scheme};
use super::secret::{InjectSchema, SecretDef, SecretSchema};
use super::sandbox::{path_problem, unprotect_problem, Sandbox, SandboxPath};
use super::PolicyError;

type SpannedList<T> = Spanned<Vec<Spanned<T>>>;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSchema {
    version: Option<Spanned<i64>>,
    default: Option<Spanned<String>>,
    mode: Option<Spanned<String>>,
    public_ranges: Option<SpannedList<String>>,
    #[serde(default)]
    rule: Vec<Spanned<RuleSchema>>,
    #[serde(default)]
    secret: Vec<Spanned<SecretSchema>>,
    sandbox: Option<SandboxSchema>,
    notify: Option<NotifySchema>,
    approvals: Option<ApprovalsSchema>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ApprovalsSchema {
    held_bytes: Option<Spanned<i64>>,
    max_pending: Option<Spanned<i64>>,
    max_pending_store: Option<Spanned<i64>>,
    reread: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NotifySchema {
    webhook: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SandboxSchema {
    ro_bind: Option<SpannedList<String>>,
    bind: Option<SpannedList<String>>,
    env: Option<SpannedList<String>>,
    unprotect: Option<SpannedList<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleSchema {
    host: Spanned<String>,
    port: Option<Spanned<OneOrMore>>,
    ports: Option<Spanned<Vec<Spanned<i64>>>>,
    action: Spanned<String>,
    allow_private: Option<Spanned<bool>>,
    inspect: Option<Spanned<bool>>,
    methods: Option<SpannedList<String>>,
    path: Option<Spanned<String>>,
    schemes: Option<SpannedList<String>>,
    timeout: Option<Spanned<String>>,
    hold: Option<Spanned<String>>,
    grants: Option<Spanned<bool>>,
    budget: Option<Spanned<BudgetSchema>>,
    inject: Option<Spanned<InjectSchema>>,
}

/// `port = 443` or `port = [443, 8443]`: one port or a list, as the model holds a list.
struct OneOrMore(Vec<i64>);

impl<'de> Deserialize<'de> for OneOrMore {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = OneOrMore;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("one port (443) or a list of ports ([443, 8443])")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<OneOrMore, E> {
                Ok(OneOrMore(vec![v]))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<OneOrMore, A::Error> {
                let mut out = Vec::new();
                while let Some(p) = seq.next_element::<i64>()? {
                    out.push(p);
                }
                Ok(OneOrMore(out))
            }
        }
        d.deserialize_any(Visitor)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BudgetSchema {
    count: Spanned<i64>,
    per: Spanned<String>,
}

/// Reads policy text; `source` names the file in messages and rule ids.
struct Reader<'a> {
    text: &'a str,
    source: &'a str,
    /// Byte offsets of the `\n`s in `text`, in order: a line number is a binary search,
    /// so a file of many rules is read in O(n log n), not O(n²).
    newlines: Vec<usize>,
}

impl Reader<'_> {
    /// The 1-based line of byte `offset` (past the end: the last line).
    fn line(&self, offset: usize) -> usize {
        1 + self.newlines.partition_point(|&nl| nl < offset)
    }

    fn err(&self, offset: usize, msg: impl Into<String>) -> PolicyError {
        PolicyError::File { file: self.source.to_string(), line: self.line(offset), msg: msg.into() }
    }

    fn toml_err(&self, e: &toml::de::Error) -> PolicyError {
        let offset = e.span().map(|s| s.start).unwrap_or(0);
        let m = e.message();
        let msg = if let Some(key) = quoted_after(m, "unknown field `") {
            match nearest_key(key, m) {
                Some(near) => format!("unknown key `{key}`; did you mean `{near}`?"),
                None => format!("unknown key `{key}`"),
            }
        } else if let Some(key) = quoted_after(m, "missing field `") {
            format!("missing key `{key}`")
        } else {
            m.trim_end().to_string()
        };
        self.err(offset, msg)
    }

    fn action(&self, v: &Spanned<String>) -> Result<Action, PolicyError> {
        parse_action(v.get_ref()).map_err(|e| self.err(v.span().start, e.to_string()))
    }

    fn port(&self, v: &Spanned<i64>) -> Result<u16, PolicyError> {
        self.port_at(v.span().start, *v.get_ref())
    }

    fn port_at(&self, offset: usize, v: i64) -> Result<u16, PolicyError> {
        match u16::try_from(v) {
            Ok(p) if p != 0 => Ok(p),
            _ => Err(self.err(offset, format!("invalid port {v}: expected 1-65535"))),
        }
    }

    fn rule(&self, index: usize, spanned: &Spanned<RuleSchema>) -> Result<Rule, PolicyError> {
        let r = spanned.get_ref();
        let host = canonical_pattern(r.host.get_ref())
            .map_err(|e| self.err(r.host.span().start, e.to_string()))?;
        let ports = match (&r.port, &r.ports) {
            (Some(_), Some(p)) => {
                return Err(self.err(p.span().start, "use either `port` or `ports`, not both"))
            }
            (Some(p), None) if p.get_ref().0.is_empty() => return Err(self.err(p.span().start, "`port` is empty")),
            (Some(p), None) => {
                Ports::List(p.get_ref().0.iter().map(|&n| self.port_at(p.span().start, n)).collect::<Result<_, _>>()?)
            }
            (None, Some(list)) if list.get_ref().is_empty() => {
                return Err(self.err(list.span().start, "`ports` is empty"))
            }
            (None, Some(list)) => {
                Ports::List(list.get_ref().iter().map(|p| self.port(p)).collect::<Result<_, _>>()?)
            }
            (None, None) => Ports::Web,
        };
        let line = self.line(spanned.span().start);
        let action = self.action(&r.action)?;
        let allow_private = match &r.allow_private {
            Some(v) if *v.get_ref() && action == Action::Deny => {
                return Err(self.err(v.span().start, "`allow_private` only applies to \"allow\" and \"ask\" rules"))
            }
            Some(v) if *v.get_ref() && !matches!(host, HostPattern::Exact(Host::Name(_)) | HostPattern::Subdomains(_)) => {
                return Err(self.err(
                    v.span().start,
                    "`allow_private` applies to names; a rule naming an address allows it already",
                ))
            }
            Some(v) => *v.get_ref(),
            None => false,
        };
        let mut rule = Rule::new(format!("{}:rule[{}]", self.source, index + 1), host, ports, action, Origin::File);
        rule.line = Some(line);
        rule.allow_private = allow_private;
        rule.inspect = r.inspect.as_ref().is_some_and(|v| *v.get_ref());
        rule.methods = r.methods.as_ref().map(|m| self.methods(m)).transpose()?;
        rule.path = match &r.path {
            Some(p) => Some(PathPattern::parse(p.get_ref()).map_err(|e| self.err(p.span().start, e.to_string()))?),
            None => None,
        };
        rule.schemes = r.schemes.as_ref().map(|s| self.schemes(s)).transpose()?;
        rule.timeout = match &r.timeout {
            Some(t) if action != Action::Ask => {
                return Err(self.err(t.span().start, "`timeout` only applies to \"ask\" rules"))
            }
            Some(t) => Some(parse_duration(t.get_ref()).map_err(|e| self.err(t.span().start, e.to_string()))?),
            None => None,
        };
        rule.hold = match &r.hold {
            Some(h) if action != Action::Ask => return Err(self.err(h.span().start, "`hold` only applies to \"ask\" rules")),
            Some(h) => match h.get_ref().as_str() {
                "wait" => Hold::Wait,
                "return" => Hold::Return,
                other => return Err(self.err(h.span().start, format!("invalid hold {other:?}: expected \"wait\" or \"return\""))),
            },
            None => Hold::Wait,
        };
        rule.grants = match &r.grants {
            Some(g) if action != Action::Ask => return Err(self.err(g.span().start, "`grants` only applies to \"ask\" rules")),
            Some(g) => *g.get_ref(),
            None => true,
        };
        rule.budget = match &r.budget {
            Some(b) if action != Action::Allow => {
                return Err(self.err(b.span().start, "`budget` only applies to \"allow\" rules"))
            }
            Some(b) => Some(self.budget(b.get_ref())?),
            None => None,
        };
        rule.inject = match &r.inject {
            Some(i) => Some(i.get_ref().parse(&rule, i.span().start).map_err(|(at, msg)| self.err(at, msg))?),
            None => None,
        };
        Ok(rule)
    }

    /// The `[[secret]]` tables, names unique among them.
    fn secrets(&self, list: &[Spanned<SecretSchema>]) -> Result<Vec<SecretDef>, PolicyError> {
        let mut out: Vec<SecretDef> = Vec::with_capacity(list.len());
        for s in list {
            let origin = format!("{}:{}", self.source, self.line(s.span().start));
            let def = s.get_ref().parse(origin).map_err(|(at, msg)| self.err(at, msg))?;
            if let Some(first) = out.iter().find(|d| d.name == def.name) {
                return Err(self.err(s.span().start, format!("secret {:?} is defined twice (first at {})", def.name, first.origin)));
            }
            out.push(def);
        }
        Ok(out)
    }

    fn methods(&self, list: &SpannedList<String>) -> Result<Vec<String>, PolicyError> {
        if list.get_ref().is_empty() {
            return Err(self.err(list.span().start, "`methods` is empty"));
        }
        list.get_ref()
            .iter()
            .map(|m| match is_upper_method(m.get_ref()) {
                true => Ok(m.get_ref().clone()),
                false => Err(self.err(
                    m.span().start,
                    format!("invalid method {:?}: expected an upper-case HTTP method token, e.g. \"POST\"", m.get_ref()),
                )),
            })
            .collect()
    }

    fn schemes(&self, list: &SpannedList<String>) -> Result<Vec<Scheme>, PolicyError> {
        if list.get_ref().is_empty() {
            return Err(self.err(list.span().start, "`schemes` is empty"));
        }
        list.get_ref()
            .iter()
            .map(|s| match s.get_ref().as_str() {
                "http" => Ok(Scheme::Http),
                "https" => Ok(Scheme::Https),
                other => Err(self.err(s.span().start, format!("invalid scheme {other:?}: expected \"http\" or \"https\""))),
            })
            .collect()
    }

    fn budget(&self, b: &BudgetSchema) -> Result<Budget, PolicyError> {
        let count = match u32::try_from(*b.count.get_ref()) {
            Ok(n) if n > 0 => n,
            _ => {
                return Err(self.err(
                    b.count.span().start,
                    format!("invalid budget count {}: expected a whole number from 1 to {}", b.count.get_ref(), u32::MAX),
                ))
            }
        };
        let per = parse_duration(b.per.get_ref()).map_err(|e| self.err(b.per.span().start, e.to_string()))?;
        Ok(Budget { count, per })
    }

    fn sandbox_paths(
        &self,
        list: Option<&SpannedList<String>>,
        problem: fn(&str) -> Option<&'static str>,
    ) -> Result<Vec<SandboxPath>, PolicyError> {
        let Some(list) = list else { return Ok(Vec::new()) };
        list.get_ref()
            .iter()
            .map(|p| match problem(p.get_ref()) {
                Some(why) => Err(self.err(p.span().start, format!("invalid path {:?}: {why}", p.get_ref()))),
                None => Ok(SandboxPath { path: p.get_ref().clone(), line: self.line(p.span().start) }),
            })
            .collect()
    }

    fn sandbox(&self, s: Option<&SandboxSchema>) -> Result<Sandbox, PolicyError> {
        let Some(s) = s else { return Ok(Sandbox::default()) };
        let env = s.env.as_ref().map_or(&[][..], |l| l.get_ref()).iter();
        let env = env.map(|e| SandboxPath { path: e.get_ref().clone(), line: self.line(e.span().start) }).collect();
        Ok(Sandbox {
            ro_bind: self.sandbox_paths(s.ro_bind.as_ref(), path_problem)?,
            bind: self.sandbox_paths(s.bind.as_ref(), path_problem)?,
            unprotect: self.sandbox_paths(s.unprotect.as_ref(), unprotect_problem)?,
            env,
        })
    }

    /// The `[notify]` table: `webhook` must be an http(s) URL (the WHATWG URL parser).
    fn notify(&self, n: Option<&NotifySchema>) -> Result<Notify, PolicyError> {
        let Some(w) = n.and_then(|n| n.webhook.as_ref()) else { return Ok(Notify::default()) };
        match url::Url::parse(w.get_ref()) {
            Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => Ok(Notify { webhook: Some(w.get_ref().clone()) }),
            _ => Err(self.err(w.span().start, format!("invalid webhook {:?}: expected an http:// or https:// URL", w.get_ref()))),
        }
    }

    /// The `[approvals]` table: `held_bytes`, `max_pending`, `max_pending_store`, each a
    /// positive integer (bytes, approvals, approvals), and `reread`, a duration.
    fn approvals(&self, a: Option<&ApprovalsSchema>) -> Result<ApprovalLimits, PolicyError> {
        let mut limits = ApprovalLimits::default();
        let Some(a) = a else { return Ok(limits) };
        let positive = |n: &Option<Spanned<i64>>, key: &str, unit: &str| -> Result<Option<i64>, PolicyError> {
            match n {
                None => Ok(None),
                Some(n) if *n.get_ref() > 0 => Ok(Some(*n.get_ref())),
                Some(n) => Err(self.err(n.span().start, format!("invalid {key} {}: expected a positive number of {unit}", n.get_ref()))),
            }
        };
        if let Some(v) = positive(&a.held_bytes, "held_bytes", "bytes")? {
            limits.held_bytes = v as u64;
        }
        if let Some(v) = positive(&a.max_pending, "max_pending", "approvals")? {
            limits.max_pending = v;
        }
        if let Some(v) = positive(&a.max_pending_store, "max_pending_store", "approvals")? {
            limits.max_pending_store = v;
        }
        if let Some(t) = &a.reread {
            limits.reread = parse_duration(t.get_ref()).map_err(|e| self.err(t.span().start, e.to_string()))?;
        }
        Ok(limits)
    }

    fn policy(&self) -> Result<Policy, PolicyError> {
        let file: FileSchema = toml::from_str(self.text).map_err(|e| self.toml_err(&e))?;
        if let Some(v) = &file.version {
            if *v.get_ref() != 1 {
                return Err(self.err(v.span().start, format!("unsupported version {}: only 1 is known", v.get_ref())));
            }
        }
        let default = match &file.default {
            Some(d) => self.action(d)?,
            None => Action::Deny,
        };
        let mode = match &file.mode {
            None => Mode::Enforce,
            Some(m) => match m.get_ref().as_str() {
                "enforce" => Mode::Enforce,
                "report" => Mode::Report,
                other => {
                    return Err(self.err(
                        m.span().start,
                        format!("invalid mode {other:?}: expected \"enforce\" or \"report\""),
                    ))
                }
            },
        };
        let mut policy = Policy::new(default);
        policy.mode = mode;
        if let Some(list) = &file.public_ranges {
            let texts: Vec<&str> = list.get_ref().iter().map(|r| r.get_ref().as_str()).collect();
            policy.public_ranges = PublicRanges::parse(&texts).map_err(|e| {
                let bad = list.get_ref().iter().find(|r| PublicRanges::parse(&[r.get_ref()]).is_err());
                self.err(bad.map_or(list.span().start, |r| r.span().start), e.to_string())
            })?;
        }
        policy.reserve_file_rules(file.rule.len());
        for (i, r) in file.rule.iter().enumerate() {
            policy.push_rule(self.rule(i, r)?);
        }
        policy.secrets = self.secrets(&file.secret)?;
        policy.sandbox = self.sandbox(file.sandbox.as_ref())?;
        policy.notify = self.notify(file.notify.as_ref())?;
        policy.approvals = self.approvals(file.approvals.as_ref())?;
        Ok(policy)
    }
}

/// The known key nearest to `key` within an edit distance of 2 (a third of a short key's
/// length at most), from the list serde's error `message` gives after "expected" (the
/// parser's own keys, so a key added to a schema comes along); `None` when none is close.
fn nearest_key<'m>(key: &str, message: &'m str) -> Option<&'m str> {
    let (_, known) = message.split_once("expected")?;
    let limit = 2.min(key.chars().count().div_ceil(3)).max(1);
    known
        .split('`')
        .skip(1)
        .step_by(2)
        .map(|k| (edit_distance(key, k), k))
        .filter(|&(d, _)| d <= limit)
        .min_by_key(|&(d, _)| d)
        .map(|(_, k)| k)
}

/// Levenshtein distance (insertions, deletions, substitutions; a swap of two neighbours
/// counts 1, as Damerau's), over chars.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut rows = vec![(0..=b.len()).collect::<Vec<_>>()];
    for i in 1..=a.len() {
        let mut row = vec![i; b.len() + 1];
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            row[j] = (rows[i - 1][j] + 1).min(row[j - 1] + 1).min(rows[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                row[j] = row[j].min(rows[i - 2][j - 2] + 1);
            }
        }
        rows.push(row);
    }
    rows[a.len()][b.len()]
}

fn quoted_after<'m>(message: &'m str, prefix: &str) -> Option<&'m str> {
    let rest = message.strip_prefix(prefix)?;
    rest.split('`').next()
}

/// `allow` | `deny` | `ask` (a breakpoint; denied until approvals exist).
pub fn parse_action(s: &str) -> Result<Action, PolicyError> {
    match s {
        "allow" => Ok(Action::Allow),
        "deny" => Ok(Action::Deny),
        "ask" => Ok(Action::Ask),
        other => Err(PolicyError::Action { value: other.to_string() }),
    }
}

/// Parse a policy file. `source` (the file name) prefixes messages and rule ids.
pub fn from_toml(text: &str, source: &str) -> Result<Policy, PolicyError> {
    let newlines = text.bytes().enumerate().filter(|&(_, b)| b == b'\n').map(|(i, _)| i).collect();
    Reader { text, source, newlines }.policy()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SecretsFileSchema {
    version: Option<Spanned<i64>>,
    #[serde(default)]
    secret: Vec<Spanned<SecretSchema>>,
}

/// Parse a host secrets file (`/etc/gatewrap/secrets.toml`: `[[secret]]` tables only, as
/// in a policy; `version = 1` optional). `source` names the file in messages.
pub fn secrets_from_toml(text: &str, source: &str) -> Result<Vec<SecretDef>, PolicyError> {
    let newlines = text.bytes().enumerate().filter(|&(_, b)| b == b'\n').map(|(i, _)| i).collect();
    let reader = Reader { text, source, newlines };
    let file: SecretsFileSchema = toml::from_str(text).map_err(|e| reader.toml_err(&e))?;
    if let Some(v) = file.version.as_ref().filter(|v| *v.get_ref() != 1) {
        return Err(reader.err(v.span().start, format!("unsupported version {}: only 1 is known", v.get_ref())));
    }
    reader.secrets(&file.secret)
}
