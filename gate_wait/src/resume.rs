//! Coming back to a restarted daemon: while the agent runs without a daemon (its gate gone, so
//! without egress), the waiter tries the daemon's socket every [`RETRY`] and asks a new daemon
//! to take the run back with one line, `resume RUN_ID\n`, with its stderr attached (SCM_RIGHTS:
//! the run's notices go to the user's terminal again). The daemon answers `resumed\n` once
//! the run's gate serves again (the new connection is then the control socket), or
//! `refused: WHY\n` (the waiter stops trying and says why).

use std::io;
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

use crate::sys::{cvt, is_open, read, send_with_fd, write_all, Fd};

/// How often the waiter tries the socket while no daemon serves the run.
pub const RETRY: Duration = Duration::from_millis(500);
/// How long a daemon may take to answer `resume` (it starts the run's gate first), in ms.
const ANSWER_MS: libc::c_int = 30_000;

/// Where to come back to: the daemon's socket and the run's id.
#[derive(Debug, PartialEq, Clone)]
pub struct Resume {
    pub socket: std::path::PathBuf,
    pub run: String,
}

/// What one try gave.
#[derive(Debug)]
pub enum Tried {
    /// A daemon took the run back: the new control socket.
    Back(Fd),
    /// No daemon listens yet (or it did not answer): try again later.
    NotYet,
    /// A daemon refused (its reason): stop trying.
    Refused(String),
}

/// One try: connect, send `resume RUN_ID` with fd 2 attached, read the answer line.
pub fn attempt(to: &Resume) -> Tried {
    let Ok(fd) = connect(&to.socket) else { return Tried::NotYet };
    let line = format!("resume {}\n", to.run);
    // A closed stderr has nothing to attach (the daemon then shows the run's notices nowhere).
    let sent = if is_open(2) { send_with_fd(fd.0, line.as_bytes(), 2) } else { write_all(fd.0, line.as_bytes()) };
    if sent.is_err() {
        return Tried::NotYet;
    }
    match answer_line(fd.0) {
        Some(line) if line == "resumed" => Tried::Back(fd),
        Some(line) => Tried::Refused(line.strip_prefix("refused: ").unwrap_or(&line).to_owned()),
        None => Tried::NotYet,
    }
}

/// A connected unix stream socket to `path` (close-on-exec).
fn connect(path: &std::path::Path) -> io::Result<Fd> {
    // SAFETY: socket(2); the fd is owned by Fd from here on.
    let fd = Fd(cvt(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) })?);
    // SAFETY: a zeroed sockaddr_un is valid; sun_path is filled below within its size.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= addr.sun_path.len() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "socket path too long"));
    }
    for (dst, src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    // SAFETY: addr is a valid sockaddr_un of at least len bytes.
    cvt(unsafe { libc::connect(fd.0, (&addr as *const libc::sockaddr_un).cast(), len as libc::socklen_t) })?;
    Ok(fd)
}

/// The first line the daemon sends (without its newline), within [`ANSWER_MS`]; None at end of
/// file, on an error or after the wait.
fn answer_line(fd: libc::c_int) -> Option<String> {
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while got.len() < 4096 {
        let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one pollfd on the stack.
        if unsafe { libc::poll(&mut pfd, 1, ANSWER_MS) } <= 0 {
            return None;
        }
        // One byte at a time: what follows the line is the run's, read by the wait loop.
        match read(fd, &mut byte) {
            Ok(1) if byte[0] == b'\n' => return Some(String::from_utf8_lossy(&got).into_owned()),
            Ok(1) => got.push(byte[0]),
            _ => return None,
        }
    }
    None
}
