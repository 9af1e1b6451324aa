//! gatewrap-wait: the agent's parent in gatewrap's shared mode.
//!
//! `gatewrap run` (Python, 3.4 MB private) asks the daemon for a sandbox, spawns the agent and
//! then execve(2)s this program, which, being the same process, stays the agent's parent:
//! children, the signal mask, pending signals and PR_SET_CHILD_SUBREAPER survive the exec
//! (prctl(2), execve(2)). It forwards signals, reaps, kills the cgroup at --timeout, reports
//! the exit code to the daemon and exits with it. `--help` for the command line.
//!
//! `gatewrap-wait --init -- PROGRAM [ARG...]` is the jail's init instead (pid 1 of the run's
//! pid namespace, in tini's place: see `init`), in both modes; one binary, so its pages are
//! shared with the waiters'.

mod args;
mod children;
mod control;
mod init;
mod resume;
mod signals;
mod sys;
mod wait;

use std::process::exit;

use args::{Config, Parsed};

/// gatewrap's own failure (as `docker run` and env(1)).
pub const EXIT_GATEWRAP: i32 = 125;

fn main() {
    let argv: Vec<_> = std::env::args_os().skip(1).collect();
    if let Some(rest) = args::init_command(&argv) {
        exit(init::run(rest))
    }
    let cfg = match args::parse(argv) {
        Ok(Parsed::Help) => {
            let _ = sys::write_all(1, args::USAGE.as_bytes());
            exit(0)
        }
        Ok(Parsed::Run(cfg)) => cfg,
        Err(why) => {
            sys::fail(&format!("{why} (--help for usage)"));
            exit(EXIT_GATEWRAP)
        }
    };
    match run(&cfg) {
        Ok(code) => exit(code),
        Err(why) => {
            sys::fail(&why);
            exit(EXIT_GATEWRAP)
        }
    }
}

/// Wait for the agent and report its end; its exit code. `Err` (exit 125) before the wait
/// starts: a pid that is not our child, a closed control fd, no signalfd.
fn run(cfg: &Config) -> Result<i32, String> {
    if !sys::is_open(cfg.control_fd) {
        return Err(format!("--control-fd {}: not an open file descriptor", cfg.control_fd));
    }
    // Rust's runtime ignores SIGPIPE already; said here since a write to a daemon that died
    // must fail with EPIPE, not kill the agent's parent.
    // SAFETY: setting a disposition.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    let signals = signals::open().map_err(|e| format!("cannot read signals through a signalfd: {e}"))?;
    let (code, control) = match children::check(cfg.pid) {
        Err(e) => return Err(format!("--pid {}: not a child of this process ({e})", cfg.pid)),
        Ok(Some(code)) => (code, Some(cfg.control_fd)), // exited before the exec
        Ok(None) => wait::until_exit(cfg, &signals).map_err(|e| format!("waiting for the agent failed: {e}"))?,
    };
    match control {
        Some(fd) => control::report_end(fd, code),
        None => sys::say(control::UNRECORDED),
    }
    Ok(code)
}
