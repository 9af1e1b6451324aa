//! The gate's one record per decision, and the `admit` record that precedes an allowed one.

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Map, Value};

use super::fields as f;

/// A gate decision as it goes to the audit log; unknown fields are left out, never `null`.
#[derive(Debug, Clone, Default)]
pub struct GateRecord {
    pub run: String,
    /// [`f::EVENT_REQUEST`] or [`f::EVENT_CONNECT`].
    pub event: &'static str,
    /// [`f::ALLOWED`], [`f::DENIED`] or [`f::FAILED`].
    pub decision: &'static str,
    pub reason: Option<String>,
    pub rule: Option<String>,
    pub would: Option<&'static str>,
    pub client: Option<String>,
    /// `Some(None)`: looked up, not found (written `null`); `None`: not looked up (absent).
    pub client_pid: Option<Option<u32>>,
    pub client_comm: Option<String>,
    pub method: Option<String>,
    pub target: Option<String>,
    pub dst_host: Option<String>,
    pub dst_ip: Option<String>,
    pub dst_port: Option<u16>,
    pub proto: &'static str,
    pub status: Option<u16>,
    pub error: Option<String>,
    /// Request body bytes sent upstream (see [`f::BYTES_UP`]).
    pub bytes_up: Option<u64>,
    /// Response body bytes passed to the client (see [`f::BYTES_DOWN`]).
    pub bytes_down: Option<u64>,
    /// Milliseconds from the request head to the response's end (see [`f::DURATION_MS`]).
    pub duration_ms: Option<f64>,
    /// A CONNECT the gate TLS-inspects (see [`f::INSPECTED`]).
    pub inspected: bool,
    /// Attempts the record stands for, when more than one (see [`f::COUNT`]).
    pub count: Option<u64>,
    /// The approval this request was held for (see [`f::APPROVAL`]).
    pub approval: Option<String>,
    /// The grant that let it through (see [`f::GRANT`]).
    pub grant: Option<String>,
    /// The secret the request carries by its rule's `inject`, or the one it misused (see
    /// [`f::SECRET`]); never its value.
    pub secret: Option<String>,
    /// Secret values masked in the response (see [`f::REDACTED`]).
    pub redacted: Option<u64>,
}

/// How a [`GateRecord`] is written: as the decision and its outcome, or as the
/// [`f::EVENT_ADMIT`] record written before the dial (the decision only: no status,
/// dst_ip, error, bytes or duration).
#[derive(Clone, Copy)]
pub(super) struct Fields<'a> {
    pub rec: &'a GateRecord,
    pub admit: bool,
}

impl Serialize for Fields<'_> {
    /// The record's keys in their order, the unknown ones left out.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let r = self.rec;
        let outcome = !self.admit;
        let mut m = s.serialize_map(None)?;
        m.serialize_entry(f::RUN, &r.run)?;
        m.serialize_entry(f::EVENT, if self.admit { f::EVENT_ADMIT } else { r.event })?;
        m.serialize_entry(f::DECISION, r.decision)?;
        opt(&mut m, f::REASON, &r.reason)?;
        opt(&mut m, f::RULE, &r.rule)?;
        opt(&mut m, f::WOULD, &r.would)?;
        opt(&mut m, f::CLIENT, &r.client)?;
        opt(&mut m, f::CLIENT_PID, &r.client_pid)?;
        opt(&mut m, f::CLIENT_COMM, &r.client_comm)?;
        opt(&mut m, f::METHOD, &r.method)?;
        opt(&mut m, f::TARGET, &r.target)?;
        opt(&mut m, f::DST_HOST, &r.dst_host)?;
        if outcome {
            opt(&mut m, f::DST_IP, &r.dst_ip)?;
        }
        opt(&mut m, f::DST_PORT, &r.dst_port)?;
        m.serialize_entry(f::PROTO, r.proto)?;
        if outcome {
            opt(&mut m, f::STATUS, &r.status)?;
            opt(&mut m, f::ERROR, &r.error)?;
            opt(&mut m, f::BYTES_UP, &r.bytes_up)?;
            opt(&mut m, f::BYTES_DOWN, &r.bytes_down)?;
            opt(&mut m, f::DURATION_MS, &r.duration_ms)?;
            opt(&mut m, f::REDACTED, &r.redacted)?;
        }
        if r.inspected {
            m.serialize_entry(f::INSPECTED, &true)?;
        }
        opt(&mut m, f::COUNT, &r.count)?;
        opt(&mut m, f::APPROVAL, &r.approval)?;
        opt(&mut m, f::GRANT, &r.grant)?;
        opt(&mut m, f::SECRET, &r.secret)?;
        m.end()
    }
}

/// `key: value` when `value` is known (`Some`).
fn opt<M: SerializeMap, T: Serialize>(m: &mut M, key: &str, value: &Option<T>) -> Result<(), M::Error> {
    match value {
        Some(v) => m.serialize_entry(key, v),
        None => Ok(()),
    }
}

impl GateRecord {
    /// The record as a JSON object, keys in their order (what [`super::AuditLog::write_gate`]
    /// writes, for callers that add keys of their own).
    pub fn into_map(self) -> Map<String, Value> {
        match serde_json::to_value(Fields { rec: &self, admit: false }) {
            Ok(Value::Object(m)) => m,
            _ => Map::new(),
        }
    }
}
