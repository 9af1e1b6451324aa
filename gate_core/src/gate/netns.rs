//! Listener sockets created inside the sandbox netns.
//!
//! `setns(CLONE_NEWNET)` changes the namespace of the calling *thread* only, and a socket
//! stays in the namespace it was created in. So a short-lived thread enters the netns,
//! creates and binds the listeners, and exits; the runtime's threads never leave the host
//! netns, which is where upstream connections must start from.

use std::fs::File;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, UdpSocket};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use socket2::{Domain, Protocol, Socket, Type};

use super::GateError;

const BACKLOG: i32 = 1024;
/// The DNS stub's port (RFC 1035 §4.2).
pub const DNS_PORT: u16 = 53;

/// Bind `127.0.0.1:port` and `[::1]:port` inside the netns at `netns_path`.
///
/// `port` 0 picks a free port for IPv4 and reuses it for IPv6. IPv6 is skipped (with a
/// warning) when the netns has no `::1` (IPv6 disabled): the agent cannot use it either.
pub fn listeners(netns_path: &Path, port: u16) -> Result<Vec<TcpListener>, GateError> {
    in_netns(netns_path, move |path| bind_in_netns(path, port))
}

/// The DNS stub's sockets: UDP and TCP on 127.0.0.1:53 and [::1]:53 inside the netns
/// (IPv6 skipped when the netns has no `::1`).
pub fn dns_sockets(netns_path: &Path) -> Result<(Vec<UdpSocket>, Vec<TcpListener>), GateError> {
    in_netns(netns_path, |path| {
        let mut udp = Vec::new();
        for ip in [IpAddr::from(Ipv4Addr::LOCALHOST), IpAddr::from(Ipv6Addr::LOCALHOST)] {
            let addr = SocketAddr::new(ip, DNS_PORT);
            match datagram(addr) {
                Ok(s) => udp.push(s),
                Err(e) if ip.is_ipv6() && matches!(e.raw_os_error(), Some(libc::EAFNOSUPPORT | libc::EADDRNOTAVAIL)) => {}
                Err(source) => return Err(GateError::Bind { addr, path: path.clone(), source }),
            }
        }
        Ok((udp, bind_in_netns(path, DNS_PORT)?))
    })
}

/// Run `f` on a short-lived thread that has entered the netns at `netns_path`.
fn in_netns<T: Send + 'static>(
    netns_path: &Path,
    f: impl FnOnce(&PathBuf) -> Result<T, GateError> + Send + 'static,
) -> Result<T, GateError> {
    let path = netns_path.to_path_buf();
    let thread = std::thread::Builder::new()
        .name("gate-netns".into())
        .spawn(move || {
            let ns = File::open(&path).map_err(|source| GateError::NetnsOpen { path: path.clone(), source })?;
            // SAFETY: setns on an fd we own; it affects this thread only.
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                let source = io::Error::last_os_error();
                return Err(GateError::Setns { path: path.clone(), source });
            }
            f(&path)
        })
        .map_err(|e| GateError::Thread(format!("cannot start the listener thread: {e}")))?;
    thread
        .join()
        .map_err(|_| GateError::Thread("the listener thread panicked".into()))?
}

fn bind_in_netns(path: &Path, port: u16) -> Result<Vec<TcpListener>, GateError> {
    let v4 = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let l4 = listen(v4).map_err(|source| GateError::Bind { addr: v4, path: path.to_path_buf(), source })?;
    let port = l4.local_addr().map(|a| a.port()).unwrap_or(port);
    let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, port));
    match listen(v6) {
        Ok(l6) => Ok(vec![l4, l6]),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EAFNOSUPPORT | libc::EADDRNOTAVAIL)) => {
            tracing::warn!(netns = %path.display(), error = %e, "no IPv6 loopback in the sandbox; gate listens on IPv4 only");
            Ok(vec![l4])
        }
        Err(source) => Err(GateError::Bind { addr: v6, path: path.to_path_buf(), source }),
    }
}

fn datagram(addr: SocketAddr) -> io::Result<UdpSocket> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.bind(&addr.into())?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}
