"""The daemon's socket and what goes over it.

One connection is one run (or one status question). Messages are JSON objects, one per line
(UTF-8), except the two plain lines of the run's end, which the native waiter speaks:

1. client -> daemon: ``{"op": "run", "opts": RunOptions as a dict, "summary": "text" | "json",
   "netns_fd": true, "install": the client's install (:func:`install`)}``, sent with the
   client's stderr as SCM_RIGHTS (unix(7)): the run's notices go there. A daemon of another
   install (:func:`other_install`) refuses the run at once, before anything is set up:
   ``{"error": what differs and what to do (:func:`mismatch`), "exit_code": 125,
   "install": its own}``. Without ``install`` (an older client) the daemon does not compare;
   an older daemon ignores it.
2. daemon -> client: ``{"spawn": spawn_agent keyword arguments, "run": RUN_ID}`` once the
   sandbox is up, with the run's netns as SCM_RIGHTS when the client asked (``netns_fd``;
   the daemon then keeps no descriptor of it, and the client joins it through its own), or
   ``{"error": MESSAGE, "exit_code": N}`` (nothing was left behind).
3. client -> daemon: ``exit CODE`` once the agent has exited (the waiter, or the client), or
   ``failed CODE MESSAGE`` (one line) when the client could not start the agent.
4. daemon -> client: the closing summary (one line; none after ``failed``), then the daemon
   closes the connection.

A connection that ends before step 3 (the client died) has its sandbox torn down: its
processes killed, its records closed.

``{"op": "status"}`` is answered with ``{"pid", "started", "runs": [run ids], "fds": {"limit",
"open", "sandbox_room"}, "install": its install}`` (:func:`gatewrap.shared.daemon.fd_room`,
:func:`install`; an older daemon's has no ``install``).

``{"op": "reload", "run": RUN_ID}`` (``gatewrap reload``) reads the run's policy file again and
is answered ``{"record": its policy_reload record}`` (result reloaded or failed) or
``{"error": MESSAGE, "exit_code": N}`` (no such run here, the record could not be written).

``resume RUN_ID`` (a plain line, from the waiter of a run whose daemon died and was
restarted) is answered ``resumed`` once the run's gate serves again (or ``refused: WHY``);
steps 3 and 4 follow.

The socket is root's (mode 0600 in a 0755 /run/gatewrap) and the daemon also checks the
peer's uid (SO_PEERCRED, socket(7)): only root may ask for a sandbox.
"""

from __future__ import annotations

# _socket, socket.py's C half, not socket.py: of socket.py the protocol would use only
# send_fds and recv_fds (a few lines over sendmsg/recvmsg, written out below), while
# importing it (the enums it makes of _socket's constants, selectors) is ~5% of the
# instructions a shared run's client spends up to its spawn. A socket.socket is a
# _socket.socket: the daemon's sockets work here as they are.
import _socket
import array
import json
import os
import struct
#: typing is not imported (~3 ms of every shared run's client start): annotations only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

#: Where the daemon listens; ``$GATEWRAP_DAEMON_SOCKET`` names another (tests, a second daemon).
DEFAULT_SOCKET = "/run/gatewrap/daemon.sock"
#: The longest message line accepted, in bytes (a run's options with its whole environment).
MAX_LINE = 4 << 20
#: File descriptors a message may carry.
MAX_FDS = 4


#: The folder every daemon socket lives in: hidden from every agent (an empty tmpfs over
#: /run/gatewrap, runner._hidden_paths), so none can even see it.
SOCKET_DIR = "/run/gatewrap"


def socket_path(environ: dict[str, str] | None = None, flag: str | None = None) -> str:
    """The daemon's socket path: ``flag`` (``--socket``), else ``$GATEWRAP_DAEMON_SOCKET``,
    else :data:`DEFAULT_SOCKET`.

    Raises:
        GatewrapError: a path outside :data:`SOCKET_DIR` (an agent could see it there).
    """
    from ..errors import GatewrapError

    path = flag or (os.environ if environ is None else environ).get("GATEWRAP_DAEMON_SOCKET") or DEFAULT_SOCKET
    real = os.path.normpath(os.path.abspath(path))
    if os.path.dirname(real) != SOCKET_DIR:
        raise GatewrapError(f"the daemon's socket must be a file directly in {SOCKET_DIR} (hidden from every "
                            f"agent), not {path}")
    return real


def install() -> dict[str, Any]:
    """This process's gatewrap install, as a run's client and the daemon tell each other:
    ``{"version": gatewrap.__version__, "path": the package's folder, "installed": its
    ``__init__.py``'s mtime in ns, None without one}`` (an install writes the files anew: a
    daemon that was running during a reinstall runs the old code, and imports the new
    modules it had not yet). One stat(2), ~13 µs: nothing a run's start would notice."""
    from .. import __version__

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        installed: int | None = os.stat(os.path.join(package, "__init__.py")).st_mtime_ns
    except OSError:  # not a folder of files (a zip): version and path only
        installed = None
    return {"version": __version__, "path": package, "installed": installed}


#: What makes two installs one (:func:`install`).
INSTALL_KEYS = ("version", "path", "installed")


def other_install(theirs: Any, ours: dict[str, Any]) -> bool:
    """Whether ``theirs`` (the other side's :func:`install`, as it sent it) is not ``ours``:
    another version, another folder, or installed again since. Keys beyond
    :data:`INSTALL_KEYS` (a later version's) do not count."""
    return not isinstance(theirs, dict) or any(theirs.get(k) != ours.get(k) for k in INSTALL_KEYS)


def shown_install(inst: Any) -> str:
    """``gatewrap 0.1.0 in /opt/venv/lib/python3.13/site-packages/gatewrap (installed
    2026-12-06 03:50:12 UTC)``; for None (a daemon older than :func:`install`): says so."""
    if not isinstance(inst, dict):
        return "an older gatewrap, which does not say its version or folder"
    from ..text import printable

    installed = inst.get("installed")
    when = ""
    if isinstance(installed, int):
        import time

        try:
            when = time.strftime(" (installed %Y-%m-%d %H:%M:%S UTC)", time.gmtime(installed / 1e9))
        except (OverflowError, OSError, ValueError):  # past what time_t holds
            when = f" (installed {installed} ns after 1970)"
    return printable(f"gatewrap {inst.get('version', '?')} in {inst.get('path', '?')}{when}")


def mismatch(socket_path: str, daemon_pid: int, daemon: Any, client: Any) -> str:
    """What a run's client says (or the daemon answers it) when the daemon at
    ``socket_path`` is another install than the client: both installs (:func:`shown_install`)
    and what to do: stop the daemon (its live runs lose their gates until they end), then run
    again, which starts one of the client's install on demand."""
    stop = "sudo gatewrap daemon --stop" + ("" if socket_path == DEFAULT_SOCKET else f" --socket {socket_path}")
    differ = ""
    if isinstance(daemon, dict) and isinstance(client, dict):
        names = {"version": "version", "path": "folder"}
        named = [names[k] for k in names if daemon.get(k) != client.get(k)]
        differ = (f" (another {' and '.join(named)})" if named else
                  " (the same version in the same folder, written anew since the daemon started)")
    return (f"the gatewrap daemon on {socket_path} (pid {daemon_pid}) is another gatewrap install than this "
            f"gatewrap run's{differ}: the daemon runs {shown_install(daemon)}; this gatewrap run is "
            f"{shown_install(client)}. Stop the daemon with {stop} (or restart the gatewrap-daemon unit; its "
            "live runs lose their gates until they end), then run again: a daemon of this install starts on "
            "demand")


class ProtocolError(Exception):
    """The other side sent something this protocol does not have, or too much of it."""


def send(sock: _socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    """Send ``message`` as one JSON line, with ``fds`` attached (SCM_RIGHTS).

    Raises:
        OSError: the connection is gone (EPIPE, ECONNRESET).
    """
    data = json.dumps(message, separators=(",", ":")).encode() + b"\n"
    if fds:  # socket.send_fds
        sent = sock.sendmsg([data], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, array.array("i", fds))])
    else:
        sent = sock.send(data)
    if sent < len(data):
        sock.sendall(data[sent:])


def send_line(sock: _socket.socket, text: str) -> None:
    """Send one plain line (``text`` without its newline)."""
    sock.sendall(text.encode() + b"\n")


class Reader:
    """Lines from a stream socket, and the descriptors that came with them.

    :meth:`line` returns one line without its newline, or None at the end of the stream.
    """

    def __init__(self, sock: _socket.socket) -> None:
        self._sock = sock
        self._buf = b""
        self.fds: list[int] = []

    def line(self) -> bytes | None:
        """The next line (without ``\\n``); None once the other side has closed.

        Raises:
            ProtocolError: a line longer than :data:`MAX_LINE`, or more than :data:`MAX_FDS` fds.
        """
        while b"\n" not in self._buf:
            if len(self._buf) > MAX_LINE:
                raise ProtocolError(f"a message longer than {MAX_LINE} bytes")
            data, fds, flags = _recv_fds(self._sock, 65536, MAX_FDS)
            self.fds += fds
            if flags & _socket.MSG_CTRUNC or len(self.fds) > MAX_FDS:
                raise ProtocolError(f"more than {MAX_FDS} file descriptors")
            if not data:
                return None
            self._buf += data
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def has_line(self) -> bool:
        """Whether a whole line is buffered already (:meth:`line` returns it without reading)."""
        return b"\n" in self._buf

    def message(self) -> dict[str, Any] | None:
        """The next line as a JSON object; None at the end of the stream.

        Raises:
            ProtocolError: not a JSON object.
        """
        line = self.line()
        return None if line is None else parse(line)

    def rest(self) -> bytes:
        """Everything until the other side closes (what is buffered first)."""
        out, self._buf = self._buf, b""
        while True:
            data = self._sock.recv(65536)
            if not data:
                return out
            out += data


def _recv_fds(sock: _socket.socket, bufsize: int, maxfds: int) -> tuple[bytes, list[int], int]:
    """``socket.recv_fds`` without its address: (data, the fds received, the msg flags). The
    fds are close-on-exec (MSG_CMSG_CLOEXEC, unix(7)): the client, which spawns the agent and
    execs the waiter, passes none on."""
    fds = array.array("i")
    data, ancdata, flags, _ = sock.recvmsg(bufsize, _socket.CMSG_LEN(maxfds * fds.itemsize), _socket.MSG_CMSG_CLOEXEC)
    for level, kind, payload in ancdata:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - (len(payload) % fds.itemsize)])
    return data, list(fds), flags


def parse(line: bytes) -> dict[str, Any]:
    """One message line as a JSON object.

    Raises:
        ProtocolError: not a JSON object.
    """
    try:
        got = json.loads(line)
    except ValueError as e:
        raise ProtocolError(f"not JSON: {e}") from None
    if not isinstance(got, dict):
        raise ProtocolError("not a JSON object")
    return got


def peer(sock: _socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end (SO_PEERCRED, socket(7))."""
    raw = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid
