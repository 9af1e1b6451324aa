"""cgroup v2 leaves for runs, under one ``gatewrap/`` parent.

Kernel doc: Documentation/admin-guide/cgroup-v2.rst. A cgroup's id, as
``bpf_get_current_cgroup_id()`` returns it, is the inode number of its directory.
"""

from __future__ import annotations

import errno
import os
import select
import time

from ..errors import SandboxError

PARENT_NAME = "gatewrap"


def cgroup2_mount(mounts_file: str = "/proc/self/mounts") -> str | None:
    """Mount point of the cgroup v2 hierarchy, read from ``/proc/self/mounts`` (proc(5)).

    Unified layouts mount it at /sys/fs/cgroup; hybrid ones (cgroup v1 controllers
    beside it) usually at /sys/fs/cgroup/unified. Returns None when not mounted.
    """
    with open(mounts_file) as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3 and parts[2] == "cgroup2":
                return parts[1].replace("\\040", " ")
    return None


def parent_dir() -> str:
    """Create (if needed) and return the ``gatewrap/`` parent cgroup directory.

    Raises:
        SandboxError: no cgroup v2 mount, or mkdir failed.
    """
    root = cgroup2_mount()
    if root is None:
        raise SandboxError(
            "no cgroup v2 hierarchy is mounted; mount one with "
            "'mount -t cgroup2 none /sys/fs/cgroup/unified' (see 'gatewrap doctor')"
        )
    path = os.path.join(root, PARENT_NAME)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise SandboxError(f"cannot create cgroup {path}: {e}") from e
    return path


def create_leaf(parent: str, run_id: str) -> tuple[str, int]:
    """Create the run's leaf cgroup; returns (directory, cgroup id).

    Raises:
        SandboxError: it exists already or mkdir failed.
    """
    path = os.path.join(parent, run_id)
    try:
        os.mkdir(path, 0o755)
    except OSError as e:
        raise SandboxError(f"cannot create cgroup {path}: {e}") from e
    return path, os.stat(path).st_ino


def populated(path: str) -> bool:
    """Whether any process is in the cgroup or below (``cgroup.events`` ``populated``)."""
    try:
        fd = os.open(os.path.join(path, "cgroup.events"), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        return populated_fd(fd)
    finally:
        os.close(fd)


def has_unseen(path: str) -> bool:
    """Whether the cgroup holds a process outside this process's pid namespace: its
    ``cgroup.procs`` lists such a process as pid 0 (the pid it has here; task_pid_vnr(),
    kernel/cgroup/cgroup.c), as a gatewrap in a child pid namespace sees the host's agents.
    False for a cgroup that is gone."""
    try:
        with open(os.path.join(path, "cgroup.procs"), "rb") as f:
            return any(line.strip() == b"0" for line in f)
    except FileNotFoundError:
        return False


def kill(path: str, timeout: float = 5.0) -> None:
    """SIGKILL every process in the cgroup (``cgroup.kill``) and wait until it is empty.

    The wait is on ``cgroup.events`` itself: a change of its values wakes a poll(2) for
    POLLPRI (Documentation/admin-guide/cgroup-v2.rst, "cgroup.events"; kernfs_notify), so the
    run's end follows its last process's exit at once instead of at the next 10 ms tick.
    A kill is written again every 10 ms meanwhile (a process forked during the first one).

    Raises:
        SandboxError: processes remain after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    try:
        events = os.open(os.path.join(path, "cgroup.events"), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        poller = select.poll()
        poller.register(events, select.POLLPRI)
        while True:
            try:
                with open(os.path.join(path, "cgroup.kill"), "w") as f:
                    f.write("1")
            except FileNotFoundError:
                return
            if not populated_fd(events):
                return
            if time.monotonic() > deadline:
                raise SandboxError(f"processes in {path} survived cgroup.kill for {timeout:.0f} s")
            poller.poll(10)
    finally:
        os.close(events)


def wait_empty(path: str, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for cgroup ``path`` to hold no process (``cgroup.events``
    ``populated 0``, woken by its POLLPRI as :func:`kill` is); whether it does (a cgroup
    that is gone does)."""
    deadline = time.monotonic() + timeout
    try:
        events = os.open(os.path.join(path, "cgroup.events"), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    try:
        poller = select.poll()
        poller.register(events, select.POLLPRI)
        while populated_fd(events):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            poller.poll(min(left, 1.0) * 1000)
        return True
    finally:
        os.close(events)


def populated_fd(fd: int) -> bool:
    """``populated`` of an open ``cgroup.events`` (read again from its start)."""
    for line in os.pread(fd, 4096, 0).decode().splitlines():
        k, _, v = line.partition(" ")
        if k == "populated":
            return v.strip() == "1"
    return False


def kill_and_remove(path: str, timeout: float = 5.0) -> None:
    """Kill every process in the cgroup (``cgroup.kill``, SIGKILL) and remove it.

    Waits up to ``timeout`` seconds for the cgroup to empty. Missing cgroups are fine.

    Raises:
        SandboxError: the cgroup still has processes after ``timeout`` or rmdir failed.
    """
    if not os.path.isdir(path):
        return
    kill(path, timeout)
    for _ in range(100):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno != errno.EBUSY:
                raise SandboxError(f"cannot remove cgroup {path}: {e}") from e
            time.sleep(0.01)
    raise SandboxError(f"cannot remove cgroup {path}: still busy")


def list_leaves(parent: str) -> list[str]:
    """Names of the run leaves under the parent (``gw-*``)."""
    try:
        return sorted(d for d in os.listdir(parent) if d.startswith("gw-"))
    except FileNotFoundError:
        return []
