#!/usr/bin/env python3
"""Time from a human's approval (the decide() commit) to the held request reaching upstream.

Starts the fake internet (tests/fakenet; root; take the host lock: ``flock
/tmp/gatewrap-kernel.lock``), runs ``gatewrap run --state sqlite:...`` with an agent that
POSTs N times, one after the other, to an ``ask`` rule's host. For each, this script waits
for the pending approval, approves it through ``ApprovalStore.decide`` and takes the
approval's ``decided_at`` (set in the committing transaction, so the figure is an upper
bound); the fake upstream's access log gives the arrival time (``ts``, same clock: written
once the Python server has parsed the request). Prints median, p99 and max in ms as JSON and
writes bench/results/approval_gate_latency.json, with the split of the median and p99 into
stages (ms): ``wake`` (the commit to the gate's ``approval_approved`` record: wake-up, store
read and claim, one audit write), ``admit`` (to the ``admit`` record), ``upstream`` (to the
arrival: the SSRF guard's DNS lookup, the kept connection, the fake upstream's parse).

The fake DNS answers with TTL ``--ttl`` (default 0, the fake internet's: every request is
resolved again, as the SSRF guard does for a name that may not be cached; a real API's
TTL of 60 s or more lets the resolver's cache answer instead). Bounded: N approvals.

Usage: sudo .venv/bin/python bench/approval_gate_latency.py [-n N] [--ttl SECONDS]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from fakenet import FakeInternet, cleanup_leftovers  # noqa: E402

from gatewrap._gate_core import ApprovalStore  # noqa: E402


def pick(ms: list[float], q: float) -> float:
    """The q-quantile of sorted ``ms`` (nearest rank below), rounded to µs."""
    return round(ms[min(len(ms) - 1, int(q * len(ms)))], 3)


def key(url: str) -> str:
    return url.rsplit("?", 1)[1]


def stamp(rfc3339: str) -> float:
    return datetime.datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=100, help="approvals to time (default 100)")
    ap.add_argument("--ttl", type=int, default=0, help="TTL of the fake DNS's answers, seconds (default 0)")
    ap.add_argument("legacy_n", nargs="?", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    n = args.legacy_n or args.n
    cleanup_leftovers()  # what a dead fake internet left (a live one is left alone), as the tests do
    with tempfile.TemporaryDirectory() as tmp, FakeInternet(ttl=args.ttl) as net:
        policy = os.path.join(tmp, "policy.toml")
        with open(policy, "w") as f:
            f.write('[[rule]]\nhost = "allowed.test"\naction = "ask"\n')
        state = f"sqlite:{tmp}/state.db"
        store = ApprovalStore(state)
        audit = os.path.join(tmp, "audit.jsonl")
        agent = f"for i in $(seq {n}); do curl -sS -o /dev/null --max-time 30 -X POST --data x http://allowed.test/echo?i=$i; done"
        cmd = [sys.executable, "-m", "gatewrap", "run", "--own", "--audit-log", audit,
               "--resolver", net.dns_server, "--public-range", "198.51.100.128/25", "--public-range", "2001:db8:100::/48",
               "--policy", policy, "--state", state, "--workdir", "/tmp", "--ro-bind", net.tmpdir,
               "--", "/bin/sh", "-c", agent]
        # stderr to a file, not a pipe: a line per approval (the gate's notice) would fill a
        # pipe no one reads before the end (~140 approvals), and the run would stall on it.
        errors = open(os.path.join(tmp, "stderr"), "w+")
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=errors, text=True, cwd=ROOT)
        decided: dict[str, float] = {}
        while len(decided) < n and p.poll() is None:
            for a in store.list(status="pending"):
                d = store.decide(a["id"], version=a["version"], digest=a["digest"], verdict="approve", by="bench")
                decided[key(a["url"])] = d["decided_at"]
            time.sleep(0.001)
        p.wait(timeout=120)
        if p.returncode != 0:
            errors.seek(0)
            raise SystemExit(f"gatewrap run failed ({p.returncode}): {errors.read()[-4000:]}")
        arrived = {key(e["path"]): e["ts"] for e in net.access_entries(server="http", event="request")
                   if e["path"].startswith("/echo?i=")}
        approved: dict[str, float] = {}
        admitted: dict[str, float] = {}
        with open(audit) as f:
            for r in map(json.loads, f):
                if r.get("event") == "approval_approved":
                    approved[key(r["url"])] = stamp(r["time"])
                elif r.get("event") == "admit" and "/echo?i=" in (r.get("target") or ""):
                    admitted[key(r["target"])] = stamp(r["time"])
    done = [k for k in decided if k in arrived and k in approved and k in admitted]
    ms = sorted((arrived[k] - decided[k]) * 1000 for k in done)
    stages = {
        "wake": sorted((approved[k] - decided[k]) * 1000 for k in done),
        "admit": sorted((admitted[k] - approved[k]) * 1000 for k in done),
        "upstream": sorted((arrived[k] - admitted[k]) * 1000 for k in done),
    }
    out = {"approvals": len(ms), "backend": "sqlite", "dns_ttl": args.ttl, "median_ms": pick(ms, 0.5),
           "p99_ms": pick(ms, 0.99), "max_ms": round(ms[-1], 3),
           "stages_median_ms": {s: pick(v, 0.5) for s, v in stages.items()},
           "stages_p99_ms": {s: pick(v, 0.99) for s, v in stages.items()},
           "loadavg_1m": round(os.getloadavg()[0], 2)}
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", "approval_gate_latency.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
