//! Reaping: the waiter is a subreaper (PR_SET_CHILD_SUBREAPER, kept across execve(2)), so the
//! agent's orphans become its children, and each is reaped when it exits (runner.py's `_reap`).

use std::io;

/// The shell's convention for a wait status: the exit code, or 128 + the signal's number.
pub fn exit_code(status: libc::c_int) -> i32 {
    if libc::WIFSIGNALED(status) {
        128 + libc::WTERMSIG(status)
    } else {
        libc::WEXITSTATUS(status)
    }
}

/// Whether `pid` is a child of this process, and its exit code if it has exited already
/// (reaped then). `Err` when it is not a child of ours (ECHILD).
pub fn check(pid: libc::pid_t) -> io::Result<Option<i32>> {
    let mut status = 0;
    // SAFETY: waitpid(2) with a local status word.
    match unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(None),
        _ => Ok(Some(exit_code(status))),
    }
}

/// Reap every child that has exited, without blocking; the exit code of `pid` if it was
/// among them.
pub fn reap(pid: libc::pid_t) -> Option<i32> {
    let mut found = None;
    loop {
        let mut status = 0;
        // SAFETY: as above. -1 (ECHILD: no children left) and 0 (none exited) both end it.
        let got = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if got <= 0 {
            return found;
        }
        if got == pid {
            found = Some(exit_code(status));
        }
    }
}

/// Reap children, blocking, until `pid` is gone (after the cgroup was killed).
pub fn reap_until_gone(pid: libc::pid_t) {
    loop {
        let mut status = 0;
        // SAFETY: as above.
        let got = unsafe { libc::waitpid(-1, &mut status, 0) };
        if got == pid {
            return;
        }
        if got == -1 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return; // ECHILD: no children left, so pid too is gone
        }
    }
}
