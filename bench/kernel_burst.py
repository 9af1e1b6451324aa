#!/usr/bin/env python3
"""Kernel denials under a burst and a flood: records written, attempts lost, CPU.

Compiles tests/escape/escape_probe.c and runs it under ``gatewrap run`` (as uid 65534, no
fake internet needed: nothing leaves the sandbox) in two scenarios:

- burst: N refused TCP connects (default 200k) round robin over 4 destinations;
- flood: 20 x N refused connects to one destination by a process with a 100 KB argv.

For each it prints the agent's attempts, EPERMs, seconds and CPU seconds, the
``direct_egress`` records written (and the sum of their counts), ``lost_events`` from
``run_end``, records and audit bytes per second of the burst, and gatewrap's own CPU
seconds (its rusage and its children's, minus the agent's). Prints one JSON object and
writes it to bench/results/kernel_burst.json. Root, one at a time on a host (the hooks are
shared): take the lock.

Usage: sudo flock /tmp/gatewrap-kernel.lock .venv/bin/python bench/kernel_burst.py [N] [--flood M] [--python PY]
       (PY: another build's interpreter, e.g. /work/main/.venv/bin/python, for a before figure)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DESTS = [("198.51.100.138", 7), ("198.51.100.138", 9), ("198.51.100.139", 7), ("2001:db8:100::10", 7)]
AGENT_UID = 65534


def build_probe(tmp: str) -> str:
    """tests/escape/escape_probe.c compiled into ``tmp``/work (made 0755); returns its path."""
    os.makedirs(os.path.join(tmp, "work"), mode=0o755, exist_ok=True)
    exe = os.path.join(tmp, "work", "escape_probe")
    subprocess.run(["cc", "-O2", "-o", exe, os.path.join(ROOT, "tests/escape/escape_probe.c")], check=True)
    os.chmod(exe, 0o755)
    return exe


def scenario(python: str, probe: str, tmp: str, n: int, dests: list[tuple[str, int]], pad: int) -> dict:
    """One ``gatewrap run`` of the probe (which lies in ``tmp``/work, the agent's workdir;
    the audit log goes to ``tmp``/audit, a folder the agent cannot write)."""
    os.makedirs(os.path.join(tmp, "audit"), exist_ok=True)
    audit = os.path.join(tmp, "audit", f"audit-{len(os.listdir(os.path.join(tmp, 'audit')))}.jsonl")
    work = os.path.dirname(probe)
    first, *rest = dests
    argv = [probe, "flood", first[0], str(first[1]), str(n)]
    for ip, port in rest:
        argv += [ip, str(port)]
    if pad:
        argv += ["--", "A" * pad]
    cmd = [python, "-m", "gatewrap", "run", "--own", "--audit-log", audit, "--workdir", work, "--", *argv]
    env = dict(os.environ, SUDO_UID=str(AGENT_UID), SUDO_GID=str(AGENT_UID))
    with open(os.path.join(tmp, "audit", "out"), "w+") as out, open(os.path.join(tmp, "audit", "err"), "w+") as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=ROOT)
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        if p.returncode != 0:
            raise SystemExit(f"gatewrap run failed ({p.returncode}): {err.read()}")
        out.seek(0)
        agent = json.loads(next(line for line in out.read().splitlines() if line.startswith("{")))
    lines = [(line, json.loads(line)) for line in open(audit, encoding="utf-8").read().splitlines()]
    egress = [line for line, rec in lines if rec["event"] == "direct_egress"]
    recs = [rec for _, rec in lines if rec["event"] == "direct_egress"]
    egress_bytes = sum(len(line.encode()) + 1 for line in egress)
    end = next(rec for _, rec in lines if rec["event"] == "run_end")
    secs = agent["elapsed"]
    return {
        "attempts": agent["res"], "eperm": agent["eperm"], "agent_s": round(secs, 3),
        "agent_cpu_s": round(agent["cpu"], 3), "attempts_per_s": round(agent["res"] / secs),
        "records": len(recs), "count_sum": sum(r.get("count", 1) for r in recs),
        "lost_events": end.get("lost_events"), "records_per_s": round(len(recs) / secs, 1),
        "audit_bytes": egress_bytes, "audit_bytes_per_s": round(egress_bytes / secs),
        "longest_record_bytes": max((len(line.encode()) for line in egress), default=0),
        "gatewrap_cpu_s": round(ru.ru_utime + ru.ru_stime - agent["cpu"], 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("n", nargs="?", type=int, default=200_000)
    ap.add_argument("--flood", type=int, default=None, help="attempts of the flood (default 20 x N)")
    ap.add_argument("--python", default=sys.executable)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="gw-bench-burst-")
    os.chmod(tmp, 0o755)
    try:
        probe = build_probe(tmp)
        scenario(args.python, probe, tmp, 1, DESTS[:1], 0)  # warm-up: the hooks compiled and pinned
        res = {
            "python": args.python,
            "burst": scenario(args.python, probe, tmp, args.n, DESTS, 0),
            "flood_100k_argv": scenario(args.python, probe, tmp, args.flood or 20 * args.n, DESTS[:1], 100_000),
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(res, indent=1))
    os.makedirs(os.path.join(ROOT, "bench/results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench/results/kernel_burst.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
