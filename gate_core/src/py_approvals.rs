//! pyo3 bindings of the approvals store (`gatewrap._gate_core.ApprovalStore`,
//! `StaleDecision`): conversions and exception mapping only; see `approvals/`.

use std::sync::{Mutex, MutexGuard};

use pyo3::create_exception;
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::approvals::{self, Approval, Grant, GrantSpec, NewApproval, Run, Store, StoreError, Verdict};

create_exception!(
    gatewrap._gate_core,
    PendingLimit,
    PyValueError,
    "A new approval past a cap of pending approvals; `.scope` is \"run\" or \"store\", `.limit` the cap."
);

create_exception!(
    gatewrap._gate_core,
    UnsafeStore,
    PyValueError,
    "A SQLite store whose file or folder is not root's alone; the message says why and what to do."
);

create_exception!(
    gatewrap._gate_core,
    StaleDecision,
    PyValueError,
    "A decision or edit made on a view of an approval that is no longer current; `.why` says why."
);

/// The Python exception for a store error: [`StaleDecision`] (with `why`, `detail`, `id`),
/// ValueError for a refused value, OSError (errno set) for the database or its file.
pub fn store_err(py: Python<'_>, e: StoreError) -> PyErr {
    match e {
        StoreError::Stale(s) => {
            let err = StaleDecision::new_err(s.to_string());
            let v = err.value(py);
            let _ = v.setattr("why", s.why);
            let _ = v.setattr("detail", s.detail);
            let _ = v.setattr("id", s.id);
            err
        }
        StoreError::Invalid(m) => PyValueError::new_err(m),
        StoreError::Full { scope, limit, msg } => {
            let err = PendingLimit::new_err(msg);
            let v = err.value(py);
            let _ = v.setattr("scope", scope);
            let _ = v.setattr("limit", limit);
            err
        }
        StoreError::Unsafe { .. } => UnsafeStore::new_err(e.to_string()),
        StoreError::Missing { .. } => PyOSError::new_err((libc::ENOENT, e.to_string())),
        StoreError::Io { ref source, .. } => PyOSError::new_err((source.raw_os_error().unwrap_or(libc::EIO), e.to_string())),
        StoreError::Db { .. } => PyOSError::new_err((libc::EIO, e.to_string())),
    }
}

fn headers_list(h: &[(String, String)]) -> Vec<Vec<String>> {
    h.iter().map(|(n, v)| vec![n.clone(), v.clone()]).collect()
}

/// An approval as a dict: every column (headers as [[name, value], ...], bodies as bytes),
/// plus `body_truncated` and `review_path`.
pub fn approval_dict<'py>(py: Python<'py>, a: &Approval) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("id", &a.id)?;
    d.set_item("run_id", &a.run_id)?;
    d.set_item("created", a.created)?;
    d.set_item("deadline", a.deadline)?;
    d.set_item("rule", &a.rule)?;
    d.set_item("method", &a.method)?;
    d.set_item("url", &a.url)?;
    d.set_item("headers", headers_list(&a.headers))?;
    d.set_item("body", PyBytes::new(py, &a.body))?;
    d.set_item("body_len", a.body_len)?;
    d.set_item("body_digest", &a.body_digest)?;
    d.set_item("digest", &a.digest)?;
    d.set_item("idem_key", &a.idem_key)?;
    d.set_item("version", a.version)?;
    d.set_item("status", &a.status)?;
    d.set_item("hold", &a.hold)?;
    d.set_item("grants_allowed", a.grants_allowed)?;
    d.set_item("token", &a.token)?;
    d.set_item("decided_by", &a.decided_by)?;
    d.set_item("decided_at", a.decided_at)?;
    d.set_item("reason", &a.reason)?;
    d.set_item("edited", a.edited)?;
    d.set_item("orig_headers", a.orig_headers.as_deref().map(headers_list))?;
    d.set_item("orig_body", a.orig_body.as_deref().map(|b| PyBytes::new(py, b)))?;
    d.set_item("grant_id", &a.grant_id)?;
    d.set_item("sent_at", a.sent_at)?;
    d.set_item("upstream_status", a.upstream_status)?;
    d.set_item("waiters", a.waiters)?;
    d.set_item("body_truncated", a.body_truncated())?;
    d.set_item("review_path", a.review_path())?;
    Ok(d)
}

fn grant_dict<'py>(py: Python<'py>, g: &Grant) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("id", &g.id)?;
    d.set_item("run_id", &g.run_id)?;
    d.set_item("approval_id", &g.approval_id)?;
    d.set_item("method", &g.method)?;
    d.set_item("host", &g.host)?;
    d.set_item("path_prefix", &g.path_prefix)?;
    d.set_item("created", g.created)?;
    d.set_item("expires", g.expires)?;
    d.set_item("revoked", g.revoked)?;
    d.set_item("revoked_by", &g.revoked_by)?;
    d.set_item("uses", g.uses)?;
    d.set_item("created_by", &g.created_by)?;
    Ok(d)
}

fn run_dict<'py>(py: Python<'py>, r: &Run) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("run_id", &r.run_id)?;
    d.set_item("started", r.started)?;
    d.set_item("ended", r.ended)?;
    d.set_item("host", &r.host)?;
    d.set_item("pid", r.pid)?;
    d.set_item("wake", &r.wake)?;
    Ok(d)
}

/// A grant from its dict {"method", "host", "path_prefix", "seconds"}.
fn grant_spec(d: &Bound<'_, PyDict>) -> PyResult<GrantSpec> {
    let get = |k: &str| -> PyResult<Bound<'_, PyAny>> {
        d.get_item(k)?.ok_or_else(|| PyValueError::new_err(format!("grant: missing {k:?} (needs method, host, path_prefix, seconds)")))
    };
    Ok(GrantSpec {
        method: get("method")?.extract()?,
        host: get("host")?.extract()?,
        path_prefix: get("path_prefix")?.extract()?,
        seconds: get("seconds")?.extract()?,
    })
}

#[pyclass(name = "ApprovalStore", module = "gatewrap._gate_core", frozen)]
pub struct PyApprovalStore {
    inner: Mutex<Store>,
    url: String,
}

impl PyApprovalStore {
    fn store(&self) -> MutexGuard<'_, Store> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Run `f` on the store without the GIL; map its error.
    fn with<T: Send>(&self, py: Python<'_>, f: impl FnOnce(&mut Store) -> approvals::Result<T> + Send) -> PyResult<T> {
        py.allow_threads(|| f(&mut self.store())).map_err(|e| store_err(py, e))
    }
}

#[pymethods]
impl PyApprovalStore {
    /// Open the store at `url`; `create = False`: a SQLite store that does not exist is
    /// not made (FileNotFoundError). UnsafeStore: its file or folder is not root's alone.
    #[new]
    #[pyo3(signature = (url, *, create = true))]
    fn new(py: Python<'_>, url: String, create: bool) -> PyResult<Self> {
        let store = py
            .allow_threads(|| if create { Store::open(&url) } else { Store::open_existing(&url) })
            .map_err(|e| store_err(py, e))?;
        let url = store.url().to_string();
        Ok(PyApprovalStore { inner: Mutex::new(store), url })
    }

    #[getter]
    fn url(&self) -> &str {
        &self.url
    }

    #[pyo3(signature = (*, status = None, run_id = None, limit = 100))]
    fn list<'py>(&self, py: Python<'py>, status: Option<String>, run_id: Option<String>, limit: i64) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let list = self.with(py, |s| s.list(status.as_deref(), run_id.as_deref(), limit))?;
        list.iter().map(|a| approval_dict(py, a)).collect()
    }

    fn get<'py>(&self, py: Python<'py>, id: String) -> PyResult<Option<Bound<'py, PyDict>>> {
        self.with(py, |s| s.get(&id))?.map(|a| approval_dict(py, &a)).transpose()
    }

    fn get_by_token<'py>(&self, py: Python<'py>, token: String) -> PyResult<Option<Bound<'py, PyDict>>> {
        self.with(py, |s| s.get_by_token(&token))?.map(|a| approval_dict(py, &a)).transpose()
    }

    #[pyo3(signature = (id, *, version, digest, verdict, by, reason = None, grant = None))]
    #[allow(clippy::too_many_arguments)]
    fn decide<'py>(
        &self,
        py: Python<'py>,
        id: String,
        version: i64,
        digest: String,
        verdict: &str,
        by: String,
        reason: Option<String>,
        grant: Option<Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let verdict = match verdict {
            "approve" => Verdict::Approve,
            "reject" => Verdict::Reject,
            other => return Err(PyValueError::new_err(format!("verdict {other:?}: expected \"approve\" or \"reject\""))),
        };
        let grant = grant.as_ref().map(grant_spec).transpose()?;
        let a = self.with(py, |s| s.decide(&id, version, &digest, verdict, &by, reason.as_deref(), grant.as_ref()))?;
        approval_dict(py, &a)
    }

    #[pyo3(signature = (id, *, version, digest, by, headers, body))]
    #[allow(clippy::too_many_arguments)]
    fn edit<'py>(
        &self,
        py: Python<'py>,
        id: String,
        version: i64,
        digest: String,
        by: String,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let a = self.with(py, |s| s.edit(&id, version, &digest, &by, &headers, &body))?;
        approval_dict(py, &a)
    }

    #[pyo3(signature = (*, run_id = None, active = true))]
    fn grants<'py>(&self, py: Python<'py>, run_id: Option<String>, active: bool) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let list = self.with(py, |s| s.grants(run_id.as_deref(), active))?;
        list.iter().map(|g| grant_dict(py, g)).collect()
    }

    #[pyo3(signature = (id, *, by))]
    fn revoke_grant<'py>(&self, py: Python<'py>, id: String, by: String) -> PyResult<Bound<'py, PyDict>> {
        let g = self.with(py, |s| s.revoke_grant(&id, &by))?;
        grant_dict(py, &g)
    }

    #[pyo3(signature = (*, active = None))]
    fn runs<'py>(&self, py: Python<'py>, active: Option<bool>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let list = self.with(py, |s| s.runs(active))?;
        list.iter().map(|r| run_dict(py, r)).collect()
    }

    #[pyo3(signature = (run_id, *, host = String::from("localhost"), pid = 0, wake = None))]
    fn start_run(&self, py: Python<'_>, run_id: String, host: String, pid: i64, wake: Option<String>) -> PyResult<()> {
        self.with(py, |s| s.start_run(&run_id, &host, pid, wake.as_deref()))
    }

    fn end_run(&self, py: Python<'_>, run_id: String) -> PyResult<()> {
        self.with(py, |s| s.end_run(&run_id))
    }

    fn counts<'py>(&self, py: Python<'py>, run_id: String) -> PyResult<Bound<'py, PyDict>> {
        let c = self.with(py, |s| s.counts(&run_id))?;
        let d = PyDict::new(py);
        d.set_item("asked", c.asked)?;
        d.set_item("approved", c.approved)?;
        d.set_item("rejected", c.rejected)?;
        d.set_item("expired", c.expired)?;
        d.set_item("granted", c.granted)?;
        d.set_item("by_grant", c.by_grant)?;
        Ok(d)
    }

    /// Persist a pending approval as the gate does (for tools and tests of the CLI and web
    /// page without a sandbox): (approval, new). Headers are redacted before they are stored.
    #[pyo3(signature = (run_id, *, rule, method, url, headers, body, timeout = 600.0, hold = String::from("wait"), grants_allowed = true, idem_key = None, max_pending = approvals::DEFAULT_MAX_PENDING, max_pending_store = approvals::DEFAULT_MAX_PENDING_STORE))]
    #[allow(clippy::too_many_arguments)]
    fn ask<'py>(
        &self,
        py: Python<'py>,
        run_id: String,
        rule: String,
        method: String,
        url: String,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
        timeout: f64,
        hold: String,
        grants_allowed: bool,
        idem_key: Option<String>,
        max_pending: i64,
        max_pending_store: i64,
    ) -> PyResult<(Bound<'py, PyDict>, bool)> {
        let req = NewApproval {
            run_id,
            rule,
            method,
            url,
            headers,
            body,
            idem_key,
            timeout,
            hold,
            grants_allowed,
            body_limit: approvals::DEFAULT_BODY_LIMIT,
            caps: approvals::PendingCaps { run: max_pending, store: max_pending_store },
        };
        let (a, new) = self.with(py, |s| s.ask(&req))?;
        Ok((approval_dict(py, &a)?, new))
    }

    /// Remove approvals decided, sent, cancelled or expired before `before` (Unix seconds),
    /// grants revoked or expired before it, runs ended before it with nothing left:
    /// {"approvals", "grants", "runs"} (how many of each).
    fn prune<'py>(&self, py: Python<'py>, before: f64) -> PyResult<Bound<'py, PyDict>> {
        let p = self.with(py, |s| s.prune(before))?;
        let d = PyDict::new(py);
        d.set_item("approvals", p.approvals)?;
        d.set_item("grants", p.grants)?;
        d.set_item("runs", p.runs)?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        format!("<ApprovalStore {}>", self.url)
    }
}

/// Register the classes and the exception in the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let stale = py.get_type::<StaleDecision>();
    stale.setattr("why", "")?;
    m.add("StaleDecision", stale)?;
    m.add("PendingLimit", py.get_type::<PendingLimit>())?;
    m.add("UnsafeStore", py.get_type::<UnsafeStore>())?;
    m.add("DEFAULT_MAX_PENDING", approvals::DEFAULT_MAX_PENDING)?;
    m.add("DEFAULT_MAX_PENDING_STORE", approvals::DEFAULT_MAX_PENDING_STORE)?;
    m.add("MAX_REASON", approvals::MAX_REASON)?;
    m.add_class::<PyApprovalStore>()?;
    Ok(())
}
