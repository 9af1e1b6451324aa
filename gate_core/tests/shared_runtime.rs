//! Gates on the process-wide shared runtime (root): several serve at once, each in its own
//! netns, and stopping one ends exactly its listeners, connections and tunnels.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use _gate_core::audit::AuditLog;
use _gate_core::gate::{Gate, GateConfig};
use _gate_core::policy::file::from_toml;
use common::client::{connect, exchange, in_netns, read_head, upstream};
use common::{require_root, Netns, TempDir};

/// An upstream on host loopback that echoes what each connection sends, until it closes.
fn echo_upstream() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind echo upstream");
    let addr = l.local_addr().expect("addr");
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut buf = [0u8; 1024];
                let mut s = s;
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 || s.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// A gate on the shared runtime in `ns`, allowing `127.0.0.1` on `ports`; notices (if
/// `notice_fd`) go there.
fn start(ns: &Netns, ports: &[u16], audit: &PathBuf, notice_fd: Option<OwnedFd>) -> Gate {
    start_with(ns, ports, "", audit, notice_fd, None)
}

/// [`start`] with `more_rules` (TOML) after the allow rule and an approvals store `state`.
fn start_with(ns: &Netns, ports: &[u16], more_rules: &str, audit: &PathBuf, notice_fd: Option<OwnedFd>, state: Option<String>) -> Gate {
    let list = ports.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", ");
    let text = format!("default = \"deny\"\n\n[[rule]]\nhost = \"127.0.0.1\"\nports = [{list}]\naction = \"allow\"\n{more_rules}");
    Gate::start(GateConfig {
        notices: notice_fd.is_some(),
        dns_stub: true,
        state,
        notice_fd,
        shared_runtime: true,
        ..common::gate_config(
            ns,
            Arc::new(RwLock::new(from_toml(&text, "policy.toml").expect("policy"))),
            Arc::new(AuditLog::open(audit).expect("audit")),
        )
    })
    .expect("gate starts")
}

/// A tunnel through `gate` (from inside `ns`) to `target`, opened and shown to echo.
fn open_tunnel(ns: PathBuf, gate: SocketAddr, target: SocketAddr) -> TcpStream {
    in_netns(ns, move || {
        let mut s = connect(gate);
        s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes()).expect("send");
        let head = read_head(&mut s);
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert_eq!(echo(&mut s, b"ping"), Some(b"ping".to_vec()), "the tunnel echoes");
        s
    })
}

/// Send `msg` through the tunnel and read as many bytes back; `None` if the tunnel is cut.
fn echo(s: &mut TcpStream, msg: &[u8]) -> Option<Vec<u8>> {
    s.write_all(msg).ok()?;
    let mut back = vec![0u8; msg.len()];
    match s.read_exact(&mut back) {
        Ok(()) => Some(back),
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => panic!("the tunnel neither echoed nor closed"),
        Err(_) => None,
    }
}

fn get(ns: &Netns, gate: SocketAddr, url: &str) -> String {
    let host = url.trim_start_matches("http://").split('/').next().unwrap_or_default().to_string();
    exchange(ns.path(), gate, format!("GET {url} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"))
}

/// How a connect from inside `ns` to `addr` ends: Ok, or the error's kind.
fn connect_from(ns: &Netns, addr: SocketAddr) -> Result<(), ErrorKind> {
    in_netns(ns.path(), move || TcpStream::connect(addr).map(drop).map_err(|e| e.kind()))
}

#[test]
fn stopping_one_shared_runtime_gate_ends_its_work_and_nothing_of_the_others() {
    require_root();
    let (na, nb) = (Netns::new("rt-a"), Netns::new("rt-b"));
    let (up, echo_up) = (upstream(), echo_upstream());
    let dir = TempDir::new("shared-rt");
    let (audit_a, audit_b) = (dir.path.join("a.jsonl"), dir.path.join("b.jsonl"));
    let a = start(&na, &[up.port(), echo_up.port()], &audit_a, None);
    let b = start(&nb, &[up.port(), echo_up.port()], &audit_b, None);
    let (ga, gb) = (a.listen_addrs()[0], b.listen_addrs()[0]);
    let ok = format!("http://127.0.0.1:{}/x", up.port());

    // Both serve at once, each its own counts.
    for _ in 0..2 {
        assert!(get(&na, ga, &ok).starts_with("HTTP/1.1 200"));
    }
    assert!(get(&nb, gb, &ok).starts_with("HTTP/1.1 200"));
    assert!(get(&nb, gb, "http://denied.test/").starts_with("HTTP/1.1 403"));
    assert_eq!(a.counts(), (2, 0, 0));
    assert_eq!(b.counts(), (1, 1, 0));
    let mut tunnel_a = open_tunnel(na.path(), ga, echo_up);
    let mut tunnel_b = open_tunnel(nb.path(), gb, echo_up);
    for t in [&tunnel_a, &tunnel_b] {
        t.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    }

    a.stop();
    assert_eq!(a.live_tasks(), 0, "every task of the stopped gate ended");
    // A's tunnel is cut, its listeners (proxy and DNS stub) refuse; B's go on.
    assert_eq!(echo(&mut tunnel_a, b"after"), None, "the stopped gate's tunnel still carries bytes");
    assert_eq!(echo(&mut tunnel_b, b"still"), Some(b"still".to_vec()));
    for addr in a.listen_addrs().iter().copied().chain([SocketAddr::from(([127, 0, 0, 1], 53))]) {
        assert_eq!(connect_from(&na, addr), Err(ErrorKind::ConnectionRefused), "{addr} of the stopped gate");
    }
    for addr in b.listen_addrs().iter().copied().chain([SocketAddr::from(([127, 0, 0, 1], 53))]) {
        assert_eq!(connect_from(&nb, addr), Ok(()), "{addr} of the running gate");
    }
    assert!(get(&nb, gb, &ok).starts_with("HTTP/1.1 200"));
    let denied = get(&nb, gb, "http://denied.test/");
    assert!(denied.starts_with("HTTP/1.1 403"), "{denied}");
    assert_eq!(a.counts(), (3, 0, 0), "A: two requests and its tunnel");
    assert_eq!(b.counts(), (3, 2, 0), "B: two requests, its tunnel, two denials");
    assert!(b.live_tasks() > 0);
    b.stop();
    assert_eq!(echo(&mut tunnel_b, b"gone"), None);
}

/// A pipe: (read end, write end), both close-on-exec.
fn pipe() -> (std::fs::File, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills both slots on success; each fd is owned once below.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0, "pipe2");
    unsafe { (std::fs::File::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

#[test]
fn a_request_held_for_approval_ends_when_its_gate_stops_and_the_other_gate_serves_on() {
    require_root();
    let (na, nb) = (Netns::new("rt-held"), Netns::new("rt-held-b"));
    let up = upstream();
    let dir = TempDir::new("shared-rt-held");
    let (read_end, write_end) = pipe();
    let state = format!("sqlite:{}", dir.path.join("state.db").display());
    let ask = "\n[[rule]]\nhost = \"held.test\"\naction = \"ask\"\n";
    let a = start_with(&na, &[1], ask, &dir.path.join("a.jsonl"), Some(write_end), Some(state));
    let b = start(&nb, &[up.port()], &dir.path.join("b.jsonl"), None);
    let ga = a.listen_addrs()[0];
    let held = std::thread::spawn({
        let path = na.path();
        move || exchange(path, ga, "GET http://held.test/x HTTP/1.1\r\nHost: held.test\r\nConnection: close\r\n\r\n".into())
    });
    // The approval's notice is said before the request waits: it is held from then on.
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(read_end), &mut line).expect("read the approval notice");
    assert!(line.starts_with("gatewrap: approval ap-"), "{line}");
    a.stop();
    assert_eq!(a.live_tasks(), 0, "the held request's task ended");
    let answer = held.join().expect("client thread");
    assert!(answer.is_empty(), "a stopped gate sends nothing: {answer}");
    assert!(get(&nb, b.listen_addrs()[0], &format!("http://127.0.0.1:{}/y", up.port())).starts_with("HTTP/1.1 200"));
}

#[test]
fn notices_go_to_the_notice_fd() {
    require_root();
    let ns = Netns::new("rt-notice");
    let dir = TempDir::new("shared-rt-notice");
    let (mut read_end, write_end) = pipe();
    let gate = start(&ns, &[1], &dir.path.join("audit.jsonl"), Some(write_end));
    let resp = get(&ns, gate.listen_addrs()[0], "http://denied.test/x");
    assert!(resp.starts_with("HTTP/1.1 403"), "{resp}");
    // The gate owns the write end: once it is dropped, the pipe ends.
    gate.stop();
    drop(gate);
    let mut got = String::new();
    read_end.read_to_string(&mut got).expect("read the notices");
    assert_eq!(got, "gatewrap: denied GET denied.test:80 (policy: default deny)\n");
}
