"""Who a kernel denial names (cli/gatewrap/attribution.py), read from /proc of real processes:
a process that exited before its record was made is said to be partly known, never given an
empty executable (the CI of stop 29 found ``exe: ""`` on a child whose record came after it had
printed and exited)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from gatewrap.attribution import Attributor, cgroup_of


def _own_run() -> Attributor:
    """An attributor whose "run" is this test's own cgroup (every child of it is in the run)."""
    return Attributor(cgroup_of(os.getpid()) or "/")


def test_a_live_process_is_named_by_its_executable_and_parents():
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        rec = _own_run().of(child.pid)
        assert rec["exe"] == os.path.realpath(sys.executable), rec
        assert rec["parents"][0]["pid"] == os.getpid() and "attribution" not in rec, rec
    finally:
        child.communicate()


def test_a_process_that_exited_before_its_record_is_partly_known_without_an_empty_executable():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    # not waited for: a zombie, whose /proc entry, stat and cgroup stay but whose exe is gone
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with open(f"/proc/{child.pid}/stat", "rb") as f:
            if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                break
        time.sleep(0.01)
    try:
        rec = _own_run().of(child.pid)
        assert rec.get("attribution") == "partial", rec
        assert "exe" not in rec, rec
    finally:
        child.wait()
