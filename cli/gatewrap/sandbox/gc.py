"""Find and remove sandboxes whose gatewrap died (``gatewrap gc``, and at every run's start).

Only what this gatewrap can prove dead: the cgroup parent is the kernel's, shared by every
install on it (a chroot's, a container's gatewrap sees the host's leaves), while the run
registry and the pids are this install's. A leaf with no lock file in this registry, or
whose owner another pid namespace holds, is left alone, and said (:func:`sort_runs`)."""

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
    #: Runs whose gatewrap this one cannot prove dead, left alone: (run id, why).
    left: list[tuple[str, str]] = field(default_factory=list)
    #: Runs of live containers whose daemon died, left for a daemon of its socket to take
    #: back (gatewrap.oci.runs.take_back_all): (run id, that socket).
    containers: list[tuple[str, str]] = field(default_factory=list)
    #: What killed daemons left beside their sockets, removed by ``gatewrap gc`` (not by
    #: :func:`collect`): the paths of each socket (:func:`gatewrap.shared.lockfile.sweep`).
    dead_daemons: list[list[str]] = field(default_factory=list)


#: Where a run's approvals wake socket lives, ``<this>/<run id>/control.sock``
#: (gate_core/src/approvals/wake.rs: removed when its gate is dropped, so left by one killed).
WAKE_DIRS = "/run/gatewrap"


def stale_runs(parent: str) -> list[str]:
    """Run ids with a cgroup (v2, or v1: :func:`limits.v1_runs`), a lock file, a wake socket's folder or a named netns (older
    versions') whose gatewrap is proven dead (:func:`sort_runs`)."""
    return sort_runs(parent)[0]


def sort_runs(parent: str) -> tuple[list[str], list[tuple[str, str]]]:
    """The runs under ``parent`` and in this registry that no gatewrap process holds, sorted
    in two: (run ids whose gatewrap is proven dead, [(run id, why it cannot be judged
    here)]). Runs whose lock is held are in neither."""
    ids = set(cgroup.list_leaves(parent)) | set(netns.list_named()) | limits.v1_runs()
    with contextlib.suppress(FileNotFoundError):
        ids |= {f[: -len(".lock")] for f in os.listdir(registry.RUNS_DIR)
                if f.endswith(".lock") and not f.startswith(".")}  # as registry.live(): a dot file names no run
    with contextlib.suppress(FileNotFoundError):
        ids |= {d for d in os.listdir(WAKE_DIRS) if d.startswith("gw-") and os.path.isdir(os.path.join(WAKE_DIRS, d))}
    stale, left = [], []
    for run_id in sorted(ids):
        if registry.alive(run_id):
            continue
        why = _not_ours(parent, run_id)
        if why is None:
            stale.append(run_id)
        else:
            left.append((run_id, why))
    return stale, left


def _not_ours(parent: str, run_id: str) -> str | None:
    """Why the death of ``run_id``'s gatewrap, whose lock is free, cannot be proven here;
    None when it is proven."""
    leaf = os.path.join(parent, run_id)
    if not os.path.exists(registry.lock_path(run_id)):
        # A run's lock file is made before its leaf and removed after it (the undo order of
        # runner.Sandbox; collect's): a leaf there now without one is another registry's.
        # Without a leaf, what is left is in this install's own folders (a wake folder, an
        # older version's named netns): ours.
        if os.path.isdir(leaf):
            return "not started by this gatewrap's registry (another install on this kernel?)"
        return None
    got = registry.info(run_id)
    why = registry.unproven(run_id, got)
    if why is not None:
        return why
    if cgroup.has_unseen(leaf):
        return "its cgroup holds processes outside this gatewrap's pid namespace (another install on this kernel?)"
    if registry.saved(run_id) is None and (pid := registry.owner_lives(got)) is not None:
        return f"its gatewrap (pid {pid}) still runs, though it holds no lock"
    return None


def collect(parent: str, salvage: Callable[[str, int], None] | None = None,
            keep: Container[str] = (), waiting_for: str | None = None) -> Collected:
    """Kill and remove every stale sandbox under ``parent`` (proven dead: :func:`sort_runs`;
    those it cannot judge are in the result's ``left``), but those in ``keep`` and the
    shared-mode runs whose daemon died and whose waiter still lives (:func:`registry.waiter_alive`)
    or whose container (gatewrap-oci) still has a process in its cgroup, unless they wait for
    the daemon of socket ``waiting_for``: they wait, without egress, for a
    daemon of their socket to take them back, and only that daemon knows how long to wait (its
    take-back window); a gc, a run of its own or a daemon of another socket started meanwhile
    must not kill their agents.

    Args:
        parent: the ``gatewrap/`` cgroup directory.
        salvage: called with (run id, cgroup id, None when its cgroup is gone already) once
            the sandbox's processes are dead and before its cgroup and lock file are removed:
            records what its ring buffer still holds, closes the run with a ``run_end`` if
            it started and has none, and drops its BPF map entries (None: leave them; they
            match no live cgroup).
        keep: stale runs to leave alone (a restarted daemon's, waiting for their clients).
        waiting_for: the socket path of the daemon collecting: also remove the runs whose
            waiter lives and waits for it (at its start, those it cannot take back; once its
            window is over, those that did not come back); None: remove none of them.
    """
    stale, left = sort_runs(parent)
    out = Collected(left=left)
    for run_id in stale:
        if run_id in keep:
            continue
        state = registry.saved(run_id)
        waiter = None if state is None else registry.waiter_alive(run_id, state)
        if waiter is not None and (waiting_for is None or state.get("socket") != waiting_for):
            out.waiting.append((run_id, waiter))
            continue
        leaf = os.path.join(parent, run_id)
        if (state is not None and state.get("container") and cgroup.populated(leaf)
                and (waiting_for is None or state.get("socket") != waiting_for)):
            out.containers.append((run_id, str(state.get("socket"))))
            continue
        try:
            cgroup_id = None
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


def left_line(run_id: str, why: str) -> str:
    """What is said of a run :func:`collect` left alone."""
    return f"left {run_id} alone: {why}"


#: Lines a run's start or a daemon says of each kind (removed, left alone) before the rest
#: are one line with their count: a host with thousands of another install's sandboxes
#: (or of dead runs) must not fill the caller's terminal or its stderr pipe.
MAX_SAID = 8


def said_of(collected: Collected) -> list[str]:
    """What a run's start or a daemon's start says of ``collected`` (without the
    ``gatewrap:`` prefix): each stale sandbox removed, each left alone that no one said yet
    (:func:`untold`), at most :data:`MAX_SAID` lines of each kind, then one line with the
    number of the others (``gatewrap gc --json`` lists every one)."""
    removed = [f"removed stale sandbox {run_id} (its gatewrap had died)" for run_id in collected.runs]
    left = [left_line(run_id, why) for run_id, why in untold(collected.left)]
    out = removed[:MAX_SAID]
    if len(removed) > MAX_SAID:
        out.append(f"removed {len(removed) - MAX_SAID} more stale sandboxes (their gatewrap had died)")
    out += left[:MAX_SAID]
    if len(left) > MAX_SAID:
        out.append(f"left {len(left) - MAX_SAID} more sandboxes alone: not started by this gatewrap's registry "
                   "(gatewrap gc --json lists them)")
    return out


def untold(left: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Those of ``left`` (:attr:`Collected.left`) that no run's start or daemon of this
    registry said yet: each is said once (a marker ``.left-RUN`` in the registry's folder,
    dropped once the run is no longer left), not at every run's start. ``gatewrap gc``
    says them all."""
    now = {run_id for run_id, _ in left}
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(registry.RUNS_DIR):
            if name.startswith(".left-") and name[len(".left-"):] not in now:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(registry.RUNS_DIR, name))
    out = []
    for run_id, why in left:
        try:
            os.close(os.open(os.path.join(registry.RUNS_DIR, f".left-{run_id}"), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
        except FileExistsError:
            continue
        except FileNotFoundError:
            pass  # no registry folder yet: said, and said again next time
        out.append((run_id, why))
    return out
