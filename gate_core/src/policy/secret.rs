//! Secrets the gate injects (issue 20): where a value comes from (`[[secret]]`) and where a
//! rule puts it (`inject = { .. }`). The values themselves are never in the policy: the CLI
//! resolves each source on the host at the run's start and hands them to the gate
//! (`gate::secrets`).
//!
//! ```toml
//! [[secret]]
//! name = "github"                              # required: [a-z0-9_-], 1-64 characters
//! from_file = "/etc/gatewrap/secrets/github"   # exactly one of from_file (absolute path),
//!                                              # from_env (a variable of gatewrap itself)
//!                                              # or from_command (argv, run on the host)
//! placeholder_env = "GITHUB_TOKEN"             # optional: the agent's variable that holds
//!                                              # a random per-run placeholder
//! budget = 100                                 # optional: requests per run that carry it
//!
//! [[rule]]
//! host = "api.github.com"
//! inspect = true                               # required for https (a tunnel is never injected)
//! action = "allow"                             # "allow" or "ask"
//! inject = { secret = "github", as = "bearer" } # or as = "basic", header = "X-Api-Key",
//!                                              # or query = "key"
//! ```

use std::sync::Arc;

use serde::Deserialize;
use toml::Spanned;

use super::rules::{Action, Rule, Scheme};

/// Where a secret's value comes from (read by the CLI, never by the gate).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// `from_file = "/abs/path"`: a root-owned file, not readable by others; one trailing
    /// newline is dropped.
    File(String),
    /// `from_env = "VAR"`: gatewrap's own environment variable.
    Env(String),
    /// `from_command = ["gh", "auth", "token"]`: its stdout, one trailing newline dropped.
    Command(Vec<String>),
}

/// One `[[secret]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretDef {
    pub name: String,
    pub source: Source,
    /// `placeholder_env = "VAR"`: the agent's variable holding the run's placeholder.
    pub placeholder_env: Option<String>,
    /// `budget = N`: at most N requests of a run carry it (the gate counts them).
    pub budget: Option<u32>,
    /// `FILE:LINE` of its `[[secret]]` header, for messages.
    pub origin: String,
}

/// Where a rule puts a secret's value in the request it allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// `as = "bearer"`: `Authorization: Bearer VALUE`.
    Bearer,
    /// `as = "basic"`: `Authorization: Basic base64(USER:VALUE)` (RFC 7617), USER the one
    /// the agent sent in its own Basic credentials, else empty.
    Basic,
    /// `header = "X-Api-Key"`: that header (lower case here), set to VALUE.
    Header(String),
    /// `query = "key"`: the query parameter, set to VALUE percent-encoded.
    Query(String),
}

/// A rule's `inject = { .. }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inject {
    pub secret: String,
    pub place: Place,
}

impl Place {
    /// Where it is, in words (`header authorization`, `query key`): the name only.
    pub fn describe(&self) -> String {
        match self {
            Place::Bearer | Place::Basic => "header authorization".into(),
            Place::Header(h) => format!("header {h}"),
            Place::Query(q) => format!("query {q}"),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SecretSchema {
    name: Spanned<String>,
    from_file: Option<Spanned<String>>,
    from_env: Option<Spanned<String>>,
    from_command: Option<Spanned<Vec<String>>>,
    placeholder_env: Option<Spanned<String>>,
    budget: Option<Spanned<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct InjectSchema {
    secret: Spanned<String>,
    #[serde(rename = "as")]
    as_: Option<Spanned<String>>,
    header: Option<Spanned<String>>,
    query: Option<Spanned<String>>,
}

/// A problem at a byte offset of the policy text (file.rs adds the line).
pub(super) type AtOffset = (usize, String);

fn is_env_name(s: &str) -> bool {
    let mut b = s.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_') && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// RFC 9110 §5.6.2 token.
fn is_token(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Headers a rule may not inject into: the ones that frame or route the request, and the
/// hop-by-hop ones the gate removes (`authorization` has `as = ...`).
const NOT_INJECTABLE: [&str; 12] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
    "authorization",
];

impl SecretSchema {
    /// The model of one `[[secret]]` (its header at `origin`).
    pub(super) fn parse(&self, origin: String) -> Result<SecretDef, AtOffset> {
        let name = self.name.get_ref();
        let ok_name = !name.is_empty()
            && name.len() <= 64
            && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
        if !ok_name {
            return Err((self.name.span().start, format!("invalid secret name {name:?}: expected 1-64 of a-z, 0-9, _ and -")));
        }
        let sources = [self.from_file.is_some(), self.from_env.is_some(), self.from_command.is_some()];
        let source = match (&self.from_file, &self.from_env, &self.from_command) {
            _ if sources.iter().filter(|s| **s).count() > 1 => {
                return Err((self.name.span().start, format!("secret {name:?}: give one of from_file, from_env, from_command, not several")))
            }
            (Some(f), _, _) if !f.get_ref().starts_with('/') => {
                return Err((f.span().start, format!("invalid from_file {:?}: expected an absolute path", f.get_ref())))
            }
            (Some(f), _, _) => Source::File(f.get_ref().clone()),
            (_, Some(e), _) if !is_env_name(e.get_ref()) => {
                return Err((e.span().start, format!("invalid from_env {:?}: expected a variable name", e.get_ref())))
            }
            (_, Some(e), _) => Source::Env(e.get_ref().clone()),
            (_, _, Some(c)) if c.get_ref().first().is_none_or(|p| p.is_empty()) => {
                return Err((c.span().start, "`from_command` is empty: expected a program and its arguments".into()))
            }
            (_, _, Some(c)) => Source::Command(c.get_ref().clone()),
            (None, None, None) => {
                return Err((self.name.span().start, format!("secret {name:?} has no source: add from_file, from_env or from_command")))
            }
        };
        let placeholder_env = match &self.placeholder_env {
            Some(p) if !is_env_name(p.get_ref()) => {
                return Err((p.span().start, format!("invalid placeholder_env {:?}: expected a variable name", p.get_ref())))
            }
            p => p.as_ref().map(|p| p.get_ref().clone()),
        };
        let budget = match &self.budget {
            Some(b) => match u32::try_from(*b.get_ref()) {
                Ok(n) if n > 0 => Some(n),
                _ => return Err((b.span().start, format!("invalid budget {}: expected a whole number of requests from 1 to {}", b.get_ref(), u32::MAX))),
            },
            None => None,
        };
        Ok(SecretDef { name: name.clone(), source, placeholder_env, budget, origin })
    }
}

impl InjectSchema {
    /// The model of a rule's `inject`, checked against the rule (`at`: the key's offset):
    /// an allow or ask rule, inspected unless it is for plain http only.
    pub(super) fn parse(&self, rule: &Rule, at: usize) -> Result<Arc<Inject>, AtOffset> {
        if !matches!(rule.action, Action::Allow | Action::Ask) {
            return Err((at, "`inject` only applies to \"allow\" and \"ask\" rules".into()));
        }
        let http_only = rule.schemes.as_deref() == Some(&[Scheme::Http]);
        if !rule.inspect && !http_only {
            return Err((
                at,
                "`inject` on https needs `inspect = true` (the gate cannot inject into a tunnel it does not open); \
                 add it, or `schemes = [\"http\"]` for plain http only"
                    .into(),
            ));
        }
        let place = match (&self.as_, &self.header, &self.query) {
            (Some(a), None, None) => match a.get_ref().as_str() {
                "bearer" => Place::Bearer,
                "basic" => Place::Basic,
                other => return Err((a.span().start, format!("invalid as {other:?}: expected \"bearer\" or \"basic\""))),
            },
            (None, Some(h), None) => {
                let lower = h.get_ref().to_ascii_lowercase();
                if !is_token(&lower) {
                    return Err((h.span().start, format!("invalid header {:?}: expected a header name", h.get_ref())));
                }
                if NOT_INJECTABLE.contains(&lower.as_str()) {
                    return Err((h.span().start, format!("header {:?} cannot be injected (Authorization: use `as = \"bearer\"` or `\"basic\"`)", h.get_ref())));
                }
                Place::Header(lower)
            }
            (None, None, Some(q)) if q.get_ref().is_empty() => return Err((q.span().start, "`query` is empty".into())),
            (None, None, Some(q)) => Place::Query(q.get_ref().clone()),
            _ => return Err((at, "`inject` needs one of `as`, `header` or `query`".into())),
        };
        Ok(Arc::new(Inject { secret: self.secret.get_ref().clone(), place }))
    }
}

/// Every rule's injected secret is one of `secrets` (the policy's and the host's): the
/// first rule naming another, as `FILE:LINE: ...`.
pub fn unknown_secret<'a>(rules: impl Iterator<Item = &'a Rule>, secrets: &[SecretDef]) -> Option<String> {
    rules.filter_map(|r| r.inject.as_ref().map(|i| (r, i))).find(|(_, i)| !secrets.iter().any(|s| s.name == i.secret)).map(|(r, i)| {
        let line = r.line.map(|l| format!(":{l}")).unwrap_or_default();
        let file = r.id.rsplit_once(":rule[").map_or(r.id.as_str(), |(f, _)| f);
        format!("{file}{line}: rule {} injects secret {:?}, which no [[secret]] defines (the policy or /etc/gatewrap/secrets.toml)", r.id, i.secret)
    })
}
