"""Resource limits of a run: --timeout, and --memory/--cpus/--pids on cgroup v2 controllers."""

from __future__ import annotations

import time

import pytest

from gatewrap.sandbox.cgroup import cgroup2_mount
from gatewrap.sandbox.limits import parse_size

pytestmark = pytest.mark.kernel


def _controllers() -> list[str]:
    with open(f"{cgroup2_mount()}/cgroup.controllers") as f:
        return f.read().split()


@pytest.mark.parametrize("text,size", [("1048576", 1 << 20), ("512M", 512 << 20), ("2g", 2 << 30), ("1GiB", 1 << 30)])
def test_sizes_are_read_in_binary_units(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "0", "12X", "-1M", "1.5G"])
def test_bad_sizes_are_refused(text):
    with pytest.raises(ValueError):
        parse_size(text)


def test_timeout_kills_the_whole_tree_and_exits_124(gatewrap):
    t0 = time.monotonic()
    r = gatewrap(["/bin/sh", "-c", "sleep 30 & sleep 30"], extra=["--timeout", "1"])
    assert r.returncode == 124, r.stderr
    assert time.monotonic() - t0 < 10
    assert "--timeout 1 s reached" in r.stderr


def test_pids_and_memory_limits_hold_or_say_why_they_cannot(gatewrap):
    r = gatewrap(python="""
        import os
        print(open("/sys/fs/cgroup/pids.max").read().strip() if os.path.exists("/sys/fs/cgroup/pids.max") else "-")
    """, extra=["--pids", "20", "--memory", "256M"])
    if {"memory", "pids"} <= set(_controllers()):
        assert r.returncode == 0, r.stderr
    else:  # a hybrid layout (these VMs): the controllers live in cgroup v1
        assert r.returncode == 125
        assert "cannot be enforced here" in r.stderr and "hybrid" in r.stderr
