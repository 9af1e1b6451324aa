//! The control socket: a connected unix stream socket to the gatewrap daemon.
//!
//! The daemon's side of the protocol is two things: whatever it sends is for the user and is
//! copied to stderr verbatim (after the agent's end, the run's summary line); the waiter sends
//! one line, `exit CODE\n`, when the agent has exited, and then reads until end of file.

use std::io;

use crate::sys::{read, say, write_all};

/// How long the waiter waits for the daemon's answer to `exit CODE` (its teardown kills and
/// removes the cgroup, waiting up to 5 s, then records the run), in milliseconds.
const ANSWER_WAIT_MS: libc::c_int = 60_000;

/// The daemon went away before the run's end was recorded.
pub const UNRECORDED: &str =
    "the gatewrap daemon went away before the run's end was recorded; sudo gatewrap gc collects the sandbox";

/// The state of the daemon's side while the agent runs.
#[derive(Debug, PartialEq)]
pub enum Daemon {
    There,
    /// End of file (or an error) on the socket: the daemon died.
    Gone,
}

/// Read what the daemon sent (the socket is readable) and copy it to stderr.
pub fn relay(fd: libc::c_int) -> Daemon {
    let mut buf = [0u8; 4096];
    match read(fd, &mut buf) {
        Ok(0) | Err(_) => Daemon::Gone,
        Ok(n) => {
            let _ = write_all(2, &buf[..n]);
            Daemon::There
        }
    }
}

/// Tell the daemon the agent's exit code, then copy its answer to stderr until end of file.
/// Says [`UNRECORDED`] on stderr if the write fails or no answer comes.
pub fn report_end(fd: libc::c_int, code: i32) {
    let line = format!("exit {code}\n");
    let answered = write_all(fd, line.as_bytes()).is_ok() && copy_answer(fd).unwrap_or(false);
    if !answered {
        say(UNRECORDED);
    }
}

/// Copy the socket's bytes to stderr until end of file; whether any came.
fn copy_answer(fd: libc::c_int) -> io::Result<bool> {
    let mut buf = [0u8; 4096];
    let mut any = false;
    loop {
        let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one pollfd on the stack.
        let ready = unsafe { libc::poll(&mut pfd, 1, ANSWER_WAIT_MS) };
        if ready == 0 {
            return Ok(any); // no answer in time: said as unrecorded when nothing came
        }
        if ready < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        match read(fd, &mut buf) {
            Ok(0) => return Ok(any),
            Ok(n) => {
                any = true;
                let _ = write_all(2, &buf[..n]);
            }
            Err(_) => return Ok(any),
        }
    }
}
