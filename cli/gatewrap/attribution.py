"""Who made a kernel-hooked attempt: the executable and parent chain of a run's process.

A kernel event names a pid (its thread group id), uid and comm; the record of it also says
which executable that process runs and the chain of its parents up to the run's first
process (the agent, or the jail's init for a jailed one), read from /proc when the record is made.
A pid is trusted only while its process is in the run's cgroup (a recycled pid outside it
is someone else); otherwise, or when the process is gone, the record says
``attribution: "partial"`` and carries what could be read.
"""

from __future__ import annotations

import os
from typing import Any

from .procstat import ppid_and_start

# /proc is read directly, not through psutil: importing psutil costs ~25 ms of a run of its
# own's start (its first kernel event is nsjail's own look for nscd's socket, on every run),
# for the three fields of /proc/PID/stat and the readlink used here.

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


class Gone(Exception):
    """The process is gone (or its /proc entry cannot be read)."""


def comm_of(pid: int) -> str:
    """/proc/PID/comm (proc(5)): the name the kernel events carry too (psutil's ``name()``
    guesses a longer one from the command line). Raises :class:`Gone` if it is gone."""
    try:
        with open(f"/proc/{pid}/comm", "rb") as f:
            return f.read().rstrip(b"\n").decode("utf-8", "backslashreplace")
    except OSError as e:
        raise Gone(pid) from e


def _stat(pid: int) -> tuple[int, int]:
    """(ppid, starttime in clock ticks since boot) of process ``pid``
    (:func:`gatewrap.procstat.ppid_and_start`). Raises :class:`Gone` if it is gone."""
    stat = ppid_and_start(pid)
    if stat is None:
        raise Gone(pid)
    return stat


def _exe(pid: int) -> str:
    """The executable of process ``pid`` (readlink of /proc/PID/exe, proc(5)), as psutil's
    ``exe()`` gives it: without the kernel's `` (deleted)`` mark when that file is gone.
    Raises :class:`Gone` if it is gone, or exiting: a process that has let go of its memory
    (exit_mm, then a zombie until its parent waits) has no executable to read, and its /proc
    entry, stat and cgroup stay; its record says ``attribution: "partial"``, never an empty
    ``exe`` (a kernel thread, the other process without one, is never in a run's cgroup)."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError as e:
        raise Gone(pid) from e
    exe = exe.split("\x00")[0]
    if exe.endswith(" (deleted)") and not os.path.exists(exe):
        exe = exe[: -len(" (deleted)")]
    return exe


def cgroup_path(cgroup_dir: str, mount: str) -> str:
    """The cgroup path /proc/PID/cgroup shows for the directory ``cgroup_dir`` of the cgroup
    v2 hierarchy mounted at ``mount`` (``/sys/fs/cgroup/gatewrap/gw-x`` -> ``/gatewrap/gw-x``)."""
    return "/" + os.path.relpath(cgroup_dir, mount).strip("/")


class Attributor:
    """Reads the attribution of the run's processes (``run_cgroup``: the run's cgroup path
    as /proc/PID/cgroup shows it), caching it per process (pid and start time)."""

    def __init__(self, run_cgroup: str) -> None:
        self._run = run_cgroup.rstrip("/")
        self._cache: dict[tuple[int, int], dict[str, Any]] = {}

    def _in_run(self, pid: int) -> bool:
        cg = cgroup_of(pid)
        return cg is not None and (cg == self._run or cg.startswith(self._run + "/"))

    def of(self, pid: int) -> dict[str, Any]:
        """The fields ``exe`` and ``parents`` (list of ``{"pid", "comm"}``, nearest first,
        up to the first process of the run, at most :data:`MAX_PARENTS`), and
        ``attribution: "partial"`` when ``pid`` or a parent was gone or not the run's.
        Costs, uncached: one /proc/PID/stat read, one readlink of /proc/PID/exe, and per
        parent a stat, a comm and a cgroup read."""
        try:
            ppid, started = _stat(pid)
        except Gone:
            return {"attribution": "partial"}
        key = (pid, started)
        if key in self._cache:
            return self._cache[key]
        if not self._in_run(pid):
            return {"attribution": "partial"}
        out: dict[str, Any] = {}
        partial = False
        try:
            out["exe"] = _exe(pid)
        except Gone:
            partial = True
        parents: list[dict[str, Any]] = []
        while len(parents) < MAX_PARENTS:
            try:
                if not ppid or not self._in_run(ppid):
                    break  # the last one looked at is the run's first process
                parent_ppid, _ = _stat(ppid)
                parents.append({"pid": ppid, "comm": comm_of(ppid)})
            except Gone:
                partial = True
                break
            ppid = parent_ppid
        out["parents"] = parents
        if partial:
            out["attribution"] = "partial"
            return out  # not cached: a later read may find more
        if len(self._cache) >= MAX_CACHED:
            self._cache.clear()
        self._cache[key] = out
        return out
