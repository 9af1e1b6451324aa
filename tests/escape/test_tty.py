"""The agent cannot type into the terminal gatewrap was started from (TIOCSTI)."""

from __future__ import annotations

import fcntl
import os
import pty
import subprocess
import termios

import pytest

from conftest import AGENT_PYTHON, gatewrap_cmd

pytestmark = pytest.mark.kernel

AGENT = (
    "import errno, fcntl, termios\n"
    "try:\n"
    "    fcntl.ioctl(0, termios.TIOCSTI, b'x')\n"
    "    print('INJECTED', flush=True)\n"
    "except OSError as e:\n"
    "    print(errno.errorcode[e.errno], flush=True)\n"
)


@pytest.mark.parametrize("jail", [[], ["--jail", "none"]], ids=["in the jail (seccomp)", "without the jail (seccomp, own session)"])
def test_tiocsti_on_the_callers_terminal_is_refused(tmp_path, jail, outcome):
    """TIOCSTI on the terminal gatewrap was started from."""
    master, slave = pty.openpty()
    env = dict(os.environ, SUDO_UID="65534", SUDO_GID="65534")
    p = subprocess.run(gatewrap_cmd("run", "--audit-log", str(tmp_path / "a.jsonl"), "--workdir", "/tmp", *jail,
                                    "--", AGENT_PYTHON, "-c", AGENT),
                       stdin=slave, capture_output=True, text=True, timeout=60, env=env,
                       # gatewrap's controlling terminal is the pty, as in an interactive shell
                       start_new_session=True,
                       preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))
    os.close(slave)
    os.set_blocking(master, False)
    try:
        typed = os.read(master, 100)
    except (BlockingIOError, OSError):  # nothing queued; EIO once the slave side is closed
        typed = b""
    os.close(master)
    got = p.stdout.strip()
    outcome("seccomp (jail)" if not jail else "seccomp (launcher); kernel: no controlling terminal (setsid)",
            f"{got} (ioctl)",
            "held" if got == "EPERM" and b"x" not in typed else "OPEN")
    assert got == "EPERM", p.stderr
    assert b"x" not in typed
