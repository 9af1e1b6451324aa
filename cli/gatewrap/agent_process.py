"""The agent's process, from the side of its parent: spawn it into its sandbox, wait for it
while forwarding signals and reaping orphans, and its exit code. Light on imports: the
shared mode's thin client uses it without the runner."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import resource
import signal
import time
#: typing is not imported (~3 ms of every shared run's client start): annotations only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, TextIO

from .errors import EXIT_CANNOT_EXEC, EXIT_NOT_FOUND, EXIT_TIMEOUT, GatewrapError
from .sandbox import cgroup

#: Signals forwarded to the agent, which runs in a session of its own (no controlling
#: terminal), so Ctrl-C reaches it only through gatewrap.
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
PR_SET_DUMPABLE = 4  # prctl(2)
PR_SET_CHILD_SUBREAPER = 36
#: oom_score_adj (proc(5), -1000..1000) of gatewrap's own processes: a run's gatewrap (its
#: gate), the shared mode's daemon and waiter. Protected from the OOM killer's choice, not
#: exempt (-1000 would be): a leak of gatewrap's own can still be stopped.
GATEWRAP_OOM_SCORE_ADJ = -900
#: The agent's, set by the launcher before its exec and inherited by all it starts: under
#: memory pressure the kernel ends an agent's process before any host process. The agent
#: cannot lower it where gatewrap has CAP_SYS_RESOURCE (the launcher's write as root then sets
#: the floor too, fs/proc/base.c __set_oom_adj); without it, down to gatewrap's own floor.
AGENT_OOM_SCORE_ADJ = 1000


def _exit_code(status: int) -> int:
    """Shell convention: the exit code, or 128 + signal number."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.waitstatus_to_exitcode(status)


def become_subreaper() -> None:
    """Make orphans of the agent's tree our children (PR_SET_CHILD_SUBREAPER, prctl(2)), so we reap them."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise GatewrapError(f"prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(ctypes.get_errno())}")


def no_core_dumps() -> None:
    """Never dump this process's memory: PR_SET_DUMPABLE 0 (prctl(2)), so a crash leaves no
    core with the secrets it holds, and /proc/PID/mem and environ are root's alone. Not
    inherited across execve(2) (the agent's own limits are unchanged).

    Raises:
        GatewrapError: the prctl failed.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise GatewrapError(f"prctl(PR_SET_DUMPABLE) failed: {os.strerror(ctypes.get_errno())}")


def reap(pid: int) -> int | None:
    """Reap every exited child; returns the wait status of ``pid`` if it was among them."""
    found = None
    while True:
        try:
            got, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return found
        if got == 0:
            return found
        if got == pid:
            found = status


def wait_forwarding_signals(pid: int, timeout: float | None, leaf: str, err: TextIO,
                            on_hup: Callable[[], None] | None = None) -> int:
    """Wait for the agent, forwarding signals to it and reaping orphans; returns its exit code.

    After ``timeout`` seconds the whole tree is killed and the code is 124 (as timeout(1)).
    SIGHUP calls ``on_hup`` (the run's own gatewrap: reload, :func:`gatewrap.reload.on_sighup`)
    instead of reaching the agent; without one it is forwarded as the others are.
    """
    waitset = set(FORWARDED) | {signal.SIGCHLD}
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        status = reap(pid)
        if status is not None:
            return _exit_code(status)
        if deadline is not None and time.monotonic() >= deadline:
            print(f"gatewrap: --timeout {timeout:g} s reached: killing the agent and its children", file=err)
            cgroup.kill(leaf)  # removed by the run's end, once its folded denials are counted
            while reap(pid) is None:
                time.sleep(0.01)
            return EXIT_TIMEOUT
        wait = 0.5 if deadline is None else max(0.01, min(0.5, deadline - time.monotonic()))
        info = signal.sigtimedwait(waitset, wait)
        if info is None or info.si_signo == signal.SIGCHLD:
            continue
        if info.si_signo == signal.SIGHUP and on_hup is not None:
            on_hup()
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, info.si_signo)  # the jail's init, or the agent without a jail


def load_launcher() -> Any:
    """The extension that holds the launcher (``gatewrap._gate_core``, ~12 MB to map and link):
    loaded by :func:`spawn`; the shared mode's client loads it ahead, while the daemon works."""
    from . import _gate_core

    return _gate_core


def spawn(spec: dict[str, Any]) -> int:
    """Start the agent as :meth:`Sandbox.spawn_spec` says (``spawn_agent``: fork, join the
    sandbox before exec); returns its pid.

    The run's netns is opened here first and must be the namespace ``netns_ino`` names (its
    path, ``/proc/PID/fd/FD`` of the gatewrap process holding it, could name another one if
    that process were gone and its pid and descriptor number reused); the launcher then joins
    it through this process's own descriptor.

    Raises:
        GatewrapError: 125 for a failure before exec (the netns included), 127/126 for the exec itself.
    """
    core = load_launcher()
    spec = dict(spec)
    ino = spec.pop("netns_ino", None)
    try:
        ns = os.open(spec["netns_path"], os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise GatewrapError(f"starting the agent failed: the run's network namespace is gone ({e.strerror})") from e
    try:
        if ino is not None and os.fstat(ns).st_ino != ino:
            raise GatewrapError("starting the agent failed: the run's network namespace is gone (another is in its place)")
        spec["netns_path"] = f"/proc/self/fd/{ns}"
        if _CALLER_NOFILE is not None:
            spec["nofile"] = _CALLER_NOFILE
        return core.spawn_agent(**spec)
    except core.SpawnError as e:
        if e.stage != "exec":
            raise GatewrapError(f"starting the agent failed: {e.strerror}") from e
        code = EXIT_NOT_FOUND if e.errno == errno.ENOENT else EXIT_CANNOT_EXEC
        raise GatewrapError(e.strerror, exit_code=code) from e
    finally:
        os.close(ns)


def protect_from_oom() -> None:
    """Lower this process's oom_score_adj to :data:`GATEWRAP_OOM_SCORE_ADJ` (needs
    CAP_SYS_RESOURCE; where refused, as in a container without it, it stays as it was)."""
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as f:
        f.write(str(GATEWRAP_OOM_SCORE_ADJ))


#: The caller's soft RLIMIT_NOFILE before :func:`raise_fd_limit` raised this process's; the
#: agent gets it back (:func:`spawn`). None: not raised.
_CALLER_NOFILE: int | None = None


def raise_fd_limit(ceiling: bool = False) -> int:
    """The gate holds two fds per tunnel (up to 1024 connections per run): raise gatewrap's
    soft RLIMIT_NOFILE to its hard limit (getrlimit(2)). The agent is started with the
    caller's soft limit (:func:`spawn`); in the jail nsjail then sets soft and hard to the
    hard one (agent.cfg's ``rlimit_nofile_type: HARD``: one value for both).

    ``ceiling`` (the daemon, 9 descriptors an idle sandbox: ``shared.daemon.FDS_PER_SANDBOX``): first try both up to the kernel's
    ``fs.nr_open`` (proc(5); raising the hard limit needs CAP_SYS_RESOURCE, which a container
    may lack: then the hard limit it has). Returns the soft limit now."""
    global _CALLER_NOFILE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if ceiling:
        try:
            with open("/proc/sys/fs/nr_open") as f:
                nr_open = int(f.read())
            if nr_open > hard:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nr_open, nr_open))
                hard = nr_open
        except (OSError, ValueError):
            pass
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        if _CALLER_NOFILE is None:
            _CALLER_NOFILE = soft
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]
