"""Which runs are alive: each run holds an exclusive flock(2) on ``/run/gatewrap/runs/<run-id>.lock``.

The kernel drops the lock when the gatewrap process dies, however it dies (SIGKILL
included), so a sandbox whose lock can be taken has no owner and is stale, if the lock file
is the one its gatewrap locked and its owner is one this gatewrap can see
(:func:`unproven`): another install on the same kernel (a chroot, a container) keeps
registries and pids of its own, and its runs are not ours to judge.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from typing import Any

from ..procstat import pid_view, ppid_and_start

RUNS_DIR = "/run/gatewrap/runs"


def _name(run_id: str) -> str:
    """``run_id`` if it can name a file of :data:`RUNS_DIR` (no ``/``, no NUL, not empty, not
    a dot file); a name typed at the CLI is checked here, where every path of a run is made, so
    that ``gatewrap stop ../../tmp/X`` never reads a lock file a local user planted.

    Raises:
        ValueError: any other name (the readers below take it as no run).
    """
    if not run_id or "/" in run_id or "\0" in run_id or run_id.startswith("."):
        raise ValueError(f"not a run id: {run_id!r}")
    return run_id


def lock_path(run_id: str) -> str:
    """Path of a run's lock file. Raises ValueError for a name that is no file name (:func:`_name`)."""
    return os.path.join(RUNS_DIR, f"{_name(run_id)}.lock")


def claim(run_id: str, audit_log: str, pid: int | None = None, since: dict[str, Any] | None = None) -> int:
    """Create and lock the run's lock file; returns the fd (close it to release).

    The file holds ``{"audit_log", "audit_offset", "audit_dev", "audit_ino", "pid", "pid_start",
    "pid_view", "registry", "started"}``: where the run's audit log is (for gc's ``run_end``
    after a crash), its size in bytes now and the file's device and inode (the run's records all
    come after that point, so ``gatewrap ps`` reads from there, through the log's rotations
    since), the pid of the run's gatewrap (``gatewrap stop`` signals it; ``pid``, default this
    process: the shared mode's daemon names the client), that process's start time (clock ticks
    since boot, :func:`process_started`), the pid namespace those pids are numbered in
    (:func:`gatewrap.procstat.pid_view`; None if this /proc is another namespace's), the
    registry folder's ``[st_dev, st_ino]`` (:func:`identity`) and the time (Unix seconds).
    :func:`unproven` reads them before a gc removes the run. The fd is close-on-exec, so the agent never
    inherits it. ``since``: the run's earlier lock file (:func:`info`; a run a restarted
    daemon takes back), whose audit position and start time are kept, so ``ps`` still reads
    the run's records from its ``run_start``.
    """
    os.makedirs(RUNS_DIR, mode=0o755, exist_ok=True)
    # Locked under a private name, then renamed into place: a lock file that gc can see is
    # always already held, so gc never mistakes a starting run for a dead one.
    tmp = os.path.join(RUNS_DIR, f".{run_id}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        st = os.stat(audit_log)
        offset, dev, ino = st.st_size, st.st_dev, st.st_ino
    except OSError:
        offset, dev, ino = 0, None, None
    owner = os.getpid() if pid is None else pid
    state = {"audit_log": os.path.abspath(audit_log), "audit_offset": offset, "audit_dev": dev, "audit_ino": ino,
             "pid": owner, "pid_start": process_started(owner), "pid_view": pid_view(), "registry": identity(),
             "started": time.time()}
    if since is not None and since.get("audit_log") == state["audit_log"]:
        state.update({k: since[k] for k in ("audit_offset", "audit_dev", "audit_ino", "started") if k in since})
    os.write(fd, json.dumps(state).encode())
    os.rename(tmp, lock_path(run_id))
    return fd


def saved_path(run_id: str) -> str:
    """Path of what the shared mode's daemon keeps of a run to take it back after a restart.
    Raises ValueError for a name that is no file name (:func:`_name`)."""
    return os.path.join(RUNS_DIR, f"{_name(run_id)}.json")


def save(run_id: str, state: dict[str, Any]) -> None:
    """Keep ``state`` (JSON) for run ``run_id`` until :func:`forget`: root's alone (0600; it
    holds the run's options and environment), replaced atomically (rename(2))."""
    tmp = os.path.join(RUNS_DIR, f".{run_id}.json.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(state, f)
    os.rename(tmp, saved_path(run_id))


def saved(run_id: str) -> dict[str, Any] | None:
    """What :func:`save` kept for ``run_id``; None if nothing (or something unreadable)."""
    try:
        with open(saved_path(run_id)) as f:
            got = json.load(f)
    except (OSError, ValueError):
        return None
    return got if isinstance(got, dict) else None


def forget(run_id: str) -> None:
    """Drop what :func:`save` kept for ``run_id`` (nothing if there is none)."""
    try:
        os.unlink(saved_path(run_id))
    except FileNotFoundError:
        pass


def process_started(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (``starttime``, field 22 of
    /proc/PID/stat, proc(5)); None if there is no such process. With the pid it names one
    process: a pid reused later has another start time. Ticks since boot, not a wall-clock
    time (psutil's create_time adds the boot time, which moves with a step of the clock)."""
    stat = ppid_and_start(pid)
    return None if stat is None else stat[1]


def waiter_alive(run_id: str, state: dict[str, Any] | None = None) -> int | None:
    """The pid of a shared-mode run's waiter (its client, the agent's parent) if that very
    process still lives (the pid and start time :func:`save` kept); None otherwise or for a
    run the daemon did not save. ``state``: what :func:`saved` gave, if the caller read it."""
    got = saved(run_id) if state is None else state
    return None if got is None else _same_process(got.get("owner_pid"), got.get("owner_starttime"))


def _same_process(pid: Any, started: Any) -> int | None:
    """``pid`` if that very process lives here: its start time (clock ticks since boot,
    proc(5) /proc/PID/stat field 22) is ``started``; None otherwise or for values that are
    not a positive pid and an int."""
    if not isinstance(pid, int) or pid <= 0 or not isinstance(started, int):
        return None
    return pid if process_started(pid) == started else None


def info(run_id: str) -> dict[str, Any] | None:
    """What :func:`claim` wrote in the run's lock file; None if there is none or it is unreadable."""
    try:
        with open(lock_path(run_id)) as f:
            got = json.load(f)
    except (OSError, ValueError):
        return None
    return got if isinstance(got, dict) else None


def live() -> list[str]:
    """Ids of the runs a gatewrap process owns now, sorted: its lock is held, or it is a
    shared-mode run whose daemon died and whose waiter waits for the next (:func:`waiter_alive`)."""
    try:
        names = os.listdir(RUNS_DIR)
    except FileNotFoundError:
        return []
    return sorted(i for i in (n[: -len(".lock")] for n in names if n.endswith(".lock") and not n.startswith("."))
                  if owned(i))


def owned(run_id: str) -> bool:
    """Whether a gatewrap process still owns ``run_id``: it holds the run's lock (:func:`alive`),
    or the run's daemon died and its waiter, whose pid the lock file names, still waits."""
    return alive(run_id) or waiter_alive(run_id) is not None


def release(run_id: str, fd: int) -> None:
    """Remove the lock file (and what :func:`save` kept) and release the lock."""
    forget(run_id)
    try:
        os.unlink(lock_path(run_id))
    except FileNotFoundError:
        pass
    os.close(fd)


def identity() -> list[int] | None:
    """``[st_dev, st_ino]`` of this registry's folder (None if there is none yet): a lock file
    read through another mount of another file system (an overlay's copy of a host's
    /run, whose flock(2) is not the host's) names a registry other than this one."""
    try:
        st = os.stat(RUNS_DIR)
    except FileNotFoundError:
        return None
    return [st.st_dev, st.st_ino]


def unproven(run_id: str, got: dict[str, Any] | None) -> str | None:
    """Why this gatewrap cannot tell whether the owner of ``run_id``, whose lock is free,
    is dead (a clause for "left RUN alone: ..."); None when it can: the lock file ``got``
    (:func:`info`) was written through this registry and names an owner in the pid
    namespace this /proc shows. A lock file of an older version, without these fields, is
    judged by its lock alone, as that version did."""
    if got is None:
        return None
    if "registry" in got and got["registry"] != identity():
        return "its registry entry was written through another mount of " + RUNS_DIR + " (another install on this kernel?)"
    if "pid_view" in got and (got["pid_view"] is None or got["pid_view"] != pid_view()):
        return (f"its gatewrap (pid {got.get('pid')} there) is in another pid namespace than this gatewrap's: "
                "only a gatewrap there can tell whether it lives")
    return None


def owner_lives(got: dict[str, Any] | None) -> int | None:
    """The pid of the owner a lock file ``got`` names if that very process (pid and start
    time) lives in this pid namespace; None otherwise, or for a lock file without a start
    time (an older version's). Call it only where :func:`unproven` said None."""
    return None if got is None else _same_process(got.get("pid"), got.get("pid_start"))


def alive(run_id: str) -> bool:
    """Whether a gatewrap process still owns ``run_id``: its lock is held. The lock file is
    opened read-only (flock(2) needs no more): opening an overlay's lower file for writing
    would copy it up, and the copy's lock is never held."""
    try:
        fd = os.open(lock_path(run_id), os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, ValueError):
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
