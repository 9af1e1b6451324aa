"""Breakpoints through a real sandbox and gate: an ``ask`` rule holds the agent's request
until a decision is made in the approvals store (here by the test, through
``ApprovalStore``, as the CLI and the review page do); the fake internet's access log says
what reached upstream and when."""

from __future__ import annotations

import os
import shlex
import subprocess
import time

import pytest

from conftest import AGENT_UID, PUBLIC_RANGES, Run, gatewrap_cmd
from gatewrap._gate_core import ApprovalStore, StaleDecision

pytestmark = pytest.mark.kernel

POLICY = """\
[[rule]]
host = "allowed.test"
action = "ask"
timeout = "{timeout}"
hold = "{hold}"
"""


class Session:
    """One ``gatewrap run --state`` started in the background."""

    def __init__(self, net, tmp_path, script: str, *, timeout="60s", hold="wait", extra=""):
        self.net = net
        policy = tmp_path / "policy.toml"
        policy.write_text(POLICY.format(timeout=timeout, hold=hold) + extra)
        self.state = f"sqlite:{tmp_path / 'state.db'}"
        self.store = ApprovalStore(self.state)
        self.audit = tmp_path / "audit.jsonl"
        cmd = gatewrap_cmd("run", "--audit-log", str(self.audit), "--resolver", net.dns_server,
                           "--workdir", "/tmp", "--ro-bind", net.tmpdir, *PUBLIC_RANGES,
                           "--policy", str(policy), "--state", self.state, "--", "/bin/sh", "-c", script)
        env = dict(os.environ, SUDO_UID=str(AGENT_UID), SUDO_GID=str(AGENT_UID))
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    def pending(self, n=1, wait=30.0) -> list[dict]:
        """The first ``n`` pending approvals, oldest first, once there are that many."""
        end = time.monotonic() + wait
        while time.monotonic() < end:
            got = self.store.list(status="pending")
            if len(got) >= n:
                return sorted(got, key=lambda a: a["created"])
            assert self.proc.poll() is None, self.proc.communicate()
            time.sleep(0.05)
        raise AssertionError(f"no {n} pending approvals; run: {self.finish(kill=True)}")

    def decide(self, a: dict, verdict: str, **kw) -> dict:
        return self.store.decide(a["id"], version=a["version"], digest=a["digest"], verdict=verdict, by="tester", **kw)

    def finish(self, kill=False) -> Run:
        if kill:
            self.proc.kill()
        out, err = self.proc.communicate(timeout=90)
        return Run(self.proc.returncode, out, err, self.audit)

    def upstream(self, path: str) -> list[dict]:
        return self.net.access_entries(server="http", event="request", path=path)


#: Shell steps of a hold = "return" agent: the approval id from the 409's headers (saved with
#: ``curl -D /tmp/h``), then the wait on the gate's own endpoint until it is answered.
ID_OF_THE_409 = "id=$(sed -n 's/^gatewrap-approval: *//Ip' /tmp/h | tr -d '\\r')"
WAIT = "curl -sS --noproxy '*' --max-time 70 http://127.0.0.1:3128/.well-known/gatewrap/approvals/$id?wait=60"


def post(path: str, data: str, *extra: str) -> str:
    return shlex.join(["curl", "-sS", "--max-time", "60", "-w", "\\n%{http_code}\\n", "-X", "POST",
                       "--data", data, *extra, f"http://allowed.test{path}"])


def events(run: Run, name: str) -> list[dict]:
    return run.records(event=name)


def test_approve_sends_once_after_the_decision(net, tmp_path):
    s = Session(net, tmp_path, post("/echo?t=approve", "hello-approve", "-H", "Authorization: Bearer s3cret"))
    (a,) = s.pending()
    assert a["method"] == "POST" and a["url"] == "http://allowed.test/echo?t=approve"
    assert a["body"] == b"hello-approve"
    assert ["authorization", "[redacted]"] in a["headers"], "credentials never reach the store"
    time.sleep(0.5)
    assert s.upstream("/echo?t=approve") == [], "nothing reaches upstream before a yes"
    s.decide(a, "approve")
    r = s.finish()
    assert r.returncode == 0, r.stderr
    assert "hello-approve" in r.stdout and "Bearer s3cret" in r.stdout, "the original credentials are sent"
    assert r.stdout.strip().endswith("200")
    assert len(s.upstream("/echo?t=approve")) == 1
    assert f"gatewrap: approval {a['id']} (digest {a['digest'][:12]}): POST http://allowed.test/echo?t=approve" \
        in r.stderr, "the notice names the digest's first characters: a line forged for this id cannot match"
    assert [e["approval"] for e in events(r, "approval_asked")] == [a["id"]]
    assert events(r, "approval_approved")[0]["by"] == "tester"
    assert events(r, "approval_sent")[0]["status"] == 200
    (req,) = r.records(event="request", approval=a["id"])
    assert req["decision"] == "allowed" and req["reason"].startswith(f"ask: approval {a['id']} approved")
    assert s.store.get(a["id"])["status"] == "sent"
    with pytest.raises(StaleDecision) as e:
        s.decide(a, "reject")
    assert e.value.why in ("decided", "run ended")


def test_a_decision_reaches_the_held_request_by_its_wake_up_not_by_the_store_re_read(net, tmp_path):
    # The held request re-reads the store once an hour and may wait ten minutes: only the
    # decision's wake-up (the run's control socket, read on the gate's runtime) lets it
    # through within curl's 60 s bound.
    s = Session(net, tmp_path, post("/echo?t=woken", "hello-woken"), timeout="10m",
                extra='\n[approvals]\nreread = "1h"\n')
    (a,) = s.pending()
    time.sleep(0.5)  # past the hold's first read of the store: from now on it waits
    assert s.upstream("/echo?t=woken") == []
    s.decide(a, "approve")
    r = s.finish()
    assert r.returncode == 0, r.stderr
    assert "hello-woken" in r.stdout and r.stdout.strip().endswith("200")
    assert len(s.upstream("/echo?t=woken")) == 1
    assert [e["approval"] for e in events(r, "approval_sent")] == [a["id"]]


def test_reject_answers_403_with_the_reason_and_sends_nothing(net, tmp_path):
    s = Session(net, tmp_path, post("/echo?t=reject", "x"))
    (a,) = s.pending()
    s.decide(a, "reject", reason="not to customers")
    r = s.finish()
    assert "not to customers" in r.stdout and r.stdout.strip().endswith("403")
    assert s.upstream("/echo?t=reject") == []
    assert events(r, "approval_rejected")[0]["reason"] == "not to customers"


def test_edit_sends_the_edited_body(net, tmp_path):
    s = Session(net, tmp_path, post("/echo?t=edit", "to=all@customers"))
    (a,) = s.pending()
    e = s.store.edit(a["id"], version=a["version"], digest=a["digest"], by="tester",
                     headers=[tuple(h) for h in a["headers"]], body=b"to=me@test")
    with pytest.raises(StaleDecision) as st:
        s.decide(a, "approve")
    assert st.value.why == "edited"
    s.decide(e, "approve")
    r = s.finish()
    assert "to=me@test" in r.stdout and "all@customers" not in r.stdout
    assert r.stdout.strip().endswith("200")
    assert events(r, "approval_edited") and events(r, "approval_sent")


def test_timeout_is_a_denial(net, tmp_path):
    s = Session(net, tmp_path, post("/echo?t=timeout", "x"), timeout="2s")
    r = s.finish()
    assert "a timeout is never a yes" in r.stdout and r.stdout.strip().endswith("403")
    assert s.upstream("/echo?t=timeout") == []
    (a,) = s.store.list()
    assert a["status"] == "expired"
    assert events(r, "approval_expired")[0]["approval"] == a["id"]


def test_concurrent_asks_are_answered_independently(net, tmp_path):
    script = f"{post('/echo?t=one', 'one')} > /tmp/one & {post('/echo?t=two', 'two')} > /tmp/two & wait; cat /tmp/one /tmp/two"
    s = Session(net, tmp_path, script)
    a, b = s.pending(2)
    first = a if a["url"].endswith("t=one") else b
    second = b if first is a else a
    s.decide(first, "approve")
    time.sleep(1.0)
    assert len(s.upstream("/echo?t=one")) == 1
    assert s.upstream("/echo?t=two") == [], "approving one never releases the other"
    s.decide(second, "reject", reason="no")
    r = s.finish()
    assert s.upstream("/echo?t=two") == []
    assert "\n200" in r.stdout and "\n403" in r.stdout


def test_identical_requests_share_one_approval_and_go_once(net, tmp_path):
    script = f"{post('/echo?t=dup', 'same')} > /tmp/a & {post('/echo?t=dup', 'same')} > /tmp/b & wait; cat /tmp/a /tmp/b"
    s = Session(net, tmp_path, script)
    (a,) = s.pending()
    end = time.monotonic() + 20
    while s.store.get(a["id"])["waiters"] < 2 and time.monotonic() < end:
        time.sleep(0.05)
    assert s.store.get(a["id"])["waiters"] == 2
    assert len(s.store.list()) == 1
    s.decide(a, "approve")
    r = s.finish()
    assert len(s.upstream("/echo?t=dup")) == 1, "at most once"
    assert "already sent once (at most once)" in r.stdout


def test_a_grant_lets_matching_requests_through_and_nothing_else(net, tmp_path):
    script = "; ".join([
        post("/echo/a", "first"),
        post("/echo/b", "second"),  # the grant
        shlex.join(["curl", "-sS", "--max-time", "30", "-w", "\\n%{http_code}\\n", "http://allowed.test/echo/c"]),  # GET: asks
        post("/other", "third"),  # another path: asks
    ])
    s = Session(net, tmp_path, script, timeout="4s")
    (a,) = s.pending()
    s.decide(a, "approve", grant={"method": "POST", "host": "allowed.test", "path_prefix": "/echo", "seconds": 60})
    r = s.finish()
    assert len(s.upstream("/echo/a")) == 1 and len(s.upstream("/echo/b")) == 1
    assert s.upstream("/echo/c") == [] and s.upstream("/other") == []
    (g,) = s.store.grants(active=False)
    assert g["uses"] == 1
    (by_grant,) = [x for x in r.records(event="request") if x.get("grant")]
    assert by_grant["reason"] == f"grant: {g['id']}" and by_grant["decision"] == "allowed"
    assert sorted(x["status"] for x in s.store.list()) == ["expired", "expired", "sent"]


def test_an_expired_grant_lets_nothing_through(net, tmp_path):
    script = f"{post('/echo/x', 'first')}; sleep 2; {post('/echo/y', 'second')}"
    s = Session(net, tmp_path, script, timeout="4s")
    (a,) = s.pending()
    s.decide(a, "approve", grant={"method": "POST", "host": "allowed.test", "path_prefix": "/echo", "seconds": 1})
    r = s.finish()
    assert len(s.upstream("/echo/x")) == 1 and s.upstream("/echo/y") == []
    assert r.stdout.strip().endswith("403")


def test_hold_return_answers_409_and_the_retry_goes_through_once(net, tmp_path):
    script = "; ".join([
        f"{post('/echo?t=ret', 'later', '-D', '/tmp/h')} > /tmp/first",
        ID_OF_THE_409,
        f"{WAIT}; echo",
        post("/echo?t=ret", "later"),
        post("/echo?t=ret", "later"),
        "cat /tmp/first",
    ])
    s = Session(net, tmp_path, script, hold="return")
    (a,) = s.pending()
    assert a["hold"] == "return"
    time.sleep(0.5)
    s.decide(a, "approve")
    r = s.finish()
    assert len(s.upstream("/echo?t=ret")) == 1
    assert f'"id":"{a["id"]}"' in r.stdout and '"status":"approved"' in r.stdout, "the wait endpoint tells the status"
    assert "\n409" in r.stdout and "\n200" in r.stdout and "already sent once" in r.stdout
    # The gate's own counts, as `audit stats` counts them: the first 409 held (it waited for
    # the approval), the retry allowed, the one after it denied (sent once already).
    (end,) = events(r, "run_end")
    assert (end["allowed"], end["denied"], end["held"]) == (1, 1, 1), end
    assert ": 1 allowed, 1 denied by the gate, 1 held (409, waiting for approval), " in r.stderr, r.stderr


def test_hold_return_after_an_edit_and_a_grant_sends_the_edited_request(net, tmp_path):
    """The retry joins its approval before any grant is looked at: the grant made with the
    yes must not carry the agent's unedited request past the human's edit (found by the
    new-user trial)."""
    script = "; ".join([
        f"{post('/echo?t=eg', 'to=all@customers', '-D', '/tmp/h')} > /tmp/first",
        ID_OF_THE_409,
        f"{WAIT}; echo",
        post("/echo?t=eg", "to=all@customers"),
    ])
    s = Session(net, tmp_path, script, hold="return")
    (a,) = s.pending()
    e = s.store.edit(a["id"], version=a["version"], digest=a["digest"], by="tester",
                     headers=[tuple(h) for h in a["headers"]], body=b"to=me@test")
    s.decide(e, "approve", grant={"method": "POST", "host": "allowed.test", "path_prefix": "/echo", "seconds": 60})
    r = s.finish()
    assert len(s.upstream("/echo?t=eg")) == 1
    assert "to=me@test" in r.stdout and "all@customers" not in r.stdout, r.stdout
    assert events(r, "approval_sent") and not [x for x in r.records(event="request") if x.get("grant")]


def test_the_wait_endpoint_knows_only_this_runs_approvals(net, tmp_path):
    script = "curl -sS --noproxy '*' -w '\\n%{http_code}\\n' http://127.0.0.1:3128/.well-known/gatewrap/approvals/ap-aaaaaaaaaaaaaaaaaaaa"
    s = Session(net, tmp_path, script)
    r = s.finish()
    assert r.stdout.strip().endswith("404")


def test_an_approval_is_never_sent_with_another_body_under_its_idempotency_key(net, tmp_path):
    """The human approves the body they saw; a retry under the same Idempotency-Key with
    another body is another request (a new approval), never sent under the first one."""
    key = ("-H", "Idempotency-Key: k-swap")
    script = "; ".join([
        f"{post('/echo?t=swap', 'to=pricing-team', '-D', '/tmp/h', *key)} > /tmp/first",
        ID_OF_THE_409,
        f"{WAIT}; echo",
        post("/echo?t=swap", "to=all-customers", *key),
    ])
    s = Session(net, tmp_path, script, hold="return")
    (a,) = s.pending()
    assert a["body"] == b"to=pricing-team"
    s.decide(a, "approve")
    r = s.finish()
    assert s.upstream("/echo?t=swap") == [], "nothing the human did not see is sent"
    assert "all-customers" not in r.stdout and r.stdout.strip().endswith("409")
    swapped = [x for x in s.store.list() if x["id"] != a["id"]]
    assert [x["body"] for x in swapped] == [b"to=all-customers"], "the other body waits for its own approval"


def test_a_retry_with_other_headers_is_sent_with_the_headers_the_human_saw(net, tmp_path):
    key = ("-H", "Idempotency-Key: k-hdr")
    script = "; ".join([
        f"{post('/echo?t=hdr', 'same', '-D', '/tmp/h', *key)} > /tmp/first",
        ID_OF_THE_409,
        f"{WAIT}; echo",
        post("/echo?t=hdr", "same", *key, "-H", "X-HTTP-Method-Override: DELETE"),
    ])
    s = Session(net, tmp_path, script, hold="return")
    (a,) = s.pending()
    s.decide(a, "approve")
    r = s.finish()
    assert len(s.upstream("/echo?t=hdr")) == 1 and r.stdout.strip().endswith("200")
    assert "method-override" not in r.stdout.lower(), "a header the human never saw is not sent"
