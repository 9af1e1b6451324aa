//! The audit log's writer thread and its queue: callers serialize their lines themselves
//! (in parallel), hand them to the queue, and the one writer thread puts everything queued
//! in the chain (`seq`, `prev`) in queue order and appends it with one `write(2)` a batch,
//! under one `flock(2)` and one check of the path ([`super::Log::write_batch`]). A caller
//! that needs its record written (the `admit` record before a dial, a refusal before its
//! answer) waits for its [`Written`]: a future, or [`Written::wait`] on a plain thread.
//!
//! Only a waited-for entry wakes the writer at once: one nobody waits for (a request's
//! outcome, whose `admit` is written already) goes with the next waited-for one, or after
//! at most [`LAZY`], or once [`LAZY_BATCH`] are queued. A request's two records then cost
//! the writer one wake-up, not two (a wake-up is a futex call on a runtime thread, and a
//! context switch that may preempt it: the profile of issue 23's tail).
//!
//! The queue holds at most [`QUEUE_CAP`] entries: a caller that finds it full waits for room
//! (the writer drains it), so a record is never dropped. An entry the writer could not
//! write is told as that error to whoever waits; an entry dropped unwritten (the writer
//! thread gone) is told as an error too: nobody waits forever, and nothing is taken as
//! written that was not.

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use super::AuditError;

/// Most entries the queue holds; a caller that finds it full waits (see the module doc).
pub const QUEUE_CAP: usize = 4096;
/// Most entries the writer takes into one batch (one `write(2)`, under one `flock(2)`).
pub const BATCH_CAP: usize = 512;
/// Longest an entry nobody waits for stays queued before the writer writes it.
pub const LAZY: std::time::Duration = std::time::Duration::from_millis(2);
/// Entries nobody waits for that wake the writer (else [`LAZY`] or a waited-for one does).
pub const LAZY_BATCH: usize = 64;

/// What the writer does with one entry.
#[derive(Debug)]
pub(super) enum Job {
    /// Append `line` (from [`super::line`] or [`super::gate_line`]: `seq` and `prev` still
    /// placeholders) whose `{"v":..,"time":".."` is `prefix` bytes long.
    Line { line: String, prefix: usize },
    /// Append a checkpoint unless the log is empty or ends with one ([`super::AuditLog::checkpoint`]).
    Checkpoint,
    /// Nothing: done once everything queued before it is written ([`super::AuditLog::sync`]).
    Flush,
}

/// One queued job and who (if anyone) waits for it. Dropped without [`Entry::done`], it
/// tells its waiter that it was not written.
#[derive(Debug)]
pub(super) struct Entry {
    pub job: Job,
    ack: Option<Arc<Ack>>,
}

impl Entry {
    /// Tell the waiter (if any) how the job went; an error nobody waits for is logged.
    pub fn done(mut self, result: Result<(), AuditError>) {
        match self.ack.take() {
            Some(ack) => ack.set(result),
            None => {
                if let Err(e) = result {
                    tracing::error!(error = %e, "audit record not written (nobody waited for it; the next admit fails closed)");
                }
            }
        }
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        if let Some(ack) = self.ack.take() {
            ack.set(Err(AuditError::Write { path: Default::default(), source: io::Error::other("the audit writer thread stopped before writing this record") }));
        }
    }
}

/// Where the writer leaves one entry's result, and who to wake.
#[derive(Debug, Default)]
struct Ack {
    state: Mutex<AckState>,
    done: Condvar,
}

#[derive(Debug, Default)]
struct AckState {
    result: Option<Result<(), AuditError>>,
    /// Taken (to be told once) by [`Written`] when it has its result.
    taken: bool,
    waker: Option<Waker>,
}

impl Ack {
    fn lock(&self) -> MutexGuard<'_, AckState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set(&self, result: Result<(), AuditError>) {
        let waker = {
            let mut s = self.lock();
            s.result = Some(result);
            s.waker.take()
        };
        self.done.notify_all();
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// A queued record's outcome: `.await` it (an async task), or [`Written::wait`] for it (a
/// thread that may block). Dropping it leaves the record queued: it is still written.
#[derive(Debug)]
pub struct Written(WrittenInner);

#[derive(Debug)]
enum WrittenInner {
    Queued(Arc<Ack>),
    /// Known at once (the record could not be queued); None once told.
    Now(Option<Result<(), AuditError>>),
}

impl Written {
    pub(super) fn now(result: Result<(), AuditError>) -> Written {
        Written(WrittenInner::Now(Some(result)))
    }

    /// Block this thread until the record is written (Ok) or cannot be (the writer's
    /// error, as [`super::AuditLog::write`] says).
    pub fn wait(self) -> Result<(), AuditError> {
        match self.0 {
            WrittenInner::Now(r) => r.unwrap_or(Ok(())),
            WrittenInner::Queued(ack) => {
                let mut s = ack.lock();
                loop {
                    if let Some(r) = s.result.take() {
                        return r;
                    }
                    s = ack.done.wait(s).unwrap_or_else(|p| p.into_inner());
                }
            }
        }
    }
}

impl Future for Written {
    type Output = Result<(), AuditError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.0 {
            WrittenInner::Now(r) => Poll::Ready(r.take().unwrap_or(Ok(()))),
            WrittenInner::Queued(ack) => {
                let mut s = ack.lock();
                if let Some(r) = s.result.take() {
                    s.taken = true;
                    return Poll::Ready(r);
                }
                if s.taken {
                    return Poll::Ready(Ok(()));
                }
                match &s.waker {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    _ => s.waker = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
        }
    }
}

/// The bounded queue between callers and the writer thread.
#[derive(Debug, Default)]
pub(super) struct Queue {
    state: Mutex<State>,
    /// The writer waits here for entries.
    work: Condvar,
    /// Callers wait here for room.
    room: Condvar,
}

#[derive(Debug, Default)]
struct State {
    entries: VecDeque<Entry>,
    /// No more entries: the writer drains what is queued and ends.
    closed: bool,
    /// Someone waits for a queued entry: the writer takes the batch at once.
    urgent: bool,
    /// The writer waits on `work` (a push that must wake it notifies; others need not).
    sleeping: bool,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queue `job` (waiting for room when [`QUEUE_CAP`] entries are queued); `wait`: with a
    /// [`Written`] to wait on, else `None` (nobody waits: the record is still written).
    pub fn push(&self, job: Job, wait: bool) -> Option<Written> {
        let ack = wait.then(|| Arc::new(Ack::default()));
        let entry = Entry { job, ack: ack.clone() };
        let mut s = self.lock();
        while s.entries.len() >= QUEUE_CAP && !s.closed {
            s = self.room.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        if s.closed {
            drop(s);
            drop(entry); // tells its waiter it was not written
        } else {
            s.entries.push_back(entry);
            s.urgent |= wait;
            let wake = s.sleeping && (wait || s.entries.len() >= LAZY_BATCH);
            if wake {
                s.sleeping = false;
            }
            drop(s);
            if wake {
                self.work.notify_one();
            }
        }
        ack.map(|a| Written(WrittenInner::Queued(a)))
    }

    /// The next batch, oldest first (at most `max` entries): at once when someone waits for
    /// one of them, else after [`LAZY`] or at [`LAZY_BATCH`] entries; None once the queue
    /// is closed and empty.
    pub fn take(&self, max: usize) -> Option<Vec<Entry>> {
        let mut s = self.lock();
        loop {
            if !s.entries.is_empty() && (s.urgent || s.closed || s.entries.len() >= LAZY_BATCH) {
                break;
            }
            if s.entries.is_empty() && s.closed {
                return None;
            }
            s.sleeping = true;
            if s.entries.is_empty() {
                s = self.work.wait(s).unwrap_or_else(|p| p.into_inner());
            } else {
                let (g, waited) = self.work.wait_timeout(s, LAZY).unwrap_or_else(|p| p.into_inner());
                s = g;
                if waited.timed_out() && !s.entries.is_empty() {
                    s.sleeping = false;
                    break;
                }
            }
            s.sleeping = false;
        }
        let n = s.entries.len().min(max);
        let batch: Vec<Entry> = s.entries.drain(..n).collect();
        // What remains may hold a waited-for entry: taken at once too (never later than asked).
        s.urgent &= !s.entries.is_empty();
        drop(s);
        self.room.notify_all();
        Some(batch)
    }

    /// No more entries: the writer ends once it has written what is queued; callers waiting
    /// for room are told their record was not written.
    pub fn close(&self) {
        self.lock().closed = true;
        self.work.notify_all();
        self.room.notify_all();
    }
}

/// `e` again, for each of a batch's entries (an `io::Error` is not `Clone`: its OS error
/// code is kept, else its kind and text).
pub(super) fn again(e: &AuditError) -> AuditError {
    let io = |s: &io::Error| match s.raw_os_error() {
        Some(code) => io::Error::from_raw_os_error(code),
        None => io::Error::new(s.kind(), s.to_string()),
    };
    match e {
        AuditError::Write { path, source } => AuditError::Write { path: path.clone(), source: io(source) },
        AuditError::Undo { path, source, undo } => AuditError::Undo { path: path.clone(), source: io(source), undo: io(undo) },
        AuditError::Open { path, source } => AuditError::Open { path: path.clone(), source: io(source) },
        AuditError::NotAFile { path, what } => AuditError::NotAFile { path: path.clone(), what },
        AuditError::Reserved(k) => AuditError::Reserved(k.clone()),
        other => AuditError::Write { path: Default::default(), source: io::Error::other(other.to_string()) },
    }
}
