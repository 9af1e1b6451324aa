"""Who made a kernel-hooked attempt: the executable and parent chain of a run's process.

A kernel event names a pid (its thread group id), uid and comm; the record of it also says
which executable that process runs and the chain of its parents up to the run's first
process (the agent, or nsjail for a jailed one), read from /proc when the record is made.
A pid is trusted only while its process is in the run's cgroup (a recycled pid outside it
is someone else); otherwise, or when the process is gone, the record says
``attribution: "partial"`` and carries what could be read.
"""

from __future__ import annotations

import os
from typing import Any

# psutil is imported where a record is attributed (on the kernel-denial thread), not at
# start-up: a run with no kernel event never needs it.

#: Most parents a record lists (nearest first).
MAX_PARENTS = 16
#: Processes whose attribution is kept, by (pid, start time); beyond it the cache is emptied
#: (a run that starts more processes than this just reads /proc again).
MAX_CACHED = 4096


def cgroup_of(pid: int) -> str | None:
    """The process's cgroup v2 path (``/gatewrap/gw-...``), from the ``0::PATH`` line of
    /proc/PID/cgroup (cgroups(7)); None if it is gone."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    return line[3:].rstrip("\n")
    except OSError:
        return None
    return None


def comm_of(pid: int) -> str:
    """/proc/PID/comm (proc(5)): the name the kernel events carry too (psutil's ``name()``
    guesses a longer one from the command line). Raises psutil.NoSuchProcess if it is gone."""
    try:
        with open(f"/proc/{pid}/comm", "rb") as f:
            return f.read().rstrip(b"\n").decode("utf-8", "backslashreplace")
    except OSError as e:
        import psutil

        raise psutil.NoSuchProcess(pid) from e


def cgroup_path(cgroup_dir: str, mount: str) -> str:
    """The cgroup path /proc/PID/cgroup shows for the directory ``cgroup_dir`` of the cgroup
    v2 hierarchy mounted at ``mount`` (``/sys/fs/cgroup/gatewrap/gw-x`` -> ``/gatewrap/gw-x``)."""
    return "/" + os.path.relpath(cgroup_dir, mount).strip("/")


class Attributor:
    """Reads the attribution of the run's processes (``run_cgroup``: the run's cgroup path
    as /proc/PID/cgroup shows it), caching it per process (pid and start time)."""

    def __init__(self, run_cgroup: str) -> None:
        self._run = run_cgroup.rstrip("/")
        self._cache: dict[tuple[int, float], dict[str, Any]] = {}

    def _in_run(self, pid: int) -> bool:
        cg = cgroup_of(pid)
        return cg is not None and (cg == self._run or cg.startswith(self._run + "/"))

    def of(self, pid: int) -> dict[str, Any]:
        """The fields ``exe`` and ``parents`` (list of ``{"pid", "comm"}``, nearest first,
        up to the first process of the run, at most :data:`MAX_PARENTS`), and
        ``attribution: "partial"`` when ``pid`` or a parent was gone or not the run's.
        Costs, uncached: psutil's Process (one /proc/PID/stat read), one readlink of
        /proc/PID/exe, and per parent a stat, a comm and a cgroup read."""
        import psutil

        try:
            proc = psutil.Process(pid)
            key = (pid, proc.create_time())
        except psutil.Error:
            return {"attribution": "partial"}
        if key in self._cache:
            return self._cache[key]
        if not self._in_run(pid):
            return {"attribution": "partial"}
        out: dict[str, Any] = {}
        partial = False
        try:
            out["exe"] = proc.exe()
        except psutil.Error:
            partial = True
        parents: list[dict[str, Any]] = []
        child = proc
        while len(parents) < MAX_PARENTS:
            try:
                ppid = child.ppid()
                if not ppid or not self._in_run(ppid):
                    break  # child is the run's first process
                parent = psutil.Process(ppid)
                parents.append({"pid": ppid, "comm": comm_of(ppid)})
            except psutil.Error:
                partial = True
                break
            child = parent
        out["parents"] = parents
        if partial:
            out["attribution"] = "partial"
            return out  # not cached: a later read may find more
        if len(self._cache) >= MAX_CACHED:
            self._cache.clear()
        self._cache[key] = out
        return out
