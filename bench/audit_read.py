#!/usr/bin/env python3
"""Reading a large audit log: MB/s and peak RSS of ``gatewrap audit`` and ``audit stats``.

Writes a log of SIZE MB (default 1024) of records shaped as the gate and the kernel-denial
reader write them (gate_core/src/audit/record.rs and mod.rs: ``v``, ``time`` first, compact
JSON; cli/gatewrap/kernel_denials.py), for 2000 runs of ~2 MB each, one after another: a
``run_start``, then a mix of allowed/denied/failed ``request`` and ``connect`` records, ``dns``
queries and ``direct_egress`` kernel denials (pid, comm, cmdline), then a ``run_end``. Then
runs each case as its own process (the real CLI, output to /dev/null) and reports its wall
time, MB/s over the log's size and peak RSS (its VmHWM at exit); the log is in the page
cache (read once first), so the figures are the reader's, not the disk's. ``--run`` with a start
of an id adds a search of the whole log for the runs it starts (audit_reader.runs_starting).
The prefilter is measured in-process: the same filtered read with and without it.

Usage: .venv/bin/python bench/audit_read.py [SIZE_MB] [--keep]   (the log goes to a temp folder;
writes bench/results/audit_read.json). No root needed.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNS = 2000
HOSTS = ["api.openai.com", "pypi.org", "files.pythonhosted.org", "github.com", "api.github.com",
         "objects.githubusercontent.com", "registry.npmjs.org", "huggingface.co"]
DENIED_HOSTS = ["evil.example", "paste.example.net", "exfil.attacker.test", "169.254.169.254"]


def _records(run: str, t: dt.datetime, rng: random.Random, n: int):
    """The records of one run (n of them between run_start and run_end), as dicts."""
    def stamp() -> str:
        nonlocal t
        t += dt.timedelta(microseconds=rng.randrange(200, 20000))
        return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    uid = rng.choice([1000, 1001, 65534])
    yield {"v": 1, "time": stamp(), "run": run, "event": "run_start",
           "argv": ["/usr/bin/python3", "agent.py", "--task", f"t{rng.randrange(1000)}"], "uid": uid,
           "cgroup_id": rng.randrange(10**6, 10**7), "gate": "http://127.0.0.1:3128"}
    counts = {"allowed": 0, "denied": 0, "failed": 0, "direct_egress": 0}
    for _ in range(n):
        r = rng.random()
        client = f"127.0.0.1:{rng.randrange(32768, 60999)}"
        if r < 0.55:
            host = rng.choice(HOSTS)
            yield {"v": 1, "time": stamp(), "run": run, "event": "connect", "decision": "allowed",
                   "reason": "policy: rule policy.toml:rule[2]", "rule": "policy.toml:rule[2]", "client": client,
                   "method": "CONNECT", "target": f"{host}:443", "dst_host": host,
                   "dst_ip": f"198.51.100.{rng.randrange(1, 255)}", "dst_port": 443, "proto": "connect", "status": 200}
            counts["allowed"] += 1
        elif r < 0.75:
            host = rng.choice(DENIED_HOSTS)
            yield {"v": 1, "time": stamp(), "run": run, "event": "request", "decision": "denied",
                   "reason": "policy: default deny", "client": client, "method": "GET",
                   "target": f"http://{host}/upload?id={rng.randrange(10**9)}", "dst_host": host, "dst_port": 80,
                   "proto": "http", "status": 403}
            counts["denied"] += 1
        elif r < 0.82:
            yield {"v": 1, "time": stamp(), "run": run, "event": "request", "decision": "failed",
                   "client": client, "method": "POST", "target": "http://pypi.org/simple/", "dst_host": "pypi.org",
                   "dst_ip": "198.51.100.7", "dst_port": 80, "proto": "http", "status": 502,
                   "error": "upstream: connection refused"}
            counts["failed"] += 1
        elif r < 0.90:
            yield {"v": 1, "time": stamp(), "run": run, "event": "dns", "decision": "denied",
                   "reason": "dns: the sandbox resolves no names; the gate resolves allowed hosts",
                   "client": client, "dst_host": rng.choice(HOSTS + DENIED_HOSTS), "proto": "dns"}
            counts["denied"] += 1
        else:
            pid = rng.randrange(2, 4000)
            yield {"v": 1, "time": stamp(), "run": run, "event": "direct_egress", "decision": "denied",
                   "reason": "kernel: connect4", "pid": pid, "tid": pid, "uid": uid, "comm": "python3",
                   "cmdline": "/usr/bin/python3 agent.py --task t1", "dst_ip": f"203.0.113.{rng.randrange(1, 255)}",
                   "dst_port": rng.choice([22, 80, 443, 6667]), "proto": "tcp", "family": "ipv4",
                   "hook": "connect4", "cgroup_id": 1234567}
            counts["direct_egress"] += 1
    yield {"v": 1, "time": stamp(), "run": run, "event": "run_end", "exit_code": 0, **counts, "inspected": 0,
           "would_deny": 0, "lost_events": 0}


def write_log(path: str, size_mb: int) -> tuple[int, list[str], str]:
    """Write the log; returns (records, run ids, the time of the middle record)."""
    rng = random.Random(11)
    target = size_mb << 20
    per_run = max(10, target // RUNS // 330)
    t = dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc)
    written, n, runs, mid = 0, 0, [], ""
    with open(path, "w", buffering=1 << 20) as f:
        while written < target:
            run = f"gw-{rng.randrange(16**10):010x}"
            runs.append(run)
            lines = [json.dumps(r, separators=(",", ":")) + "\n" for r in _records(run, t, rng, per_run)]
            t = dt.datetime.fromisoformat(json.loads(lines[-1])["time"])
            f.write("".join(lines))
            written += sum(len(x) for x in lines)
            n += len(lines)
            if not mid and written >= target // 2:
                mid = json.loads(lines[-1])["time"]
    return n, runs, mid


#: Runs gatewrap's main with its arguments and, at exit, writes the process's own peak RSS
#: (VmHWM of /proc/self/status, proc(5): the high-water mark of this program's memory; wait4's
#: ru_maxrss would also count the parent's RSS at fork) to the file $GW_BENCH_HWM.
WRAPPER = """
import atexit, os, sys
def hwm():
    with open("/proc/self/status") as f, open(os.environ["GW_BENCH_HWM"], "w") as out:
        out.write(next(l for l in f if l.startswith("VmHWM:")).split()[1])
atexit.register(hwm)
sys.argv = ["gatewrap", *sys.argv[1:]]
from gatewrap.cli import main
main()
"""


def timed(args: list[str]) -> dict:
    """Run ``gatewrap ARGS`` with stdout to /dev/null: wall seconds and peak RSS (MiB)."""
    with tempfile.NamedTemporaryFile() as hwm:
        t0 = time.monotonic()
        p = subprocess.run([sys.executable, "-c", WRAPPER, *args], stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, env=dict(os.environ, GW_BENCH_HWM=hwm.name))
        wall = time.monotonic() - t0
        if p.returncode != 0:
            raise SystemExit(f"{args}: exit {p.returncode}: {p.stderr.decode()}")
        kib = int(open(hwm.name).read())
    return {"seconds": round(wall, 2), "peak_rss_mib": round(kib / 1024, 1)}


def prefilter_effect(path: str, run: str) -> dict:
    """In-process: a --run read with the prefilter, and with it turned off (every line parsed)."""
    sys.path.insert(0, os.path.join(ROOT, "cli"))
    from gatewrap import audit_reader as ar

    out = {}
    for name, quick in (("with_prefilter", True), ("without_prefilter", False)):
        f = ar.Filters(run=run)
        if not quick:
            f.quick = lambda line: True  # type: ignore[method-assign]
        t0 = time.monotonic()
        got = sum(1 for _ in ar.entries(path, f))
        out[name] = {"seconds": round(time.monotonic() - t0, 2), "records": got}
    return out


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    size_mb = int(args[0]) if args else 1024
    keep = "--keep" in sys.argv
    gw = ["audit"]
    with tempfile.TemporaryDirectory(prefix="gw-bench-audit-") as d:
        path = os.path.join(d, "audit.jsonl")
        t0 = time.monotonic()
        n, runs, mid = write_log(path, size_mb)
        gen = time.monotonic() - t0
        size = os.path.getsize(path)
        with open(path, "rb") as f:  # into the page cache
            while f.read(1 << 24):
                pass
        run = runs[len(runs) // 2]
        cases = {
            "--run ID (one run of 2000), json": [*gw, "--run", run, "--json", "--log", path],
            "--run START (its first 9 digits, without gw-), json": [*gw, "--run", run[3:12], "--json", "--log", path],
            "--denied --host '*.attacker.test', json": [*gw, "--denied", "--host", "*.attacker.test", "--json",
                                                        "--log", path],
            "--event direct_egress --pid 1234, csv": [*gw, "--event", "direct_egress", "--pid", "1234",
                                                      "--format", "csv", "--log", path],
            "--since (the second half), table": [*gw, "--since", mid, "--format", "table", "--log", path],
            "no filter, json (every line parsed, passed through)": [*gw, "--json", "--log", path],
            "stats": [*gw, "stats", "--log", path],
        }
        results = {}
        for name, argv in cases.items():
            r = timed(argv)
            r["mb_per_s"] = round(size / 2**20 / r["seconds"], 1)
            results[name] = r
            print(f"{name:55} {r['seconds']:7.2f} s {r['mb_per_s']:7.1f} MB/s  peak RSS {r['peak_rss_mib']} MiB",
                  flush=True)
        pre = prefilter_effect(path, run)
        print(f"prefilter, --run in-process: {pre}", flush=True)
        out = {"log_mib": round(size / 2**20, 1), "records": n, "runs": len(runs), "generate_s": round(gen, 1),
               "cases": results, "prefilter_run_read": pre, "python": sys.version.split()[0],
               "date": dt.date.today().isoformat()}
        if keep:
            os.link(path, os.path.join(tempfile.gettempdir(), "gw-bench-audit.jsonl"))
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", "audit_read.json"), "w") as f:
        json.dump(out, f, indent=2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
