//! The gate in a real netns (root): forward, CONNECT, denial, upstream failures, audit lines.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use _gate_core::audit::AuditLog;
use _gate_core::gate::{Gate, GateConfig};
use _gate_core::policy::{file::from_toml, Mode, Policy};
use common::{is_root, Netns, TempDir};
use serde_json::Value;

/// A tiny upstream on host loopback: answers every request with what it received.
fn upstream() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind upstream");
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

/// An upstream that accepts and never answers.
fn silent_upstream() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind silent upstream");
    let addr = l.local_addr().expect("addr");
    std::thread::spawn(move || {
        let held: Vec<TcpStream> = l.incoming().flatten().collect();
        drop(held);
    });
    addr
}

/// Run `f` on a thread that has entered the netns at `ns`.
fn in_netns<T: Send + 'static>(ns: PathBuf, f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        let file = std::fs::File::open(&ns).expect("open netns");
        // SAFETY: setns on this thread only.
        assert_eq!(unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) }, 0, "setns");
        f()
    })
    .join()
    .expect("client thread")
}

fn connect(gate: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(gate).expect("connect to the gate");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    s
}

/// Send raw bytes to the gate from inside the netns; return the whole response.
fn exchange(ns: PathBuf, gate: SocketAddr, request: String) -> String {
    in_netns(ns, move || {
        let mut s = connect(gate);
        s.write_all(request.as_bytes()).expect("send");
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    })
}

/// Read a response head byte by byte (so tunnel bytes after it stay unread).
fn read_head(s: &mut TcpStream) -> String {
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
fn tunnel(ns: PathBuf, gate: SocketAddr, target: String) -> (String, String) {
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

fn audit_lines(path: &PathBuf) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("audit line is JSON"))
        .collect()
}

fn find<'a>(lines: &'a [Value], event: &str, target: &str) -> &'a Value {
    lines
        .iter()
        .find(|v| v["event"] == event && v["target"] == target)
        .unwrap_or_else(|| panic!("no {event} record for {target}: {lines:#?}"))
}

#[test]
fn gate_forwards_tunnels_denies_and_audits() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let ns = Netns::new("gate");
    let up = upstream();
    let closed = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("closed port");
    let silent = silent_upstream();
    // A nameserver that never answers: proves denied names are not resolved.
    let dns = UdpSocket::bind("127.0.0.1:0").expect("dns socket");
    let dir = TempDir::new("gate-test");
    let audit_path = dir.path.join("audit.jsonl");

    let text = format!(
        "default = \"deny\"\n\n[[rule]]\nhost = \"127.0.0.1\"\nports = [{}, {}, {}]\naction = \"allow\"\n\n[[rule]]\nhost = \"nx.test\"\naction = \"allow\"\n",
        up.port(),
        closed.port(),
        silent.port()
    );
    let policy = Arc::new(RwLock::new(from_toml(&text, "policy.toml").expect("policy")));
    let gate = Gate::start(GateConfig {
        run_id: "gw-test".into(),
        netns_path: ns.path(),
        policy: policy.clone(),
        audit: Arc::new(AuditLog::open(&audit_path).expect("audit")),
        listen_port: 0,
        nameservers: Some(vec![dns.local_addr().expect("dns addr").to_string()]),
        connect_timeout: Duration::from_secs(1),
    })
    .expect("gate starts");
    let addrs = gate.listen_addrs().to_vec();
    assert_eq!(addrs.len(), 2, "IPv4 and IPv6 listeners: {addrs:?}");
    let (g4, g6) = (addrs[0], addrs[1]);
    assert!(TcpStream::connect(g4).is_err(), "the gate is not reachable from the host netns");

    // 1. Absolute-form request, allowed by rule 1: forwarded in origin form.
    let target = format!("http://127.0.0.1:{}/hello?x=1", up.port());
    let resp = exchange(
        ns.path(),
        g4,
        format!("GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nProxy-Connection: keep-alive\r\nProxy-Authorization: Basic eDp5\r\nConnection: close, x-secret\r\nX-Secret: 1\r\n\r\n", up.port()),
    );
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert!(resp.contains("got get /hello?x=1 http/1.1"), "origin form upstream: {resp}");
    for hop in ["proxy-connection", "proxy-authorization", "x-secret"] {
        assert!(!resp.contains(hop), "{hop} must not be forwarded: {resp}");
    }

    // 2. CONNECT over IPv4 and IPv6 listeners, allowed: 200 then a tunnel.
    for g in [g4, g6] {
        let (head, body) = tunnel(ns.path(), g, format!("127.0.0.1:{}", up.port()));
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(body.contains("got get /tunnel"), "{body}");
    }

    // 3. Denied by default: 403 with the rule and how to allow it; the name is never resolved.
    let resp = exchange(ns.path(), g4, "GET http://Denied.Test./x HTTP/1.1\r\nHost: denied.test\r\nConnection: close\r\n\r\n".into());
    assert!(resp.starts_with("HTTP/1.1 403"), "{resp}");
    assert!(resp.to_ascii_lowercase().contains("x-gatewrap-decision: denied"), "{resp}");
    assert!(resp.contains(
        "gatewrap: egress to denied.test:80 was denied (default deny).\nTo allow it, run with --allow denied.test:80 or add to your policy:\n  [[rule]]\n  host = \"denied.test\"\n  port = 80\n  action = \"allow\"\n"
    ), "{resp}");
    let (head, body) = tunnel(ns.path(), g4, "denied.test:443".into());
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    assert!(body.contains("egress to denied.test:443 was denied (default deny)"), "{body}");
    let (head, _) = tunnel(ns.path(), g4, format!("127.0.0.1:{}", up.port() ^ 1));
    assert!(head.starts_with("HTTP/1.1 403"), "unlisted port: {head}");
    dns.set_nonblocking(true).expect("nonblocking");
    let mut buf = [0u8; 512];
    assert!(dns.recv_from(&mut buf).is_err(), "a denied name was sent to DNS");

    // 4. Upstream failures: refused -> 502, DNS timeout -> 504; both audited as failed.
    let (head, body) = tunnel(ns.path(), g4, format!("127.0.0.1:{}", closed.port()));
    assert!(head.starts_with("HTTP/1.1 502"), "{head}");
    assert!(body.contains("upstream: connection refused"), "{body}");
    let resp = exchange(ns.path(), g4, "GET http://nx.test/ HTTP/1.1\r\nHost: nx.test\r\nConnection: close\r\n\r\n".into());
    assert!(resp.starts_with("HTTP/1.1 504"), "{resp}");
    assert!(resp.contains("dns: timeout resolving nx.test"), "{resp}");

    // 5. Not a proxy request: 400 with a hint.
    let resp = exchange(ns.path(), g4, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".into());
    assert!(resp.starts_with("HTTP/1.1 400"), "{resp}");
    assert!(resp.contains("this is a forward proxy; set HTTP_PROXY="), "{resp}");
    let resp = exchange(ns.path(), g4, "GET https://x.test/ HTTP/1.1\r\nHost: x.test\r\nConnection: close\r\n\r\n".into());
    assert!(resp.starts_with("HTTP/1.1 400"), "{resp}");
    // A head over the limit is refused by hyper without reaching the service.
    let big = format!("GET http://127.0.0.1:{}/ HTTP/1.1\r\nX-Big: {}\r\n\r\n", up.port(), "a".repeat(100_000));
    let resp = exchange(ns.path(), g4, big);
    assert!(resp.is_empty() || resp.starts_with("HTTP/1.1 431"), "{}", &resp[..resp.len().min(300)]);

    // 6. Credentials in the URL stay out of the audit log.
    let resp = exchange(ns.path(), g4, format!("GET http://user:hunter2@127.0.0.1:{}/cred HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", up.port()));
    assert!(resp.starts_with("HTTP/1.1 200"), "{}", &resp[..resp.len().min(300)]);

    // 7. A client that gives up while the upstream is silent still leaves a record.
    let silent_target = format!("http://127.0.0.1:{}/slow", silent.port());
    let req = format!("GET {silent_target} HTTP/1.1\r\nHost: x\r\n\r\n");
    in_netns(ns.path(), move || {
        let mut s = connect(g4);
        s.write_all(req.as_bytes()).expect("send");
        std::thread::sleep(Duration::from_millis(200));
    });

    // 8. Report mode: a denied destination goes through and the record says so.
    policy.write().expect("lock").mode = Mode::Report;
    let (head, _) = tunnel(ns.path(), g4, format!("localhost:{}", up.port()));
    assert!(head.starts_with("HTTP/1.1 200"), "report mode lets it through: {head}");
    policy.write().expect("lock").mode = Mode::Enforce;

    // The audit log: one record per decision, with the documented fields.
    let lines = audit_lines(&audit_path);
    let fwd = find(&lines, "request", &target);
    assert_eq!(fwd["decision"], "allowed");
    assert_eq!(fwd["status"], 200);
    assert_eq!(fwd["proto"], "http");
    assert_eq!(fwd["rule"], "policy.toml:rule[1]");
    assert_eq!(fwd["reason"], "policy: rule policy.toml:rule[1]");
    assert_eq!(fwd["dst_ip"], "127.0.0.1");
    assert_eq!(fwd["run"], "gw-test");
    assert!(fwd["client"].as_str().is_some_and(|c| c.starts_with("127.0.0.1:")), "{fwd}");
    let keys: Vec<&String> = fwd.as_object().map(|o| o.keys().collect()).unwrap_or_default();
    assert_eq!(&keys[..2], &["v", "time"]);

    let denied = find(&lines, "connect", "denied.test:443");
    assert_eq!(denied["decision"], "denied");
    assert_eq!(denied["reason"], "policy: default deny");
    assert_eq!(denied["status"], 403);
    assert!(denied.get("rule").is_none() && denied.get("dst_ip").is_none(), "unknown fields are omitted: {denied}");
    let refused = find(&lines, "connect", &format!("127.0.0.1:{}", closed.port()));
    assert_eq!(refused["decision"], "failed");
    assert_eq!(refused["error"], "upstream: connection refused");
    assert_eq!(refused["status"], 502);
    let nx = find(&lines, "request", "http://nx.test/");
    assert_eq!((nx["decision"].as_str(), nx["status"].as_u64()), (Some("failed"), Some(504)));
    let report = find(&lines, "connect", &format!("localhost:{}", up.port()));
    assert_eq!((report["decision"].as_str(), report["would"].as_str()), (Some("allowed"), Some("deny")));
    assert_eq!(find(&lines, "request", "/")["status"], 400);

    let cred = find(&lines, "request", &format!("http://127.0.0.1:{}/cred", up.port()));
    assert_eq!(cred["status"], 200);
    assert!(!std::fs::read_to_string(&audit_path).unwrap_or_default().contains("hunter2"));
    // hyper drops the service future when the client goes; the pending record is written.
    let gone = find(&lines, "request", &silent_target);
    assert_eq!((gone["decision"].as_str(), gone["error"].as_str()), (Some("failed"), Some("downstream: client disconnected")));
    assert!(gone.get("status").is_none(), "no status was sent: {gone}");

    assert_eq!(gate.counts().1, 5, "denied: 3 by policy, 2 bad requests");

    // 9. stop(): an open tunnel is cut and shutdown takes well under 2 s.
    let ns_path = ns.path();
    let upstream_target = format!("127.0.0.1:{}", up.port());
    let (tx, rx) = std::sync::mpsc::channel();
    let client = std::thread::spawn(move || {
        in_netns(ns_path, move || {
            let mut s = connect(g4);
            s.write_all(format!("CONNECT {upstream_target} HTTP/1.1\r\n\r\n").as_bytes()).expect("send");
            let head = read_head(&mut s);
            let _ = tx.send(head);
            let mut rest = Vec::new();
            s.read_to_end(&mut rest).map(|_| rest.len())
        })
    });
    let head = rx.recv_timeout(Duration::from_secs(5)).expect("tunnel opened");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let t0 = Instant::now();
    gate.stop();
    gate.stop();
    assert!(t0.elapsed() < Duration::from_secs(2), "stop took {:?}", t0.elapsed());
    let ended = client.join().expect("client");
    assert!(ended.is_ok(), "the tunnel was closed, not left hanging: {ended:?}");
    assert_eq!(gate.counts(), (6, 5, 3), "allowed: fwd, 2 tunnels, cred, report, last tunnel; failed: refused, nx, abandoned");
    drop(gate);
}

#[test]
fn gate_start_failures_say_what_to_do() {
    let err = Gate::start(GateConfig {
        run_id: "gw-x".into(),
        netns_path: PathBuf::from("/run/netns/gw-does-not-exist"),
        policy: Arc::new(RwLock::new(Policy::new(_gate_core::policy::Action::Deny))),
        audit: Arc::new(AuditLog::open(std::env::temp_dir().join("gw-unused-audit.jsonl")).expect("audit")),
        listen_port: 0,
        nameservers: Some(vec![]),
        connect_timeout: Duration::from_secs(1),
    })
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(err.starts_with("cannot open netns /run/netns/gw-does-not-exist"), "{err}");
    assert!(err.contains("does the sandbox exist?"), "{err}");
    let _ = std::fs::remove_file(std::env::temp_dir().join("gw-unused-audit.jsonl"));
}
