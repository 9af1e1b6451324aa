//! The embedded backend: SQLite (rusqlite, bundled) in WAL mode with a 5 s busy timeout and
//! `synchronous = NORMAL`: a commit survives a crash of any process (it is in the WAL), not
//! a power cut (the WAL is synced at checkpoints). The at-most-once holds either way: a
//! claim lost to a power cut went with the agent's connection, so nothing can be re-sent. Wake-ups: a datagram with the approval id to the run's unix socket (`wake`).
//! Sources: <https://www.sqlite.org/wal.html>, <https://www.sqlite.org/pragma.html>.

use std::fs;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::time::Duration;

use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{Connection, ToSql};

use super::sql::{schema, version_mismatch, SCHEMA_VERSION};
use super::{Db, Val};

pub enum OpenError {
    Io(std::io::Error),
    Db(String),
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
    /// Open or create the database file at `path` (its directory created 0700 if missing,
    /// the file made 0600: it holds review tokens and request bodies).
    pub fn open(path: &Path) -> Result<Lite, OpenError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            if !dir.exists() {
                fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(OpenError::Io)?;
            }
        }
        // A new file is made 0600 at creation (O_CREAT|O_EXCL, open(2)), before SQLite opens
        // it: no moment in which another user could open it and keep the descriptor. SQLite
        // gives the -wal and -shm files the database file's permissions.
        match fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path) {
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

    fn wake(&mut self, run_wake: Option<&str>, id: &str) {
        if let (Some(sock), Some(path)) = (&self.waker, run_wake) {
            let _ = sock.send_to(id.as_bytes(), path);
        }
    }
}
