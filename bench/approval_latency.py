#!/usr/bin/env python3
"""Latency from a human's approve to the held request reaching upstream (issue 12: target
p99 <= 5 ms on SQLite).

Starts the fake internet (tests/fakenet; root, one at a time on a host: run under
``flock /tmp/gatewrap-kernel.lock``) and one ``gatewrap run`` whose agent sends N POSTs one
after the other to an ``ask`` rule (each a different query, so none shares an approval). For
each, this process waits until the approval is pending in the store, notes the wall clock,
calls ``ApprovalStore.decide`` (what ``gatewrap approvals approve`` and the review page call),
and reads the upstream server's own receive time (``ts`` of its access log line, the same
host clock). The figure covers the commit, the wake-up (SQLite: a datagram to the run's
socket; PostgreSQL: NOTIFY), the gate's claim and its send. Prints one JSON object and writes
bench/results/approval_latency.json.

Usage: sudo .venv/bin/python bench/approval_latency.py [N] [--state URL]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from fakenet import FakeInternet  # noqa: E402

POLICY = """\
version = 1
default = "deny"

[[rule]]
host = "allowed.test"
methods = ["POST"]
path = "/echo"
action = "ask"
"""

AGENT = textwrap.dedent("""
    import sys, urllib.request
    for i in range(int(sys.argv[1])):
        req = urllib.request.Request(f"http://allowed.test/echo?i={i}", data=b"x", method="POST")
        with urllib.request.urlopen(req, timeout=120) as r:
            r.read()
""")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("n", nargs="?", type=int, default=200)
    ap.add_argument("--state", help="store URL (default: a fresh SQLite file)")
    args = ap.parse_args()
    from gatewrap import _gate_core as core

    tmp = tempfile.mkdtemp(prefix="gwt-bench-appr-")
    os.chmod(tmp, 0o755)
    url = args.state or f"sqlite:{tmp}/state.db"
    for name, text in (("policy.toml", POLICY), ("agent.py", AGENT)):
        with open(os.path.join(tmp, name), "w") as f:
            f.write(text)
        os.chmod(os.path.join(tmp, name), 0o644)
    store = core.ApprovalStore(url)
    lat: list[float] = []
    with FakeInternet() as net:
        cmd = [sys.executable, "-m", "gatewrap", "run", "--audit-log", os.path.join(tmp, "audit.jsonl"),
               "--resolver", net.dns_server, "--public-range", "198.51.100.128/25", "--workdir", "/tmp",
               "--ro-bind", tmp, "--policy", os.path.join(tmp, "policy.toml"), "--state", url, "--",
               "/usr/bin/python3", os.path.join(tmp, "agent.py"), str(args.n)]
        env = dict(os.environ, SUDO_UID="65534", SUDO_GID="65534")
        run = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            for i in range(args.n):
                while True:
                    items = store.list(status="pending", limit=1)
                    if items:
                        break
                    if run.poll() is not None:
                        raise SystemExit(f"the run ended early: {run.stderr.read()}")
                    time.sleep(0.002)
                a = items[0]
                t0 = time.time()
                store.decide(a["id"], version=a["version"], digest=a["digest"], verdict="approve", by="bench")
                while not (got := net.access_entries(method="POST", path=f"/echo?i={i}")):
                    time.sleep(0.0005)
                lat.append((got[0]["ts"] - t0) * 1000)
            run.wait(timeout=120)
        finally:
            if run.poll() is None:
                run.terminate()
                run.wait()
    shutil.rmtree(tmp, ignore_errors=True)
    lat.sort()
    out = {"n": len(lat), "store": url.split(":")[0], "median_ms": round(statistics.median(lat), 3),
           "p90_ms": round(lat[int(0.9 * (len(lat) - 1))], 3), "p99_ms": round(lat[int(0.99 * (len(lat) - 1))], 3),
           "max_ms": round(lat[-1], 3)}
    print(json.dumps(out))
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", "approval_latency.json"), "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
