"""The gate keeps upstream connections between requests (gate_core/src/gate/pool.rs), and
only where the SSRF guard sends the request anyway: requests from different agent
connections to one vetted address share one upstream TCP connection; a name that now
resolves elsewhere gets a connection to its new address. And a CONNECT tunnel carries a
large body intact both ways (idle.rs's larger buffers)."""

from __future__ import annotations

import json

import pytest

from fakenet import FakeInternet

pytestmark = pytest.mark.kernel

POOLED = "198.51.100.148"
#: A name whose answers move between two public addresses and back.
FLIP = ["198.51.100.138", "198.51.100.158", "198.51.100.138"]


@pytest.fixture(scope="module")
def net():
    with FakeInternet(extra_names={"pool.test": [POOLED]}, sequences={"flip.test": FLIP}) as n:
        yield n


def upstream_requests(net, host: str) -> list[dict]:
    return [e for e in net.access_entries(event="request", server="http") if e["host"] == host]


def test_requests_from_different_agent_connections_share_one_upstream_connection(gatewrap, net):
    net.clear_logs()
    # requests.get opens a connection to the gate per call, and `Connection: close` ends it.
    r = gatewrap(python="""
        import json, requests
        for i in range(6):
            resp = requests.get(f"http://pool.test/status/200?i={i}", headers={"Connection": "close"}, timeout=10)
            print(resp.status_code, flush=True)
    """, allow=["pool.test"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["200"] * 6, r.stdout + r.stderr
    seen = upstream_requests(net, "pool.test")
    assert [e["path"] for e in seen] == [f"/status/200?i={i}" for i in range(6)]
    # one TCP connection from the gate carried all six requests
    assert len(net.access_entries(event="connect", server="http", local=POOLED)) == 1
    assert len({e["peer_port"] for e in seen}) == 1, seen
    # the records are per request, as without the pool: an admit and an outcome each
    recs = r.records(event="request")
    assert [(x["decision"], x["dst_ip"], x["status"]) for x in recs] == [("allowed", POOLED, 200)] * 6
    assert len(r.records(event="admit")) == 6


def test_a_kept_connection_is_not_reused_once_the_name_resolves_elsewhere(gatewrap, net):
    net.clear_logs()
    r = gatewrap(python="""
        import requests
        s = requests.Session()
        for i in range(3):
            print(s.get(f"http://flip.test/status/200?i={i}", timeout=10).status_code, flush=True)
    """, allow=["flip.test"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["200"] * 3, r.stdout + r.stderr
    seen = upstream_requests(net, "flip.test")
    # each request reached the address its own lookup gave, which the guard vetted ...
    assert [e["local"] for e in seen] == FLIP
    assert [x["dst_ip"] for x in r.records(event="request")] == FLIP
    # ... the second on a new connection, the third on the first's connection again
    assert seen[0]["peer_port"] == seen[2]["peer_port"]
    assert len(net.access_entries(event="connect", server="http")) == 2


TUNNEL_AGENT = r"""
import hashlib, os, socket, threading, urllib.parse
proxy = urllib.parse.urlsplit(os.environ.get("HTTPS_PROXY") or os.environ["https_proxy"])
s = socket.create_connection((proxy.hostname, proxy.port), timeout=30)
s.sendall(b"CONNECT pool.test:7 HTTP/1.1\r\nHost: pool.test:7\r\n\r\n")
head = b""
while not head.endswith(b"\r\n\r\n"):
    head += s.recv(1)
print(head.split(b"\r\n")[0].decode(), flush=True)
data = os.urandom(SIZE)
def send():
    s.sendall(data)
    s.shutdown(socket.SHUT_WR)
t = threading.Thread(target=send)
t.start()
h, n = hashlib.sha256(), 0
while chunk := s.recv(1 << 20):
    h.update(chunk)
    n += len(chunk)
t.join()
print(n, h.hexdigest() == hashlib.sha256(data).hexdigest(), flush=True)
"""


def test_a_tunnel_carries_a_large_body_intact_both_ways(gatewrap, net):
    size = 48 * 1024 * 1024 + 12345  # many buffers' worth, not a multiple of one
    r = gatewrap(python=f"SIZE = {size}\n{TUNNEL_AGENT}", allow=["pool.test:7"], timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["HTTP/1.1 200 OK", f"{size} True"], r.stdout + r.stderr
    (rec,) = r.records(event="connect")
    assert (rec["decision"], rec["dst_ip"], rec["dst_port"]) == ("allowed", POOLED, 7)
