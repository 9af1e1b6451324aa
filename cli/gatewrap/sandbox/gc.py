"""Find and remove sandboxes whose gatewrap died (``gatewrap gc``, and at every run's start)."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
from collections.abc import Callable, Container
from dataclasses import dataclass, field

from ..errors import SandboxError
from ..shims import STAGED_ROOT
from . import cgroup, limits, netns, registry


@dataclass
class Collected:
    """What :func:`collect` removed: run ids, and errors that left something behind;
    ``waiting``: shared-mode runs left alone, their daemon dead but their waiter alive
    (run id, the waiter's pid)."""

    runs: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    waiting: list[tuple[str, int]] = field(default_factory=list)


#: Where a run's approvals wake socket lives, ``<this>/<run id>/control.sock``
#: (gate_core/src/approvals/wake.rs: removed when its gate is dropped, so left by one killed).
WAKE_DIRS = "/run/gatewrap"


def stale_runs(parent: str) -> list[str]:
    """Run ids with a cgroup (v2, or v1: :func:`limits.v1_runs`), a lock file, a wake socket's folder or a named netns (older
    versions') but no live gatewrap process."""
    ids = set(cgroup.list_leaves(parent)) | set(netns.list_named()) | limits.v1_runs()
    with contextlib.suppress(FileNotFoundError):
        ids |= {f[: -len(".lock")] for f in os.listdir(registry.RUNS_DIR) if f.endswith(".lock")}
    with contextlib.suppress(FileNotFoundError):
        ids |= {d for d in os.listdir(WAKE_DIRS) if d.startswith("gw-") and os.path.isdir(os.path.join(WAKE_DIRS, d))}
    return sorted(i for i in ids if not registry.alive(i))


def collect(parent: str, salvage: Callable[[str, int], None] | None = None,
            keep: Container[str] = (), waiting_for: str | None = None) -> Collected:
    """Kill and remove every stale sandbox under ``parent``, but those in ``keep`` and the
    shared-mode runs whose daemon died and whose waiter still lives (:func:`registry.waiter_alive`),
    unless they wait for the daemon of socket ``waiting_for``: they wait, without egress, for a
    daemon of their socket to take them back, and only that daemon knows how long to wait (its
    take-back window); a gc, a run of its own or a daemon of another socket started meanwhile
    must not kill their agents.

    Args:
        parent: the ``gatewrap/`` cgroup directory.
        salvage: called with (run id, cgroup id) once the sandbox's processes are dead and
            before its cgroup is removed: records what its ring buffer still holds and drops
            its BPF map entries (None: leave them; they match no live cgroup).
        keep: stale runs to leave alone (a restarted daemon's, waiting for their clients).
        waiting_for: the socket path of the daemon collecting: also remove the runs whose
            waiter lives and waits for it (at its start, those it cannot take back; once its
            window is over, those that did not come back); None: remove none of them.
    """
    out = Collected()
    for run_id in stale_runs(parent):
        if run_id in keep:
            continue
        state = registry.saved(run_id)
        waiter = None if state is None else registry.waiter_alive(run_id, state)
        if waiter is not None and (waiting_for is None or state.get("socket") != waiting_for):
            out.waiting.append((run_id, waiter))
            continue
        leaf = os.path.join(parent, run_id)
        try:
            if os.path.isdir(leaf):
                cgroup_id = os.stat(leaf).st_ino
                cgroup.kill(leaf)
                if salvage is not None:
                    salvage(run_id, cgroup_id)
            cgroup.kill_and_remove(leaf)
            limits.remove(run_id)
            netns.remove_named(run_id)
            for staged in glob.glob(os.path.join(STAGED_ROOT, f"{run_id}-*")):
                shutil.rmtree(staged, ignore_errors=True)
            shutil.rmtree(os.path.join(WAKE_DIRS, run_id), ignore_errors=True)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(registry.lock_path(run_id))
            registry.forget(run_id)
            out.runs.append(run_id)
        except SandboxError as e:
            out.errors.append(f"{run_id}: {e}")
    return out
