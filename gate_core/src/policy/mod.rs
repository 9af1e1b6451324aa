//! Policy: canonical destinations (`canon`), the model and decision (`rules`), the file (`file`).

pub mod budget;
pub mod canon;
pub mod decide;
pub mod duration;
pub mod file;
mod index;
pub mod path;
pub mod rules;
pub mod sandbox;
pub mod secret;
pub mod ssrf;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_index;
#[cfg(test)]
mod tests_match;
#[cfg(test)]
mod tests_path;
#[cfg(test)]
mod tests_prop;
#[cfg(test)]
mod tests_sandbox;
#[cfg(test)]
mod tests_secret;

pub use canon::{canonical_host, canonical_pattern, Host, HostError, HostPattern};
pub use budget::{Budget, Budgets, Spend};
pub use path::{canonical_path, PathError, PathPattern};
pub use sandbox::{Sandbox, SandboxPath};
pub use secret::{Inject, Place, SecretDef, Source};
pub use rules::{Action, ApprovalLimits, Decision, Hold, Mode, Notify, Origin, Policy, Ports, RequestFacts, Rule, Scheme, DEFAULT_ASK_TIMEOUT, DEFAULT_HELD_BYTES, DEFAULT_REREAD, REASON_UNSPECIFIED};

/// A policy that cannot be used: bad file or bad flag value.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("{file}:{line}: {msg}")]
    File { file: String, line: usize, msg: String },
    #[error(transparent)]
    Host(#[from] HostError),
    #[error("invalid port {value:?}: expected 1-65535")]
    Port { value: String },
    #[error("invalid action {value:?}: expected \"allow\", \"deny\" or \"ask\"")]
    Action { value: String },
    #[error("{value:?} is an address: a rule naming an address allows it already (use --allow); --allow-private is for names")]
    PrivateNeedsName { value: String },
    /// Secrets that do not fit together (defined twice, an inject naming none).
    #[error("{0}")]
    Secrets(String),
}

impl Policy {
    /// Add the host's secrets file's `[[secret]]`s (`secrets_from_toml`) after the
    /// policy's, then check that every rule's `inject` names one of them.
    ///
    /// Errors: [`PolicyError::Secrets`]: a name defined in both files, or an inject naming
    /// no secret (`FILE:LINE: ...`).
    pub fn add_host_secrets(&mut self, defs: Vec<SecretDef>) -> Result<(), PolicyError> {
        for d in defs {
            if let Some(first) = self.secrets.iter().find(|s| s.name == d.name) {
                return Err(PolicyError::Secrets(format!("{}: secret {:?} is defined twice (first at {})", d.origin, d.name, first.origin)));
            }
            self.secrets.push(d);
        }
        self.check_injects()
    }

    /// Every rule's `inject` names a defined secret ([`PolicyError::Secrets`] if not).
    pub fn check_injects(&self) -> Result<(), PolicyError> {
        match secret::unknown_secret(self.rules(), &self.secrets) {
            Some(msg) => Err(PolicyError::Secrets(msg)),
            None => Ok(()),
        }
    }

    /// Add a command-line rule (`--allow HOST[:PORT]`, `--deny ...`). `origin` becomes its id.
    pub fn add_rule(&mut self, spec: &str, action: &str, origin: &str) -> Result<(), PolicyError> {
        let rule = cli_rule(spec, file::parse_action(action)?, origin)?;
        self.push_rule(rule);
        Ok(())
    }

    /// Add `--allow-private HOST[:PORT]`: an allow rule with `allow_private = true` (the name
    /// may resolve to a private, loopback, link-local, CGNAT, documentation, benchmarking or
    /// reserved address; never metadata nor embedded IPv4). `origin` becomes its id.
    ///
    /// Errors: as [`Policy::add_rule`], and [`PolicyError::PrivateNeedsName`] for an address.
    pub fn add_private_rule(&mut self, spec: &str, origin: &str) -> Result<(), PolicyError> {
        let mut rule = cli_rule(spec, Action::Allow, origin)?;
        if !matches!(rule.host, HostPattern::Exact(Host::Name(_)) | HostPattern::Subdomains(_)) {
            return Err(PolicyError::PrivateNeedsName { value: spec.to_string() });
        }
        rule.allow_private = true;
        self.push_rule(rule);
        Ok(())
    }
}

/// The rule of a command-line flag: `spec` is `HOST[:PORT]` (no port: 80 and 443).
fn cli_rule(spec: &str, action: Action, origin: &str) -> Result<Rule, PolicyError> {
    let (host, port) = canon::split_spec(spec)?;
    let host = canonical_pattern(host)?;
    let ports = match port {
        None => Ports::Web,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n != 0 && p.bytes().all(|b| b.is_ascii_digit()) => Ports::List(vec![n]),
            _ => return Err(PolicyError::Port { value: p.to_string() }),
        },
    };
    Ok(Rule::new(origin.to_string(), host, ports, action, Origin::Cli))
}
