//! The pre-exec launcher: clone into the run's cgroup, enter the sandbox, drop privileges, exec.
//!
//! Everything that can allocate or fail for ordinary reasons (opening the netns and the
//! cgroup's folder, reading `cap_last_cap`, the argv, environment and exec paths) happens
//! before `clone3`; the child only makes async-signal-safe system calls on memory prepared
//! in advance.
//!
//! The child is born in the cgroup (`clone3(2)` with `CLONE_INTO_CGROUP`, Linux 5.7)
//! rather than moving itself there by writing `cgroup.procs`: a move takes the cgroup
//! threadgroup rwsem for writing, which waits out an RCU grace period (~10 ms here when
//! nothing else moved a task just before; cgroups(7), the `favordynmods` mount option), while
//! a birth in the cgroup takes it only for reading.

mod child;
pub mod landlock;
pub mod seccomp;
#[cfg(test)]
mod tests;

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

pub use child::Step;
pub use seccomp::Mode;

/// What to run and where.
#[derive(Debug, Clone)]
pub struct SpawnRequest {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    pub netns_path: PathBuf,
    pub cgroup_dir: PathBuf,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    /// Host paths hidden from the agent (an empty tmpfs over each), e.g. `/sys/fs/bpf`.
    pub hide: Vec<PathBuf>,
    /// Host paths the agent sees read-only, e.g. the cgroup v2 mount and the audit log's folder.
    pub readonly: Vec<PathBuf>,
    /// What `argv` is: nsjail (which still makes namespaces and mounts, and drops to `uid`,
    /// `gid` and `groups` itself: it runs as root so that it needs no user namespace, which
    /// the kernel refuses in a chroot and some distributions restrict) or the agent itself;
    /// chooses the baseline seccomp filter ([`seccomp`]) and whether the launcher drops
    /// privileges (only for the agent itself; no_new_privs is set in both modes).
    pub mode: Mode,
    /// cgroup v1 leaves the agent joins before anything else (a hybrid host's pids, memory
    /// and cpu controllers); the launcher opens their `cgroup.procs` before `clone3`.
    pub join_cgroups: Vec<PathBuf>,
    /// The agent's oom_score_adj (-1000..=1000, proc(5)), inherited by all it starts.
    pub oom_score_adj: Option<i32>,
    /// RLIMIT_NPROC for the agent (where no pids controller bounds the run).
    pub nproc: Option<u64>,
    /// The agent's soft RLIMIT_NOFILE: the caller's, where gatewrap raised its own to the
    /// hard limit for the gate's sockets (`None`: this process's).
    pub nofile: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("empty command")]
    EmptyArgv,
    #[error("cannot open netns {path}: {source}")]
    Netns { path: PathBuf, source: io::Error },
    #[error("cannot open {path} to join the cgroup: {source}")]
    Cgroup { path: PathBuf, source: io::Error },
    #[error("path {0} contains a NUL byte")]
    NulInPath(PathBuf),
    #[error("the command's arguments or environment contain a NUL byte: {0:?}")]
    NulInArg(String),
    #[error("clone3(CLONE_INTO_CGROUP) failed (Linux 5.7 or later is needed): {0}")]
    Clone(io::Error),
    #[error("cannot read /proc/sys/kernel/cap_last_cap: {0}")]
    CapLastCap(io::Error),
    #[error("cannot create the launcher's status pipe: {0}")]
    Pipe(io::Error),
    #[error("command not found: {0}")]
    NotFound(String),
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    #[error("cannot execute {cmd}: {source}")]
    Exec { cmd: String, source: io::Error },
    #[error(transparent)]
    Seccomp(#[from] seccomp::BuildError),
    #[error("cannot create the launcher's Landlock ruleset (ABI {abi}): {source}")]
    Landlock { abi: u32, source: io::Error },
    #[error("launcher: {step} failed in the child before exec: {source}")]
    Child { step: Step, source: io::Error },
}

impl SpawnError {
    /// True when exec itself failed (command missing or not executable); false when setting
    /// up the sandbox failed, before or in the child.
    pub fn is_exec(&self) -> bool {
        matches!(self, SpawnError::NotFound(_) | SpawnError::PermissionDenied(_) | SpawnError::Exec { .. })
    }

    /// The errno to report (`EINVAL` for errors without one).
    pub fn errno(&self) -> i32 {
        match self {
            SpawnError::EmptyArgv | SpawnError::NulInPath(_) | SpawnError::NulInArg(_) | SpawnError::Seccomp(_) => {
                libc::EINVAL
            }
            SpawnError::NotFound(_) => libc::ENOENT,
            SpawnError::PermissionDenied(_) => libc::EACCES,
            SpawnError::Netns { source, .. }
            | SpawnError::Cgroup { source, .. }
            | SpawnError::CapLastCap(source)
            | SpawnError::Pipe(source)
            | SpawnError::Clone(source)
            | SpawnError::Exec { source, .. }
            | SpawnError::Landlock { source, .. }
            | SpawnError::Child { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
        }
    }
}

fn cap_last_cap() -> Result<u32, SpawnError> {
    let text = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap").map_err(SpawnError::CapLastCap)?;
    text.trim().parse::<u32>().map_err(|e| {
        SpawnError::CapLastCap(io::Error::new(io::ErrorKind::InvalidData, e.to_string()))
    })
}

/// A pipe the child reports a failed step on (both ends close on exec: end of file then
/// means the exec happened). Blocking: the parent reads until the child has exec'd or failed.
fn status_pipe() -> Result<(OwnedFd, OwnedFd), SpawnError> {
    let mut fds = [-1i32; 2];
    // SAFETY: fds is a valid array of two ints.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(SpawnError::Pipe(io::Error::last_os_error()));
    }
    // SAFETY: pipe2 returned two fresh descriptors that nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Wait for the child's report: `None` at end of file (it exec'd), else the failed step and
/// its errno. A short read (the child died mid-write) reads as an exec that never happened.
fn read_report(r: &OwnedFd) -> Option<(Step, i32)> {
    let mut buf = [0u8; child::REPORT_BYTES];
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: reading into the unfilled tail of a local buffer.
        let n = unsafe { libc::read(r.as_raw_fd(), buf[got..].as_mut_ptr().cast(), buf.len() - got) };
        match n {
            0 => break,
            n if n > 0 => got += n as usize,
            _ if io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) => {}
            _ => break,
        }
    }
    match got {
        0 => None,
        child::REPORT_BYTES => child::decode_report(&buf),
        _ => Some((Step::Exec, libc::EIO)),
    }
}

fn c_paths(paths: &[PathBuf]) -> Result<Vec<CString>, SpawnError> {
    paths
        .iter()
        .map(|p| CString::new(p.as_os_str().as_bytes()).map_err(|_| SpawnError::NulInPath(p.clone())))
        .collect()
}

fn c_string(s: String) -> Result<CString, SpawnError> {
    CString::new(s).map_err(|e| SpawnError::NulInArg(String::from_utf8_lossy(&e.into_vec()).into_owned()))
}

/// The paths execve(2) tries for `program`, as execvp(3) searches: the program itself when it
/// contains a `/`, else each entry of the child's `PATH` (this process's when the request sets
/// none; an empty entry is the working directory) joined with it.
fn exec_paths(program: &str, env: &[(String, String)]) -> Result<Vec<CString>, SpawnError> {
    if program.contains('/') {
        return Ok(vec![c_string(program.to_string())?]);
    }
    let path = env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.clone())
        .or_else(|| std::env::var("PATH").ok())
        .unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".to_string());
    path.split(':')
        .map(|dir| c_string(if dir.is_empty() { program.to_string() } else { format!("{dir}/{program}") }))
        .collect()
}

/// The `clone_args` of clone3(2) (linux/sched.h, `CLONE_ARGS_SIZE_VER2`: 88 bytes).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// `CLONE_INTO_CGROUP` (linux/sched.h).
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// Start `req.argv` inside the sandbox; returns the child's pid (the caller reaps it).
///
/// Returns once the child has exec'd (or failed: then it is reaped here and its step and
/// errno make the error).
pub fn spawn(req: &SpawnRequest) -> Result<u32, SpawnError> {
    let program = req.argv.first().ok_or(SpawnError::EmptyArgv)?;
    let netns = File::open(&req.netns_path)
        .map_err(|source| SpawnError::Netns { path: req.netns_path.clone(), source })?;
    let cgroup = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(&req.cgroup_dir)
        .map_err(|source| SpawnError::Cgroup { path: req.cgroup_dir.clone(), source })?;
    let joins = req
        .join_cgroups
        .iter()
        .map(|dir| {
            let path = dir.join("cgroup.procs");
            std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_CLOEXEC)
                .open(&path)
                .map_err(|source| SpawnError::Cgroup { path, source })
        })
        .collect::<Result<Vec<File>, _>>()?;
    let (status_r, status_w) = status_pipe()?;
    let abi = landlock::abi();
    let ruleset = landlock::ruleset_for(abi, req.mode)
        .map(|attr| landlock::create(&attr))
        .transpose()
        .map_err(|source| SpawnError::Landlock { abi: abi.unwrap_or(0), source })?;
    let argv_store = req.argv.iter().cloned().map(c_string).collect::<Result<Vec<_>, _>>()?;
    let envp_store = req.env.iter().map(|(k, v)| c_string(format!("{k}={v}"))).collect::<Result<Vec<_>, _>>()?;
    let nul_terminated = |v: &[CString]| v.iter().map(|s| s.as_ptr()).chain([std::ptr::null()]).collect::<Vec<_>>();
    let plan = child::Plan {
        netns_fd: netns.as_raw_fd(),
        status_fd: status_w.as_raw_fd(),
        exec_paths: exec_paths(program, &req.env)?,
        argv: nul_terminated(&argv_store),
        envp: nul_terminated(&envp_store),
        _owned: (argv_store, envp_store),
        groups: req.groups.iter().map(|&g| g as libc::gid_t).collect(),
        uid: req.uid,
        gid: req.gid,
        last_cap: cap_last_cap()?,
        hide: c_paths(&req.hide)?,
        readonly: c_paths(&req.readonly)?,
        cwd: c_paths(std::slice::from_ref(&req.cwd))?.remove(0),
        drop_privileges: req.mode == Mode::Direct,
        landlock_fd: ruleset.as_ref().map(|fd| fd.as_raw_fd()),
        filters: seccomp::build(req.mode)?,
        join_fds: joins.iter().map(|f| f.as_raw_fd()).collect(),
        oom_score_adj: req.oom_score_adj.map(|adj| c_string(adj.to_string())).transpose()?,
        nproc: req.nproc,
        nofile: req.nofile,
    };

    // In the jail the child is born the init (pid 1) of a pid namespace of its own: nsjail,
    // which it execs, runs in execve mode (nsjail/agent.cfg) and execs tini in its place, so
    // tini is that init and no nsjail stays resident; its parent (gatewrap, or the shared
    // mode's waiter) reaps it directly.
    let pid_ns = if req.mode == Mode::Nsjail { libc::CLONE_NEWPID as u64 } else { 0 };
    let args = CloneArgs {
        flags: CLONE_INTO_CGROUP | pid_ns,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: cgroup.as_raw_fd() as u64,
        ..CloneArgs::default()
    };
    // SAFETY: clone3 without CLONE_VM copies the address space as fork does; the child runs
    // only Plan::run_child (system calls on the prepared plan) and never returns.
    let pid = unsafe { libc::syscall(libc::SYS_clone3, &args as *const CloneArgs, std::mem::size_of::<CloneArgs>()) };
    if pid == 0 {
        // SAFETY: this is the child of clone3, and the plan was prepared before it.
        unsafe { plan.run_child() }
    }
    let clone_error = (pid < 0).then(io::Error::last_os_error);
    drop(status_w);
    if let Some(e) = clone_error {
        return Err(SpawnError::Clone(e));
    }
    let report = read_report(&status_r);
    drop(netns);
    drop(cgroup);
    drop(joins);
    drop(ruleset);
    let Some((step, errno)) = report else { return Ok(pid as u32) };
    let mut status = 0;
    // SAFETY: reaping our own child, which has exited or is about to (_exit after the report).
    unsafe { libc::waitpid(pid as libc::pid_t, &mut status, 0) };
    let source = io::Error::from_raw_os_error(errno);
    Err(match step {
        Step::Chdir | Step::Exec => exec_error(program, &req.cwd, source),
        step => SpawnError::Child { step, source },
    })
}
fn exec_error(program: &str, cwd: &Path, source: io::Error) -> SpawnError {
    match source.raw_os_error() {
        Some(libc::ENOENT) if !cwd.is_dir() => SpawnError::Exec {
            cmd: program.to_string(),
            source: io::Error::new(source.kind(), format!("working directory {} does not exist", cwd.display())),
        },
        Some(libc::ENOENT) => SpawnError::NotFound(program.to_string()),
        Some(libc::EACCES) => SpawnError::PermissionDenied(program.to_string()),
        _ => SpawnError::Exec { cmd: program.to_string(), source },
    }
}
