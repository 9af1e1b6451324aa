"""DNS rebinding through a real sandbox: a name the fake DNS answers with a public address
first and a private one afterwards (TTL 0). The gate judges every lookup on its own and
dials only an address it vetted: the private servers (10.20.30.40 in the fake internet, the
host's 127.0.0.1:80) receive no connection at all."""

from __future__ import annotations

import json

import pytest

from fakenet import FakeInternet
from fakenet.listener import CountingListener

pytestmark = pytest.mark.kernel

PRIVATE = "10.20.30.40"
SEQUENCES = {
    "rebind.test": ["198.51.100.138", PRIVATE],
    "rebind-loop.test": ["198.51.100.138", "127.0.0.1"],
    "rebind-tls.test": ["198.51.100.138", PRIVATE],
    "rebind-v6.test": ["2001:db8:100::10", "fd00::1020:3040"],
}
#: A name with a private and a public address at once: the private one is dropped.
MIXED = {"mixed.test": [PRIVATE, "198.51.100.138"]}


@pytest.fixture(scope="module")
def net():
    with FakeInternet(extra_names=MIXED, sequences=SEQUENCES, private_addrs=[PRIVATE, "fd00::1020:3040"]) as n:
        yield n


@pytest.fixture(scope="module")
def host_loopback():
    """Watches the host's 127.0.0.1:80, where a rebound name would take the gate."""
    with CountingListener("127.0.0.1", 80) as listener:
        listener.self_check()
        yield listener


AGENT = r"""
import json, requests
for url in URLS:
    try:
        r = requests.get(url, timeout=10)
        print(json.dumps([url, r.status_code, r.text]), flush=True)
    except requests.RequestException as e:
        print(json.dumps([url, 0, repr(e)]), flush=True)
"""


def agent(urls: list[str]) -> str:
    return f"URLS = {urls!r}\n{AGENT}"


@pytest.mark.parametrize("name,private_ip,ip_class", [
    ("rebind.test", PRIVATE, "private"),
    ("rebind-loop.test", "127.0.0.1", "loopback"),
    ("rebind-v6.test", "fd00::1020:3040", "private"),
], ids=["a name rebound to a private address", "a name rebound to the host's loopback",
        "a name rebound to a private IPv6 address"])
def test_a_rebound_name_is_refused_on_its_next_lookup_and_never_dialled(gatewrap, net, host_loopback,
                                                                       name, private_ip, ip_class):
    net.clear_logs()
    r = gatewrap(python=agent([f"http://{name}/"] * 3), allow=[name])
    seen = [tuple(line) for line in map(json.loads, r.stdout.splitlines())]
    assert [s[1] for s in seen] == [200, 403, 403], r.stdout + r.stderr
    assert seen[0][2] == f"hello from {name} over http\n"
    reason = f"ssrf: {ip_class} address {private_ip}"
    recs = r.records(event="request")
    assert [(x["decision"], x.get("reason")) for x in recs] == [
        ("allowed", f"policy: rule --allow {name}"), ("denied", reason), ("denied", reason)]
    assert recs[0]["dst_ip"] == net.names[name][0]  # the public first answer was dialled
    # the gate asked the fake DNS again for each request (no allow cached across lookups) ...
    qtype = "AAAA" if ":" in private_ip else "A"
    answers = [q["answers"] for q in net.dns_queries(qname=name, qtype=qtype)]
    assert len(answers) >= 3 and private_ip in answers[-1], answers
    # ... and never connected to the private address it was given
    assert net.access_entries(local=private_ip) == []
    assert host_loopback.connections == []


def test_a_rebound_connect_target_is_refused_on_its_next_lookup(gatewrap, net):
    net.clear_logs()
    r = gatewrap(python=agent(["https://rebind-tls.test/"] * 2), allow=["rebind-tls.test"])
    seen = [tuple(line) for line in map(json.loads, r.stdout.splitlines())]
    assert seen[0][1:] == (200, "hello from rebind-tls.test over https\n"), r.stdout + r.stderr
    assert seen[1][1] == 0 and "403" in seen[1][2], seen
    recs = r.records(event="connect")
    assert [(x["decision"], x.get("reason")) for x in recs] == [
        ("allowed", "policy: rule --allow rebind-tls.test"), ("denied", f"ssrf: private address {PRIVATE}")]
    assert net.access_entries(local=PRIVATE) == []


def test_a_name_with_a_private_and_a_public_address_is_dialled_on_the_public_one(gatewrap, net):
    net.clear_logs()
    r = gatewrap(python=agent(["http://mixed.test/"] * 2), allow=["mixed.test"])
    seen = [tuple(line) for line in map(json.loads, r.stdout.splitlines())]
    assert [s[1:] for s in seen] == [(200, "hello from mixed.test over http\n")] * 2, r.stdout + r.stderr
    recs = r.records(event="request")
    assert [(x["decision"], x["dst_ip"]) for x in recs] == [("allowed", "198.51.100.138")] * 2
    assert net.access_entries(local=PRIVATE) == []
