#!/usr/bin/env python3
"""Latency of https requests through the gate, plain CONNECT tunnel vs TLS inspection.

Starts the fake internet (tests/fakenet; root, one at a time on a host: take the lock
``flock /tmp/gwt-kernel.lock``), then runs ``gatewrap run`` twice with an agent that makes N
sequential GETs of ``https://allowed.test/`` on one kept-alive connection (requests.Session)
and one fresh connection per request, timed inside the agent. Prints one JSON object and
writes it to bench/results/inspect_latency.json. Bounded: N requests per mode (default 200).

Usage: sudo .venv/bin/python bench/inspect_latency.py [N]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from fakenet import FakeInternet  # noqa: E402

AGENT = textwrap.dedent("""
    import json, statistics, sys, time, requests
    n = int(sys.argv[1])
    def timed(get):
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            r = get("https://allowed.test/", timeout=10)
            assert r.status_code == 200, r.status_code
            out.append((time.perf_counter() - t0) * 1000)
        return out
    s = requests.Session()
    kept = timed(s.get)
    fresh = timed(lambda url, timeout: requests.get(url, timeout=timeout, headers={"Connection": "close"}))
    q = lambda xs: {"first_ms": round(xs[0], 3), "median_ms": round(statistics.median(xs[1:]), 3),
                    "p90_ms": round(sorted(xs[1:])[int(0.9 * (len(xs) - 1))], 3)}
    print(json.dumps({"kept_alive": q(kept), "new_connection": q(fresh)}))
""")


def run(net: FakeInternet, policy: str, n: int, tmp: str) -> dict:
    path = os.path.join(tmp, f"policy-{len(os.listdir(tmp))}.toml")
    with open(path, "w") as f:
        f.write(policy)
    cmd = [sys.executable, "-m", "gatewrap", "run", "--own", "--audit-log", os.path.join(tmp, "audit.jsonl"),
           "--resolver", net.dns_server, "--public-range", "198.51.100.128/25", "--public-range", "2001:db8:100::/48",
           "--policy", path, "--upstream-ca", net.ca_path, "--ca-dir", os.path.join(tmp, "ca"),
           "--workdir", "/tmp", "--ro-bind", net.tmpdir, "--", "/usr/bin/python3", "-c", AGENT, str(n)]
    env = dict(os.environ, SSL_CERT_FILE=net.ca_path, REQUESTS_CA_BUNDLE=net.ca_path)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    if p.returncode != 0:
        raise SystemExit(f"gatewrap run failed ({p.returncode}): {p.stderr}")
    return json.loads(p.stdout)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    rule = '[[rule]]\nhost = "allowed.test"\naction = "allow"\n'
    with tempfile.TemporaryDirectory() as tmp, FakeInternet() as net:
        out = {"requests_per_mode": n,
               "plain_tunnel": run(net, rule, n, tmp),
               "inspected": run(net, rule + "inspect = true\n", n, tmp)}
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", "inspect_latency.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
