//! The embedded backend: SQLite (rusqlite, bundled) in WAL mode with a 5 s busy timeout and
//! `synchronous = NORMAL`: a commit survives a crash of any process (it is in the WAL), not
//! a power cut (the WAL is synced at checkpoints). The at-most-once holds either way: a
//! claim lost to a power cut went with the agent's connection, so nothing can be re-sent. Wake-ups: a datagram with the approval id to the run's unix socket (`wake`).
//! Sources: <https://www.sqlite.org/wal.html>, <https://www.sqlite.org/pragma.html>.

use std::fs;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::time::Duration;

use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{Connection, ToSql};

use crate::root_dir::{self, UnsafeDir};

use super::sql::{schema, version_mismatch, SCHEMA_VERSION};
use super::{Db, Val};

pub enum OpenError {
    Io(std::io::Error),
    Db(String),
    /// The file or its folder is not root's alone: the message says why and what to do.
    Unsafe(String),
    /// A read or a decision named a store that does not exist (none is made for it).
    Missing(String),
}

/// Side files SQLite keeps beside the database (<https://www.sqlite.org/tempfiles.html>):
/// the write-ahead log, its shared-memory index, the rollback journal.
const SIDE_FILES: [&str; 3] = ["-wal", "-shm", "-journal"];

/// `path` (if it exists) is a regular file, not a symbolic link, of the gate's user (root)
/// with no permission for group or others (0600): a file another user made or may write
/// could hold approvals of their making, or be read for the review tokens in it.
fn check_file(path: &Path) -> Result<(), OpenError> {
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(OpenError::Io(e)),
    };
    let shown = path.display();
    let fix = format!(
        "if you trust what is in it: chown root:root {shown} && chmod 0600 {shown}; else remove it (a local user \
         could have written approvals or decisions into it)"
    );
    if meta.file_type().is_symlink() || !meta.is_file() {
        return Err(OpenError::Unsafe(format!("{shown} is a symbolic link or not a regular file; remove it")));
    }
    // SAFETY: geteuid has no preconditions.
    if meta.uid() != unsafe { libc::geteuid() } {
        return Err(OpenError::Unsafe(format!("{shown} is not root's (owner uid {}): {fix}", meta.uid())));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(OpenError::Unsafe(format!("{shown} has mode {mode:04o}, not 0600 (others may read or write it): {fix}")));
    }
    Ok(())
}

/// Whether `dir` is on a file system mounted read-only (statvfs(3) `ST_RDONLY`); false if
/// it cannot be asked (SQLite's own error then says what went wrong).
fn read_only_fs(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else { return false };
    // SAFETY: statvfs fills the zeroed struct; `c` is a NUL-terminated path alive for the call.
    unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        libc::statvfs(c.as_ptr(), &mut st) == 0 && st.f_flag & libc::ST_RDONLY != 0
    }
}

/// A folder that fails [`root_dir::check`], as [`OpenError::Unsafe`] with what to do.
fn unsafe_dir(e: UnsafeDir) -> OpenError {
    match e {
        UnsafeDir::Io { source, .. } => OpenError::Io(source),
        e => OpenError::Unsafe(format!(
            "the store's folder: {e}; keep the store in a folder of root's that only root may write \
             (chown root:root, chmod 0700), or choose another with --state"
        )),
    }
}

impl ToSql for Val {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match self {
            Val::Null => ValueRef::Null,
            Val::Int(v) => ValueRef::Integer(*v),
            Val::Real(v) => ValueRef::Real(*v),
            Val::Text(s) => ValueRef::Text(s.as_bytes()),
            Val::Blob(b) => ValueRef::Blob(b),
        }))
    }
}

fn val_of(v: ValueRef<'_>) -> Val {
    match v {
        ValueRef::Null => Val::Null,
        ValueRef::Integer(i) => Val::Int(i),
        ValueRef::Real(f) => Val::Real(f),
        ValueRef::Text(t) => Val::Text(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Blob(b) => Val::Blob(b.to_vec()),
    }
}

pub struct Lite {
    conn: Connection,
    /// Unbound datagram socket for wake-ups.
    waker: Option<UnixDatagram>,
}

impl Lite {
    /// Open the database file at `path`; if `create`, make it (and its folder, 0700, the
    /// missing folders above it 0755) when missing.
    ///
    /// The folder is checked as the audit log's ([`root_dir::check`]: root's, not writable
    /// by group or others, not a symbolic link, the folders above it root's and not writable
    /// by others unless sticky), so no other user can swap the file between this check and
    /// SQLite's open; the file and its side files (`-wal`, `-shm`, `-journal`) must be root's
    /// regular files with mode 0600 ([`check_file`]). Errors: [`OpenError::Unsafe`] (why and
    /// what to do), [`OpenError::Missing`] (not `create`), [`OpenError::Io`], [`OpenError::Db`].
    pub fn open(path: &Path, create: bool) -> Result<Lite, OpenError> {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let missing = || OpenError::Missing(format!("{} does not exist", path.display()));
        match fs::symlink_metadata(dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !create => return Err(missing()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => root_dir::ensure(dir, 0o700, 0o022).map_err(unsafe_dir)?,
            _ => root_dir::check(dir, 0o022).map_err(unsafe_dir)?,
        }
        for side in std::iter::once("").chain(SIDE_FILES) {
            let mut p = path.as_os_str().to_os_string();
            p.push(side);
            check_file(Path::new(&p))?;
        }
        if !create && fs::symlink_metadata(path).is_err() {
            return Err(missing());
        }
        // SQLite would only say "unable to open database file": every use of the store writes
        // (the schema, WAL's -shm index), so a read-only file system is said as such.
        if read_only_fs(dir) {
            return Err(OpenError::Io(std::io::Error::from_raw_os_error(libc::EROFS)));
        }
        // A new file is made 0600 at creation (O_CREAT|O_EXCL, open(2)), before SQLite opens
        // it: no moment in which another user could open it and keep the descriptor. SQLite
        // gives the -wal and -shm files the database file's permissions.
        match fs::OpenOptions::new().write(true).create_new(true).mode(0o600).custom_flags(libc::O_NOFOLLOW).open(path) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(OpenError::Io(e)),
        }
        let conn = Connection::open(path).map_err(|e| OpenError::Db(e.to_string()))?;
        let db = |e: rusqlite::Error| OpenError::Db(e.to_string());
        conn.busy_timeout(Duration::from_secs(5)).map_err(db)?;
        let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0)).map_err(db)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(OpenError::Db(format!("cannot use write-ahead logging (journal_mode is {mode})")));
        }
        conn.execute_batch("PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON;").map_err(db)?;
        conn.execute_batch(&format!("BEGIN IMMEDIATE; {} COMMIT;", schema("REAL", "INTEGER", "BLOB"))).map_err(db)?;
        let found: String = conn.query_row("SELECT value FROM meta WHERE key = 'schema'", [], |r| r.get(0)).map_err(db)?;
        if found != SCHEMA_VERSION {
            return Err(OpenError::Db(version_mismatch(&found)));
        }
        Ok(Lite { conn, waker: UnixDatagram::unbound().ok() })
    }
}

impl Db for Lite {
    fn exec(&mut self, sql: &str, params: &[Val]) -> Result<u64, String> {
        if params.is_empty() {
            return self.conn.execute_batch(sql).map(|_| 0).map_err(|e| e.to_string());
        }
        let mut st = self.conn.prepare_cached(sql).map_err(|e| e.to_string())?;
        st.execute(rusqlite::params_from_iter(params.iter())).map(|n| n as u64).map_err(|e| e.to_string())
    }

    fn query(&mut self, sql: &str, params: &[Val]) -> Result<Vec<Vec<Val>>, String> {
        let mut st = self.conn.prepare_cached(sql).map_err(|e| e.to_string())?;
        let n = st.column_count();
        let rows = st
            .query_map(rusqlite::params_from_iter(params.iter()), |r| (0..n).map(|i| r.get_ref(i).map(val_of)).collect())
            .map_err(|e| e.to_string())?;
        rows.collect::<Result<Vec<Vec<Val>>, _>>().map_err(|e| e.to_string())
    }

    fn begin(&mut self) -> Result<(), String> {
        self.conn.execute_batch("BEGIN IMMEDIATE").map_err(|e| e.to_string())
    }

    fn lock_asks(&mut self) -> Result<(), String> {
        Ok(())
    }

    fn wake(&mut self, run_wake: Option<&str>, id: &str) {
        if let (Some(sock), Some(path)) = (&self.waker, run_wake) {
            let _ = sock.send_to(id.as_bytes(), path);
        }
    }
}
