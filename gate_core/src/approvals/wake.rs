//! Wake-ups of a run's held requests: only a hint to re-read the store (the truth), which
//! the gate also re-reads at least every second. SQLite: a unix datagram socket of the run
//! (`/run/gatewrap/<run-id>/control.sock`, the directory root-only 0700, outside any sandbox
//! view) receives the approval id. PostgreSQL: a connection of its own `LISTEN`s on
//! `gatewrap_approvals` (NOTIFY payload = the id).

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

/// How often the listener thread looks at its stop flag.
const POLL: Duration = Duration::from_millis(500);

/// A listening thread; stops when dropped.
pub struct Listener {
    /// The address to register in `runs.wake` (SQLite: the socket path; PostgreSQL: none).
    pub address: Option<String>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    dir: Option<PathBuf>,
}

impl Listener {
    /// Start listening for wake-ups of `run_id` in the store at `url`, calling `on_wake(id)`
    /// on a thread of its own. SQLite: binds `<run_dir>/<run_id>/control.sock`.
    /// Errors: the directory or socket cannot be made, or PostgreSQL refuses the connection.
    pub fn start(url: &str, run_id: &str, run_dir: &str, on_wake: impl Fn(&str) + Send + 'static) -> Result<Listener, String> {
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
                                // The connection broke: waiters fall back to re-reading every second.
                                Err(_) => return,
                            }
                        }
                    }
                })
                .map_err(|e| e.to_string())?;
            return Ok(Listener { address: None, stop, thread: Some(thread), dir: None });
        }
        let dir = PathBuf::from(run_dir).join(run_id);
        fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let path = dir.join("control.sock");
        let _ = fs::remove_file(&path);
        let sock = UnixDatagram::bind(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        sock.set_read_timeout(Some(POLL)).map_err(|e| e.to_string())?;
        let thread = std::thread::Builder::new()
            .name("approvals-wake".into())
            .spawn(move || {
                let mut buf = [0u8; 256];
                while !flag.load(Ordering::Relaxed) {
                    if let Ok(n) = sock.recv(&mut buf) {
                        if let Ok(id) = std::str::from_utf8(&buf[..n]) {
                            on_wake(id);
                        }
                    }
                }
            })
            .map_err(|e| e.to_string())?;
        Ok(Listener { address: Some(path.to_string_lossy().into_owned()), stop, thread: Some(thread), dir: Some(dir) })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(dir) = self.dir.take() {
            let _ = fs::remove_dir_all(dir);
        }
    }
}
