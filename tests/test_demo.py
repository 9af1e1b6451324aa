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
