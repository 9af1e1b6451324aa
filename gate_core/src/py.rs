//! pyo3 bindings (`gatewrap._gate_core`): conversions and exception mapping only.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use pyo3::create_exception;
use pyo3::exceptions::{PyOSError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::{Map, Value};

use crate::audit::{AuditError, AuditLog, NoteKey, Rotation};
use crate::gate::{self as gate, Gate, GateConfig};
use crate::launcher::{self, SpawnRequest};
use crate::policy::ssrf::PublicRanges;
use crate::policy::{self, canonical_host, Policy};

create_exception!(gatewrap._gate_core, PolicyError, PyValueError, "A bad policy file or --allow/--deny value.");
create_exception!(gatewrap._gate_core, GateError, PyRuntimeError, "The gate could not start.");
create_exception!(gatewrap._gate_core, SpawnError, PyOSError, "The launcher could not start the agent.");

fn policy_err(e: policy::PolicyError) -> PyErr {
    PolicyError::new_err(e.to_string())
}

fn gate_err(e: gate::GateError) -> PyErr {
    GateError::new_err(e.to_string())
}

fn spawn_err(py: Python<'_>, e: launcher::SpawnError) -> PyErr {
    let err = SpawnError::new_err((e.errno(), e.to_string()));
    let stage = if e.is_exec() { "exec" } else { "setup" };
    // Best effort: the exception is still raised without the attribute.
    let _ = err.value(py).setattr("stage", stage);
    err
}

fn audit_err(e: AuditError) -> PyErr {
    match e.io() {
        Some(io) => PyOSError::new_err((io.raw_os_error().unwrap_or(libc::EIO), e.to_string())),
        None => PyValueError::new_err(e.to_string()),
    }
}

#[pyclass(name = "Policy", module = "gatewrap._gate_core", frozen)]
pub struct PyPolicy {
    inner: Arc<RwLock<Policy>>,
}

impl PyPolicy {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Policy> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }
}

#[pymethods]
impl PyPolicy {
    #[staticmethod]
    fn from_toml(text: &str, source: &str) -> PyResult<Self> {
        let p = policy::file::from_toml(text, source).map_err(policy_err)?;
        Ok(PyPolicy { inner: Arc::new(RwLock::new(p)) })
    }

    #[staticmethod]
    #[pyo3(name = "new", signature = (default = "deny"))]
    fn new_policy(default: &str) -> PyResult<Self> {
        let action = policy::file::parse_action(default).map_err(policy_err)?;
        Ok(PyPolicy { inner: Arc::new(RwLock::new(Policy::new(action))) })
    }

    fn add_rule(&self, spec: &str, action: &str, origin: &str) -> PyResult<()> {
        let mut p = self.inner.write().unwrap_or_else(|p| p.into_inner());
        p.add_rule(spec, action, origin).map_err(policy_err)
    }

    /// `--allow-private HOST[:PORT]`: an allow rule with `allow_private = true` (names only).
    fn add_private_rule(&self, spec: &str, origin: &str) -> PyResult<()> {
        let mut p = self.inner.write().unwrap_or_else(|p| p.into_inner());
        p.add_private_rule(spec, origin).map_err(policy_err)
    }

    /// Put `other`'s rules, default, mode, `public_ranges` and `[approvals]` limits in
    /// place of this policy's, for the requests that come next (`gatewrap reload`): a gate
    /// made with this policy decides by `other` from now on. The `[sandbox]` and `[notify]`
    /// tables stay as they were (the jail and the notifications were set up at start).
    fn replace_with(&self, other: &PyPolicy) {
        if std::ptr::eq(self, other) {
            return;
        }
        let mut new = other.read().clone();
        let mut p = self.inner.write().unwrap_or_else(|p| p.into_inner());
        new.sandbox = std::mem::take(&mut p.sandbox);
        new.notify = std::mem::take(&mut p.notify);
        *p = new;
    }

    /// The file's top-level `public_ranges` (CIDR strings).
    #[getter]
    fn public_ranges(&self) -> Vec<String> {
        self.read().public_ranges.ranges().iter().map(|c| c.to_string()).collect()
    }

    /// The decision on a CONNECT tunnel to `host:port`: (action, reason, rule, inspect).
    fn decide_connect(&self, host: &str, port: u16) -> PyResult<(&'static str, String, Option<String>, bool)> {
        let host = canonical_host(host).map_err(|e| policy_err(e.into()))?;
        let d = self.read().decide_connect(&host, port);
        Ok((d.action.as_str(), d.reason, d.rule, d.inspect))
    }

    /// The decision on one request (`scheme` "http" or "https", `path` with any query):
    /// (action, reason, rule). Budgets are the gate's: not counted here.
    fn decide_request(&self, host: &str, port: u16, scheme: &str, method: &str, path: &str) -> PyResult<(&'static str, String, Option<String>)> {
        let host = canonical_host(host).map_err(|e| policy_err(e.into()))?;
        let scheme = match scheme {
            "http" => policy::Scheme::Http,
            "https" => policy::Scheme::Https,
            other => return Err(PyValueError::new_err(format!("invalid scheme {other:?}: expected \"http\" or \"https\""))),
        };
        let facts = policy::RequestFacts { host: &host, port, scheme, method, path };
        let d = self.read().decide_request(&facts);
        Ok((d.action.as_str(), d.reason, d.rule))
    }

    #[getter]
    fn default(&self) -> &'static str {
        self.read().default.as_str()
    }

    #[getter]
    fn mode(&self) -> &'static str {
        self.read().mode.as_str()
    }

    fn describe<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        self.read()
            .rules()
            .map(|r| {
                let d = PyDict::new(py);
                d.set_item("id", &r.id)?;
                d.set_item("host", r.host.to_string())?;
                d.set_item("ports", r.ports.to_vec())?;
                d.set_item("ports_default", matches!(r.ports, policy::Ports::Web))?;
                d.set_item("action", r.action.as_str())?;
                d.set_item("origin", match r.origin {
                    policy::Origin::Cli => "cli",
                    policy::Origin::File => "file",
                })?;
                d.set_item("line", r.line)?;
                d.set_item("allow_private", r.allow_private)?;
                d.set_item("inspect", r.inspect)?;
                d.set_item("methods", r.methods.clone())?;
                d.set_item("path", r.path.as_ref().map(|p| p.as_str().to_string()))?;
                d.set_item("schemes", r.schemes.as_ref().map(|s| s.iter().map(|x| x.as_str()).collect::<Vec<_>>()))?;
                d.set_item("timeout", r.timeout.map(policy::duration::show_duration))?;
                d.set_item("budget", r.budget.map(|b| (b.count, policy::duration::show_duration(b.per))))?;
                d.set_item("inject", r.inject.as_ref().map(|i| (i.secret.clone(), i.place.describe())))?;
                Ok(d)
            })
            .collect()
    }

    /// Add the host secrets file's text (`/etc/gatewrap/secrets.toml`, `source` its name) and
    /// check every rule's `inject` names a defined secret; `None`: check only.
    ///
    /// Errors: PolicyError (`FILE:LINE: ...`).
    #[pyo3(signature = (text = None, source = "/etc/gatewrap/secrets.toml"))]
    fn add_host_secrets(&self, text: Option<&str>, source: &str) -> PyResult<()> {
        let defs = match text {
            Some(t) => policy::file::secrets_from_toml(t, source).map_err(policy_err)?,
            None => Vec::new(),
        };
        let mut p = self.inner.write().unwrap_or_else(|p| p.into_inner());
        p.add_host_secrets(defs).map_err(policy_err)
    }

    /// The `[[secret]]`s: [{"name", "source": ("file"|"env"|"command", str | [str]),
    /// "placeholder_env": str | None, "budget": int | None (requests per run), "origin": "FILE:LINE"}].
    fn secrets<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        self.read()
            .secrets
            .iter()
            .map(|s| {
                let d = PyDict::new(py);
                d.set_item("name", &s.name)?;
                match &s.source {
                    policy::Source::File(f) => d.set_item("source", ("file", f))?,
                    policy::Source::Env(e) => d.set_item("source", ("env", e))?,
                    policy::Source::Command(c) => d.set_item("source", ("command", c.clone()))?,
                }
                d.set_item("placeholder_env", s.placeholder_env.clone())?;
                d.set_item("budget", s.budget)?;
                d.set_item("origin", &s.origin)?;
                Ok(d)
            })
            .collect()
    }

    /// The file's `[notify]` table: {"webhook": str | None}.
    fn notify<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("webhook", self.read().notify.webhook.clone())?;
        Ok(d)
    }

    /// The file's `[sandbox]` table: {"ro_bind": [(path, line)], "bind": [(path, line)],
    /// "env": [(entry, line)], "unprotect": [(path, line)]}.
    fn sandbox<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let p = self.read();
        let d = PyDict::new(py);
        let pairs = |list: &[policy::SandboxPath]| list.iter().map(|s| (s.path.clone(), s.line)).collect::<Vec<_>>();
        d.set_item("ro_bind", pairs(&p.sandbox.ro_bind))?;
        d.set_item("bind", pairs(&p.sandbox.bind))?;
        d.set_item("env", pairs(&p.sandbox.env))?;
        d.set_item("unprotect", pairs(&p.sandbox.unprotect))?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        let p = self.read();
        format!("<Policy default={} mode={} rules={}>", p.default.as_str(), p.mode.as_str(), p.rules().count())
    }
}

#[pyclass(name = "AuditLog", module = "gatewrap._gate_core", frozen)]
pub struct PyAuditLog {
    inner: Arc<AuditLog>,
}

fn to_json(obj: &Bound<'_, PyAny>, depth: usize) -> PyResult<Value> {
    if depth > 64 {
        return Err(PyValueError::new_err("audit record nested too deeply"));
    }
    if obj.is_none() {
        Ok(Value::Null)
    } else if obj.is_instance_of::<PyBool>() {
        Ok(Value::Bool(obj.extract()?))
    } else if obj.is_instance_of::<PyInt>() {
        if let Ok(i) = obj.extract::<i64>() {
            Ok(Value::from(i))
        } else {
            Ok(Value::from(obj.extract::<u64>()?))
        }
    } else if obj.is_instance_of::<PyFloat>() {
        let f: f64 = obj.extract()?;
        serde_json::Number::from_f64(f)
            .map(Value::Number)
            .ok_or_else(|| PyValueError::new_err(format!("audit record: {f} is not a JSON number")))
    } else if let Ok(s) = obj.downcast::<PyString>() {
        Ok(Value::String(py_text(s)))
    } else if let Ok(b) = obj.downcast::<PyBytes>() {
        Ok(Value::String(lossless_text(b.as_bytes())))
    } else if let Ok(l) = obj.downcast::<PyList>() {
        l.iter().map(|v| to_json(&v, depth + 1)).collect::<PyResult<_>>().map(Value::Array)
    } else if let Ok(t) = obj.downcast::<PyTuple>() {
        t.iter().map(|v| to_json(&v, depth + 1)).collect::<PyResult<_>>().map(Value::Array)
    } else if let Ok(d) = obj.downcast::<PyDict>() {
        dict_to_map(d, depth + 1).map(Value::Object)
    } else {
        Err(PyTypeError::new_err(format!(
            "audit record: cannot store a value of type {}",
            obj.get_type().name()?
        )))
    }
}

/// `bytes` as text: its valid UTF-8 as it is, every other byte as `\xNN` (as Python's
/// `backslashreplace`), so that nothing an agent wrote is lost or written raw.
fn lossless_text(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        out.push_str(chunk.valid());
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// A Python str as Rust text: one holding lone surrogates (a file name decoded with
/// `surrogateescape`, PEP 383) has its escaped bytes written `\xNN`; other lone
/// surrogates become U+FFFD.
fn py_text(s: &Bound<'_, PyString>) -> String {
    if let Ok(t) = s.to_str() {
        return t.to_string();
    }
    match s.call_method1("encode", ("utf-8", "surrogateescape")).and_then(|b| b.extract::<Vec<u8>>()) {
        Ok(bytes) => lossless_text(&bytes),
        Err(_) => s.to_string_lossy().into_owned(),
    }
}

fn dict_to_map(d: &Bound<'_, PyDict>, depth: usize) -> PyResult<Map<String, Value>> {
    let mut m = Map::with_capacity(d.len());
    for (k, v) in d.iter() {
        let key = k
            .downcast::<PyString>()
            .map_err(|_| PyTypeError::new_err("audit record keys must be str"))?
            .to_str()?
            .to_string();
        m.insert(key, to_json(&v, depth)?);
    }
    Ok(m)
}

#[pymethods]
impl PyAuditLog {
    #[new]
    #[pyo3(signature = (path, key = Some(PathBuf::from(crate::audit::note::DEFAULT_KEY)), checkpoint_every = crate::audit::CHECKPOINT_RECORDS, checkpoint_interval = crate::audit::CHECKPOINT_INTERVAL.as_secs_f64(), max_size = crate::audit::rotate::DEFAULT_MAX_SIZE, keep = None))]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        key: Option<PathBuf>,
        checkpoint_every: u64,
        checkpoint_interval: f64,
        max_size: u64,
        keep: Option<usize>,
    ) -> PyResult<Self> {
        let interval = Duration::try_from_secs_f64(checkpoint_interval)
            .map_err(|_| PyValueError::new_err("checkpoint_interval must be a number of seconds >= 0"))?;
        let min = crate::audit::rotate::MIN_MAX_SIZE;
        if max_size != 0 && max_size < min {
            return Err(PyValueError::new_err(format!("max_size {max_size} is below {min} bytes (0: never rotate)")));
        }
        let log = py
            .allow_threads(|| {
                let log = AuditLog::open(&path)?;
                match key {
                    Some(k) => {
                        let key = NoteKey::load_or_create(&k).map_err(AuditError::Key)?;
                        let log = log.with_checkpoints(key, checkpoint_every, interval);
                        Ok(if max_size == 0 { log } else { log.with_rotation(Rotation { max_size, keep }) })
                    }
                    None => Ok(log),
                }
            })
            .map_err(audit_err)?;
        Ok(PyAuditLog { inner: Arc::new(log) })
    }

    fn checkpoint(&self, py: Python<'_>) -> PyResult<()> {
        let log = self.inner.clone();
        py.allow_threads(move || log.checkpoint()).map_err(audit_err)
    }

    #[getter]
    fn path(&self) -> String {
        self.inner.path().to_string_lossy().into_owned()
    }

    fn write(&self, py: Python<'_>, record: &Bound<'_, PyDict>) -> PyResult<()> {
        let map = dict_to_map(record, 0)?;
        let log = self.inner.clone();
        py.allow_threads(move || log.write(map)).map_err(audit_err)
    }

    fn sync(&self, py: Python<'_>) -> PyResult<()> {
        let log = self.inner.clone();
        py.allow_threads(move || log.sync()).map_err(audit_err)
    }

    fn __repr__(&self) -> String {
        format!("<AuditLog {}>", self.inner.path().display())
    }
}

/// A BPF ring buffer map read through its memory (`crate::ringbuf`): Python polls the map's
/// fd and calls `consume`. One thread at a time (the caller locks; a second call meanwhile
/// raises RuntimeError: already borrowed).
#[pyclass(name = "RingReader", module = "gatewrap._gate_core")]
struct PyRingReader {
    inner: Option<crate::ringbuf::RingReader>,
}

#[pymethods]
impl PyRingReader {
    #[new]
    fn new(map_fd: i32, size: u64) -> PyResult<Self> {
        let reader = crate::ringbuf::RingReader::new(map_fd, size).map_err(|e| match e.raw_os_error() {
            Some(errno) => PyOSError::new_err((errno, format!("cannot map the ring buffer (fd {map_fd}): {e}"))),
            None => PyValueError::new_err(e.to_string()),
        })?;
        Ok(PyRingReader { inner: Some(reader) })
    }

    /// Call `callback(record)` (bytes) for each record waiting, in order; returns how many.
    /// An exception from `callback` is raised after its record is marked read. 0 once closed.
    fn consume(&self, py: Python<'_>, callback: &Bound<'_, PyAny>) -> PyResult<usize> {
        let Some(reader) = &self.inner else { return Ok(0) };
        reader.consume(|sample| callback.call1((PyBytes::new(py, sample),)).map(|_| ()))
    }

    /// Unmap the buffer (the map stays while its fd or the hooks' map of maps holds it). Idempotent.
    fn close(&mut self) {
        self.inner = None;
    }
}

/// A close-on-exec duplicate of the caller's `fd` (the caller keeps and closes its own).
///
/// Errors: ValueError for a negative fd; OSError (EBADF, EMFILE...) from fcntl(2).
fn dup_cloexec(fd: i32) -> PyResult<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    if fd < 0 {
        return Err(PyValueError::new_err(format!("invalid notice_fd {fd}: expected an open file descriptor")));
    }
    // SAFETY: F_DUPFD_CLOEXEC on any int is safe; on success the new fd is ours alone.
    let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
    if dup < 0 {
        let e = std::io::Error::last_os_error();
        return Err(PyOSError::new_err((e.raw_os_error().unwrap_or(0), format!("cannot duplicate notice_fd {fd}: {e}"))));
    }
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(dup) })
}

#[pyclass(name = "Gate", module = "gatewrap._gate_core", frozen)]
pub struct PyGate {
    inner: Gate,
}

#[pymethods]
impl PyGate {
    #[new]
    #[pyo3(signature = (*, run_id, netns_path, policy, audit, listen_port = 3128, nameservers = None, connect_timeout = 10.0, public_ranges = None, notices = false, dns_stub = false, ca_dir = None, upstream_ca = None, body_limit = gate::inspect::DEFAULT_BODY_LIMIT, idle_timeout = gate::DEFAULT_IDLE_TIMEOUT.as_secs_f64(), run_cgroup = None, state = None, on_asked = None, shared_runtime = false, notice_fd = None, secrets = None, answer_prefix = None, answer_suffix = None, allow_hint = "run"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        run_id: String,
        netns_path: PathBuf,
        policy: PyRef<'_, PyPolicy>,
        audit: PyRef<'_, PyAuditLog>,
        listen_port: u16,
        nameservers: Option<Vec<String>>,
        connect_timeout: f64,
        public_ranges: Option<Vec<String>>,
        notices: bool,
        dns_stub: bool,
        ca_dir: Option<PathBuf>,
        upstream_ca: Option<Vec<PathBuf>>,
        body_limit: u64,
        idle_timeout: f64,
        run_cgroup: Option<PathBuf>,
        state: Option<String>,
        on_asked: Option<PyObject>,
        shared_runtime: bool,
        notice_fd: Option<i32>,
        secrets: Option<Vec<(String, String, Option<String>)>>,
        answer_prefix: Option<String>,
        answer_suffix: Option<String>,
        allow_hint: &str,
    ) -> PyResult<Self> {
        if !(connect_timeout.is_finite() && connect_timeout > 0.0) {
            return Err(gate_err(gate::GateError::ConnectTimeout(connect_timeout)));
        }
        if !(idle_timeout.is_finite() && idle_timeout > 0.0) {
            return Err(gate_err(gate::GateError::IdleTimeout(idle_timeout)));
        }
        let public_ranges = PublicRanges::parse(public_ranges.as_deref().unwrap_or_default())
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let allow_hint = gate::AllowHint::from_name(allow_hint)
            .ok_or_else(|| PyValueError::new_err(format!("allow_hint: {allow_hint:?} is neither \"run\" nor \"container\"")))?;
        let notice_fd = notice_fd.map(dup_cloexec).transpose()?;
        let secrets = gate::secrets::Secrets::new(secrets.unwrap_or_default()).map_err(PyValueError::new_err)?;
        let config = GateConfig {
            secrets: Arc::new(RwLock::new(secrets)),
            run_id,
            netns_path,
            policy: policy.inner.clone(),
            audit: audit.inner.clone(),
            listen_port,
            nameservers,
            connect_timeout: Duration::from_secs_f64(connect_timeout),
            public_ranges,
            notices,
            notice_fd,
            shared_runtime,
            dns_stub,
            inspect: gate::inspect::InspectSettings { ca_dir, upstream_ca: upstream_ca.unwrap_or_default(), body_limit },
            idle_timeout: Duration::from_secs_f64(idle_timeout),
            run_cgroup,
            state,
            on_asked: on_asked.map(|cb| -> gate::OnAsked {
                Box::new(move |a| {
                    // A notification never decides: its errors are dropped.
                    Python::with_gil(|py| {
                        if let Ok(d) = crate::py_approvals::approval_dict(py, a) {
                            let _ = cb.call1(py, (d,));
                        }
                    })
                })
            }),
            answer_hint: {
                let d = gate::AnswerHint::default();
                gate::AnswerHint { prefix: answer_prefix.unwrap_or(d.prefix), suffix: answer_suffix.unwrap_or(d.suffix) }
            },
            allow_hint,
        };
        let gate = py.allow_threads(move || Gate::start(config)).map_err(gate_err)?;
        Ok(PyGate { inner: gate })
    }

    /// Replace the run's secrets (a rotation: `[(name, value, placeholder)]`, every one of
    /// the run's, placeholders unchanged); requests from now on get the new values.
    ///
    /// Errors: ValueError as `Gate(secrets=...)` (the message names a secret, never a value).
    fn set_secrets(&self, secrets: Vec<(String, String, Option<String>)>) -> PyResult<()> {
        let new = gate::secrets::Secrets::new(secrets).map_err(PyValueError::new_err)?;
        *self.inner.secrets().write().unwrap_or_else(|p| p.into_inner()) = new;
        Ok(())
    }

    #[getter]
    fn listen_addrs(&self) -> Vec<String> {
        self.inner.listen_addrs().iter().map(|a| a.to_string()).collect()
    }

    fn counts<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (allowed, denied, failed) = self.inner.counts();
        let d = PyDict::new(py);
        d.set_item("allowed", allowed)?;
        d.set_item("denied", denied)?;
        d.set_item("failed", failed)?;
        let (inspected, would_deny, unsent, held) = self.inner.more_counts();
        d.set_item("inspected", inspected)?;
        d.set_item("would_deny", would_deny)?;
        d.set_item("unsent", unsent)?;
        d.set_item("held", held)?;
        Ok(d)
    }

    #[pyo3(signature = (end_run = true))]
    fn stop(&self, py: Python<'_>, end_run: bool) {
        py.allow_threads(|| self.inner.stop_serving(end_run));
    }

    fn __repr__(&self) -> String {
        let addrs: Vec<String> = self.listen_addrs();
        format!("<Gate listening on {}>", addrs.join(", "))
    }
}

/// The signed-note verifier key of the audit key at `path` (made if missing).
#[pyfunction]
#[pyo3(signature = (path = PathBuf::from(crate::audit::note::DEFAULT_KEY)))]
fn audit_verifier_key(py: Python<'_>, path: PathBuf) -> PyResult<String> {
    py.allow_threads(|| NoteKey::load_or_create(&path).map(|k| k.verifier()))
        .map_err(|e| audit_err(AuditError::Key(e)))
}

/// Load the TLS inspection CA from `ca_dir`, or make it there; returns the path of its
/// certificate (PEM). See `gate::inspect::ca`.
#[pyfunction]
fn ensure_ca(py: Python<'_>, ca_dir: PathBuf) -> PyResult<String> {
    let ca = py.allow_threads(|| gate::inspect::ca::Ca::load_or_create(&ca_dir)).map_err(|e| GateError::new_err(e.to_string()))?;
    Ok(ca.cert_path.to_string_lossy().into_owned())
}

/// Seconds of a duration in the policy file's grammar (`30s`, `10m`, `2h`; see
/// `policy::duration`): one grammar for the policy and gatewrap's options (`--timeout`).
/// Raises ValueError with the grammar's message.
#[pyfunction]
fn parse_duration(text: &str) -> PyResult<f64> {
    policy::duration::parse_duration(text).map(|d| d.as_secs_f64()).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// The kernel's Landlock ABI version, or `None` without Landlock; see
/// `launcher::landlock::abi` (for `gatewrap doctor`).
#[pyfunction]
fn landlock_abi() -> Option<u32> {
    launcher::landlock::abi()
}

#[pyfunction]
#[pyo3(signature = (argv, env, cwd, netns_path, cgroup_dir, uid, gid, groups, hide=Vec::new(), readonly=Vec::new(), jail="none", join_cgroups=Vec::new(), oom_score_adj=None, nproc=None, nofile=None))]
#[allow(clippy::too_many_arguments)]
fn spawn_agent(
    py: Python<'_>,
    argv: Vec<String>,
    env: std::collections::BTreeMap<String, String>,
    cwd: PathBuf,
    netns_path: PathBuf,
    cgroup_dir: PathBuf,
    uid: u32,
    gid: u32,
    groups: Vec<u32>,
    hide: Vec<PathBuf>,
    readonly: Vec<PathBuf>,
    jail: &str,
    join_cgroups: Vec<PathBuf>,
    oom_score_adj: Option<i32>,
    nproc: Option<u64>,
    nofile: Option<u64>,
) -> PyResult<u32> {
    let mode = match jail {
        "nsjail" => launcher::Mode::Nsjail,
        "none" => launcher::Mode::Direct,
        other => return Err(pyo3::exceptions::PyValueError::new_err(format!("jail: {other:?} is not nsjail or none"))),
    };
    let req = SpawnRequest {
        argv,
        env: env.into_iter().collect(),
        cwd,
        netns_path,
        cgroup_dir,
        uid,
        gid,
        groups,
        hide,
        readonly,
        mode,
        join_cgroups,
        oom_score_adj,
        nproc,
        nofile,
    };
    py.allow_threads(|| launcher::spawn(&req)).map_err(|e| spawn_err(py, e))
}

#[pymodule]
fn _gate_core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("PolicyError", py.get_type::<PolicyError>())?;
    m.add("GateError", py.get_type::<GateError>())?;
    let spawn_error = py.get_type::<SpawnError>();
    spawn_error.setattr("stage", "setup")?;
    m.add("SpawnError", spawn_error)?;
    m.add_class::<PyPolicy>()?;
    m.add_class::<PyAuditLog>()?;
    m.add_class::<PyGate>()?;
    m.add_class::<PyRingReader>()?;
    m.add_function(wrap_pyfunction!(spawn_agent, m)?)?;
    m.add_function(wrap_pyfunction!(ensure_ca, m)?)?;
    m.add_function(wrap_pyfunction!(landlock_abi, m)?)?;
    m.add_function(wrap_pyfunction!(parse_duration, m)?)?;
    m.add_function(wrap_pyfunction!(audit_verifier_key, m)?)?;
    crate::py_approvals::register(m)?;
    Ok(())
}
