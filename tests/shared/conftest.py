"""A gatewrap daemon of the tests' own, on a socket of its own."""

from __future__ import annotations

import fcntl
import os
import secrets
import signal
import subprocess
import time

import pytest

from conftest import gatewrap_cmd


class Daemon:
    """``gatewrap daemon`` started by a test: ``env`` makes a ``gatewrap run`` use it."""

    def __init__(self, *args: str) -> None:
        self.args = args
        self.socket = f"/run/gatewrap/test-daemon-{secrets.token_hex(3)}.sock"
        self.env = {"GATEWRAP_SHARED": "1", "GATEWRAP_DAEMON_SOCKET": self.socket}
        self.log = f"/tmp/gwt-daemon-{secrets.token_hex(3)}.log"
        self.proc: subprocess.Popen | None = None

    @classmethod
    def restart_of(cls, dead: "Daemon") -> "Daemon":
        """A new daemon on ``dead``'s socket (a restart), started."""
        d = cls(*dead.args)
        d.socket, d.env = dead.socket, dict(dead.env)
        try:
            return d.start()
        except BaseException:
            d.kill()
            raise

    def start(self) -> "Daemon":
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(gatewrap_cmd("daemon", "--socket", self.socket, *self.args),
                                         stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + 60
        while not self._answers():  # a dead daemon's socket file may be there already
            assert self.proc.poll() is None, self.log_text()
            assert time.monotonic() < deadline, self.log_text()
            time.sleep(0.05)
        return self

    def _answers(self) -> bool:
        import socket

        with socket.socket(socket.AF_UNIX) as s:
            try:
                s.connect(self.socket)
            except OSError:
                return False
        return True

    def status(self) -> dict:
        import json

        out = subprocess.run(gatewrap_cmd("daemon", "--socket", self.socket, "--status", "--json"),
                             capture_output=True, text=True, timeout=30)
        return json.loads(out.stdout)

    def log_text(self) -> str:
        with open(self.log, errors="replace") as f:
            return f.read()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        """Stop the daemon (SIGTERM), and remove what a killed one left of its socket, unless
        another daemon serves that socket now (one a run started on demand: see
        :func:`lock_holder`; its files are its own, and whoever made it stops it)."""
        self.kill(signal.SIGTERM)
        if lock_holder(self.socket) is not None:
            return
        for leftover in (self.socket, self.socket + ".lock", self.socket + ".start"):
            if os.path.exists(leftover):
                os.unlink(leftover)


def lock_holder(socket_path: str) -> int | None:
    """The pid of the daemon serving ``socket_path``: the one holding the lock beside it, who
    wrote its pid there; None when no process holds it (a pid in a file nobody holds may be
    another process's by now)."""
    try:
        fd = os.open(socket_path + ".lock", os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            return int(os.pread(fd, 32, 0))
        except ValueError:
            return None  # held, its pid not written yet
    finally:
        os.close(fd)
    return None


@pytest.fixture(scope="module")
def daemon():
    """A daemon for the module's runs."""
    d = Daemon().start()
    yield d
    d.stop()
