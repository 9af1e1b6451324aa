"""Breakpoints on a CONNECT tunnel (no inspection: the approval is for the tunnel itself),
the wait endpoint in absolute form, and the bound on the bytes of bodies a gate holds.
Real sandbox, real gate, the fake internet's access log for what reached upstream."""

from __future__ import annotations

import shlex
import time

import pytest

from .test_gate_hold import Session, post

pytestmark = pytest.mark.kernel


def get_https(net, path: str) -> str:
    """curl through the gate's CONNECT (the sandbox's proxy settings; the fake internet's CA),
    printing the CONNECT's status after the body."""
    return shlex.join(["curl", "-sS", "--max-time", "60", "--cacert", net.ca_path,
                       "-w", "\\nconnect=%{http_connect} code=%{http_code}\\n", f"https://allowed.test{path}"])


def tls_connections(net) -> int:
    """TLS connections the fake https server accepted so far (its log is the session's)."""
    return len(net.access_entries(server="https", event="connect"))


def test_an_approved_tunnel_opens_once(net, tmp_path):
    before = tls_connections(net)
    s = Session(net, tmp_path, get_https(net, "/echo?t=tun"))
    (a,) = s.pending()
    assert (a["method"], a["url"], a["body"]) == ("CONNECT", "allowed.test:443", b"")
    time.sleep(0.5)
    assert tls_connections(net) == before, "no tunnel before a yes"
    s.decide(a, "approve")
    r = s.finish()
    assert r.returncode == 0, r.stderr
    assert "connect=200 code=200" in r.stdout
    assert len(net.access_entries(server="https", event="request", path="/echo?t=tun")) == 1
    assert tls_connections(net) == before + 1, "the tunnel opened once"
    (rec,) = r.records(event="connect", approval=a["id"])
    assert rec["decision"] == "allowed" and rec["reason"].startswith(f"ask: approval {a['id']} approved by tester")
    assert r.records(event="admit", approval=a["id"])
    assert r.records(event="approval_sent")[0]["status"] == 200
    assert s.store.get(a["id"])["status"] == "sent"


def test_a_rejected_tunnel_is_403_with_the_reason(net, tmp_path):
    before = tls_connections(net)
    s = Session(net, tmp_path, get_https(net, "/echo?t=tunrej"))
    (a,) = s.pending()
    s.decide(a, "reject", reason="no https to it today")
    r = s.finish()
    assert "connect=403" in r.stdout
    assert tls_connections(net) == before
    (rec,) = r.records(event="connect", approval=a["id"])
    assert rec["decision"] == "denied" and rec["status"] == 403
    assert "no https to it today" in rec["reason"]


def test_a_tunnel_not_answered_in_time_is_denied(net, tmp_path):
    before = tls_connections(net)
    s = Session(net, tmp_path, get_https(net, "/echo?t=tunexp"), timeout="2s")
    r = s.finish()
    assert "connect=403" in r.stdout
    assert tls_connections(net) == before
    (a,) = s.store.list()
    assert (a["method"], a["status"]) == ("CONNECT", "expired")
    (rec,) = r.records(event="connect", approval=a["id"])
    assert rec["decision"] == "denied" and "expired" in rec["reason"]


def test_hold_return_on_a_tunnel_answers_409(net, tmp_path):
    before = tls_connections(net)
    s = Session(net, tmp_path, get_https(net, "/echo?t=tunret"), hold="return")
    r = s.finish()
    assert "connect=409" in r.stdout
    (a,) = s.store.list()  # cancelled since: the run ended
    assert (a["method"], a["hold"]) == ("CONNECT", "return")
    (rec,) = r.records(event="connect", approval=a["id"])
    assert rec["status"] == 409 and tls_connections(net) == before


PROXY = ("--proxy", "http://127.0.0.1:3128")


def test_the_wait_endpoint_answers_in_absolute_form_to_the_gates_own_address(net, tmp_path):
    """What a client with HTTP_PROXY set sends: GET http://127.0.0.1:3128/.well-known/...;
    the same path on any other host is an ordinary request for the policy (denied here)."""
    endpoint = "/.well-known/gatewrap/approvals/$id"
    script = "; ".join([
        f"{post('/echo?t=abs', 'x', '-D', '/tmp/h')} > /tmp/first",
        "id=$(sed -n 's/^gatewrap-approval: *//Ip' /tmp/h | tr -d '\\r')",
        f"curl -sS --max-time 70 {' '.join(PROXY)} \"http://127.0.0.1:3128{endpoint}?wait=60\"; echo",
        f"curl -sS --max-time 10 {' '.join(PROXY)} -w '\\nother=%{{http_code}}\\n' \"http://other.test{endpoint}\"",
    ])
    s = Session(net, tmp_path, script, hold="return")
    (a,) = s.pending()
    s.decide(a, "approve")
    r = s.finish()
    assert f'"id":"{a["id"]}"' in r.stdout and '"status":"approved"' in r.stdout
    assert "other=403" in r.stdout
    (other,) = [x for x in r.records(event="request") if x.get("dst_host") == "other.test"]
    assert other["decision"] == "denied" and other["reason"].startswith("policy: default")


def test_the_wait_endpoint_still_answers_in_origin_form(net, tmp_path):
    script = "curl -sS --noproxy '*' -w '\\n%{http_code}\\n' http://127.0.0.1:3128/.well-known/gatewrap/approvals/ap-aaaaaaaaaaaaaaaaaaaa"
    r = Session(net, tmp_path, script).finish()
    assert '"error":"no such approval in this run"' in r.stdout and r.stdout.strip().endswith("404")


def test_bodies_held_past_the_gates_bound_are_503_and_never_sent(net, tmp_path):
    """[approvals] held_bytes = 1000: one 600-byte body is held; a second while it waits
    would pass the bound: 503 at once, recorded, no approval, nothing sent. The first still
    goes through once approved."""
    big = "a" * 600
    script = (f"{post('/echo?t=cap1', big)} > /tmp/one & sleep 2; {post('/echo?t=cap2', 'b' * 600)} > /tmp/two; "
              "wait; cat /tmp/one /tmp/two")
    s = Session(net, tmp_path, script, extra="\n[approvals]\nheld_bytes = 1000\n")
    (a,) = s.pending()
    assert a["url"].endswith("t=cap1")
    deadline = time.monotonic() + 30
    while not s.audit.exists() or '"status":503' not in s.audit.read_text():
        assert time.monotonic() < deadline, "the second request was not refused"
        time.sleep(0.1)
    assert len(s.store.list()) == 1, "the refused body made no approval"
    s.decide(a, "approve")
    r = s.finish()
    assert "\n503" in r.stdout and "held_bytes" in r.stdout
    assert len(s.upstream("/echo?t=cap1")) == 1 and s.upstream("/echo?t=cap2") == []
    (refused,) = [x for x in r.records(event="request") if x.get("status") == 503]
    assert refused["decision"] == "denied" and refused["reason"].startswith("limit: ") and "held_bytes" in refused["reason"]


def test_two_tunnels_waiting_on_one_approval_open_once(net, tmp_path):
    """Two CONNECTs to the same host:port while one is held share its approval (the same
    digest: CONNECT host:port, no body); one yes opens one tunnel, the other is 409 (at most
    once), never a second tunnel."""
    before = tls_connections(net)
    one, two = get_https(net, "/echo?t=twin1"), get_https(net, "/echo?t=twin2")
    s = Session(net, tmp_path, f"{one} > /tmp/one & {two} > /tmp/two; wait; cat /tmp/one /tmp/two")
    (a,) = s.pending()
    deadline = time.monotonic() + 30
    while s.store.get(a["id"])["waiters"] < 2:
        assert time.monotonic() < deadline, "the second CONNECT did not join the approval"
        time.sleep(0.05)
    assert len(s.store.list()) == 1
    s.decide(s.store.get(a["id"]), "approve")
    r = s.finish()
    assert sorted(line.split()[0] for line in r.stdout.splitlines() if line.startswith("connect=")) \
        == ["connect=200", "connect=409"], r.stdout
    assert tls_connections(net) == before + 1, "one approval, one tunnel"
    recs = r.records(event="connect", approval=a["id"])
    assert sorted(x["status"] for x in recs) == [200, 409]


def test_past_the_run_s_pending_cap_a_request_is_refused_and_recorded_never_held(net, tmp_path):
    """[approvals] max_pending = 1, hold = "return": the first request is held (409); a second,
    different one while it is pending is refused at once (429, a `request` record with reason
    `limit: ...`), asks nothing and sends nothing; the first's retry still joins its approval."""
    script = "; ".join([
        f"{post('/echo?t=cap-a', 'one')} > /tmp/a",
        f"{post('/echo?t=cap-b', 'two')} > /tmp/b",
        f"{post('/echo?t=cap-a', 'one')} > /tmp/a2",
        "cat /tmp/a /tmp/b /tmp/a2",
    ])
    s = Session(net, tmp_path, script, hold="return", extra="\n[approvals]\nmax_pending = 1\n")
    r = s.finish()
    (a,) = s.store.list()
    assert a["url"].endswith("t=cap-a"), "one approval: the refused request made none, the retry joined it"
    assert r.stdout.count("\n409") == 2 and "\n429" in r.stdout and "max_pending = 1" in r.stdout, r.stdout
    assert s.upstream("/echo?t=cap-a") == [] and s.upstream("/echo?t=cap-b") == []
    (refused,) = [x for x in r.records(event="request") if x.get("status") == 429]
    assert refused["decision"] == "denied" and refused["reason"].startswith("limit: run ") and \
        "max_pending = 1" in refused["reason"]
    assert [e["approval"] for e in r.records(event="approval_asked")] == [a["id"]]
