//! The audit log: JSON lines appended with one `write(2)` each.

pub mod fields;
mod record;
#[cfg(test)]
mod tests;

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::{Map, Value};

pub use record::GateRecord;

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("cannot create audit log directory {path}: {source}")]
    Dir { path: PathBuf, source: io::Error },
    #[error("cannot open audit log {path}: {source}")]
    Open { path: PathBuf, source: io::Error },
    #[error("cannot write audit log {path}: {source}")]
    Write { path: PathBuf, source: io::Error },
    #[error("audit record must not set the reserved key {0:?}")]
    Reserved(String),
}

impl AuditError {
    pub fn io(&self) -> Option<&io::Error> {
        match self {
            AuditError::Dir { source, .. }
            | AuditError::Open { source, .. }
            | AuditError::Write { source, .. } => Some(source),
            AuditError::Reserved(_) => None,
        }
    }
}

/// An append-only JSON-lines file, shared by the gate and the Python side.
#[derive(Debug)]
pub struct AuditLog {
    path: PathBuf,
    file: Mutex<File>,
}

impl AuditLog {
    /// Open (create) `path` with mode 0640, creating missing parents with mode 0750. A
    /// symbolic link at `path` is refused (`ELOOP`), never followed.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, AuditError> {
        let path = path.as_ref().to_path_buf();
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            DirBuilder::new()
                .recursive(true)
                .mode(0o750)
                .create(parent)
                .map_err(|source| AuditError::Dir { path: parent.to_path_buf(), source })?;
        }
        let file = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o640)
            // O_NOFOLLOW: a symlink planted where the log goes (by an agent, in a folder it
            // can write) must not make root append to the file it points to (open(2)).
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|source| AuditError::Open { path: path.clone(), source })?;
        Ok(AuditLog { path, file: Mutex::new(file) })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Append one record: `v` and `time` first, then `record`'s keys in order.
    pub fn write(&self, record: Map<String, Value>) -> Result<(), AuditError> {
        let line = line(&now_rfc3339(), record)?;
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        // One write(2) for the whole line: O_APPEND makes it land after every other append.
        file.write_all(line.as_bytes())
            .map_err(|source| AuditError::Write { path: self.path.clone(), source })
    }

    /// fsync the log.
    pub fn sync(&self) -> Result<(), AuditError> {
        let file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        file.sync_all().map_err(|source| AuditError::Write { path: self.path.clone(), source })
    }
}

/// The serialized line (ending in `\n`) for `record` stamped with `time`.
pub fn line(time: &str, record: Map<String, Value>) -> Result<String, AuditError> {
    let mut out = Map::with_capacity(record.len() + 2);
    out.insert(fields::V.into(), Value::from(fields::VERSION));
    out.insert(fields::TIME.into(), Value::from(time));
    for (k, v) in record {
        if k == fields::V || k == fields::TIME {
            return Err(AuditError::Reserved(k));
        }
        out.insert(k, v);
    }
    // Serializing a Map of plain JSON values cannot fail; fall back to an empty object anyway.
    let mut s = serde_json::to_string(&Value::Object(out)).unwrap_or_else(|_| "{}".into());
    s.push('\n');
    Ok(s)
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
