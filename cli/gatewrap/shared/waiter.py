"""The native waiter, ``gatewrap-wait``: the agent's parent once the client has spawned it.

In the shared mode ``gatewrap run`` is a thin client: it asks the daemon for a sandbox, spawns
the agent (``core.spawn_agent``, fork + pre-exec join) and then replaces itself with the
waiter through execve(2). Being the same process, the waiter is still the agent's parent: the
children, the signal mask, pending signals and PR_SET_CHILD_SUBREAPER survive the exec
(prctl(2), execve(2)), while the interpreter's 3.4 MB of private memory go. The waiter
forwards SIGINT/SIGTERM/SIGHUP/SIGQUIT to the jail's init, reaps orphans, kills the run's
cgroup at the timeout (exit code 124), writes ``exit CODE`` to the control socket, copies the
daemon's answer (the run's summary line) to stderr and exits with the agent's code
(``gatewrap-wait --help``; the crate ``gate_wait/``).

Before calling :func:`exec_waiter` the client must have become a subreaper and blocked
SIGINT, SIGTERM, SIGHUP, SIGQUIT and SIGCHLD (as before the spawn), so that no signal is
lost or acted on between the spawn and the waiter's signalfd.
"""

from __future__ import annotations

import os
import sys
#: typing is not imported (~3 ms of every shared run's client start): annotations only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NoReturn

from ..errors import GatewrapError

#: Timeouts from this many seconds on (``inf`` included, which ``--timeout`` takes) are no
#: timeout: the waiter's clock (a Rust Duration, a timerfd) holds no more, and a run of its
#: own never reaches them either (a thousand years).
MAX_TIMEOUT = 1000 * 365.25 * 86400

#: The waiter's file name: scripts/setup.sh installs it beside the virtualenv's interpreter.
NAME = "gatewrap-wait"


def find() -> str | None:
    """The path of the ``gatewrap-wait`` executable: the one beside ``sys.executable`` (the
    virtualenv's ``bin/``, where scripts/setup.sh installs it), else the first on ``PATH``;
    None when there is none."""
    beside = os.path.join(os.path.dirname(sys.executable), NAME)
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        return beside
    import shutil  # not at the top: it imports bz2, lzma and fnmatch, on every shared run's path

    return shutil.which(NAME)


def argv(path: str, pid: int, control_fd: int, timeout: float | None, cgroup_dir: str,
         resume: tuple[str, str] | None = None) -> list[str]:
    """The waiter's command line (see :func:`exec_waiter` for the arguments)."""
    args = [path, "--pid", str(pid), "--control-fd", str(control_fd), "--cgroup", cgroup_dir]
    if resume is not None:
        args += ["--socket", resume[0], "--run", resume[1]]
    if timeout is not None and float(timeout) < MAX_TIMEOUT:
        # repr: the shortest text that reads back as the same float (no rounding, unlike %g)
        args += ["--timeout", repr(float(timeout))]
    return args


def exec_waiter(pid: int, control_fd: int, timeout: float | None, cgroup_dir: str,
                resume: tuple[str, str] | None = None) -> NoReturn:
    """Replace this process with ``gatewrap-wait``, which waits for the agent ``pid``.

    Args:
        pid: the agent's process (the jail's init, or the agent's without a jail), a child of this
            process.
        control_fd: a connected unix stream socket to the daemon; it is made inheritable
            (FD_CLOEXEC cleared) so that it survives the exec. The daemon receives
            ``exit CODE\\n`` on it when the agent has exited, and what it answers goes to stderr.
        timeout: seconds (fractions allowed) after which the run's cgroup is killed and the
            exit code is 124; None (or :data:`MAX_TIMEOUT` and more) for no limit. Counted from the waiter's start.
        cgroup_dir: the run's cgroup v2 directory (``cgroup.kill`` is written there at the
            timeout).
        resume: (the daemon's socket path, the run's id): should the daemon die, the waiter
            asks a restarted one to take the run back (``resume RUN_ID``, see
            :mod:`gatewrap.shared.protocol`); None: it does not.

    Never returns: the process becomes the waiter and exits with the agent's exit code (or
    124 at the timeout, 125 if the waiter itself fails). Python's buffered stdout and stderr
    are flushed first; nothing else of the interpreter (atexit, finally blocks) runs.

    Raises:
        GatewrapError: no ``gatewrap-wait`` is installed, ``cgroup_dir`` is empty, ``control_fd`` is not open, or
            execve(2) failed; this process is unchanged then (it is still the agent's parent).
    """
    if not cgroup_dir:
        raise GatewrapError(f"{NAME} needs the run's cgroup directory (empty cgroup_dir)")
    path = find()
    if path is None:
        raise GatewrapError(
            f"{NAME} is not installed (beside {sys.executable} or on PATH); "
            "install it with: sudo scripts/setup.sh install")
    try:
        os.set_inheritable(control_fd, True)
    except OSError as e:
        raise GatewrapError(f"the control socket (fd {control_fd}) cannot be passed to {NAME}: {e}") from e
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass  # a closed or missing stream has nothing to lose
    try:
        os.execv(path, argv(path, pid, control_fd, timeout, cgroup_dir, resume))
    except OSError as e:
        raise GatewrapError(f"cannot run {path}: {e}") from e
