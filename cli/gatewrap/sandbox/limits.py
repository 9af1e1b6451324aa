"""Resource limits of a run: cgroup v2 ``memory.max``, ``cpu.max`` and ``pids.max`` on its leaf.

Kernel doc: Documentation/admin-guide/cgroup-v2.rst ("Memory", "CPU", "PID"). A
controller must be listed in the hierarchy root's ``cgroup.controllers`` and enabled in
``cgroup.subtree_control`` of every ancestor of the leaf; hybrid layouts (cgroup v1
controllers beside an empty cgroup v2 tree, as on these VMs) have none to give.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import GatewrapError
from ..sizes import parse_size  # noqa: F401 (its home before gatewrap.sizes: callers import it from here)
from .cgroup import cgroup2_mount

#: cpu.max period in microseconds (the kernel's default).
CPU_PERIOD_US = 100_000


@dataclass(frozen=True)
class Limits:
    """``memory`` in bytes, ``cpus`` in CPUs (0.5 = half of one), ``pids`` in tasks; None = no limit."""

    memory: int | None = None
    cpus: float | None = None
    pids: int | None = None

    def controllers(self) -> list[str]:
        """The cgroup v2 controllers these limits need."""
        return [c for c, v in (("memory", self.memory), ("cpu", self.cpus), ("pids", self.pids)) if v is not None]


def _enable(path: str, controller: str) -> None:
    with open(os.path.join(path, "cgroup.subtree_control")) as f:
        if controller in f.read().split():
            return
    with open(os.path.join(path, "cgroup.subtree_control"), "w") as f:
        f.write(f"+{controller}")


def apply(leaf: str, limits: Limits) -> None:
    """Set the limits on the run's ``leaf``, enabling the controllers on its ancestors.

    Raises:
        GatewrapError: a controller is not available here, or writing a limit failed.
    """
    needed = limits.controllers()
    if not needed:
        return
    root = cgroup2_mount() or "/sys/fs/cgroup"
    with open(os.path.join(root, "cgroup.controllers")) as f:
        available = f.read().split()
    missing = [c for c in needed if c not in available]
    if missing:
        flags = {"memory": "--memory", "cpu": "--cpus", "pids": "--pids"}
        raise GatewrapError(
            f"{' and '.join(flags[c] for c in missing)} cannot be enforced here: this machine's cgroup v2 "
            f"hierarchy ({root}) does not offer the {', '.join(missing)} controller{'s' if len(missing) > 1 else ''} "
            f"(it has: {', '.join(available) or 'none'}; a hybrid layout keeps them in cgroup v1). Boot with "
            "systemd.unified_cgroup_hierarchy=1, or run without those options."
        )
    try:
        ancestors = []
        p = os.path.dirname(leaf)
        while len(p) >= len(root):
            ancestors.append(p)
            p = os.path.dirname(p)
        for path in reversed(ancestors):
            for c in needed:
                _enable(path, c)
        if limits.memory is not None:
            _write(leaf, "memory.max", str(limits.memory))
            _write(leaf, "memory.swap.max", "0")
        if limits.cpus is not None:
            _write(leaf, "cpu.max", f"{max(1000, int(limits.cpus * CPU_PERIOD_US))} {CPU_PERIOD_US}")
        if limits.pids is not None:
            _write(leaf, "pids.max", str(limits.pids))
    except OSError as e:
        raise GatewrapError(f"setting the run's resource limits failed: {e}") from e


def _write(leaf: str, name: str, value: str) -> None:
    path = os.path.join(leaf, name)
    if name == "memory.swap.max" and not os.path.exists(path):
        return  # kernels without swap accounting
    with open(path, "w") as f:
        f.write(value)
