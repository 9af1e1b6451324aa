#!/usr/bin/env python3
"""The cost of rotating the audit log: one writer (gate_core's AuditLog through its Python
binding) writes N 300-byte records with rotation off and at 1 MiB, 64 KiB and 16 KiB, and
the difference over the rotations made is the cost of one (a closing and an opening
checkpoint, two Ed25519 signatures, a file made, linked and renamed). Timings on a shared
machine vary by a quarter from run to run: read the per-rotation figure as an order of size.

Usage: sudo .venv/bin/python bench/audit_rotate.py [N]   (default 20000; root: the
directories must be root's).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

from gatewrap import _gate_core as core


def case(folder: str, max_size: int, n: int) -> tuple[float, int]:
    """(seconds for ``n`` writes, rotations made) with ``max_size`` (0: off)."""
    path = os.path.join(folder, f"audit-{max_size}.jsonl")
    log = core.AuditLog(path, key=os.path.join(folder, "key", "signing-key"), max_size=max_size)
    rec = {"run": "gw-bench", "event": "request", "decision": "allowed", "target": "http://x.test/" + "p" * 200}
    t = time.perf_counter()
    for _ in range(n):
        log.write(rec)
    return time.perf_counter() - t, sum(1 for f in os.listdir(folder) if f.startswith(os.path.basename(path) + "."))


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    folder = tempfile.mkdtemp(prefix="gw-rotate-bench-", dir="/root")
    os.chmod(folder, 0o750)
    try:
        case(folder, 0, 1000)  # warm up: the key is made, the page cache filled
        base, _ = case(folder, 0, n)
        print(f"rotation off: {n} records in {base:.3f} s ({n / base:.0f}/s)")
        for size in (1 << 20, 64 << 10, 16 << 10):
            t, rotations = case(folder, size, n)
            per = (t - base) / rotations * 1e3 if rotations else float("nan")
            print(f"max_size {size >> 10} KiB: {t:.3f} s ({n / t:.0f}/s), {rotations} rotations, "
                  f"{per:.2f} ms each")
    finally:
        shutil.rmtree(folder)


if __name__ == "__main__":
    main()
