"""The shared daemon's life: what a finished run leaves in it (nothing)."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from conftest import AGENT_UID, gatewrap_cmd

from .conftest import Daemon

pytestmark = pytest.mark.kernel


def _true_run(d: Daemon, audit) -> subprocess.CompletedProcess:
    """``gatewrap run --audit-log AUDIT -- /bin/true`` on daemon ``d``."""
    env = {**os.environ, **d.env, "SUDO_UID": str(AGENT_UID), "SUDO_GID": str(AGENT_UID)}
    return subprocess.run(gatewrap_cmd("run", "--audit-log", str(audit), "--workdir", "/tmp", "--", "/bin/true"),
                          capture_output=True, text=True, env=env, timeout=120)


def _fds(pid: int) -> dict[str, str]:
    """Open descriptors of process ``pid``: fd -> what it is (/proc/PID/fd, proc(5))."""
    out = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out[fd] = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:
            pass
    return out


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def _steady(pid: int) -> tuple[int, int]:
    """(open fds, threads) of ``pid`` once they stayed the same for a second (at most 30 s)."""
    deadline = time.monotonic() + 30
    last = None
    while True:
        now = len(_fds(pid)), _threads(pid)
        if now == last or time.monotonic() > deadline:
            return now
        last = now
        time.sleep(1)


def _settled(pid: int, fds: int, threads: int) -> tuple[int, int]:
    """(open fds, threads) of ``pid`` once both are at most ``fds`` and ``threads``, or as they
    are after 30 s (a run's last teardown steps, and idle pool threads, end on their own)."""
    deadline = time.monotonic() + 30
    while True:
        now = len(_fds(pid)), _threads(pid)
        if (now[0] <= fds and now[1] <= threads) or time.monotonic() > deadline:
            return now
        time.sleep(0.2)


def test_the_daemon_keeps_no_descriptor_nor_thread_of_a_finished_run(tmp_path):
    d = Daemon().start()
    try:
        pid = d.proc.pid
        first = _true_run(d, tmp_path / "first.jsonl")  # what a first run makes once (the runtime, the reader)
        assert first.returncode == 0, first.stderr
        fds, threads = _steady(pid)
        logs = [tmp_path / f"audit-{i}.jsonl" for i in range(5)]
        for log in logs:
            r = _true_run(d, log)
            assert r.returncode == 0, r.stderr
            assert any(rec for rec in log.read_text().splitlines() if '"run_end"' in rec)
        after = _settled(pid, fds, threads)
        still_open = [what for what in _fds(pid).values() if what.startswith(str(tmp_path))]
        assert still_open == [], d.log_text()
        assert after[0] <= fds, f"open fds {after[0]}, {fds} before the runs: {sorted(_fds(pid).values())}"
        assert after[1] <= threads, f"threads {after[1]}, {threads} before the runs"
    finally:
        d.stop()
