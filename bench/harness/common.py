"""Shared helpers: paths, timing, statistics, subprocesses, missing peers."""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import time
from typing import Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "bench", "results")
VENV_PY = os.path.join(ROOT, ".venv", "bin", "python")
# The agent's uid for `gatewrap run` (as in bench/kernel_burst.py): not root, so it is jailed
# by nsjail as a real run is.
AGENT_UID = 65534


class Missing(Exception):
    """A peer or tool is not installed; the section reports it instead of failing."""


def need(tool: str) -> str:
    """The path of ``tool`` on PATH; raises :class:`Missing` naming it."""
    path = shutil.which(tool)
    if path is None:
        raise Missing(tool)
    return path


def gatewrap_argv(audit: str, *extra: str) -> list[str]:
    """``gatewrap run`` of this worktree's venv (``GATEWRAP_PYTHON`` to pick another build),
    writing its audit to ``audit``; the agent command follows ``--``."""
    py = os.environ.get("GATEWRAP_PYTHON", VENV_PY)
    own = [] if "--shared" in extra else ["--own"]  # the default is the host's shared daemon
    return [py, "-m", "gatewrap", "run", *own, "--audit-log", audit, "--workdir", "/tmp", *extra]


def agent_env() -> dict[str, str]:
    """The environment for ``gatewrap run``: the agent runs as :data:`AGENT_UID`."""
    return dict(os.environ, SUDO_UID=str(AGENT_UID), SUDO_GID=str(AGENT_UID))


def timed(argv: Sequence[str], env: dict[str, str] | None = None, timeout: float = 120) -> float:
    """Wall seconds of one run of ``argv`` (stdout and stderr discarded); raises
    CalledProcessError when it fails."""
    t0 = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                   timeout=timeout, check=True)
    return time.perf_counter() - t0


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b`` rounded to 2 places, None when either is missing or b is 0."""
    if a is None or not b:
        return None
    return round(a / b, 2)


def versus_squid(cells: dict[str, dict]) -> None:
    """Add ``rps_vs_squid`` and ``p99_vs_squid`` (ratios) to every cell of ``cells``
    (``{proxy: {"rps", "p99_ms", ...}}``) but Squid's, when Squid has one."""
    sq = cells.get("squid")
    for name, c in cells.items():
        if sq and name != "squid":
            c["rps_vs_squid"] = ratio(c["rps"], sq["rps"])
            c["p99_vs_squid"] = ratio(c["p99_ms"], sq["p99_ms"])


#: The socket of the harness's own gatewrap daemon (the shared mode's runs).
DAEMON_SOCKET = "/run/gatewrap/bench-harness.sock"


class SharedDaemon:
    """``gatewrap daemon`` on ``socket_path`` for the shared mode's rows, answering once
    entered; stopped (SIGTERM) on leaving. ``env``: ``gatewrap run --shared`` uses it (the
    agent as :data:`AGENT_UID`). ``gatewrap``: the command that is gatewrap (default:
    ``GATEWRAP_PYTHON -m gatewrap``, or this worktree's venv)."""

    def __init__(self, gatewrap: list[str] | None = None, socket_path: str = DAEMON_SOCKET) -> None:
        self.gatewrap = gatewrap or [os.environ.get("GATEWRAP_PYTHON", VENV_PY), "-m", "gatewrap"]
        self.socket_path = socket_path

    def __enter__(self) -> "SharedDaemon":
        import socket

        self.env = dict(agent_env(), GATEWRAP_DAEMON_SOCKET=self.socket_path)
        self.proc = subprocess.Popen([*self.gatewrap, "daemon", "--socket", self.socket_path],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 60
        while True:
            with socket.socket(socket.AF_UNIX) as s:
                try:
                    s.connect(self.socket_path)
                    return self
                except OSError:
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        self.__exit__()
                        raise RuntimeError("the gatewrap daemon did not start")
            time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(60)

