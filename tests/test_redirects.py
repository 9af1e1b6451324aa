"""Redirects to private addresses through a real sandbox: the gate never follows a
redirect itself (the agent receives the 302), and when the agent's client follows it, the
gate judges the new request on its own and the SSRF guard refuses it, under a policy that
allows everything."""

from __future__ import annotations

import json

import pytest

from conftest import run_gatewrap
from fakenet import FakeInternet
from fakenet.listener import CountingListener
from rawproxy import agent_code, get, results

pytestmark = pytest.mark.kernel

PRIVATE = "10.20.30.40"
TO_PRIVATE = f"http://allowed.test/redirect?to=http://{PRIVATE}/"
TO_LOOPBACK = "http://allowed.test/redirect?to=http://127.0.0.1/"
TO_LOOP_NAME = "http://allowed.test/redirect?to=http://loop.test/"

AGENT = r"""
import json, subprocess, requests

def curl(case_id, *args):
    p = subprocess.run(["curl", "-sS", "-L", "--max-time", "10", "-o", "/dev/null",
                        "-w", "%{http_code} %{num_redirects}", *args], capture_output=True, text=True)
    code, redirects = p.stdout.split()
    print(json.dumps({"id": case_id, "status": int(code), "redirects": int(redirects)}), flush=True)

def follow(case_id, url, session):
    r = session.get(url, timeout=10)
    print(json.dumps({"id": case_id, "status": r.status_code, "redirects": len(r.history),
                      "first": r.history[0].status_code if r.history else None}), flush=True)

curl("curl to a private address", TO_PRIVATE)
# NO_PROXY names 127.0.0.1 (the agent's own loopback); a list that does not, sends it to the gate
curl("curl to the loopback address", "--noproxy", "nothing.invalid", TO_LOOPBACK)
follow("requests to a name resolving to loopback", TO_LOOP_NAME, requests.Session())
s = requests.Session()
s.trust_env = False
s.proxies = {"http": "http://127.0.0.1:3128"}
follow("requests to the loopback address", TO_LOOPBACK, s)
"""


def client_agent() -> str:
    """AGENT with the three redirecting URLs defined."""
    return f"TO_PRIVATE, TO_LOOPBACK, TO_LOOP_NAME = {[TO_PRIVATE, TO_LOOPBACK, TO_LOOP_NAME]!r}\n{AGENT}"

#: (case, the address refused on the second request, its class)
FOLLOWED = [
    ("curl to a private address", PRIVATE, "private"),
    ("curl to the loopback address", "127.0.0.1", "loopback"),
    ("requests to a name resolving to loopback", "127.0.0.1", "loopback"),
    ("requests to the loopback address", "127.0.0.1", "loopback"),
]


@pytest.fixture(scope="module")
def net():
    with FakeInternet(extra_names={"loop.test": "127.0.0.1"}, private_addrs=[PRIVATE]) as n:
        yield n


@pytest.fixture(scope="module")
def redirect_runs(net, tmp_path_factory):
    """Two sandbox runs under an allow-all policy, the host's 127.0.0.1:80 watched: raw
    requests (what the gate answers itself), then clients that follow redirects."""
    net.clear_logs()
    d = tmp_path_factory.mktemp("redirects")
    policy = d / "allow-all.toml"
    policy.write_text('default = "allow"\n')
    extra = ["--policy", str(policy)]
    with CountingListener("127.0.0.1", 80) as loopback:
        loopback.self_check()
        raw = run_gatewrap(net, d / "raw.jsonl", extra=extra, python=agent_code(
            [(u, get(u, "allowed.test")) for u in (TO_PRIVATE, TO_LOOPBACK)]))
        clients = run_gatewrap(net, d / "clients.jsonl", extra=extra, python=client_agent())
    return raw, clients, loopback.connections


@pytest.mark.parametrize("url,location", [(TO_PRIVATE, f"http://{PRIVATE}/"), (TO_LOOPBACK, "http://127.0.0.1/")],
                         ids=["a redirect to a private address", "a redirect to the loopback address"])
def test_the_gate_hands_the_redirect_to_the_agent_without_following_it(redirect_runs, url, location):
    raw, _, _ = redirect_runs
    answer = results(raw.stdout)[url]
    assert answer["status"] == 302, raw.stdout + raw.stderr
    (rec,) = [r for r in raw.records(event="request") if r.get("client") == answer["client"]]
    assert (rec["decision"], rec["status"], rec["dst_host"]) == ("allowed", 302, "allowed.test")
    assert len(raw.records(event="request")) == 2  # one record per request the agent sent, nothing more


@pytest.mark.parametrize("case,ip,ip_class", FOLLOWED, ids=[c for c, _, _ in FOLLOWED])
def test_a_followed_redirect_to_a_private_address_is_judged_on_its_own_and_refused(redirect_runs, case, ip, ip_class):
    _, clients, _ = redirect_runs
    answers = {r["id"]: r for r in map(json.loads, clients.stdout.splitlines())}
    assert case in answers, clients.stdout + clients.stderr
    assert (answers[case]["status"], answers[case]["redirects"]) == (403, 1), answers[case]
    reason = f"ssrf: {ip_class} address {ip}"
    assert [r for r in clients.records(event="request") if r.get("reason") == reason], clients.audit()


def test_no_redirect_reached_a_private_server(redirect_runs, net):
    raw, clients, loopback_connections = redirect_runs
    refused = [r for r in clients.records(event="request") if r["decision"] == "denied"]
    assert len(refused) == len(FOLLOWED) and all(r["reason"].startswith("ssrf: ") for r in refused), refused
    assert net.access_entries(local=PRIVATE) == []
    assert loopback_connections == []
    # the fake internet saw exactly the requests the agents sent to allowed.test
    assert len(net.access_entries(event="request", path=TO_PRIVATE.removeprefix("http://allowed.test"))) == 2
