#!/usr/bin/env python3
"""Writing the audit log: records per second the writer (gate_core's AuditLog through its
Python binding, the path kernel denials take) sustains with the hash chain (each write
reads the file's last line back under the flock and hashes it) and signed checkpoints
(every 1000 records), one writer thread and four, and ``gatewrap audit verify`` MB/s on the
result. Records are shaped as kernel denials (pid, comm, a 200-byte cmdline).

Usage: sudo .venv/bin/python bench/audit_write.py [N]   (N records per case, default 200000;
writes bench/results/audit_write.json; root: the directories must be root's).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time

from gatewrap import _gate_core as core

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def record(i: int) -> dict:
    return {"run": "gw-0123456789", "event": "direct_egress", "hook": "connect4", "family": "inet",
            "dst_ip": "198.51.100.137", "dst_port": 80, "pid": 4242, "tid": 4242, "uid": 65534,
            "comm": "python3", "cmdline": "python3 -c " + "x" * 190, "count": 1, "i": i}


def case(d: str, name: str, n: int, threads: int, key: str | None) -> dict:
    path = os.path.join(d, f"{name}.jsonl")
    log = core.AuditLog(path, key=key)
    per = n // threads

    def work(t: int) -> None:
        for i in range(per):
            log.write(record(t * per + i))

    cpu0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    log.checkpoint()
    wall = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    out = {"case": name, "records": per * threads, "threads": threads, "signed": key is not None,
           "seconds": round(wall, 3), "records_per_s": round(per * threads / wall),
           "cpu_us_per_record": round(cpu / (per * threads) * 1e6, 2), "bytes": os.path.getsize(path)}
    return out


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    results = []
    with tempfile.TemporaryDirectory(prefix="gw-bench-write-") as d:
        os.chmod(d, 0o700)
        key = os.path.join(d, "keys", "signing-key")
        for name, threads, k in (("chained-1", 1, key), ("chained-4", 4, key), ("unsigned-1", 1, None)):
            r = case(d, name, n, threads, k)
            results.append(r)
            print(json.dumps(r), flush=True)
        verifier = core.audit_verifier_key(key)
        path = os.path.join(d, "chained-1.jsonl")
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "gatewrap", "audit", "verify", "--key", verifier, path],
                           capture_output=True, text=True, cwd=ROOT)
        wall = time.perf_counter() - t0
        v = {"case": "verify", "ok": p.returncode == 0, "seconds": round(wall, 3),
             "mb_per_s": round(os.path.getsize(path) / wall / 1e6, 1), "output": p.stdout.strip()}
        results.append(v)
        print(json.dumps(v), flush=True)
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", "audit_write.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
