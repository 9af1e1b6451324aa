//! What every connection task shares, and the audit record of a decision in progress.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use hickory_resolver::TokioAsyncResolver;
use hyper::{Request, Response, StatusCode, Uri};

use crate::audit::{fields as f, AuditError, AuditLog, GateRecord};
use crate::policy::ssrf::PublicRanges;
use crate::policy::Policy;

use super::admit::Admission;
use super::dial::DialError;
use super::respond;

#[derive(Debug, Default)]
pub struct Counts {
    /// Requests and plain tunnels let through (inspected tunnels are counted apart: their
    /// requests are counted here, each with its own decision).
    pub allowed: AtomicU64,
    pub denied: AtomicU64,
    pub failed: AtomicU64,
    /// Tunnels the gate TLS-inspected.
    pub inspected: AtomicU64,
    /// Let through by `report` mode that `enforce` would have denied (also in `allowed`).
    pub would_deny: AtomicU64,
    /// Refused with 503 before any dial because their record could not be written (decision
    /// `failed`, error `internal: ...`): not in `failed`, which is what upstream broke.
    pub unsent: AtomicU64,
    /// Answered 409 while their approval waits (`hold = "return"`; decision `denied`,
    /// reason [`super::hold::HELD_REASON`]): not in `denied`.
    pub held: AtomicU64,
}

/// What every connection task shares.
pub struct Ctx {
    pub(super) run_id: String,
    pub(super) policy: Arc<RwLock<Policy>>,
    pub(super) audit: Arc<AuditLog>,
    pub(super) resolver: TokioAsyncResolver,
    /// The run's lookups in flight (see `guard::MAX_LOOKUPS`).
    pub(super) lookups: tokio::sync::Semaphore,
    pub(super) connect_timeout: Duration,
    pub(super) counts: Arc<Counts>,
    /// Extra ranges the SSRF guard counts as public.
    pub(super) public_ranges: PublicRanges,
    pub(super) notices: super::notice::Notices,
    /// Budget counters of this run (see `policy::budget`).
    pub(super) budgets: crate::policy::Budgets,
    /// TLS inspection; `None` when the gate has no CA.
    pub(super) inspector: Option<Arc<super::inspect::Inspector>>,
    pub(super) idle_timeout: Duration,
    /// The last audit write failed (see [`Ctx::record`]).
    pub(super) audit_failing: AtomicBool,
    /// The processes behind the open connections (see `client`).
    pub(super) clients: Arc<super::client::Clients>,
    /// How many `dns` records the stub may still write this second (see `dns_stub`).
    pub(super) dns_rate: super::dns_stub::RecordRate,
    /// The run's denials, folded (see `fold`).
    pub(super) folds: super::fold::Folds,
    /// Kept upstream connections of plain-http requests (see `pool`).
    pub(super) upstream: super::pool::Pool<super::pool::ReqBody>,
    /// Kept upstream TLS connections of inspected requests (see `pool`, `inspect`).
    pub(super) inspected: super::pool::Pool<super::inspect::UpBody>,
    /// Approvals (breakpoints); `None`: an `ask` is a denial.
    pub(super) approvals: Option<Arc<super::hold::Approvals>>,
    /// The proxy port's own addresses in the sandbox netns (`127.0.0.1:PORT`, `[::1]:PORT`):
    /// an absolute-form request to one of them is for the gate itself (`wait_endpoint`).
    pub(super) listen_addrs: Vec<SocketAddr>,
    /// This gate's tasks (see `tasks`): every task it spawns is one of them.
    pub(super) tasks: super::tasks::Tasks,
    /// The run's secrets (see `secrets`), replaced whole on rotation.
    pub(super) secrets: super::secrets::Shared,
    /// Which settings its 403 bodies and notices name to allow a destination.
    pub(super) allow_hint: super::respond::AllowHint,
    /// The run's open connections and half-closed tunnels (see `server`'s caps).
    pub(super) open: Arc<super::server::Cap>,
    pub(super) half_closed: Arc<super::server::Cap>,
}

impl Ctx {
    /// The run's connections now: open ones and half-closed tunnels (what `fd_room` weighs).
    pub(super) fn held(&self) -> usize {
        self.open.taken() + self.half_closed.taken()
    }

    /// Spawn `fut` as one of this gate's tasks: it ends when it completes or when the gate
    /// stops (see [`super::tasks::Tasks::spawn`]). The only way the gate spawns a task.
    pub(super) fn spawn<F>(&self, fut: F)
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.tasks.spawn(fut);
    }

    /// A record naming the run, event, protocol and client only (no request was parsed).
    pub(super) fn bare_record(&self, event: &'static str, proto: &'static str, peer: SocketAddr) -> GateRecord {
        let who = self.clients.of(peer);
        GateRecord {
            run: self.run_id.clone(),
            event,
            proto,
            client: Some(peer.to_string()),
            client_pid: who.as_ref().map(|c| c.pid),
            client_comm: who.and_then(|c| c.comm),
            ..GateRecord::default()
        }
    }

    pub(super) fn record_for<B>(&self, event: &'static str, proto: &'static str, peer: SocketAddr, req: &Request<B>) -> GateRecord {
        GateRecord {
            method: Some(req.method().to_string()),
            target: Some(target_of(req.uri())),
            ..self.bare_record(event, proto, peer)
        }
    }

    /// Count and log one decision (a repeated denial folded, see `fold`: its record is its
    /// key's at the window's end, and this returns Ok). The caller decides what a failed
    /// write means for the client (see [`Ctx::admit`], [`Ctx::refuse_with`]); the first
    /// failure after a success (and the first success after failures) is told on stderr.
    pub(super) fn record(&self, rec: GateRecord) -> Result<(), AuditError> {
        if self.tally(&rec) {
            return Ok(());
        }
        self.noting(self.audit.write_gate(&rec, false))
    }

    /// Count and log one decision as [`Ctx::record`] does, and queue its record without
    /// waiting for it: for an outcome whose `admit` record is written already (an error is
    /// logged by the writer; the next admit fails closed and says so).
    pub(super) fn record_queued(&self, rec: GateRecord) {
        if !self.tally(&rec) {
            let _ = self.audit.send_gate(&rec, false, false);
        }
    }

    /// Count, log and show `rec`; true when it is folded (see `fold`): then its key's record
    /// stands for it and it is not written on its own.
    fn tally(&self, rec: &GateRecord) -> bool {
        if rec.would.is_some() {
            self.counts.would_deny.fetch_add(1, Ordering::Relaxed);
        }
        let counter = match rec.decision {
            f::ALLOWED if rec.inspected => &self.counts.inspected,
            f::ALLOWED => &self.counts.allowed,
            f::DENIED if rec.reason.as_deref().is_some_and(|r| r.starts_with(super::hold::HELD_REASON)) => &self.counts.held,
            f::DENIED => &self.counts.denied,
            _ if rec.error.as_deref().is_some_and(|e| e.starts_with(INTERNAL)) => &self.counts.unsent,
            _ => &self.counts.failed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            dst.host = rec.dst_host.as_deref().unwrap_or("-"),
            dst.port = rec.dst_port.unwrap_or(0),
            client = rec.client.as_deref().unwrap_or("-"),
            decision = rec.decision,
            "gate decision"
        );
        self.notices.show(rec);
        // A repeated denial is counted above and told in its key's folded record (see
        // `fold`); not while the log is failing: each denial then tries its own write.
        super::fold::folds(rec)
            && !self.audit_failing.load(Ordering::Relaxed)
            && self.folds.offer(rec, std::time::Instant::now()) == super::fold::Offer::Folded
    }

    /// Write a folded record of denials (see `fold`): counted when each happened.
    pub(super) fn write_folded(&self, record: serde_json::Map<String, serde_json::Value>) -> Result<(), AuditError> {
        self.noting(self.audit.write(record))
    }

    /// Write a record that is no decision (an approval step) to the audit log.
    pub(super) fn event(&self, record: serde_json::Map<String, serde_json::Value>) -> Result<(), AuditError> {
        self.noting(self.audit.write(record))
    }

    /// `result` (of one audit write), noting whether the log is failing.
    fn noting(&self, result: Result<(), AuditError>) -> Result<(), AuditError> {
        let failing = result.is_err();
        if self.audit_failing.swap(failing, Ordering::Relaxed) != failing {
            match &result {
                Err(e) => {
                    tracing::error!(error = %e, "audit write failed");
                    self.notices.say(&format!("gatewrap: {e}: the gate refuses every request until it can record it (503)"));
                }
                Ok(()) => self.notices.say(&format!("gatewrap: the audit log {} can be written again; the gate admits requests again", self.audit.path().display())),
            }
        }
        result
    }

    /// Write the [`f::EVENT_ADMIT`] record of an allowed request or tunnel (`rec` as decided,
    /// before the dial), so that nothing leaves unrecorded: this waits (without holding a
    /// runtime thread) until the audit writer has written it. If it cannot be written, the
    /// decision is recorded as failed (counted; its write is tried too) and the 503 that
    /// says the audit log cannot be written is returned: the caller must not dial.
    #[allow(clippy::result_large_err)] // the Err is the answer itself, returned at once
    pub(super) async fn admit(&self, rec: &GateRecord) -> Result<(), Response<respond::Body>> {
        // The decision only: what is known of the outcome goes in the record that follows.
        let written = match self.audit.send_gate(rec, true, true) {
            Some(w) => w.await,
            None => Ok(()),
        };
        match self.noting(written) {
            Ok(()) => Ok(()),
            Err(e) => Err(self.unrecorded(rec.clone(), &e)),
        }
    }

    /// The answer to a request whose record could not be written (`err`): 503 naming the log
    /// and the cause. `rec` is recorded as failed (counted; its write is tried, and fails
    /// quietly if the log still cannot be written).
    pub(super) fn unrecorded(&self, mut rec: GateRecord, err: &AuditError) -> Response<respond::Body> {
        let resp = respond::audit_unwritable(err);
        rec.decision = f::FAILED;
        rec.error = Some(format!("{INTERNAL}{err}"));
        rec.status = Some(resp.status().as_u16());
        let _ = self.record(rec);
        resp
    }

    /// Answer 400 for a request that is not a proxy request, recording it as denied.
    pub(super) fn refuse(&self, rec: GateRecord, reason: &str, msg: &str) -> Response<respond::Body> {
        self.refuse_with(rec, StatusCode::BAD_REQUEST, reason.to_string(), format!("{msg}\n"))
    }

    /// Record a refusal (decision denied, `reason`) and answer `status` with `body`; or, if
    /// its record cannot be written, the 503 of [`Ctx::unrecorded`].
    pub(super) fn refuse_with(&self, mut rec: GateRecord, status: StatusCode, reason: String, body: String) -> Response<respond::Body> {
        rec.decision = f::DENIED;
        rec.reason = Some(reason);
        rec.status = Some(status.as_u16());
        self.answer_recorded(rec, respond::text(status, "denied", body))
    }

    /// `resp` once `rec` (a refusal) is written; if it cannot be, the 503 that says the
    /// audit log cannot be written ([`respond::audit_unwritable`]).
    pub(super) fn answer_recorded(&self, rec: GateRecord, resp: Response<respond::Body>) -> Response<respond::Body> {
        match self.record(rec) {
            Ok(()) => resp,
            Err(e) => respond::audit_unwritable(&e),
        }
    }
}

/// The prefix of the error of a decision the gate's own fault ended (an audit write).
const INTERNAL: &str = "internal: ";

/// The request target for the audit log, without any `user:password@`.
fn target_of(uri: &Uri) -> String {
    match uri.authority() {
        Some(a) if a.as_str().contains('@') => {
            let hostport = a.as_str().rsplit('@').next().unwrap_or_default();
            let scheme = uri.scheme_str().map(|s| format!("{s}://")).unwrap_or_default();
            let pq = uri.path_and_query().map(|p| p.as_str()).unwrap_or_default();
            format!("{scheme}{hostport}{pq}")
        }
        _ => uri.to_string(),
    }
}

/// The record of an allowed request that is still being carried out (dial, upstream
/// response). If the handler is dropped first — the client went away, or the gate
/// stopped — the record is still written with a `downstream:` error: as `failed` before
/// the gate dialled, as `allowed` after (the request may have reached upstream, so the
/// log must not say it failed).
pub struct Pending {
    ctx: Arc<Ctx>,
    rec: Option<GateRecord>,
}

impl Pending {
    pub fn new(ctx: Arc<Ctx>, rec: GateRecord) -> Pending {
        Pending { ctx, rec: Some(rec) }
    }

    pub fn rec(&mut self) -> &mut GateRecord {
        self.rec.get_or_insert_with(GateRecord::default)
    }

    /// Record an upstream failure (decision `failed`, its cause and address) and return
    /// the 502/504 that tells the client; or, for the SSRF guard's refusal, a denial
    /// (decision `denied`, reason `ssrf: <class> address <ip>`) and its 403.
    pub fn fail(mut self, adm: &Admission, err: &DialError) -> Response<respond::Body> {
        if let DialError::Ssrf { ip, class } = err {
            let resp = respond::ssrf_denied(&adm.host, adm.port, *ip, *class, adm.decision.rule.as_deref(), self.ctx.allow_hint);
            self.ctx.notices.say_once(&adm.host.to_string(), &respond::ssrf_hint(&adm.host, adm.port, *ip, *class, self.ctx.allow_hint));
            let rec = self.rec();
            rec.decision = f::DENIED;
            rec.reason = Some(err.to_string());
            rec.would = None;
            rec.dst_ip = Some(ip.to_string());
            rec.status = Some(resp.status().as_u16());
            self.finish();
            return resp;
        }
        let resp = respond::upstream_failure(&adm.host.with_port(adm.port), err);
        let rec = self.rec();
        rec.decision = f::FAILED;
        rec.dst_ip = err.addr().map(|a| a.ip().to_string());
        rec.error = Some(err.to_string());
        rec.status = Some(resp.status().as_u16());
        self.finish();
        resp
    }

    /// Record a failure once the gate has dialled (decision `failed`, `cause` as the error)
    /// and return the `status` (502 or 504) answer that names `target` and the cause.
    pub fn fail_after_dial(mut self, target: &str, cause: String, status: StatusCode) -> Response<respond::Body> {
        let mut resp = respond::bad_gateway(target, &cause);
        *resp.status_mut() = status;
        let rec = self.rec();
        rec.decision = f::FAILED;
        rec.error = Some(cause);
        rec.status = Some(status.as_u16());
        self.finish();
        resp
    }

    /// Record how the exchange with upstream ended without a response: an upstream failure
    /// as [`Pending::fail_after_dial`] (502); a client's broken or malformed body as
    /// `allowed` with that error (its head reached upstream), answered 400.
    pub fn send_failed(mut self, target: &str, failure: super::forward::SendFailure) -> Response<respond::Body> {
        match failure {
            super::forward::SendFailure::Secret(m) => {
                let (reason, body) = super::secrets::misuse_texts(&m, target);
                let resp = respond::text(StatusCode::FORBIDDEN, "denied", body);
                let rec = self.rec();
                rec.decision = f::DENIED;
                rec.reason = Some(reason);
                rec.secret = Some(m.secret);
                rec.error = Some("the head and the body before the secret had gone upstream; the gate aborted the request there".into());
                rec.status = Some(StatusCode::FORBIDDEN.as_u16());
                self.finish();
                resp
            }
            super::forward::SendFailure::Upstream(cause) => self.fail_after_dial(target, cause, StatusCode::BAD_GATEWAY),
            super::forward::SendFailure::Downstream(cause) => {
                let resp = respond::text(StatusCode::BAD_REQUEST, "allowed", format!("gatewrap gate: {cause}\n"));
                let rec = self.rec();
                rec.error = Some(cause);
                rec.status = Some(StatusCode::BAD_REQUEST.as_u16());
                self.finish();
                resp
            }
        }
    }

    /// Queue the record as it stands (the outcome of an admitted request: its `admit`
    /// record is written already, so nobody waits for this one, see [`Ctx::record_queued`]).
    pub fn finish(mut self) {
        if let Some(rec) = self.rec.take() {
            self.ctx.record_queued(rec);
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(mut rec) = self.rec.take() {
            // `dst_ip` is set once the dial succeeded (see connect.rs, forward.rs, inspect/inner.rs).
            if rec.dst_ip.is_some() {
                rec.error = Some("downstream: client disconnected before the response; the request may have reached upstream".into());
            } else {
                rec.decision = f::FAILED;
                rec.error = Some("downstream: client disconnected".into());
            }
            self.ctx.record_queued(rec);
        }
    }
}
