//! The audit log's writer thread and its queue: callers serialize their lines themselves
//! (in parallel), hand them to the queue, and the one writer thread puts everything queued
//! in the chain (`seq`, `prev`) in queue order and appends it with one `write(2)` a batch,
//! under one `flock(2)` and one check of the path ([`super::Log::write_batch`]). A caller
//! that needs its record written (the `admit` record before a dial, a refusal before its
//! answer) waits for its [`Written`]: a future, or [`Written::wait`] on a plain thread.
//!
//! The writer thread ends after [`WRITER_IDLE`] without a record and the next record starts
//! another ([`Queue::push`] says when): a daemon holding thousands of idle sandboxes, each
//! with an audit log of its own, holds no thread for them (issue 23, target 4).
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
use std::time::Duration;

use super::AuditError;

/// Most entries the queue holds; a caller that finds it full waits (see the module doc).
pub const QUEUE_CAP: usize = 4096;
/// Most entries the writer takes into one batch (one `write(2)`, under one `flock(2)`).
pub const BATCH_CAP: usize = 512;
/// How long the writer thread waits for a record before it ends (the next record starts
/// another: a thread's start is ~0.05 ms, against seconds between an idle gate's records).
pub const WRITER_IDLE: Duration = Duration::from_secs(5);

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
    /// A writer thread is running (or being started): set by the push that finds none,
    /// cleared by the writer when it ends, both under the lock, so that every entry queued
    /// has a writer to take it.
    writing: bool,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queue `job` (waiting for room when [`QUEUE_CAP`] entries are queued); `wait`: with a
    /// [`Written`] to wait on, else `None` (nobody waits: the record is still written).
    /// The `bool`: no writer thread is running and the caller must start one (or, if it
    /// cannot, call [`Queue::no_writer`]).
    pub fn push(&self, job: Job, wait: bool) -> (Option<Written>, bool) {
        let ack = wait.then(|| Arc::new(Ack::default()));
        let entry = Entry { job, ack: ack.clone() };
        let mut s = self.lock();
        while s.entries.len() >= QUEUE_CAP && !s.closed {
            s = self.room.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        let mut start = false;
        if s.closed {
            drop(s);
            drop(entry); // tells its waiter it was not written
        } else {
            let first = s.entries.is_empty();
            s.entries.push_back(entry);
            start = !s.writing;
            s.writing = true;
            drop(s);
            if first && !start {
                self.work.notify_one();
            }
        }
        (ack.map(|a| Written(WrittenInner::Queued(a))), start)
    }

    /// No writer thread could be started: every entry queued is dropped unwritten (each
    /// waiter told so: fail closed), and the next push tries again.
    pub fn no_writer(&self) {
        let mut s = self.lock();
        s.writing = false;
        let dropped: Vec<Entry> = s.entries.drain(..).collect();
        drop(s);
        self.room.notify_all();
        drop(dropped);
    }

    /// The next batch, oldest first (at most `max` entries; waits up to `idle` for one);
    /// None once the queue is closed and empty, or after `idle` without an entry: the
    /// writer thread then ends (the next [`Queue::push`] starts another).
    pub fn take(&self, max: usize, idle: Duration) -> Option<Vec<Entry>> {
        let mut s = self.lock();
        while s.entries.is_empty() {
            if s.closed {
                s.writing = false;
                return None;
            }
            let (next, timeout) = self.work.wait_timeout(s, idle).unwrap_or_else(|p| p.into_inner());
            s = next;
            if timeout.timed_out() && s.entries.is_empty() {
                s.writing = false;
                return None;
            }
        }
        let n = s.entries.len().min(max);
        let batch: Vec<Entry> = s.entries.drain(..n).collect();
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
