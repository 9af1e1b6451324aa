//! The wait: poll(2) on the signalfd, the control socket and the timeout's timerfd until the
//! agent exits (runner.py's `_wait_forwarding_signals`).

use std::io;
use std::time::Duration;

use crate::args::Config;
use crate::children;
use crate::control::{self, Daemon};
use crate::resume;
use crate::signals::{self, Got};
use crate::sys::{cvt, say, write_all, Fd};

/// The exit code after --timeout (timeout(1)'s convention).
pub const EXIT_TIMEOUT: i32 = 124;

const GONE: &str =
    "the gatewrap daemon went away: the agent keeps running without egress (fail closed) until it exits";

/// Wait for `cfg.pid`, forwarding signals and reaping orphans; its exit code (124 after the
/// timeout, when the cgroup was killed) and the control socket to report it on (None: no
/// daemon serves the run any more). `signals` is [`signals::open`]'s fd. With `cfg.resume`,
/// a daemon that went away is tried again every [`resume::RETRY`] (see `resume`).
pub fn until_exit(cfg: &Config, signals: &Fd) -> io::Result<(i32, Option<libc::c_int>)> {
    let timer = cfg.timeout.map(arm).transpose()?;
    let mut control = Some(cfg.control_fd);
    // A daemon that took the run back: its connection (kept open until the exit is reported).
    let mut taken_back: Option<Fd> = None;
    let mut retry: Option<Fd> = None;
    loop {
        // Reap first, then look at the clock, as the runner does: an agent that exited just
        // as the timeout fired keeps its own code.
        if let Some(code) = children::reap(cfg.pid) {
            return Ok((code, control.map(|fd| keep(fd, &mut taken_back))));
        }
        let mut fds = [
            pollfd(signals.0),
            pollfd(control.unwrap_or(-1)), // a negative fd is skipped by poll(2)
            pollfd(timer.as_ref().map_or(-1, |t| t.0)),
            pollfd(retry.as_ref().map_or(-1, |t| t.0)),
        ];
        // SAFETY: a stack array of pollfds and its length.
        if let Err(err) = cvt(unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) }) {
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        while let Some(got) = signals::next(signals)? {
            if let Got::Forward(sig) = got {
                signals::forward(cfg.pid, sig);
            } // Got::Child: the reap at the top of the loop
        }
        if fds[1].revents != 0 && control::relay(control.unwrap_or(-1)) == Daemon::Gone {
            say(GONE);
            control = None;
            taken_back = None;
            if cfg.resume.is_some() {
                retry = Some(every(resume::RETRY)?);
            }
        }
        if fds[3].revents != 0 {
            drain_timer(retry.as_ref().map_or(-1, |t| t.0));
            match cfg.resume.as_ref().map(resume::attempt) {
                Some(resume::Tried::Back(fd)) => {
                    control = Some(fd.0);
                    taken_back = Some(fd);
                    retry = None;
                }
                Some(resume::Tried::Refused(why)) => {
                    say(&format!("no daemon takes the run back ({why}): it stays without egress until it exits"));
                    retry = None;
                }
                Some(resume::Tried::NotYet) | None => {}
            }
        }
        if fds[2].revents != 0 && children::reap(cfg.pid).is_none() {
            kill_tree(cfg);
            return Ok((EXIT_TIMEOUT, control.map(|fd| keep(fd, &mut taken_back))));
        }
    }
}

/// `fd`, with a taken-back daemon's connection left open for the report (not closed by the
/// drop of its owner here).
fn keep(fd: libc::c_int, taken_back: &mut Option<Fd>) -> libc::c_int {
    if let Some(owned) = taken_back.take() {
        std::mem::forget(owned);
    }
    fd
}

/// A periodic timerfd (CLOCK_MONOTONIC), readable every `period`.
fn every(period: Duration) -> io::Result<Fd> {
    // SAFETY: as in `arm`, with an interval.
    unsafe {
        let fd = Fd(cvt(libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_CLOEXEC | libc::TFD_NONBLOCK))?);
        let mut spec: libc::itimerspec = std::mem::zeroed();
        spec.it_value.tv_nsec = period.subsec_nanos() as libc::c_long;
        spec.it_value.tv_sec = period.as_secs() as libc::time_t;
        spec.it_interval = spec.it_value;
        cvt(libc::timerfd_settime(fd.0, 0, &spec, std::ptr::null_mut()))?;
        Ok(fd)
    }
}

/// Read a timerfd's expiry count (so it polls quiet until the next tick).
fn drain_timer(fd: libc::c_int) {
    let mut buf = [0u8; 8];
    let _ = crate::sys::read(fd, &mut buf);
}

fn pollfd(fd: libc::c_int) -> libc::pollfd {
    libc::pollfd { fd, events: libc::POLLIN, revents: 0 }
}

/// A timerfd (CLOCK_MONOTONIC) that becomes readable after `after`.
fn arm(after: Duration) -> io::Result<Fd> {
    // SAFETY: timerfd_create(2)/timerfd_settime(2) with a zeroed itimerspec on the stack.
    unsafe {
        let fd = Fd(cvt(libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_CLOEXEC | libc::TFD_NONBLOCK))?);
        // A zero it_value would disarm the timer: --timeout 0 fires after 1 ns instead.
        let after = after.max(Duration::from_nanos(1));
        let mut spec: libc::itimerspec = std::mem::zeroed();
        spec.it_value.tv_sec = after.as_secs().min(libc::time_t::MAX as u64) as libc::time_t;
        spec.it_value.tv_nsec = after.subsec_nanos() as libc::c_long;
        cvt(libc::timerfd_settime(fd.0, 0, &spec, std::ptr::null_mut()))?;
        Ok(fd)
    }
}

/// The timeout: say so, kill the run's cgroup (`cgroup.kill`, cgroup v2: SIGKILL to every
/// process in it and its descendants, forks included) and reap until the agent is gone.
fn kill_tree(cfg: &Config) {
    let secs = cfg.timeout.unwrap_or_default().as_secs_f64();
    say(&format!("--timeout {secs} s reached: killing the agent and its children"));
    let killed = match &cfg.cgroup_kill {
        Some(path) => write_file(path, b"1").map_err(|e| format!("{}: {e}", path.to_string_lossy())),
        None => Err("no --cgroup".to_owned()),
    };
    if let Err(why) = killed {
        say(&format!("could not kill the agent's cgroup ({why}): killing the agent's process only"));
    }
    // The agent's process itself too, so that the wait below ends whatever the cgroup held
    // (what it leaves is the daemon's teardown's, or `gatewrap gc`'s).
    // SAFETY: kill(2) of our own child, not reaped yet (so its pid cannot have been reused).
    unsafe { libc::kill(cfg.pid, libc::SIGKILL) };
    children::reap_until_gone(cfg.pid);
}

fn write_file(path: &std::ffi::CStr, bytes: &[u8]) -> io::Result<()> {
    // SAFETY: a NUL-terminated path; the fd is closed by Fd's drop.
    let fd = Fd(cvt(unsafe { libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) })?);
    write_all(fd.0, bytes)
}
