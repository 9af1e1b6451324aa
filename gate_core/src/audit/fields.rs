//! Audit record field names: the one place they are spelled.

/// Schema version of a record (always written first).
pub const V: &str = "v";
/// RFC 3339 UTC time with microseconds (written second).
pub const TIME: &str = "time";
/// The record's 1-based position in the log's hash chain (written third; see `chain.rs`).
pub const SEQ: &str = "seq";
/// SHA-256 (64 lowercase hex digits) of the previous line's bytes, its newline included;
/// the genesis value on a log's first record (written fourth; see `chain.rs`).
pub const PREV: &str = "prev";
pub const RUN: &str = "run";
/// `request` (absolute-form HTTP) | `connect` (CONNECT tunnel) | kernel events from Python.
pub const EVENT: &str = "event";
/// `allowed` | `denied` | `failed`.
pub const DECISION: &str = "decision";
pub const REASON: &str = "reason";
pub const RULE: &str = "rule";
pub const PID: &str = "pid";
pub const CMDLINE: &str = "cmdline";
/// Peer `ip:port` of the agent's connection to the gate.
pub const CLIENT: &str = "client";
/// The pid of the sandbox process that holds the client's socket (found once per
/// connection); `null` when it could not be found, absent when it was not looked up.
pub const CLIENT_PID: &str = "client_pid";
/// That process's command name (`/proc/PID/comm`).
pub const CLIENT_COMM: &str = "client_comm";
pub const METHOD: &str = "method";
pub const TARGET: &str = "target";
pub const DST_HOST: &str = "dst_host";
pub const DST_IP: &str = "dst_ip";
pub const DST_PORT: &str = "dst_port";
/// `http` | `connect` | `https` (inside an inspected tunnel).
pub const PROTO: &str = "proto";
/// HTTP status the gate sent to the client.
pub const STATUS: &str = "status";
/// Cause of a failure, prefixed with where it came from (`upstream:`, `dns:`, `downstream:`).
pub const ERROR: &str = "error";
/// On a `request` record: the request body's bytes the gate sent upstream (as received,
/// after any chunked framing is removed; 0 for none).
pub const BYTES_UP: &str = "bytes_up";
/// On a `request` record: the response body's bytes the gate passed to the client (as
/// above); what upstream sent until the client had all of it or went away.
pub const BYTES_DOWN: &str = "bytes_down";
/// On a `request` record: occurrences of a secret's value (or its encoded forms) the gate
/// masked with `*` in the response's head and body (gate/secrets/mask.rs); absent when none.
pub const REDACTED: &str = "redacted";
/// On a `request` record: milliseconds (microsecond resolution) from the gate reading the
/// request head to the response's last byte handed to the client (or the client leaving).
pub const DURATION_MS: &str = "duration_ms";
pub const HOOK: &str = "hook";
pub const FAMILY: &str = "family";
pub const COMM: &str = "comm";
pub const CGROUP_ID: &str = "cgroup_id";
/// In `report` mode: what `enforce` would have done (`deny`).
pub const WOULD: &str = "would";
/// On a `connect` record: the tunnel was TLS-inspected (its requests have records of their own).
pub const INSPECTED: &str = "inspected";

/// The fields whose values were cut (strings shortened, or a value dropped) so that the
/// record fits [`super::MAX_RECORD`]; absent when nothing was cut.
pub const TRUNCATED: &str = "truncated";

/// Record schema version.
pub const VERSION: u64 = 1;

pub const EVENT_REQUEST: &str = "request";
pub const EVENT_CONNECT: &str = "connect";
/// Written before the gate dials for an allowed request or tunnel (nothing leaves without
/// it); the `request`/`connect` record that follows says how it went.
pub const EVENT_ADMIT: &str = "admit";
pub const PROTO_HTTP: &str = "http";
pub const PROTO_CONNECT: &str = "connect";
/// A request inside a TLS-inspected CONNECT tunnel.
pub const PROTO_HTTPS: &str = "https";
/// A query to the sandbox's DNS stub.
pub const EVENT_DNS: &str = "dns";
pub const PROTO_DNS: &str = "dns";
/// A signed checkpoint of the chain (see `note.rs`): its `size` (records before it) and
/// `note` (the C2SP signed note, its text with newlines).
pub const EVENT_CHECKPOINT: &str = "checkpoint";
pub const SIZE: &str = "size";
pub const NOTE: &str = "note";
/// A segment's opening checkpoint: the file name of the segment before it (rotate.rs).
pub const ROTATED_FROM: &str = "rotated_from";
pub const ALLOWED: &str = "allowed";
pub const DENIED: &str = "denied";
pub const FAILED: &str = "failed";

/// How many attempts a record stands for (a `dns` record of queries over the record rate,
/// a folded denial).
pub const COUNT: &str = "count";
/// A folded record's first and last attempt (RFC 3339 UTC, microseconds).
pub const FIRST_SEEN: &str = "first_seen";
pub const LAST_SEEN: &str = "last_seen";
/// A folded record of the denials beyond the distinct ones a run folds one by one.
pub const OVERFLOW: &str = "overflow";

/// The approval (`ap-...`) a held request waited for; the approval events' link.
pub const APPROVAL: &str = "approval";
/// The grant (`gr-...`) that let a request through without asking.
pub const GRANT: &str = "grant";
/// The name of the secret the gate injected into the request (its rule's `inject`), or
/// of the one a `secret_misuse` refusal found; never its value.
pub const SECRET: &str = "secret";
pub const EVENT_APPROVAL_ASKED: &str = "approval_asked";
pub const EVENT_APPROVAL_EDITED: &str = "approval_edited";
pub const EVENT_APPROVAL_APPROVED: &str = "approval_approved";
pub const EVENT_APPROVAL_REJECTED: &str = "approval_rejected";
pub const EVENT_APPROVAL_EXPIRED: &str = "approval_expired";
pub const EVENT_APPROVAL_SENT: &str = "approval_sent";
pub const EVENT_APPROVAL_CANCELLED: &str = "approval_cancelled";
