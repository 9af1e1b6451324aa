#!/usr/bin/env python3
"""Cost of a secret's injection per request: the same inspected https rule with and without
``inject = { secret, as = "bearer" }`` (issue 20): ``inspected`` (no secret; the agent sends
``Bearer none``), ``injected`` (the agent sends ``Bearer none``, the gate replaces it) and
``placeholder`` (the agent sends its per-run placeholder, which the gate swaps).

Starts the fake internet (tests/fakenet; root, one at a time on a host: it waits for the
host's fake-internet lock, ``fakenet.host_lock``), then runs ``gatewrap run --own`` (the gate
in that process, not a shared daemon another worktree may have started) for each variant,
ROUNDS times in alternation (A B C A B C: the machine is shared, alternation spreads its noise
over all), with an agent that makes N sequential GETs of ``https://allowed.test/`` on one
kept-alive connection (requests.Session), timed inside the agent (p50, p99 in µs), and the
gatewrap process's CPU (user + system, proc(5) ``stat``) from the agent's first request to its
last, per request. Prints one JSON object (medians over the rounds, and each round's figures) and writes it to
bench/results/secret_inject_cost.json.

The fake upstream must set TCP_NODELAY (tests/fakenet/servers.py ``nodelay``): without it its
two response writes met the gate's delayed ACK and every request took ~44 ms.

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
    s.get("https://allowed.test/", headers=h, timeout=10)  # connect + handshake, untimed
    print("go", flush=True)
    time.sleep(0.3)  # the parent reads the gate's CPU now
    for _ in range(n):
        t0 = time.perf_counter()
        r = s.get("https://allowed.test/", headers=h, timeout=10)
        assert r.status_code == 200, r.status_code
        out.append((time.perf_counter() - t0) * 1e6)
    xs = sorted(out)
    print(json.dumps({"p50_us": statistics.median(xs), "p99_us": xs[int(0.99 * (len(xs) - 1))]}), flush=True)
    time.sleep(0.3)
""")

RULE = '[[rule]]\nhost = "allowed.test"\naction = "allow"\ninspect = true\n'
SECRET = '[[secret]]\nname = "bench"\nfrom_env = "BENCH_SECRET"\nplaceholder_env = "BENCH_TOKEN"\n\n'
INJECT = 'inject = { secret = "bench", as = "bearer" }\n'
VARIANTS = {"inspected": RULE,
            "injected": SECRET.replace('placeholder_env = "BENCH_TOKEN"\n', "") + RULE + INJECT,
            "placeholder": SECRET + RULE + INJECT}


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid``, all its threads (proc(5) stat fields 14, 15)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    lines = iter(p.stdout.readline, "")
    go = next(lines, "")
    c0 = cpu_s(p.pid) if go.strip() == "go" else None
    got = next(lines, "")
    c1 = cpu_s(p.pid) if c0 is not None and got.startswith("{") else None
    rest = p.stdout.read()
    err = p.stderr.read()
    if p.wait(timeout=600) != 0 or c1 is None:
        raise SystemExit(f"gatewrap run failed ({p.returncode}): {go}{got}{rest}{err}")
    return {**json.loads(got), "gate_cpu_us": (c1 - c0) / n * 1e6}


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    got: dict[str, list[dict]] = {k: [] for k in VARIANTS}
    _lock = hold_host_lock("bench/secret_inject_cost.py")  # noqa: F841 - held for this process's life
    with tempfile.TemporaryDirectory() as tmp, FakeInternet() as net:
        for _ in range(rounds):
            for name, policy in VARIANTS.items():
                got[name].append(run(net, policy, n, tmp))
    out = {"requests_per_run": n, "rounds": rounds,
           "uptime": open("/proc/loadavg").read().split()[:3],
           **{k: {m: round(statistics.median(r[m] for r in v), 1) for m in ("p50_us", "p99_us", "gate_cpu_us")}
              for k, v in got.items()}}
    out["per_round"] = {k: [{m: round(r[m], 1) for m in r} for r in v] for k, v in got.items()}
    for k in ("injected", "placeholder"):
        out[f"{k}_minus_inspected"] = {m: round(out[k][m] - out["inspected"][m], 1) for m in ("p50_us", "gate_cpu_us")}
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", "secret_inject_cost.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
