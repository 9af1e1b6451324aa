"""Canonical hosts through a real sandbox: the gate judges (and dials) one spelling of each
destination, whatever spelling the agent sends.

One sandbox run sends every raw case below on a connection of its own (bytes written by
hand to the gate, see ``rawproxy.py``); each test then checks one answer and its audit
record. A second run does the same with curl and requests, which clean up some spellings
themselves before the gate sees them.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import pytest

from conftest import run_gatewrap
from fakenet import FakeInternet
from rawproxy import agent_code, connect, folded_record, get, record_of, results

pytestmark = pytest.mark.kernel

#: Names a wrong match would reach (evil.test's address), and two IDN names in punycode.
NAMES = {
    "evilallowed.test": "198.51.100.158",
    "allowed.test.evil.test": "198.51.100.158",
    "xn--bcher-kva.test": "198.51.100.138",  # bücher.test
    "xn--mnchen-3ya.test": "198.51.100.138",  # münchen.test
}
#: bücher.test is allowed by its Unicode spelling, münchen.test by its punycode one.
ALLOW = ["allowed.test", "*.allowed.test", "bücher.test", "xn--mnchen-3ya.test", "198.51.100.138",
         "[2001:db8:100::10]"]
DEFAULT_DENY = "policy: default deny"
MALFORMED_URI = "protocol: malformed request (invalid URI)"
MISMATCH = "Host header disagrees with the request target"

@pytest.fixture(scope="module")
def net():
    with FakeInternet(extra_names=NAMES) as n:
        yield n


@dataclass
class Case:
    """One raw request and what the gate must do with it. ``reason`` ending in ``*`` is a
    prefix; ``dst_host``/``rule``/``body`` are checked when given."""

    id: str
    request: str
    status: int
    reason: str | None = None
    dst_host: str | None = None
    rule: str | None = None
    body: str | None = None
    bug: str | None = None  # a known gate bug: the case is a strict xfail
    says: str | None = None  # for a 400: what its body says (default: the reason's words)

    @property
    def decision(self) -> str:
        return "allowed" if self.status == 200 else "denied"


def hello(host: str) -> str:
    return f"hello from {host} over http\n"


def invalid(value: str, why: str) -> str:
    return f"protocol: invalid host {json.dumps(value)}: {why}"


LONG_LABEL = "a" * 64 + ".allowed.test"
LONG_NAME = ("a" * 62 + ".") * 4 + "allowed.test"  # 264 characters, every label legal


def ok(id, target, host, dst, rule, body=None, **kw):
    return Case(id, get(target, host), 200, None, dst, rule, body if body is not None else hello(dst), **kw)


def deny(id, target, host, dst, reason=DEFAULT_DENY, **kw):
    return Case(id, get(target, host), 403, reason, dst, **kw)


def bad(id, request, reason, **kw):
    return Case(id, request, 400, reason, **kw)


CASES = [
    # label boundaries
    ok("a subdomain matches a *.suffix rule", "http://other.allowed.test/", "other.allowed.test",
       "other.allowed.test", "--allow *.allowed.test"),
    deny("a name that merely ends in the suffix is not a subdomain", "http://evilallowed.test/",
         "evilallowed.test", "evilallowed.test"),
    deny("the allowed name as the first labels of another domain is not allowed",
         "http://allowed.test.evil.test/", "allowed.test.evil.test", "allowed.test.evil.test"),
    # trailing dots
    ok("one trailing dot names the same host", "http://allowed.test./", "allowed.test.", "allowed.test",
       "--allow allowed.test"),
    ok("a subdomain with a trailing dot matches the suffix rule", "http://other.allowed.test./",
       "other.allowed.test.", "other.allowed.test", "--allow *.allowed.test"),
    bad("two trailing dots are refused", get("http://allowed.test../", "allowed.test.."),
        invalid("allowed.test..", "empty label")),
    bad("a leading dot is refused", get("http://.allowed.test/", ".allowed.test"),
        invalid(".allowed.test", "empty label")),
    # case
    ok("an upper-case name is the same host", "http://ALLOWED.Test/", "ALLOWED.Test", "allowed.test",
       "--allow allowed.test"),
    ok("an upper-case subdomain matches the suffix rule", "http://OTHER.ALLOWED.TEST/", "OTHER.ALLOWED.TEST",
       "other.allowed.test", "--allow *.allowed.test"),
    # IDN
    ok("a punycode request matches a rule written in Unicode", "http://xn--bcher-kva.test/",
       "xn--bcher-kva.test", "xn--bcher-kva.test", "--allow bücher.test"),
    ok("upper-case punycode matches a rule written in Unicode", "http://XN--BCHER-KVA.test/",
       "XN--BCHER-KVA.test", "xn--bcher-kva.test", "--allow bücher.test"),
    bad("a raw UTF-8 name in the request target is refused: URIs are ASCII",
        get("http://bücher.test/", "xn--bcher-kva.test").encode().decode("latin-1"),
        MALFORMED_URI),
    # alternate IPv4 spellings of an allowed address (198.51.100.138) and of denied ones
    ok("the dotted quad of an allowed address is allowed", "http://198.51.100.138/", "198.51.100.138",
       "198.51.100.138", "--allow 198.51.100.138"),
    ok("a 32-bit decimal address is judged as its dotted quad", "http://3325256842/", "3325256842",
       "198.51.100.138", "--allow 198.51.100.138"),
    ok("an octal address is judged as its dotted quad", "http://0306.063.0144.0212/", "0306.063.0144.0212",
       "198.51.100.138", "--allow 198.51.100.138"),
    ok("a hex address is judged as its dotted quad", "http://0xc6.0x33.0x64.0x8a/", "0xc6.0x33.0x64.0x8a",
       "198.51.100.138", "--allow 198.51.100.138"),
    ok("a three-part short form is judged as its dotted quad", "http://198.51.25738/", "198.51.25738",
       "198.51.100.138", "--allow 198.51.100.138"),
    ok("a two-part short form is judged as its dotted quad", "http://198.3368074/", "198.3368074",
       "198.51.100.138", "--allow 198.51.100.138"),
    deny("a hex spelling of a denied address is judged as that address", "http://0xc6.0x33.0x64.0x94/",
         "0xc6.0x33.0x64.0x94", "198.51.100.148"),
    deny("a short form that reads as another address is judged as that address", "http://203.113.10/",
         "203.113.10", "203.113.0.10"),
    deny("a leading zero makes the last part octal, not the allowed address", "http://198.51.100.0210/",
         "198.51.100.0210", "198.51.100.136"),
    bad("an address past 32 bits is refused", get("http://4294967296/", "4294967296"),
        invalid("4294967296", "numeric last label but not an IPv4 address in any spelling")),
    # IPv6 spellings of an allowed address
    ok("an IPv6 literal in upper case with a zero group is the compressed address",
       "http://[2001:DB8:100:0::10]/", "[2001:DB8:100:0::10]", "2001:db8:100::10", "--allow [2001:db8:100::10]"),
    ok("an IPv6 literal written out in full is the compressed address",
       "http://[2001:0db8:0100:0000:0000:0000:0000:0010]/", "[2001:0db8:0100:0000:0000:0000:0000:0010]",
       "2001:db8:100::10", "--allow [2001:db8:100::10]"),
    ok("an IPv6 literal with a dotted tail is the compressed address", "http://[2001:db8:100::0.0.0.16]/",
       "[2001:db8:100::0.0.0.16]", "2001:db8:100::10", "--allow [2001:db8:100::10]"),
    bad("an IPv6 zone id is refused", get("http://[fe80::1%25eth0]/", "[fe80::1%25eth0]"),
        invalid("[fe80::1%25eth0]", "not an IPv6 address inside brackets")),
    # userinfo never picks the destination
    deny("userinfo naming an allowed host does not make it the destination", "http://allowed.test@evil.test/",
         "evil.test", "evil.test"),
    deny("userinfo with a password naming an allowed host does not either",
         "http://allowed.test:80@evil.test/", "evil.test", "evil.test"),
    ok("userinfo before an allowed host is ignored for matching", "http://evil.test@allowed.test/",
       "allowed.test", "allowed.test", "--allow allowed.test"),
    bad("a backslash before @ is refused, not read as a path", get("http://evil.test\\@allowed.test/", "allowed.test"),
        MALFORMED_URI),
    ok("a fragment after the host is dropped: the request is for allowed.test's /",
       "http://allowed.test#@evil.test/", "allowed.test", "allowed.test", "--allow allowed.test"),
    ok("an empty path before a query is sent as /", "http://allowed.test?x=1", "allowed.test", "allowed.test",
       "--allow allowed.test"),
    # the Host header
    bad("a Host header naming another host is refused", get("http://allowed.test/", "evil.test"),
        "protocol: host mismatch", says=MISMATCH),
    bad("a Host header naming an allowed host does not rescue a denied target", get("http://evil.test/", "allowed.test"),
        "protocol: host mismatch", says=MISMATCH),
    bad("a Host header with another port is refused", get("http://allowed.test/", "allowed.test:8080"),
        "protocol: host mismatch", says=MISMATCH),
    bad("a Host header with userinfo is refused", get("http://allowed.test/", "evil.test@allowed.test"),
        "protocol: host mismatch", says=MISMATCH),
    bad("two Host headers are refused", get("http://allowed.test/", "allowed.test", headers="Host: evil.test\r\n"),
        "protocol: more than one Host header", says="more than one Host header"),
    ok("a Host header that agrees once canonical is accepted", "http://allowed.test/", "ALLOWED.TEST.:80",
       "allowed.test", "--allow allowed.test"),
    bad("an HTTP/1.1 request without a Host header is refused (RFC 9112 §3.2)", get("http://allowed.test/"),
        "protocol: no Host header", says="an HTTP/1.1 request without a Host header"),
    Case("an HTTP/1.0 request without a Host header is accepted",
         get("http://allowed.test/").replace("HTTP/1.1", "HTTP/1.0", 1), 200, None, "allowed.test",
         "--allow allowed.test", hello("allowed.test")),
    # hostile names
    bad("a percent-encoded NUL in the host is refused", get("http://allowed.test%00.evil.test/", "allowed.test"),
        MALFORMED_URI),
    bad("a percent-encoded space in the host is refused", get("http://allowed%20.test/", "allowed.test"),
        MALFORMED_URI),
    bad("a percent-encoded name is refused, not decoded into an allowed one", get("http://%61llowed.test/", "allowed.test"),
        MALFORMED_URI),
    bad("a raw control character in the target is refused", get("http://allowed\x01.test/", "allowed.test"),
        MALFORMED_URI),
    bad("a raw space in the target is refused", get("http://allowed .test/", "allowed.test"),
        "protocol: malformed request (invalid HTTP version parsed)"),
    bad("a label longer than 63 characters is refused even under an allowed suffix",
        get(f"http://{LONG_LABEL}/", LONG_LABEL), invalid(LONG_LABEL, "label longer than 63 characters")),
    bad("a name longer than 253 characters is refused even under an allowed suffix",
        get(f"http://{LONG_NAME}/", LONG_NAME), invalid(LONG_NAME, "longer than 253 characters")),
    # CONNECT targets are canonicalised the same way
    Case("CONNECT with a trailing dot names the same host", connect("allowed.test.:443"), 200, None,
         "allowed.test", "--allow allowed.test"),
    Case("CONNECT in upper case names the same host", connect("ALLOWED.TEST:443"), 200, None,
         "allowed.test", "--allow allowed.test"),
    Case("CONNECT to a name that merely ends in the suffix is denied", connect("evilallowed.test:443"), 403,
         DEFAULT_DENY, "evilallowed.test"),
    Case("CONNECT to two trailing dots is refused", connect("allowed.test..:443"), 400,
         invalid("allowed.test..", "empty label")),
    Case("CONNECT to an IPv6 literal in another spelling is the compressed address",
         connect("[2001:DB8:100:0::10]:443"), 200, None, "2001:db8:100::10", "--allow [2001:db8:100::10]"),
    Case("CONNECT with userinfo naming an allowed host does not make it the destination",
         connect("allowed.test@evil.test:443"), 403, DEFAULT_DENY, "evil.test"),
    Case("CONNECT with userinfo before an allowed host is ignored for matching",
         connect("evil.test@allowed.test:443"), 200, None, "allowed.test", "--allow allowed.test"),
    Case("CONNECT to a decimal address is judged as its dotted quad", connect("3325256842:443"), 200, None,
         "198.51.100.138", "--allow 198.51.100.138"),
]


@pytest.fixture(scope="module")
def raw_run(net, tmp_path_factory):
    """One sandbox run that sends every case; returns the run and the answers by case id."""
    net.clear_logs()
    audit = tmp_path_factory.mktemp("canon") / "audit.jsonl"
    run = run_gatewrap(net, audit, python=agent_code([(c.id, c.request) for c in CASES]), allow=ALLOW)
    answers = results(run.stdout)
    assert len(answers) == len(CASES), run.stdout + run.stderr
    return run, answers


def params(cases):
    return [pytest.param(c, id=c.id, marks=[pytest.mark.xfail(strict=True, reason=c.bug)] if c.bug else [])
            for c in cases]


@pytest.mark.parametrize("case", params(CASES))
def test_the_gate_judges_the_canonical_host(raw_run, net, case):
    run, answers = raw_run
    answer = answers[case.id]
    rec = record_of(run, answer)
    if rec is None and case.decision == "denied" and case.reason is not None:
        rec = folded_record(run, case.decision, case.reason, case.dst_host)  # a repeated denial, counted
    assert rec is not None, f"no audit record for {answer}"
    got = (answer["status"], rec["decision"], rec.get("status"))
    assert got == (case.status, case.decision, case.status), (answer, rec)
    if case.reason is not None and case.reason.endswith("*"):
        assert rec.get("reason", "").startswith(case.reason[:-1]), rec
    elif case.reason is not None:
        assert rec.get("reason") == case.reason, rec
    if case.dst_host is not None:
        assert rec.get("dst_host") == case.dst_host, rec
    if case.rule is not None:
        assert rec.get("rule") == case.rule, rec
    if case.body is not None:
        assert answer["body"] == case.body, answer


MALFORMED_BODY = ("gate bug: a request head hyper cannot parse (raw control character or space, '%' in "
                  "the host) is answered by hyper itself with an empty 400 (gate_core/src/gate/server.rs, "
                  "malformed.rs only audits it): no body tells the agent what was wrong with the host")


@pytest.mark.parametrize("case", params([
    dataclasses.replace(c, bug=c.bug or (MALFORMED_BODY if c.reason.startswith("protocol: malformed") else None))
    for c in CASES if c.status == 400]))
def test_a_refused_host_gets_a_body_that_says_why(raw_run, case):
    _, answers = raw_run
    says = case.says or case.reason.removeprefix("protocol: ")
    if case.reason.startswith("protocol: malformed") or case.reason.endswith("*"):
        says = "gatewrap gate: "  # the gate's own words, whatever they are
    assert says in answers[case.id]["body"], answers[case.id]


def test_no_refused_or_denied_case_reached_the_fake_internet(raw_run, net):
    """Nothing the gate refused was dialled: the only addresses the servers saw requests on
    are the allowed ones (evil.test's 198.51.100.158 and denied.test's .20 saw nothing)."""
    seen = {e["local"] for e in net.access_entries()}
    assert seen <= {"198.51.100.138", "2001:db8:100::10"}, seen


CLIENT_AGENT = r"""
import json, subprocess, requests

def curl(case_id, *args):
    p = subprocess.run(["curl", "-sS", "--max-time", "10", "-w", "\n%{http_code}", *args],
                       capture_output=True, text=True)
    body, _, code = p.stdout.rpartition("\n")
    print(json.dumps({"id": case_id, "status": int(code or 0), "body": body, "error": p.stderr}), flush=True)

def get(case_id, url):
    try:
        r = requests.get(url, timeout=10)
        out = {"status": r.status_code, "body": r.text}
    except Exception as e:
        out = {"status": 0, "body": "", "error": repr(e)}
    print(json.dumps({"id": case_id, **out}), flush=True)

curl("curl upper case and a trailing dot", "http://ALLOWED.TEST./")
curl("curl Unicode name", "http://bücher.test/")
get("requests Unicode name", "http://münchen.test/")
curl("curl decimal address", "http://3325256842/")
curl("curl hex address", "http://0xc6.0x33.0x64.0x8a/")
get("requests IPv6 spelling", "http://[2001:DB8:100:0::10]/")
get("requests userinfo", "http://allowed.test@evil.test/")
curl("curl backslash userinfo", "--path-as-is", "http://evil.test\\@allowed.test/")
"""

#: (case, status the agent saw, body, the host of the gate's record, its rule or reason)
CLIENT_CASES = [
    ("curl upper case and a trailing dot", 200, hello("allowed.test"), "allowed.test", "--allow allowed.test"),
    ("curl Unicode name", 200, hello("xn--bcher-kva.test"), "xn--bcher-kva.test", "--allow bücher.test"),
    ("requests Unicode name", 200, hello("xn--mnchen-3ya.test"), "xn--mnchen-3ya.test",
     "--allow xn--mnchen-3ya.test"),
    ("curl decimal address", 200, hello("198.51.100.138"), "198.51.100.138", "--allow 198.51.100.138"),
    ("curl hex address", 200, hello("198.51.100.138"), "198.51.100.138", "--allow 198.51.100.138"),
    ("requests IPv6 spelling", 200, hello("2001:db8:100::10"), "2001:db8:100::10", "--allow [2001:db8:100::10]"),
    ("requests userinfo", 403, None, "evil.test", DEFAULT_DENY),
]
CLIENT_IDS = [
    "curl's own clean-up of case and a trailing dot reaches the allowed host",
    "curl sends a Unicode name as punycode, matched by a Unicode rule",
    "requests sends a Unicode name as punycode, matched by a punycode rule",
    "curl turns a decimal address into the dotted quad the rule names",
    "curl turns a hex address into the dotted quad the rule names",
    "requests with an IPv6 spelling reaches the allowed address",
    "requests with userinfo naming an allowed host is judged on the real host",
]


@pytest.fixture(scope="module")
def client_run(net, raw_run, tmp_path_factory):
    audit = tmp_path_factory.mktemp("canon-clients") / "audit.jsonl"
    run = run_gatewrap(net, audit, python=CLIENT_AGENT, allow=ALLOW)
    return run, results(run.stdout)


@pytest.mark.parametrize("case,status,body,dst_host,why", CLIENT_CASES, ids=CLIENT_IDS)
def test_clients_reach_the_canonical_host(client_run, case, status, body, dst_host, why):
    run, answers = client_run
    answer = answers[case]
    assert answer["status"] == status, answer
    if body is not None:
        assert answer["body"] == body, answer
    recs = [r for r in run.records(event="request") if r.get("dst_host") == dst_host]
    assert recs, run.audit()
    key = "rule" if status == 200 else "reason"
    assert {(r["decision"], r.get(key)) for r in recs} == {("allowed" if status == 200 else "denied", why)}


def test_curl_reads_a_backslash_before_at_as_userinfo_and_the_gate_judges_the_same_host(client_run, net):
    """curl (RFC 3986 style) takes ``evil.test\\`` for userinfo and sends the request to
    allowed.test; the gate judges that same host, and evil.test's server sees nothing."""
    run, answers = client_run
    answer = answers["curl backslash userinfo"]
    assert (answer["status"], answer["body"]) == (200, hello("allowed.test")), answer
    assert not [r for r in run.audit() if r.get("dst_host") == "evil.test" and r["decision"] == "allowed"]
    assert net.access_entries(local="198.51.100.158") == []
