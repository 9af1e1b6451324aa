"""The SSRF guard inside an inspected tunnel: the tunnel keeps its upstream connection for
the next request, and that request may be decided by another rule. A kept connection to an
address the guard would refuse for that rule is not reused (found by the final attack pass:
a rule with `allow_private` opened the connection, and a request another rule allowed rode it
to the private address)."""

from __future__ import annotations

import json

import pytest

from fakenet import FakeInternet
from rawproxy import READ_ANSWER

pytestmark = pytest.mark.kernel

PRIVATE = "10.20.30.40"

POLICY = """
[[rule]]
host = "priv.test"
path = "/a"
allow_private = true
inspect = true
action = "allow"

[[rule]]
host = "priv.test"
inspect = true
action = "allow"
"""

AGENT = r"""
import json, socket, ssl
""" + READ_ANSWER + r"""
def tunnel():
    s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    s.sendall(b"CONNECT priv.test:443 HTTP/1.1\r\nHost: priv.test:443\r\n\r\n")
    answer(s)
    return ssl.create_default_context().wrap_socket(s, server_hostname="priv.test")
def get(s, path):
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: priv.test\r\n\r\n".encode())
    line, body = answer(s)
    return [line, body.decode(errors="replace")]
out = {"fresh /b": get(tunnel(), "/b")}
t = tunnel()
out["/a"] = get(t, "/a")
out["/b after /a"] = get(t, "/b")
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def net():
    with FakeInternet(extra_names={"priv.test": PRIVATE}, private_addrs=[PRIVATE]) as n:
        yield n


def test_a_kept_upstream_connection_to_a_private_address_is_not_reused_by_a_request_another_rule_allows(
        gatewrap, net, tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    r = gatewrap(["/usr/bin/python3", "-c", AGENT],
                 extra=["--policy", str(policy), "--upstream-ca", net.ca_path, "--ca-dir", str(tmp_path / "ca")])
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    ssrf = f"ssrf: private address {PRIVATE}"
    assert out["fresh /b"][0] == "HTTP/1.1 403 Forbidden", out
    assert not out["/a"][0].startswith("HTTP/1.1 403"), out  # rule 1 allows the private address
    assert out["/b after /a"][0] == "HTTP/1.1 403 Forbidden", out
    b_records = [x for x in r.records(event="request", proto="https") if x["target"].endswith("/b")]
    assert [(x["decision"], x["reason"]) for x in b_records] == [("denied", ssrf)] * 2, b_records
    assert not net.access_entries(path="/b"), "a request the guard refuses reached the private address"
    assert net.access_entries(path="/a"), "the control: /a reached it under allow_private"
