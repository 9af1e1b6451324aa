//! The gate in a real netns (root): forward, CONNECT, denial, upstream failures, audit lines.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use _gate_core::audit::AuditLog;
use _gate_core::gate::{Gate, GateConfig};
use _gate_core::policy::ssrf::PublicRanges;
use _gate_core::policy::{file::from_toml, Mode, Policy};
use common::client::{audit_lines, connect, decision_lines, exchange, find, in_netns, read_head, tunnel, upstream};
use common::{require_root, Netns, TempDir};
use serde_json::Value;

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

#[test]
fn gate_forwards_tunnels_denies_and_audits() {
    require_root();
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
        nameservers: Some(vec![dns.local_addr().expect("dns addr").to_string()]),
        ..common::gate_config(&ns, policy.clone(), Arc::new(AuditLog::open(&audit_path).expect("audit")))
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
    // A head over the limit is refused by hyper without reaching the service; still audited.
    let big = format!("GET http://127.0.0.1:{}/ HTTP/1.1\r\nX-Big: {}\r\n\r\n", up.port(), "a".repeat(100_000));
    let resp = exchange(ns.path(), g4, big);
    assert!(resp.is_empty() || resp.starts_with("HTTP/1.1 431"), "{}", &resp[..resp.len().min(300)]);

    // 6. Credentials in the URL stay out of the audit log.
    let resp = exchange(ns.path(), g4, format!("GET http://user:hunter2@127.0.0.1:{0}/cred HTTP/1.1\r\nHost: 127.0.0.1:{0}\r\nConnection: close\r\n\r\n", up.port()));
    assert!(resp.starts_with("HTTP/1.1 200"), "{}", &resp[..resp.len().min(300)]);

    // 7. A client that gives up while the upstream is silent still leaves a record.
    let silent_target = format!("http://127.0.0.1:{}/slow", silent.port());
    let req = format!("GET {silent_target} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n\r\n", silent.port());
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
    // Before the dial, its `admit` record: the decision, nothing of the outcome yet.
    let at = |event: &str| lines.iter().position(|v| v["event"] == event && v["target"] == target.as_str());
    let admit = &lines[at("admit").expect("an admit record for the allowed request")];
    assert!(at("admit") < at("request"), "admit is written before the outcome");
    assert_eq!((&admit["decision"], &admit["rule"], &admit["dst_port"]), (&fwd["decision"], &fwd["rule"], &fwd["dst_port"]));
    assert!(admit.get("status").is_none() && admit.get("dst_ip").is_none(), "{admit}");

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
    // hyper drops the service future when the client goes; the pending record is written,
    // `allowed` (the request went upstream) with the downstream error.
    let gone = find(&lines, "request", &silent_target);
    assert_eq!(
        (gone["decision"].as_str(), gone["error"].as_str()),
        (Some("allowed"), Some("downstream: client disconnected before the response; the request may have reached upstream"))
    );
    assert!(gone.get("status").is_none(), "no status was sent: {gone}");

    let too_large: Vec<&Value> = lines.iter().filter(|v| v.get("method").is_none()).collect();
    assert_eq!(too_large.len(), 1, "{too_large:#?}");
    assert_eq!(too_large[0]["reason"], "protocol: malformed request (header section too large)");
    assert_eq!((too_large[0]["decision"].as_str(), too_large[0]["status"].as_u64()), (Some("denied"), Some(431)));

    assert_eq!(gate.counts().1, 6, "denied: 3 by policy, 2 bad requests, 1 head too large");

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
    assert_eq!(
        gate.counts(),
        (7, 6, 2),
        "allowed: fwd, 2 tunnels, cred, report, abandoned after the dial, last tunnel; failed: refused, nx"
    );
    drop(gate);
}

#[test]
fn gate_start_failures_say_what_to_do() {
    let dir = TempDir::new("start-failures");
    let err = Gate::start(GateConfig {
        run_id: "gw-x".into(),
        netns_path: PathBuf::from("/run/netns/gw-does-not-exist"),
        policy: Arc::new(RwLock::new(Policy::new(_gate_core::policy::Action::Deny))),
        audit: Arc::new(AuditLog::open(dir.path.join("audit.jsonl")).expect("audit")),
        listen_port: 0,
        nameservers: Some(vec![]),
        connect_timeout: Duration::from_secs(1),
        public_ranges: PublicRanges::default(),
        notices: false,
        dns_stub: false,
        inspect: Default::default(),
        idle_timeout: _gate_core::gate::DEFAULT_IDLE_TIMEOUT,
        run_cgroup: None,
        state: None,
        on_asked: None,
        secrets: Default::default(),
        answer_hint: Default::default(),
        allow_hint: Default::default(),
        notice_fd: None,
        shared_runtime: false,
    })
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(err.starts_with("cannot open netns /run/netns/gw-does-not-exist"), "{err}");
    assert!(err.contains("does the sandbox exist?"), "{err}");
}

/// Start a gate in `ns` with `policy_text`, auditing to `audit`, answering DNS from nowhere.
fn start_gate(ns: &Netns, policy_text: &str, audit: &PathBuf) -> (Gate, Arc<RwLock<Policy>>) {
    let policy = Arc::new(RwLock::new(from_toml(policy_text, "policy.toml").expect("policy")));
    let gate = Gate::start(GateConfig {
        run_id: "gw-test".into(),
        netns_path: ns.path(),
        policy: policy.clone(),
        audit: Arc::new(AuditLog::open(audit).expect("audit")),
        listen_port: 0,
        nameservers: Some(vec![]),
        connect_timeout: Duration::from_secs(1),
        public_ranges: PublicRanges::default(),
        notices: false,
        dns_stub: false,
        inspect: Default::default(),
        idle_timeout: _gate_core::gate::DEFAULT_IDLE_TIMEOUT,
        run_cgroup: None,
        state: None,
        on_asked: None,
        secrets: Default::default(),
        answer_hint: Default::default(),
        allow_hint: Default::default(),
        notice_fd: None,
        shared_runtime: false,
    })
    .expect("gate starts");
    (gate, policy)
}

/// The audit lines once they stand for at least `n` decisions (records of refused heads are
/// written when hyper ends the connection, just after the client saw the answer; repeated
/// denials are told at the end of their second, folded); 5 s at most.
fn wait_for_decisions(path: &PathBuf, n: usize) -> Vec<Value> {
    let t0 = Instant::now();
    loop {
        let lines = decision_lines(path);
        if decisions(&lines.iter().collect::<Vec<_>>()) >= n || t0.elapsed() > Duration::from_secs(5) {
            return lines;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The decisions `recs` stand for: a folded record its `count`, any other one.
fn decisions(recs: &[&Value]) -> usize {
    recs.iter().map(|r| r["count"].as_u64().unwrap_or(1) as usize).sum()
}

/// The records whose `reason` is `reason`.
fn by_reason<'a>(lines: &'a [Value], reason: &str) -> Vec<&'a Value> {
    lines.iter().filter(|v| v["reason"] == reason).collect()
}

#[test]
fn gate_audits_malformed_heads_and_refuses_bad_targets() {
    require_root();
    let ns = Netns::new("gate-bad");
    let up = upstream();
    let dir = TempDir::new("gate-bad-test");
    let audit_path = dir.path.join("audit.jsonl");
    // Everything is allowed, so each refusal below is the gate's own.
    let text = format!(
        "default = \"allow\"\n\n[[rule]]\nhost = \"127.0.0.1\"\nports = [80, {}]\naction = \"allow\"\n",
        up.port()
    );
    let (gate, policy) = start_gate(&ns, &text, &audit_path);
    let g4 = gate.listen_addrs()[0];
    let mut expected = 0;

    // 1. Heads hyper refuses: answered 400/431 by hyper and audited as denied.
    let malformed: &[(&str, String, &str, u16)] = &[
        ("a bad request line", "NOT HTTP AT ALL\r\n\r\n".into(), "invalid HTTP version parsed", 400),
        ("invalid header bytes", format!("GET http://127.0.0.1:{}/ HTTP/1.1\r\nBad Name: x\r\n\r\n", up.port()), "invalid HTTP header parsed", 400),
        ("a header section over the limit", format!("GET http://127.0.0.1:{}/ HTTP/1.1\r\n{}\r\n", up.port(), "X-A: 1\r\n".repeat(200)), "header section too large", 431),
    ];
    for (case, req, _, status) in malformed {
        let resp = exchange(ns.path(), g4, req.clone());
        assert!(resp.starts_with(&format!("HTTP/1.1 {status} ")), "{case}: {resp}");
    }
    expected += malformed.len();
    // A clean EOF, an idle client leaving, and a client leaving mid-head decide nothing.
    for bytes in [&b""[..], b"\r\n", b"GET http://127.0.0.1/ HTTP/1.1\r\nHo"] {
        in_netns(ns.path(), move || {
            let mut s = connect(g4);
            s.write_all(bytes).expect("send");
            std::thread::sleep(Duration::from_millis(50));
        });
    }
    // A refused CONNECT whose client already sent its TLS bytes: one record, not two.
    let resp = exchange(ns.path(), g4, "CONNECT 127.0.0.1:0 HTTP/1.1\r\n\r\n\x16\x03\x01\x02\x00\x01\x00\x01\x7f\x03\x03".into());
    assert!(resp.starts_with("HTTP/1.1 400"), "{resp}");
    expected += 1;

    // 2. Ports that are not 1-65535: 400, never the default port (65616 would wrap to 80).
    let bad_ports: &[(&str, String, &str)] = &[
        ("absolute form, past 65535", "GET http://127.0.0.1:65616/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".into(), "65616"),
        ("absolute form, empty", "GET http://127.0.0.1:/ HTTP/1.1\r\nConnection: close\r\n\r\n".into(), ""),
        ("absolute form, zero", "GET http://127.0.0.1:0/ HTTP/1.1\r\nConnection: close\r\n\r\n".into(), "0"),
        ("CONNECT, past 65535", "CONNECT allowed.test:99999 HTTP/1.1\r\n\r\n".into(), "99999"),
        ("CONNECT, empty", "CONNECT allowed.test: HTTP/1.1\r\n\r\n".into(), ""),
    ];
    for (case, req, port) in bad_ports {
        let resp = exchange(ns.path(), g4, req.clone());
        assert!(resp.starts_with("HTTP/1.1 400"), "{case}: {resp}");
        assert!(resp.contains(&format!("the port {port:?} in the request target is invalid")), "{case}: {resp}");
        assert!(!resp.contains("got "), "{case}: reached the upstream: {resp}");
    }
    expected += bad_ports.len();

    // 3. Unspecified addresses: 403 whatever the rules and the mode; never dialled (the
    //    upstream listens on the host's loopback, which 0.0.0.0 would reach).
    for mode in [Mode::Enforce, Mode::Report] {
        policy.write().expect("lock").mode = mode;
        let resp = exchange(ns.path(), g4, format!("GET http://0.0.0.0:{0}/ HTTP/1.1\r\nHost: 0.0.0.0:{0}\r\nConnection: close\r\n\r\n", up.port()));
        assert!(resp.starts_with("HTTP/1.1 403"), "{mode:?}: {resp}");
        assert!(resp.contains("was denied (unspecified address)"), "{resp}");
        for target in [format!("0.0.0.0:{}", up.port()), format!("[::]:{}", up.port()), format!("[::ffff:0.0.0.0]:{}", up.port())] {
            let (head, body) = tunnel(ns.path(), g4, target.clone());
            assert!(head.starts_with("HTTP/1.1 403"), "{mode:?} {target}: {head}");
            assert!(!body.contains("got "), "{target}: {body}");
        }
    }
    policy.write().expect("lock").mode = Mode::Enforce;
    expected += 8;

    // 4. A Host header that names another host or port is refused; canonical spellings agree.
    let mismatched: &[(&str, String)] = &[
        ("another host", format!("GET http://127.0.0.1:{}/ HTTP/1.1\r\nHost: evil.test\r\nConnection: close\r\n\r\n", up.port())),
        ("another port", format!("GET http://127.0.0.1:{}/ HTTP/1.1\r\nHost: 127.0.0.1:1\r\nConnection: close\r\n\r\n", up.port())),
        ("the default port left out", format!("GET http://127.0.0.1:{}/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", up.port())),
    ];
    for (case, req) in mismatched {
        let resp = exchange(ns.path(), g4, req.clone());
        assert!(resp.starts_with("HTTP/1.1 400"), "{case}: {resp}");
        assert!(resp.contains("Host header disagrees with the request target"), "{case}: {resp}");
        assert!(!resp.contains("got "), "{case}: reached the upstream: {resp}");
    }
    expected += mismatched.len();
    let resp = exchange(ns.path(), g4, format!("GET http://127.0.0.1:{0}/same HTTP/1.1\r\nHost: 127.0.0.1.:{0}\r\nConnection: close\r\n\r\n", up.port()));
    assert!(resp.starts_with("HTTP/1.1 200"), "a trailing dot agrees: {resp}");
    assert!(resp.contains(&format!("host: 127.0.0.1:{}", up.port())), "{resp}");
    let resp = exchange(ns.path(), g4, format!("GET http://127.0.0.1:{}/bare HTTP/1.0\r\n\r\n", up.port()));
    assert!(resp.starts_with("HTTP/1.0 200"), "no Host header: {resp}");
    expected += 2;

    // The audit log: every decision (repeated denials folded: one record with their count),
    // nothing for the disconnects.
    let lines = wait_for_decisions(&audit_path, expected);
    assert_eq!(decisions(&lines.iter().collect::<Vec<_>>()), expected, "{lines:#?}");
    for (case, _, cause, status) in malformed {
        let recs = by_reason(&lines, &format!("protocol: malformed request ({cause})"));
        assert_eq!(recs.len(), 1, "{case}: {lines:#?}");
        let r = recs[0];
        assert_eq!((r["event"].as_str(), r["decision"].as_str(), r["status"].as_u64()), (Some("request"), Some("denied"), Some(*status as u64)), "{case}");
        assert!(r["client"].as_str().is_some_and(|c| c.starts_with("127.0.0.1:")), "{case}: {r}");
        assert!(r.get("method").is_none() && r.get("target").is_none(), "{case}: {r}");
    }
    let ports = by_reason(&lines, "protocol: invalid port");
    assert_eq!(decisions(&ports), bad_ports.len() + 1, "the refused CONNECT to port 0 too: {lines:#?}");
    assert!(ports.iter().all(|r| r["decision"] == "denied" && r["status"] == 400), "{ports:#?}");
    assert!(lines.iter().any(|r| r["target"] == "http://127.0.0.1:65616/" && r["reason"] == "protocol: invalid port"));
    let unspecified = by_reason(&lines, "policy: unspecified address");
    assert_eq!(decisions(&unspecified), 8, "{lines:#?}");
    assert!(unspecified.iter().all(|r| r["decision"] == "denied" && r["status"] == 403 && r.get("would").is_none()), "{unspecified:#?}");
    let hosts = by_reason(&lines, "protocol: host mismatch");
    assert_eq!(decisions(&hosts), mismatched.len(), "{lines:#?}");
    assert!(hosts.iter().all(|r| r["decision"] == "denied" && r["status"] == 400), "{hosts:#?}");
    let refused = expected - 2;
    assert_eq!(gate.counts(), (2, refused as u64, 0));
    gate.stop();
}

/// CONNECT `target` through the gate at `addr` (from inside its netns): the stream and the
/// answer's head ("" when the gate closed the connection without answering).
fn open_tunnel(addr: SocketAddr, target: &str) -> (TcpStream, String) {
    let mut s = connect(addr);
    let _ = s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes());
    let head = read_head(&mut s);
    (s, head)
}

/// Go's http.Transport (hey) closes the surplus tunnels it dialled, and a busy upstream ends
/// its side later: a tunnel whose client finished sending is counted as half-closed (up to
/// MAX_HALF_CLOSED; beyond, it is closed then, and that is audited), not as one of the
/// client's MAX_CONNECTIONS open connections (it was refused while it held none,
/// bench/README.md). Held tunnels are still refused beyond the cap, and audited. The upstream
/// here never ends its side, nor reads.
#[test]
fn a_client_closing_its_connect_tunnels_is_not_refused_and_the_cap_still_holds() {
    use _gate_core::gate::{MAX_CONNECTIONS, MAX_HALF_CLOSED};
    require_root();
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: plain getrlimit/setrlimit on this process; ~13,000 descriptors are needed.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur = lim.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
    let ns = Netns::new("halfclosed");
    let dir = TempDir::new("halfclosed");
    let audit = dir.path.join("audit.jsonl");
    let silent = silent_upstream();
    let text = format!("[[rule]]\nhost = \"127.0.0.1\"\nports = [{}]\naction = \"allow\"\n", silent.port());
    let (gate, _) = start_gate(&ns, &text, &audit);
    let addr = gate.listen_addrs()[0];
    let target = silent.to_string();
    let over = 100;

    // Open and close: every tunnel answered 200; the last `over` closed by the gate.
    let t = target.clone();
    let refused = in_netns(ns.path(), move || {
        (0..MAX_HALF_CLOSED + over).find(|_| !open_tunnel(addr, &t).1.starts_with("HTTP/1.1 200"))
    });
    assert_eq!(refused, None, "a tunnel was refused (its index) though the client held none open");

    // Open and hold: the run's open connections stay bounded, and the refusal is audited.
    let held = in_netns(ns.path(), move || {
        let mut kept = Vec::new();
        while kept.len() <= MAX_CONNECTIONS {
            let (s, head) = open_tunnel(addr, &target);
            if !head.starts_with("HTTP/1.1 200") {
                break;
            }
            kept.push(s);
        }
        kept.len()
    });
    assert_eq!(held, MAX_CONNECTIONS, "held tunnels, none of the closed ones counted as open");
    // Each tunnel's record, the refusals of half-closing (the `over` closed ones, then every held
    // one as its client closed with the bound still full) and at least one refusal to connect.
    let lines = wait_for_decisions(&audit, (MAX_HALF_CLOSED + over + held) + (over + held) + 1);
    let open = by_reason(&lines, &format!("limit: more than {MAX_CONNECTIONS} open connections"));
    assert!(!open.is_empty() && open.iter().all(|r| r["decision"] == "denied" && r["event"] == "request"), "{open:?}");
    let half = by_reason(&lines, &format!("limit: more than {MAX_HALF_CLOSED} half-closed tunnels"));
    assert!(half.iter().all(|r| r["decision"] == "denied" && r["event"] == "connect" && r["target"] == silent.to_string()), "{half:?}");
    assert_eq!(decisions(&half), over + held, "each tunnel closed over the half-closed bound is recorded");
}
