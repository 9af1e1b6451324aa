//! The signals the waiter takes: blocked and read through a signalfd(2), as runner.py's
//! `sigtimedwait` loop does, and forwarded to the agent's process (the jail's init, which
//! passes them on, or the agent itself without a jail).

use std::io;
use std::mem;

use crate::sys::{cvt, Fd};

/// Forwarded to the agent (runner.py's FORWARDED).
pub const FORWARDED: [libc::c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// What the signalfd delivered.
#[derive(Debug, PartialEq)]
pub enum Got {
    /// A child changed state: reap.
    Child,
    /// A signal to forward.
    Forward(libc::c_int),
}

/// Block the forwarded signals and SIGCHLD and return a non-blocking signalfd for them.
///
/// Signals already pending (sent while the client still ran, with the same mask, which
/// execve(2) keeps along with what is pending) are read from it too. SIGCHLD's disposition is
/// set to the default first: an inherited SIG_IGN would make the kernel reap the agent itself
/// and lose its exit status (waitpid(2), NOTES). The forwarded ones keep theirs: one the
/// invoking shell ignores (nohup's SIGHUP) is dropped, as the runner drops it.
pub fn open() -> io::Result<Fd> {
    // SAFETY: plain libc calls on a local, zero-initialised sigset_t.
    unsafe {
        if libc::signal(libc::SIGCHLD, libc::SIG_DFL) == libc::SIG_ERR {
            return Err(io::Error::last_os_error());
        }
        let mut set: libc::sigset_t = mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in FORWARDED.iter().chain(&[libc::SIGCHLD]) {
            libc::sigaddset(&mut set, *sig);
        }
        cvt(libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()))?;
        Ok(Fd(cvt(libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK))?))
    }
}

/// The next signal from `fd`, or `None` when none is pending.
pub fn next(fd: &Fd) -> io::Result<Option<Got>> {
    // SAFETY: signalfd_siginfo is plain data; read(2) fills at most its size.
    let mut info: libc::signalfd_siginfo = unsafe { mem::zeroed() };
    let size = mem::size_of::<libc::signalfd_siginfo>();
    let n = unsafe { libc::read(fd.0, (&mut info as *mut libc::signalfd_siginfo).cast(), size) };
    if n < 0 {
        let err = io::Error::last_os_error();
        return match err.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
            _ => Err(err),
        };
    }
    if n as usize != size {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "short read from the signalfd"));
    }
    let sig = info.ssi_signo as libc::c_int;
    Ok(Some(if sig == libc::SIGCHLD { Got::Child } else { Got::Forward(sig) }))
}

/// Send `sig` to `pid` (our child: the jail's init or the agent); one that is gone already
/// is no error.
pub fn forward(pid: libc::pid_t, sig: libc::c_int) {
    // SAFETY: kill(2) with plain integers. ESRCH (exited meanwhile) is expected, and nothing
    // else can fail for our own child as root.
    unsafe { libc::kill(pid, sig) };
}
