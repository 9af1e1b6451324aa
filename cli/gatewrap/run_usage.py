"""What live runs use now, for ``gatewrap ps``: CPU %, resident memory and process count of
the processes in each run's cgroup v2 leaf (its ``cgroup.procs``: the processes in that cgroup,
cgroup-v2.rst; a run's leaf has no children). Read with psutil; a process that exits between
the listing and the read is left out (psutil.NoSuchProcess), never an error.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass

from .sandbox import cgroup

#: Seconds between the two CPU samples (one sleep for every run at once).
SAMPLE_S = 0.2


@dataclass(frozen=True)
class Usage:
    """One run's use: ``cpu_percent`` of one CPU summed over its processes over
    :data:`SAMPLE_S` (150.0 = one and a half CPUs busy), ``rss`` the sum of their resident
    set sizes in bytes (pages they share counted once per process, as ps(1) sums them) and
    ``procs`` how many processes its cgroup holds."""

    cpu_percent: float = 0.0
    rss: int = 0
    procs: int = 0


def cgroup_pids(run_id: str) -> list[int]:
    """The pids (this pid namespace's) in run ``run_id``'s cgroup leaf; [] when the leaf or the
    cgroup v2 mount is gone (the run has just ended)."""
    root = cgroup.cgroup2_mount()
    if root is None:
        return []
    try:
        with open(os.path.join(root, cgroup.PARENT_NAME, run_id, "cgroup.procs")) as f:
            return [int(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return []


def sample(run_ids: list[str], interval: float = SAMPLE_S) -> Mapping[str, Usage]:
    """The :class:`Usage` of each run in ``run_ids``: the runs' processes are listed and their
    CPU times read, then after ``interval`` seconds listed and read again. CPU % is the CPU
    time each process used between the two reads over the time between them (psutil's
    ``cpu_percent``); a process that started in between counts for RSS and ``procs`` but not
    CPU; one that exited in between is not counted at all. Needs root to read other users'
    processes (psutil.AccessDenied leaves a process out)."""
    import psutil  # ~25 ms to import: only ps pays it

    def primed(pid: int) -> psutil.Process | None:
        try:
            p = psutil.Process(pid)
            p.cpu_percent(None)
            return p
        except psutil.Error:
            return None

    first = {run: {pid: primed(pid) for pid in cgroup_pids(run)} for run in run_ids}
    if run_ids:
        time.sleep(interval)
    out: dict[str, Usage] = {}
    for run in run_ids:
        cpu, rss, procs = 0.0, 0, 0
        for pid in cgroup_pids(run):
            p = first[run].get(pid)
            try:
                if p is not None and p.is_running():  # the same process (pid and start time)
                    used = p.cpu_percent(None)
                else:
                    p, used = psutil.Process(pid), 0.0
                rss += p.memory_info().rss
            except psutil.Error:
                continue
            cpu += used
            procs += 1
        out[run] = Usage(round(cpu, 1), rss, procs)
    return out
