"""Waiting for a server to listen on loopback."""

from __future__ import annotations

import socket
import subprocess
import time


def listening(port: int, host: str = "127.0.0.1") -> bool:
    """True when a TCP connect to ``host:port`` succeeds."""
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def wait_listening(proc: subprocess.Popen, ports: list[int], name: str, timeout: float = 20) -> None:
    """Return once every port listens; raises RuntimeError if ``proc`` exits or ``timeout``
    seconds pass first."""
    deadline = time.monotonic() + timeout
    while not all(listening(p) for p in ports):
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited {proc.returncode} before listening on {ports}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} not listening on {ports} after {timeout} s")
        time.sleep(0.05)
