//! The pre-exec launcher: fork, enter the sandbox, drop privileges, exec.
//!
//! Everything that can allocate or fail for ordinary reasons (opening the netns and the
//! cgroup's `cgroup.procs`, reading `cap_last_cap`) happens before `fork`; the child only
//! makes async-signal-safe system calls on memory prepared in advance.

mod child;
pub mod seccomp;
#[cfg(test)]
mod tests;

use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

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
            SpawnError::EmptyArgv | SpawnError::NulInPath(_) | SpawnError::Seccomp(_) => libc::EINVAL,
            SpawnError::NotFound(_) => libc::ENOENT,
            SpawnError::PermissionDenied(_) => libc::EACCES,
            SpawnError::Netns { source, .. }
            | SpawnError::Cgroup { source, .. }
            | SpawnError::CapLastCap(source)
            | SpawnError::Pipe(source)
            | SpawnError::Exec { source, .. }
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

/// A pipe the child writes one [`Step`] byte to when a step fails (both ends close on exec).
fn status_pipe() -> Result<(OwnedFd, OwnedFd), SpawnError> {
    let mut fds = [-1i32; 2];
    // SAFETY: fds is a valid array of two ints.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        return Err(SpawnError::Pipe(io::Error::last_os_error()));
    }
    // SAFETY: pipe2 returned two fresh descriptors that nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn read_step(r: &OwnedFd) -> Option<Step> {
    let mut b = 0u8;
    // SAFETY: reading one byte into a valid local.
    let n = unsafe { libc::read(r.as_raw_fd(), (&mut b as *mut u8).cast(), 1) };
    (n == 1).then(|| Step::from_code(b)).flatten()
}

fn c_paths(paths: &[PathBuf]) -> Result<Vec<CString>, SpawnError> {
    paths
        .iter()
        .map(|p| CString::new(p.as_os_str().as_bytes()).map_err(|_| SpawnError::NulInPath(p.clone())))
        .collect()
}

/// Start `req.argv` inside the sandbox; returns the child's pid (the caller reaps it).
pub fn spawn(req: &SpawnRequest) -> Result<u32, SpawnError> {
    let program = req.argv.first().ok_or(SpawnError::EmptyArgv)?;
    let netns = File::open(&req.netns_path)
        .map_err(|source| SpawnError::Netns { path: req.netns_path.clone(), source })?;
    let procs_path = req.cgroup_dir.join("cgroup.procs");
    let procs = OpenOptions::new()
        .write(true)
        .open(&procs_path)
        .map_err(|source| SpawnError::Cgroup { path: procs_path.clone(), source })?;
    let (status_r, status_w) = status_pipe()?;
    let plan = child::Plan {
        netns_fd: netns.as_raw_fd(),
        procs_fd: procs.as_raw_fd(),
        status_fd: status_w.as_raw_fd(),
        groups: req.groups.iter().map(|&g| g as libc::gid_t).collect(),
        uid: req.uid,
        gid: req.gid,
        last_cap: cap_last_cap()?,
        hide: c_paths(&req.hide)?,
        readonly: c_paths(&req.readonly)?,
        cwd: c_paths(std::slice::from_ref(&req.cwd))?.remove(0),
        drop_privileges: req.mode == Mode::Direct,
        filters: seccomp::build(req.mode)?,
    };

    let mut cmd = Command::new(program);
    cmd.args(&req.argv[1..]).env_clear().current_dir(&req.cwd);
    for (k, v) in &req.env {
        cmd.env(OsStr::new(k), OsStr::new(v));
    }
    // SAFETY: Plan::enter only makes async-signal-safe system calls and does not allocate.
    unsafe { cmd.pre_exec(move || plan.enter()) };
    let result = cmd.spawn();
    drop(status_w);
    drop(netns);
    drop(procs);
    match result {
        Ok(child) => Ok(child.id()),
        Err(source) => Err(match read_step(&status_r) {
            Some(step) => SpawnError::Child { step, source },
            None => exec_error(program, &req.cwd, source),
        }),
    }
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
