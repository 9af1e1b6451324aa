//! Holding a request an `ask` rule matched (approvals on): a grant of the run lets it
//! through; else it is persisted as an approval (or joins the pending one with the same
//! digest or Idempotency-Key) and the agent waits (`hold = "wait"`) or is answered 409
//! (`hold = "return"`) until a human decides. Approved: the one [`Store::claim`] winner
//! sends the current request with the agent's original credentials (the store has only
//! redacted copies). Rejected, expired, cancelled: 403. The store is the truth; wake-ups
//! only shorten the wait (it is re-read every `[approvals] reread`, 1 s by default). A store that cannot be
//! read or written denies the request (recorded): nothing is sent without it.
//! An uninspected CONNECT is held the same way, the approval being for the tunnel itself
//! ([`hold_tunnel`]). The bodies held at once are bounded over the whole gate (the policy's
//! `[approvals] held_bytes`): past it a request is answered 503, nothing asked nor sent.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use hyper::http::request::Parts;
use hyper::{Response, StatusCode};
use serde_json::{Map, Value};

use crate::approvals::{self, digest, redact, status, wake, Approval, NewApproval, PendingCaps, Store, StoreError};
use crate::audit::{fields as f, GateRecord};
use crate::policy::path::without_query;
use crate::policy::{canonical_path, Action, Hold, Host, Scheme, DEFAULT_ASK_TIMEOUT};

use super::admit::Admission;
use super::guard::Early;
use super::respond::{self, Body};
use super::Ctx;

/// Longest wait the wait endpoint allows (`?wait=S`), in seconds.
pub const MAX_POLL: f64 = 60.0;
/// Most bytes of a plain-http request body the gate holds in memory for an approval.
pub const HOLD_BODY_LIMIT: usize = 16 * 1024 * 1024;

/// Called with each new approval (off the runtime; its failure decides nothing).
pub type OnAsked = Box<dyn Fn(&Approval) + Send + Sync>;

/// A piece of work for the store's thread (see [`Approvals::call`]).
type Job = Box<dyn FnOnce(&mut Store) + Send>;

/// The approvals side of a running gate.
pub struct Approvals {
    store: Arc<Mutex<Store>>,
    /// The store's thread's queue, made on the first call (see [`Approvals::post`]).
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    pub(super) wakes: Arc<tokio::sync::Notify>,
    on_asked: Option<Arc<OnAsked>>,
    /// How the live line says to answer (see [`AnswerHint`]).
    hint: AnswerHint,
    /// Approval events written already by this gate ((id, event)): one record per step
    /// even when several requests share the approval.
    written: Mutex<HashSet<(String, &'static str)>>,
    /// Bytes of request bodies the gate's holds keep in memory now (see [`Reserved`]).
    held_bytes: Arc<AtomicU64>,
    _listener: wake::Listener,
}

impl Approvals {
    /// Open the store at `url`, listen for wake-ups (SQLite: on a task of `rt`, the gate's
    /// runtime), register run `run_id`.
    pub fn start(url: &str, run_id: &str, rt: &tokio::runtime::Handle, on_asked: Option<OnAsked>, hint: AnswerHint) -> Result<Approvals, String> {
        let mut store = Store::open(url).map_err(|e| e.to_string())?;
        let wakes = Arc::new(tokio::sync::Notify::new());
        let w = wakes.clone();
        let listener = wake::Listener::start(url, run_id, wake::RUN_DIR, rt, move |_| w.notify_waiters())?;
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default().trim().to_string();
        store.start_run(run_id, &host, std::process::id() as i64, listener.address.as_deref()).map_err(|e| e.to_string())?;
        Ok(Approvals {
            store: Arc::new(Mutex::new(store)),
            jobs: Mutex::new(None),
            wakes,
            on_asked: on_asked.map(Arc::new),
            hint,
            written: Mutex::new(HashSet::new()),
            held_bytes: Arc::new(AtomicU64::new(0)),
            _listener: listener,
        })
    }

    /// Run `f` on the store, on the store's thread (SQLite's and the PostgreSQL client's
    /// calls block; the PostgreSQL client has its own runtime), and await its answer.
    ///
    /// Errors: `f`'s, or [`StoreError::Invalid`] when the store's thread cannot be started
    /// or `f` panicked (the request is then denied: nothing is sent without the store).
    pub(super) async fn call<T: Send + 'static>(&self, f: impl FnOnce(&mut Store) -> approvals::Result<T> + Send + 'static) -> approvals::Result<T> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.post(Box::new(move |s| {
            let _ = tx.send(f(s));
        }))?;
        rx.await.unwrap_or_else(|_| Err(StoreError::Invalid("store call failed (it panicked)".into())))
    }

    /// Queue `job` for the store's thread: one thread per gate with approvals on, started by
    /// the first job (from a runtime thread, so in the host's network namespace, as the
    /// blocking threads it replaces were), ending when the gate drops its [`Approvals`]. Jobs
    /// run one at a time in the order they were posted (a claim before its `sent`), each
    /// with the store locked (the plain threads of `end_run` lock it too). A job that panics
    /// is dropped; the thread goes on.
    fn post(&self, job: Job) -> approvals::Result<()> {
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        if jobs.is_none() {
            let (tx, rx) = mpsc::channel::<Job>();
            let store = self.store.clone();
            std::thread::Builder::new()
                .name("gate-store".into())
                .spawn(move || {
                    for job in rx {
                        let mut s = store.lock().unwrap_or_else(|p| p.into_inner());
                        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(&mut s)));
                    }
                })
                .map_err(|e| StoreError::Invalid(format!("the store's thread could not be started: {e}")))?;
            *jobs = Some(tx);
        }
        match jobs.as_ref().map(|tx| tx.send(job)) {
            Some(Ok(())) => Ok(()),
            _ => Err(StoreError::Invalid("the store's thread has ended".into())),
        }
    }

    /// End the run in the store (its pending approvals cancelled). From a plain thread.
    pub fn end_run(&self, run_id: &str) {
        let _ = self.store.lock().unwrap_or_else(|p| p.into_inner()).end_run(run_id);
    }

    /// True the first time `(id, event)` is asked about.
    fn first(&self, id: &str, event: &'static str) -> bool {
        self.written.lock().unwrap_or_else(|p| p.into_inner()).insert((id.to_string(), event))
    }
}

/// What to do with a held request.
pub enum Held {
    Answer(Response<Body>),
    /// Send it: these headers and body (the approved, possibly edited, request).
    Go { headers: HeaderMap, body: Bytes, sending: Option<Sending> },
}

/// An approved request on its way: records `sent` (upstream's status) when dropped.
pub struct Sending {
    ctx: Arc<Ctx>,
    approval: Approval,
    pub status: Option<u16>,
    /// The destination's lookup, started alongside the claim (see [`Early`]).
    early: Option<Early>,
    /// Its outcome is recorded already ([`not_sent`]): the drop records nothing.
    done: bool,
}

impl Drop for Sending {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let Some(ap) = self.ctx.approvals.clone() else { return };
        let (id, st) = (self.approval.id.clone(), self.status.map(i64::from));
        let mut rec = event(&self.ctx, f::EVENT_APPROVAL_SENT, &self.approval);
        if let Some(s) = self.status {
            rec.insert(f::STATUS.into(), s.into());
        } else {
            rec.insert(f::ERROR.into(), "upstream: no response".into());
        }
        let _ = self.ctx.event(rec);
        let _ = ap.post(Box::new(move |s| {
            let _ = s.sent(&id, st);
        }));
    }
}

/// An approved request the gate could not send (`err`: the SSRF guard refused its address,
/// or the lookup or the dial failed before a byte left): its approval is recorded
/// cancelled with that reason (`approval_cancelled`), never `sent`.
pub fn not_sent(sending: Option<Sending>, err: &super::dial::DialError) {
    let Some(mut s) = sending else { return };
    let why = format!("not sent: {err}");
    let mut rec = event(&s.ctx, f::EVENT_APPROVAL_CANCELLED, &s.approval);
    rec.insert(f::REASON.into(), why.clone().into());
    let _ = s.ctx.event(rec);
    if let Some(ap) = s.ctx.approvals.clone() {
        let id = s.approval.id.clone();
        let _ = ap.post(Box::new(move |s| {
            let _ = s.unsent(&id, &why);
        }));
    }
    s.done = true;
}

impl Sending {
    /// The lookup started alongside the claim, for the dial (taken once).
    pub fn early(&mut self) -> Option<Early> {
        self.early.take()
    }

    /// The reason of the request record: who approved which approval.
    pub fn reason(&self) -> String {
        format!("ask: approval {} approved by {}", self.approval.id, self.approval.decided_by.as_deref().unwrap_or("?"))
    }
}

/// Whether `adm` is an `ask` this gate holds (approvals on, no budget in the way).
pub fn applies(ctx: &Ctx, adm: &Admission) -> bool {
    ctx.approvals.is_some() && !adm.proceed && adm.decision.action == Action::Ask && adm.over_budget.is_none()
}

/// An approval event record of `a` (run, approval, rule, method, url, digest, version).
fn event(ctx: &Ctx, name: &'static str, a: &Approval) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert(f::RUN.into(), ctx.run_id.clone().into());
    m.insert(f::EVENT.into(), name.into());
    m.insert(f::APPROVAL.into(), a.id.clone().into());
    m.insert(f::RULE.into(), a.rule.clone().into());
    m.insert(f::METHOD.into(), a.method.clone().into());
    m.insert("url".into(), a.url.clone().into());
    m.insert("digest".into(), a.digest.clone().into());
    m.insert("version".into(), a.version.into());
    m
}

/// Deny with `status` and `text`, the record naming the approval and `reason`.
fn deny(ctx: &Ctx, mut rec: GateRecord, status: StatusCode, reason: String, text: String) -> Held {
    rec.decision = f::DENIED;
    rec.reason = Some(reason);
    rec.status = Some(status.as_u16());
    Held::Answer(ctx.answer_recorded(rec, respond::text(status, "denied", text)))
}

fn store_failed(ctx: &Ctx, rec: GateRecord, e: &StoreError) -> Held {
    let text = format!(
        "gatewrap gate: this request needs approval, and the approvals store cannot be used ({e}); it was not sent.\nFix the store (disk, database) and retry.\n"
    );
    deny(ctx, rec, StatusCode::SERVICE_UNAVAILABLE, format!("ask: approvals store unavailable: {e}"), text)
}

/// The headers to send: the agent's own for everything an edit may not touch (credentials
/// above all), the approval's current list for the rest: what the human saw, also when this
/// request (a retry sharing the approval) came with other headers.
fn send_headers(original: &HeaderMap, a: &Approval) -> HeaderMap {
    let mine: Vec<(String, String)> =
        original.iter().map(|(n, v)| (n.as_str().to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned())).collect();
    if !a.edited && redact::redact(&mine) == a.headers {
        return original.clone();
    }
    let mut out = HeaderMap::new();
    for (n, v) in original {
        if !redact::is_editable(n.as_str()) {
            out.append(n.clone(), v.clone());
        }
    }
    for (n, v) in &a.headers {
        if redact::is_editable(n) {
            if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(n.as_bytes()), HeaderValue::from_str(v)) {
                out.append(n, v);
            }
        }
    }
    out.remove(hyper::header::CONTENT_LENGTH);
    out
}

/// Bytes of one held body counted in the gate's total (`Approvals::held_bytes`), given
/// back when dropped: when the hold ends (sent, answered, or the agent left).
struct Reserved {
    total: Arc<AtomicU64>,
    n: u64,
}

impl Reserved {
    /// Count between `least` and `most` more bytes, as many as the total has room for
    /// under `cap`: how many, or `None` (nothing counted) if not even `least` fit.
    fn grow_between(&mut self, least: u64, most: u64, cap: u64) -> Option<u64> {
        let mut got = 0;
        self.total
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                let k = most.min(cap.checked_sub(cur)?);
                got = k;
                (k >= least).then_some(cur + k)
            })
            .ok()?;
        self.n += got;
        Some(got)
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        self.total.fetch_sub(self.n, Ordering::AcqRel);
    }
}

type Collected = (Result<Bytes, (StatusCode, String)>, Reserved);

/// A held body as it is read: its bytes, and the memory they take counted in the gate's
/// total (`held.n` is at least `buf.capacity()`: what is allocated, not only what is used;
/// a buffer left to grow on its own doubles, so a body could take up to twice what was
/// counted, and `held_bytes` would bound half the memory it promises).
struct HeldBody {
    buf: Vec<u8>,
    held: Reserved,
}

impl HeldBody {
    /// Append `data` (the caller checked the body's own `limit`, bytes). The buffer grows
    /// by doubling while the gate's total stays within `cap` bytes, else to the exact size
    /// needed; false (nothing appended) when even that would pass `cap`.
    fn push(&mut self, data: &[u8], limit: usize, cap: u64) -> bool {
        let need = self.buf.len() + data.len();
        if need > self.buf.capacity() {
            let doubled = need.max(self.buf.capacity().saturating_mul(2)).min(limit.max(need)) as u64;
            // Room for `need` at least, for `doubled` if the gate's total has it (taking what
            // is left near the bound: no reallocation per chunk there).
            let counted = self.held.n;
            if doubled > counted && self.held.grow_between((need as u64).saturating_sub(counted), doubled - counted, cap).is_none() {
                return false;
            }
            self.buf.reserve_exact(self.held.n as usize - self.buf.len());
            // The allocator may round up: count what it gave (or give up on it).
            let got = self.buf.capacity() as u64;
            if got > self.held.n && self.held.grow_between(got - self.held.n, got - self.held.n, cap).is_none() {
                return false;
            }
        }
        self.buf.extend_from_slice(data);
        true
    }
}

/// The whole body, at most `limit` bytes (413 beyond, 400 when it breaks off), the memory
/// it takes counted in `held` first ([`HeldBody`]): past `cap` bytes held by the whole
/// gate, 503 (nothing is held nor sent). Boxed: the body's error type is erased here, not
/// in the caller's future.
fn collect<B>(body: B, limit: usize, held: Reserved, cap: u64) -> std::pin::Pin<Box<dyn std::future::Future<Output = Collected> + Send>>
where
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: std::fmt::Display + Send + 'static,
{
    Box::pin(async move {
        let mut body = std::pin::pin!(body);
        let mut out = HeldBody { buf: Vec::new(), held };
        while let Some(frame) = body.frame().await {
            let frame = match frame {
                Ok(f) => f,
                Err(e) => return (Err((StatusCode::BAD_REQUEST, format!("downstream: the request body could not be read: {e}"))), out.held),
            };
            if let Ok(data) = frame.into_data() {
                if out.buf.len() + data.len() > limit {
                    return (Err((StatusCode::PAYLOAD_TOO_LARGE, format!("limit: request body over {limit} bytes (held for approval)"))), out.held);
                }
                if !out.push(&data, limit, cap) {
                    let why = format!(
                        "limit: the gate holds {cap} bytes of request bodies for approvals at most ([approvals] held_bytes), and they are taken; this request was neither held nor sent"
                    );
                    return (Err((StatusCode::SERVICE_UNAVAILABLE, why)), out.held);
                }
            }
        }
        (Ok(Bytes::from(out.buf)), out.held)
    })
}

/// [`hold`] for a request path: on a yes, `parts` gets the approved headers and `rec` is
/// marked allowed (reason: the approval's), and the approved body comes back with the
/// [`Sending`] that records `sent`; otherwise the answer for the agent (403, 409, 503).
#[allow(clippy::too_many_arguments)]
pub async fn hold_request<B>(ctx: &Arc<Ctx>, adm: &Admission, rec: &mut GateRecord, parts: &mut Parts, body: B, scheme: Scheme, pq: &str, limit: usize) -> Result<(Bytes, Option<Sending>), Response<Body>>
where
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: std::fmt::Display + Send + 'static,
{
    let (held, held_rec) = hold(ctx, adm, std::mem::take(rec), &parts.method, &parts.headers, body, Some((scheme, pq)), limit).await;
    *rec = held_rec;
    match held {
        Held::Answer(resp) => Err(resp),
        Held::Go { headers, body, sending } => {
            parts.headers = headers;
            rec.decision = f::ALLOWED;
            if let Some(s) = &sending {
                rec.reason = Some(s.reason());
            }
            Ok((body, sending))
        }
    }
}

/// [`hold`] for an uninspected CONNECT tunnel (`headers` its request's): the approval is
/// for the tunnel itself (method `CONNECT`, URL `host:port`, no body; no grants: a grant
/// names a method and path a tunnel hides). `Ok`: open the tunnel once, `rec` marked
/// allowed, the [`Sending`] to give the tunnel's status; `Err`: the answer (403, 409, 503).
pub async fn hold_tunnel(ctx: &Arc<Ctx>, adm: &Admission, rec: &mut GateRecord, headers: &HeaderMap) -> Result<Option<Sending>, Response<Body>> {
    let empty = http_body_util::Empty::<Bytes>::new();
    let (held, held_rec) = hold(ctx, adm, std::mem::take(rec), &hyper::Method::CONNECT, headers, empty, None, 0).await;
    *rec = held_rec;
    match held {
        Held::Answer(resp) => Err(resp),
        Held::Go { sending, .. } => {
            rec.decision = f::ALLOWED;
            if let Some(s) = &sending {
                rec.reason = Some(s.reason());
            }
            Ok(sending)
        }
    }
}

/// Hold the request (`method`, `headers`, `body`) that `adm` (an `ask`) decided, `rec` its
/// record; `target` its scheme and origin-form target, `None` for a CONNECT tunnel.
#[allow(clippy::too_many_arguments)]
async fn hold<B>(ctx: &Arc<Ctx>, adm: &Admission, mut rec: GateRecord, method: &hyper::Method, headers: &HeaderMap, body: B, target: Option<(Scheme, &str)>, limit: usize) -> (Held, GateRecord)
where
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: std::fmt::Display + Send + 'static,
{
    let ap = ctx.approvals.clone().expect("hold without approvals");
    let rule = adm.decision.rule.clone().unwrap_or_else(|| "default".into());
    let (timeout, mode, grants_ok, cap, caps, reread) = {
        let p = ctx.policy.read().unwrap_or_else(|p| p.into_inner());
        let (t, m, g) = p.rule(&rule).map_or((DEFAULT_ASK_TIMEOUT, Hold::Wait, true), |r| (r.timeout.unwrap_or(DEFAULT_ASK_TIMEOUT), r.hold, r.grants));
        let caps = PendingCaps { run: p.approvals.max_pending, store: p.approvals.max_pending_store };
        (t, m, g, p.approvals.held_bytes, caps, p.approvals.reread)
    };
    let run = ctx.run_id.clone();
    let method = method.to_string();
    let url = match target {
        Some((scheme, pq)) => digest::canonical_url(scheme, &adm.host, adm.port, pq),
        None => adm.host.with_port(adm.port),
    };
    let grants_ok = grants_ok && target.is_some();
    // The name a yes dials (an inspected tunnel dials nothing when it opens): looked up
    // alongside the claim, never before the approval says approved.
    let dials = (target.is_some() || !adm.decision.inspect).then(|| adm.host.clone());
    // Counted until this hold ends (`_held` dropped with this future).
    let (bytes, _held) = match collect(body, limit, Reserved { total: ap.held_bytes.clone(), n: 0 }, cap).await {
        (Ok(b), held) => (b, held),
        (Err((code, why)), _) => {
            let text = format!("gatewrap gate: {why}\n");
            return (deny(ctx, rec.clone(), code, why, text), rec);
        }
    };
    let shown: Vec<(String, String)> =
        headers.iter().map(|(n, v)| (n.as_str().to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned())).collect();
    let idem = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).map(str::to_string);
    let new = NewApproval {
        run_id: run.clone(),
        rule: rule.clone(),
        method: method.clone(),
        url,
        headers: shown,
        body: bytes.to_vec(),
        idem_key: idem,
        timeout: timeout.as_secs_f64(),
        hold: mode.as_str().into(),
        grants_allowed: grants_ok,
        body_limit: approvals::DEFAULT_BODY_LIMIT,
        caps,
    };
    // With hold = "return", a retry joins the approval it already has (the human may have
    // edited it: the edited request is what goes on a yes), before any grant is looked at.
    let joined = if mode == Hold::Return {
        let n = new.clone();
        match ap.call(move |s| s.latest(&n)).await {
            Ok(a) => a.filter(|a| a.status != status::CANCELLED),
            Err(e) => return (store_failed(ctx, rec.clone(), &e), rec),
        }
    } else {
        None
    };
    // A grant of this run covering the request lets it through.
    if let (None, true, Some((scheme, pq))) = (&joined, grants_ok, target) {
        if let Ok(path) = canonical_path(without_query(pq)) {
            let host = digest::authority(scheme, &adm.host, adm.port);
            let (r, m) = (run.clone(), method.clone());
            match ap.call(move |s| s.use_grant(&r, scheme.as_str(), &m, &host, &path)).await {
                Ok(Some(g)) => {
                    rec.decision = f::ALLOWED;
                    rec.reason = Some(format!("grant: {}", g.id));
                    rec.grant = Some(g.id);
                    return (Held::Go { headers: headers.clone(), body: bytes, sending: None }, rec);
                }
                Ok(None) => {}
                Err(e) => return (store_failed(ctx, rec.clone(), &e), rec),
            }
        }
    }
    // Not joined yet: asked, unless an identical retry made its approval meanwhile (looked
    // up again in the same store trip as the ask).
    let asked = match joined {
        Some(a) => Ok((a, false)),
        None => ap
            .call(move |s| {
                if mode == Hold::Return {
                    if let Some(a) = s.latest(&new)? {
                        if a.status != status::CANCELLED {
                            return Ok((a, false));
                        }
                    }
                }
                s.ask(&new)
            })
            .await,
    };
    let (a, fresh) = match asked {
        Ok(ok) => ok,
        Err(StoreError::Full { scope, msg, .. }) => {
            // Past a cap: refused at once, never held (nothing asked, nothing sent, no webhook).
            let code = if scope == "run" { StatusCode::TOO_MANY_REQUESTS } else { StatusCode::SERVICE_UNAVAILABLE };
            let text = format!("gatewrap gate: this request needs approval, and {msg}; it was neither held nor sent.\n");
            return (deny(ctx, rec.clone(), code, format!("limit: {msg}"), text), rec);
        }
        Err(e) => return (store_failed(ctx, rec.clone(), &e), rec),
    };
    rec.approval = Some(a.id.clone());
    if fresh {
        let mut m = event(ctx, f::EVENT_APPROVAL_ASKED, &a);
        m.insert("deadline".into(), approvals::rfc3339(a.deadline).into());
        m.insert("hold".into(), a.hold.clone().into());
        if let Err(e) = ctx.event(m) {
            let id = a.id.clone();
            let _ = ap.call(move |s| s.cancel(&id, "the audit log cannot be written")).await;
            return (Held::Answer(respond::audit_unwritable(&e)), rec);
        }
        ap.first(&a.id, f::EVENT_APPROVAL_ASKED);
        ctx.notices.say(&notice_line(&a, &ap.hint));
        if let Some(cb) = ap.on_asked.clone() {
            let copy = a.clone();
            tokio::task::spawn_blocking(move || cb(&copy));
        }
    }
    let (a, claimed, early) = if mode == Hold::Return { (a, None, None) } else { wait(ctx, &ap, a, dials.as_ref(), reread).await };
    (outcome(ctx, &ap, a, (claimed, early), dials.as_ref(), rec.clone(), headers, bytes).await, rec)
}

/// Characters of the request's digest a notice line shows: 48 bits, enough that a line
/// forged for the same approval id cannot name another request's digest by chance.
pub const NOTICE_DIGEST_CHARS: usize = 12;

/// What the live line puts around the commands a human answers with, so that a pasted
/// command reaches this run's store: `{prefix} approve ID{suffix} | reject ID --reason
/// TEXT{suffix} | show ID{suffix}`. gatewrap's Python side says what they are (``sudo`` only
/// for a human who is not root, ``--state URL`` only for a store the command would not
/// find by itself).
#[derive(Clone, Debug)]
pub struct AnswerHint {
    /// e.g. `sudo gatewrap approvals`.
    pub prefix: String,
    /// e.g. ` --state sqlite:/srv/gw/state.db`, or empty.
    pub suffix: String,
}

impl Default for AnswerHint {
    fn default() -> Self {
        AnswerHint { prefix: "sudo gatewrap approvals".into(), suffix: String::new() }
    }
}

/// The live line of a new approval on the run's stderr: its id and the first
/// [`NOTICE_DIGEST_CHARS`] of its digest (which `gatewrap approvals approve` shows in full
/// before it asks y/N: the agent shares that stderr and may print a forged line), the
/// request, the rule, the deadline, the commands (as `hint` says). Control characters
/// escaped by `say`. The same text as `notify.stderr_line` (gatewrap's Python side).
pub fn notice_line(a: &Approval, hint: &AnswerHint) -> String {
    format!(
        "gatewrap: approval {id} (digest {dg}): {} {} (rule {}) waits until {}; answer with: {p} approve {id}{s} | reject {id} --reason TEXT{s} | show {id}{s}",
        a.method,
        a.url,
        a.rule,
        approvals::rfc3339(a.deadline),
        id = a.id,
        dg = &a.digest[..a.digest.len().min(NOTICE_DIGEST_CHARS)],
        p = hint.prefix,
        s = hint.suffix,
    )
}

/// Wait until `a` is no longer pending (re-read on a wake-up or every `reread`), expiring
/// it at its deadline. If the agent leaves (this future is dropped), the approval is
/// cancelled when no other request shares it. An approval found approved is claimed in the
/// same trip to the store (one blocking-thread hop less between the human's yes and the
/// send): `Some(won)` is that [`Store::claim`]'s answer. Found approved, the lookup of
/// `dials` (the destination a yes dials) starts between the read and the claim, on its own
/// task ([`Early`]): the claim's write and the lookup overlap.
async fn wait(ctx: &Arc<Ctx>, ap: &Arc<Approvals>, mut a: Approval, dials: Option<&Host>, reread: Duration) -> (Approval, Option<approvals::Result<bool>>, Option<Early>) {
    let mut leaving = Leaving { ap: ap.clone(), ctx: ctx.clone(), id: Some(a.id.clone()) };
    let (mut claimed, mut early) = (None, None);
    let rt = tokio::runtime::Handle::current();
    loop {
        let woken = ap.wakes.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let id = a.id.clone();
        let (c, rt, host) = (ctx.clone(), rt.clone(), dials.cloned());
        let read = ap
            .call(move |s| {
                let now = s.get(&id)?;
                let (claim, early) = match &now {
                    Some(n) if n.status == status::APPROVED => {
                        let _in = rt.enter();
                        let early = host.and_then(|h| Early::start(&c, &h));
                        (Some(s.claim(&id)), early)
                    }
                    _ => (None, None),
                };
                Ok((now, claim, early))
            })
            .await;
        if let Ok((Some(now), claim, e)) = read {
            a = now;
            claimed = claim;
            early = e;
        }
        if a.status != status::PENDING {
            break;
        }
        let left = a.deadline - approvals::now();
        if left <= 0.0 {
            let id = a.id.clone();
            if ap.call(move |s| s.expire(&id)).await.is_err() {
                // The store cannot record the expiry (full disk, lost server): the deadline
                // has passed all the same, and a timeout is never a yes. Deny now rather than
                // ask the failing store again in a loop; the approval left pending there has
                // no request behind it any more, so a later yes sends nothing.
                a.status = status::EXPIRED.to_string();
                break;
            }
            continue;
        }
        let _ = tokio::time::timeout(reread.min(Duration::from_secs_f64(left)), woken).await;
    }
    leaving.id = None;
    (a, claimed, early)
}

/// Cancels a held approval whose last waiting request went away.
struct Leaving {
    ap: Arc<Approvals>,
    ctx: Arc<Ctx>,
    id: Option<String>,
}

impl Drop for Leaving {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else { return };
        let ctx = self.ctx.clone();
        let _ = self.ap.post(Box::new(move |s| {
            if let Ok(0) = s.leave(&id) {
                if let Ok(true) = s.cancel(&id, "the agent disconnected while it was held") {
                    if let Ok(Some(a)) = s.get(&id) {
                        let mut m = event(&ctx, f::EVENT_APPROVAL_CANCELLED, &a);
                        m.insert(f::REASON.into(), "the agent disconnected while it was held".into());
                        let _ = ctx.event(m);
                    }
                }
            }
        }));
    }
}

/// How the reason of a request answered 409 while its approval waits begins (`hold =
/// "return"`): counted as `held`, not `denied` (`Ctx::record`).
pub(super) const HELD_REASON: &str = "ask: held for approval ";

/// Carry out the decision of `a` for this request; `claimed`: the [`Store::claim`] made
/// already when `a` was read (else it is made here, the lookup of `dials` started beside
/// it) and the lookup started with it. A lost claim drops the lookup: nothing is dialled.
#[allow(clippy::too_many_arguments)]
async fn outcome(
    ctx: &Arc<Ctx>,
    ap: &Arc<Approvals>,
    a: Approval,
    claimed: (Option<approvals::Result<bool>>, Option<Early>),
    dials: Option<&Host>,
    rec: GateRecord,
    headers: &HeaderMap,
    body: Bytes,
) -> Held {
    let (claimed, early) = claimed;
    let id = a.id.clone();
    match a.status.as_str() {
        status::PENDING => {
            let mut resp = respond::text(
                StatusCode::CONFLICT,
                "held",
                format!(
                    "gatewrap gate: this request waits for approval {id} (rule {}, until {}).\nRetry the same request \
                     (same body, or the same Idempotency-Key) after a human approved it; to wait without polling upstream:\n  \
                     curl --proxy '' http://{gate}/.well-known/gatewrap/approvals/{id}?wait=60\n",
                    a.rule,
                    approvals::rfc3339(a.deadline),
                    gate = ctx.listen_addrs.iter().find(|l| l.is_ipv4()).or(ctx.listen_addrs.first())
                        .map_or_else(|| "127.0.0.1:3128".to_string(), |l| l.to_string()),
                ),
            );
            resp.headers_mut().insert(RETRY_AFTER, HeaderValue::from_static("5"));
            if let Ok(v) = HeaderValue::from_str(&id) {
                resp.headers_mut().insert("gatewrap-approval", v);
            }
            let mut rec = rec;
            rec.decision = f::DENIED;
            rec.reason = Some(format!("{HELD_REASON}{id} (hold = return)"));
            rec.status = Some(409);
            Held::Answer(ctx.answer_recorded(rec, resp))
        }
        status::APPROVED => {
            let cid = id.clone();
            let (won, early) = match claimed {
                Some(won) => (won, early),
                None => {
                    let early = dials.and_then(|h| Early::start(ctx, h));
                    (ap.call(move |s| s.claim(&cid)).await, early)
                }
            };
            match won {
                Ok(true) => {
                    if a.edited && ap.first(&id, f::EVENT_APPROVAL_EDITED) {
                        let mut m = event(ctx, f::EVENT_APPROVAL_EDITED, &a);
                        m.insert("by".into(), a.decided_by.clone().unwrap_or_default().into());
                        let _ = ctx.event(m);
                    }
                    let mut m = event(ctx, f::EVENT_APPROVAL_APPROVED, &a);
                    m.insert("by".into(), a.decided_by.clone().unwrap_or_default().into());
                    if let Some(g) = &a.grant_id {
                        m.insert(f::GRANT.into(), g.clone().into());
                    }
                    if let Err(e) = ctx.event(m) {
                        return Held::Answer(respond::audit_unwritable(&e));
                    }
                    // An edited body is whole in the store (an edit of a truncated one is refused).
                    let send_body = if a.edited { Bytes::from(a.body.clone()) } else { body };
                    Held::Go {
                        headers: send_headers(headers, &a),
                        body: send_body,
                        sending: Some(Sending { ctx: ctx.clone(), approval: a, status: None, early, done: false }),
                    }
                }
                Ok(false) => sent_once(ctx, rec, &id),
                Err(e) => store_failed(ctx, rec, &e),
            }
        }
        status::SENDING | status::SENT => sent_once(ctx, rec, &id),
        status::REJECTED => {
            let by = a.decided_by.clone().unwrap_or_default();
            let why = a.reason.clone().unwrap_or_else(|| "no reason given".into());
            if ap.first(&id, f::EVENT_APPROVAL_REJECTED) {
                let mut m = event(ctx, f::EVENT_APPROVAL_REJECTED, &a);
                m.insert("by".into(), by.clone().into());
                m.insert(f::REASON.into(), why.clone().into());
                let _ = ctx.event(m);
            }
            deny(
                ctx,
                rec,
                StatusCode::FORBIDDEN,
                format!("ask: approval {id} rejected by {by}: {why}"),
                format!("gatewrap gate: approval {id} was rejected by {by}: {why}\n"),
            )
        }
        status::EXPIRED => {
            if ap.first(&id, f::EVENT_APPROVAL_EXPIRED) {
                let mut m = event(ctx, f::EVENT_APPROVAL_EXPIRED, &a);
                m.insert(f::REASON.into(), "timeout".into());
                let _ = ctx.event(m);
            }
            deny(
                ctx,
                rec,
                StatusCode::FORBIDDEN,
                format!("ask: approval {id} expired (a timeout is never a yes)"),
                format!("gatewrap gate: approval {id} expired at {} (a timeout is never a yes); nothing was sent\n", approvals::rfc3339(a.deadline)),
            )
        }
        _ => {
            let why = a.reason.clone().unwrap_or_else(|| "cancelled".into());
            deny(ctx, rec, StatusCode::FORBIDDEN, format!("ask: approval {id} cancelled ({why})"), format!("gatewrap gate: approval {id} was cancelled ({why}); nothing was sent\n"))
        }
    }
}

fn sent_once(ctx: &Ctx, rec: GateRecord, id: &str) -> Held {
    deny(
        ctx,
        rec,
        StatusCode::CONFLICT,
        format!("ask: approval {id} already sent once (at most once)"),
        format!("gatewrap gate: approval {id} was already sent once (at most once); ask again with a new request\n"),
    )
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    use super::{HeldBody, Reserved};

    fn body(total: &Arc<AtomicU64>) -> HeldBody {
        HeldBody { buf: Vec::new(), held: Reserved { total: total.clone(), n: 0 } }
    }

    /// The gate's count covers the memory a held body takes (its buffer's capacity), not
    /// only its length, whatever the chunks; a body that fits the bound exactly is still
    /// taken (grown to the exact size), and dropping it gives everything back.
    #[test]
    fn held_bytes_count_the_memory_a_body_takes() {
        let total = Arc::new(AtomicU64::new(0));
        for (chunk, n, cap) in [(1000usize, 3usize, 3500u64), (1, 5000, 6000), (4096, 40, 1 << 20), (700, 10, 7000), (3, 1, 3)] {
            let mut b = body(&total);
            for _ in 0..n {
                assert!(b.push(&vec![7u8; chunk], usize::MAX, cap), "{chunk}x{n} within {cap}");
                assert!(b.held.n >= b.buf.capacity() as u64, "counted {} < allocated {}", b.held.n, b.buf.capacity());
                assert!(total.load(Ordering::Acquire) <= cap);
            }
            assert_eq!(b.buf.len(), chunk * n);
            drop(b);
            assert_eq!(total.load(Ordering::Acquire), 0, "given back");
        }
    }

    /// Past the bound nothing is appended, and what the gate's other holds keep counts too.
    #[test]
    fn a_body_past_the_bound_is_refused() {
        let total = Arc::new(AtomicU64::new(0));
        let mut first = body(&total);
        assert!(first.push(&[1u8; 600], usize::MAX, 1000));
        let mut second = body(&total);
        assert!(!second.push(&[2u8; 600], usize::MAX, 1000));
        assert!(second.buf.is_empty());
        assert!(total.load(Ordering::Acquire) <= 1000);
        drop(first);
        assert!(second.push(&[2u8; 600], usize::MAX, 1000), "room again once the first hold ended");
        assert!(total.load(Ordering::Acquire) >= second.buf.capacity() as u64);
    }
}
