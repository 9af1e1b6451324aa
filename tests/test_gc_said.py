"""What a run's start (and a daemon's) says of the sandboxes it collected or left alone is
bounded (gc.said_of): a host holding thousands of another install's sandboxes once filled the
stderr pipe of a run's caller with a line each, and the run hung writing them."""

from __future__ import annotations

import os
import subprocess

import pytest

from conftest import gatewrap_cmd
from gatewrap.sandbox import cgroup, gc, registry


def test_each_kind_is_said_in_at_most_max_said_lines_and_what_was_said_is_not_said_again(tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "RUNS_DIR", str(tmp_path))
    ids = [f"gw-{i:010x}" for i in range(20)]
    collected = gc.Collected(runs=ids[:12], left=[(i, "not started by this gatewrap's registry") for i in ids])
    said = gc.said_of(collected)
    assert len(said) == 2 * (gc.MAX_SAID + 1), said
    assert said[gc.MAX_SAID] == f"removed {12 - gc.MAX_SAID} more stale sandboxes (their gatewrap had died)"
    assert said[-1].startswith(f"left {20 - gc.MAX_SAID} more sandboxes alone") and "gatewrap gc --json" in said[-1]
    again = gc.said_of(gc.Collected(left=collected.left))
    assert again == [], "each left alone is said once"


@pytest.mark.kernel
@pytest.mark.own_process  # the run's own start collects (a daemon collects at its start only)
def test_a_run_starting_beside_many_foreign_sandboxes_says_a_bounded_summary(tmp_path):
    parent = cgroup.parent_dir()
    foreign = [os.path.join(parent, "gw-f0" + os.urandom(4).hex()) for _ in range(40)]
    for leaf in foreign:
        os.mkdir(leaf)
    try:
        p = subprocess.run(gatewrap_cmd("run", "--own", "--audit-log", str(tmp_path / "audit.jsonl"),
                                        "--workdir", "/tmp", "--", "/bin/true"),
                           capture_output=True, text=True, timeout=60, env={**os.environ, "SUDO_UID": "65534",
                                                                            "SUDO_GID": "65534"})
    finally:
        for leaf in foreign:
            os.rmdir(leaf)
    assert p.returncode == 0, p.stderr
    left = [line for line in p.stderr.splitlines() if line.startswith("gatewrap: left ")]
    assert len(left) <= gc.MAX_SAID + 1, p.stderr
    assert any("more sandboxes alone" in line for line in left), p.stderr
