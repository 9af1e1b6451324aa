"""The audit pipeline: kernel denials to lines on disk, by bench/kernel_burst.py's scenarios
(tests/escape/escape_probe.c flood under ``gatewrap run``): a burst of N refused connects
over 4 destinations and a flood of 20 x N to one by a process with a 100 KB argv; for each,
attempts, records written, the sum of their counts (exact: every attempt must be counted),
``lost_events``, records/s and gatewrap's CPU (issue 13, target 6)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

from .common import ROOT, VENV_PY

sys.path.insert(0, os.path.join(ROOT, "bench"))
import kernel_burst  # noqa: E402


def measure(n: int) -> dict:
    """``{"burst": {...}, "flood_100k_argv": {...}}`` (kernel_burst.scenario's dicts) plus
    ``lost_attempts``: attempts minus the counts recorded, per scenario."""
    python = os.environ.get("GATEWRAP_PYTHON", VENV_PY)
    tmp = tempfile.mkdtemp(prefix="gw-bench-burst-")
    os.chmod(tmp, 0o755)
    try:
        probe = kernel_burst.build_probe(tmp)
        kernel_burst.scenario(python, probe, tmp, 1, kernel_burst.DESTS[:1], 0)  # hooks pinned
        res = {"burst": kernel_burst.scenario(python, probe, tmp, n, kernel_burst.DESTS, 0),
               "flood_100k_argv": kernel_burst.scenario(python, probe, tmp, 20 * n, kernel_burst.DESTS[:1], 100_000)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for r in res.values():
        r["lost_attempts"] = r["attempts"] - r["count_sum"]
    return res
