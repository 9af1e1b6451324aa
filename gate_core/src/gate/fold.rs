//! The gate's denials of one run, folded as the kernel folds its own (bpf/common.bpf.c,
//! `record`): identical denials (same event, rule, host, port and reason) within a
//! [`WINDOW`] of the last record of that denial are counted, not written one by one.
//!
//! - The first denial of a key, and the first after a quiet window, is written at once (its
//!   own record, as without folding: the live notice and `gatewrap audit --follow` see it).
//! - Repeats within the window are counted; when the window ends (a timer task of the gate,
//!   [`run`]) one record carries their exact `count`, `first_seen` and `last_seen`, and the
//!   method, target (up to [`MAX_TARGET`] bytes) and client of the last of them. So a flood writes about one record a second a
//!   key, not one a request.
//! - A run folds at most [`MAX_KEYS`] distinct keys (the kernel's `GW_MAX_FOLDS_PER_RUN`);
//!   the denials beyond them fold together into one overflow key of the run (`overflow`:
//!   true, no host): an agent asking for a million distinct hosts gets no million records.
//! - At the gate's stop ([`flush`]), every count still held is written, whatever its window.
//!
//! Only denials fold (decision `denied` of a `request` or `connect` record, no approval or
//! grant in it): never an allowed request, an admission or an approval step, whose records
//! stay one each (contract 5: no unrecorded yes). Every denial is counted in the run's
//! `denied` when it happens. While the audit log cannot be written nothing folds (each denial
//! tries its own write and gets the 503 of an unrecordable decision); a folded record that
//! cannot be written keeps its count for the next try.
//!
//! What a crash loses: the counts held in memory, at most one window (a second) of repeats
//! of each key whose first was written; the kernel's folds live in pinned maps and are
//! collected by `gatewrap gc`, the gate's die with its process.

use std::collections::hash_map::{DefaultHasher, Entry as MapEntry};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;
use tokio::sync::Notify;

use crate::audit::{fields as f, GateRecord};

use super::Ctx;

/// Repeats of one denial within this long of its last record are folded into the next
/// (the kernel's `GW_FOLD_INTERVAL_NS`).
pub const WINDOW: Duration = Duration::from_secs(1);
/// Distinct denials a run folds one by one (the kernel's `GW_MAX_FOLDS_PER_RUN`); beyond,
/// into the run's overflow key.
pub const MAX_KEYS: usize = 4096;
/// The longest target a folded record carries (the last repeat's); a longer one is left
/// out, so that a run's keys hold at most this much each.
pub const MAX_TARGET: usize = 512;
/// The reason of the overflow key's records.
pub const OVERFLOW_REASON: &str =
    "gate: denials beyond the 4096 distinct ones a run folds, folded together (any rule, host and reason)";

/// What the record of a key says (the key's own fields), and what its repeats left.
#[derive(Debug)]
struct Entry {
    event: &'static str,
    proto: &'static str,
    rule: Option<String>,
    host: Option<String>,
    port: Option<u16>,
    reason: Option<String>,
    status: Option<u16>,
    /// When this key's last record was written.
    emitted: Instant,
    /// Repeats since, not yet written.
    pending: u64,
    first_seen: SystemTime,
    last_seen: SystemTime,
    /// Method, target (when at most [`MAX_TARGET`] bytes) and client of the last repeat.
    method: Option<String>,
    target: Option<String>,
    client: Option<String>,
    client_pid: Option<Option<u32>>,
    client_comm: Option<String>,
}

impl Entry {
    fn of(rec: &GateRecord, now: Instant) -> Entry {
        Entry {
            event: rec.event,
            proto: rec.proto,
            rule: rec.rule.clone(),
            host: rec.dst_host.clone(),
            port: rec.dst_port,
            reason: rec.reason.clone(),
            status: rec.status,
            emitted: now,
            pending: 0,
            first_seen: SystemTime::UNIX_EPOCH,
            last_seen: SystemTime::UNIX_EPOCH,
            method: None,
            target: None,
            client: None,
            client_pid: None,
            client_comm: None,
        }
    }

    fn overflow(rec: &GateRecord, now: Instant) -> Entry {
        Entry { rule: None, host: None, port: None, reason: Some(OVERFLOW_REASON.into()), ..Entry::of(rec, now) }
    }

    fn is(&self, rec: &GateRecord) -> bool {
        self.event == rec.event
            && self.rule == rec.rule
            && self.host == rec.dst_host
            && self.port == rec.dst_port
            && self.reason == rec.reason
    }

    /// Count `rec` as a repeat.
    fn hold(&mut self, rec: &GateRecord) {
        let now = SystemTime::now();
        if self.pending == 0 {
            self.first_seen = now;
        }
        self.pending += 1;
        self.last_seen = now;
        self.method.clone_from(&rec.method);
        self.target = rec.target.as_ref().filter(|t| t.len() <= MAX_TARGET).cloned();
        self.client.clone_from(&rec.client);
        self.client_pid = rec.client_pid;
        self.client_comm.clone_from(&rec.client_comm);
    }

    /// The folded record of the repeats held (`count` of them).
    fn record(&self, run: &str, overflow: bool) -> serde_json::Map<String, Value> {
        let rec = GateRecord {
            run: run.to_string(),
            event: self.event,
            decision: f::DENIED,
            reason: self.reason.clone(),
            rule: self.rule.clone(),
            client: self.client.clone(),
            client_pid: self.client_pid,
            client_comm: self.client_comm.clone(),
            method: self.method.clone(),
            target: self.target.clone(),
            dst_host: self.host.clone(),
            dst_port: self.port,
            proto: self.proto,
            status: self.status,
            count: Some(self.pending),
            ..GateRecord::default()
        };
        let mut m = rec.into_map();
        m.insert(f::FIRST_SEEN.into(), rfc3339(self.first_seen).into());
        m.insert(f::LAST_SEEN.into(), rfc3339(self.last_seen).into());
        if overflow {
            m.insert(f::OVERFLOW.into(), Value::Bool(true));
        }
        m
    }
}

fn rfc3339(t: SystemTime) -> String {
    crate::audit::format_time(time::OffsetDateTime::from(t))
}

/// What [`Folds::offer`] decided for a denial.
#[derive(Debug, PartialEq, Eq)]
pub enum Offer {
    /// Write its own record now (a first, or the first after a quiet window).
    Write,
    /// Counted; its key's record at the window's end says it.
    Folded,
}

/// The folded denials of one run.
#[derive(Debug, Default)]
pub struct Folds {
    state: Mutex<State>,
    /// Wakes the flusher ([`run`]) when a key gets its first repeat of a window.
    wake: Notify,
}

#[derive(Debug, Default)]
struct State {
    /// By a hash of the key's fields; [`Entry::is`] checks the fields (a different key
    /// with the same hash goes to the overflow key).
    keys: HashMap<u64, Entry>,
    overflow: Option<Entry>,
}

/// Whether `rec` is a decision that folds: a denial of a request or tunnel, not tied to an
/// approval or grant.
pub fn folds(rec: &GateRecord) -> bool {
    rec.decision == f::DENIED
        && (rec.event == f::EVENT_REQUEST || rec.event == f::EVENT_CONNECT)
        && rec.approval.is_none()
        && rec.grant.is_none()
}

fn key_hash(rec: &GateRecord) -> u64 {
    let mut h = DefaultHasher::new();
    (rec.event, &rec.rule, &rec.dst_host, rec.dst_port, &rec.reason).hash(&mut h);
    h.finish()
}

impl Folds {
    /// Decide for the denial `rec` (one that [`folds`]) at `now`.
    pub fn offer(&self, rec: &GateRecord, now: Instant) -> Offer {
        let mut guard = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let s = &mut *guard;
        let n = s.keys.len();
        let entry = match s.keys.entry(key_hash(rec)) {
            MapEntry::Occupied(e) if e.get().is(rec) => e.into_mut(),
            MapEntry::Vacant(v) if n < MAX_KEYS => {
                v.insert(Entry::of(rec, now));
                return Offer::Write;
            }
            _ => match &mut s.overflow {
                Some(o) => o,
                none => {
                    *none = Some(Entry::overflow(rec, now));
                    // The first denial past the quota: its own record, at once, as any first.
                    return Offer::Write;
                }
            },
        };
        if entry.pending == 0 && now.duration_since(entry.emitted) >= WINDOW {
            entry.emitted = now;
            return Offer::Write;
        }
        let first = entry.pending == 0;
        entry.hold(rec);
        drop(guard);
        if first {
            self.wake.notify_one();
        }
        Offer::Folded
    }

    /// The folded records due at `now` (every one held if `all`), taken out of their keys
    /// with their counts; the next time one is due, if any is held.
    fn take_due(&self, run: &str, now: Instant, all: bool) -> (Vec<Due>, Option<Instant>) {
        let mut guard = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let State { keys, overflow } = &mut *guard;
        let mut out = Vec::new();
        let mut next: Option<Instant> = None;
        let entries = keys.iter_mut().map(|(h, e)| (Taken::Key(*h), e)).chain(overflow.iter_mut().map(|e| (Taken::Overflow, e)));
        for (which, e) in entries {
            if e.pending == 0 {
                continue;
            }
            let due = e.emitted + WINDOW;
            if all || now >= due {
                let rec = e.record(run, which == Taken::Overflow);
                out.push(Due { which, count: e.pending, first_seen: e.first_seen, rec });
                e.emitted = now;
                e.pending = 0;
            } else {
                next = Some(next.map_or(due, |n| n.min(due)));
            }
        }
        (out, next)
    }

    /// A folded record that could not be written: its count goes back to its key, to be
    /// written with the key's next one (whose times then span both).
    fn put_back(&self, due: &Due) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let e = match due.which {
            Taken::Key(h) => s.keys.get_mut(&h),
            Taken::Overflow => s.overflow.as_mut(),
        };
        if let Some(e) = e {
            if e.pending == 0 {
                e.last_seen = due.first_seen;
            }
            e.pending += due.count;
            e.first_seen = due.first_seen;
        }
    }
}

/// A folded record taken out of its key, and what puts it back.
#[derive(Debug)]
struct Due {
    which: Taken,
    count: u64,
    first_seen: SystemTime,
    rec: serde_json::Map<String, Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Taken {
    Key(u64),
    Overflow,
}

/// Write the folded records due now (every one held if `all`); a record that cannot be
/// written keeps its count for the next try. Returns when the next is due, if any is held.
fn write_due(ctx: &Ctx, all: bool) -> Option<Instant> {
    let (due, next) = ctx.folds.take_due(&ctx.run_id, Instant::now(), all);
    let mut failed = false;
    for d in due {
        if failed || ctx.write_folded(d.rec.clone()).is_err() {
            failed = true;
            ctx.folds.put_back(&d);
        }
    }
    if failed {
        // Tried again a window later.
        return Some(Instant::now() + WINDOW);
    }
    next
}

/// The flusher of a gate (one of its tasks, started with it; it sleeps until a key holds a
/// repeat): writes each key's folded record at its window's end.
pub async fn run(ctx: Arc<Ctx>) {
    loop {
        match write_due(&ctx, false) {
            Some(at) => tokio::time::sleep_until(at.into()).await,
            None => ctx.folds.wake.notified().await,
        }
    }
}

/// Write every count still held (at the gate's stop, its tasks ended).
pub fn flush(ctx: &Ctx) {
    let _ = write_due(ctx, true);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denial(host: &str, reason: &str) -> GateRecord {
        GateRecord {
            run: "gw-t".into(),
            event: f::EVENT_REQUEST,
            decision: f::DENIED,
            dst_host: Some(host.into()),
            dst_port: Some(80),
            reason: Some(reason.into()),
            proto: f::PROTO_HTTP,
            ..GateRecord::default()
        }
    }

    fn held(folds: &Folds, now: Instant, all: bool) -> u64 {
        folds.take_due("gw-t", now, all).0.iter().map(|d| d.rec[f::COUNT].as_u64().unwrap()).sum()
    }

    #[test]
    fn the_first_is_written_the_repeats_counted_and_told_at_the_windows_end() {
        let folds = Folds::default();
        let t0 = Instant::now();
        let rec = denial("x.test", "policy: default deny");
        assert_eq!(folds.offer(&rec, t0), Offer::Write);
        for _ in 0..999 {
            assert_eq!(folds.offer(&rec, t0), Offer::Folded);
        }
        // Another reason is another key: its first is written at once.
        assert_eq!(folds.offer(&denial("x.test", "ssrf: private address 10.0.0.1"), t0), Offer::Write);
        assert_eq!(held(&folds, t0 + WINDOW / 2, false), 0, "not before the window's end");
        assert_eq!(held(&folds, t0 + WINDOW, false), 999);
        // A quiet window later, the next is written at once again.
        assert_eq!(folds.offer(&rec, t0 + 3 * WINDOW), Offer::Write);
    }

    #[test]
    fn keys_beyond_the_quota_fold_into_the_overflow_and_all_counts_add_up() {
        let folds = Folds::default();
        let t0 = Instant::now();
        let mut written = 0;
        for i in 0..MAX_KEYS + 500 {
            for _ in 0..3 {
                if folds.offer(&denial(&format!("h{i}.test"), "policy: default deny"), t0) == Offer::Write {
                    written += 1;
                }
            }
        }
        // One record per key of the quota, one for the first past it; the rest are held.
        assert_eq!(written, MAX_KEYS as u64 + 1);
        let (due, next) = folds.take_due("gw-t", t0, true);
        assert!(next.is_none());
        let total: u64 = due.iter().map(|d| d.count).sum();
        assert_eq!(written + total, 3 * (MAX_KEYS as u64 + 500));
        let over: Vec<_> = due.iter().filter(|d| d.which == Taken::Overflow).collect();
        assert_eq!(over.len(), 1);
        assert_eq!(over[0].rec[f::COUNT], serde_json::json!(3 * 500 - 1));
        assert_eq!(over[0].rec[f::OVERFLOW], serde_json::json!(true));
        assert!(over[0].rec.get(f::DST_HOST).is_none());
    }

    #[test]
    fn a_record_that_could_not_be_written_keeps_its_count() {
        let folds = Folds::default();
        let t0 = Instant::now();
        let rec = denial("x.test", "policy: default deny");
        folds.offer(&rec, t0);
        for _ in 0..5 {
            folds.offer(&rec, t0);
        }
        let (due, _) = folds.take_due("gw-t", t0 + WINDOW, false);
        assert_eq!(due.len(), 1);
        folds.put_back(&due[0]);
        folds.offer(&rec, t0 + WINDOW);
        assert_eq!(held(&folds, t0 + 2 * WINDOW, true), 6);
    }

    #[test]
    fn only_denials_of_requests_and_tunnels_without_an_approval_fold() {
        let d = denial("x.test", "policy: default deny");
        assert!(folds(&d));
        assert!(!folds(&GateRecord { decision: f::ALLOWED, ..d.clone() }));
        assert!(!folds(&GateRecord { decision: f::FAILED, ..d.clone() }));
        assert!(!folds(&GateRecord { event: f::EVENT_DNS, ..d.clone() }));
        assert!(!folds(&GateRecord { approval: Some("ap-1".into()), ..d.clone() }));
        assert!(!folds(&GateRecord { grant: Some("gr-1".into()), ..d }));
    }
}
