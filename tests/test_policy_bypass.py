"""Attacks on the gate's method, path and scheme rules and on the audit log, through a real
sandbox: each case is a request a rule denies that still reaches its server, or a record that
says something other than what the gate did. Each was a confirmed bypass, now fixed; the tests keep
it so."""

from __future__ import annotations

import json

import pytest

from rawproxy import READ_ANSWER

pytestmark = pytest.mark.kernel

#: An agent that sends each case's steps (raw bytes, then how many responses to read) on one
#: connection to the gate and prints one JSON line per case: [status line, body] per response.
RAW_AGENT = r'''
import json, socket, sys
''' + READ_ANSWER + r'''
for case, steps in json.loads(sys.argv[1]):
    out = []
    s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
    try:
        for raw, answers in steps:
            s.sendall(raw.encode("latin-1"))
            out += [[line, body.decode("utf-8", "replace")] for line, body in (answer(s) for _ in range(answers))]
    except OSError as e:
        out.append(["error", repr(e)])
    s.close()
    print(json.dumps([case, out]), flush=True)
'''


def raw_run(gatewrap, tmp_path, policy: str, cases: list) -> tuple[dict, object]:
    p = tmp_path / "policy.toml"
    p.write_text(policy)
    r = gatewrap(["/usr/bin/python3", "-c", RAW_AGENT, json.dumps(cases)], extra=["--policy", str(p)])
    assert r.returncode == 0, r.stderr
    return dict(json.loads(line) for line in r.stdout.splitlines()), r


POST_ECHO = "POST /echo HTTP/1.1\r\nHost: {h}\r\nContent-Length: 4\r\n\r\nmail"


def tunnel_to_80(host: str) -> list:
    """CONNECT host:80, then a plain-http POST /echo inside the tunnel."""
    return [(f"CONNECT {host}:80 HTTP/1.1\r\nHost: {host}:80\r\n\r\n", 1), (POST_ECHO.format(h=host), 1)]


def test_a_deny_rule_with_inspect_denies_post_over_https(gatewrap, tmp_path):
    p = tmp_path / "policy.toml"
    p.write_text('[[rule]]\nhost = "allowed.test"\nmethods = ["POST"]\ninspect = true\naction = "deny"\n')
    r = gatewrap(["curl", "-sS", "--max-time", "10", "-X", "POST", "-d", "mail", "https://allowed.test/echo"],
                 extra=["--policy", str(p)])
    assert '"method": "POST"' not in r.stdout, "the POST a rule denies reached the server: " + r.stdout
    assert f"was denied (rule {p}:rule[1]).\nTo allow it, change that rule in your policy" in r.stdout, r.stdout
    (tunnel,) = r.records(event="connect")
    assert (tunnel["decision"], tunnel["reason"]) == ("allowed", f"policy: rule {p}:rule[1] inspects the tunnel")
    (rec,) = r.records(event="request", proto="https")
    assert (rec["method"], rec["decision"], rec["status"]) == ("POST", "denied", 403), rec


def test_an_http_only_deny_rule_also_holds_for_a_tunnel_to_port_80(gatewrap, tmp_path):
    policy = ('[[rule]]\nhost = "allowed.test"\nmethods = ["POST"]\nschemes = ["http"]\naction = "deny"\n\n'
              '[[rule]]\nhost = "allowed.test"\naction = "allow"\n')
    out, r = raw_run(gatewrap, tmp_path, policy, [
        ("absolute-form POST", [(POST_ECHO.format(h="allowed.test").replace("/echo", "http://allowed.test/echo", 1), 1)]),
        ("POST in a tunnel to port 80", tunnel_to_80("allowed.test")),
    ])
    assert out["absolute-form POST"][0][0] == "HTTP/1.1 403 Forbidden", out
    assert out["POST in a tunnel to port 80"][0][0] != "HTTP/1.1 200 OK", (
        "the plain-http POST the rule denies went through a CONNECT tunnel: " + json.dumps(out))


@pytest.mark.parametrize("path", ["/echo;x", "/echo%3Bx", "/echo;x/deeper"])
def test_a_path_deny_rule_is_not_bypassed_by_a_path_parameter(gatewrap, tmp_path, path):
    policy = ('[[rule]]\nhost = "allowed.test"\npath = "/echo"\naction = "deny"\n\n'
              '[[rule]]\nhost = "allowed.test"\naction = "allow"\n')
    out, r = raw_run(gatewrap, tmp_path, policy, [
        ("plain", [("GET http://allowed.test/echo HTTP/1.1\r\nHost: allowed.test\r\n\r\n", 1)]),
        ("with a parameter", [(f"GET http://allowed.test{path} HTTP/1.1\r\nHost: allowed.test\r\n\r\n", 1)]),
    ])
    assert out["plain"][0][0] == "HTTP/1.1 403 Forbidden", out
    plain, param = r.records(event="request")
    assert param["decision"] == "denied", f"{path} was let past the deny rule for /echo: {param}"


HANG_UP = r'''
import socket, time
s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
s.sendall(b"POST http://allowed.test/delay/1500 HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 4\r\n\r\nmail")
time.sleep(0.7)
s.close()
time.sleep(1.5)
'''


def test_a_request_delivered_upstream_is_not_recorded_as_failed_when_the_agent_hangs_up(gatewrap, net):
    r = gatewrap(["/usr/bin/python3", "-c", HANG_UP], allow=["allowed.test"])
    (rec,) = r.records(event="request")
    assert rec["error"] == "downstream: client disconnected before the response; the request may have reached upstream"
    assert net.access_entries(event="request", method="POST", path="/delay/1500"), "the POST reached the server"
    assert rec["decision"] == "allowed", f"the POST reached the server but the record says {rec['decision']}"
    assert "could not reach" not in r.stderr, r.stderr


def test_a_budget_on_an_inspect_rule_still_limits_https(gatewrap, tmp_path):
    p = tmp_path / "policy.toml"
    p.write_text('[[rule]]\nhost = "allowed.test"\ninspect = true\naction = "allow"\n'
                 'budget = { count = 1, per = "1h" }\n')
    loop = "for i in 1 2 3; do curl -sS -o /dev/null -w '%{http_code}\\n' https://allowed.test/; done"
    r = gatewrap(["/bin/sh", "-c", loop], extra=["--policy", str(p)])
    assert r.stdout.splitlines() != ["200", "200", "200"], "three https fetches under a budget of one"
