//! Breakpoints (issue 12): approvals of held requests, their store (SQLite or PostgreSQL,
//! `store/`), the wake-ups (`wake`), and the grants a human may answer with.
//!
//! The store is the truth; a wake-up only tells a waiter to re-read it. Every status move is
//! one guarded statement (`WHERE status = .. AND version = ..`, version + 1), so a decision
//! made on a stale view changes nothing and is refused as [`Stale`] with the reason.

pub mod digest;
pub mod redact;
pub mod store;
pub mod wake;

use std::time::{SystemTime, UNIX_EPOCH};

pub use store::{NewApproval, Store};

/// Statuses of an approval. Moves only forward: pending -> approved|rejected|expired|cancelled,
/// approved -> sending (the one [`Store::claim`] winner) -> sent; approved -> cancelled when its run ends;
/// sending -> cancelled when the gate could not send it (the SSRF guard, a failed dial).
pub mod status {
    pub const PENDING: &str = "pending";
    pub const APPROVED: &str = "approved";
    pub const REJECTED: &str = "rejected";
    pub const EXPIRED: &str = "expired";
    pub const SENDING: &str = "sending";
    pub const SENT: &str = "sent";
    pub const CANCELLED: &str = "cancelled";
}

/// Default limit of the body kept in the store (64 KiB); the digest covers the whole body.
pub const DEFAULT_BODY_LIMIT: usize = 64 * 1024;

/// Default cap of pending approvals of one run (the policy's `[approvals] max_pending`).
pub const DEFAULT_MAX_PENDING: i64 = 100;
/// Default cap of pending approvals in one store, all runs together (`[approvals]
/// max_pending_store`): with the 64 KiB of body kept each, about 64 MiB.
pub const DEFAULT_MAX_PENDING_STORE: i64 = 1000;
/// Longest reason a decision may carry, in characters (the agent is told it in its 403).
pub const MAX_REASON: usize = 1000;

/// Caps of pending approvals (unexpired, undecided): past one, a new request is refused
/// ([`StoreError::Full`]); joining a pending approval (an identical retry) is not capped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingCaps {
    /// Per run.
    pub run: i64,
    /// Per store, all runs.
    pub store: i64,
}

impl Default for PendingCaps {
    fn default() -> Self {
        PendingCaps { run: DEFAULT_MAX_PENDING, store: DEFAULT_MAX_PENDING_STORE }
    }
}

/// What [`Store::prune`] removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    pub approvals: u64,
    pub grants: u64,
    pub runs: u64,
}

/// Default path of the embedded store.
pub const DEFAULT_STATE: &str = "/var/lib/gatewrap/state.db";

/// One approval, as stored (headers redacted: [`redact`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Approval {
    pub id: String,
    pub run_id: String,
    /// Seconds since the Unix epoch.
    pub created: f64,
    pub deadline: f64,
    pub rule: String,
    pub method: String,
    /// Canonical absolute URL ([`digest::canonical_url`]), or `host:port` for a CONNECT.
    pub url: String,
    pub headers: Vec<(String, String)>,
    /// The first `body_limit` bytes of the body.
    pub body: Vec<u8>,
    pub body_len: i64,
    pub body_digest: String,
    /// [`digest::request_digest`] of the current (possibly edited) request.
    pub digest: String,
    pub idem_key: Option<String>,
    /// 1 when asked; one step per change a human decides on or is fenced by: an edit, a
    /// decision (approve, reject), an expiry, a cancel. The gate's own sending of an
    /// approved request (claim, sent) changes the status only: a decision names the
    /// version it saw, and no decision can follow an approval anyway.
    pub version: i64,
    pub status: String,
    /// `wait` | `return` (the rule's `hold`).
    pub hold: String,
    pub grants_allowed: bool,
    /// The review page's secret (32 random bytes, base64url).
    pub token: String,
    pub decided_by: Option<String>,
    pub decided_at: Option<f64>,
    pub reason: Option<String>,
    pub edited: bool,
    pub orig_headers: Option<Vec<(String, String)>>,
    pub orig_body: Option<Vec<u8>>,
    pub grant_id: Option<String>,
    pub sent_at: Option<f64>,
    pub upstream_status: Option<i64>,
    /// Requests of the agent that joined this approval (dedup), the first included.
    pub waiters: i64,
}

impl Approval {
    /// The stored body is shorter than the request's.
    pub fn body_truncated(&self) -> bool {
        self.body_len > self.body.len() as i64
    }

    /// Path of the review page, relative to the review server.
    pub fn review_path(&self) -> String {
        format!("/a/{}", self.token)
    }
}

/// A grant: requests of one run matching method, host and path prefix are let through
/// until `expires` (unless revoked).
#[derive(Debug, Clone, PartialEq)]
pub struct Grant {
    pub id: String,
    pub run_id: String,
    pub approval_id: String,
    pub method: String,
    /// The request's authority as in its canonical URL (`host` or `host:port`).
    pub host: String,
    pub path_prefix: String,
    pub created: f64,
    pub expires: f64,
    pub revoked: Option<f64>,
    pub revoked_by: Option<String>,
    pub uses: i64,
    pub created_by: String,
}

impl Grant {
    /// Whether this grant covers `method` to `host` (exactly) on `path` (canonical, without
    /// query): `path_prefix` equals the path, or is a prefix of it ending at a `/` boundary.
    pub fn covers(&self, method: &str, host: &str, path: &str, now: f64) -> bool {
        self.revoked.is_none()
            && self.expires > now
            && self.method == method
            && self.host == host
            && path_under(path, &self.path_prefix)
    }
}

/// `path` is `prefix` or below it, segment-wise (`/v1/send` is under `/v1` and `/v1/`, not
/// under `/v1/se`).
pub fn path_under(path: &str, prefix: &str) -> bool {
    if prefix == "/" || path == prefix {
        return true;
    }
    match path.strip_prefix(prefix) {
        Some(rest) => prefix.ends_with('/') || rest.starts_with('/'),
        None => false,
    }
}

/// A run of gatewrap, the fence of its approvals and grants.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub run_id: String,
    pub started: f64,
    pub ended: Option<f64>,
    pub host: String,
    pub pid: i64,
    /// Wake-up address (SQLite: a unix datagram socket path).
    pub wake: Option<String>,
}

/// What a human's decision carries: a grant is {method, host, path_prefix, seconds}.
#[derive(Debug, Clone, PartialEq)]
pub struct GrantSpec {
    pub method: String,
    pub host: String,
    pub path_prefix: String,
    pub seconds: f64,
}

/// The verdict of a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Approve,
    Reject,
}

/// Counts of one run for its summary.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    pub asked: i64,
    pub approved: i64,
    pub rejected: i64,
    pub expired: i64,
    pub granted: i64,
    pub by_grant: i64,
}

/// A decision or edit made on a view that is no longer current. `why` is one of `decided`,
/// `edited`, `expired`, `run ended`, `digest`, `not found`; `detail` tells the human.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("approval {id}: stale ({why}): {detail}")]
pub struct Stale {
    pub id: String,
    pub why: &'static str,
    pub detail: String,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Stale(#[from] Stale),
    /// A value the caller gave is refused (a header that is not editable, a grant wider than
    /// the request, a body over the limit, an unknown verdict).
    #[error("{0}")]
    Invalid(String),
    #[error("approvals store {url}: {msg}")]
    Db { url: String, msg: String },
    #[error("approvals store {url}: {source}")]
    Io { url: String, source: std::io::Error },
    /// The store's file or folder is not root's alone (`msg`: why and what to do).
    #[error("approvals store {url}: refused: {msg}")]
    Unsafe { url: String, msg: String },
    /// A store that does not exist, named by a command that would not make one.
    #[error("approvals store {url}: {msg}")]
    Missing { url: String, msg: String },
    /// A new approval past a cap of pending approvals ([`PendingCaps`]): refused, never held.
    #[error("{msg}")]
    Full { scope: &'static str, limit: i64, msg: String },
}

pub type Result<T> = std::result::Result<T, StoreError>;

/// Seconds since the Unix epoch, now.
pub fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// `prefix` + 20 lower-case base32 characters (100 random bits from getrandom(2)).
pub fn new_id(prefix: &str) -> String {
    const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
    let mut raw = [0u8; 20];
    getrandom::fill(&mut raw).expect("getrandom(2) failed");
    let tail: String = raw.iter().map(|b| ALPHABET[(b & 31) as usize] as char).collect();
    format!("{prefix}{tail}")
}

/// 32 random bytes, base64url without padding: a review page's secret.
pub fn new_token() -> String {
    use base64::Engine as _;
    let mut raw = [0u8; 32];
    getrandom::fill(&mut raw).expect("getrandom(2) failed");
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
}

/// RFC 3339 UTC of `t` seconds since the epoch (the audit records' `deadline`).
pub fn rfc3339(t: f64) -> String {
    let dt = time::OffsetDateTime::from_unix_timestamp(t as i64).unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    dt.format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
}

#[cfg(test)]
mod tests;
