//! The gate's one record per decision.

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
}

impl GateRecord {
    pub fn into_map(self) -> Map<String, Value> {
        let mut m = Map::new();
        let mut put = |k: &str, v: Option<Value>| {
            if let Some(v) = v {
                m.insert(k.to_string(), v);
            }
        };
        put(f::RUN, Some(self.run.into()));
        put(f::EVENT, Some(self.event.into()));
        put(f::DECISION, Some(self.decision.into()));
        put(f::REASON, self.reason.map(Value::from));
        put(f::RULE, self.rule.map(Value::from));
        put(f::WOULD, self.would.map(Value::from));
        put(f::CLIENT, self.client.map(Value::from));
        put(f::CLIENT_PID, self.client_pid.map(|p| p.map_or(Value::Null, Value::from)));
        put(f::CLIENT_COMM, self.client_comm.map(Value::from));
        put(f::METHOD, self.method.map(Value::from));
        put(f::TARGET, self.target.map(Value::from));
        put(f::DST_HOST, self.dst_host.map(Value::from));
        put(f::DST_IP, self.dst_ip.map(Value::from));
        put(f::DST_PORT, self.dst_port.map(Value::from));
        put(f::PROTO, Some(self.proto.into()));
        put(f::STATUS, self.status.map(Value::from));
        put(f::ERROR, self.error.map(Value::from));
        put(f::INSPECTED, self.inspected.then_some(Value::Bool(true)));
        put(f::COUNT, self.count.map(Value::from));
        put(f::APPROVAL, self.approval.map(Value::from));
        put(f::GRANT, self.grant.map(Value::from));
        put(f::SECRET, self.secret.map(Value::from));
        m
    }
}
