"""Resource bounds of a run: tasks (pids), memory and CPU, where this host can enforce them.

Each controller is used where the host has it, in this order:

1. cgroup v2, on the run's leaf (``pids.max``, ``memory.max`` + ``memory.swap.max``,
   ``cpu.max``), when the v2 root lists the controller in ``cgroup.controllers``
   (Documentation/admin-guide/cgroup-v2.rst); it is enabled in ``cgroup.subtree_control`` of
   every ancestor of the leaf;
2. else the controller's cgroup v1 hierarchy (a hybrid layout, as on these VMs): a leaf
   ``<mount>/gatewrap/<run id>`` (``pids.max``, ``memory.limit_in_bytes`` and
   ``memory.memsw.limit_in_bytes``, ``cpu.cfs_quota_us``), which the launcher makes the agent
   join before anything else (it writes ``0``, "the writer", to the leaf's ``cgroup.procs``;
   Documentation/admin-guide/cgroup-v1/pids.rst, memory.rst);
3. else, for pids only, ``RLIMIT_NPROC`` of the agent (setrlimit(2)), which counts every
   process of the agent's user on the host, not the run's: said on stderr. A memory or CPU
   bound that cannot be enforced is refused (fail closed; ``--memory max`` runs without).

The ``gatewrap/`` parent of each hierarchy caps all runs together (:data:`PARENT_PIDS_SHARE`
of the host's pids, :data:`PARENT_MEMORY_SHARE` of its RAM), written when gatewrap makes the
parent: an administrator may change it there and it stays until the next boot.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from ..entry import DEFAULT_TMPFS
from ..errors import GatewrapError
from ..sizes import parse_size, ram_bytes
from .cgroup import PARENT_NAME, cgroup2_mount

#: cpu.max period in microseconds (the kernel's default).
CPU_PERIOD_US = 100_000
#: All runs together: at most this share of min(kernel.pid_max, kernel.threads-max) tasks,
#: so that a host service, a login and gatewrap itself can still fork.
PARENT_PIDS_SHARE = 0.5
#: All runs together: at most this share of the host's RAM.
PARENT_MEMORY_SHARE = 0.75
#: The controllers a run's bounds use, with the option each serves.
FLAGS = {"pids": "--pids", "memory": "--memory", "cpu": "--cpus"}


@dataclass(frozen=True)
class Limits:
    """``memory`` in bytes, ``cpus`` in CPUs (0.5 = half of one), ``pids`` in tasks (None = no
    bound; ``gatewrap run``'s defaults are :mod:`gatewrap.entry`'s ``DEFAULT_*``); ``tmpfs``:
    the bytes of the jail's in-memory file systems together (:mod:`gatewrap.sandbox.tmpfs`)."""

    memory: int | None = None
    cpus: float | None = None
    pids: int | None = None
    tmpfs: int = parse_size(DEFAULT_TMPFS)

    def controllers(self) -> list[str]:
        """The cgroup controllers these limits need."""
        return [c for c, v in (("pids", self.pids), ("memory", self.memory), ("cpu", self.cpus)) if v is not None]


@dataclass
class Bounds:
    """How a run's :class:`Limits` are enforced here (:func:`apply`).

    ``join``: cgroup v1 leaves the agent joins (the launcher's ``join_cgroups``); ``nproc``:
    RLIMIT_NPROC for the agent (no pids controller), else None; ``record``: what ``run_start``
    says (``limits``); ``notes``: what to say on stderr."""

    join: list[str] = field(default_factory=list)
    nproc: int | None = None
    record: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def v1_mount(controller: str, mounts_file: str = "/proc/self/mounts") -> str | None:
    """Mount point of the cgroup v1 hierarchy that has ``controller`` (proc(5): fstype
    ``cgroup``, the controller among the mount options), or None."""
    with open(mounts_file) as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 4 and parts[2] == "cgroup" and controller in parts[3].split(","):
                return parts[1].replace("\\040", " ")
    return None


def where(controller: str, v2_root: str | None = None) -> tuple[str, str] | None:
    """Where ``controller`` is enforced here: ``("cgroup2", v2 root)``, ``("cgroup1", its v1
    mount)`` or None (see the module's order)."""
    root = v2_root or cgroup2_mount()
    if root is not None:
        with contextlib.suppress(OSError), open(os.path.join(root, "cgroup.controllers")) as f:
            if controller in f.read().split():
                return "cgroup2", root
    mount = v1_mount(controller)
    return ("cgroup1", mount) if mount is not None else None


def host_pids() -> int:
    """The host's task ceiling: min(kernel.pid_max, kernel.threads-max) (proc(5))."""
    values = []
    for name in ("pid_max", "threads-max"):
        with open(f"/proc/sys/kernel/{name}") as f:
            values.append(int(f.read()))
    return min(values)


def apply(leaf: str, run_id: str, limits: Limits) -> Bounds:
    """Enforce ``limits`` for run ``run_id`` whose cgroup v2 leaf is ``leaf``: set them on the
    leaf, or make the run's cgroup v1 leaves (removed by :func:`remove`, which the caller
    registers first), or fall back to RLIMIT_NPROC for pids.

    Raises:
        GatewrapError: a memory or CPU bound with no controller here, or writing a limit failed.
    """
    out = Bounds(record={"tmpfs": limits.tmpfs})
    places = {c: where(c, cgroup2_mount()) for c in limits.controllers()}
    missing = [c for c, p in places.items() if p is None and c != "pids"]
    if missing:
        raise GatewrapError(
            f"{' and '.join(FLAGS[c] for c in missing)} cannot be enforced here: this machine has no "
            f"{', '.join(missing)} controller in cgroup v2 or v1. Run with --memory max (and without --cpus) "
            "to go on without that bound.")
    try:
        for controller, place in places.items():
            value = {"pids": limits.pids, "memory": limits.memory, "cpu": limits.cpus}[controller]
            if place is None:  # pids only: see the module's docstring
                out.nproc = int(value)
                out.record.update(pids=out.nproc, pids_by="rlimit")
                out.notes.append(
                    f"gatewrap: note: no pids controller here: the run's --pids {out.nproc} is the agent's "
                    "RLIMIT_NPROC, which counts all of its user's processes on the host (other runs as that "
                    "user too), not only the run's")
                continue
            kind, root = place
            if kind == "cgroup2":
                _enable_up_to(leaf, root, controller)
                target = leaf
            else:
                target = _v1_leaf(root, run_id)
                out.join.append(target)
            _set(target, controller, value, kind)
            key = "cpus" if controller == "cpu" else controller
            out.record.update({key: value, f"{key}_by": kind})
    except OSError as e:
        raise GatewrapError(f"setting the run's resource limits failed: {e}") from e
    return out


def _enable_up_to(leaf: str, root: str, controller: str) -> None:
    """Enable ``controller`` in ``cgroup.subtree_control`` of every ancestor of ``leaf`` below
    and including ``root``, and cap the ``gatewrap/`` parent the first time (:func:`_cap_parent`)."""
    ancestors = []
    p = os.path.dirname(leaf)
    while len(p) >= len(root):
        ancestors.append(p)
        p = os.path.dirname(p)
    for path in reversed(ancestors):
        with open(os.path.join(path, "cgroup.subtree_control")) as f:
            enabled = controller in f.read().split()
        if not enabled:
            with open(os.path.join(path, "cgroup.subtree_control"), "w") as f:
                f.write(f"+{controller}")
            if path == os.path.dirname(leaf):
                _cap_parent(path, controller, "cgroup2")


def _v1_leaf(mount: str, run_id: str) -> str:
    """Make ``<mount>/gatewrap/<run_id>`` (the parent too, capped when made: :func:`_cap_parent`)."""
    parent = os.path.join(mount, PARENT_NAME)
    try:
        os.mkdir(parent, 0o755)
        _cap_parent(parent, os.path.basename(mount), "cgroup1")
    except FileExistsError:
        pass
    leaf = os.path.join(parent, run_id)
    os.mkdir(leaf, 0o755)
    return leaf


def _cap_parent(parent: str, controller: str, kind: str) -> None:
    """The cap of all runs together on the ``gatewrap/`` parent (see the module's docstring)."""
    if controller == "pids":
        _set(parent, "pids", int(host_pids() * PARENT_PIDS_SHARE), kind)
    elif controller == "memory":
        _set(parent, "memory", int(ram_bytes() * PARENT_MEMORY_SHARE) // 4096 * 4096, kind)


def _set(path: str, controller: str, value: float | int | None, kind: str) -> None:
    """Write one bound of ``controller`` in cgroup ``path`` of a ``kind`` hierarchy."""
    if controller == "pids":
        _write(path, "pids.max", str(value))
    elif controller == "memory" and kind == "cgroup2":
        _write(path, "memory.max", str(value))
        _write(path, "memory.swap.max", "0", optional=True)
    elif controller == "memory":
        # memsw (memory + swap) must stay at or above the memory limit: memory first, then
        # memsw equal to it, i.e. no swap (absent without swap accounting).
        _write(path, "memory.limit_in_bytes", str(value))
        _write(path, "memory.memsw.limit_in_bytes", str(value), optional=True)
    elif kind == "cgroup2":
        _write(path, "cpu.max", f"{max(1000, int(value * CPU_PERIOD_US))} {CPU_PERIOD_US}")
    else:
        _write(path, "cpu.cfs_period_us", str(CPU_PERIOD_US))
        _write(path, "cpu.cfs_quota_us", str(max(1000, int(value * CPU_PERIOD_US))))


def _write(cgroup: str, name: str, value: str, optional: bool = False) -> None:
    path = os.path.join(cgroup, name)
    if optional and not os.path.exists(path):
        return
    with open(path, "w") as f:
        f.write(value)


def v1_leaves(run_id: str) -> list[str]:
    """The run's cgroup v1 leaves that exist (every v1 hierarchy's ``gatewrap/<run_id>``)."""
    return [p for p in (os.path.join(m, PARENT_NAME, run_id) for m in _v1_mounts()) if os.path.isdir(p)]


def v1_runs() -> set[str]:
    """Run ids with a cgroup v1 leaf in any hierarchy (for ``gatewrap gc``)."""
    ids: set[str] = set()
    for mount in _v1_mounts():
        with contextlib.suppress(FileNotFoundError):
            ids |= {d for d in os.listdir(os.path.join(mount, PARENT_NAME)) if d.startswith("gw-")}
    return ids


def _v1_mounts(mounts_file: str = "/proc/self/mounts") -> list[str]:
    """Mount points of the cgroup v1 hierarchies of :data:`FLAGS`' controllers."""
    found = {v1_mount(c, mounts_file) for c in FLAGS}
    return sorted(m for m in found if m is not None)


def remove(run_id: str, timeout: float = 5.0) -> None:
    """Remove the run's cgroup v1 leaves (after its cgroup v2 leaf is empty, so normally
    they are too: the agent joined them from inside it). A task still listed in one is
    killed (cgroup v1 has no ``cgroup.kill``), then the removal is tried again for up to
    ``timeout`` seconds. Missing leaves are fine.

    Raises:
        SandboxError: a leaf is still busy after ``timeout``.
    """
    from ..errors import SandboxError

    deadline = time.monotonic() + timeout
    for leaf in v1_leaves(run_id):
        while True:
            try:
                os.rmdir(leaf)
                break
            except FileNotFoundError:
                break
            except OSError as e:
                if e.errno != errno.EBUSY:
                    raise SandboxError(f"cannot remove cgroup {leaf}: {e}") from e
            if time.monotonic() > deadline:
                raise SandboxError(f"cannot remove cgroup {leaf}: processes in it survived SIGKILL for {timeout:.0f} s")
            with contextlib.suppress(OSError), open(os.path.join(leaf, "cgroup.procs")) as f:
                for pid in f.read().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
            time.sleep(0.01)


def hits(leaf: str, run_id: str) -> dict[str, int]:
    """How often the run met its bounds, read before its cgroups are removed:
    ``pids_refused``, forks refused by a pids limit (``pids.events`` ``max``: in cgroup v1
    those of the leaf's own tasks, whichever limit refused them; in v2 ``pids.events.local``
    where the kernel has it), and ``oom_kills``, processes of the run the OOM killer ended
    (v1 ``memory.oom_control`` / v2 ``memory.events`` ``oom_kill``)."""
    out = {"pids_refused": 0, "oom_kills": 0}
    places = [leaf, *v1_leaves(run_id)]
    for path in places:
        for name, key, field_name in (("pids.events.local", "pids_refused", "max"),
                                      ("pids.events", "pids_refused", "max"),
                                      ("memory.events", "oom_kills", "oom_kill"),
                                      ("memory.oom_control", "oom_kills", "oom_kill")):
            value = _field(os.path.join(path, name), field_name)
            if value is not None:
                out[key] = max(out[key], value)
    return out


def _field(path: str, name: str) -> int | None:
    """The value of ``name`` in a flat-keyed cgroup file, or None (no such file or key)."""
    try:
        with open(path) as f:
            for line in f:
                k, _, v = line.partition(" ")
                if k == name:
                    return int(v)
    except (OSError, ValueError):
        return None
    return None
