//! Which sandbox process holds a connection to the gate: found once per connection, from the
//! client socket's inode, and named in every record of that connection (`client_pid`,
//! `client_comm`).
//!
//! The client's socket is the one of the sandbox's TCP table whose local address is the
//! connection's peer and whose remote address is the gate's; its owner is the process of the
//! run's cgroup (`cgroup.procs`, the run's and the cgroups below) with a descriptor on
//! `socket:[INODE]` (`/proc/PID/fd`).
//!
//! The work is bounded per run, whatever the run's agent does (issue 23, target 5: a
//! neighbour's 1,000 connections had each scanned up to 4,096 processes' tables on a thread
//! of its own, and every run's connections waited behind them):
//! - a run has at most one lookup in flight; the connections that arrive meanwhile wait (at
//!   most [`MAX_WAITING`], beyond that their records say `client_pid: null` at once) and are
//!   all answered by the next one, a *batch*;
//! - a batch reads the TCP table once (`/proc/PID/net/tcp{,6}` of one process in the
//!   sandbox's netns: the table is the namespace's, proc(5)); a client not in it (it already
//!   closed) is given up then, without reading any process's descriptors;
//! - the descriptors are read process by process (the last owners found first, most
//!   connections come from the same few), until every socket of the batch is found; a batch
//!   whose connections all stopped waiting ([`LOOKUP_TIMEOUT`], or closed) stops there;
//! - the batches of every gate in the process take turns on [`THREADS`] blocking threads
//!   (a fair semaphore: a run waits behind at most one batch of each other run).

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use procfs::process::{FDTarget, Process};
use tokio::sync::{oneshot, Semaphore};

use super::netns::canonical;
use super::tasks::Tasks;

/// How long a connection waits for its lookup before its records say `client_pid: null`.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_millis(500);
/// Most processes whose descriptors one batch reads.
const MAX_PROCS: usize = 4096;
/// Most cgroups (the run's and those below it) one batch lists.
const MAX_CGROUPS: usize = 64;
/// Connections of one run waiting for a lookup; beyond it a new one is not looked up.
pub const MAX_WAITING: usize = 256;
/// Blocking threads the lookups of all gates of the process use at once.
pub const THREADS: usize = 2;
/// Owners remembered per run and tried first.
const RECENT: usize = 8;

static PERMITS: Semaphore = Semaphore::const_new(THREADS);

/// The process behind a connection: `pid` None when it could not be found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Client {
    pub pid: Option<u32>,
    pub comm: Option<String>,
}

/// What a run's lookups have cost so far (for tests and benches): TCP tables read (one file
/// each, tcp or tcp6) and processes whose descriptors were read.
#[derive(Debug, Default)]
pub struct Work {
    pub tables: AtomicU64,
    pub fd_dirs: AtomicU64,
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

/// One connection waiting for its owner.
struct Want {
    client: SocketAddr,
    gate: SocketAddr,
    reply: oneshot::Sender<(u32, String)>,
}

/// Where one run's lookups are looked for, and what they cost.
#[derive(Debug)]
pub struct Scope {
    cgroup: PathBuf,
    /// The inode of the sandbox's netns (`stat` of its file): the TCP table is read from a
    /// process in it. None: from the first process of the cgroup.
    netns: Option<u64>,
    /// Owners found last, most recent first.
    recent: Mutex<VecDeque<i32>>,
    pub work: Work,
}

impl Scope {
    /// Lookups in the cgroup directory `cgroup`, whose processes are in the netns at
    /// `netns_path` (None, or a path that cannot be read: any of its processes' table).
    pub fn new(cgroup: PathBuf, netns_path: Option<&Path>) -> Scope {
        let netns = netns_path.and_then(|p| std::fs::metadata(p).ok()).map(|m| m.ino());
        Scope { cgroup, netns, recent: Mutex::default(), work: Work::default() }
    }

    /// The TCP table entries (v4, v6, each read only if `v4`/`v6`) of the sandbox's netns,
    /// from one of `pids` that is in it, added to `out`: (local, remote) → inode, the
    /// addresses as the gate names its peers ([`canonical`]: an IPv4 connection of an IPv6
    /// socket is listed in `tcp6` as `::ffff:a.b.c.d`, ipv6(7)).
    fn table(&self, pids: &[i32], v4: bool, v6: bool, out: &mut HashMap<(SocketAddr, SocketAddr), u64>) {
        let in_ns = |pid: i32| match self.netns {
            None => true,
            Some(ino) => std::fs::metadata(format!("/proc/{pid}/ns/net")).is_ok_and(|m| m.ino() == ino),
        };
        let Some(proc) = pids.iter().find(|&&p| in_ns(p)).and_then(|&p| Process::new(p).ok()) else {
            return;
        };
        let mut read = |t: procfs::ProcResult<Vec<procfs::net::TcpNetEntry>>| {
            self.work.tables.fetch_add(1, Ordering::Relaxed);
            // A socket in TIME_WAIT (its owner closed it) is listed with inode 0.
            for e in t.into_iter().flatten().filter(|e| e.inode != 0) {
                out.insert((bare(canonical(e.local_address)), bare(canonical(e.remote_address))), e.inode);
            }
        };
        if v4 {
            read(proc.tcp());
        }
        if v6 {
            read(proc.tcp6());
        }
    }

    /// Answer each of `batch` that can be: its owner sent on its `reply`; the others are
    /// dropped (their waiters see none). Blocking; stops early once nobody waits.
    fn resolve(&self, batch: Vec<Want>) {
        let pids = procs(&self.cgroup);
        let v4 = batch.iter().any(|w| w.client.is_ipv4());
        let v6 = batch.iter().any(|w| w.client.is_ipv6());
        let mut table = HashMap::new();
        self.table(&pids, v4, v6, &mut table);
        // An IPv4 client missing from `tcp` may hold an IPv6 socket (it connected to
        // ::ffff:127.0.0.1): its entry is in `tcp6`, read then only.
        if !v6 && batch.iter().any(|w| !table.contains_key(&(bare(w.client), bare(w.gate)))) {
            self.table(&pids, false, true, &mut table);
        }
        let mut wanted: HashMap<u64, Vec<Want>> = HashMap::new();
        for w in batch {
            // A client not in the table has closed: given up here.
            if let Some(&inode) = table.get(&(bare(w.client), bare(w.gate))) {
                wanted.entry(inode).or_default().push(w);
            }
        }
        if wanted.is_empty() {
            return;
        }
        let members: HashSet<i32> = pids.iter().copied().collect();
        let recent: Vec<i32> = self.recent.lock().unwrap_or_else(|p| p.into_inner()).iter().copied().filter(|p| members.contains(p)).collect();
        let order = recent.iter().copied().chain(pids.iter().copied().filter(|p| !recent.contains(p)));
        for pid in order {
            wanted.retain(|_, ws| {
                ws.retain(|w| !w.reply.is_closed());
                !ws.is_empty()
            });
            if wanted.is_empty() {
                return;
            }
            let Ok(proc) = Process::new(pid) else { continue };
            self.work.fd_dirs.fetch_add(1, Ordering::Relaxed);
            let Ok(fds) = proc.fd() else { continue };
            let mut comm = None;
            for fd in fds.flatten() {
                let FDTarget::Socket(inode) = fd.target else { continue };
                let Some(ws) = wanted.remove(&inode) else { continue };
                let name = comm.get_or_insert_with(|| proc.stat().map(|s| s.comm).unwrap_or_default()).clone();
                for w in ws {
                    let _ = w.reply.send((pid as u32, name.clone()));
                }
            }
            if comm.is_some() {
                let mut r = self.recent.lock().unwrap_or_else(|p| p.into_inner());
                r.retain(|&p| p != pid);
                r.push_front(pid);
                r.truncate(RECENT);
            }
        }
    }
}

/// An address without IPv6 scope and flow (the table has neither).
fn bare(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip(), a.port())
}

/// The process of the run's cgroup (`cgroup`) holding the client end of the connection
/// from `client` to `gate`, and its command name (`/proc/PID/comm`): one lookup on the
/// calling thread. None when no process of the run has it (it is gone, or gave it away).
pub fn owner(scope: &Scope, client: SocketAddr, gate: SocketAddr) -> Option<(u32, String)> {
    let (tx, mut rx) = oneshot::channel();
    scope.resolve(vec![Want { client, gate, reply: tx }]);
    rx.try_recv().ok()
}

/// The lookups waiting in a run, and whether a batch is running.
#[derive(Default)]
struct Waiting {
    queue: Vec<Want>,
    busy: bool,
}

/// The clients of the open connections, by peer address, for the records of each.
pub struct Clients {
    scope: Option<Arc<Scope>>,
    tasks: Tasks,
    waiting: Mutex<Waiting>,
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
    /// Attribution for the run whose processes are in `scope` (none, no `client_pid` in
    /// records, without one); its batches run as tasks of `tasks` (ended with the gate).
    pub fn new(scope: Option<Scope>, tasks: Tasks) -> Clients {
        Clients {
            scope: scope.map(Arc::new),
            tasks,
            waiting: Mutex::default(),
            open: Mutex::default(),
            next: AtomicU64::new(0),
        }
    }

    /// What this run's lookups have cost so far; None without attribution.
    pub fn work(&self) -> Option<&Work> {
        self.scope.as_deref().map(|s| &s.work)
    }

    /// Find the process behind the connection from `peer` to `local` (waiting at most
    /// [`LOOKUP_TIMEOUT`], not at all when [`MAX_WAITING`] of the run's connections already
    /// wait) and register it until the returned registration drops. None when the gate has
    /// no run cgroup to look in.
    pub async fn register(self: &Arc<Self>, peer: SocketAddr, local: SocketAddr) -> Option<Registration> {
        let scope = self.scope.clone()?;
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut w = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
            if w.queue.len() < MAX_WAITING {
                w.queue.push(Want { client: peer, gate: local, reply: tx });
                !std::mem::replace(&mut w.busy, true)
            } else {
                false
            }
        };
        if start {
            self.tasks.spawn(self.clone().batches(scope));
        }
        let client = match tokio::time::timeout(LOOKUP_TIMEOUT, rx).await {
            Ok(Ok((pid, comm))) => Client { pid: Some(pid), comm: Some(comm) },
            _ => Client::default(),
        };
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.open.lock().unwrap_or_else(|p| p.into_inner()).insert(peer, (id, client));
        Some(Registration { clients: self.clone(), peer, id })
    }

    /// Run the run's batches one after the other until none waits: each takes what waits
    /// then, and a turn on one of the [`THREADS`].
    async fn batches(self: Arc<Self>, scope: Arc<Scope>) {
        loop {
            let batch: Vec<Want> = {
                let mut w = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
                if w.queue.is_empty() {
                    w.busy = false;
                    return;
                }
                std::mem::take(&mut w.queue)
            };
            let batch: Vec<Want> = batch.into_iter().filter(|w| !w.reply.is_closed()).collect();
            if batch.is_empty() {
                continue;
            }
            let Ok(_turn) = PERMITS.acquire().await else { return };
            let scope = scope.clone();
            let _ = tokio::task::spawn_blocking(move || scope.resolve(batch)).await;
        }
    }

    /// The client of the open connection from `peer`; None when it was not looked up.
    pub fn of(&self, peer: SocketAddr) -> Option<Client> {
        self.open.lock().unwrap_or_else(|p| p.into_inner()).get(&peer).map(|(_, c)| c.clone())
    }
}

#[cfg(test)]
mod tests {
    //! Need root and cgroup v2 at /sys/fs/cgroup/unified (this machine's).
    use std::io::{BufRead, BufReader, Write};
    use std::net::{SocketAddr, TcpListener, TcpStream};
    use std::path::PathBuf;
    use std::process::{Child, Command, Stdio};
    use std::sync::atomic::Ordering;
    use std::time::Instant;

    use super::{owner, Scope};

    /// A cgroup of its own holding `idle` sleeping processes and one process with `conns`
    /// connections to a listener of the test; killed and removed on drop.
    struct Run {
        cg: PathBuf,
        kids: Vec<Child>,
        gate: SocketAddr,
        clients: Vec<SocketAddr>,
        _listener: TcpListener,
        _accepted: Vec<TcpStream>,
    }

    impl Run {
        fn new(name: &str, idle: usize, conns: usize) -> Run {
            Run::connecting(name, idle, conns, "127.0.0.1")
        }

        /// As [`Run::new`], the connections made to `to` (`::ffff:127.0.0.1`: IPv4
        /// connections of IPv6 sockets; the listener sees them from 127.0.0.1).
        fn connecting(name: &str, idle: usize, conns: usize, to: &str) -> Run {
            let cg = PathBuf::from(format!("/sys/fs/cgroup/unified/gw-client-{name}-{}", std::process::id()));
            std::fs::create_dir(&cg).expect("mkdir the test cgroup (root, cgroup v2)");
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let gate = listener.local_addr().unwrap();
            let mut kids: Vec<_> = (0..idle).map(|_| Command::new("sleep").arg("60").spawn().unwrap()).collect();
            let script = format!(
                "import socket,time\nss=[socket.create_connection(('{to}',{})) for _ in range({conns})]\nprint(' '.join(str(s.getsockname()[1]) for s in ss),flush=True)\ntime.sleep(60)",
                gate.port()
            );
            let mut holder = Command::new("python3").args(["-c", &script]).stdout(Stdio::piped()).spawn().unwrap();
            let mut line = String::new();
            BufReader::new(holder.stdout.take().unwrap()).read_line(&mut line).unwrap();
            let clients = line.split_whitespace().map(|p| SocketAddr::from(([127, 0, 0, 1], p.parse().unwrap()))).collect();
            let accepted = (0..conns).map(|_| listener.accept().unwrap().0).collect();
            kids.push(holder);
            for k in &kids {
                std::fs::File::options().write(true).open(cg.join("cgroup.procs")).unwrap().write_all(k.id().to_string().as_bytes()).unwrap();
            }
            Run { cg, kids, gate, clients, _listener: listener, _accepted: accepted }
        }

        fn holder(&self) -> u32 {
            self.kids.last().unwrap().id()
        }

        fn scope(&self) -> Scope {
            Scope::new(self.cg.clone(), None)
        }
    }

    impl Drop for Run {
        fn drop(&mut self) {
            for k in &mut self.kids {
                let _ = k.kill();
                let _ = k.wait();
            }
            let _ = std::fs::remove_dir(&self.cg);
        }
    }

    #[test]
    fn a_closed_client_is_given_up_after_one_table_read_and_no_descriptors() {
        let run = Run::new("closed", 30, 1);
        // A connection from outside the run, closed before its lookup.
        let gone = TcpStream::connect(run.gate).unwrap();
        let addr = gone.local_addr().unwrap();
        drop(gone);
        let scope = run.scope();
        assert_eq!(owner(&scope, addr, run.gate), None);
        assert_eq!(scope.work.tables.load(Ordering::Relaxed), 2, "tcp, then tcp6 (it may have been an IPv6 socket's)");
        assert_eq!(scope.work.fd_dirs.load(Ordering::Relaxed), 0, "no process's descriptors read");
    }

    #[test]
    fn an_ipv4_connection_of_an_ipv6_socket_is_found_in_tcp6() {
        // The agent connects an AF_INET6 socket to ::ffff:127.0.0.1: the gate sees the peer
        // 127.0.0.1:PORT, the table lists ::ffff:127.0.0.1:PORT (before: client_pid null).
        let run = Run::connecting("mapped", 3, 2, "::ffff:127.0.0.1");
        let scope = run.scope();
        for &c in &run.clients {
            assert_eq!(owner(&scope, c, run.gate).map(|o| o.0), Some(run.holder()), "{c}");
        }
    }

    #[test]
    fn one_batch_finds_every_waiting_connection_with_one_table_read() {
        let run = Run::new("batch", 20, 5);
        let scope = run.scope();
        let (wants, replies): (Vec<_>, Vec<_>) = run
            .clients
            .iter()
            .map(|&c| {
                let (tx, rx) = tokio::sync::oneshot::channel();
                (super::Want { client: c, gate: run.gate, reply: tx }, rx)
            })
            .unzip();
        scope.resolve(wants);
        for mut rx in replies {
            assert_eq!(rx.try_recv().ok().map(|o| o.0), Some(run.holder()));
        }
        assert_eq!(scope.work.tables.load(Ordering::Relaxed), 1);
        assert!(scope.work.fd_dirs.load(Ordering::Relaxed) <= 21, "each process's descriptors read at most once");
    }

    #[test]
    fn the_last_owner_found_is_read_first() {
        let run = Run::new("recent", 20, 2);
        let scope = run.scope();
        assert_eq!(owner(&scope, run.clients[0], run.gate).map(|o| o.0), Some(run.holder()));
        let before = scope.work.fd_dirs.load(Ordering::Relaxed);
        assert_eq!(owner(&scope, run.clients[1], run.gate).map(|o| o.0), Some(run.holder()));
        assert_eq!(scope.work.fd_dirs.load(Ordering::Relaxed) - before, 1);
    }

    /// The cost of one lookup (what a connection waits for before its first request is
    /// read): 10 idle processes and one holding a connection:
    /// `cargo test -q -p gate_core --lib lookup_cost -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn lookup_cost() {
        let run = Run::new("bench", 10, 1);
        let scope = run.scope();
        let n = 200;
        let t0 = Instant::now();
        for _ in 0..n {
            assert_eq!(owner(&scope, run.clients[0], run.gate).map(|o| o.0), Some(run.holder()));
        }
        println!("lookup: {:?} per connection (11 processes in the cgroup)", t0.elapsed() / n);
    }
}
