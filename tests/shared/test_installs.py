"""A ``gatewrap run`` and a daemon of two gatewrap installs (two venvs, two checkouts, or one
reinstalled under a running daemon): the daemon refuses the run at once, before anything is
set up, and the client says both installs and what to do; a client or daemon that says
nothing of its install (an older one) is still served, and a client whose older daemon just
closes the connection says what it found."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

import gatewrap
from conftest import AGENT_UID, gatewrap_cmd
from gatewrap.shared import protocol

from .conftest import Daemon

pytestmark = pytest.mark.kernel

#: This install's package folder, as the client names it.
OURS = os.path.dirname(os.path.abspath(gatewrap.__file__))


def _install_copy(at: Path) -> Path:
    """Another install of gatewrap: this one's package copied to ``at``/gatewrap, its files
    written anew (as pip writes them: their mtimes now). Its ``python -m gatewrap`` with
    PYTHONPATH=``at`` runs it."""
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(at / "gatewrap")
    shutil.copytree(OURS, at / "gatewrap", symlinks=True, copy_function=shutil.copy,
                    ignore=shutil.ignore_patterns("__pycache__"))
    return at / "gatewrap"


class CopyDaemon(Daemon):
    """A daemon of the install copied to ``at`` (:func:`_install_copy`)."""

    def __init__(self, at: Path) -> None:
        super().__init__()
        self.at = at

    def start(self) -> "CopyDaemon":
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(gatewrap_cmd("daemon", "--socket", self.socket), stdout=log, stderr=log,
                                         start_new_session=True, cwd="/",
                                         env={**os.environ, "PYTHONPATH": str(self.at)})
        deadline = time.monotonic() + 60
        while not self._answers():
            assert self.proc.poll() is None, self.log_text()
            assert time.monotonic() < deadline, self.log_text()
            time.sleep(0.05)
        return self


def _run(d: Daemon, *, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **d.env, "SUDO_UID": str(AGENT_UID), "SUDO_GID": str(AGENT_UID)}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run(gatewrap_cmd("run", "--workdir", "/tmp", "--", "/bin/true"), capture_output=True, text=True,
                          env=env, timeout=120, cwd="/")


def _stop(socket_path: str) -> subprocess.CompletedProcess:
    return subprocess.run(gatewrap_cmd("daemon", "--socket", socket_path, "--stop"), capture_output=True, text=True,
                          timeout=90)


def test_a_run_against_a_daemon_of_another_install_is_refused_saying_both_and_what_to_do(tmp_path):
    other = _install_copy(tmp_path)
    d = CopyDaemon(tmp_path).start()
    try:
        status = subprocess.run(gatewrap_cmd("daemon", "--socket", d.socket, "--status"), capture_output=True,
                                text=True, timeout=30)
        assert f"; gatewrap {gatewrap.__version__} in {other} (installed " in status.stdout, status
        assert d.status()["install"]["path"] == str(other)
        p = _run(d)
        assert p.returncode == 125, p.stderr
        said = " ".join(p.stderr.split())
        assert (f"the gatewrap daemon on {d.socket} (pid {d.proc.pid}) is another gatewrap install than this "
                f"gatewrap run's (another folder): the daemon runs gatewrap {gatewrap.__version__} in {other} (installed ") in said, said
        assert f"this gatewrap run is gatewrap {gatewrap.__version__} in {OURS} (installed " in said, said
        assert f"Stop the daemon with sudo gatewrap daemon --stop --socket {d.socket} " in said, said
        assert "closed the connection" not in said and d.status()["runs"] == [], said  # refused before any set-up
        assert "refused a run of client pid" in d.log_text()
        # what it says to do: stop it, run again (a daemon of this install starts on demand)
        assert _stop(d.socket).returncode == 0
        again = _run(d)
        assert again.returncode == 0, again.stderr
        assert d.status()["install"]["path"] == OURS
    finally:
        _stop(d.socket)
        d.stop()


def test_a_daemon_running_while_its_install_is_written_anew_refuses_the_new_installs_runs(tmp_path):
    other = _install_copy(tmp_path)
    d = CopyDaemon(tmp_path).start()
    try:
        before = d.status()["install"]["installed"]
        time.sleep(0.05)
        _install_copy(tmp_path)  # reinstalled under the running daemon: same folder, same version
        p = _run(d, pythonpath=tmp_path)
        assert p.returncode == 125, p.stderr
        said = " ".join(p.stderr.split())
        assert "(the same version in the same folder, written anew since the daemon started)" in said, said
        assert said.count(f"gatewrap {gatewrap.__version__} in {other} (installed ") == 2, said
        assert d.status()["install"]["installed"] == before  # the daemon's is what it started with
    finally:
        d.stop()


def test_a_daemon_serves_a_client_that_says_nothing_of_its_install(daemon, tmp_path):
    """An older client sends no ``install``: the daemon does not compare, and sets the
    sandbox up (the spawn reply), as before; the client's ``failed`` then tears it down."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(daemon.socket)
    try:
        opts = {"argv": ["/bin/true"], "environ": {"PATH": "/usr/bin:/bin"}, "cwd": "/tmp",
                "audit_log": str(tmp_path / "audit.jsonl")}
        protocol.send(sock, {"op": "run", "opts": opts, "summary": "text"}, fds=[2])
        reply = protocol.Reader(sock).message()
        assert reply is not None and "spawn" in reply and "error" not in reply, reply
        protocol.send_line(sock, "failed 125 an older client gave up")
        protocol.Reader(sock).rest()
    finally:
        sock.close()


def test_a_client_whose_older_daemon_closes_the_connection_says_so_and_what_to_do(tmp_path):
    """An older daemon (its status names no install) that closes a run's connection without a
    reply: the client asks its status, on this failure only, and says it is another install.
    The older daemon is played by this test (it answers as one did: no ``install``)."""
    path = f"/run/gatewrap/test-older-{os.getpid()}.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen(8)
    stop = threading.Event()

    def older_daemon() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                reader = protocol.Reader(conn)
                msg = reader.message()
                for fd in reader.fds:  # a run's: the client's stderr
                    os.close(fd)
                if msg and msg.get("op") == "status":
                    protocol.send(conn, {"pid": os.getpid(), "started": time.time(), "runs": []})
                # a run: closed without a word

    t = threading.Thread(target=older_daemon, daemon=True)
    t.start()
    try:
        env = {**os.environ, "GATEWRAP_SHARED": "1", "GATEWRAP_DAEMON_SOCKET": path}
        p = subprocess.run(gatewrap_cmd("run", "--", "/bin/true"), capture_output=True, text=True, env=env, timeout=60)
        said = " ".join(p.stderr.split())
        assert p.returncode == 125, said
        assert "the gatewrap daemon closed the connection before the sandbox was up" in said, said
        assert (f"the gatewrap daemon on {path} (pid {os.getpid()}) is another gatewrap install than this gatewrap "
                "run's: the daemon runs an older gatewrap, which does not say its version or folder; this gatewrap "
                f"run is gatewrap {gatewrap.__version__} in {OURS} (installed ") in said, said
        assert f"sudo gatewrap daemon --stop --socket {path} " in said, said
    finally:
        stop.set()
        listener.close()
        os.unlink(path)
        t.join(timeout=10)


def test_an_install_time_past_time_t_is_shown_not_raised():
    """Found by an attacker: an ``installed`` past time_t raised OverflowError (the daemon
    answered "the daemon failed" instead of its refusal; ``daemon --status`` a traceback)."""
    for installed in (10**30, -(10**30), 2**1100):
        shown = protocol.shown_install({"version": "0.1.0", "path": "/x", "installed": installed})
        assert shown.startswith("gatewrap 0.1.0 in /x (installed "), shown
    text = protocol.mismatch("/run/x.sock", 1, {"version": "0", "path": "/a", "installed": 10**30}, protocol.install())
    assert "another gatewrap install" in text
