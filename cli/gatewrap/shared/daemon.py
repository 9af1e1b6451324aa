"""``gatewrap daemon``: one long-lived process that sets up, serves and tears down the sandbox
of every shared-mode run on the host.

It holds what a run of its own would load each time: the hooks (loaded and attached once),
one tokio runtime for every run's gate (``Gate(shared_runtime=True)``), and it removes stale
sandboxes once at its start. Each run costs it the run's gate (listeners made inside the run's
netns) and the run's ring-buffer reader; while a run's agent runs, its connection waits with
every other run's on one thread (:class:`Parked`): an idle run costs the daemon no thread.

Fail closed: the hooks stay attached to the ``gatewrap/`` cgroup whatever happens to the
daemon, and only the gate's listeners are reachable from a sandbox, so a dead daemon leaves
every sandbox without egress. Its runs' locks go with it; ``gatewrap gc`` (or the next
daemon's start) then removes their sandboxes.
"""

from __future__ import annotations

import _thread
import collections
import contextlib
import errno
import json
import os
import resource
import select
import selectors
import signal
import socket
import sys
import threading
import time
from dataclasses import fields
from typing import Any, Callable, Iterator, TextIO

from .. import runner
from ..errors import GatewrapError, require_root
from ..kernel_denials import SharedReader
from ..run_types import RunOptions, summary_line
from ..sandbox import cgroup, gc, limits, registry
from ..bpf import loader
from . import lockfile, protocol

#: Lines a run's terminal holds while it is slow to read them (see :class:`Terminal`).
MAX_PENDING = 256
#: How long the summary waits for the run's last notices to reach its terminal, in seconds.
SUMMARY_WAIT = 2.0
#: How long a restarted daemon waits for the clients of the runs it can take back, in seconds.
TAKE_BACK_WINDOW = 30.0
#: How long a starting daemon waits for the lock beside its socket, in seconds: a sweep
#: (:func:`gatewrap.shared.lockfile.sweep`) holds a dead daemon's for an instant; a live
#: daemon holds it for good (then the start is refused).
CLAIM_WAIT = 0.5
#: Connections waiting to be accepted (listen(2) backlog).
BACKLOG = 512
#: Runs ending at once (the others wait their turn). A thousand runs stopped together made a
#: thousand threads take turns on the GIL at every step of each teardown: 121 s for all of
#: them, against ~12 ms for one run's end alone.
ENDING_AT_ONCE = 4
#: How long a stopping daemon waits for the ends under way (their sandbox's last removals), in seconds.
ENDS_WAIT = 10.0


class Parked:
    """Connections waiting for their client's next line, watched by one thread (selectors):
    when one is readable, ``then`` runs on a thread of its own, which ends with it.

    A run's connection waits for ``exit CODE`` as long as its agent runs; a thread blocked
    on each made a thousand idle runs a thousand threads of the daemon (issue 23, target 4).
    The watching thread starts with the first connection parked.
    """

    def __init__(self) -> None:
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._lock = threading.Lock()
        self._new: list[tuple[socket.socket, Any]] = []
        self._started = False

    def park(self, conn: socket.socket, then: Any) -> None:
        """Call ``then()`` (on a thread of its own) once ``conn`` has something to read or
        is closed by its peer."""
        with self._lock:
            self._new.append((conn, then))
            if not self._started:
                threading.Thread(target=self._watch, daemon=True, name="gatewrap-parked").start()
                self._started = True
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_w, b"x")

    def _watch(self) -> None:
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        while True:
            # In a call of its own: nothing of a run (its ``then``, which holds its sandbox and
            # gate, and so a duplicate of its terminal) stays referenced from this frame.
            self._ready([key for key, _ in self._sel.select()])

    def _ready(self, keys: list[selectors.SelectorKey]) -> None:
        for key in keys:
            if key.fileobj == self._wake_r:
                with contextlib.suppress(BlockingIOError):
                    os.read(self._wake_r, 4096)
                with self._lock:
                    new, self._new = self._new, []
                for conn, then in new:
                    self._sel.register(conn, selectors.EVENT_READ, then)
                continue
            self._sel.unregister(key.fileobj)
            try:
                _start(key.data)
            except RuntimeError:  # no thread to be had: end it here, the others wait
                key.data()


#: The daemon's file descriptors per idle sandbox, what its limit is divided by: the gate's
#: three listeners and the client's connection, the run's lock, its ring buffer, its terminal
#: twice (the daemon's notices and the gate's) and its audit log (one for all the runs naming
#: the same log). tests/shared/test_lifecycle.py counts them.
FDS_PER_SANDBOX = 9


def fd_room() -> dict[str, int]:
    """This process's file descriptors, as ``gatewrap daemon --status`` says them: ``{"limit":
    its soft RLIMIT_NOFILE (getrlimit(2)), "open": how many are open now (/proc/self/fd,
    proc(5)), "sandbox_room": about how many more idle sandboxes fit in the rest}``
    (:data:`FDS_PER_SANDBOX` each; their gates' connections take more)."""
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    held = len(os.listdir("/proc/self/fd"))
    return {"limit": limit, "open": held, "sandbox_room": max(limit - held, 0) // FDS_PER_SANDBOX}


class DaemonRunning(GatewrapError):
    """Another daemon already serves this socket (it holds the lock beside it)."""


class Terminal:
    """A run's terminal: the client's stderr, received over the socket, as a text sink.

    Writes never block the caller: lines wait in a queue (at most :data:`MAX_PENDING`; more are
    dropped and counted in :attr:`dropped`) for a thread that writes them out and ends when the
    queue is empty. A terminal that stops reading (a full pipe) then stalls only its own
    thread, never the daemon's shared ring-buffer reader nor another run. Write errors (the
    client went away: EPIPE) drop the line.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._queue: collections.deque[bytes] = collections.deque()
        self._lock = threading.Lock()
        self._writing = False
        self._closing = False
        self._idle = threading.Event()
        self._idle.set()
        self.dropped = 0
        #: The bytes of a line not ended yet (see :meth:`write`).
        self._partial = b""

    def fileno(self) -> int:
        return self._fd

    def write(self, text: str) -> int:
        """Queue ``text``; only whole lines are queued (the rest waits for its newline or
        :meth:`flush`), so that each line is one write(2): ``print`` writes its text and its
        newline in two calls, and the agent, which writes to the same terminal, would land
        between them (a pipe keeps a write of up to PIPE_BUF bytes whole: pipe(7))."""
        data = text.encode(errors="backslashreplace")
        with self._lock:
            self._partial += data
            if b"\n" not in data:
                return len(text)
            cut = self._partial.rindex(b"\n") + 1
            data, self._partial = self._partial[:cut], self._partial[cut:]
            self._queue_locked(data)
        return len(text)

    def _queue_locked(self, data: bytes) -> None:
        """Queue ``data`` for the writing thread (started if idle); the lock is held."""
        if self._closing or self._fd < 0 or len(self._queue) >= MAX_PENDING:
            self.dropped += 1
            return
        self._queue.append(data)
        self._idle.clear()
        if not self._writing:
            self._writing = True
            _start(self._drain)

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._writing = False
                    self._idle.set()
                    if self._closing:
                        self._close_fd()
                    return
                data = self._queue.popleft()
            with contextlib.suppress(OSError):
                while data:
                    data = data[os.write(self._fd, data):]

    def flush(self) -> None:
        """Queue a line still waiting for its newline."""
        with self._lock:
            if self._partial:
                data, self._partial = self._partial, b""
                self._queue_locked(data)

    def wait_written(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until every queued line is written; whether it was."""
        return self._idle.wait(timeout)

    def close(self) -> None:
        """Close once what is queued is written (at once when nothing is)."""
        self.flush()
        with self._lock:
            self._closing = True
            if not self._writing:
                self._close_fd()

    def _close_fd(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1


def _fits(value: Any, shape: str) -> bool:
    """Whether a JSON ``value`` has the dataclass field type ``shape`` (its annotation's text:
    ``int``, ``float | None``, ``list[str]``, ``dict[str, str] | None``...)."""
    if shape.endswith(" | None"):
        return value is None or _fits(value, shape[: -len(" | None")])
    if shape == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if shape == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if shape == "str":
        return isinstance(value, str)
    if shape == "list[str]":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if shape == "dict[str, str]":
        return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())
    return False


def _typed(raw: dict[str, Any], cls: Any, what: str) -> dict[str, Any]:
    """``raw`` checked against the fields of dataclass ``cls``: none unknown, each of its type.

    Raises:
        protocol.ProtocolError: a field ``cls`` does not have, or a value of another type.
    """
    types = {f.name: f.type for f in fields(cls)}
    unknown = set(raw) - set(types)
    if unknown:
        raise protocol.ProtocolError(f"unknown {what} {sorted(unknown)}: is the client another gatewrap version?")
    for name, value in raw.items():
        if types[name] != "Limits" and not _fits(value, str(types[name])):
            raise protocol.ProtocolError(f"{what} {name}: {value!r} is not a {types[name]}")
    return raw


def options(raw: Any) -> RunOptions:
    """A :class:`RunOptions` from its JSON form (``dataclasses.asdict``).

    Raises:
        protocol.ProtocolError: not an object, a field this version does not have, a value
            of another type, or no argv.
    """
    if not isinstance(raw, dict):
        raise protocol.ProtocolError("opts is not an object")
    raw = dict(_typed(raw, RunOptions, "run options"))
    if "limits" in raw:
        if not isinstance(raw["limits"], dict):
            raise protocol.ProtocolError("run options limits: not an object")
        raw["limits"] = limits.Limits(**_typed(raw["limits"], limits.Limits, "run options limits"))
    if not raw.get("argv"):
        raise protocol.ProtocolError("opts.argv must be a non-empty list")
    return RunOptions(**raw)


class Daemon:
    """The daemon serving ``socket_path``; :meth:`serve` until SIGTERM or SIGINT.

    Raises (from :meth:`serve`):
        NeedRoot: not root.
        DaemonRunning: another daemon holds the socket's lock.
        GatewrapError: the hooks cannot be loaded, or the socket cannot be made.
    """

    def __init__(self, socket_path: str, log: TextIO | None = None, idle_exit: float = 0) -> None:
        self.socket_path = socket_path
        #: Seconds without a run nor a client after which the daemon exits; 0: never.
        self.idle_exit = idle_exit
        #: Connections being served, and when the last one ended (time.monotonic()).
        self._clients = 0
        self._quiet_since = time.monotonic()
        self._listener: socket.socket | None = None
        #: The two ends of the socket pair SIGTERM and SIGINT wake serve's poll(2) by.
        self._wake: tuple[socket.socket, socket.socket] | None = None
        #: A descriptor held in reserve (/dev/null) for telling a client the daemon is out of
        #: descriptors (:meth:`_out_of_descriptors`); -1 while given up.
        self._spare = -1
        #: The lock beside the socket (:meth:`_claim`) while held.
        self._lock_fd = -1
        self.log = log or sys.stderr
        self.started = time.time()
        #: The install this daemon runs (as it started: its files may be written anew since),
        #: told in status answers and compared with each run's client's (:meth:`_serve_one`).
        self.install = protocol.install()
        self.runs: dict[str, runner.Sandbox] = {}
        #: Container runs (gatewrap-oci), kept from their create to their delete.
        self.containers: dict[str, Any] = {}
        #: The watch that ends the runs of dead containers never deleted (:class:`gatewrap.oci.runs.Exits`).
        self.exits: Any = None
        self._lock = threading.Lock()
        #: Runs whose end is under way (:meth:`_serve_end`), and their last one's signal: the
        #: staged files and the ring buffer's release follow the client's release, and a daemon
        #: leaving (SIGTERM, its idle time) waits for them rather than leave them behind.
        self._ends = 0
        self._ends_done = threading.Condition(self._lock)
        self._ending = threading.BoundedSemaphore(ENDING_AT_ONCE)
        #: The connections of the runs whose agent runs (see :meth:`_serve_end`).
        self.parked = Parked()
        self.hooks: loader.Hooks | None = None
        self.reader: SharedReader | None = None
        #: Runs of a dead daemon kept for their clients to come back (see :meth:`_resume`).
        self.awaiting: set[str] = set()
        #: One audit log writer per (path, max size, keep), shared by the live runs that name
        #: it, with how many they are: the last one's end closes it (nothing of a finished run
        #: stays open in a daemon that lives for weeks; see :meth:`audit_log`).
        self._audit_logs: dict[tuple[str, int, int | None], list[Any]] = {}

    def say(self, text: str) -> None:
        """One line of the daemon's log: the time (RFC 3339, UTC), its pid and socket, ``text``
        (every daemon started on demand shares /var/log/gatewrap/daemon.log)."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        print(f"{now} gatewrap daemon {os.getpid()} ({self.socket_path}): {text}", file=self.log, flush=True)

    def _claim(self) -> int:
        """Take the lock beside the socket (flock(2), dropped by the kernel when we die; the file
        removed when the daemon stops: :meth:`_let_go`) and write our pid in it. A lock held
        for more than :data:`CLAIM_WAIT` seconds is a daemon's.

        Raises:
            DaemonRunning: another daemon holds it.
        """
        folder = os.path.dirname(self.socket_path)
        os.makedirs(folder, mode=0o755, exist_ok=True)
        deadline = time.monotonic() + CLAIM_WAIT
        while True:
            try:
                fd = lockfile.take(self.socket_path + ".lock", wait=False)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise DaemonRunning(f"a gatewrap daemon already serves {self.socket_path}") from None
                time.sleep(0.01)
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        return fd

    def _listen(self) -> socket.socket:
        """The listening socket, root's alone (0600), replacing a dead daemon's."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        old = os.umask(0o177)
        try:
            sock.bind(self.socket_path)
        finally:
            os.umask(old)
        os.chmod(self.socket_path, 0o600)
        sock.listen(BACKLOG)
        return sock

    def serve(self) -> None:
        require_root("daemon")
        lock_fd = self._claim()
        runner.raise_fd_limit(ceiling=True)
        runner.protect_from_oom()
        parent = cgroup.parent_dir()
        self.hooks = loader.load_or_reuse(parent)
        self.reader = SharedReader()
        from ..oci.runs import take_back_all

        for line in take_back_all(self, parent):
            self.say(line)
        self.awaiting = self._takeable(parent)
        for run_id in self.awaiting:
            self.say(f"run {run_id} of the last daemon still runs: waiting {TAKE_BACK_WINDOW:g} s for its "
                     "gatewrap run to come back")
        collected = gc.collect(parent, runner.salvager(self.hooks, "the gatewrap daemon"), keep=self.awaiting,
                               waiting_for=self.socket_path)
        for line in gc.said_of(collected):
            self.say(line)
        for removed in lockfile.sweep(os.path.dirname(self.socket_path)):  # dead daemons' of other sockets
            self.say(lockfile.said(removed))
        if swept := self.hooks.sweep(parent):
            self.say(f"dropped the hooks' map entries of {swept} cgroups that are gone")
        if self.awaiting:
            timer = threading.Timer(TAKE_BACK_WINDOW, self._give_up, args=(parent,))
            timer.daemon = True  # a SIGTERM in the window stops the daemon at once, as outside it
            timer.start()
        stopping, woken = self._stop_on_signals()
        self._listener = self._listen()
        self._lock_fd = lock_fd
        self._spare = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        idle = f", exits after {self.idle_exit:g} s without a run" if self.idle_exit else ""
        room = fd_room()  # open: the daemon's own (hooks, maps, log, listener)
        self.say(f"serving {self.socket_path} (pid {os.getpid()}{idle}; file descriptor limit {room['limit']:,}, "
                 f"{room['open']} its own: room for about {room['sandbox_room']:,} idle sandboxes)")
        try:
            # poll(2), then a non-blocking accept: a socket timeout would have accept() spin on
            # a listener shut down by stop() (readable, yet EAGAIN) until the timeout ends.
            self._listener.setblocking(False)
            while not stopping.is_set():
                wait = self._until_idle()
                poller = select.poll()
                poller.register(self._listener, select.POLLIN)
                poller.register(woken, select.POLLIN)
                ready = poller.poll(None if wait is None else wait * 1000)
                if stopping.is_set():
                    break
                if any(fd == woken.fileno() for fd, _ in ready):
                    with contextlib.suppress(BlockingIOError):
                        woken.recv(4096)
                    continue  # the handler runs on the main thread before the loop's test
                if not ready:
                    if self._leave_if_idle():
                        break
                    continue
                try:
                    conn, _ = self._listener.accept()
                except BlockingIOError:
                    continue
                except OSError as e:
                    if stopping.is_set():
                        break
                    if e.errno in (errno.EMFILE, errno.ENFILE):
                        self._out_of_descriptors()
                        continue
                    raise
                conn.setblocking(True)
                self._serve_thread(conn)
        finally:
            n = len(self.runs)
            if self._lock_fd >= 0:
                self.say(f"stopping; {n} run{'' if n == 1 else 's'} lose{'s' if n == 1 else ''} "
                         f"{'its gate and stays' if n == 1 else 'their gates and stay'} without egress until "
                         f"{'it ends' if n == 1 else 'they end'}")
            with self._lock:
                boxes = list(self.runs.values())
            for box in boxes:  # what each gate holds in memory goes to the log before we go
                with contextlib.suppress(Exception):
                    box.leave()
            with self._lock:  # the ends under way finish their sandbox's removal
                self._ends_done.wait_for(lambda: self._ends == 0, ENDS_WAIT)
            self._let_go()

    def _stop_on_signals(self) -> tuple[threading.Event, socket.socket]:
        """SIGTERM and SIGINT stop :meth:`serve`: the event they set, and the socket their
        arrival makes readable (``signal.set_wakeup_fd``), which serve's poll(2) watches.

        The kernel hands a signal sent to the process to any thread that does not block it
        (signal(7)): here often a thread of the gate's runtime, whose C-level handler only
        flags it, while Python runs handlers on the main thread alone (the ``signal``
        module's docs), which sleeps in poll(2) and would not wake for it. The wakeup
        socket wakes it, whichever thread took the signal. Set before the listener exists,
        so that a client that can connect can also stop the daemon."""
        stopping = threading.Event()
        woken, wake = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        for end in (woken, wake):
            end.setblocking(False)
        self._wake = (woken, wake)  # kept open for the daemon's life

        def stop(signum: int, _frame: Any) -> None:
            stopping.set()
            if self._listener is not None:
                with contextlib.suppress(OSError):
                    self._listener.shutdown(socket.SHUT_RDWR)

        signal.set_wakeup_fd(wake.fileno(), warn_on_full_buffer=False)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, stop)
        return stopping, woken

    def _let_go(self, start: int = -1) -> None:
        """Remove the socket and let go of it (a new daemon may serve the path now): the
        socket, then the lock beside it, then the start lock (``SOCKET.start``), each file
        removed while its lock is held (:mod:`gatewrap.shared.lockfile`), so that nothing of
        a socket no daemon serves stays in its folder. The start lock is taken first, so that
        a client that finds no daemon meanwhile waits for it rather than start one that would
        find the socket's lock still held; one a client holds already (it is starting a
        daemon) is left to it. ``start``: the start lock, when the caller holds it. Idempotent."""
        if self._lock_fd < 0:
            return
        if start < 0:
            with contextlib.suppress(BlockingIOError):
                start = lockfile.take(self.socket_path + ".start", wait=False)
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.socket_path)
            if self._listener is not None:
                self._listener.close()
            if self._spare >= 0:
                os.close(self._spare)
                self._spare = -1
            lockfile.remove(self.socket_path + ".lock", self._lock_fd)
            self._lock_fd = -1
        finally:
            if start >= 0:
                lockfile.remove(self.socket_path + ".start", start)

    def _out_of_descriptors(self) -> None:
        """accept(2) failed with EMFILE/ENFILE (the daemon's RLIMIT_NOFILE, or the system's): the
        waiting client is told so, not left to wait, and the daemon serves on (its runs' gates
        with it; raising on it would end them all). The spare descriptor is given up for the
        one connection, which gets the refusal (exit 125) and is closed, then taken again;
        while it cannot be, accept is retried every 0.1 s (the connections wait in the backlog)."""
        if self._spare < 0:
            with contextlib.suppress(OSError):
                self._spare = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
            if self._spare < 0:
                time.sleep(0.1)
                return
        os.close(self._spare)
        self._spare = -1
        assert self._listener is not None
        try:
            conn, _ = self._listener.accept()
        except OSError:
            return
        with self._lock:
            n = len(self.runs)
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        runs = f"{n:,} run{'' if n == 1 else 's'}"
        said = (f"the gatewrap daemon is out of file descriptors (its limit {limit:,}; {runs}, about "
                f"{FDS_PER_SANDBOX} descriptors an idle sandbox, and their gates' connections): raise its open-file limit "
                "(LimitNOFILE in its systemd unit; a daemon started on demand has the limit of the gatewrap run that "
                "started it: stop it with sudo gatewrap daemon --stop once its runs end, and start the next run after "
                "ulimit -n N), or run with --own")
        self.say(f"out of file descriptors (limit {limit:,}, {runs}): a client was refused")
        with contextlib.suppress(OSError):
            conn.settimeout(1)
            # Its request first (any descriptor it carries is dropped: no room for it), so the
            # refusal is not written before the client's send, which it would fail (EPIPE).
            conn.recv(65536)
            protocol.send(conn, {"error": said, "exit_code": 125})
        conn.close()
        with contextlib.suppress(OSError):
            self._spare = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)

    def _serve_thread(self, conn: socket.socket) -> None:
        """Serve ``conn`` on a thread of its own, counted as a client until it ends."""
        with self._lock:
            self._clients += 1

        def serve() -> None:
            try:
                self._serve_one(conn)
            finally:
                with self._lock:
                    self._clients -= 1
                    self._quiet_since = time.monotonic()

        _start(serve)

    def _until_idle(self) -> float | None:
        """How long accept(2) may wait before the idle time is checked again, in seconds;
        None (for ever) without an idle exit."""
        if not self.idle_exit:
            return None
        with self._lock:
            quiet = time.monotonic() - self._quiet_since
        return max(0.05, self.idle_exit - quiet)

    def _leave_if_idle(self) -> bool:
        """Whether the daemon has been idle for :attr:`idle_exit` (no run, no client, no run of
        a dead daemon awaited) and has let go of its socket; then it exits.

        A client's connect must not be lost while the daemon decides: under the start lock
        (``SOCKET.start``, which a client holds while it starts a daemon: see
        :func:`gatewrap.shared.client.connect`), the listener is shut down, after which a
        connect is refused at once (unix(7): a listening socket shut down for reading takes
        no more; the client then waits for the start lock). A connection already queued is
        then still accepted: the daemon serves it and listens again. Otherwise it removes its
        socket and its lock before the start lock (:meth:`_let_go`), so that the waiting
        client starts a new daemon."""
        with self._lock:
            if (self.runs or self._clients or self._ends or self.awaiting
                    or time.monotonic() - self._quiet_since < self.idle_exit):
                return False
        try:
            start = lockfile.take(self.socket_path + ".start", wait=False)
        except BlockingIOError:
            return False  # a client is starting a daemon or waiting for this one: not idle
        try:
            listener = self._listener
            assert listener is not None
            listener.shutdown(socket.SHUT_RDWR)
            listener.setblocking(False)
            queued = []
            while True:
                try:
                    queued.append(listener.accept()[0])
                except OSError:
                    break
            if queued:
                self._listener = self._listen()
                self._listener.setblocking(False)
                listener.close()
                for conn in queued:
                    conn.setblocking(True)
                    self._serve_thread(conn)
                return False
            self.say(f"exiting: no run for {self.idle_exit:g} s (--idle-exit)")
            self._let_go(start)  # removes the start lock's file and lets go of it
            start = -1
            return True
        finally:
            if start >= 0:
                os.close(start)

    @contextlib.contextmanager
    def audit_logs(self) -> Iterator[Callable[[RunOptions], Any]]:
        """A run's way of opening its audit log (``plan``'s ``audit_logs``): the daemon's writer
        of that log (``runner.open_audit_log``), one per log for all the daemon's live runs (the
        writer takes the log's lock for each record and follows a rotation made by another
        process, so sharing it changes nothing of what is written). On leaving, the run lets go
        of what it took; the last run of a log closes its writer."""
        taken: list[tuple[str, int, int | None]] = []

        def open_log(opts: RunOptions) -> Any:
            key = (os.path.abspath(opts.audit_log), opts.audit_max_size, opts.audit_keep)
            with self._lock:
                held = self._audit_logs.get(key)
                if held is not None:
                    held[1] += 1
                    taken.append(key)
                    return held[0]
            log = runner.open_audit_log(opts)
            with self._lock:
                held = self._audit_logs.setdefault(key, [log, 0])
                held[1] += 1
                taken.append(key)
                return held[0]

        try:
            yield open_log
        finally:
            with self._lock:
                for key in taken:
                    held = self._audit_logs[key]
                    held[1] -= 1
                    if held[1] == 0:
                        del self._audit_logs[key]

    def _takeable(self, parent: str) -> set[str]:
        """Stale runs a dead daemon of this socket served whose client (the waiter, the
        agent's parent) still lives: kept for :meth:`_resume` instead of removed."""
        out = set()
        for run_id in gc.stale_runs(parent):
            saved = registry.saved(run_id)
            if (saved is not None and saved.get("socket") == self.socket_path
                    and registry.waiter_alive(run_id, saved) is not None and cgroup.populated(os.path.join(parent, run_id))):
                out.add(run_id)
        return out

    def _give_up(self, parent: str) -> None:
        """The take-back window is over: a run whose client did not come back is removed."""
        with self._lock:
            self.awaiting = set()
        for stale in gc.collect(parent, runner.salvager(self.hooks, "the gatewrap daemon"), waiting_for=self.socket_path).runs:
            self.say(f"removed stale sandbox {stale} (its gatewrap run did not come back)")
        self.hooks.sweep(parent)

    def _resume(self, conn: socket.socket, reader: protocol.Reader, run_id: str, pid: int) -> bool:
        """``resume RUN_ID`` from a run's waiter after a daemon restart: take the run back
        (its gate again in its netns), answer ``resumed``, then serve its end as usual. Only
        the run's own client may (SO_PEERCRED's pid is the one the run was saved with).
        Returns whether the connection was handed on (:meth:`_serve_end` closes it then)."""
        saved = registry.saved(run_id)
        if saved is None or saved.get("owner_pid") != pid or saved.get("socket") != self.socket_path:
            protocol.send_line(conn, f"refused: run {run_id} is not one this daemon can take back")
            return False
        with self._lock:
            self.awaiting.discard(run_id)
        err = _terminal_of(reader.fds)
        logs = contextlib.ExitStack()
        audit_logs = logs.enter_context(self.audit_logs())
        handed = False
        try:
            handed = self._take_back(conn, reader, run_id, pid, saved, err, audit_logs, logs.close)
            return handed
        finally:
            if not handed:
                err.close()
                logs.close()

    def _take_back(self, conn: socket.socket, reader: protocol.Reader, run_id: str, pid: int, saved: dict[str, Any],
                   err: Terminal, audit_logs: Callable[[RunOptions], Any], release: Callable[[], None]) -> bool:
        """:meth:`_resume` once the client is known to be the run's own; ``release`` lets go of
        its audit log at the run's end. Returns whether the connection was handed on."""
        opts = options(saved.get("opts"))
        try:
            planned = runner.plan_taken_back(run_id, opts, err,  # type: ignore[arg-type]
                                             policy_text=saved.get("policy_text"), audit_logs=audit_logs,
                                             policy_where=saved.get("policy_where"))
            box = runner.Sandbox(planned, err, hooks=self.hooks, owner_pid=pid,  # type: ignore[arg-type]
                                 shared_runtime=True, notice_fd=err.fileno(), reader=self.reader,
                                 socket=self.socket_path).take_back(saved)
        except GatewrapError as e:
            protocol.send_line(conn, f"refused: {e}")
            return False
        self.say(f"took run {run_id} back (its client, pid {pid}, came back)")
        print(f"gatewrap: the gatewrap daemon is back: run {run_id}'s gate serves again", file=err)
        try:
            protocol.send_line(conn, "resumed")
        except OSError:
            box.__exit__(None, None, None)
            raise
        return self._serve_end(conn, reader, box, run_id, saved.get("summary", "text"), err, release)

    @contextlib.contextmanager
    def _faults_answered(self, conn: socket.socket) -> Iterator[None]:
        """A client's request served inside: a protocol error is answered as a refusal (125), a
        failed connection said in the daemon's log, any other fault answered as the daemon's
        failure (125) and never raised: one run's fault must not take the daemon (and every
        other run) down."""
        try:
            yield
        except protocol.ProtocolError as e:
            with contextlib.suppress(OSError):
                protocol.send(conn, {"error": f"the daemon refused the request: {e}", "exit_code": 125})
        except OSError as e:
            self.say(f"a client connection failed: {e}")
        except Exception as e:
            self.say(f"internal error serving a client: {e!r}")
            with contextlib.suppress(OSError):
                protocol.send(conn, {"error": f"the daemon failed: {e}", "exit_code": 125})

    def _serve_one(self, conn: socket.socket) -> None:
        """One connection: check the peer, then answer its one request."""
        reader = protocol.Reader(conn)
        handed = False
        try:
            with self._faults_answered(conn):
                pid, uid, _ = protocol.peer(conn)
                if uid != 0:
                    protocol.send(conn, {"error": "only root may ask the gatewrap daemon for a sandbox (sudo gatewrap run ...)",
                                         "exit_code": 125})
                    return
                line = reader.line()
                if line is None:
                    return
                if line.startswith(b"resume "):
                    handed = self._resume(conn, reader, line[len(b"resume "):].decode(errors="replace").strip(), pid)
                    return
                msg = protocol.parse(line)
                if msg.get("op") == "status":
                    protocol.send(conn, {"pid": os.getpid(), "started": self.started, "runs": sorted(self.runs),
                                         "fds": fd_room(), "install": self.install})
                elif msg.get("op") == "run" and "install" in msg and protocol.other_install(msg["install"], self.install):
                    # before anything is set up: another install's client may expect another
                    # spawn spec, launcher or options (an older client sends no install)
                    self.say(f"refused a run of client pid {pid}: it is {protocol.shown_install(msg['install'])}")
                    protocol.send(conn, {"error": protocol.mismatch(self.socket_path, os.getpid(), self.install,
                                                                    msg["install"]),
                                         "exit_code": 125, "install": self.install})
                elif msg.get("op") == "run":
                    handed = self._run(conn, reader, msg, pid)
                elif msg.get("op") == "reload":
                    protocol.send(conn, self._reload(str(msg.get("run"))))
                elif msg.get("op") in ("container_create", "container_delete"):
                    protocol.send(conn, self._container(msg, pid))
                else:
                    raise protocol.ProtocolError(f"unknown op {msg.get('op')!r}")
        finally:
            if not handed:
                _close(conn, reader)

    def _container(self, msg: dict[str, Any], client_pid: int) -> dict[str, Any]:
        """A ``gatewrap-oci`` request (:mod:`gatewrap.oci.runs`): the answer, or the refusal."""
        from ..oci import runs

        try:
            if msg["op"] == "container_create":
                return runs.create(self, msg, client_pid)
            return runs.delete(self, msg)
        except GatewrapError as e:
            return {"error": str(e), "exit_code": e.exit_code}

    def container_terminal(self) -> Terminal:
        """Where a container's run's notices go: the daemon's log (a container has no terminal
        of gatewrap's; its engine keeps its own output)."""
        return Terminal(os.dup(self.log.fileno()))

    def add_container(self, run_id: str, run: Any, creator: int | None) -> None:
        """Keep container run ``run`` (:class:`gatewrap.oci.runs.ContainerRun`) until its
        delete, or until its container is dead and never deleted (:attr:`exits`);
        ``creator``: the pid of the gatewrap-oci that made it (None: gone)."""
        from ..oci.runs import Exits

        with self._lock:
            self.runs[run_id] = run.box
            self.containers[run_id] = run
            if self.exits is None:
                self.exits = Exits(self)
        self.exits.watch(run_id, run.box.leaf, creator)

    def take_container(self, run_id: str) -> Any:
        """The container run ``run_id``, no longer kept; None if there is none."""
        with self._lock:
            run = self.containers.pop(run_id, None)
            if run is not None:
                self.runs.pop(run_id, None)
            return run

    def _reload(self, run_id: str) -> dict[str, Any]:
        """``{"op": "reload", "run": ID}``: read the run's policy file again (:mod:`gatewrap.reload`);
        the answer is ``{"record": its policy_reload record}`` or ``{"error", "exit_code"}``."""
        from .. import reload

        box = self.runs.get(run_id)
        if box is None:
            return {"error": f"no live run {run_id} in this daemon (gatewrap ps lists them)", "exit_code": 1}
        try:
            return {"record": reload.reload_policy(box.plan, box.err, box.resolve_secrets_again)}
        except reload.ReloadFailed as e:
            file = box.plan.opts.policy_file
            rec = {"result": "failed", "error": str(e).removesuffix("; the policy in force is unchanged"),
                   **({"policy_file": file} if file else {})}
            return {"record": rec}
        except GatewrapError as e:
            return {"error": str(e), "exit_code": e.exit_code}

    def _current_hooks(self) -> loader.Hooks:
        """The hooks for a new run: the ones this daemon opened, or, once they were loaded again
        by another gatewrap (an unload, another version: :meth:`loader.Hooks.is_current`), the
        new ones. The old ones stay open for the runs configured in them."""
        with self._lock:
            assert self.hooks is not None
            if not self.hooks.is_current():
                self.hooks = loader.load_or_reuse(cgroup.parent_dir())
                self.say("the hooks were loaded again by another gatewrap: new runs use the new ones")
            return self.hooks

    def _run(self, conn: socket.socket, reader: protocol.Reader, msg: dict[str, Any], client_pid: int) -> bool:
        """A run's life on the daemon's side: plan, set up, hand the spawn to the client,
        wait for its ``exit CODE``, finish, send the summary; then let go of its terminal and
        audit log. Returns whether the connection was handed on (:meth:`_serve_end` closes it
        then)."""
        if len(reader.fds) != 1:
            raise protocol.ProtocolError("a run request carries exactly one fd, the client's stderr")
        err = Terminal(reader.fds.pop())
        logs = contextlib.ExitStack()
        audit_logs = logs.enter_context(self.audit_logs())
        handed = False
        try:
            handed = self._set_up(conn, reader, msg, client_pid, err, audit_logs, logs.close)
            return handed
        finally:
            if not handed:
                err.close()
                logs.close()

    def _set_up(self, conn: socket.socket, reader: protocol.Reader, msg: dict[str, Any], client_pid: int,
                err: Terminal, audit_logs: Callable[[RunOptions], Any], release: Callable[[], None]) -> bool:
        """:meth:`_run` with the run's terminal ``err``, its way of opening audit logs and of
        letting them go (``release``, at the run's end). Returns whether the connection was
        handed on."""
        opts = options(msg.get("opts"))
        try:
            planned = runner.plan(opts, err, audit_logs)  # type: ignore[arg-type]
            box = runner.Sandbox(planned, err, hooks=self._current_hooks(), owner_pid=client_pid,  # type: ignore[arg-type]
                                 shared_runtime=True, notice_fd=err.fileno(),
                                 reader=self.reader, socket=self.socket_path,
                                 summary="json" if msg.get("summary") == "json" else "text")
            box.__enter__()
        except GatewrapError as e:
            protocol.send(conn, {"error": str(e), "exit_code": e.exit_code})
            return False
        # A client that asks for it gets the run's netns with the reply (SCM_RIGHTS) and joins
        # it through its own descriptor: the daemon keeps none of an idle run's namespace.
        hand = msg.get("netns_fd") is True
        try:
            protocol.send(conn, {"spawn": box.spawn_spec(), "run": planned.run_id},
                          fds=[box.netns_fd()] if hand else None)
        except OSError:
            box.__exit__(None, None, None)
            raise
        if hand:
            box.let_go_of_netns()
        box.start_socket_scan()  # after the reply, which it would delay (see there)
        return self._serve_end(conn, reader, box, planned.run_id, msg.get("summary", "text"), err, release)

    def _serve_end(self, conn: socket.socket, reader: protocol.Reader, box: runner.Sandbox, run_id: str,
                   summary: str, err: Terminal, release: Callable[[], None]) -> bool:
        """Once the run's ``exit CODE`` comes (its connection waits in :attr:`parked`, with no
        thread of its own), finish the run, send its summary, tear it down; then close ``err``,
        let go of its audit log (``release``) and close the connection. Returns True: the
        connection is handed on."""
        with self._lock:
            self.runs[run_id] = box
        box.release_later = True

        def then() -> None:
            with self._lock:
                self._ends += 1
            try:
                with self._faults_answered(conn):
                    self._end(conn, reader, box, run_id, summary)
            finally:
                err.close()
                release()
                _close(conn, reader)
                with self._lock:
                    self._ends -= 1
                    self._quiet_since = time.monotonic()
                    self._ends_done.notify_all()

        if reader.has_line():
            then()
        else:
            self.parked.park(conn, then)
        return True

    def _end(self, conn: socket.socket, reader: protocol.Reader, box: runner.Sandbox, run_id: str,
             summary: str) -> None:
        """Read the run's ``exit CODE`` (or the end of its connection), finish the run, send
        its summary, tear it down."""
        try:
            line = reader.line()
            code = _exit_code(line)
            with self._ending:
                failed = _failure(line)
                if failed is not None:
                    box.finish(failed[0], reason=f"{runner.AGENT_NOT_STARTED}: {failed[1]}")
                    return
                if code is None:
                    box.finish(None, reason="the client (gatewrap run) went away before the agent's end")
                    return
                result = box.finish(code)
            box.err.wait_written(SUMMARY_WAIT)  # type: ignore[attr-defined]  # its last notices before its summary
            text = json.dumps(result.as_record()) if summary == "json" else summary_line(result)
            with contextlib.suppress(OSError):
                protocol.send_line(conn, text)
        finally:
            with self._lock:
                self.runs.pop(run_id, None)
            try:
                with self._ending:
                    box.__exit__(None, None, None)
            finally:
                # The client (the waiter, reading to the end) exits now: the sandbox is gone,
                # its records written and its lock released; only the removal of its ring
                # buffer from the hooks' map of maps is still waiting out an RCU grace
                # period (~12 ms), which no client needs to wait for.
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
                box.wait_released()


def _start(fn: Callable[[], None]) -> None:
    """``fn()`` on a new thread, as a daemon thread (it does not hold the process's exit),
    without waiting for it to run: ``threading.Thread.start`` waits until the new thread has
    run (a scheduling round trip: median 0.1 ms, p90 3 ms, up to 6 ms on the loaded 2-core
    test machine), on the critical path of a run's set-up, end or notices.

    Raises:
        RuntimeError: no thread could be started.
    """
    _thread.start_new_thread(fn, ())


def _close(conn: socket.socket, reader: protocol.Reader) -> None:
    """Close a client's connection and the descriptors it sent that are still ours."""
    for fd in reader.fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    conn.close()


def _terminal_of(fds: list[int]) -> Terminal:
    """A taken-back run's terminal: the stderr its waiter sent with ``resume`` (SCM_RIGHTS,
    taken from ``fds``), the user's own descriptor with its own file position and mode;
    without one (a waiter whose stderr is closed), nothing is shown."""
    if len(fds) == 1:
        return Terminal(fds.pop())
    return Terminal(os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC))


def _failure(line: bytes | None) -> tuple[int, str] | None:
    """(CODE, MESSAGE) of a ``failed CODE MESSAGE`` line (the client could not start the
    agent); None for anything else. CODE is gatewrap's: 125, 126 or 127."""
    if line is None or not line.startswith(b"failed "):
        return None
    code, _, message = line[len(b"failed "):].decode(errors="replace").strip().partition(" ")
    if code not in ("125", "126", "127"):
        return None
    return int(code), message[:1000]


def _exit_code(line: bytes | None) -> int | None:
    """CODE of an ``exit CODE`` line; None for the end of the stream or anything else."""
    if line is None:
        return None
    word, _, code = line.decode(errors="replace").partition(" ")
    digits = code.strip().removeprefix("-")
    # ASCII digits only (str.isdigit also takes "²", which int() refuses), and an exit code's size
    if word != "exit" or not (digits.isascii() and digits.isdigit() and len(digits) <= 3):
        return None
    return int(code)
