//! Wake-ups of a run's held requests: only a hint to re-read the store (the truth), which
//! the gate also re-reads on its own (`[approvals] reread`, 1 s by default). SQLite: a unix
//! datagram socket of the run (`/run/gatewrap/<run-id>/control.sock`, the directory
//! root-only 0700, outside any sandbox view) receives the approval id, read by a task on the
//! gate's runtime: the worker woken by the datagram is the one that asks the store, no
//! thread in between. PostgreSQL: a connection of its own `LISTEN`s on `gatewrap_approvals`
//! (NOTIFY payload = the id), on a thread (the synchronous client blocks).

use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use postgres::fallible_iterator::FallibleIterator;

/// Where the runs' wake sockets live.
pub const RUN_DIR: &str = "/run/gatewrap";

/// How often the PostgreSQL listener thread looks at its stop flag.
const POLL: Duration = Duration::from_millis(500);

/// A listening task (SQLite) or thread (PostgreSQL); stops when dropped.
pub struct Listener {
    /// The address to register in `runs.wake` (SQLite: the socket path; PostgreSQL: none).
    pub address: Option<String>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    task: Option<tokio::task::AbortHandle>,
    dir: Option<PathBuf>,
}

impl Listener {
    /// Start listening for wake-ups of `run_id` in the store at `url`, calling `on_wake(id)`
    /// for each. SQLite: binds `<run_dir>/<run_id>/control.sock` and reads it on a task of
    /// `rt`; PostgreSQL: on a thread of its own.
    /// Errors: the directory or socket cannot be made, or PostgreSQL refuses the connection.
    pub fn start(url: &str, run_id: &str, run_dir: &str, rt: &tokio::runtime::Handle, on_wake: impl Fn(&str) + Send + 'static) -> Result<Listener, String> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        if url.starts_with("postgresql://") || url.starts_with("postgres://") {
            let mut client = postgres::Client::connect(url, postgres::NoTls).map_err(|e| e.to_string())?;
            client.batch_execute(&format!("LISTEN {}", super::store::PG_CHANNEL)).map_err(|e| e.to_string())?;
            let thread = std::thread::Builder::new()
                .name("approvals-listen".into())
                .spawn(move || {
                    while !flag.load(Ordering::Relaxed) {
                        let mut n = client.notifications();
                        let mut it = n.timeout_iter(POLL);
                        loop {
                            match it.next() {
                                Ok(Some(note)) => on_wake(note.payload()),
                                Ok(None) => break,
                                // The connection broke: waiters fall back to re-reading the store (`[approvals] reread`).
                                Err(_) => return,
                            }
                        }
                    }
                })
                .map_err(|e| e.to_string())?;
            return Ok(Listener { address: None, stop, thread: Some(thread), task: None, dir: None });
        }
        let dir = PathBuf::from(run_dir).join(run_id);
        fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let path = dir.join("control.sock");
        let _ = fs::remove_file(&path);
        let sock = UnixDatagram::bind(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        sock.set_nonblocking(true).map_err(|e| e.to_string())?;
        let sock = {
            let _in = rt.enter();
            tokio::net::UnixDatagram::from_std(sock).map_err(|e| e.to_string())?
        };
        let task = rt.spawn(async move {
            let mut buf = [0u8; 256];
            // An error of a datagram socket's recv is its own (none is expected); the
            // waiters fall back to re-reading the store.
            while let Ok(n) = sock.recv(&mut buf).await {
                if let Ok(id) = std::str::from_utf8(&buf[..n]) {
                    on_wake(id);
                }
            }
        });
        Ok(Listener {
            address: Some(path.to_string_lossy().into_owned()),
            stop,
            thread: None,
            task: Some(task.abort_handle()),
            dir: Some(dir),
        })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.task.take() {
            t.abort();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(dir) = self.dir.take() {
            let _ = fs::remove_dir_all(dir);
        }
    }
}
