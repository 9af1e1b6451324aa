#!/usr/bin/env python3
"""Time from a human's approval (the decide() commit) to the held request reaching upstream.

Starts the fake internet (tests/fakenet; root; take the host lock: ``flock
/tmp/gatewrap-kernel.lock``), runs ``gatewrap run --state sqlite:...`` with an agent that
POSTs N times, one after the other, to an ``ask`` rule's host. For each, this script waits
for the pending approval, approves it through ``ApprovalStore.decide`` and takes the
approval's ``decided_at`` (set in the committing transaction, so the figure is an upper
bound); the fake upstream's access log gives the arrival time (``ts``, same clock). Prints
median, p99 and max in ms as JSON and writes bench/results/approval_gate_latency.json.
Bounded: N (default 100) approvals.

Usage: sudo .venv/bin/python bench/approval_gate_latency.py [N]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from fakenet import FakeInternet  # noqa: E402

from gatewrap._gate_core import ApprovalStore  # noqa: E402


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    with tempfile.TemporaryDirectory() as tmp, FakeInternet() as net:
        policy = os.path.join(tmp, "policy.toml")
        with open(policy, "w") as f:
            f.write('[[rule]]\nhost = "allowed.test"\naction = "ask"\n')
        state = f"sqlite:{tmp}/state.db"
        store = ApprovalStore(state)
        agent = f"for i in $(seq {n}); do curl -sS -o /dev/null --max-time 30 -X POST --data x http://allowed.test/echo?i=$i; done"
        cmd = [sys.executable, "-m", "gatewrap", "run", "--audit-log", os.path.join(tmp, "audit.jsonl"),
               "--resolver", net.dns_server, "--public-range", "198.51.100.128/25", "--public-range", "2001:db8:100::/48",
               "--policy", policy, "--state", state, "--workdir", "/tmp", "--ro-bind", net.tmpdir,
               "--", "/bin/sh", "-c", agent]
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        decided: dict[str, float] = {}
        while len(decided) < n and p.poll() is None:
            for a in store.list(status="pending"):
                d = store.decide(a["id"], version=a["version"], digest=a["digest"], verdict="approve", by="bench")
                decided[a["url"].rsplit("?", 1)[1]] = d["decided_at"]
            time.sleep(0.001)
        _, err = p.communicate(timeout=120)
        if p.returncode != 0:
            raise SystemExit(f"gatewrap run failed ({p.returncode}): {err}")
        arrived = {e["path"].rsplit("?", 1)[1]: e["ts"] for e in net.access_entries(server="http", event="request")
                   if e["path"].startswith("/echo?i=")}
    ms = sorted((arrived[k] - t) * 1000 for k, t in decided.items() if k in arrived)
    out = {"approvals": len(ms), "backend": "sqlite", "median_ms": round(statistics.median(ms), 3),
           "p99_ms": round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 3), "max_ms": round(ms[-1], 3)}
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", "approval_gate_latency.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
