//! Clients and upstreams for the gate tests: run code inside a netns, talk to the gate,
//! read the audit log.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

/// A tiny upstream on host loopback: answers every request with what it received.
pub fn upstream() -> SocketAddr {
    serve(TcpListener::bind("127.0.0.1:0").expect("bind upstream"))
}

/// The same upstream listening on `bind` (e.g. `[::]:0`, dual-stack) inside the netns `ns`.
pub fn upstream_in(ns: PathBuf, bind: &'static str) -> SocketAddr {
    serve(in_netns(ns, move || TcpListener::bind(bind).expect("bind upstream in netns")))
}

fn serve(l: TcpListener) -> SocketAddr {
    let addr = l.local_addr().expect("addr");
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut r = BufReader::new(&s);
                let mut head = String::new();
                loop {
                    let mut line = String::new();
                    match r.read_line(&mut line) {
                        Ok(0) | Err(_) => return,
                        Ok(_) if line == "\r\n" => break,
                        Ok(_) => head.push_str(&line.to_ascii_lowercase()),
                    }
                }
                let body = format!("got {head}");
                let resp = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
                let _ = (&s).write_all(resp.as_bytes());
            });
        }
    });
    addr
}

/// Run `f` on a thread that has entered the netns at `ns`.
pub fn in_netns<T: Send + 'static>(ns: PathBuf, f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        let file = std::fs::File::open(&ns).expect("open netns");
        // SAFETY: setns on this thread only.
        assert_eq!(unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) }, 0, "setns");
        f()
    })
    .join()
    .expect("client thread")
}

pub fn connect(gate: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(gate).expect("connect to the gate");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    s
}

/// Send raw bytes to the gate from inside the netns; return the whole response.
pub fn exchange(ns: PathBuf, gate: SocketAddr, request: String) -> String {
    in_netns(ns, move || {
        let mut s = connect(gate);
        s.write_all(request.as_bytes()).expect("send");
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    })
}

/// Read a response head byte by byte (so tunnel bytes after it stay unread).
pub fn read_head(s: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut b) {
            Ok(1) => head.push(b[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// CONNECT, then (if 200) one request through the tunnel. Returns (head, tunnel response).
pub fn tunnel(ns: PathBuf, gate: SocketAddr, target: String) -> (String, String) {
    in_netns(ns, move || {
        let mut s = connect(gate);
        s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes()).expect("send");
        let head = read_head(&mut s);
        let mut body = String::new();
        if head.starts_with("HTTP/1.1 200") {
            s.write_all(b"GET /tunnel HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").expect("send");
            let _ = s.read_to_string(&mut body);
        } else {
            let _ = s.read_to_string(&mut body);
        }
        (head, body)
    })
}

pub fn audit_lines(path: &PathBuf) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("audit line is JSON"))
        .collect()
}

/// The decision records of the log: every line but the `admit` ones (each allowed request
/// or tunnel has one, written before the gate dials).
pub fn decision_lines(path: &PathBuf) -> Vec<Value> {
    audit_lines(path).into_iter().filter(|v| v["event"] != "admit").collect()
}

pub fn find<'a>(lines: &'a [Value], event: &str, target: &str) -> &'a Value {
    lines
        .iter()
        .find(|v| v["event"] == event && v["target"] == target)
        .unwrap_or_else(|| panic!("no {event} record for {target}: {lines:#?}"))
}

