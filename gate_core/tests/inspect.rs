//! TLS inspection in a real netns (root): leaves and their cache, the SNI and Host checks,
//! inner requests decided one by one and audited, upstream verification, h2c, body limit.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant, SystemTime};

use _gate_core::audit::AuditLog;
use _gate_core::gate::inspect::ca::Ca;
use _gate_core::gate::inspect::leaf::LeafCache;
use _gate_core::gate::inspect::InspectSettings;
use _gate_core::gate::{Gate, GateConfig, DEFAULT_IDLE_TIMEOUT};
use _gate_core::policy::ssrf::PublicRanges;
use _gate_core::policy::{canonical_host, file::from_toml, Policy};
use common::client::{decision_lines, exchange, in_netns};
use common::tls::{ask, open, pki, upstream};
use common::{require_root, Netns, TempDir};
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use serde_json::Value;

fn mode(p: &PathBuf) -> u32 {
    std::fs::metadata(p).map(|m| m.permissions().mode() & 0o777).unwrap_or(0)
}

#[test]
fn the_ca_is_made_once_and_signs_cached_leaves_that_verify() {
    let dir = TempDir::new("inspect-ca");
    let ca_dir = dir.path.join("ca");
    let ca = Ca::load_or_create(&ca_dir).expect("ca made");
    assert_eq!(mode(&ca_dir.join("ca.crt")), 0o644, "the certificate is public");
    assert_eq!(mode(&ca_dir.join("private")), 0o700, "the key's directory is root's");
    assert_eq!(mode(&ca_dir.join("private/ca.key")), 0o600, "the key is root's");
    let again = Ca::load_or_create(&ca_dir).expect("ca reused");
    assert_eq!(ca.cert_pem, again.cert_pem, "a second load reuses the CA");

    let roots = {
        let mut r = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(&ca.cert_path).expect("pem") {
            r.add(c.expect("cert")).expect("root");
        }
        Arc::new(r)
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(roots, provider).build().expect("verifier");
    let cache = LeafCache::default();
    let table: &[(&str, &str, &str)] = &[
        ("a name gets a dNSName leaf", "api.example.test", "api.example.test"),
        ("an IPv4 literal gets an iPAddress leaf", "198.51.100.7", "198.51.100.7"),
        ("an IPv6 literal gets an iPAddress leaf", "[2001:db8::7]", "2001:db8::7"),
    ];
    for (case, host, server_name) in table {
        let h = canonical_host(host).expect("host");
        let t0 = Instant::now();
        let leaf = cache.get(&ca, &h).expect("leaf");
        let made = t0.elapsed();
        let t1 = Instant::now();
        let cached = cache.get(&ca, &h).expect("cached leaf");
        eprintln!("{case}: leaf made in {made:?}, cached lookup {:?}", t1.elapsed());
        assert!(Arc::ptr_eq(&leaf, &cached), "{case}: the second lookup is the cached leaf");
        assert_eq!(leaf.cert.len(), 2, "{case}: the chain is the leaf then the CA");
        let name = ServerName::try_from(server_name.to_string()).expect("name");
        let now = UnixTime::since_unix_epoch(SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).expect("time"));
        verifier.verify_server_cert(&leaf.cert[0], &leaf.cert[1..], &name, &[], now).expect(case);
        let other = ServerName::try_from("other.test").expect("name");
        assert!(verifier.verify_server_cert(&leaf.cert[0], &leaf.cert[1..], &other, &[], now).is_err(), "{case}: names no other host");
    }
    assert_eq!(cache.len(), 3);
}

#[test]
fn a_ca_key_readable_by_others_is_refused() {
    let dir = TempDir::new("inspect-ca-mode");
    let ca_dir = dir.path.join("ca");
    Ca::load_or_create(&ca_dir).expect("ca made");
    std::fs::set_permissions(ca_dir.join("private/ca.key"), std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let err = Ca::load_or_create(&ca_dir).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("is readable by others or not owned by root (mode 644)"), "{err}");
}

struct Setup {
    ns: Netns,
    _dir: TempDir,
    gate: Gate,
    policy: Arc<RwLock<Policy>>,
    audit: PathBuf,
    /// The gate's CA certificate, which the test client trusts.
    gate_ca: PathBuf,
    good: u16,
    untrusted: u16,
    /// Accepts TCP and never says anything.
    silent: u16,
}

fn silent_upstream() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind silent upstream");
    let port = l.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        let held: Vec<std::net::TcpStream> = l.incoming().flatten().collect();
        drop(held);
    });
    port
}

/// A gate inspecting 127.0.0.1 on two TLS upstreams: one whose CA the gate is given
/// (`upstream_ca`), one it does not know. Body limit 1024 bytes.
fn setup(tag: &str) -> Setup {
    setup_idle(tag, DEFAULT_IDLE_TIMEOUT)
}

fn setup_idle(tag: &str, idle_timeout: Duration) -> Setup {
    require_root();
    let ns = Netns::new(tag);
    let dir = TempDir::new(tag);
    let trusted = pki(&dir.path, "trusted");
    let unknown = pki(&dir.path, "unknown");
    let (good, untrusted, silent) = (upstream(&trusted).port(), upstream(&unknown).port(), silent_upstream());
    let text = format!("[[rule]]\nhost = \"127.0.0.1\"\nports = [{good}, {untrusted}, {silent}]\naction = \"allow\"\ninspect = true\n");
    let policy = Arc::new(RwLock::new(from_toml(&text, "policy.toml").expect("policy")));
    let audit = dir.path.join("audit.jsonl");
    let ca_dir = dir.path.join("ca");
    let gate = Gate::start(GateConfig {
        run_id: "gw-inspect".into(),
        netns_path: ns.path(),
        policy: policy.clone(),
        audit: Arc::new(AuditLog::open(&audit).expect("audit")),
        listen_port: 0,
        nameservers: Some(vec![]),
        connect_timeout: Duration::from_secs(2),
        public_ranges: PublicRanges::default(),
        notices: false,
        dns_stub: false,
        inspect: InspectSettings { ca_dir: Some(ca_dir.clone()), upstream_ca: vec![trusted.ca_pem.clone()], body_limit: 1024 },
        idle_timeout,
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
    Setup { ns, _dir: dir, gate, policy, audit, gate_ca: ca_dir.join("ca.crt"), good, untrusted, silent }
}

/// The decision records of `proto` (the `admit` records left out).
fn records(path: &PathBuf, proto: &str) -> Vec<Value> {
    decision_lines(path).into_iter().filter(|v| v["proto"] == proto).collect()
}

#[test]
fn inner_requests_are_decided_forwarded_and_audited_one_by_one() {
    let s = setup("insp-req");
    let (g, ca, port, policy) = (s.gate.listen_addrs()[0], s.gate_ca.clone(), s.good, s.policy.clone());
    let answers = in_netns(s.ns.path(), move || {
        let target = format!("127.0.0.1:{port}");
        let (head, tls) = open(g, &target, &ca, "127.0.0.1");
        let mut tls = tls.expect("the client trusts the gate's leaf");
        let get = ask(&mut tls, &format!("GET /ok?x=1 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n"));
        let post = ask(&mut tls, &format!("POST /ok HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 5\r\n\r\nhello"));
        // Rules added now apply to the tunnel's next request.
        policy.write().expect("policy").add_rule(&target, "deny", "--deny 127.0.0.1").expect("rule");
        let denied = ask(&mut tls, &format!("GET /later HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n"));
        (head, get, post, denied)
    });
    let (head, get, post, denied) = answers;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(get.starts_with("HTTP/1.1 200") && get.ends_with(&format!("GET /ok?x=1 host=127.0.0.1:{} body=0", s.good)), "{get}");
    assert!(post.ends_with("POST /ok host=127.0.0.1:".to_string().as_str()) || post.contains("POST /ok host="), "{post}");
    assert!(post.ends_with("body=5"), "{post}");
    assert!(denied.starts_with("HTTP/1.1 403"), "{denied}");
    assert!(denied.contains("was denied (rule --deny 127.0.0.1)"), "{denied}");
    s.gate.stop();
    let recs = records(&s.audit, "https");
    let summary: Vec<(String, String, String, u64)> = recs
        .iter()
        .map(|r| {
            (r["method"].as_str().unwrap_or("").into(), r["target"].as_str().unwrap_or("").into(), r["decision"].as_str().unwrap_or("").into(), r["status"].as_u64().unwrap_or(0))
        })
        .collect();
    let t = |p: &str| format!("https://127.0.0.1:{}{p}", s.good);
    assert_eq!(
        summary,
        vec![
            ("GET".into(), t("/ok?x=1"), "allowed".into(), 200),
            ("POST".into(), t("/ok"), "allowed".into(), 200),
            ("GET".into(), t("/later"), "denied".into(), 403),
        ]
    );
    assert_eq!(recs[0]["rule"], "policy.toml:rule[1]");
    assert_eq!(recs[0]["dst_ip"], "127.0.0.1");
    assert_eq!(recs[2]["reason"], "policy: rule --deny 127.0.0.1");
    let connects: Vec<Value> = records(&s.audit, "connect");
    assert_eq!(connects.len(), 1, "one CONNECT record for the tunnel");
    assert_eq!(connects[0]["status"], 200);
    // Each admitted thing has its `admit` record first: the tunnel, then each allowed
    // request (the denied one none), without an outcome.
    let lines = common::client::audit_lines(&s.audit);
    let admits: Vec<(&str, &str)> = lines
        .iter()
        .filter(|v| v["event"] == "admit")
        .map(|v| (v["proto"].as_str().unwrap_or(""), v["target"].as_str().unwrap_or("")))
        .collect();
    let tunnel_target = format!("127.0.0.1:{}", s.good);
    assert_eq!(admits, vec![("connect", tunnel_target.as_str()), ("https", t("/ok?x=1").as_str()), ("https", t("/ok").as_str())]);
    assert!(lines.iter().filter(|v| v["event"] == "admit").all(|v| v.get("status").is_none() && v.get("dst_ip").is_none()), "{lines:#?}");
    let at = |event: &str, target: &str| lines.iter().position(|v| v["event"] == event && v["target"] == target);
    assert!(at("admit", &t("/ok")) < at("request", &t("/ok")), "admit before the request's record");
}

/// Inspected requests of different tunnels to one host go upstream on one kept TLS
/// connection (the pool), each request still decided and recorded with its address.
#[test]
fn tunnels_to_one_host_share_a_kept_upstream_connection() {
    let s = setup("insp-pool");
    let (g, ca, port) = (s.gate.listen_addrs()[0], s.gate_ca.clone(), s.good);
    let answers = in_netns(s.ns.path(), move || {
        let target = format!("127.0.0.1:{port}");
        (0..3)
            .map(|i| {
                let mut tls = open(g, &target, &ca, "127.0.0.1").1.expect("tls");
                ask(&mut tls, &format!("GET /t{i} HTTP/1.1\r\nHost: {target}\r\n\r\n"))
            })
            .collect::<Vec<_>>()
    });
    s.gate.stop();
    let conns: Vec<Option<&str>> = answers.iter().map(|a| a.lines().find_map(|l| l.strip_prefix("x-conn: "))).collect();
    assert_eq!(conns, vec![Some("1"); 3], "{answers:#?}");
    let recs = records(&s.audit, "https");
    assert_eq!(recs.len(), 3);
    assert!(recs.iter().all(|r| r["decision"] == "allowed" && r["status"] == 200 && r["dst_ip"] == "127.0.0.1"), "{recs:#?}");
}

#[test]
fn refusals_inside_a_tunnel_say_why() {
    let s = setup("insp-refuse");
    let (g, ca, good, bad, silent) = (s.gate.listen_addrs()[0], s.gate_ca.clone(), s.good, s.untrusted, s.silent);
    let out = in_netns(s.ns.path(), move || {
        let target = format!("127.0.0.1:{good}");
        let (_, sni) = open(g, &target, &ca, "other.test");
        let mut tls = open(g, &target, &ca, "127.0.0.1").1.expect("tls");
        let host = ask(&mut tls, "GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n");
        let mut tls = open(g, &target, &ca, "127.0.0.1").1.expect("tls");
        let h2c = ask(&mut tls, &format!("GET / HTTP/1.1\r\nHost: {target}\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n"));
        let mut tls = open(g, &target, &ca, "127.0.0.1").1.expect("tls");
        let declared = ask(&mut tls, &format!("POST / HTTP/1.1\r\nHost: {target}\r\nContent-Length: 2000\r\n\r\n"));
        let mut tls = open(g, &target, &ca, "127.0.0.1").1.expect("tls");
        let chunk = format!("{:x}\r\n{}\r\n", 1500, "a".repeat(1500));
        let chunked = ask(&mut tls, &format!("POST / HTTP/1.1\r\nHost: {target}\r\nTransfer-Encoding: chunked\r\n\r\n{chunk}0\r\n\r\n"));
        let mut tls = open(g, &format!("127.0.0.1:{bad}"), &ca, "127.0.0.1").1.expect("tls");
        let unverified = ask(&mut tls, &format!("GET / HTTP/1.1\r\nHost: 127.0.0.1:{bad}\r\n\r\n"));
        let mut tls = open(g, &target, &ca, "127.0.0.1").1.expect("tls");
        let nested = ask(&mut tls, &format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n"));
        let mut tls = open(g, &format!("127.0.0.1:{silent}"), &ca, "127.0.0.1").1.expect("tls");
        let mute = ask(&mut tls, &format!("GET / HTTP/1.1\r\nHost: 127.0.0.1:{silent}\r\n\r\n"));
        let mut tls = open(g, &target, &ca, "127.0.0.1").1.expect("tls");
        let gzip = ask(&mut tls, &format!("POST / HTTP/1.1\r\nHost: {target}\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n"));
        (sni.err().unwrap_or_default(), host, h2c, declared, chunked, unverified, mute, nested, gzip)
    });
    let (sni, host, h2c, declared, chunked, unverified, mute, nested, gzip) = out;
    s.gate.stop();
    let recs = records(&s.audit, "https");
    let find = |what: &str| -> Value {
        recs.iter().find(|r| [&r["reason"], &r["error"]].iter().any(|t| t.as_str().is_some_and(|t| t.starts_with(what)))).cloned().unwrap_or_else(|| panic!("no record for {what}: {recs:#?}"))
    };
    let table: &[(&str, &str, &str, &str, &str)] = &[
        ("an SNI that names another host ends the handshake", &sni, "AccessDenied", "tls: SNI \"other.test\" does not match the CONNECT host 127.0.0.1", "denied"),
        ("a Host header that names another host is misdirected", &host, "HTTP/1.1 421", "protocol: host mismatch (Host evil.test, tunnel to 127.0.0.1:", "denied"),
        ("a CONNECT inside the tunnel is refused", &nested, "HTTP/1.1 400", "protocol: CONNECT inside an inspected tunnel", "denied"),
        ("Upgrade: h2c is refused", &h2c, "HTTP/1.1 400", "protocol: Upgrade: h2c is refused", "denied"),
        ("a transfer coding other than chunked is refused", &gzip, "HTTP/1.1 400", "protocol: a transfer coding other than one chunked", "denied"),
        ("a declared body over the limit is refused", &declared, "HTTP/1.1 413", "limit: request body over 1024 bytes", "denied"),
        ("a streamed body over the limit is cut, and recorded as reaching upstream", &chunked, "HTTP/1.1 413", "limit: request body over 1024 bytes; its head and up to 1024 bytes of its body were sent upstream", "allowed"),
        ("an upstream the gate cannot verify fails", &unverified, "HTTP/1.1 502", "upstream: tls: invalid peer certificate: UnknownIssuer", "failed"),
        ("an upstream that never finishes its handshake times out", &mute, "HTTP/1.1 504", "upstream: tls: timeout during the handshake", "failed"),
    ];
    for (case, answer, starts, reason, decision) in table {
        assert!(answer.contains(starts), "{case}: {answer}");
        let rec = find(reason);
        assert_eq!(rec["decision"], *decision, "{case}: {rec}");
    }
    assert!(unverified.contains("could not reach 127.0.0.1"), "{unverified}");
    let limit = |t: &Value| t.as_str().is_some_and(|t| t.starts_with("limit: request body over 1024 bytes"));
    let declared_recs = recs.iter().filter(|r| limit(&r["reason"]) || limit(&r["error"])).count();
    assert_eq!(declared_recs, 2, "both oversized bodies are audited");
}

#[test]
fn a_transfer_coding_other_than_chunked_is_refused_on_plain_http_too() {
    let s = setup("insp-te");
    for coding in ["gzip, chunked", "chunked, chunked"] {
        let req = format!(
            "POST http://127.0.0.1:{p}/ HTTP/1.1\r\nHost: 127.0.0.1:{p}\r\nTransfer-Encoding: {coding}\r\nConnection: close\r\n\r\n2\r\nab\r\n0\r\n\r\n",
            p = s.good
        );
        let resp = exchange(s.ns.path(), s.gate.listen_addrs()[0], req);
        assert!(resp.starts_with("HTTP/1.1 400") && resp.contains("only the chunked transfer coding"), "{coding}: {resp}");
    }
    s.gate.stop();
    let recs = records(&s.audit, "http");
    let refused = recs.iter().filter(|r| r["reason"] == "protocol: a transfer coding other than one chunked").count();
    assert_eq!(refused, 2, "{recs:#?}");
}

#[test]
fn h2c_is_refused_on_plain_http_too() {
    let s = setup("insp-h2c");
    let req = format!(
        "GET http://127.0.0.1:{p}/ HTTP/1.1\r\nHost: 127.0.0.1:{p}\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\nConnection: close\r\n\r\n",
        p = s.good
    );
    let resp = exchange(s.ns.path(), s.gate.listen_addrs()[0], req);
    assert!(resp.starts_with("HTTP/1.1 400"), "{resp}");
    assert!(resp.contains("Upgrade: h2c is refused"), "{resp}");
    s.gate.stop();
    let recs = records(&s.audit, "http");
    assert_eq!(recs.last().map(|r| r["reason"].clone()), Some(Value::from("protocol: Upgrade: h2c is refused")));
}

#[test]
fn an_idle_tunnel_is_closed_after_the_idle_timeout() {
    let s = setup_idle("insp-idle", Duration::from_secs(1));
    let (g, port) = (s.gate.listen_addrs()[0], s.good);
    // A command-line rule without inspect comes first: a plain tunnel.
    s.policy.write().expect("policy").add_rule(&format!("127.0.0.1:{port}"), "allow", "--allow").expect("rule");
    let (head, read, took) = in_netns(s.ns.path(), move || {
        use std::io::{Read, Write};
        let mut plain = common::client::connect(g);
        plain.write_all(format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n").as_bytes()).expect("send");
        let head = common::client::read_head(&mut plain);
        let t0 = Instant::now();
        let mut buf = [0u8; 1];
        let read = plain.read(&mut buf).map_err(|e| e.to_string());
        (head, read, t0.elapsed())
    });
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(read, Ok(0), "the gate closed the silent tunnel");
    assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(5), "closed after about 1 s, not {took:?}");
}

#[test]
fn a_client_that_leaves_mid_request_costs_nothing() {
    let s = setup("insp-leave");
    let (g, ca, port) = (s.gate.listen_addrs()[0], s.gate_ca.clone(), s.good);
    let after = in_netns(s.ns.path(), move || {
        use std::io::Write;
        let target = format!("127.0.0.1:{port}");
        for _ in 0..20 {
            let mut tls = open(g, &target, &ca, "127.0.0.1").1.expect("tls");
            let _ = tls.write_all(format!("POST /upload HTTP/1.1\r\nHost: {target}\r\nContent-Length: 1000\r\n\r\npartial").as_bytes());
            let _ = tls.flush();
            drop(tls);
        }
        std::thread::sleep(Duration::from_millis(300));
        let mut tls = open(g, &target, &ca, "127.0.0.1").1.expect("tls after the departures");
        ask(&mut tls, &format!("GET /after HTTP/1.1\r\nHost: {target}\r\n\r\n"))
    });
    assert!(after.starts_with("HTTP/1.1 200"), "the gate still serves: {after}");
    s.gate.stop();
    let left: Vec<Value> = records(&s.audit, "https").into_iter().filter(|r| r["target"].as_str().is_some_and(|t| t.ends_with("/upload"))).collect();
    assert_eq!(left.len(), 20, "each abandoned request is one record");
    // Left before the dial: failed. Left after the head went upstream: allowed (it reached
    // upstream), with the error that ended it; never "malformed".
    let ok = |r: &Value| {
        let err = r["error"].as_str().unwrap_or_default();
        (r["decision"] == "failed" && err == "downstream: client disconnected")
            || (r["decision"] == "allowed" && err.starts_with("downstream: client disconnected before its request body was complete"))
    };
    assert!(left.iter().all(ok), "{:#?}", left.iter().map(|r| (r["decision"].clone(), r["error"].clone())).collect::<Vec<_>>());
}
