"""Escape suite, the CLI's run names: what a local user leaves for root's ``gatewrap stop`` or
``gatewrap reload`` (a run's name or a start of it, as ``gatewrap ps`` shows) must not make it
signal a process that is no run's. A run's lock file is ``/run/gatewrap/runs/<id>.lock``, root's; a name
with ``/`` would have read one anywhere."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import time

import pytest

from conftest import ROOT, gatewrap_cmd


@pytest.mark.parametrize("cmd", [["stop", "--timeout", "1"], ["reload", "--timeout", "1"]], ids=["stop", "reload"])
def test_gatewrap_stop_and_reload_take_no_path_for_a_run_name(tmp_path, outcome, cmd):
    """gatewrap stop|reload ../../../tmp/X: a lock file a local user made and holds, naming a
    victim's pid (stop would SIGTERM it, reload SIGHUP it). The registry's paths refuse any
    name that is not a file name of its folder (sandbox/registry.py)."""
    victim = subprocess.Popen(["sleep", "60"])
    lock = tmp_path / "evil.lock"
    lock.write_text(json.dumps({"audit_log": "/dev/null", "pid": victim.pid}))
    held = os.open(lock, os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        name = "../../.." + str(tmp_path / "evil")
        r = subprocess.run(gatewrap_cmd(cmd[0], name, *cmd[1:]), capture_output=True, text=True,
                           timeout=60, cwd=ROOT)
        time.sleep(0.2)
        signalled = victim.poll() is not None
        outcome(f"gatewrap {cmd[0]}: the run's name", f"exit {r.returncode}; the victim "
                f"{'got a signal' if signalled else 'untouched'}", "OPEN" if signalled else "held")
        assert not signalled, r.stderr
        assert r.returncode == 1 and "no live run" in r.stderr, r.stderr
    finally:
        os.close(held)
        victim.kill()
        victim.wait()
