//! The approvals store: one set of statements over two backends (SQLite, PostgreSQL).
//!
//! Statements are written once with `?N` placeholders (SQLite's numbered form; the
//! PostgreSQL backend turns them into `$N`) over columns of five types ([`Val`]). Each status
//! move is one `UPDATE .. WHERE status = .. AND version = ..` (optimistic locking): when it
//! changes no row, the approval is re-read and the reason given as [`Stale`].

mod postgres;
pub use postgres::CHANNEL as PG_CHANNEL;
mod sqlite;
mod sql;

use subtle::ConstantTimeEq;

use super::redact::{check_edit, redact};
use super::{digest, new_id, new_token, now, status, Approval, Counts, Grant, GrantSpec, PendingCaps, Pruned, Result, Run, Stale, StoreError, Verdict, MAX_REASON};

/// One value of a column or a parameter.
#[derive(Debug, Clone, PartialEq)]
pub enum Val {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

impl From<&str> for Val {
    fn from(s: &str) -> Val {
        Val::Text(s.to_string())
    }
}
impl From<String> for Val {
    fn from(s: String) -> Val {
        Val::Text(s)
    }
}
impl From<&String> for Val {
    fn from(s: &String) -> Val {
        Val::Text(s.clone())
    }
}
impl From<i64> for Val {
    fn from(v: i64) -> Val {
        Val::Int(v)
    }
}
impl From<f64> for Val {
    fn from(v: f64) -> Val {
        Val::Real(v)
    }
}
impl From<bool> for Val {
    fn from(v: bool) -> Val {
        Val::Int(v as i64)
    }
}
impl From<Vec<u8>> for Val {
    fn from(v: Vec<u8>) -> Val {
        Val::Blob(v)
    }
}
impl<T: Into<Val>> From<Option<T>> for Val {
    fn from(v: Option<T>) -> Val {
        v.map_or(Val::Null, Into::into)
    }
}

impl Val {
    fn text(&self) -> Option<String> {
        match self {
            Val::Text(s) => Some(s.clone()),
            _ => None,
        }
    }
    fn int(&self) -> Option<i64> {
        match self {
            Val::Int(v) => Some(*v),
            Val::Real(v) => Some(*v as i64),
            _ => None,
        }
    }
    fn real(&self) -> Option<f64> {
        match self {
            Val::Real(v) => Some(*v),
            Val::Int(v) => Some(*v as f64),
            _ => None,
        }
    }
    fn blob(&self) -> Option<Vec<u8>> {
        match self {
            Val::Blob(b) => Some(b.clone()),
            Val::Text(s) => Some(s.as_bytes().to_vec()),
            _ => None,
        }
    }
}

/// What a backend does: run statements, transactions, and send a wake-up.
trait Db: Send {
    /// Rows changed.
    fn exec(&mut self, sql: &str, params: &[Val]) -> std::result::Result<u64, String>;
    fn query(&mut self, sql: &str, params: &[Val]) -> std::result::Result<Vec<Vec<Val>>, String>;
    /// Start a write transaction (SQLite: `BEGIN IMMEDIATE`).
    fn begin(&mut self) -> std::result::Result<(), String>;
    /// In a transaction: wait until no other one that took this lock is open (so two gates
    /// counting pending approvals and inserting one cannot both pass a cap). SQLite: nothing
    /// (`BEGIN IMMEDIATE` already admits one writer); PostgreSQL: an advisory lock.
    fn lock_asks(&mut self) -> std::result::Result<(), String>;
    /// Tell the waiters of `run_wake` (the run's `wake` column) that approval `id` changed,
    /// after the commit. Best effort: a lost wake-up only delays (waiters re-read the store every `[approvals] reread`).
    fn wake(&mut self, run_wake: Option<&str>, id: &str);
}

/// What the gate knows of a request it holds.
#[derive(Debug, Clone)]
pub struct NewApproval {
    pub run_id: String,
    pub rule: String,
    pub method: String,
    pub url: String,
    /// As the agent sent them; redacted here before they are stored.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub idem_key: Option<String>,
    /// Seconds from now.
    pub timeout: f64,
    pub hold: String,
    pub grants_allowed: bool,
    pub body_limit: usize,
    /// Caps of pending approvals this request may not pass (a new approval only).
    pub caps: PendingCaps,
}

/// An open store (one connection).
pub struct Store {
    db: Box<dyn Db>,
    url: String,
    body_limit: usize,
}

const APPROVAL_COLS: &str = "id, run_id, created, deadline, rule, method, url, headers, body, body_len, body_digest, digest, \
     idem_key, version, status, hold, grants_allowed, token, decided_by, decided_at, reason, edited, orig_headers, \
     orig_body, grant_id, sent_at, upstream_status, waiters";
const GRANT_COLS: &str =
    "id, run_id, approval_id, method, host, path_prefix, created, expires, revoked, revoked_by, uses, created_by";
const RUN_COLS: &str = "run_id, started, ended, host, pid, wake";

fn headers_json(h: &[(String, String)]) -> String {
    serde_json::to_string(&h.iter().map(|(n, v)| [n, v]).collect::<Vec<_>>()).unwrap_or_else(|_| "[]".into())
}

fn headers_from(v: &Val) -> Option<Vec<(String, String)>> {
    let text = v.text()?;
    let list: Vec<(String, String)> = serde_json::from_str(&text).ok()?;
    Some(list)
}

fn approval_from(r: &[Val]) -> Approval {
    let s = |i: usize| r[i].text().unwrap_or_default();
    Approval {
        id: s(0),
        run_id: s(1),
        created: r[2].real().unwrap_or(0.0),
        deadline: r[3].real().unwrap_or(0.0),
        rule: s(4),
        method: s(5),
        url: s(6),
        headers: headers_from(&r[7]).unwrap_or_default(),
        body: r[8].blob().unwrap_or_default(),
        body_len: r[9].int().unwrap_or(0),
        body_digest: s(10),
        digest: s(11),
        idem_key: r[12].text(),
        version: r[13].int().unwrap_or(0),
        status: s(14),
        hold: s(15),
        grants_allowed: r[16].int().unwrap_or(0) != 0,
        token: s(17),
        decided_by: r[18].text(),
        decided_at: r[19].real(),
        reason: r[20].text(),
        edited: r[21].int().unwrap_or(0) != 0,
        orig_headers: headers_from(&r[22]),
        orig_body: r[23].blob(),
        grant_id: r[24].text(),
        sent_at: r[25].real(),
        upstream_status: r[26].int(),
        waiters: r[27].int().unwrap_or(0),
    }
}

fn grant_from(r: &[Val]) -> Grant {
    let s = |i: usize| r[i].text().unwrap_or_default();
    Grant {
        id: s(0),
        run_id: s(1),
        approval_id: s(2),
        method: s(3),
        host: s(4),
        path_prefix: s(5),
        created: r[6].real().unwrap_or(0.0),
        expires: r[7].real().unwrap_or(0.0),
        revoked: r[8].real(),
        revoked_by: r[9].text(),
        uses: r[10].int().unwrap_or(0),
        created_by: s(11),
    }
}

fn run_from(r: &[Val]) -> Run {
    Run {
        run_id: r[0].text().unwrap_or_default(),
        started: r[1].real().unwrap_or(0.0),
        ended: r[2].real(),
        host: r[3].text().unwrap_or_default(),
        pid: r[4].int().unwrap_or(0),
        wake: r[5].text(),
    }
}

/// Whether approval `a` answers a request of digest `dg` (method, URL, whole body) as the
/// agent first sent it, before any edit: an approval answers only the request the human was
/// shown, so a retry under the same Idempotency-Key with another body is another request,
/// never sent under this approval's decision. (Other headers may differ, as a client's
/// retry counter does: the gate then sends the headers the human saw, `hold.rs`.)
fn is_request(a: &Approval, dg: &str) -> bool {
    let first = match (&a.orig_body, a.edited) {
        (Some(body), true) => digest::request_digest(&a.method, &a.url, &digest::sha256_hex(body)),
        _ => a.digest.clone(),
    };
    first == dg
}

/// `url` with any password replaced by `***` (for messages and [`Store::url`]).
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        _ => url.to_string(),
    }
}

/// Whether `url` starts with a URL scheme (RFC 3986 §3.1: a letter, then letters, digits,
/// `+`, `-`, `.`, then `:`): `sqlit:/x` is a mistyped scheme, not a relative path.
fn has_scheme(url: &str) -> bool {
    let Some((scheme, _)) = url.split_once(':') else { return false };
    let mut chars = scheme.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic()) && chars.all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
}

impl Store {
    /// Open (creating the schema if needed) the store at `url`: a path or `sqlite:PATH`
    /// (WAL, busy timeout 5 s; the file 0600, a new parent directory 0700, both checked to be
    /// root's alone: `sqlite.rs`), or `postgresql://user@host:port/db?..` (also
    /// `postgres://`). A SQLite file is made if missing; see [`Store::open_existing`].
    /// Errors: [`StoreError::Io`] (the file or directory), [`StoreError::Unsafe`] (not root's
    /// alone), [`StoreError::Db`] (the database refused, or its schema is newer than this
    /// gatewrap), [`StoreError::Invalid`] (the URL).
    pub fn open(url: &str) -> Result<Store> {
        Store::open_with(url, true)
    }

    /// As [`Store::open`], but a SQLite store that does not exist is not made (nor its
    /// folder): [`StoreError::Missing`]. For commands that read or decide: a mistyped path
    /// must not leave an empty store behind.
    pub fn open_existing(url: &str) -> Result<Store> {
        Store::open_with(url, false)
    }

    fn open_with(url: &str, create: bool) -> Result<Store> {
        let shown = redact_url(url);
        let db: Box<dyn Db> = if url.starts_with("postgresql://") || url.starts_with("postgres://") {
            Box::new(postgres::Pg::open(url).map_err(|msg| StoreError::Db { url: shown.clone(), msg })?)
        } else {
            let path = url.strip_prefix("sqlite:").unwrap_or(url);
            if path.is_empty() || has_scheme(url) && !url.starts_with("sqlite:") || path.contains("://") {
                return Err(StoreError::Invalid(format!(
                    "state URL {shown:?}: expected a path, sqlite:PATH or postgresql://USER@HOST:PORT/DB"
                )));
            }
            Box::new(sqlite::Lite::open(std::path::Path::new(path), create).map_err(|e| match e {
                sqlite::OpenError::Io(source) => StoreError::Io { url: shown.clone(), source },
                sqlite::OpenError::Db(msg) => StoreError::Db { url: shown.clone(), msg },
                sqlite::OpenError::Unsafe(msg) => StoreError::Unsafe { url: shown.clone(), msg },
                sqlite::OpenError::Missing(msg) => StoreError::Missing { url: shown.clone(), msg },
            })?)
        };
        Ok(Store { db, url: shown, body_limit: super::DEFAULT_BODY_LIMIT })
    }

    /// The URL, password redacted.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn db_err(&self, msg: String) -> StoreError {
        StoreError::Db { url: self.url.clone(), msg }
    }

    fn exec(&mut self, sql: &str, params: &[Val]) -> Result<u64> {
        self.db.exec(sql, params).map_err(|m| StoreError::Db { url: self.url.clone(), msg: m })
    }

    fn query(&mut self, sql: &str, params: &[Val]) -> Result<Vec<Vec<Val>>> {
        self.db.query(sql, params).map_err(|m| StoreError::Db { url: self.url.clone(), msg: m })
    }

    /// Run `f` in a write transaction: committed if it returns Ok, rolled back otherwise.
    fn tx<T>(&mut self, f: impl FnOnce(&mut Store) -> Result<T>) -> Result<T> {
        self.db.begin().map_err(|m| self.db_err(m))?;
        match f(self) {
            Ok(v) => {
                self.exec("COMMIT", &[])?;
                Ok(v)
            }
            Err(e) => {
                let _ = self.db.exec("ROLLBACK", &[]);
                Err(e)
            }
        }
    }

    // ---- runs -------------------------------------------------------------------------

    /// Register a run (its fence) with its wake-up address. Errors if the id exists.
    pub fn start_run(&mut self, run_id: &str, host: &str, pid: i64, wake: Option<&str>) -> Result<()> {
        let sql = format!("INSERT INTO runs ({RUN_COLS}) VALUES (?1, ?2, NULL, ?3, ?4, ?5)");
        self.exec(&sql, &[run_id.into(), now().into(), host.into(), pid.into(), wake.into()])?;
        Ok(())
    }

    /// Mark a run ended: its pending (and approved but unclaimed) approvals become
    /// `cancelled`, its grants stop applying (they are of an ended run). Idempotent.
    pub fn end_run(&mut self, run_id: &str) -> Result<()> {
        let t = now();
        let ids = self.tx(|s| {
            s.exec("UPDATE runs SET ended = ?2 WHERE run_id = ?1 AND ended IS NULL", &[run_id.into(), t.into()])?;
            let rows = s.query(
                "SELECT id FROM approvals WHERE run_id = ?1 AND status IN ('pending', 'approved')",
                &[run_id.into()],
            )?;
            s.exec(
                "UPDATE approvals SET status = 'cancelled', version = version + 1, reason = COALESCE(reason, 'run ended') \
                 WHERE run_id = ?1 AND status IN ('pending', 'approved')",
                &[run_id.into()],
            )?;
            Ok(rows.into_iter().filter_map(|r| r[0].text()).collect::<Vec<_>>())
        })?;
        let wake = self.run(run_id)?.and_then(|r| r.wake);
        for id in ids {
            self.db.wake(wake.as_deref(), &id);
        }
        Ok(())
    }

    pub fn run(&mut self, run_id: &str) -> Result<Option<Run>> {
        let sql = format!("SELECT {RUN_COLS} FROM runs WHERE run_id = ?1");
        Ok(self.query(&sql, &[run_id.into()])?.first().map(|r| run_from(r)))
    }

    /// Runs, newest first; `active` Some(true) = not ended, Some(false) = ended.
    pub fn runs(&mut self, active: Option<bool>) -> Result<Vec<Run>> {
        let filter = match active {
            None => "",
            Some(true) => "WHERE ended IS NULL",
            Some(false) => "WHERE ended IS NOT NULL",
        };
        let sql = format!("SELECT {RUN_COLS} FROM runs {filter} ORDER BY started DESC");
        Ok(self.query(&sql, &[])?.iter().map(|r| run_from(r)).collect())
    }

    // ---- approvals --------------------------------------------------------------------

    /// The approval `id`, if any.
    pub fn get(&mut self, id: &str) -> Result<Option<Approval>> {
        let sql = format!("SELECT {APPROVAL_COLS} FROM approvals WHERE id = ?1");
        Ok(self.query(&sql, &[id.into()])?.first().map(|r| approval_from(r)))
    }

    /// The approval whose review token is `token`. The row is found by the token's first
    /// 8 characters; the whole token is compared in constant time (subtle), so the time
    /// taken tells nothing of the secret's other 200 bits.
    pub fn get_by_token(&mut self, token: &str) -> Result<Option<Approval>> {
        if token.len() < 16 || !token.is_ascii() {
            return Ok(None);
        }
        let sql = format!("SELECT {APPROVAL_COLS} FROM approvals WHERE substr(token, 1, 8) = ?1");
        let rows = self.query(&sql, &[token[..8].into()])?;
        Ok(rows
            .iter()
            .map(|r| approval_from(r))
            .find(|a| a.token.len() == token.len() && bool::from(a.token.as_bytes().ct_eq(token.as_bytes()))))
    }

    /// Approvals, newest first, filtered by `status` and `run_id`, at most `limit`.
    pub fn list(&mut self, status: Option<&str>, run_id: Option<&str>, limit: i64) -> Result<Vec<Approval>> {
        let sql = format!(
            "SELECT {APPROVAL_COLS} FROM approvals WHERE (?1 = '' OR status = ?1) AND (?2 = '' OR run_id = ?2) \
             ORDER BY created DESC LIMIT ?3"
        );
        let rows = self.query(&sql, &[status.unwrap_or("").into(), run_id.unwrap_or("").into(), limit.max(0).into()])?;
        Ok(rows.iter().map(|r| approval_from(r)).collect())
    }

    /// Persist a new pending approval of a held request, or join the pending one of the
    /// same run with the same digest or Idempotency-Key (dedup: `waiters` + 1). Returns the
    /// approval and whether it is new. Its headers are stored redacted, its body up to the
    /// limit. The caller (one gate per run) serialises calls for a run.
    pub fn ask(&mut self, req: &NewApproval) -> Result<(Approval, bool)> {
        let body_digest = digest::sha256_hex(&req.body);
        let dg = digest::request_digest(&req.method, &req.url, &body_digest);
        let t = now();
        let joined = self.tx(|s| {
            let sql = format!(
                "SELECT {APPROVAL_COLS} FROM approvals WHERE run_id = ?1 AND status = 'pending' AND deadline > ?2 \
                 AND (digest = ?3 OR (idem_key IS NOT NULL AND idem_key = ?4)) ORDER BY created"
            );
            let found = s.query(&sql, &[(&req.run_id).into(), t.into(), (&dg).into(), req.idem_key.clone().into()])?;
            let Some(a) = found.iter().map(|r| approval_from(r)).find(|a| is_request(a, &dg)) else { return Ok(None) };
            s.exec("UPDATE approvals SET waiters = waiters + 1 WHERE id = ?1", &[(&a.id).into()])?;
            Ok(Some(Approval { waiters: a.waiters + 1, ..a }))
        })?;
        if let Some(a) = joined {
            return Ok((a, false));
        }
        let keep = req.body.len().min(req.body_limit);
        let a = Approval {
            id: new_id("ap-"),
            run_id: req.run_id.clone(),
            created: t,
            deadline: t + req.timeout,
            rule: req.rule.clone(),
            method: req.method.clone(),
            url: req.url.clone(),
            headers: redact(&req.headers),
            body: req.body[..keep].to_vec(),
            body_len: req.body.len() as i64,
            body_digest,
            digest: dg,
            idem_key: req.idem_key.clone(),
            version: 1,
            status: status::PENDING.into(),
            hold: req.hold.clone(),
            grants_allowed: req.grants_allowed,
            token: new_token(),
            decided_by: None,
            decided_at: None,
            reason: None,
            edited: false,
            orig_headers: None,
            orig_body: None,
            grant_id: None,
            sent_at: None,
            upstream_status: None,
            waiters: 1,
        };
        let sql = format!(
            "INSERT INTO approvals ({APPROVAL_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, \
             ?15, ?16, ?17, ?18, NULL, NULL, NULL, 0, NULL, NULL, NULL, NULL, NULL, ?19)"
        );
        let params: Vec<Val> = vec![
            (&a.id).into(),
            (&a.run_id).into(),
            a.created.into(),
            a.deadline.into(),
            (&a.rule).into(),
            (&a.method).into(),
            (&a.url).into(),
            headers_json(&a.headers).into(),
            a.body.clone().into(),
            a.body_len.into(),
            (&a.body_digest).into(),
            (&a.digest).into(),
            a.idem_key.clone().into(),
            a.version.into(),
            (&a.status).into(),
            (&a.hold).into(),
            a.grants_allowed.into(),
            (&a.token).into(),
            a.waiters.into(),
        ];
        self.tx(|s| {
            s.check_caps(&req.run_id, req.caps, t)?;
            s.exec(&sql, &params)
        })?;
        Ok((a, true))
    }

    /// In [`Store::ask`]'s transaction: [`StoreError::Full`] if run `run_id` or the whole
    /// store already has as many pending approvals (undecided, deadline after `t`) as `caps`
    /// allow.
    fn check_caps(&mut self, run_id: &str, caps: PendingCaps, t: f64) -> Result<()> {
        self.db.lock_asks().map_err(|m| self.db_err(m))?;
        let rows = self.query(
            "SELECT CAST(COUNT(*) AS BIGINT), CAST(COALESCE(SUM(CASE WHEN run_id = ?1 THEN 1 ELSE 0 END), 0) AS BIGINT) \
             FROM approvals WHERE status = 'pending' AND deadline > ?2",
            &[run_id.into(), t.into()],
        )?;
        let at = |i: usize| rows.first().and_then(|r| r[i].int()).unwrap_or(0);
        let (all, mine) = (at(0), at(1));
        if mine >= caps.run {
            return Err(StoreError::Full {
                scope: "run",
                limit: caps.run,
                msg: format!(
                    "run {run_id} has {mine} approvals pending, its limit ([approvals] max_pending = {}); decide or let some expire first",
                    caps.run
                ),
            });
        }
        if all >= caps.store {
            return Err(StoreError::Full {
                scope: "store",
                limit: caps.store,
                msg: format!(
                    "the approvals store has {all} approvals pending, its limit ([approvals] max_pending_store = {}); decide or let some expire first",
                    caps.store
                ),
            });
        }
        Ok(())
    }

    /// Remove what is over: approvals decided, sent, cancelled or expired (or pending past
    /// their deadline) whose every time (asked, decided, sent; the deadline of an expired
    /// one) is before `before` (Unix seconds); grants revoked or expired before it; runs
    /// ended before it with no approval or grant left. Never a pending approval whose
    /// deadline is to come, nor an approved one still to be sent (its run may send it).
    pub fn prune(&mut self, before: f64) -> Result<Pruned> {
        self.tx(|s| {
            let approvals = s.exec(
                "DELETE FROM approvals WHERE \
                 (status IN ('rejected', 'sent', 'cancelled') AND created < ?1 AND COALESCE(decided_at, 0) < ?1 \
                  AND COALESCE(sent_at, 0) < ?1) \
                 OR (status IN ('expired', 'pending') AND deadline < ?1)",
                &[before.into()],
            )?;
            let grants = s.exec(
                "DELETE FROM grants WHERE (revoked IS NOT NULL AND revoked < ?1) OR expires < ?1 \
                 OR run_id IN (SELECT run_id FROM runs WHERE ended IS NOT NULL AND ended < ?1)",
                &[before.into()],
            )?;
            let runs = s.exec(
                "DELETE FROM runs WHERE ended IS NOT NULL AND ended < ?1 \
                 AND run_id NOT IN (SELECT run_id FROM approvals) AND run_id NOT IN (SELECT run_id FROM grants)",
                &[before.into()],
            )?;
            Ok(Pruned { approvals, grants, runs })
        })
    }

    /// The newest approval of the run of `req` that answers it ([`is_request`]:
    /// found by its current digest, its first one (an edited approval: the agent retries what it
    /// sent, not the edit) or the same Idempotency-Key), whatever its status: what a
    /// `hold = "return"` retry is answered by.
    pub fn latest(&mut self, req: &NewApproval) -> Result<Option<Approval>> {
        let dg = digest::request_digest(&req.method, &req.url, &digest::sha256_hex(&req.body));
        let sql = format!(
            "SELECT {APPROVAL_COLS} FROM approvals WHERE run_id = ?1 AND (digest = ?2 OR edited <> 0 OR (idem_key IS NOT NULL AND idem_key = ?3)) \
             ORDER BY created DESC"
        );
        let rows = self.query(&sql, &[(&req.run_id).into(), (&dg).into(), req.idem_key.clone().into()])?;
        Ok(rows.iter().map(|r| approval_from(r)).find(|a| is_request(a, &dg)))
    }

    /// Why a guarded move of `id` (made on `version`/`digest`) changed nothing.
    fn why_stale(&mut self, id: &str, version: i64, digest: &str) -> Result<Stale> {
        let stale = |why: &'static str, detail: String| Stale { id: id.to_string(), why, detail };
        let Some(a) = self.get(id)? else {
            return Ok(stale("not found", "no such approval".into()));
        };
        let ended = self.run(&a.run_id)?.is_none_or(|r| r.ended.is_some());
        Ok(match a.status.as_str() {
            status::EXPIRED => stale("expired", format!("its deadline passed at {}; a timeout is never a yes", super::rfc3339(a.deadline))),
            status::CANCELLED => stale("run ended", format!("run {} ended; nothing of it can be sent any more", a.run_id)),
            status::PENDING if ended => stale("run ended", format!("run {} ended; nothing of it can be sent any more", a.run_id)),
            status::PENDING if a.deadline <= now() => {
                stale("expired", format!("its deadline passed at {}; a timeout is never a yes", super::rfc3339(a.deadline)))
            }
            status::PENDING if a.version != version => stale(
                "edited",
                format!("it is at version {} (you saw {version}); look at it again (show) before deciding", a.version),
            ),
            status::PENDING if a.digest != digest => {
                stale("digest", format!("the request's digest is {}, not the {digest} you saw", a.digest))
            }
            status::PENDING => stale("edited", "it changed while you decided; look at it again".into()),
            s => stale(
                "decided",
                format!(
                    "already {s} by {} at {}{}",
                    a.decided_by.as_deref().unwrap_or("the gate"),
                    a.decided_at.map(super::rfc3339).unwrap_or_else(|| "?".into()),
                    a.reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default()
                ),
            ),
        })
    }

    /// Check a grant the human asks for against the approval: never wider than its host;
    /// the rule must allow grants; a method token, a path prefix starting with `/`, seconds > 0.
    fn check_grant(a: &Approval, g: &GrantSpec) -> Result<()> {
        let bad = |m: String| Err(StoreError::Invalid(m));
        if !a.grants_allowed {
            return bad(format!("rule {} forbids grants (grants = false); approve without one", a.rule));
        }
        let host = digest::split_url(&a.url).map(|(h, _)| h).unwrap_or(a.url.as_str());
        if g.host != host {
            return bad(format!("a grant may not be wider than the request's host: {:?} is not {host:?}", g.host));
        }
        if !crate::policy::decide::is_upper_method(&g.method) {
            return bad(format!("grant method {:?}: expected an upper-case method such as POST", g.method));
        }
        if !g.path_prefix.starts_with('/') || crate::policy::canonical_path(&g.path_prefix).ok().as_deref() != Some(g.path_prefix.as_str()) {
            return bad(format!("grant path prefix {:?}: expected a canonical absolute path such as /v3/", g.path_prefix));
        }
        if !(g.seconds > 0.0 && g.seconds.is_finite()) {
            return bad(format!("grant duration {}: expected a positive number of seconds", g.seconds));
        }
        Ok(())
    }

    /// Approve or reject `id` as seen at `version` with `digest`, by `by`. Refused as
    /// [`Stale`] if it changed, was decided, expired, or its run ended. An approval may carry
    /// a grant (created in the same transaction). Wakes the run after the commit.
    pub fn decide(
        &mut self,
        id: &str,
        version: i64,
        digest: &str,
        verdict: Verdict,
        by: &str,
        reason: Option<&str>,
        grant: Option<&GrantSpec>,
    ) -> Result<Approval> {
        if verdict == Verdict::Reject && grant.is_some() {
            return Err(StoreError::Invalid("a rejection cannot carry a grant".into()));
        }
        if let Some(r) = reason.filter(|r| r.chars().count() > MAX_REASON) {
            return Err(StoreError::Invalid(format!("the reason is {} characters; the limit is {MAX_REASON}", r.chars().count())));
        }
        let t = now();
        let seen = self.get(id)?;
        if let (Some(a), Some(g)) = (&seen, grant) {
            Self::check_grant(a, g)?;
        }
        let new_status = match verdict {
            Verdict::Approve => status::APPROVED,
            Verdict::Reject => status::REJECTED,
        };
        let moved = self.tx(|s| {
            let grant_id = grant.map(|_| new_id("gr-"));
            let n = s.exec(
                "UPDATE approvals SET status = ?2, version = version + 1, decided_by = ?3, decided_at = ?4, reason = ?5, \
                 grant_id = ?6 WHERE id = ?1 AND status = 'pending' AND version = ?7 AND digest = ?8 AND deadline > ?4 \
                 AND run_id IN (SELECT run_id FROM runs WHERE ended IS NULL)",
                &[id.into(), new_status.into(), by.into(), t.into(), reason.into(), grant_id.clone().into(), version.into(), digest.into()],
            )?;
            if n == 0 {
                return Ok(false);
            }
            if let (Some(g), Some(gid), Some(a)) = (grant, grant_id, &seen) {
                let sql = format!("INSERT INTO grants ({GRANT_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, NULL, NULL, 0, ?9)");
                s.exec(
                    &sql,
                    &[gid.into(), (&a.run_id).into(), id.into(), (&g.method).into(), (&g.host).into(), (&g.path_prefix).into(), t.into(), (t + g.seconds).into(), by.into()],
                )?;
            }
            Ok(true)
        })?;
        if !moved {
            return Err(self.why_stale(id, version, digest)?.into());
        }
        self.after_change(id)
    }

    /// Re-read `id` after a committed change and wake its run.
    fn after_change(&mut self, id: &str) -> Result<Approval> {
        let a = self.get(id)?.ok_or_else(|| self.db_err(format!("approval {id} vanished")))?;
        let wake = self.run(&a.run_id)?.and_then(|r| r.wake);
        self.db.wake(wake.as_deref(), id);
        Ok(a)
    }

    /// Replace the editable headers and the body of pending `id` (seen at `version` with
    /// `digest`): credentials, Host, hop-by-hop headers, Content-Length and Idempotency-Key
    /// must stay as they are, the URL cannot change, the body must fit the store's limit
    /// (and the stored one must be whole). The first edit keeps the original in
    /// `orig_headers`/`orig_body`. Errors: [`StoreError::Invalid`], [`Stale`].
    pub fn edit(&mut self, id: &str, version: i64, digest: &str, by: &str, headers: &[(String, String)], body: &[u8]) -> Result<Approval> {
        let Some(a) = self.get(id)? else {
            return Err(Stale { id: id.into(), why: "not found", detail: "no such approval".into() }.into());
        };
        if body.len() > self.body_limit {
            return Err(StoreError::Invalid(format!("the edited body is {} bytes; the limit is {}", body.len(), self.body_limit)));
        }
        if a.body_truncated() {
            return Err(StoreError::Invalid(format!(
                "the body is {} bytes, more than the store keeps ({}); it cannot be edited, only approved or rejected",
                a.body_len,
                a.body.len()
            )));
        }
        check_edit(&a.headers, headers).map_err(StoreError::Invalid)?;
        let body_digest = digest::sha256_hex(body);
        let new_digest = digest::request_digest(&a.method, &a.url, &body_digest);
        let t = now();
        let n = self.exec(
            "UPDATE approvals SET headers = ?2, body = ?3, body_len = ?4, body_digest = ?5, digest = ?6, version = version + 1, \
             edited = 1, orig_headers = COALESCE(orig_headers, headers), orig_body = COALESCE(orig_body, body), \
             decided_by = ?7 WHERE id = ?1 AND status = 'pending' AND version = ?8 AND digest = ?9 AND deadline > ?10 \
             AND run_id IN (SELECT run_id FROM runs WHERE ended IS NULL)",
            &[
                id.into(),
                headers_json(headers).into(),
                body.to_vec().into(),
                (body.len() as i64).into(),
                body_digest.into(),
                new_digest.into(),
                by.into(),
                version.into(),
                digest.into(),
                t.into(),
            ],
        )?;
        if n == 0 {
            return Err(self.why_stale(id, version, digest)?.into());
        }
        self.after_change(id)
    }

    /// approved -> sending: true for exactly one caller per approval (the at-most-once).
    /// The version stays (see [`Approval::version`]): one decision, one step.
    pub fn claim(&mut self, id: &str) -> Result<bool> {
        Ok(self.exec("UPDATE approvals SET status = 'sending' WHERE id = ?1 AND status = 'approved'", &[id.into()])? == 1)
    }

    /// sending -> sent, with upstream's status (None: no response came).
    pub fn sent(&mut self, id: &str, upstream_status: Option<i64>) -> Result<()> {
        self.exec(
            "UPDATE approvals SET status = 'sent', sent_at = ?2, upstream_status = ?3 WHERE id = ?1 AND status = 'sending'",
            &[id.into(), now().into(), upstream_status.into()],
        )?;
        Ok(())
    }

    /// sending -> cancelled with `reason`: the gate claimed it and then could not send it
    /// (the SSRF guard refused the address, the dial failed); nothing left the gate.
    pub fn unsent(&mut self, id: &str, reason: &str) -> Result<()> {
        self.exec(
            "UPDATE approvals SET status = 'cancelled', version = version + 1, reason = ?2 WHERE id = ?1 AND status = 'sending'",
            &[id.into(), reason.into()],
        )?;
        Ok(())
    }

    /// pending -> expired once its deadline passed (by the gate). True if this call moved it.
    pub fn expire(&mut self, id: &str) -> Result<bool> {
        let n = self.exec(
            "UPDATE approvals SET status = 'expired', version = version + 1, reason = 'timeout' WHERE id = ?1 AND status = 'pending' AND deadline <= ?2",
            &[id.into(), now().into()],
        )?;
        Ok(n == 1)
    }

    /// pending|approved -> cancelled with `reason` (the agent left; nothing is sent without
    /// a connection to answer). True if this call moved it.
    pub fn cancel(&mut self, id: &str, reason: &str) -> Result<bool> {
        let n = self.exec(
            "UPDATE approvals SET status = 'cancelled', version = version + 1, reason = ?2 WHERE id = ?1 AND status IN ('pending', 'approved')",
            &[id.into(), reason.into()],
        )?;
        Ok(n == 1)
    }

    /// One waiter of `id` left; returns how many remain.
    pub fn leave(&mut self, id: &str) -> Result<i64> {
        self.exec("UPDATE approvals SET waiters = waiters - 1 WHERE id = ?1 AND waiters > 0", &[id.into()])?;
        Ok(self.get(id)?.map_or(0, |a| a.waiters))
    }

    // ---- grants -----------------------------------------------------------------------

    /// Grants, newest first, of `run_id` (any when None); `active`: unrevoked, unexpired and
    /// of a run that has not ended.
    pub fn grants(&mut self, run_id: Option<&str>, active: bool) -> Result<Vec<Grant>> {
        let mut params: Vec<Val> = vec![run_id.unwrap_or("").into()];
        let cond = if active {
            params.push(now().into());
            "AND revoked IS NULL AND expires > ?2 AND run_id IN (SELECT run_id FROM runs WHERE ended IS NULL)"
        } else {
            ""
        };
        let sql = format!("SELECT {GRANT_COLS} FROM grants WHERE (?1 = '' OR run_id = ?1) {cond} ORDER BY created DESC");
        Ok(self.query(&sql, &params)?.iter().map(|r| grant_from(r)).collect())
    }

    /// The first active grant of `run_id` that covers the request ([`Grant::covers`]) and
    /// was made on a request of the same `scheme` (`http` | `https`: the authority `host`
    /// leaves out the scheme's default port, so `http://h` and `https://h` share it), its use
    /// counted. `path` is canonical, without query.
    pub fn use_grant(&mut self, run_id: &str, scheme: &str, method: &str, host: &str, path: &str) -> Result<Option<Grant>> {
        let t = now();
        let origin = format!("{scheme}://");
        let mut found = None;
        for g in self.grants(Some(run_id), true)?.into_iter().filter(|g| g.covers(method, host, path, t)) {
            if self.get(&g.approval_id)?.is_some_and(|a| a.url.starts_with(&origin)) {
                found = Some(g);
                break;
            }
        }
        if let Some(g) = &found {
            self.exec("UPDATE grants SET uses = uses + 1 WHERE id = ?1", &[(&g.id).into()])?;
        }
        Ok(found.map(|g| Grant { uses: g.uses + 1, ..g }))
    }

    /// Revoke grant `id` (by `by`); revoking one already revoked changes nothing.
    /// Errors: [`StoreError::Invalid`] when there is no such grant.
    pub fn revoke_grant(&mut self, id: &str, by: &str) -> Result<Grant> {
        self.exec("UPDATE grants SET revoked = ?2, revoked_by = ?3 WHERE id = ?1 AND revoked IS NULL", &[id.into(), now().into(), by.into()])?;
        let sql = format!("SELECT {GRANT_COLS} FROM grants WHERE id = ?1");
        self.query(&sql, &[id.into()])?
            .first()
            .map(|r| grant_from(r))
            .ok_or_else(|| StoreError::Invalid(format!("no grant {id}; `gatewrap approvals grants` lists them")))
    }

    /// Counts of run `run_id` for its summary.
    pub fn counts(&mut self, run_id: &str) -> Result<Counts> {
        let rows = self.query(
            "SELECT CAST(COUNT(*) AS BIGINT), \
             CAST(COALESCE(SUM(CASE WHEN status IN ('approved', 'sending', 'sent') THEN 1 ELSE 0 END), 0) AS BIGINT), \
             CAST(COALESCE(SUM(CASE WHEN status = 'rejected' THEN 1 ELSE 0 END), 0) AS BIGINT), \
             CAST(COALESCE(SUM(CASE WHEN status = 'expired' THEN 1 ELSE 0 END), 0) AS BIGINT) \
             FROM approvals WHERE run_id = ?1",
            &[run_id.into()],
        )?;
        let g = self.query("SELECT CAST(COUNT(*) AS BIGINT), CAST(COALESCE(SUM(uses), 0) AS BIGINT) FROM grants WHERE run_id = ?1", &[run_id.into()])?;
        let at = |rows: &Vec<Vec<Val>>, i: usize| rows.first().and_then(|r| r[i].int()).unwrap_or(0);
        Ok(Counts {
            asked: at(&rows, 0),
            approved: at(&rows, 1),
            rejected: at(&rows, 2),
            expired: at(&rows, 3),
            granted: at(&g, 0),
            by_grant: at(&g, 1),
        })
    }
}
