//! The SSRF guard in real netns (root): names resolved by a fake DNS server, upstreams on
//! loopback, documentation and metadata addresses of a netns "internet" the test creates.
//! The gate is started from a thread inside that netns, so it resolves and dials there.

mod common;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use _gate_core::audit::AuditLog;
use _gate_core::gate::{Gate, GateConfig};
use _gate_core::policy::ssrf::PublicRanges;
use _gate_core::policy::{file::from_toml, Mode, Policy};
use common::client::{audit_lines, exchange, in_netns, tunnel, upstream_in};
use common::dns::{FakeDns, Zone};
use common::{ip_in, require_root, Netns, TempDir};
use hickory_proto::rr::RecordType;
use serde_json::Value;

fn zone(entries: &[(&str, &[&[&str]])]) -> Zone {
    let parse = |s: &&str| s.parse::<IpAddr>().unwrap_or_else(|e| panic!("{s}: {e}"));
    entries
        .iter()
        .map(|(name, sets)| (name.to_string(), sets.iter().map(|set| set.iter().map(parse).collect()).collect()))
        .collect::<HashMap<_, _>>()
}

/// The records for CONNECT `target`, in order.
fn records<'a>(lines: &'a [Value], target: &str) -> Vec<&'a Value> {
    lines.iter().filter(|v| v["event"] == "connect" && v["target"] == target).collect()
}

struct Setup {
    sandbox: Netns,
    gate: Gate,
    policy: Arc<RwLock<Policy>>,
    dns: FakeDns,
    up: SocketAddr,
    audit: PathBuf,
    _inet: Netns,
    _dir: TempDir,
}

const POLICY: &str = "default = \"allow\"\n\n\
    [[rule]]\nhost = \"private.test\"\naction = \"allow\"\nports = [PORT]\nallow_private = true\n\n\
    [[rule]]\nhost = \"meta.test\"\naction = \"allow\"\nports = [PORT]\nallow_private = true\n\n\
    [[rule]]\nhost = \"mapped.test\"\naction = \"allow\"\nports = [PORT]\nallow_private = true\n";

fn setup() -> Setup {
    let sandbox = Netns::new("ssrf");
    let inet = Netns::new("ssrf-inet");
    for a in ["203.0.113.7/32", "198.51.100.7/32", "169.254.169.254/32"] {
        ip_in(&inet.name, &["addr", "add", a, "dev", "lo"]);
    }
    ip_in(&inet.name, &["-6", "addr", "add", "2001:db8:100::7/128", "dev", "lo", "nodad"]);
    let up = upstream_in(inet.path(), "[::]:0");
    let dns = FakeDns::start(
        inet.path(),
        zone(&[
            ("local.test", &[&["127.0.0.1"]]),
            ("private.test", &[&["127.0.0.1"]]),
            ("meta.test", &[&["169.254.169.254"]]),
            ("mapped.test", &[&["::ffff:127.0.0.1"]]),
            ("doc.test", &[&["203.0.113.7", "2001:db8:100::7"]]),
            ("other-doc.test", &[&["198.51.100.7"]]),
            ("mixed.test", &[&["127.0.0.1", "10.0.0.1", "203.0.113.7"]]),
            ("rebind.test", &[&["203.0.113.7"], &["127.0.0.1"]]),
        ]),
    );
    let dir = TempDir::new("ssrf-test");
    let audit = dir.path.join("audit.jsonl");
    let text = POLICY.replace("PORT", &up.port().to_string());
    let policy = Arc::new(RwLock::new(from_toml(&text, "policy.toml").expect("policy")));
    let config = GateConfig {
        run_id: "gw-ssrf".into(),
        nameservers: Some(vec![dns.addr.to_string()]),
        connect_timeout: Duration::from_secs(2),
        public_ranges: PublicRanges::parse(&["203.0.113.0/24", "2001:db8:100::/48"]).expect("ranges"),
        ..common::gate_config(&sandbox, policy.clone(), Arc::new(AuditLog::open(&audit).expect("audit")))
    };
    // Started on a thread inside the "internet": its runtime resolves and dials from there.
    let gate = in_netns(inet.path(), move || Gate::start(config).expect("gate starts"));
    Setup { sandbox, gate, policy, dns, up, audit, _inet: inet, _dir: dir }
}

impl Setup {
    fn connect(&self, host: &str) -> (String, String) {
        let target = format!("{host}:{}", self.up.port());
        tunnel(self.sandbox.path(), self.gate.listen_addrs()[0], target)
    }
}

#[test]
fn ssrf_guard_judges_every_resolved_address() {
    require_root();
    let s = setup();
    let port = s.up.port();
    let ok = |host: &str| {
        let (head, body) = s.connect(host);
        assert!(head.starts_with("HTTP/1.1 200"), "{host}: {head}{body}");
        assert!(body.contains("got get /tunnel"), "{host}: {body}");
    };
    let denied = |host: &str, says: &[&str]| {
        let (head, body) = s.connect(host);
        assert!(head.starts_with("HTTP/1.1 403"), "{host}: {head}{body}");
        assert!(head.to_ascii_lowercase().contains("x-gatewrap-decision: denied"), "{head}");
        assert!(!body.contains("got "), "{host} reached the upstream: {body}");
        for text in says {
            assert!(body.contains(text), "{host}: want {text:?} in\n{body}");
        }
        body
    };

    // 1. A name resolving to loopback: 403 unless its rule has allow_private.
    let body = denied("local.test", &["local.test resolves to 127.0.0.1, a loopback address"]);
    assert_eq!(
        body,
        format!(
            "gatewrap: egress to local.test:{port} was denied: local.test resolves to 127.0.0.1, a loopback \
             address, which the gate dials only when a rule allows it (SSRF guard).\n\
             To allow it, run with --allow-private local.test:{port} or add `allow_private = true` to a rule for local.test:\n  [[rule]]\n  host = \"local.test\"\n  \
             port = {port}\n  action = \"allow\"\n  allow_private = true\n\
             or allow only this address: run with --allow 127.0.0.1:{port} or add to your policy:\n  [[rule]]\n  \
             host = \"127.0.0.1\"\n  port = {port}\n  action = \"allow\"\n"
        )
    );
    let resp = exchange(
        s.sandbox.path(),
        s.gate.listen_addrs()[0],
        format!("GET http://local.test:{port}/x HTTP/1.1\r\nHost: local.test:{port}\r\nConnection: close\r\n\r\n"),
    );
    assert!(resp.starts_with("HTTP/1.1 403"), "{resp}");
    assert!(resp.contains("a loopback address"), "{resp}");
    ok("private.test");

    // 2. Metadata: denied even with allow_private, and as a literal the default allows.
    denied("meta.test", &["169.254.169.254, a metadata address", "`allow_private` never covers them", "--allow 169.254.169.254:"]);
    denied("169.254.169.254", &["169.254.169.254 is a metadata address"]);

    // 3. IPv6 forms embedding IPv4: denied whatever they embed, allow_private or not.
    denied("[::ffff:127.0.0.1]", &["::ffff:127.0.0.1 is an embedded-ipv4 address", "host = \"::ffff:127.0.0.1\""]);
    denied("mapped.test", &["mapped.test resolves to ::ffff:127.0.0.1, an embedded-ipv4 address"]);
    denied("127.0.0.1", &["127.0.0.1 is a loopback address", "--allow 127.0.0.1:"]);

    // 4. public_ranges: listed documentation addresses are dialled, others are not.
    ok("doc.test");
    ok("203.0.113.7");
    ok("[2001:db8:100::7]");
    denied("198.51.100.7", &["198.51.100.7 is a documentation address", "run with --public-range CIDR, or put public_ranges = [\"CIDR\"] at the top of your policy"]);
    denied("other-doc.test", &["other-doc.test resolves to 198.51.100.7, a documentation address"]);

    // 5. Non-public addresses are dropped, the public one is dialled.
    ok("mixed.test");

    // 6. Rebinding: judged again on every lookup (TTL 0, nothing cached).
    ok("rebind.test");
    denied("rebind.test", &["rebind.test resolves to 127.0.0.1, a loopback address"]);
    assert_eq!(s.dns.count("rebind.test", RecordType::A), 2, "the second request looked the name up again");

    // 7. Report mode does not lift the guard.
    s.policy.write().expect("lock").mode = Mode::Report;
    denied("local.test", &["a loopback address"]);
    s.policy.write().expect("lock").mode = Mode::Enforce;

    // 8. A rule naming the address allows it, whatever its class and however it was reached.
    {
        let mut p = s.policy.write().expect("lock");
        for spec in [format!("169.254.169.254:{port}"), format!("[::ffff:127.0.0.1]:{port}")] {
            p.add_rule(&spec, "allow", &format!("--allow {spec}")).expect("rule");
        }
    }
    ok("169.254.169.254");
    ok("meta.test");
    ok("[::ffff:127.0.0.1]");
    ok("mapped.test");

    // Stopped first: a denial repeated within a second (local.test, in report mode) is
    // folded into a record with its count, written at the latest when the gate stops.
    let counts = s.gate.counts();
    s.gate.stop();
    let lines = audit_lines(&s.audit);
    let one = |target: &str, n: usize| -> Value {
        let recs = records(&lines, target);
        recs.get(n).map(|v| (*v).clone()).unwrap_or_else(|| panic!("no record {n} for {target}: {lines:#?}"))
    };
    let t = |host: &str| format!("{host}:{port}");
    let local = one(&t("local.test"), 0);
    assert_eq!(local["decision"], "denied");
    assert_eq!(local["reason"], "ssrf: loopback address 127.0.0.1");
    assert_eq!((local["dst_host"].as_str(), local["dst_ip"].as_str()), (Some("local.test"), Some("127.0.0.1")));
    assert_eq!(local["status"], 403);
    assert!(local.get("error").is_none() && local.get("rule").is_none(), "{local}");
    let private = one(&t("private.test"), 0);
    assert_eq!((private["decision"].as_str(), private["dst_ip"].as_str()), (Some("allowed"), Some("127.0.0.1")));
    assert_eq!(private["rule"], "policy.toml:rule[1]");
    let meta = one(&t("meta.test"), 0);
    assert_eq!(meta["reason"], "ssrf: metadata address 169.254.169.254");
    assert_eq!(meta["rule"], "policy.toml:rule[2]", "the rule that allowed the name is kept: {meta}");
    assert_eq!(one(&t("[::ffff:127.0.0.1]"), 0)["reason"], "ssrf: embedded-ipv4 address ::ffff:127.0.0.1");
    assert_eq!(one(&t("198.51.100.7"), 0)["reason"], "ssrf: documentation address 198.51.100.7");
    assert_eq!(one(&t("mixed.test"), 0)["dst_ip"], "203.0.113.7");
    assert_eq!(one(&t("doc.test"), 0)["decision"], "allowed");
    let rebind = (one(&t("rebind.test"), 0), one(&t("rebind.test"), 1));
    assert_eq!((rebind.0["decision"].as_str(), rebind.0["dst_ip"].as_str()), (Some("allowed"), Some("203.0.113.7")));
    assert_eq!(rebind.1["reason"], "ssrf: loopback address 127.0.0.1");
    let report = one(&t("local.test"), 1);
    assert_eq!((report["decision"].as_str(), report.get("would"), report["count"].as_u64()), (Some("denied"), None, Some(1)), "{report}");
    let named = one(&t("meta.test"), 1);
    assert_eq!((named["decision"].as_str(), named["dst_ip"].as_str()), (Some("allowed"), Some("169.254.169.254")));
    let fwd = lines.iter().find(|v| v["event"] == "request").expect("forward record");
    assert_eq!((fwd["reason"].as_str(), fwd["status"].as_u64()), (Some("ssrf: loopback address 127.0.0.1"), Some(403)));

    // allowed: private, doc x3, mixed, rebind, 4 named; denied: the other 11.
    assert_eq!(counts, (10, 11, 0));
}
