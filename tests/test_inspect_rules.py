"""Method and path rules on https, through TLS inspection in a real sandbox: a rule allowing
``GET /ok*`` lets those through and the gate answers everything else in the tunnel with its
own 403, which the agent sees (curl and requests). Needs the policy's ``methods``/``path``
keys (``Policy::decide_request``)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.kernel

POLICY = """
[[rule]]
host = "allowed.test"
action = "allow"
inspect = true
methods = ["GET"]
path = "/ok*"
"""


@pytest.fixture
def inspecting(gatewrap, net, tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    extra = ["--policy", str(policy), "--upstream-ca", net.ca_path, "--ca-dir", str(tmp_path / "ca")]
    return lambda argv=None, **kw: gatewrap(argv, extra=extra, **kw)


CASES = [
    ("GET /ok is allowed and reaches the fake internet (which has no /ok: 404)", "GET", "/ok", 404, "allowed"),
    ("GET /okay is allowed by the glob", "GET", "/okay", 404, "allowed"),
    ("POST /ok is denied by the gate with 403", "POST", "/ok", 403, "denied"),
    ("GET /echo is outside the path and denied with 403", "GET", "/echo", 403, "denied"),
]


@pytest.mark.parametrize("case,method,path,status,decision", CASES, ids=[c[0] for c in CASES])
def test_curl_sees_each_inner_request_decided(inspecting, case, method, path, status, decision):
    r = inspecting(["curl", "-sS", "--max-time", "10", "-X", method, "-w", "\n%{http_code}",
                    f"https://allowed.test{path}"])
    assert r.returncode == 0, r.stderr
    body, code = r.stdout.rsplit("\n", 1)
    assert int(code) == status, r.stdout
    if status == 403:
        assert "gatewrap: egress to allowed.test:443 was denied" in body, body
    (rec,) = r.records(event="request", proto="https")
    assert (rec["method"], rec["target"], rec["decision"], rec["status"]) == (
        method, f"https://allowed.test{path}", decision, status)


def test_requests_gets_the_gates_403_for_a_post(inspecting):
    r = inspecting(python="""
        import requests
        ok = requests.get("https://allowed.test/ok", timeout=10)
        no = requests.post("https://allowed.test/ok", data=b"x", timeout=10)
        print(ok.status_code, no.status_code, no.headers.get("x-gatewrap-decision"))
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "404 403 denied\n"
    assert [(x["method"], x["decision"]) for x in r.records(event="request", proto="https")] == [
        ("GET", "allowed"), ("POST", "denied")]
