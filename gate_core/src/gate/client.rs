//! Which sandbox process holds a connection to the gate: found once per connection, from the
//! client socket's inode, and named in every record of that connection (`client_pid`,
//! `client_comm`).
//!
//! The client's socket is the one of the sandbox's TCP table (`/proc/PID/net/tcp{,6}` of
//! any of its processes: the table is the netns's, proc(5)) whose local address is the
//! connection's peer and whose remote address is the gate's; its owner is the process of
//! the run's cgroup (`cgroup.procs`, the run's and the cgroups below) with a descriptor on
//! `socket:[INODE]` (`/proc/PID/fd`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use procfs::process::{FDTarget, Process};

/// How long a connection's lookup may take before its records say `client_pid: null`.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_millis(500);
/// Most processes whose descriptors one lookup reads.
const MAX_PROCS: usize = 4096;
/// Most cgroups (the run's and those below it) one lookup lists.
const MAX_CGROUPS: usize = 64;

/// The process behind a connection: `pid` None when it could not be found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Client {
    pub pid: Option<u32>,
    pub comm: Option<String>,
}

/// The pids of the processes in `cgroup` and the cgroups below it (at most [`MAX_PROCS`]
/// pids from [`MAX_CGROUPS`] cgroups).
fn procs(cgroup: &Path) -> Vec<i32> {
    let mut dirs = vec![cgroup.to_path_buf()];
    let mut pids = Vec::new();
    let mut seen = 0;
    while let Some(dir) = dirs.pop() {
        seen += 1;
        if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
            pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
        }
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries.flatten() {
                if seen + dirs.len() < MAX_CGROUPS && e.file_type().is_ok_and(|t| t.is_dir()) {
                    dirs.push(e.path());
                }
            }
        }
        if pids.len() >= MAX_PROCS {
            pids.truncate(MAX_PROCS);
            break;
        }
    }
    pids
}

/// The inode of the socket, in the TCP tables `proc` sees, whose local address is `client`
/// and whose remote address is `gate` (addresses compared without IPv6 scope and flow).
fn socket_inode(proc: &Process, client: SocketAddr, gate: SocketAddr) -> Option<u64> {
    let same = |a: SocketAddr, b: SocketAddr| a.ip() == b.ip() && a.port() == b.port();
    let tables = [proc.tcp(), proc.tcp6()];
    tables
        .into_iter()
        .flatten()
        .flatten()
        .find(|e| same(e.local_address, client) && same(e.remote_address, gate))
        .map(|e| e.inode)
}

/// The process of the run's cgroup (`cgroup`) holding the client end of the connection
/// from `client` to `gate`, and its command name (`/proc/PID/comm`). None when no process
/// of the run has it (it is gone, or gave the socket away).
pub fn owner(cgroup: &Path, client: SocketAddr, gate: SocketAddr) -> Option<(u32, String)> {
    let pids = procs(cgroup);
    let inode = pids.iter().find_map(|&p| Process::new(p).ok().and_then(|p| socket_inode(&p, client, gate)))?;
    for pid in pids {
        let Ok(proc) = Process::new(pid) else { continue };
        let Ok(fds) = proc.fd() else { continue };
        if fds.flatten().any(|fd| matches!(fd.target, FDTarget::Socket(i) if i == inode)) {
            let comm = proc.stat().map(|s| s.comm).unwrap_or_default();
            return Some((u32::try_from(pid).ok()?, comm));
        }
    }
    None
}

/// The clients of the open connections, by peer address, for the records of each.
#[derive(Debug, Default)]
pub struct Clients {
    run_cgroup: Option<PathBuf>,
    open: Mutex<HashMap<SocketAddr, (u64, Client)>>,
    next: AtomicU64,
}

/// A connection's entry in [`Clients`], removed when the last holder (the connection, or
/// the tunnel it became) drops it.
pub struct Registration {
    clients: Arc<Clients>,
    peer: SocketAddr,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut open = self.clients.open.lock().unwrap_or_else(|p| p.into_inner());
        if open.get(&self.peer).is_some_and(|(id, _)| *id == self.id) {
            open.remove(&self.peer);
        }
    }
}

impl Clients {
    /// Attribution for the run whose cgroup directory is `run_cgroup`; none (no
    /// `client_pid` in records) without one.
    pub fn new(run_cgroup: Option<PathBuf>) -> Clients {
        Clients { run_cgroup, ..Clients::default() }
    }

    /// Find the process behind the connection from `peer` to `local` (on a blocking thread,
    /// at most [`LOOKUP_TIMEOUT`]) and register it until the returned registration drops.
    /// None when the gate has no run cgroup to look in.
    pub async fn register(self: &Arc<Self>, peer: SocketAddr, local: SocketAddr) -> Option<Registration> {
        let cgroup = self.run_cgroup.clone()?;
        let lookup = tokio::task::spawn_blocking(move || owner(&cgroup, peer, local));
        let found = match tokio::time::timeout(LOOKUP_TIMEOUT, lookup).await {
            Ok(Ok(found)) => found,
            _ => None,
        };
        let client = match found {
            Some((pid, comm)) => Client { pid: Some(pid), comm: Some(comm) },
            None => Client::default(),
        };
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.open.lock().unwrap_or_else(|p| p.into_inner()).insert(peer, (id, client));
        Some(Registration { clients: self.clone(), peer, id })
    }

    /// The client of the open connection from `peer`; None when it was not looked up.
    pub fn of(&self, peer: SocketAddr) -> Option<Client> {
        self.open.lock().unwrap_or_else(|p| p.into_inner()).get(&peer).map(|(_, c)| c.clone())
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::net::TcpListener;
    use std::process::{Command, Stdio};
    use std::time::Instant;

    /// The cost of one lookup (what a connection waits for before its first request is
    /// read): a cgroup of its own holding 10 idle processes and one holding a connection to
    /// a listener of this test. Needs root and cgroup v2 at /sys/fs/cgroup/unified (this machine's):
    /// `cargo test -q -p gate_core --lib lookup_cost -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn lookup_cost() {
        let cg = std::path::PathBuf::from(format!("/sys/fs/cgroup/unified/gw-lookup-bench-{}", std::process::id()));
        std::fs::create_dir(&cg).expect("mkdir the bench cgroup (root, cgroup v2)");
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let gate = listener.local_addr().unwrap();
        let mut kids: Vec<_> = (0..10).map(|_| Command::new("sleep").arg("30").spawn().unwrap()).collect();
        let script = format!("import socket,time\ns=socket.create_connection(('127.0.0.1',{}))\nprint(s.getsockname()[1],flush=True)\ntime.sleep(30)", gate.port());
        let holder = Command::new("python3").args(["-c", &script]).stdout(Stdio::piped()).spawn().unwrap();
        let (_conn, client) = listener.accept().unwrap();
        kids.push(holder);
        for k in &kids {
            std::fs::File::options().write(true).open(cg.join("cgroup.procs")).unwrap().write_all(k.id().to_string().as_bytes()).unwrap();
        }
        let n = 200;
        let t0 = Instant::now();
        for _ in 0..n {
            assert_eq!(super::owner(&cg, client, gate).map(|o| o.0), Some(kids.last().unwrap().id()));
        }
        let each = t0.elapsed() / n;
        for k in &mut kids {
            let _ = k.kill();
            let _ = k.wait();
        }
        let _ = std::fs::remove_dir(&cg);
        println!("lookup: {each:?} per connection (11 processes in the cgroup)");
    }
}
