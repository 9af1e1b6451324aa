"""Which runs are alive: each run holds an exclusive flock(2) on ``/run/gatewrap/runs/<run-id>.lock``.

The kernel drops the lock when the gatewrap process dies, however it dies (SIGKILL
included), so a sandbox whose lock can be taken has no owner and is stale.
"""

from __future__ import annotations

import fcntl
import json
import os

RUNS_DIR = "/run/gatewrap/runs"


def lock_path(run_id: str) -> str:
    """Path of a run's lock file."""
    return os.path.join(RUNS_DIR, f"{run_id}.lock")


def claim(run_id: str, audit_log: str) -> int:
    """Create and lock the run's lock file, recording where its audit log is (for
    :func:`audit_log_of` after a crash); returns the fd (close it to release).

    The fd is close-on-exec, so the agent never inherits it.
    """
    os.makedirs(RUNS_DIR, mode=0o755, exist_ok=True)
    # Locked under a private name, then renamed into place: a lock file that gc can see is
    # always already held, so gc never mistakes a starting run for a dead one.
    tmp = os.path.join(RUNS_DIR, f".{run_id}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, json.dumps({"audit_log": os.path.abspath(audit_log), "pid": os.getpid()}).encode())
    os.rename(tmp, lock_path(run_id))
    return fd


def audit_log_of(run_id: str) -> str | None:
    """The audit log a (dead) run was writing to, from its lock file; None if unknown."""
    try:
        with open(lock_path(run_id)) as f:
            return json.load(f).get("audit_log")
    except (OSError, ValueError, AttributeError):
        return None


def release(run_id: str, fd: int) -> None:
    """Remove the lock file and release the lock."""
    try:
        os.unlink(lock_path(run_id))
    except FileNotFoundError:
        pass
    os.close(fd)


def alive(run_id: str) -> bool:
    """Whether a gatewrap process still owns ``run_id``."""
    try:
        fd = os.open(lock_path(run_id), os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
