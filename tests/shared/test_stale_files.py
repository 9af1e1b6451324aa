"""What a SIGKILLed daemon leaves beside its socket (the socket, ``SOCKET.lock``; a client
killed while starting one: ``SOCKET.start``): ``gatewrap gc`` and the next daemon's start
remove it once no process holds its lock, and leave a live daemon's files and those of a
socket a client is starting a daemon on (gatewrap.shared.lockfile)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading

import pytest

from conftest import gatewrap_cmd
from gatewrap.shared import lockfile

from .conftest import Daemon

pytestmark = pytest.mark.kernel


def _files(d: Daemon) -> list[str]:
    return [p for p in (d.socket, d.socket + ".lock", d.socket + ".start") if os.path.exists(p)]


def _killed(*daemons: Daemon) -> None:
    """SIGKILL the daemons, once all have started (a daemon's start sweeps)."""
    for d in daemons:
        d.kill(signal.SIGKILL)
        assert _files(d)[:2] == [d.socket, d.socket + ".lock"], "what a SIGKILLed daemon leaves"


def test_gc_removes_what_a_sigkilled_daemon_left_and_leaves_a_live_ones_and_a_starting_ones():
    dead, starting, live = Daemon().start(), Daemon().start(), Daemon().start()
    _killed(dead, starting)
    start = lockfile.take(starting.socket + ".start")  # a client starting a daemon on it
    try:
        g = subprocess.run(gatewrap_cmd("gc", "--json"), capture_output=True, text=True, timeout=120)
        assert g.returncode == 0, g.stderr
        removed = sum(json.loads(g.stdout)["dead_daemons"], [])
        assert _files(dead) == [] and [dead.socket, dead.socket + ".lock"] in json.loads(g.stdout)["dead_daemons"]
        assert _files(starting) == [starting.socket, starting.socket + ".lock", starting.socket + ".start"]
        assert _files(live)[:2] == [live.socket, live.socket + ".lock"] and live.status()["pid"] == live.proc.pid
        assert not {*_files(starting), *_files(live)} & set(removed), removed
    finally:
        lockfile.remove(starting.socket + ".start", start)
        for d in (dead, starting, live):
            d.stop()



def test_gc_says_which_files_of_a_dead_daemon_it_removed():
    dead = Daemon().start()
    _killed(dead)
    try:
        g = subprocess.run(gatewrap_cmd("gc"), capture_output=True, text=True, timeout=120)
        assert g.returncode == 0, g.stderr
        assert f"removed {dead.socket}, {dead.socket}.lock (no daemon serves it: its daemon had died)" in g.stdout, \
            g.stdout
        assert _files(dead) == []
    finally:
        dead.stop()


def test_a_daemons_start_removes_what_a_sigkilled_daemon_of_another_socket_left():
    dead = Daemon().start()
    _killed(dead)
    d = Daemon()
    try:
        d.start()
        assert _files(dead) == []
        assert f"removed {dead.socket}, {dead.socket}.lock (no daemon serves it" in d.log_text(), d.log_text()
    finally:
        d.stop()
        dead.stop()


def test_a_daemon_starting_while_a_sweep_holds_the_dead_ones_lock_an_instant_still_starts():
    """A sweep holds a dead daemon's lock for the instant it removes its files: a daemon
    started on that socket then must wait for it, not refuse to start as if one served it."""
    dead = Daemon().start()
    _killed(dead)
    held = lockfile.take(dead.socket + ".lock", wait=False)
    threading.Timer(0.3, lambda: lockfile.remove(dead.socket + ".lock", held)).start()
    again = Daemon.restart_of(dead)  # starts while the lock is held
    try:
        assert again.status()["pid"] == again.proc.pid
    finally:
        again.stop()
