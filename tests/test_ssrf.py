"""The SSRF guard through a real sandbox: names that resolve to non-public addresses, and
metadata addresses, are refused before any connection, whatever the policy allows."""

from __future__ import annotations

import pytest

from fakenet import FakeInternet

pytestmark = pytest.mark.kernel

CURL = ["curl", "-sS", "-i", "--max-time", "10"]


@pytest.fixture(scope="module")
def net():
    # 10.20.30.40 has a server in the fake internet: were the guard to let it through, the
    # connection would land there (and in the access log), never on the host's own network.
    with FakeInternet(extra_names={"loop.test": "127.0.0.1", "meta.test": "169.254.169.254",
                                   "lan.test": "10.20.30.40", "meta6.test": "fd00:ec2::254",
                                   "mapped.test": "::ffff:10.20.30.40"},
                      private_addrs=["10.20.30.40"]) as n:
        yield n


@pytest.mark.parametrize("url,reason", [
    ("http://loop.test/", "ssrf: loopback address 127.0.0.1"),
    ("http://lan.test/", "ssrf: private address 10.20.30.40"),
    ("http://meta.test/latest/meta-data/", "ssrf: metadata address 169.254.169.254"),
    ("http://169.254.169.254/latest/meta-data/", "ssrf: metadata address 169.254.169.254"),
    ("http://[::ffff:127.0.0.1]/", "ssrf: embedded-ipv4 address ::ffff:127.0.0.1"),
], ids=["a name resolving to loopback", "a name resolving to a private address",
        "a name resolving to the metadata address", "the metadata address itself",
        "a v4-mapped loopback literal"])
def test_non_public_destinations_are_refused_even_when_the_policy_allows_all(gatewrap, tmp_path, url, reason):
    policy = tmp_path / "allow-all.toml"
    policy.write_text('default = "allow"\n')
    r = gatewrap([*CURL, url], extra=["--policy", str(policy)])
    assert r.stdout.startswith("HTTP/1.1 403"), r.stdout + r.stderr
    (rec,) = r.records(event="request")
    assert (rec["decision"], rec["reason"]) == ("denied", reason)


def test_documentation_addresses_count_as_public_only_with_public_range(net, tmp_path):
    import json
    import os
    import subprocess

    from conftest import ROOT, gatewrap_cmd

    audit = tmp_path / "audit.jsonl"
    cmd = gatewrap_cmd("run", "--audit-log", str(audit), "--resolver", net.dns_server, "--workdir", "/tmp",
                       "--allow", "allowed.test", "--", *CURL, "http://allowed.test/")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT,
                       env=dict(os.environ, SUDO_UID="65534", SUDO_GID="65534"))
    assert p.stdout.startswith("HTTP/1.1 403"), p.stdout + p.stderr
    (rec,) = [r for r in map(json.loads, audit.read_text().splitlines()) if r["event"] == "request"]
    assert rec["reason"] in ("ssrf: documentation address 198.51.100.138",
                             "ssrf: documentation address 2001:db8:100::10")


def test_a_bad_public_range_is_a_usage_error(gatewrap):
    r = gatewrap(["/bin/true"], extra=["--public-range", "169.254.0.0/16"])
    assert r.returncode == 125
    assert "--public-range" in r.stderr and "metadata" in r.stderr


# --- every way to the metadata service and to IPv4 behind an IPv6 form, with an allow-all policy

from conftest import run_gatewrap  # noqa: E402
from rawproxy import agent_code, connect, get, record_of, results  # noqa: E402

#: default allow, and allow_private on the names (which must not be enough for metadata or
#: embedded IPv4); lan.test shows that allow_private does open a private address.
ALLOW_PRIVATE_POLICY = 'default = "allow"\n' + "".join(
    f'\n[[rule]]\nhost = "{name}"\naction = "allow"\nallow_private = true\n'
    for name in ("meta.test", "meta6.test", "mapped.test", "lan.test"))
#: The IPv4 normalisation bug of test_canonical_hosts.py: decimal forms are refused (400).
def refused(ip_class: str, ip: str) -> tuple[int, str]:
    return 403, f"ssrf: {ip_class} address {ip}"


GUARD_CASES = [
    ("the IPv6 metadata address", get("http://[fd00:ec2::254]/", "[fd00:ec2::254]"), refused("metadata", "fd00:ec2::254")),
    ("a name resolving to the metadata address with allow_private on its rule",
     get("http://meta.test/latest/meta-data/", "meta.test"), refused("metadata", "169.254.169.254")),
    ("a name resolving to the IPv6 metadata address with allow_private on its rule",
     get("http://meta6.test/", "meta6.test"), refused("metadata", "fd00:ec2::254")),
    ("a CONNECT to the metadata address", connect("169.254.169.254:443"), refused("metadata", "169.254.169.254")),
    ("a CONNECT to a name resolving to the metadata address with allow_private", connect("meta.test:443"),
     refused("metadata", "169.254.169.254")),
    ("the metadata address v4-mapped", get("http://[::ffff:169.254.169.254]/", "[::ffff:169.254.169.254]"),
     refused("embedded-ipv4", "::ffff:169.254.169.254")),
    ("the metadata address in decimal", get("http://2852039166/", "2852039166"), refused("metadata", "169.254.169.254")),
    ("a v4-mapped loopback address in hex", get("http://[::ffff:7f00:1]/", "[::ffff:7f00:1]"),
     refused("embedded-ipv4", "::ffff:127.0.0.1")),
    ("a v4-mapped public address", get("http://[::ffff:198.51.100.138]/", "[::ffff:198.51.100.138]"),
     refused("embedded-ipv4", "::ffff:198.51.100.138")),
    ("a v4-compatible loopback address", get("http://[::127.0.0.1]/", "[::127.0.0.1]"),
     refused("embedded-ipv4", "::7f00:1")),
    ("a NAT64 address embedding a private one", get("http://[64:ff9b::10.20.30.40]/", "[64:ff9b::10.20.30.40]"),
     refused("embedded-ipv4", "64:ff9b::a14:1e28")),
    ("a local-use NAT64 address embedding the metadata one", get("http://[64:ff9b:1::a9fe:a9fe]/", "[64:ff9b:1::a9fe:a9fe]"),
     refused("embedded-ipv4", "64:ff9b:1::a9fe:a9fe")),
    ("a 6to4 address embedding a private one", get("http://[2002:a14:1e28::1]/", "[2002:a14:1e28::1]"),
     refused("embedded-ipv4", "2002:a14:1e28::1")),
    ("a Teredo address", get("http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/", "[2001:0:4136:e378:8000:63bf:3fff:fdd2]"),
     refused("embedded-ipv4", "2001:0:4136:e378:8000:63bf:3fff:fdd2")),
    ("a name resolving to a v4-mapped address with allow_private on its rule", get("http://mapped.test/", "mapped.test"),
     refused("embedded-ipv4", "::ffff:10.20.30.40")),
    ("a name resolving to a private address with allow_private on its rule is dialled",
     get("http://lan.test/", "lan.test"), (200, "allow-private.toml:rule[4]")),
]


@pytest.fixture(scope="module")
def guard_run(net, tmp_path_factory):
    """One sandbox run under ALLOW_PRIVATE_POLICY sending every GUARD_CASES request."""
    net.clear_logs()
    d = tmp_path_factory.mktemp("guard")
    policy = d / "allow-private.toml"
    policy.write_text(ALLOW_PRIVATE_POLICY)
    run = run_gatewrap(net, d / "audit.jsonl", python=agent_code([(c, req) for c, req, _ in GUARD_CASES]),
                       extra=["--policy", str(policy)])
    answers = results(run.stdout)
    assert len(answers) == len(GUARD_CASES), run.stdout + run.stderr
    return run, answers


@pytest.mark.parametrize("case,want", [
    pytest.param(c, want, id=c)
    for c, _, want in GUARD_CASES])
def test_the_guard_refuses_metadata_and_embedded_ipv4_whatever_the_policy_allows(guard_run, case, want):
    run, answers = guard_run
    rec = record_of(run, answers[case])
    status, reason = want
    assert rec is not None, answers[case]
    assert (answers[case]["status"], rec.get("status")) == (status, status), (answers[case], rec)
    if status == 200:
        assert (rec["decision"], rec["dst_ip"]) == ("allowed", "10.20.30.40"), rec
        assert rec["rule"].endswith(reason), rec  # the policy file's path, then the rule
    else:
        assert (rec["decision"], rec.get("reason")) == ("denied", reason), rec


def test_the_guard_dialled_only_the_private_address_allow_private_opened(guard_run, net):
    seen = {(e["local"], e.get("host")) for e in net.access_entries(event="request")}
    assert seen == {("10.20.30.40", "lan.test")}, seen
