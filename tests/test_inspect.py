"""TLS inspection through a real sandbox: an ``inspect = true`` rule makes the gate end the
agent's TLS with a leaf of its own CA, which the agent trusts through the CA variables
gatewrap sets; each request inside is decided and audited on its own; WebSocket is relayed
over http and inspected https; ``Upgrade: h2c`` is refused."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.kernel

CURL = ["curl", "-sS", "--max-time", "10"]
BUNDLE, CA = "/run/gatewrap-shims/ca-bundle.crt", "/run/gatewrap-shims/ca.crt"

POLICY = """
[[rule]]
host = "allowed.test"
ports = [80, 443, 8080, 8443]
action = "allow"
inspect = true
"""

#: The agent's side of RFC 6455: an opening handshake and one masked text message, with
#: Debian's python3 stdlib only. ``how`` is "http" (absolute-form through the gate) or
#: "https" (CONNECT, then TLS trusting SSL_CERT_FILE, i.e. the gate's CA).
WS_CLIENT = r"""
import base64, json, os, socket, ssl, struct, sys

def read_head(s):
    head = b""
    while b"\r\n\r\n" not in head:
        c = s.recv(1)
        if not c:
            break
        head += c
    return head.decode()

def exact(s, n):
    out = b""
    while len(out) < n:
        c = s.recv(n - len(out))
        if not c:
            raise EOFError
        out += c
    return out

def echo(how, host, port, text):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    target = f"http://{host}:{port}/chat"
    if how == "https":
        s.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        assert read_head(s).startswith("HTTP/1.1 200")
        s = ssl.create_default_context().wrap_socket(s, server_hostname=host)
        target = "/chat"
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall((f"GET {target} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
               f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
    head = read_head(s)
    mask = os.urandom(4)
    data = text.encode()
    s.sendall(bytes([0x81, 0x80 | len(data)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))
    b0, b1 = exact(s, 2)
    reply = exact(s, b1 & 0x7F).decode()
    return {"status": head.split("\r\n")[0], "opcode": b0 & 0x0F, "reply": reply}

print(json.dumps([echo("http", "allowed.test", 8080, "hello over ws"),
                  echo("https", "allowed.test", 8443, "hello over wss")]))
"""


@pytest.fixture
def inspecting(gatewrap, net, tmp_path):
    """``gatewrap run`` with POLICY, the fake internet's CA trusted upstream, a CA of the test's own."""
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    extra = ["--policy", str(policy), "--upstream-ca", net.ca_path, "--ca-dir", str(tmp_path / "ca")]

    def _run(argv=None, **kw):
        return gatewrap(argv, extra=[*extra, *kw.pop("extra", [])], **kw)

    return _run


def test_curl_trusts_the_gates_leaf_through_the_ca_variables_and_each_request_is_audited(inspecting):
    r = inspecting(["sh", "-c", "curl -sS --max-time 10 https://allowed.test/ https://allowed.test/echo?x=1"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("hello from allowed.test over https\n"), r.stdout
    echo = json.loads(r.stdout.split("\n", 1)[1])
    assert (echo["path"], echo["scheme"], echo["sni"]) == ("/echo?x=1", "https", "allowed.test")
    (tunnel,) = r.records(event="connect")
    assert (tunnel["decision"], tunnel["dst_host"], tunnel["status"], tunnel["inspected"]) == (
        "allowed", "allowed.test", 200, True)
    (end,) = r.records(event="run_end")
    assert (end["allowed"], end["inspected"]) == (2, 1), end  # the two requests; the tunnel apart
    assert ": 2 allowed, " in r.stderr and ", 1 tunnels TLS-inspected" in r.stderr, r.stderr
    inner = r.records(event="request", proto="https")
    assert [(x["method"], x["target"], x["decision"], x["status"]) for x in inner] == [
        ("GET", "https://allowed.test/", "allowed", 200),
        ("GET", "https://allowed.test/echo?x=1", "allowed", 200),
    ]
    assert all(x["rule"].endswith("policy.toml:rule[1]") for x in inner), inner
    assert inner[0]["dst_ip"] in ("198.51.100.138", "2001:db8:100::10")
    assert "replaced your" in r.stderr and "SSL_CERT_FILE" in r.stderr, r.stderr


def test_an_inspected_request_record_carries_its_bytes_up_and_down_and_its_duration(inspecting):
    # As on plain http (test_gate_requests.py): body bytes each way, the time it took.
    r = inspecting(["sh", "-c", "head -c 1000 /dev/zero | curl -sS --max-time 10 -o /dev/null -w '%{size_download}' "
                    "--data-binary @- https://allowed.test/bytes/5000"])
    assert r.returncode == 0, r.stderr
    assert r.stdout == "5000"
    (rec,) = r.records(event="request", proto="https")
    assert (rec["decision"], rec["status"]) == ("allowed", 200)
    assert (rec["bytes_up"], rec["bytes_down"]) == (1000, 5000)
    assert isinstance(rec["duration_ms"], (int, float)) and rec["duration_ms"] >= 0
    assert "error" not in rec


def test_the_ca_variables_reach_the_agent_and_name_files_it_can_read(inspecting, tmp_path):
    r = inspecting(python="""
        import json, os
        names = ["SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "PIP_CERT", "GIT_SSL_CAINFO",
                 "AWS_CA_BUNDLE", "CARGO_HTTP_CAINFO", "NODE_EXTRA_CA_CERTS", "DENO_CERT"]
        env = {n: os.environ.get(n) for n in names}
        files = {p: open(p).read().count("BEGIN CERTIFICATE") for p in set(env.values()) if p}
        print(json.dumps({"env": env, "files": files, "ca": open(env["NODE_EXTRA_CA_CERTS"]).read(),
                          "bundle_end": open(env["SSL_CERT_FILE"]).read()[-2000:]}))
    """)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["env"] == {"SSL_CERT_FILE": BUNDLE, "REQUESTS_CA_BUNDLE": BUNDLE, "CURL_CA_BUNDLE": BUNDLE,
                          "PIP_CERT": BUNDLE, "GIT_SSL_CAINFO": BUNDLE, "AWS_CA_BUNDLE": BUNDLE,
                          "CARGO_HTTP_CAINFO": BUNDLE, "NODE_EXTRA_CA_CERTS": CA, "DENO_CERT": CA}
    assert out["files"][CA] == 1, "the CA file is the gate's CA alone"
    assert out["files"][BUNDLE] > 1, "the bundle is the system roots and the gate's CA"
    gate_ca = (tmp_path / "ca" / "ca.crt").read_text()
    assert out["ca"] == gate_ca and out["bundle_end"].endswith(gate_ca), "the run's CA is the --ca-dir one"
    # Said once, naming each replaced variable of the user's (the fixture sets three).
    line = next(x for x in r.stderr.splitlines() if "replaced your" in x)
    for name in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        assert line.count(name) == 1, line


def test_python_requests_through_inspection(inspecting):
    r = inspecting(python="""
        import requests
        r = requests.post("https://allowed.test/echo", data=b"ping", timeout=10)
        print(r.status_code, r.json()["method"], r.json()["body"])
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "200 POST ping\n"
    (rec,) = r.records(event="request", proto="https")
    assert (rec["method"], rec["target"], rec["status"]) == ("POST", "https://allowed.test/echo", 200)


def test_a_websocket_is_relayed_over_http_and_over_inspected_https(inspecting, net):
    r = inspecting(python=WS_CLIENT)
    assert r.returncode == 0, r.stderr
    ws, wss = json.loads(r.stdout)
    assert ws == {"status": "HTTP/1.1 101 Switching Protocols", "opcode": 1, "reply": "hello over ws"}
    assert wss == {"status": "HTTP/1.1 101 Switching Protocols", "opcode": 1, "reply": "hello over wss"}
    recs = [(x["proto"], x["target"], x["status"]) for x in r.records(event="request")]
    assert recs == [("http", "http://allowed.test:8080/chat", 101), ("https", "https://allowed.test:8443/chat", 101)]
    with open(net.ws_log) as f:
        seen = [json.loads(x) for x in f]
    mine = [x for x in seen if x["path"] == "/chat"][-2:]
    assert [x["server"] for x in mine] == ["ws", "wss"]
    assert all(x["headers"]["sec-websocket-version"] == "13" for x in mine), mine


@pytest.mark.parametrize("how", ["http", "https"], ids=["Upgrade: h2c on a plain http request is refused with 400",
                                                         "Upgrade: h2c inside an inspected tunnel is refused with 400"])
def test_h2c_is_refused(inspecting, how):
    r = inspecting(python=f"""
        import socket, ssl
        s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
        target = "http://allowed.test/"
        if {how!r} == "https":
            s.sendall(b"CONNECT allowed.test:443 HTTP/1.1\\r\\nHost: allowed.test:443\\r\\n\\r\\n")
            s.recv(1024)
            s = ssl.create_default_context().wrap_socket(s, server_hostname="allowed.test")
            target = "/"
        s.sendall(f"GET {{target}} HTTP/1.1\\r\\nHost: allowed.test\\r\\nConnection: Upgrade, HTTP2-Settings\\r\\n"
                  "Upgrade: h2c\\r\\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\\r\\n\\r\\n".encode())
        print(s.recv(4096).decode())
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("HTTP/1.1 400"), r.stdout
    assert "Upgrade: h2c is refused" in r.stdout
    (rec,) = r.records(event="request")
    assert (rec["proto"], rec["decision"], rec["reason"]) == (how, "denied", "protocol: Upgrade: h2c is refused")
