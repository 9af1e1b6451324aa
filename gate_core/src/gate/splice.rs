//! A CONNECT tunnel's bytes moved between the two TCP sockets with splice(2) through a
//! pipe, one pipe per direction: the kernel hands pages from one socket to the other and
//! the gate never copies them into its memory (a copying relay cost two copies and two
//! system calls per buffer, and reached a fifth of a direct download on loopback).
//!
//! Same contract as [`idle::relay`]: each direction runs until its source ends, then shuts
//! the other socket's sending side (as `copy_bidirectional`); the relay ends when both have,
//! on the first error, or after the idle timeout without a byte either way.
//! Source: splice(2), pipe(7) (`F_SETPIPE_SZ`), Linux only as the gate is.

use std::io;
use std::net::Shutdown;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::io::Interest;
use tokio::net::TcpStream;

use super::idle::{self, Activity, Ended};

/// Bytes asked of one splice(2), and the capacity a pipe is given (`F_SETPIPE_SZ`) once one
/// splice filled its default 64 KiB (the default is kept if the kernel refuses, e.g. over
/// /proc/sys/fs/pipe-max-size). Only a bulk transfer grows its pipe: a tunnel of short
/// exchanges (one request at a time, a TLS handshake) never fills 64 KiB, and growing every
/// pipe at the start cost each new tunnel two `fcntl`s and 256-slot rings to allocate and free.
const CHUNK: usize = 1024 * 1024;
/// A pipe's capacity before it is grown, in bytes (pipe(7): 16 pages).
const DEFAULT_PIPE: usize = 64 * 1024;
/// The error a relay ends with when its client finished sending and it may not stay
/// half-closed.
const HALF_CLOSED: &str = "the client finished sending and the tunnel may not stay half-closed";

/// A pipe, both ends non-blocking and close-on-exec.
struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl Pipe {
    fn new() -> io::Result<Pipe> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 writes.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: pipe2 succeeded, so both are open descriptors that nothing else owns.
        Ok(unsafe { Pipe { read: OwnedFd::from_raw_fd(fds[0]), write: OwnedFd::from_raw_fd(fds[1]) } })
    }

    /// Give the pipe [`CHUNK`] bytes of capacity; a failure leaves it as it was.
    fn grow(&self) {
        // SAFETY: F_SETPIPE_SZ takes an int.
        unsafe { libc::fcntl(self.write.as_raw_fd(), libc::F_SETPIPE_SZ, CHUNK as libc::c_int) };
    }
}

/// One splice(2) of up to `len` bytes from `from` to `to`, never blocking.
fn splice(from: RawFd, to: RawFd, len: usize) -> io::Result<usize> {
    let flags = libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK;
    // SAFETY: no offsets (both are a pipe or a socket); the descriptors are open for the call.
    let n = unsafe { libc::splice(from, std::ptr::null_mut(), to, std::ptr::null_mut(), len, flags) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Write all of `buf` to `to` (bytes hyper had read past the CONNECT head).
async fn write_all(to: &TcpStream, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        to.writable().await?;
        match to.try_write(buf) {
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Move bytes from `from` to `to` until `from` ends, then shut `to`'s sending side.
/// Returns the bytes moved.
async fn pump(from: &TcpStream, to: &TcpStream, pipe: Pipe, activity: &Activity) -> io::Result<u64> {
    let mut total = 0u64;
    let mut grown = false;
    loop {
        from.readable().await?;
        let n = match from.try_io(Interest::READABLE, || splice(from.as_raw_fd(), pipe.write.as_raw_fd(), CHUNK)) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            return match socket2::SockRef::from(to).shutdown(Shutdown::Write) {
                Err(e) if e.kind() != io::ErrorKind::NotConnected => Err(e),
                _ => Ok(total),
            };
        }
        activity.touch();
        // The pipe is emptied before the next read, so a read never finds it full.
        let mut left = n;
        while left > 0 {
            to.writable().await?;
            match to.try_io(Interest::WRITABLE, || splice(pipe.read.as_raw_fd(), to.as_raw_fd(), left)) {
                Ok(m) => left -= m,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        total += n as u64;
        // The pipe is empty again, so a larger capacity cannot fail for its contents.
        if !grown && n >= DEFAULT_PIPE {
            pipe.grow();
            grown = true;
        }
    }
}

/// Relay between the client `a` (with `a_read`, bytes it sent that hyper has read already)
/// and upstream `b` with splice(2); see the module doc. `a_finished` is called once the
/// client has finished sending and its end was passed upstream while upstream's side is
/// still open (that direction's pipe is closed by then): true goes on until upstream's end,
/// false ends the relay there (`Ended::Error` of [`HALF_CLOSED`]). `Err` (nothing relayed) when no pipe can be made
/// (e.g. out of file descriptors): the caller then copies instead.
pub async fn relay(a: &TcpStream, a_read: &[u8], b: &TcpStream, idle: Duration, a_finished: impl FnOnce() -> bool) -> Result<Ended, io::Error> {
    let (up, down) = (Pipe::new()?, Pipe::new()?);
    let activity = Activity::new();
    // Both directions are polled by this one task: no ordering beyond program order needed.
    let upstream_ended = AtomicBool::new(false);
    let both = async {
        write_all(b, a_read).await?;
        let upward = async {
            let n = pump(a, b, up, &activity).await?;
            match upstream_ended.load(Ordering::Relaxed) || a_finished() {
                true => Ok(n),
                false => Err(io::Error::other(HALF_CLOSED)),
            }
        };
        let downward = async {
            let n = pump(b, a, down, &activity).await?;
            upstream_ended.store(true, Ordering::Relaxed);
            Ok(n)
        };
        tokio::try_join!(upward, downward)
    };
    Ok(tokio::select! {
        r = both => match r {
            Ok((up, down)) => Ended::Closed(up + a_read.len() as u64, down),
            Err(e) => Ended::Error(e),
        },
        () = idle::watchdog(&activity, idle) => Ended::Idle,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|e| panic!("{e}"));
        let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let (a, b) = tokio::join!(TcpStream::connect(addr), l.accept());
        (a.unwrap_or_else(|e| panic!("{e}")), b.unwrap_or_else(|e| panic!("{e}")).0)
    }

    /// 20 MiB and some each way through the relay, with a first few bytes already read:
    /// every byte arrives, in order, and each side sees the other's end.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_relay_carries_every_byte_both_ways_and_passes_the_end_on() {
        let (mut client, gate_down) = pair().await;
        let (gate_up, mut server) = pair().await;
        let finished = Arc::new(AtomicBool::new(false));
        let f = finished.clone();
        let relay = tokio::spawn(async move { relay(&gate_down, b"early:", &gate_up, Duration::from_secs(30), move || {
            f.store(true, Ordering::SeqCst);
            true
        })
        .await
        });
        let data: Vec<u8> = (0..20 * 1024 * 1024 + 7).map(|i: u32| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
        let want = Sha256::digest([b"early:".as_slice(), &data].concat());
        let sent = data.clone();
        let (mut cr, mut cw) = client.split();
        let (mut sr, mut sw) = server.split();
        let client_side = async {
            cw.write_all(&sent).await?;
            cw.shutdown().await?;
            let mut back = Vec::new();
            cr.read_to_end(&mut back).await?;
            Ok::<_, io::Error>(back)
        };
        let server_side = async {
            let mut got = Vec::new();
            sr.read_to_end(&mut got).await?;
            sw.write_all(&got).await?;
            sw.shutdown().await?;
            Ok::<_, io::Error>(got)
        };
        let (back, got) = tokio::try_join!(client_side, server_side).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(Sha256::digest(&got), want, "upstream got every byte, in order");
        assert_eq!(Sha256::digest(&back), want, "the client got every byte back, in order");
        match relay.await.unwrap_or_else(|e| panic!("{e}")) {
            Ok(Ended::Closed(up, down)) => assert_eq!((up, down), (got.len() as u64, got.len() as u64)),
            other => panic!("{other:?}"),
        }
        assert!(finished.load(Ordering::SeqCst), "the client's end was told");
    }

    /// Upstream ends first, then the client: the tunnel was never half-closed by its client,
    /// so `a_finished` is not asked (a full half-closed bound must not cut or record it).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_ending_after_upstream_is_not_told_as_half_closed() {
        let (mut client, gate_down) = pair().await;
        let (gate_up, mut server) = pair().await;
        let relay = tokio::spawn(async move {
            relay(&gate_down, b"", &gate_up, Duration::from_secs(30), || panic!("asked after upstream's end")).await
        });
        server.write_all(b"bye").await.unwrap_or_else(|e| panic!("{e}"));
        server.shutdown().await.unwrap_or_else(|e| panic!("{e}"));
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got, b"bye");
        client.shutdown().await.unwrap_or_else(|e| panic!("{e}"));
        match relay.await.unwrap_or_else(|e| panic!("{e}")) {
            Ok(Ended::Closed(0, 3)) => {}
            other => panic!("{other:?}"),
        }
    }
}
