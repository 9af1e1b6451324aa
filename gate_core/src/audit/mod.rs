//! The audit log: JSON lines appended with one `write(2)` each, at most [`MAX_RECORD`]
//! bytes a line, never a cut one; every control character escaped ([`escape`]); each line
//! chained to the one before it by its hash ([`chain`]), with signed checkpoints of the
//! chain ([`note`]) every [`CHECKPOINT_RECORDS`] records or [`CHECKPOINT_INTERVAL`], and
//! when asked ([`AuditLog::checkpoint`], at each run's end).

mod cap;
pub mod chain;
pub mod escape;
pub mod fields;
pub mod note;
mod record;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_chain;

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

use crate::root_dir::{self, UnsafeDir};

pub use cap::MAX_RECORD;
pub use note::{KeyError, NoteKey};
pub use record::GateRecord;

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

/// An append-only JSON-lines file, shared by the gate and the Python side.
#[derive(Debug)]
pub struct AuditLog {
    path: PathBuf,
    file: Mutex<Writer>,
    key: Option<NoteKey>,
    every: u64,
    interval: Duration,
}

#[derive(Debug)]
struct Writer {
    file: File,
    /// When this writer last checkpointed (or opened the log).
    last_checkpoint: Instant,
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
        let not_a_file = |path: &Path| {
            fs::symlink_metadata(path)
                .ok()
                .filter(|m| !m.is_file())
                .map(|m| AuditError::NotAFile { path: path.to_path_buf(), what: kind_of(m.file_type()) })
        };
        // Read too: a writer reads the last line back for the chain.
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o640)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&path)
            .map_err(|source| not_a_file(&path).unwrap_or(AuditError::Open { path: path.clone(), source }))?;
        let meta = file.metadata().map_err(|source| AuditError::Open { path: path.clone(), source })?;
        if !meta.is_file() {
            return Err(AuditError::NotAFile { path, what: kind_of(meta.file_type()) });
        }
        // SAFETY: fcntl on a descriptor we own; F_GETFL/F_SETFL take and return flags only.
        let cleared = unsafe {
            let flags = libc::fcntl(file.as_raw_fd(), libc::F_GETFL);
            flags >= 0 && libc::fcntl(file.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK) == 0
        };
        if !cleared {
            return Err(AuditError::Open { path, source: io::Error::last_os_error() });
        }
        let file = Mutex::new(Writer { file, last_checkpoint: Instant::now() });
        Ok(AuditLog { path, file, key: None, every: CHECKPOINT_RECORDS, interval: CHECKPOINT_INTERVAL })
    }

    /// Sign checkpoints with `key`, every `every` records (a `seq` multiple of it; 0:
    /// never) or `interval`, whichever comes first. Without a key the log is chained but
    /// has no checkpoints.
    pub fn with_checkpoints(mut self, key: NoteKey, every: u64, interval: Duration) -> Self {
        self.key = Some(key);
        self.every = every;
        self.interval = interval;
        self
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Append one record: `v`, `time`, `seq` and `prev` first, then `record`'s keys in
    /// order, capped at [`MAX_RECORD`] bytes (see [`line`]); then a checkpoint if one is
    /// due (one that cannot be written is retried with the next record, and is not this
    /// record's error).
    ///
    /// The whole line or nothing: the file is locked (`flock(2)`, which every writer of the
    /// log takes, in this process or another), its last line read back for `seq` and
    /// `prev` ([`chain::Head::of_file`]); if the write stops short (`ENOSPC` mid-line), the
    /// file is cut back to its end (`ftruncate(2)`). Errors: [`AuditError::Write`]
    /// (nothing was added), [`AuditError::Undo`] (a cut record may remain),
    /// [`AuditError::Reserved`].
    pub fn write(&self, record: Map<String, Value>) -> Result<(), AuditError> {
        let time = now_rfc3339();
        let line = line(&time, record)?;
        self.at_head(|file, last_checkpoint, end, head| {
            let line = chain::place(&line, prefix_len(&time), head.seq + 1, &head.hash);
            self.append(file, end, &line)?;
            let seq = head.seq + 1;
            let due = (self.every != 0 && seq % self.every == 0) || last_checkpoint.elapsed() >= self.interval;
            if due && self.key.is_some() {
                let end = end + line.len() as u64;
                match self.append_checkpoint(file, end, seq, &chain::hash(line.as_bytes())) {
                    Ok(()) => *last_checkpoint = Instant::now(),
                    Err(e) => tracing::warn!("audit checkpoint not written, retried with the next record: {e}"),
                }
            }
            Ok(())
        })
    }

    /// Run `f` with the file under both locks (this handle's mutex, then the `flock(2)`
    /// every writer shares), its length and the chain's head as the file holds it.
    fn at_head<T>(
        &self,
        f: impl FnOnce(&File, &mut Instant, u64, chain::Head) -> Result<T, AuditError>,
    ) -> Result<T, AuditError> {
        let mut guard = self.file.lock().unwrap_or_else(|p| p.into_inner());
        let Writer { file, last_checkpoint } = &mut *guard;
        let werr = |source| AuditError::Write { path: self.path.clone(), source };
        let _lock = Flock::exclusive(file).map_err(werr)?;
        let end = file.metadata().map_err(werr)?.len();
        let head = chain::Head::of_file(file, end).map_err(werr)?;
        f(file, last_checkpoint, end, head)
    }

    /// Append a signed checkpoint of the chain as the file holds it, unless the file is
    /// empty or its last record already is one. Does nothing without a key. Errors as
    /// [`AuditLog::write`].
    pub fn checkpoint(&self) -> Result<(), AuditError> {
        if self.key.is_none() {
            return Ok(());
        }
        self.at_head(|file, last_checkpoint, end, head| {
            if head.seq == 0 || head.checkpoint {
                return Ok(());
            }
            self.append_checkpoint(file, end, head.seq, &head.hash)?;
            *last_checkpoint = Instant::now();
            Ok(())
        })
    }

    /// Under the lock: the checkpoint record of the `size` records ending in `root`, as
    /// record `size + 1`.
    fn append_checkpoint(&self, file: &File, end: u64, size: u64, root: &[u8; 32]) -> Result<(), AuditError> {
        let Some(key) = &self.key else { return Ok(()) };
        let mut m = Map::new();
        m.insert(fields::EVENT.into(), Value::from(fields::EVENT_CHECKPOINT));
        m.insert(fields::SIZE.into(), Value::from(size));
        m.insert(fields::NOTE.into(), Value::from(key.checkpoint(size, root)));
        let time = now_rfc3339();
        let line = chain::place(&line(&time, m)?, prefix_len(&time), size + 1, root);
        self.append(file, end, &line)
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

    /// fsync the log.
    pub fn sync(&self) -> Result<(), AuditError> {
        let w = self.file.lock().unwrap_or_else(|p| p.into_inner());
        w.file.sync_all().map_err(|source| AuditError::Write { path: self.path.clone(), source })
    }
}

/// An exclusive `flock(2)` on a file, released on drop.
struct Flock<'a>(&'a File);

impl<'a> Flock<'a> {
    fn exclusive(file: &'a File) -> io::Result<Flock<'a>> {
        loop {
            // SAFETY: flock on a descriptor we own.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(Flock(file));
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

impl Drop for Flock<'_> {
    fn drop(&mut self) {
        // SAFETY: flock on a descriptor we own; unlocking cannot fail in a way we could act on.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
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
