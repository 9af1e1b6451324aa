"""Attack (h-attack): the response mask's hold-back is a timing oracle for a secret's value.

The mask holds back the bytes at the end of what came that are a proper prefix of a masked
form, until more come (mask.rs ``pending_tail``). An upstream the agent controls (here the fake
internet's ``/drip``: the bytes the agent names, a pause, a newline; any allowed host the
agent can serve from does the same) never receives the secret, yet what the agent reads during
the pause says whether the bytes it named begin the value: right guesses come late, wrong
ones at once. Byte by byte (~95 guesses each) the agent learns the value, ASCII case aside
(gate_core tests_oracle.rs recovers it whole). Contract 6: "a secret the gate injects never
exists inside the sandbox"."""

from __future__ import annotations

import json

import pytest

from test_secrets import POLICY, VALUE

pytestmark = pytest.mark.kernel

PAUSE_MS = 1500

# The agent: for each probe, a raw GET through the gate (its http_proxy), and how long until
# the probe's bytes came (before the upstream's pause ends, or after).
AGENT = """
import json, os, socket, sys, time, urllib.parse
proxy = urllib.parse.urlsplit(os.environ.get("http_proxy") or os.environ["HTTP_PROXY"])
for probe in json.loads(sys.argv[1]):
    s = socket.create_connection((proxy.hostname, proxy.port), timeout=20)
    url = f"http://other.allowed.test/drip?data={probe.encode().hex()}&pause=%d"
    s.sendall(f"GET {url} HTTP/1.1\\r\\nHost: other.allowed.test\\r\\nConnection: close\\r\\n\\r\\n".encode())
    start, got = time.monotonic(), b""
    while True:
        head, sep, body = got.partition(b"\\r\\n\\r\\n")
        if sep and len(body) >= len(probe):
            break
        chunk = s.recv(65536)
        if not chunk:
            break
        got += chunk
    print(json.dumps({"probe": probe, "ms": round((time.monotonic() - start) * 1000), "status": got[:12].decode()}), flush=True)
    s.close()
""" % PAUSE_MS


def test_how_soon_the_agents_bytes_come_does_not_say_whether_they_begin_the_secret(gatewrap, net, tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY.replace("PLACE", 'as = "bearer"'))
    extra = ["--policy", str(policy), "--upstream-ca", net.ca_path, "--ca-dir", str(tmp_path / "ca")]
    probes = ["......", VALUE[:6], "......", VALUE[:6].lower(), VALUE[:5] + "!"]
    r = gatewrap(["/usr/bin/python3", "-c", AGENT, json.dumps(probes)], extra=extra, unnamed={"GW_TEST_SECRET": VALUE})
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    assert r.returncode == 0 and len(lines) == len(probes), (r.stderr, lines)
    assert all(x["status"].endswith("200") for x in lines), lines
    # Alike: each came after the pause (held: fewer bytes than the longest form came) or
    # each at once; a bound on the ratio of the two, not a timing assertion.
    late = {x["probe"]: x["ms"] >= PAUSE_MS * 0.8 for x in lines}
    assert len(set(late.values())) == 1, f"some came only after the pause (held): {late}; all: {lines}"
