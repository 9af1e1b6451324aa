"""The native waiter ``gatewrap-wait`` (gate_wait/), as the shared mode's client uses it.

Each case runs tests/waiter_driver.py, which does the client's last steps (subreaper, signals
blocked, the agent spawned) and execs the waiter through ``gatewrap.shared.waiter``; the test
holds the other end of the control socket, as the daemon would.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from gatewrap.errors import GatewrapError
from gatewrap.sandbox import cgroup
from gatewrap.shared import waiter

DRIVER = Path(__file__).with_name("waiter_driver.py")
#: How long any one step may take before the test gives up (generous: a loaded 2-core machine).
PATIENCE = 60.0
GONE = ("gatewrap: the gatewrap daemon went away: the agent keeps running without egress "
        "(fail closed) until it exits\n")
UNRECORDED = ("gatewrap: the gatewrap daemon went away before the run's end was recorded; "
              "sudo gatewrap gc collects the sandbox\n")
SUMMARY = b"gatewrap: run gw-test ended: exit code 7, 0 requests allowed, 0 denied\n"


@pytest.fixture(scope="module", autouse=True)
def waiter_path() -> str:
    path = waiter.find()
    if path is None:
        pytest.fail("gatewrap-wait is not installed beside the interpreter or on PATH: "
                    "sudo scripts/setup.sh install builds and installs it")
    return path


@dataclass
class Client:
    """A driver that has exec'd the waiter, and the daemon's end of its control socket."""

    proc: subprocess.Popen
    daemon: socket.socket
    agent_pid: int

    def wait(self, stdin: bytes | None = None) -> tuple[int, str]:
        """The exit code and the whole of stderr, once the waiter exits (``stdin``: written to
        the agent's standard input first, which is then closed)."""
        _, err = self.proc.communicate(stdin, timeout=PATIENCE)
        return self.proc.returncode, err.decode()

    def line_from_waiter(self) -> bytes:
        """Bytes the waiter sent, up to and including the first newline."""
        self.daemon.settimeout(PATIENCE)
        got = b""
        while not got.endswith(b"\n"):
            chunk = self.daemon.recv(64)
            if not chunk:
                break
            got += chunk
        return got

    def stderr_until(self, text: str) -> str:
        """stderr read as it comes until ``text`` is in it; what was read."""
        got = b""
        deadline = time.monotonic() + PATIENCE
        fd = self.proc.stderr.fileno()
        while text.encode() not in got:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(fd, 4096) if ready else b""
            if not chunk:
                pytest.fail(f"stderr ended or stalled before {text!r}: {got!r}")
            got += chunk
        return got.decode()


def start(command: list[str], tmp_path: Path, *, timeout: float | None = None, cgroup_dir: str | None = None,
          stdin: int | None = subprocess.DEVNULL) -> Client:
    """Run the driver for ``command``; returns once the agent runs and the signals are blocked."""
    daemon, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    args = [sys.executable, str(DRIVER), "--control-fd", str(theirs.fileno()),
            "--cgroup", cgroup_dir or str(tmp_path)]
    if timeout is not None:
        args += ["--timeout", str(timeout)]
    if cgroup_dir is not None:
        args.append("--join-cgroup")
    proc = subprocess.Popen([*args, "--", *command], stdin=stdin, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, pass_fds=[theirs.fileno()])
    theirs.close()
    line = proc.stdout.readline().decode()
    assert line.startswith("agent "), f"the driver did not start the agent: {line!r}, {proc.communicate()}"
    return Client(proc, daemon, int(line.split()[1]))


def test_the_agents_exit_code_goes_to_the_daemon_and_the_daemons_answer_to_stderr(tmp_path):
    client = start(["sh", "-c", "exit 7"], tmp_path)
    assert client.line_from_waiter() == b"exit 7\n"
    client.daemon.sendall(SUMMARY)
    client.daemon.close()
    code, err = client.wait()
    assert (code, err) == (7, SUMMARY.decode())


def test_a_signal_to_the_client_is_forwarded_to_the_agent(tmp_path):
    client = start(["sleep", "30"], tmp_path)
    client.proc.send_signal(signal.SIGTERM)
    assert client.line_from_waiter() == b"exit 143\n"
    client.daemon.sendall(b"summary\n")
    client.daemon.close()
    assert client.wait() == (128 + signal.SIGTERM, "summary\n")


def test_an_orphan_of_the_agent_is_reaped_while_the_agent_runs(tmp_path):
    # The subshell exits at once, so its sleep is orphaned to the nearest subreaper: the waiter.
    pid_file = tmp_path / "orphan.pid"
    client = start(["sh", "-c", f"(sleep 300 & echo $! > {pid_file}.new; mv {pid_file}.new {pid_file}); read line; exit 5"],
                   tmp_path, stdin=subprocess.PIPE)
    deadline = time.monotonic() + PATIENCE
    while not pid_file.exists():
        assert time.monotonic() < deadline, "the agent never started its orphan"
        time.sleep(0.01)
    orphan = int(pid_file.read_text())
    stat = Path(f"/proc/{orphan}/stat")
    while int(stat.read_text().rsplit(")", 1)[1].split()[1]) != client.proc.pid:
        assert time.monotonic() < deadline, "the orphan never became the waiter's child"
        time.sleep(0.01)
    os.kill(orphan, signal.SIGKILL)
    while stat.exists():  # a zombie until its parent, the waiter, reaps it
        assert time.monotonic() < deadline, f"the waiter left its orphan unreaped: {stat.read_text()}"
        time.sleep(0.01)
    client.daemon.close()
    code, err = client.wait(stdin=b"go\n")
    assert (code, err) == (5, GONE + UNRECORDED)


@pytest.fixture
def wait_cgroup():
    root = cgroup.cgroup2_mount()
    assert root is not None, "no cgroup v2 hierarchy mounted"
    path = Path(root) / f"gatewrap-test-wait-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    yield path
    with open(path / "cgroup.kill", "w") as f:
        f.write("1")
    deadline = time.monotonic() + PATIENCE
    while True:
        try:
            path.rmdir()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def populated(path: Path) -> bool:
    """cgroup.events' ``populated`` (cgroup v2): a process is in the cgroup or below it."""
    return "populated 1" in (path / "cgroup.events").read_text()


@pytest.mark.kernel
def test_the_timeout_kills_the_agents_cgroup_and_the_code_is_124(tmp_path, wait_cgroup):
    # The shell's child (sleep) dies only if the whole cgroup was killed.
    client = start(["sh", "-c", "sleep 300 & wait"], tmp_path, timeout=0.5, cgroup_dir=str(wait_cgroup))
    assert client.line_from_waiter() == b"exit 124\n"
    client.daemon.sendall(b"summary\n")
    client.daemon.close()
    code, err = client.wait()
    assert (code, err) == (124, "gatewrap: --timeout 0.5 s reached: killing the agent and its children\nsummary\n")
    deadline = time.monotonic() + PATIENCE
    while populated(wait_cgroup):
        assert time.monotonic() < deadline, "the agent's child survived the timeout"
        time.sleep(0.05)


def test_a_daemon_that_went_away_is_said_once_and_the_code_is_still_the_agents(tmp_path):
    client = start(["sh", "-c", "read line; exit 3"], tmp_path, stdin=subprocess.PIPE)
    client.daemon.close()
    said = client.stderr_until(GONE)
    code, rest = client.wait(stdin=b"go\n")
    assert (code, said + rest) == (3, GONE + UNRECORDED)


def test_a_daemon_that_answers_nothing_is_said_and_the_code_is_still_the_agents(tmp_path):
    client = start(["sh", "-c", "exit 9"], tmp_path)
    assert client.line_from_waiter() == b"exit 9\n"
    client.daemon.close()
    assert client.wait() == (9, UNRECORDED)


@pytest.mark.parametrize(("case", "args", "reason"), [
    ("no pid", ["--control-fd", "0"], "--pid PID is required"),
    ("no control fd", ["--pid", "1"], "--control-fd FD is required"),
    ("a pid that is not a number", ["--pid", "one", "--control-fd", "0"], "--pid \"one\": not a process id"),
    ("a pid that is not a child", ["--pid", "1", "--control-fd", "0"], "--pid 1: not a child of this process"),
    ("a control fd that is not open", ["--pid", "1", "--control-fd", "57"], "--control-fd 57: not an open file descriptor"),
    ("a negative timeout", ["--pid", "1", "--control-fd", "0", "--timeout", "-2", "--cgroup", "/x"],
     "not a number of seconds >= 0"),
    ("a timeout without a cgroup", ["--pid", "1", "--control-fd", "0", "--timeout", "2"], "--timeout needs --cgroup"),
    ("an unknown flag", ["--pid", "1", "--control-fd", "0", "--quiet"], "unknown argument \"--quiet\""),
])
def test_bad_arguments_are_refused_with_125_and_a_reason(waiter_path, case, args, reason):
    done = subprocess.run([waiter_path, *args], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=PATIENCE)
    assert (done.returncode, reason in done.stderr) == (125, True), f"{case}: {done.stderr!r}"
    assert done.stderr.startswith("gatewrap-wait: "), case


def test_help_prints_the_usage(waiter_path):
    done = subprocess.run([waiter_path, "--help"], capture_output=True, text=True, timeout=PATIENCE)
    assert (done.returncode, done.stdout.startswith("usage: gatewrap-wait --pid PID --control-fd FD")) == (0, True)


def test_exec_waiter_refuses_an_empty_cgroup_before_replacing_the_process():
    with pytest.raises(GatewrapError, match="cgroup directory"):
        waiter.exec_waiter(os.getpid(), 0, None, "")
