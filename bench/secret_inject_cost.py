#!/usr/bin/env python3
"""Cost of a secret's injection per request: the same inspected https rule with and without
``inject = { secret, as = "bearer" }`` (issue 20), the agent sending the placeholder each time.

Starts the fake internet (tests/fakenet; root, one at a time on a host: it waits for the
host's fake-internet lock, ``fakenet.host_lock``), then runs ``gatewrap run`` for each variant, ROUNDS times in
alternation (the machine is shared: alternation spreads its noise over both), with an agent
that makes N sequential GETs of ``https://allowed.test/`` on one kept-alive connection
(requests.Session), timed inside the agent. Prints one JSON object (medians of the rounds'
medians and p90s) and writes it to bench/results/secret_inject_cost.json.

Usage: sudo .venv/bin/python bench/secret_inject_cost.py [N] [ROUNDS]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from fakenet import FakeInternet  # noqa: E402
from fakenet.host_lock import hold_host_lock  # noqa: E402

AGENT = textwrap.dedent("""
    import json, os, statistics, sys, time, requests
    n = int(sys.argv[1])
    s = requests.Session()
    h = {"Authorization": "Bearer " + os.environ.get("BENCH_TOKEN", "none")}
    out = []
    for _ in range(n + 1):
        t0 = time.perf_counter()
        r = s.get("https://allowed.test/", headers=h, timeout=10)
        assert r.status_code == 200, r.status_code
        out.append((time.perf_counter() - t0) * 1e6)
    xs = sorted(out[1:])
    print(json.dumps({"median_us": statistics.median(xs), "p90_us": xs[int(0.9 * (len(xs) - 1))]}))
""")

RULE = '[[rule]]\nhost = "allowed.test"\naction = "allow"\ninspect = true\n'
SECRET = '[[secret]]\nname = "bench"\nfrom_env = "BENCH_SECRET"\nplaceholder_env = "BENCH_TOKEN"\n\n'
VARIANTS = {"inspected": RULE, "inspected_and_injected": SECRET + RULE + 'inject = { secret = "bench", as = "bearer" }\n'}


def run(net: FakeInternet, policy: str, n: int, tmp: str) -> dict:
    path = os.path.join(tmp, f"policy-{len(os.listdir(tmp))}.toml")
    with open(path, "w") as f:
        f.write(policy)
    cmd = [sys.executable, "-m", "gatewrap", "run", "--own", "--audit-log", os.path.join(tmp, "audit.jsonl"),
           "--resolver", net.dns_server, "--public-range", "198.51.100.128/25", "--public-range", "2001:db8:100::/48",
           "--policy", path, "--upstream-ca", net.ca_path, "--ca-dir", os.path.join(tmp, "ca"),
           "--env", "REQUESTS_CA_BUNDLE", "--workdir", "/tmp", "--ro-bind", net.tmpdir,
           "--", "/usr/bin/python3", "-c", AGENT, str(n)]
    env = dict(os.environ, REQUESTS_CA_BUNDLE=net.ca_path, BENCH_SECRET="ghp_bench0123456789abcdefghijklmnopqrstu")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    if p.returncode != 0:
        raise SystemExit(f"gatewrap run failed ({p.returncode}): {p.stderr}")
    return json.loads(p.stdout)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    got: dict[str, list[dict]] = {k: [] for k in VARIANTS}
    _lock = hold_host_lock("bench/secret_inject_cost.py")  # noqa: F841 - held for this process's life
    with tempfile.TemporaryDirectory() as tmp, FakeInternet() as net:
        for _ in range(rounds):
            for name, policy in VARIANTS.items():
                got[name].append(run(net, policy, n, tmp))
    out = {"requests_per_run": n, "rounds": rounds,
           **{k: {m: round(statistics.median(r[m] for r in v), 1) for m in ("median_us", "p90_us")} for k, v in got.items()}}
    out["injection_cost_median_us"] = round(out["inspected_and_injected"]["median_us"] - out["inspected"]["median_us"], 1)
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", "secret_inject_cost.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
