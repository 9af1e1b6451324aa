#!/usr/bin/env python3
"""Memory and threads of one process holding N idle gates: on the shared runtime
(``core.Gate(shared_runtime=True)``: one tokio runtime for all) against a runtime each.

Makes N network namespaces (root; take the host lock: ``flock /tmp/gatewrap-kernel.lock``),
then, for each mode, a fresh Python process that starts one gate in each netns (listen port
0, policy default deny, an audit log each, no DNS stub unless ``--dns-stub``), waits
``--settle`` seconds, and reports from its own /proc/self/status: VmRSS (KiB) and Threads
before the first gate and with all N running, the difference per gate, the wall time to
start all N and to stop all N (ms). Nothing is sent through the gates (idle). Prints JSON
and writes bench/results/gate_density.json.

Usage: sudo .venv/bin/python bench/gate_density.py [-n N] [--modes shared,own] [--dns-stub]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def status() -> dict[str, int]:
    """VmRSS (KiB) and Threads of this process, from /proc/self/status."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "Threads"):
                out[key] = int(value.split()[0])
    return out


def child(mode: str, paths: list[str], dns_stub: bool, settle: float) -> dict:
    """Start a gate in each netns of ``paths`` (``mode`` "shared" or "own"), measure, stop."""
    from gatewrap import _gate_core as core

    tmp = tempfile.mkdtemp(prefix="gw-density-")
    policy = core.Policy.new("deny")
    logs = [core.AuditLog(os.path.join(tmp, f"audit{i}.jsonl"), key=None) for i in range(len(paths))]
    time.sleep(settle)
    before = status()
    t0 = time.monotonic()
    gates = [core.Gate(run_id=f"gw-density{i}", netns_path=p, policy=policy, audit=logs[i], listen_port=0,
                       nameservers=[], dns_stub=dns_stub, shared_runtime=(mode == "shared"))
             for i, p in enumerate(paths)]
    started_ms = (time.monotonic() - t0) * 1000
    time.sleep(settle)
    running = status()
    t0 = time.monotonic()
    for g in gates:
        g.stop()
    stopped_ms = (time.monotonic() - t0) * 1000
    after = status()
    n = len(paths)
    return {
        "mode": mode, "gates": n,
        "rss_kib_before": before["VmRSS"], "rss_kib_running": running["VmRSS"], "rss_kib_after_stop": after["VmRSS"],
        "rss_kib_per_gate": round((running["VmRSS"] - before["VmRSS"]) / n, 1),
        "threads_before": before["Threads"], "threads_running": running["Threads"], "threads_after_stop": after["Threads"],
        "start_all_ms": round(started_ms, 1), "stop_all_ms": round(stopped_ms, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=100, help="gates (and netns) per mode (default 100)")
    ap.add_argument("--modes", default="shared,own", help="comma-separated: shared, own (default both)")
    ap.add_argument("--dns-stub", action="store_true", help="also serve each gate's DNS stub (UDP+TCP port 53)")
    ap.add_argument("--settle", type=float, default=1.0, help="seconds to wait before each reading (default 1)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--paths", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.paths.split(","), args.dns_stub, args.settle)))
        return 0
    from gatewrap.sandbox import netns

    results, held = [], []
    try:
        for _ in range(args.n):
            held.append(netns.create())
        paths = [ns.path for ns in held]
        for mode in args.modes.split(","):
            cmd = [sys.executable, __file__, "--child", mode, "--paths", ",".join(paths), "--settle", str(args.settle)]
            if args.dns_stub:
                cmd.append("--dns-stub")
            out = subprocess.run(cmd, capture_output=True, text=True, check=True)
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    finally:
        for ns in held:
            ns.close()
    report = {"date": time.strftime("%Y-%m-%d"), "gates": args.n, "dns_stub": args.dns_stub, "results": results}
    print(json.dumps(report, indent=2))
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", "gate_density.json"), "w") as f:
        json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
