//! The schema, written once for both backends: `{REAL}`, `{INT}` and `{BLOB}` stand for the
//! backend's column types (SQLite: REAL, INTEGER, BLOB; PostgreSQL: DOUBLE PRECISION,
//! BIGINT, BYTEA). Creating it is idempotent; `meta.schema` says which version it is.

/// The schema version this gatewrap writes and reads.
pub const SCHEMA_VERSION: &str = "1";

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, started {REAL} NOT NULL, ended {REAL}, host TEXT NOT NULL,
    pid {INT} NOT NULL, wake TEXT);
CREATE TABLE IF NOT EXISTS approvals (
    id TEXT PRIMARY KEY, run_id TEXT NOT NULL REFERENCES runs (run_id), created {REAL} NOT NULL,
    deadline {REAL} NOT NULL, rule TEXT NOT NULL, method TEXT NOT NULL, url TEXT NOT NULL,
    headers TEXT NOT NULL, body {BLOB} NOT NULL, body_len {INT} NOT NULL, body_digest TEXT NOT NULL,
    digest TEXT NOT NULL, idem_key TEXT, version {INT} NOT NULL, status TEXT NOT NULL,
    hold TEXT NOT NULL, grants_allowed {INT} NOT NULL, token TEXT NOT NULL UNIQUE, decided_by TEXT,
    decided_at {REAL}, reason TEXT, edited {INT} NOT NULL, orig_headers TEXT, orig_body {BLOB},
    grant_id TEXT, sent_at {REAL}, upstream_status {INT}, waiters {INT} NOT NULL);
CREATE INDEX IF NOT EXISTS approvals_by_run ON approvals (run_id, status);
CREATE INDEX IF NOT EXISTS approvals_by_token ON approvals (substr(token, 1, 8));
CREATE TABLE IF NOT EXISTS grants (
    id TEXT PRIMARY KEY, run_id TEXT NOT NULL REFERENCES runs (run_id), approval_id TEXT NOT NULL,
    method TEXT NOT NULL, host TEXT NOT NULL, path_prefix TEXT NOT NULL, created {REAL} NOT NULL,
    expires {REAL} NOT NULL, revoked {REAL}, revoked_by TEXT, uses {INT} NOT NULL, created_by TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS grants_by_run ON grants (run_id);
INSERT INTO meta (key, value) VALUES ('schema', '1') ON CONFLICT (key) DO NOTHING;
";

/// The schema's statements with the backend's column types.
pub fn schema(real: &str, int: &str, blob: &str) -> String {
    SCHEMA.replace("{REAL}", real).replace("{INT}", int).replace("{BLOB}", blob)
}

/// The error when the stored schema is not [`SCHEMA_VERSION`].
pub fn version_mismatch(found: &str) -> String {
    format!("its schema is version {found}, this gatewrap knows version {SCHEMA_VERSION}; use the gatewrap that made it, or another state URL")
}
