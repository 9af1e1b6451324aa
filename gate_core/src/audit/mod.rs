//! The audit log: JSON lines appended a batch a `write(2)`, at most [`MAX_RECORD`]
//! bytes a line, never a cut one; every control character escaped ([`escape`]); each line
//! chained to the one before it by its hash ([`chain`]), with signed checkpoints of the
//! chain ([`note`]) every [`CHECKPOINT_RECORDS`] records or [`CHECKPOINT_INTERVAL`], and
//! when asked ([`AuditLog::checkpoint`], at each run's end); rotated by size into
//! segments that continue the chain ([`rotate`]). One writer thread a log ([`queue`])
//! appends what callers queue, a batch at a time.

mod cap;
pub mod chain;
pub mod escape;
pub mod fields;
pub mod note;
pub mod queue;
mod record;
pub mod rotate;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_chain;
#[cfg(test)]
mod tests_queue;
#[cfg(test)]
mod tests_rotate;

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Map, Value};

use crate::root_dir::{self, UnsafeDir};

pub use cap::MAX_RECORD;
pub use note::{KeyError, NoteKey};
pub use queue::Written;
use queue::{Entry, Job, Queue};
pub use record::GateRecord;
pub use rotate::Rotation;

/// A checkpoint follows every record whose `seq` is a multiple of this.
pub const CHECKPOINT_RECORDS: u64 = 1000;
/// A checkpoint follows the first record written this long after this writer's last one.
pub const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("cannot use the audit log's directory: {0}; choose an --audit-log in a directory only root can write (the default /var/log/gatewrap is made 0750 root)")]
    Dir(UnsafeDir),
    #[error("cannot open audit log {path}: {source}")]
    Open { path: PathBuf, source: io::Error },
    #[error("audit log {path} is {what}, not a regular file: remove it, or choose another --audit-log")]
    NotAFile { path: PathBuf, what: &'static str },
    #[error("cannot write audit log {path}: {source}")]
    Write { path: PathBuf, source: io::Error },
    #[error("cannot write audit log {path}: {source}; and the partly written record could not be removed: {undo}")]
    Undo { path: PathBuf, source: io::Error, undo: io::Error },
    #[error("audit record must not set the reserved key {0:?}")]
    Reserved(String),
    #[error("{0}")]
    Key(KeyError),
}

impl AuditError {
    /// The OS error behind it, if one is (`Dir` with an I/O cause, `Open`, `Write`, `Undo`).
    pub fn io(&self) -> Option<&io::Error> {
        match self {
            AuditError::Dir(UnsafeDir::Io { source, .. })
            | AuditError::Open { source, .. }
            | AuditError::Write { source, .. }
            | AuditError::Undo { source, .. } => Some(source),
            AuditError::Key(KeyError::Io { source, .. }) => Some(source),
            AuditError::Dir(UnsafeDir::Unsafe { .. })
            | AuditError::NotAFile { .. }
            | AuditError::Reserved(_)
            | AuditError::Key(_) => None,
        }
    }
}

/// What a file that is not a regular one is, for [`AuditError::NotAFile`].
fn kind_of(t: fs::FileType) -> &'static str {
    if t.is_symlink() {
        "a symbolic link (never followed)"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_block_device() || t.is_char_device() {
        "a device"
    } else {
        "not a regular file"
    }
}

/// An append-only JSON-lines file, shared by the gate and the Python side: callers queue
/// records, its writer thread ([`queue`]) appends them, in queue order, a batch a `write(2)`.
/// Dropped, it writes what is queued, then its thread ends and the file is closed.
#[derive(Debug)]
pub struct AuditLog {
    log: Arc<Log>,
    queue: Arc<Queue>,
    /// The writer thread: started by a record that finds none (the first, or the first after
    /// [`queue::WRITER_IDLE`] without one), so that the builders below still own `log` alone.
    writer: Mutex<Option<JoinHandle<()>>>,
}

/// The file and its chain: written by the writer thread only (and locked for `sync`).
#[derive(Debug)]
struct Log {
    path: PathBuf,
    file: Mutex<Writer>,
    key: Option<NoteKey>,
    every: u64,
    interval: Duration,
    rotation: Option<Rotation>,
}

/// How often one write follows the path to a newer file before it gives up (each time,
/// another writer rotated the log while this one waited for the lock).
const REOPEN_TRIES: usize = 64;

#[derive(Debug)]
struct Writer {
    file: File,
    /// When this writer last checkpointed (or opened the log).
    last_checkpoint: Instant,
    /// The file's length and chain head right after this writer's last append to it: when
    /// the locked file still has that length, nobody appended since (the log only grows,
    /// and a cut write is cut back to the same bytes; another file at the path is another
    /// inode, see [`AuditLog::at_head`]), so its last line need not be read back and
    /// hashed again. `None` after anything else (an error, a rotation, a reopen).
    known: Option<(u64, chain::Head)>,
}

/// `path` opened (created, mode 0640) for appending and reading back: without following a
/// link, without blocking, and a regular file, as [`AuditLog::open`] says.
fn open_file(path: &Path) -> Result<File, AuditError> {
    let not_a_file = |path: &Path| {
        fs::symlink_metadata(path)
            .ok()
            .filter(|m| !m.is_file())
            .map(|m| AuditError::NotAFile { path: path.to_path_buf(), what: kind_of(m.file_type()) })
    };
    let open_err = |source| AuditError::Open { path: path.to_path_buf(), source };
    // Read too: a writer reads the last line back for the chain.
    let file = OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .mode(0o640)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|source| not_a_file(path).unwrap_or_else(|| open_err(source)))?;
    let meta = file.metadata().map_err(open_err)?;
    if !meta.is_file() {
        return Err(AuditError::NotAFile { path: path.to_path_buf(), what: kind_of(meta.file_type()) });
    }
    // SAFETY: fcntl on a descriptor we own; F_GETFL/F_SETFL take and return flags only.
    let cleared = unsafe {
        let flags = libc::fcntl(file.as_raw_fd(), libc::F_GETFL);
        flags >= 0 && libc::fcntl(file.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK) == 0
    };
    if !cleared {
        return Err(open_err(io::Error::last_os_error()));
    }
    Ok(file)
}

impl AuditLog {
    /// Open (create) `path` with mode 0640, for appending and reading back its last line.
    ///
    /// Its directory is made if missing (mode 0750, its missing parents too) and must be
    /// root's and not writable by others, nor any directory above it unless sticky
    /// ([`root_dir::check`]): else [`AuditError::Dir`]. The file is opened without following
    /// a symbolic link (`O_NOFOLLOW`) and without blocking (`O_NONBLOCK`: a FIFO planted
    /// there would block `open(2)` until a reader came, see fifo(7)); then it must be a
    /// regular file ([`AuditError::NotAFile`]), and `O_NONBLOCK` is cleared.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, AuditError> {
        let path = path.as_ref().to_path_buf();
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        root_dir::ensure(dir, 0o750, 0o022).map_err(AuditError::Dir)?;
        let file = open_file(&path)?;
        let file = Mutex::new(Writer { file, last_checkpoint: Instant::now(), known: None });
        let log = Log { path, file, key: None, every: CHECKPOINT_RECORDS, interval: CHECKPOINT_INTERVAL, rotation: None };
        Ok(AuditLog { log: Arc::new(log), queue: Arc::default(), writer: Mutex::new(None) })
    }

    /// The log as the builders change it: before the first record, when no writer thread
    /// shares it yet.
    fn log_mut(&mut self) -> &mut Log {
        Arc::get_mut(&mut self.log).expect("AuditLog configured before its first record")
    }

    /// Sign checkpoints with `key`, every `every` records (a `seq` multiple of it; 0:
    /// never) or `interval`, whichever comes first. Without a key the log is chained but
    /// has no checkpoints.
    pub fn with_checkpoints(mut self, key: NoteKey, every: u64, interval: Duration) -> Self {
        let log = self.log_mut();
        log.key = Some(key);
        log.every = every;
        log.interval = interval;
        self
    }

    /// Rotate the log by size ([`rotate`]): before a record that would take the file past
    /// `rotation.max_size` bytes (and the file holds more than one line), it becomes a
    /// segment and the record goes to a new file whose first line is a checkpoint
    /// continuing the chain. Only with checkpoints ([`AuditLog::with_checkpoints`]):
    /// without a key nothing could vouch for where a segment starts, and the log is not
    /// rotated.
    pub fn with_rotation(mut self, rotation: Rotation) -> Self {
        self.log_mut().rotation = Some(rotation);
        self
    }

    pub fn path(&self) -> &Path {
        &self.log.path
    }

    /// Queue `job` for the writer thread (started when none runs); `wait`: with its
    /// [`Written`]. Errors (in the [`Written`]): [`AuditError::Write`] when no thread can be
    /// started (everything queued is then told it was not written).
    fn push(&self, job: Job, wait: bool) -> Option<Written> {
        let (written, start) = self.queue.push(job, wait);
        if start {
            let (log, queue) = (self.log.clone(), self.queue.clone());
            let spawned = std::thread::Builder::new().name("gw-audit".into()).spawn(move || {
                while let Some(batch) = queue.take(queue::BATCH_CAP, queue::WRITER_IDLE) {
                    log.write_batch(batch);
                }
            });
            match spawned {
                // The thread before it (if any) has ended or is ending: it is not joined.
                Ok(h) => *self.writer.lock().unwrap_or_else(|p| p.into_inner()) = Some(h),
                Err(e) => {
                    tracing::error!(path = %self.log.path.display(), error = %e, "cannot start the audit writer thread: records not written");
                    self.queue.no_writer();
                }
            }
        }
        written
    }

    /// Append one record: `v`, `time`, `seq` and `prev` first, then `record`'s keys in
    /// order, capped at [`MAX_RECORD`] bytes (see [`line`]); rotating the log first if the
    /// line would take it past its limit ([`AuditLog::with_rotation`]); then a checkpoint
    /// if one is due (in the same `write(2)`: neither or both).
    ///
    /// The whole line or nothing: the file is locked (`flock(2)`, which every writer of the
    /// log takes, in this process or another; if the path names another file once the lock
    /// is held, another writer rotated the log, and the path's file is opened and locked
    /// instead), its last line read back for `seq` and `prev` ([`chain::Head::of_file`]);
    /// if the write stops short (`ENOSPC` mid-line), the file is cut back to its end
    /// (`ftruncate(2)`). A rotation that fails (a full disk) leaves the log at the path as
    /// it was and is this record's error: the record is not written. Errors:
    /// [`AuditError::Write`] (nothing was added), [`AuditError::Undo`] (a cut record may
    /// remain), [`AuditError::Reserved`], [`AuditError::Open`] / [`AuditError::NotAFile`]
    /// (the path's new file cannot be opened).
    ///
    /// The line is made on the caller's thread and appended by the writer thread ([`queue`]);
    /// this waits for it (a thread that must not block: [`AuditLog::send`]).
    pub fn write(&self, record: Map<String, Value>) -> Result<(), AuditError> {
        self.send(record, true).map_or(Ok(()), Written::wait)
    }

    /// Queue `record` as [`AuditLog::write`] appends it; `wait`: with its [`Written`] (to
    /// `.await`), else None (nobody waits: it is still written, in order, and an error is
    /// only logged). Blocks only while the queue is full ([`queue::QUEUE_CAP`]).
    pub fn send(&self, record: Map<String, Value>, wait: bool) -> Option<Written> {
        let time = now_rfc3339();
        match line(&time, record) {
            Ok(line) => self.push(Job::Line { line, prefix: prefix_len(&time) }, wait),
            Err(e) => wait.then(|| Written::now(Err(e))),
        }
    }

    /// Append a gate decision as [`AuditLog::write`] does with `rec.into_map()` (the same
    /// line), serialized straight from the record rather than through a JSON map; `admit`:
    /// as its [`fields::EVENT_ADMIT`] record (the decision only, see `record::Fields`).
    /// Errors as [`AuditLog::write`].
    pub fn write_gate(&self, rec: &GateRecord, admit: bool) -> Result<(), AuditError> {
        self.send_gate(rec, admit, true).map_or(Ok(()), Written::wait)
    }

    /// Queue a gate decision as [`AuditLog::write_gate`] appends it; `wait` as in
    /// [`AuditLog::send`].
    pub fn send_gate(&self, rec: &GateRecord, admit: bool, wait: bool) -> Option<Written> {
        let time = now_rfc3339();
        let line = gate_line(&time, record::Fields { rec, admit });
        self.push(Job::Line { line, prefix: prefix_len(&time) }, wait)
    }

    /// Append a signed checkpoint of the chain as the file holds it once everything queued
    /// before is written, unless the file is empty or its last record already is one. Does
    /// nothing without a key. Errors as [`AuditLog::write`].
    pub fn checkpoint(&self) -> Result<(), AuditError> {
        if self.log.key.is_none() {
            return Ok(());
        }
        self.push(Job::Checkpoint, true).map_or(Ok(()), Written::wait)
    }

    /// fsync the log, once everything queued before is written.
    pub fn sync(&self) -> Result<(), AuditError> {
        self.push(Job::Flush, true).map_or(Ok(()), Written::wait)?;
        let w = self.log.file.lock().unwrap_or_else(|p| p.into_inner());
        w.file.sync_all().map_err(|source| AuditError::Write { path: self.log.path.clone(), source })
    }
}

impl Drop for AuditLog {
    /// What is queued is written, then the writer thread ends (and the file is closed).
    fn drop(&mut self) {
        self.queue.close();
        if let Some(t) = self.writer.get_mut().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = t.join();
        }
    }
}

impl Log {
    /// Write `batch` (the writer thread's): each job in order, under one lock, one
    /// `write(2)` for all (two around a rotation); each entry told how it went. A failure
    /// stops the batch: the entries not yet written are told its error.
    fn write_batch(&self, batch: Vec<Entry>) {
        let mut rest: VecDeque<Entry> = batch.into();
        if let Err(e) = self.at_head(|w, end, head| self.fill(w, end, head, &mut rest)) {
            for entry in rest.drain(..) {
                entry.done(Err(queue::again(&e)));
            }
        }
    }

    /// Under the lock (the file `end` bytes long, its chain at `head`): place `rest`'s jobs
    /// in the chain and append them, telling each entry once its bytes are written. Returns
    /// the error that stopped it; the entries still in `rest` are not written.
    fn fill(&self, w: &mut Writer, end: u64, head: chain::Head, rest: &mut VecDeque<Entry>) -> Result<(), AuditError> {
        let mut out = Batch { end, head, buf: String::new(), placed: Vec::new() };
        while let Some(entry) = rest.pop_front() {
            match &entry.job {
                Job::Line { line, prefix } => {
                    if self.rotation_due(out.end + out.buf.len() as u64, &out.head, line.len()) {
                        let rotated = self.flush(w, &mut out).and_then(|()| self.rotate(w, out.end, out.head.clone()));
                        match rotated {
                            Ok((end, head)) => (out.end, out.head) = (end, head),
                            Err(e) => {
                                rest.push_front(entry);
                                return Err(e);
                            }
                        }
                    }
                    let seq = out.head.seq + 1;
                    out.add(chain::place(line, *prefix, seq, &out.head.hash), false);
                    let due = (self.every != 0 && seq % self.every == 0) || w.last_checkpoint.elapsed() >= self.interval;
                    if due && self.key.is_some() {
                        out.add(self.checkpoint_line(seq, &out.head.hash, None)?, true);
                        w.last_checkpoint = Instant::now();
                    }
                }
                Job::Checkpoint => {
                    if self.key.is_some() && out.head.seq != 0 && !out.head.checkpoint {
                        out.add(self.checkpoint_line(out.head.seq, &out.head.hash, None)?, true);
                        w.last_checkpoint = Instant::now();
                    }
                }
                Job::Flush => {}
            }
            out.placed.push(entry);
        }
        self.flush(w, &mut out)
    }

    /// Append what `out` holds with one `write(2)` (or leave the file as it was), and tell
    /// its entries: Ok, or the write's error (also returned).
    fn flush(&self, w: &mut Writer, out: &mut Batch) -> Result<(), AuditError> {
        let result = if out.buf.is_empty() { Ok(()) } else { self.append(&w.file, out.end, &out.buf) };
        match &result {
            Ok(()) => {
                out.end += out.buf.len() as u64;
                w.known = Some((out.end, out.head.clone()));
                for entry in out.placed.drain(..) {
                    entry.done(Ok(()));
                }
            }
            Err(e) => {
                for entry in out.placed.drain(..) {
                    entry.done(Err(queue::again(e)));
                }
            }
        }
        out.buf.clear();
        result
    }

    /// Whether a line of `len` bytes after `end` (the head `head`) calls for a rotation first.
    fn rotation_due(&self, end: u64, head: &chain::Head, len: usize) -> bool {
        match (&self.rotation, &self.key) {
            (Some(r), Some(_)) => head.start > 0 && end + len as u64 > r.max_size,
            _ => false,
        }
    }

    /// Under the lock: close the file with a checkpoint (unless its last record is one),
    /// make the new file with its opening checkpoint, put it in place and the old file at
    /// its segment name ([`rotate::swap`]), and drop the segments beyond `keep`. Returns
    /// the new file's length and head. Errors: [`AuditError::Write`] (the log at the path
    /// is as it was, but for a closing checkpoint).
    fn rotate(&self, w: &mut Writer, end: u64, head: chain::Head) -> Result<(u64, chain::Head), AuditError> {
        let werr = |source| AuditError::Write { path: self.path.clone(), source };
        let (mut end, mut head) = (end, head);
        if !head.checkpoint {
            let closing = self.checkpoint_line(head.seq, &head.hash, None)?;
            self.append(&w.file, end, &closing)?;
            head = chain::Head { hash: chain::hash(closing.as_bytes()), seq: head.seq + 1, checkpoint: true, start: end };
            end += closing.len() as u64;
        }
        let segment = rotate::segment_path(&self.path, rotate::first_seq(&w.file, end).map_err(werr)?);
        let name = segment.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let opening = self.checkpoint_line(head.seq, &head.hash, Some(&name))?;
        let staged = rotate::staging_path(&self.path);
        let new = Self::stage(&staged, &w.file, &opening)
            .and_then(|new| rotate::swap(&self.path, &w.file, &staged, &segment).map(|()| new))
            .map_err(|e| {
                let _ = fs::remove_file(&staged);
                werr(e)
            })?;
        // The old file is closed, and its lock with it; the new one's (taken in stage) is held.
        w.file = new;
        w.last_checkpoint = Instant::now();
        tracing::info!(segment = %segment.display(), seq = head.seq + 1, "audit log rotated");
        if let Some(keep) = self.rotation.and_then(|r| r.keep) {
            for (p, e) in rotate::prune(&self.path, keep) {
                tracing::warn!("audit segment {} beyond --audit-keep not deleted: {e}", p.display());
            }
        }
        let head = chain::Head { hash: chain::hash(opening.as_bytes()), seq: head.seq + 1, checkpoint: true, start: 0 };
        Ok((opening.len() as u64, head))
    }

    /// The new file at `staged`: made (0640, then the old file's mode and group), locked,
    /// holding `opening`.
    fn stage(staged: &Path, old: &File, opening: &str) -> io::Result<File> {
        let _ = fs::remove_file(staged); // a leftover of a rotation of ours cut short
        let new = OpenOptions::new()
            .read(true)
            .append(true)
            .create_new(true)
            .mode(0o640)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(staged)?;
        let meta = old.metadata()?;
        std::os::unix::fs::fchown(&new, None, Some(meta.gid()))?;
        new.set_permissions(meta.permissions())?;
        flock(&new, libc::LOCK_EX)?;
        (&new).write_all(opening.as_bytes())?;
        Ok(new)
    }

    /// Run `f` with the file locked (this handle's mutex, then the `flock(2)` every writer
    /// shares), its length and the chain's head as the file holds it. When the path names
    /// another file once the lock is held (another writer rotated the log), that file is
    /// opened and locked instead.
    fn at_head<T>(&self, f: impl FnOnce(&mut Writer, u64, chain::Head) -> Result<T, AuditError>) -> Result<T, AuditError> {
        let mut guard = self.file.lock().unwrap_or_else(|p| p.into_inner());
        let w = &mut *guard;
        let werr = |source| AuditError::Write { path: self.path.clone(), source };
        let mut tries = 0;
        let end = loop {
            flock(&w.file, libc::LOCK_EX).map_err(werr)?;
            let current = rotate::current_len(&self.path, &w.file);
            if let Ok(Some(len)) = current {
                break len;
            }
            let _ = flock(&w.file, libc::LOCK_UN);
            current.map_err(werr)?;
            if tries == REOPEN_TRIES {
                return Err(werr(io::Error::other(format!("the log was replaced {REOPEN_TRIES} times while this writer waited"))));
            }
            w.known = None;
            w.file = open_file(&self.path)?;
            tries += 1;
        };
        // The length from the check above: the file is locked, so it holds.
        let mut locked = Locked(w);
        // Taken: only a successful append of this call sets it again.
        let head = match locked.known.take() {
            Some((len, head)) if len == end => head,
            _ => chain::Head::of_file(&locked.file, end).map_err(werr)?,
        };
        f(&mut locked, end, head)
    }

    /// The checkpoint record of the `size` records ending in `root`, as record `size + 1`
    /// (with `rotated_from`: a segment's opening checkpoint, the name in the record and in
    /// the signed note, see [`NoteKey::checkpoint`]). "" without a key.
    fn checkpoint_line(&self, size: u64, root: &[u8; 32], rotated_from: Option<&str>) -> Result<String, AuditError> {
        let Some(key) = &self.key else { return Ok(String::new()) };
        let mut m = Map::new();
        m.insert(fields::EVENT.into(), Value::from(fields::EVENT_CHECKPOINT));
        m.insert(fields::SIZE.into(), Value::from(size));
        if let Some(from) = rotated_from {
            m.insert(fields::ROTATED_FROM.into(), Value::from(from));
        }
        m.insert(fields::NOTE.into(), Value::from(key.checkpoint(size, root, rotated_from)));
        let time = now_rfc3339();
        Ok(chain::place(&line(&time, m)?, prefix_len(&time), size + 1, root))
    }

    /// Append `line` to `file` (locked, `end` bytes long), or leave it as it was.
    fn append(&self, file: &File, end: u64, line: &str) -> Result<(), AuditError> {
        // O_APPEND: the write lands at the end, after every other writer's.
        match (&*file).write_all(line.as_bytes()) {
            Ok(()) => Ok(()),
            Err(source) => match file.set_len(end) {
                Ok(()) => Err(AuditError::Write { path: self.path.clone(), source }),
                Err(undo) => Err(AuditError::Undo { path: self.path.clone(), source, undo }),
            },
        }
    }
}

/// The lines of a batch not yet written: they follow the file's `end` bytes, the last of
/// them is `head`; `placed` are the entries they (or nothing, for a flush) stand for.
struct Batch {
    end: u64,
    head: chain::Head,
    buf: String,
    placed: Vec<Entry>,
}

impl Batch {
    /// `line` (placed in the chain after `head`) added; it is the head now.
    fn add(&mut self, line: String, checkpoint: bool) {
        let start = self.end + self.buf.len() as u64;
        self.head = chain::Head { hash: chain::hash(line.as_bytes()), seq: self.head.seq + 1, checkpoint, start };
        self.buf.push_str(&line);
    }
}

/// `flock(2)` `op` (`LOCK_EX`, `LOCK_UN`) on `file`, again when interrupted.
fn flock(file: &File, op: libc::c_int) -> io::Result<()> {
    loop {
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// A writer whose file is locked; the file it holds when dropped (a rotation replaces it
/// with the new file, locked too) is unlocked.
struct Locked<'a>(&'a mut Writer);

impl std::ops::Deref for Locked<'_> {
    type Target = Writer;
    fn deref(&self) -> &Writer {
        self.0
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Writer {
        self.0
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        // Unlocking cannot fail in a way we could act on.
        let _ = flock(&self.0.file, libc::LOCK_UN);
    }
}

/// The serialized line (ending in `\n`) for `record` stamped with `time`, at most
/// [`MAX_RECORD`] bytes ([`cap::capped_line`] says what is cut when it is longer), with
/// `seq` and `prev` placeholders for [`chain::place`].
pub fn line(time: &str, record: Map<String, Value>) -> Result<String, AuditError> {
    let mut out = Map::with_capacity(record.len() + 4);
    out.insert(fields::V.into(), Value::from(fields::VERSION));
    out.insert(fields::TIME.into(), Value::from(time));
    out.insert(fields::SEQ.into(), Value::from(chain::SEQ_PLACEHOLDER));
    out.insert(fields::PREV.into(), Value::from(chain::PREV_PLACEHOLDER));
    for (k, v) in record {
        if [fields::V, fields::TIME, fields::SEQ, fields::PREV].contains(&k.as_str()) {
            return Err(AuditError::Reserved(k));
        }
        out.insert(k, v);
    }
    Ok(cap::capped_line(out))
}

/// The line of a gate record (`fields`) stamped `time`: the same bytes as [`line`] of its
/// map, written without building one; a line over [`MAX_RECORD`] bytes goes through [`line`]
/// (and [`cap::capped_line`]) instead.
fn gate_line(time: &str, rec: record::Fields) -> String {
    let mut out = Vec::with_capacity(768);
    out.extend_from_slice(format!("{{\"{}\":{},\"{}\":{}", fields::V, fields::VERSION, fields::TIME, escape::to_string(time)).as_bytes());
    out.extend_from_slice(format!(",\"{}\":{},\"{}\":\"{}\"", fields::SEQ, chain::SEQ_PLACEHOLDER, fields::PREV, chain::PREV_PLACEHOLDER).as_bytes());
    let open = out.len();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, escape::ControlEscaping);
    // A record always has `run`: its object is never empty, so its `{` becomes the `,`
    // after `prev`. Serializing into a Vec cannot fail.
    if rec.serialize(&mut ser).is_ok() && out.get(open) == Some(&b'{') && out.len() < MAX_RECORD {
        out[open] = b',';
        out.push(b'\n');
        if let Ok(s) = String::from_utf8(out) {
            return s;
        }
    }
    let map = match serde_json::to_value(rec) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    };
    // The record's keys are never reserved ones.
    line(time, map).unwrap_or_default()
}

/// The length of a line's `{"v":1,"time":"..."` (what precedes `seq`).
fn prefix_len(time: &str) -> usize {
    format!("{{\"{}\":{},\"{}\":{}", fields::V, fields::VERSION, fields::TIME, escape::to_string(time)).len()
}

/// Now, as `2026-11-29T09:16:42.123456Z`.
pub fn now_rfc3339() -> String {
    format_time(time::OffsetDateTime::now_utc())
}

pub fn format_time(t: time::OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.microsecond()
    )
}
