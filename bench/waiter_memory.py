#!/usr/bin/env python3
"""Memory of a waiting ``gatewrap-wait`` (the shared mode's agent parent), against the Python
client it replaces.

Starts N waiters the way the client does (tests/waiter_driver.py: subreaper, signals blocked,
the agent ``sleep 3600`` spawned, then ``gatewrap.shared.waiter.exec_waiter``), each with its
own socketpair as the daemon's end, waits until each is blocked in poll(2), and reads
``/proc/PID/smaps_rollup`` (proc(5)): Rss, Pss, and private = Private_Clean + Private_Dirty
(Private_Dirty alone too: what no other process can share, ever). The first waiter is measured
alone, then all N together (Pss shares the binary's pages among them). For comparison the
same figures of the client's interpreter at the point of the exec (the driver's Python with
gatewrap.shared.waiter imported, paused before exec). Figures in KiB. No root needed.

A binary installed moments ago counts its page-cache pages, dirty until written back (about
30 s, vm.dirty_expire_centisecs), as the first waiter's Private_Dirty: measure after that.

    .venv/bin/python bench/waiter_memory.py [-n 10] [--json bench/results/waiter_memory.json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from gatewrap.shared import waiter

ROOT = Path(__file__).resolve().parent.parent
DRIVER = ROOT / "tests" / "waiter_driver.py"
FIELDS = ("Rss", "Pss", "Private_Clean", "Private_Dirty")


def rollup(pid: int) -> dict[str, int]:
    """``/proc/PID/smaps_rollup``'s fields of :data:`FIELDS` plus ``Private``, in KiB."""
    got: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in FIELDS:
            got[key] = int(rest.split()[0])
    got["Private"] = got["Private_Clean"] + got["Private_Dirty"]
    return got


def waiting(pid: int) -> bool:
    """Whether ``pid`` runs gatewrap-wait and sleeps in poll(2) (``/proc/PID/wchan``)."""
    try:
        exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
        wchan = Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return False
    return exe == "gatewrap-wait" and "poll" in wchan


def start_waiter() -> tuple[subprocess.Popen, socket.socket]:
    daemon, theirs = socket.socketpair()
    proc = subprocess.Popen([sys.executable, str(DRIVER), "--control-fd", str(theirs.fileno()),
                             "--cgroup", "/nonexistent", "--", "sleep", "3600"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, pass_fds=[theirs.fileno()])
    theirs.close()
    proc.stdout.readline()
    deadline = time.monotonic() + 60
    while not waiting(proc.pid):
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit(f"waiter {proc.pid} did not start waiting")
        time.sleep(0.01)
    return proc, daemon


def python_client() -> dict[str, int]:
    """The client's interpreter just before the exec: Python with the waiter module imported."""
    code = "import gatewrap.shared.waiter, signal, sys; print('ready', flush=True); signal.pause()"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        proc.stdout.readline()
        return rollup(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def stop(proc: subprocess.Popen, daemon: socket.socket) -> None:
    """End the agent (SIGTERM through the waiter) and let the waiter exit."""
    proc.send_signal(signal.SIGTERM)
    daemon.recv(64)
    daemon.close()
    proc.wait(timeout=60)


def show(label: str, figures: dict[str, int]) -> None:
    print(f"{label:<34} " + "  ".join(f"{k} {figures[k]:>6} KiB" for k in ("Rss", "Pss", "Private", "Private_Dirty")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=10, help="waiters at once (default 10)")
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "waiter_memory.json")
    opts = parser.parse_args()
    if waiter.find() is None:
        raise SystemExit("no gatewrap-wait beside this interpreter or on PATH: sudo scripts/setup.sh install")

    waiters = [start_waiter()]
    alone = rollup(waiters[0][0].pid)
    try:
        waiters += [start_waiter() for _ in range(opts.n - 1)]
        together = [rollup(p.pid) for p, _ in waiters]
    finally:
        for proc, daemon in waiters:
            stop(proc, daemon)
    median = {k: int(statistics.median(f[k] for f in together)) for k in together[0]}
    client = python_client()
    binary = Path(waiter.find() or "gatewrap-wait")
    print(f"gatewrap-wait {binary} ({binary.stat().st_size // 1024} KiB on disk)")
    show("one waiter, alone", alone)
    show(f"median of {opts.n} waiters at once", median)
    show("the Python client (for comparison)", client)
    opts.json.parent.mkdir(parents=True, exist_ok=True)
    opts.json.write_text(json.dumps({"alone": alone, "median_of_n": median, "n": opts.n,
                                     "python_client": client, "kib": True}, indent=1) + "\n")


if __name__ == "__main__":
    main()
