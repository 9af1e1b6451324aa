//! Listener sockets created inside the sandbox netns.
//!
//! `setns(CLONE_NEWNET)` changes the namespace of the calling *thread* only, and a socket
//! stays in the namespace it was created in. So a short-lived thread enters the netns,
//! creates and binds the listeners, and exits; the runtime's threads never leave the host
//! netns, which is where upstream connections must start from.
//!
//! One socket per service serves both loopback addresses: an IPv6 socket bound to `[::]`
//! with `IPV6_V6ONLY` off takes IPv4 connections and datagrams too, from v4-mapped
//! addresses (ipv6(7), RFC 3493 §5.3). A daemon serving thousands of sandboxes then holds
//! three sockets a sandbox instead of six (issue 23, target 4: its descriptors bound how many
//! it serves). The sandbox's netns has only `lo`, so the wildcard adds no interface; it does
//! take 127.0.0.0/8's other addresses, which the hooks refuse to the agent (it may reach only
//! the gate's 127.0.0.1 and ::1). Addresses the socket reports are given back as the client
//! made them ([`canonical`]: `127.0.0.1`, never `::ffff:127.0.0.1`), and the gate names the
//! two it serves ([`served`]). A netns without `::1` (IPv6 off) gets one IPv4 socket on
//! `127.0.0.1`.

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

/// The proxy's listener on `port` inside the netns at `netns_path`: one socket for
/// `127.0.0.1:port` and `[::1]:port` (IPv4 only when the netns has no `::1`).
///
/// `port` 0 picks a free port.
pub fn listeners(netns_path: &Path, port: u16) -> Result<Vec<TcpListener>, GateError> {
    in_netns(netns_path, move |path| {
        let addr = bind_addr(path, port)?;
        Ok(vec![listen(addr).map_err(|source| GateError::Bind { addr, path: path.clone(), source })?])
    })
}

/// The DNS stub's sockets: UDP and TCP on port 53 inside the netns, each one socket for
/// 127.0.0.1 and ::1 (IPv4 only when the netns has no `::1`).
pub fn dns_sockets(netns_path: &Path) -> Result<(Vec<UdpSocket>, Vec<TcpListener>), GateError> {
    in_netns(netns_path, |path| {
        let addr = bind_addr(path, DNS_PORT)?;
        let bind_err = |source| GateError::Bind { addr, path: path.clone(), source };
        Ok((vec![datagram(addr).map_err(bind_err)?], vec![listen(addr).map_err(bind_err)?]))
    })
}

/// The loopback addresses a socket bound at `local` serves: `127.0.0.1:PORT` and
/// `[::1]:PORT` for the dual-stack `[::]:PORT`, else `local` itself.
pub fn served(local: SocketAddr) -> Vec<SocketAddr> {
    if local.ip() == IpAddr::V6(Ipv6Addr::UNSPECIFIED) {
        vec![SocketAddr::from((Ipv4Addr::LOCALHOST, local.port())), SocketAddr::from((Ipv6Addr::LOCALHOST, local.port()))]
    } else {
        vec![local]
    }
}

/// `addr` as the client made it: a peer or local address of a dual-stack socket that is
/// v4-mapped (`::ffff:127.0.0.1`: an IPv4 connection or datagram, RFC 4291 §2.5.5.2) as
/// that IPv4 address; any other unchanged.
pub fn canonical(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
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

/// Where this thread's netns gets the gate's socket for `port`: `[::]` (both loopback
/// addresses, see the module's doc) when it has `::1`, else `127.0.0.1`.
fn bind_addr(path: &Path, port: u16) -> Result<SocketAddr, GateError> {
    let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, port));
    match has_ipv6_loopback() {
        Ok(true) => Ok(SocketAddr::from((Ipv6Addr::UNSPECIFIED, port))),
        Ok(false) => {
            tracing::warn!(netns = %path.display(), "no IPv6 loopback in the sandbox; gate listens on IPv4 only");
            Ok(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
        }
        Err(source) => Err(GateError::Bind { addr: v6, path: path.to_path_buf(), source }),
    }
}

/// Whether this thread's netns has `::1`: a UDP socket binds to it (port 0, closed at once).
/// No IPv6 in the kernel (EAFNOSUPPORT) or none on `lo` (EADDRNOTAVAIL): false.
fn has_ipv6_loopback() -> io::Result<bool> {
    let probe = Socket::new(Domain::IPV6, Type::DGRAM, Some(Protocol::UDP)).and_then(|s| {
        s.set_only_v6(true)?;
        s.bind(&SocketAddr::from((Ipv6Addr::LOCALHOST, 0)).into())
    });
    match probe {
        Ok(()) => Ok(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EAFNOSUPPORT | libc::EADDRNOTAVAIL)) => Ok(false),
        Err(e) => Err(e),
    }
}

fn datagram(addr: SocketAddr) -> io::Result<UdpSocket> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(false)?;
    }
    socket.bind(&addr.into())?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(false)?;
    }
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}
