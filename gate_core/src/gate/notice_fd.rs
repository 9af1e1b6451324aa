//! Notices written to a file descriptor of the run's own (e.g. its terminal, handed to a
//! daemon that serves many runs) instead of the process's stderr.
//!
//! A writer thread per gate owns the descriptor and takes lines from a bounded queue, so a
//! stalled terminal (Ctrl-S, a full pipe) never blocks a runtime worker that other gates
//! share: when [`QUEUE_LINES`] are waiting, further lines are dropped (the audit log keeps
//! every decision). The thread has SIGPIPE blocked: a write to a pipe whose reader went
//! away fails with EPIPE (ignored, like every write error) and the signal stays pending on
//! that thread only, whatever the process's SIGPIPE disposition (Rust binaries ignore it;
//! a cdylib inherits its host's). The thread ends, closing the descriptor, when the gate
//! that owns the [`FdSink`] is dropped.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::sync::mpsc::{self, SyncSender};

/// Lines waiting for the writer thread before new ones are dropped.
pub const QUEUE_LINES: usize = 64;
/// The writer thread's stack, in bytes (it only calls write(2)).
const STACK_BYTES: usize = 64 * 1024;

/// The sending side of one gate's notice writer.
#[derive(Debug)]
pub struct FdSink {
    lines: SyncSender<String>,
}

impl FdSink {
    /// Start the writer thread `gate-notice`, which owns `fd` from now on.
    ///
    /// Errors: the OS error of creating the thread (`fd` is closed then).
    pub fn start(fd: OwnedFd) -> io::Result<FdSink> {
        let (tx, rx) = mpsc::sync_channel::<String>(QUEUE_LINES);
        std::thread::Builder::new().name("gate-notice".into()).stack_size(STACK_BYTES).spawn(move || {
            block_sigpipe();
            let mut out = File::from(fd);
            for line in rx {
                // EPIPE (the client went away), EBADF, EIO...: the notice is lost, the
                // decision is in the audit log all the same.
                let _ = out.write_all(line.as_bytes());
            }
        })?;
        Ok(FdSink { lines: tx })
    }

    /// Queue one line (its newline included); dropped if [`QUEUE_LINES`] are waiting.
    pub fn send(&self, line: String) {
        let _ = self.lines.try_send(line);
    }
}

/// Block SIGPIPE on the calling thread.
fn block_sigpipe() {
    // SAFETY: sigset_t is plain data, initialised by sigemptyset before use; the mask
    // change applies to this thread only.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGPIPE);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::FromRawFd;

    fn pipe() -> (File, OwnedFd) {
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills both slots on success; each fd is owned once below.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        unsafe { (File::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
    }

    #[test]
    fn lines_reach_the_fd_and_it_is_closed_when_the_sink_drops() {
        let (mut r, w) = pipe();
        let sink = FdSink::start(w).expect("writer thread");
        sink.send("one\n".into());
        sink.send("two\n".into());
        drop(sink);
        let mut got = String::new();
        r.read_to_string(&mut got).expect("read until the writer closes");
        assert_eq!(got, "one\ntwo\n");
    }

    #[test]
    fn a_reader_gone_is_ignored() {
        let (r, w) = pipe();
        drop(r);
        let sink = FdSink::start(w).expect("writer thread");
        for _ in 0..3 {
            sink.send("nobody reads this\n".into());
        }
        drop(sink);
    }
}
