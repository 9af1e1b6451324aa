//! The policy file's `[sandbox]` table: host paths the run shows in the agent's jail, as
//! `gatewrap run --ro-bind PATH` / `--bind PATH` would, and environment variables the agent
//! gets, as `gatewrap run --env` would. The gate does not use them; they live in the policy
//! so that a team shares one file for what the agent may reach.
//!
//! ```toml
//! [sandbox]
//! ro_bind = ["/opt/tools", "/srv/datasets"]   # shown read-only
//! bind = ["/srv/scratch"]                     # shown writable
//! env = ["OPENAI_API_KEY", "LOG_LEVEL=debug"]  # NAME (the caller's value) or NAME=VALUE
//! unprotect = [".vscode", "/srv/scratch/.envrc"] # left writable though tools run it
//! ```
//!
//! `env` entries are kept as written, each with its line: gatewrap's Python side
//! (`cli/gatewrap/sandbox/environment.py`) reads and checks them, the one place the rule of
//! which names may be passed is written (for `--env` and `--env-file` too).
//!
//! `unprotect` names protected paths (cli/gatewrap/sandbox/protect.py: `.git/config`,
//! `.git/hooks`, `.envrc`, `.vscode/`...) the agent may change, as `gatewrap run --unprotect
//! PATH`: an absolute path, or one relative to each writable path (the working directory
//! first).

/// One host path of `[sandbox]`, with the 1-based line it was written on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxPath {
    pub path: String,
    pub line: usize,
}

/// The `[sandbox]` table (empty without one).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sandbox {
    /// `ro_bind = [..]`: shown read-only, submounts included.
    pub ro_bind: Vec<SandboxPath>,
    /// `bind = [..]`: shown writable (its own file system; submounts stay read-only).
    pub bind: Vec<SandboxPath>,
    /// `env = [..]`: `NAME` or `NAME=VALUE` entries, as written (`path` holds the entry).
    pub env: Vec<SandboxPath>,
    /// `unprotect = [..]`: protected paths left writable (absolute, or relative to each
    /// writable path).
    pub unprotect: Vec<SandboxPath>,
}

/// Why a `[sandbox]` path is refused, or `None` if it is usable: it must be absolute,
/// have no `.`/`..` component and no NUL, and must not be `/` (that would show the whole
/// host, its sockets and secrets included).
pub fn path_problem(path: &str) -> Option<&'static str> {
    if !path.starts_with('/') {
        return Some("expected an absolute path (starting with /)");
    }
    if path.contains('\0') {
        return Some("a path cannot contain NUL");
    }
    if path.split('/').any(|c| c == "." || c == "..") {
        return Some("a path cannot have . or .. components; write it out");
    }
    if path.split('/').all(str::is_empty) {
        return Some("binding / would show the whole host (its sockets and secrets too); name the folders the agent needs");
    }
    None
}

/// Why an `unprotect` entry is refused, or `None` if it is usable: absolute or relative, but
/// not empty, with no `.`/`..` component and no NUL.
pub fn unprotect_problem(path: &str) -> Option<&'static str> {
    if path.contains('\0') {
        return Some("a path cannot contain NUL");
    }
    if path.split('/').all(str::is_empty) {
        return Some("expected a protected path, e.g. \".vscode\" or \"/srv/repo/.git/hooks\"");
    }
    if path.split('/').any(|c| c == "." || c == "..") {
        return Some("a path cannot have . or .. components; write it out");
    }
    None
}
