"""``gatewrap run`` (the shared mode, the default): the thin client. It asks the daemon for a
sandbox, spawns the agent into it itself (so the agent is its child: stdio, signals and exit
code as in a run of its own), then becomes the native waiter, a process of well under a
megabyte, for the rest of the run.

The daemon is started on demand: when nothing answers on its socket, the client starts
``gatewrap daemon --idle-exit 10m`` in a session of its own (its log:
``/var/log/gatewrap/daemon.log``), says so once on stderr, and waits for it, at most
:data:`START_TIMEOUT` seconds. Runs starting at once start one daemon (the start lock,
``SOCKET.start``). Where none can start, :class:`DaemonUnavailable` says why (the run then
runs on its own).
"""

from __future__ import annotations

import _socket  # not socket.py: see gatewrap.shared.protocol
import contextlib
import os
import signal
import sys
import time

from ..errors import GatewrapError
from . import lockfile, protocol, waiter

#: typing is not imported (~3 ms of every shared run's client start): annotations only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from typing import Any, NoReturn

#: How long a client waits for a daemon it started to listen, in seconds.
START_TIMEOUT = 20.0
#: The log of a daemon started on demand.
DAEMON_LOG = "/var/log/gatewrap/daemon.log"


#: How long a daemon started on demand lives without a run (``gatewrap daemon --idle-exit``).
ON_DEMAND_IDLE_EXIT = "10m"


class DaemonUnavailable(GatewrapError):
    """No daemon answers on the socket and none could be started (the message says why)."""


def connect(path: str, start: bool = True) -> _socket.socket:
    """A connection to the daemon at ``path``, starting one when none answers and ``start``.

    Raises:
        GatewrapError: no daemon answers (and ``start`` is false).
        DaemonUnavailable: none answers and none could be started (its log's last lines said).
    """
    try:
        return _connect(path)
    except (FileNotFoundError, ConnectionRefusedError):
        if not start:
            own = "" if path == protocol.DEFAULT_SOCKET else f" --socket {path}"
            raise GatewrapError(f"no gatewrap daemon answers on {path}: start one with sudo gatewrap daemon{own} "
                                "(or the gatewrap-daemon systemd unit)") from None
    # One client at a time starts a daemon; the others wait here, then find it answering. A
    # daemon leaving on its idle time takes this lock too (gatewrap.shared.daemon
    # Daemon._leave_if_idle): a client refused meanwhile finds a daemon again, or none.
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    lock = lockfile.take(path + ".start")  # a stopping daemon removes the file: see lockfile
    try:
        try:
            return _connect(path)
        except (FileNotFoundError, ConnectionRefusedError):
            pass
        proc = _start_daemon(path)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                sock = _connect(path)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                code = proc.poll()
                if code is not None or time.monotonic() > deadline:
                    why = f"it exited {code}" if code is not None else f"it did not answer within {START_TIMEOUT:g} s"
                    raise DaemonUnavailable(f"the shared gatewrap daemon did not start ({why}; {DAEMON_LOG}: "
                                            f"{_tail(DAEMON_LOG)})") from None
                time.sleep(0.01)
    finally:
        os.close(lock)
    sys.stderr.write(f"gatewrap: started the shared daemon (pid {proc.pid}, log {DAEMON_LOG}, exits after "
                     f"{ON_DEMAND_IDLE_EXIT} without a run; gatewrap daemon --status)\n")
    return sock


def _connect(path: str) -> _socket.socket:
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        raise
    return sock


def _start_daemon(path: str) -> subprocess.Popen[bytes]:
    """``gatewrap daemon --socket PATH --idle-exit 10m`` in a new session, detached from our
    terminal, with a minimal environment (the runs' own environments come with their
    requests). A daemon started by hand at the same time keeps the socket: this one then
    exits 0 when it finds the lock held."""
    import subprocess  # not at the top: only a client that starts the daemon needs it

    os.makedirs(os.path.dirname(DAEMON_LOG), mode=0o755, exist_ok=True)
    log = os.open(DAEMON_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "PYTHONPATH")}
    try:
        proc = subprocess.Popen([sys.executable, "-m", "gatewrap", "daemon", "--socket", path, "--quiet-if-running",
                                 "--idle-exit", ON_DEMAND_IDLE_EXIT],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                                start_new_session=True, close_fds=True, cwd="/")
    finally:
        os.close(log)
    _own_cgroup(proc.pid)
    return proc


#: The cgroup (v2, top level) a daemon started on demand is moved to: not the starting
#: client's (a login session's scope, whose end would kill the daemon and every run's gate).
DAEMON_CGROUP = "gatewrap-daemon"


def _own_cgroup(pid: int) -> None:
    """Move process ``pid`` into :data:`DAEMON_CGROUP` (made if missing; cgroups(7),
    cgroup.procs). Without a cgroup v2 hierarchy or where the move is refused, it stays."""
    from ..sandbox import cgroup

    root = cgroup.cgroup2_mount()
    if root is None:
        return
    target = os.path.join(root, DAEMON_CGROUP)
    with contextlib.suppress(OSError):
        os.makedirs(target, exist_ok=True)
        with open(os.path.join(target, "cgroup.procs"), "w") as f:
            f.write(str(pid))


def _tail(path: str, lines: int = 3) -> str:
    try:
        with open(path, errors="replace") as f:
            return " | ".join(f.read().splitlines()[-lines:]) or "(empty)"
    except OSError as e:
        return f"(cannot read it: {e.strerror})"


def run(fields: dict[str, Any], summary: str = "text") -> NoReturn | int:
    """Run the options ``fields`` in a sandbox of the daemon's; ``summary``: the closing line
    as ``text`` or ``json``. With the native waiter (``gatewrap-wait``) this never returns: the
    process becomes the waiter and exits with the agent's code. Without it, this process
    waits and returns the agent's exit code.

    ``fields`` are those of a :class:`gatewrap.run_types.RunOptions` in its JSON form
    (``dataclasses.asdict``: ``limits`` a dict), ``environ`` left out (this process's is sent)
    and ``cwd`` None for the current folder; any left out take the RunOptions default. The
    daemon makes the RunOptions (:func:`gatewrap.shared.daemon.options`): the client does not
    import run_types, whose dataclasses (generated methods compiled at import) cost every start.

    Raises:
        GatewrapError: the daemon refused the run or failed (its message, its exit code), or
            the agent could not be started (125, 126, 127).
    """
    opts = {**fields, "environ": dict(os.environ), "cwd": fields.get("cwd") or os.getcwd()}
    timeout = opts.get("timeout")
    path = protocol.socket_path()
    sock = connect(path)
    reader = protocol.Reader(sock)
    # install: a daemon of another install refuses at once, saying what differs (an older
    # daemon ignores it); no round trip of its own
    protocol.send(sock, {"op": "run", "opts": opts, "summary": summary, "netns_fd": True,
                         "install": protocol.install()}, fds=[2])
    # While the daemon sets the sandbox up (~20 ms), this process readies what the spawn needs
    # (ctypes, the launcher's extension: a few ms off the critical path) and its own state.
    from .. import agent_process

    agent_process.load_launcher()
    found = waiter.find()
    agent_process.become_subreaper()
    agent_process.raise_fd_limit()  # the agent inherits it, as from a run of its own
    agent_process.protect_from_oom()  # the waiter this process becomes: the run's end depends on it
    reply = reader.message()
    if reply is None:
        raise GatewrapError(closed_early(sock, path))
    if "error" in reply:
        raise GatewrapError(str(reply["error"]), exit_code=int(reply.get("exit_code", 125)))
    spec = reply["spawn"]
    # The run's netns, sent with the reply (a daemon that holds none of an idle run's); an
    # older daemon sends none, and its spec names its own descriptor.
    netns = reader.fds.pop() if reader.fds else None
    if netns is not None:
        spec["netns_path"] = f"/proc/self/fd/{netns}"
    signal.pthread_sigmask(signal.SIG_BLOCK, set(agent_process.FORWARDED) | {signal.SIGCHLD})
    try:
        pid = agent_process.spawn(spec)
    except GatewrapError as e:
        # The daemon closes the run with this reason (its run_end) and tears the sandbox down;
        # the daemon's closing the connection says it is done.
        with contextlib.suppress(OSError):
            protocol.send_line(sock, f"failed {e.exit_code} {' '.join(str(e).split())}")
            reader.rest()
        raise
    finally:
        if netns is not None:
            os.close(netns)
    if found is not None:
        waiter.exec_waiter(pid, sock.fileno(), timeout, spec["cgroup_dir"], resume=(path, reply["run"]))
    code = agent_process.wait_forwarding_signals(pid, timeout, spec["cgroup_dir"], sys.stderr)
    summary = b""
    with contextlib.suppress(OSError):
        protocol.send_line(sock, f"exit {code}")
        summary = reader.rest()
    sys.stderr.write(summary.decode(errors="replace") or GONE + "\n")
    return code


def closed_early(sock: _socket.socket, path: str) -> str:
    """What to say when the daemon at ``path`` closed run connection ``sock`` without a
    reply. A daemon that knows installs refuses another's client with a reply
    (:func:`protocol.mismatch`); one older than that may just fail. So ask the daemon that
    served ``sock`` (its pid from SO_PEERCRED, unix(7)) for its status, only now, on this
    failure: if it says no install (older) or another one, say both and what to do."""
    said = (f"the gatewrap daemon closed the connection before the sandbox was up (see {DAEMON_LOG}, or the "
            "journal of gatewrap-daemon)")
    try:
        pid = protocol.peer(sock)[0]
        other = connect(path, start=False)
        try:
            protocol.send(other, {"op": "status"})
            status = protocol.Reader(other).message()
        finally:
            other.close()
    except (GatewrapError, OSError, protocol.ProtocolError):
        return said  # gone, or another daemon's socket now: nothing to compare with
    if not status or status.get("pid") != pid:
        return said
    ours = protocol.install()
    if "install" in status and not protocol.other_install(status["install"], ours):
        return said
    return f"{said}; {protocol.mismatch(path, pid, status.get('install'), ours)}"


#: What the client says when the daemon is gone at the run's end (the waiter says the same).
GONE = ("gatewrap: the gatewrap daemon went away before the run's end was recorded; "
        "sudo gatewrap gc collects the sandbox")
