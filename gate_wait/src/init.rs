//! `gatewrap-wait --init -- PROGRAM [ARG...]`: the jail's init, in tini's place.
//!
//! gatewrap's launcher makes the run's pid namespace (clone3 `CLONE_NEWPID`); nsjail, in
//! execve mode, sets up the jail in that process and execs this as its pid 1 (as the agent's
//! user, no capabilities, under the jail's seccomp policy). As tini does, it starts the agent,
//! forwards every signal it can to it, reaps every orphan of the namespace (they are all
//! reparented to pid 1: pid_namespaces(7)) and exits with the agent's code (128 + signal when
//! a signal ended it); when it exits the kernel kills what is left in the namespace.
//!
//! Unlike tini it first clears the parent-death signal nsjail leaves set (SIGKILL,
//! `PR_SET_PDEATHSIG` in nsjail's contain.cc, kept across execve(2)): the sandbox must outlive
//! a gatewrap that dies (fail closed: it keeps its hooks and has no egress, and `gatewrap gc`
//! removes it), as it did when a resident nsjail was its parent. And it makes itself not
//! dumpable: its /proc/1 shows the agent nothing of the host (see `start`).

use std::ffi::{CString, OsString};
use std::io;
use std::mem;
use std::os::unix::ffi::OsStringExt;

use crate::children;
use crate::sys::{cvt, fail, Fd};

/// Signals not taken from a signalfd: those the kernel raises for a fault of this process
/// (they must act at once), and the two that cannot be blocked. Every other one is forwarded
/// (SIGCHLD: reaped), as tini forwards.
const NOT_FORWARDED: [libc::c_int; 9] = [
    libc::SIGFPE,
    libc::SIGILL,
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGABRT,
    libc::SIGTRAP,
    libc::SIGSYS,
    libc::SIGKILL,
    libc::SIGSTOP,
];

/// Run the agent `argv` (PROGRAM and its arguments, PATH searched as execvp(3) does) as pid 1
/// would; returns the code to exit with: the agent's, 127 when PROGRAM is not found, 126 when
/// it cannot be executed (as a shell says), 125 when this init cannot start.
pub fn run(argv: Vec<OsString>) -> i32 {
    match start(argv) {
        Ok(code) => code,
        Err(why) => {
            fail(&format!("--init: {why}"));
            crate::EXIT_GATEWRAP
        }
    }
}

fn start(argv: Vec<OsString>) -> Result<i32, String> {
    if argv.is_empty() {
        return Err("no command after --init --".into());
    }
    let args = argv
        .into_iter()
        .map(|a| CString::new(a.into_vec()).map_err(|_| "an argument contains a NUL byte".to_owned()))
        .collect::<Result<Vec<_>, _>>()?;
    let mut ptrs: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    // SAFETY: plain prctl(2); clearing our own parent-death signal cannot fail.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, 0 as libc::c_ulong, 0, 0, 0) };
    // Not dumpable: this init runs as the agent's user, so the agent could otherwise read its
    // /proc/1/exe, maps, environ and fd (ptrace access mode READ, same uid: proc(5)), which
    // name this binary's host path (the virtualenv's, outside the jail's view). A process that
    // is not dumpable has those owned by root (proc(5), PR_SET_DUMPABLE in prctl(2)); the agent
    // is dumpable again, as execve(2) resets it.
    // SAFETY: plain prctl(2) on this process.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0 as libc::c_ulong, 0, 0, 0) };
    let (signals, old_mask) = block_signals().map_err(|e| format!("cannot read signals through a signalfd: {e}"))?;
    // SAFETY: this process has one thread; the child only resets its signals and execs.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(format!("fork: {}", io::Error::last_os_error()));
    }
    if child == 0 {
        // SAFETY: in the child of fork, on values prepared before it.
        unsafe { exec_agent(&ptrs, &old_mask) }
    }
    wait(child, &signals).map_err(|e| format!("waiting for the agent failed: {e}"))
}

/// Block every signal but [`NOT_FORWARDED`] and open a signalfd for them (blocked signals are
/// queued for pid 1 too, although it has no handler: kernel/signal.c, `sig_ignored`). Returns
/// the fd and the mask before, which the agent gets back.
fn block_signals() -> io::Result<(Fd, libc::sigset_t)> {
    // SAFETY: plain libc calls on local, zero-initialised sigset_t values.
    unsafe {
        // An inherited SIG_IGN of SIGCHLD would make the kernel reap the agent itself.
        if libc::signal(libc::SIGCHLD, libc::SIG_DFL) == libc::SIG_ERR {
            return Err(io::Error::last_os_error());
        }
        let mut set: libc::sigset_t = mem::zeroed();
        libc::sigfillset(&mut set);
        for sig in NOT_FORWARDED {
            libc::sigdelset(&mut set, sig);
        }
        let mut old: libc::sigset_t = mem::zeroed();
        cvt(libc::sigprocmask(libc::SIG_BLOCK, &set, &mut old))?;
        Ok((Fd(cvt(libc::signalfd(-1, &set, libc::SFD_CLOEXEC))?), old))
    }
}

/// The child: a process group of its own (as tini gives it), the signal mask it had and
/// SIGPIPE's default action back (Rust's runtime ignored it here, and an ignored signal
/// stays ignored across execve(2)), then the agent. Never returns.
///
/// SAFETY: to be called only in the child of `fork`.
unsafe fn exec_agent(argv: &[*const libc::c_char], old_mask: &libc::sigset_t) -> ! {
    libc::setpgid(0, 0);
    libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    libc::sigprocmask(libc::SIG_SETMASK, old_mask, std::ptr::null_mut());
    libc::execvp(argv[0], argv.as_ptr());
    let err = io::Error::last_os_error();
    let program = std::ffi::CStr::from_ptr(argv[0]).to_string_lossy();
    fail(&format!("cannot run {program}: {err}"));
    libc::_exit(if err.raw_os_error() == Some(libc::ENOENT) { 127 } else { 126 })
}

/// Read signals until the agent `child` has exited: SIGCHLD reaps (every exited child: the
/// namespace's orphans are ours), any other is sent on to the agent. Its exit code.
fn wait(child: libc::pid_t, signals: &Fd) -> io::Result<i32> {
    loop {
        if let Some(code) = children::reap(child) {
            return Ok(code);
        }
        // SAFETY: signalfd_siginfo is plain data; read(2) fills at most its size.
        let mut info: libc::signalfd_siginfo = unsafe { mem::zeroed() };
        let size = mem::size_of::<libc::signalfd_siginfo>();
        let n = unsafe { libc::read(signals.0, (&mut info as *mut libc::signalfd_siginfo).cast(), size) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        let sig = info.ssi_signo as libc::c_int;
        if sig != libc::SIGCHLD {
            // SAFETY: kill(2) of our own child, not reaped yet; ESRCH is no error.
            unsafe { libc::kill(child, sig) };
        }
    }
}
