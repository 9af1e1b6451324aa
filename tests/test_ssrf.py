"""The SSRF guard through a real sandbox: names that resolve to non-public addresses, and
metadata addresses, are refused before any connection, whatever the policy allows."""

from __future__ import annotations

import pytest

from fakenet import FakeInternet

pytestmark = pytest.mark.kernel

CURL = ["curl", "-sS", "-i", "--max-time", "10"]


@pytest.fixture(scope="module")
def net():
    with FakeInternet(extra_names={"loop.test": "127.0.0.1", "meta.test": "169.254.169.254",
                                   "lan.test": "10.20.30.40"}) as n:
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
    assert rec["reason"] in ("ssrf: documentation address 203.0.113.10",
                             "ssrf: documentation address 2001:db8:100::10")


def test_a_bad_public_range_is_a_usage_error(gatewrap):
    r = gatewrap(["/bin/true"], extra=["--public-range", "169.254.0.0/16"])
    assert r.returncode == 125
    assert "--public-range" in r.stderr and "metadata" in r.stderr
