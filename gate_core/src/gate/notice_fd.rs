//! Notices written to a file descriptor of the run's own (e.g. its terminal, handed to a
//! daemon that serves many runs) instead of the process's stderr.
//!
//! Lines wait in a bounded queue for a writer thread, so a stalled terminal (Ctrl-S, a full
//! pipe) never blocks a runtime worker that other gates share: when [`QUEUE_LINES`] are
//! waiting, further lines are dropped (the audit log keeps every decision). The thread runs
//! only while lines wait: it is started by the first line queued and ends once the queue is
//! empty, so an idle run costs no thread (issue 23, target 4: one thread per sandbox kept for
//! its lifetime made a thousand idle runs a thousand threads of the daemon). The thread has
//! SIGPIPE blocked: a write to a pipe whose reader went away fails with EPIPE (ignored, like
//! every write error) and the signal stays pending on that thread only, whatever the
//! process's SIGPIPE disposition (Rust binaries ignore it; a cdylib inherits its host's).
//! The descriptor is closed once the [`FdSink`] is dropped and what was queued is written.

use std::collections::VecDeque;
use std::fs::File;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

/// Lines waiting for the writer thread before new ones are dropped.
pub const QUEUE_LINES: usize = 64;
/// The writer thread's stack, in bytes (it only calls write(2)).
const STACK_BYTES: usize = 64 * 1024;

#[derive(Debug, Default)]
struct Queue {
    lines: VecDeque<String>,
    /// A writer thread runs (it empties `lines`, then clears this and ends).
    writing: bool,
}

#[derive(Debug)]
struct Shared {
    out: File,
    queue: Mutex<Queue>,
}

/// The sending side of one gate's notice writer.
#[derive(Debug)]
pub struct FdSink {
    shared: Arc<Shared>,
}

impl FdSink {
    /// A sink that owns `fd` from now on (no thread until a line is sent).
    pub fn new(fd: OwnedFd) -> FdSink {
        FdSink { shared: Arc::new(Shared { out: File::from(fd), queue: Mutex::default() }) }
    }

    /// Queue one line (its newline included); dropped if [`QUEUE_LINES`] are waiting, or if
    /// no writer thread can be started.
    pub fn send(&self, line: String) {
        let mut q = self.shared.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.lines.len() >= QUEUE_LINES {
            return;
        }
        q.lines.push_back(line);
        if q.writing {
            return;
        }
        let shared = self.shared.clone();
        let started = std::thread::Builder::new().name("gate-notice".into()).stack_size(STACK_BYTES).spawn(move || {
            block_sigpipe();
            loop {
                let line = {
                    let mut q = shared.queue.lock().unwrap_or_else(|p| p.into_inner());
                    match q.lines.pop_front() {
                        Some(l) => l,
                        None => {
                            q.writing = false;
                            return;
                        }
                    }
                };
                // EPIPE (the client went away), EBADF, EIO...: the notice is lost, the
                // decision is in the audit log all the same.
                let _ = (&shared.out).write_all(line.as_bytes());
            }
        });
        match started {
            Ok(_) => q.writing = true,
            Err(_) => q.lines.clear(),
        }
    }

    /// Whether no writer thread runs (nothing waits to be written).
    #[cfg(test)]
    fn idle(&self) -> bool {
        !self.shared.queue.lock().unwrap_or_else(|p| p.into_inner()).writing
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
        let sink = FdSink::new(w);
        sink.send("one\n".into());
        sink.send("two\n".into());
        drop(sink);
        let mut got = String::new();
        r.read_to_string(&mut got).expect("read until the writer closes");
        assert_eq!(got, "one\ntwo\n");
    }

    #[test]
    fn a_sink_has_no_thread_but_while_lines_wait() {
        let (r, w) = pipe();
        let sink = FdSink::new(w);
        assert!(sink.idle(), "no thread before the first line");
        sink.send("one\n".into());
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(r), &mut line).expect("read the line");
        assert_eq!(line, "one\n");
        while !sink.idle() {
            std::thread::yield_now();
        }
    }

    #[test]
    fn a_reader_gone_is_ignored() {
        let (r, w) = pipe();
        drop(r);
        let sink = FdSink::new(w);
        for _ in 0..3 {
            sink.send("nobody reads this\n".into());
        }
        drop(sink);
    }
}
