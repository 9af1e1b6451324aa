"""The README's demo command, end to end: examples/demo.py builds its own fake internet, runs
examples/agent.py under gatewrap and prints the audit log (what `scripts/setup.sh demo` runs)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.kernel


def test_the_demo_shows_the_fetch_the_403_the_eperm_and_the_summary():
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    p = subprocess.run([sys.executable, str(ROOT / "examples" / "demo.py")], capture_output=True, text=True,
                       timeout=120, env=env)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "agent: fetched https://allowed.test/: 200" in out
    assert "answered 403" in out
    assert "[Errno 1] egress to 198.51.100.148:80 was blocked by gatewrap" in out
    assert "exited 0: 1 allowed, 1 denied by the gate, 1 direct egress blocked" in out
    last = p.stdout.rstrip("\n").splitlines()[-1]
    # it ends on what to do next, not on the raw JSON of its last command
    assert last.startswith("next: ") and "gatewrap audit --log /tmp/gatewrap-demo-" in last, last
    assert "docs/tutorials/wrap-an-agent.md" in last and len(last) < 200, last


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_the_demo_asked_for_help_says_what_it_does_and_runs_nothing(flag):
    p = subprocess.run([sys.executable, str(ROOT / "examples" / "demo.py"), flag], capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "--keep" in p.stdout and "fake internet" in p.stdout
    assert "$ gatewrap run" not in p.stdout, p.stdout  # the demo echoes each command it runs
