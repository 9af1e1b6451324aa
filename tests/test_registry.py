"""The run registry's view of processes (gatewrap.sandbox.registry)."""

from __future__ import annotations

import os
import subprocess
import sys

from gatewrap.sandbox import registry


def test_a_process_start_time_is_its_ticks_since_boot_and_names_that_process_only():
    me = registry.process_started(os.getpid())
    assert isinstance(me, int) and me == registry.process_started(os.getpid())
    # A command name with spaces and parentheses does not shift the fields.
    child = subprocess.Popen([sys.executable, "-c", "import sys; open('/proc/self/comm', 'w').write('a) b (c');"
                              " print('ready', flush=True); sys.stdin.read()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline() == b"ready\n"
        with open(f"/proc/{child.pid}/comm") as f:
            assert f.read().strip() == "a) b (c"
        started = registry.process_started(child.pid)
        assert isinstance(started, int) and started >= me
    finally:
        child.communicate(b"")
    assert registry.process_started(child.pid) is None  # gone (reaped)
