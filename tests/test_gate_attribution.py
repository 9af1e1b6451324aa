"""The attribution of connections (each record's ``client_pid``) costs a run bounded work: a
neighbour's churn of connections does not grow the gate's process by a thread per connection
(issue 23, target 5: 4 -> 520 threads, and every other run's connections waited behind)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time

import pytest

from gatewrap import _gate_core as core
from gatewrap.sandbox import netns

pytestmark = pytest.mark.kernel

CGROUP_ROOT = "/sys/fs/cgroup/unified"

#: Inside the run: argv[1] idle processes (children), then argv[2] connections to the gate at
#: argv[3] (HOST:PORT), each closed at once; prints "done" and waits for stdin to close.
CHURN = r"""
import os, socket, sys, time
kids = []
for _ in range(int(sys.argv[1])):
    pid = os.fork()
    if pid == 0:
        time.sleep(120); os._exit(0)
    kids.append(pid)
host, port = sys.argv[3].rsplit(":", 1)
for _ in range(int(sys.argv[2])):
    try:
        socket.create_connection((host, int(port)), timeout=10).close()
    except OSError:
        pass
print("done", flush=True)
sys.stdin.read()
for pid in kids:
    os.kill(pid, 9)
"""


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.fixture
def run_cgroup():
    path = os.path.join(CGROUP_ROOT, f"gw-attribution-test-{os.getpid()}")
    os.mkdir(path)
    try:
        yield path
    finally:
        for _ in range(100):
            try:
                os.rmdir(path)
                break
            except OSError:
                time.sleep(0.05)


@pytest.fixture
def fd_limit_raised():
    """The gate runs in this process here: its open-file limit raised to the hard one, as
    gatewrap raises its own (agent_process.raise_fd_limit; sudo on Debian leaves 1024, and
    1,000 connections and this test's own files pass it)."""
    old = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (old[1], old[1]))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, old)


def test_a_churn_of_connections_from_a_crowded_run_adds_at_most_a_few_threads_to_the_gate(run_cgroup, tmp_path,
                                                                                          fd_limit_raised):
    ns = netns.create()
    gate = None
    try:
        gate = core.Gate(run_id="gw-attr", netns_path=ns.path, policy=core.Policy.new("deny"),
                         audit=core.AuditLog(str(tmp_path / "audit.jsonl"), key=None), listen_port=0,
                         nameservers=[], shared_runtime=True, run_cgroup=run_cgroup)
        before = threads()
        script = f"open({os.path.join(run_cgroup, 'cgroup.procs')!r}, 'w').write(str(os.getpid()))\n" + CHURN
        churn = subprocess.Popen(["nsenter", f"--net={ns.path}", sys.executable, "-c", "import os\n" + script,
                                  "300", "1000", str(gate.listen_addrs[0])],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert churn.stdout.readline().strip() == "done"
            # Blocking threads outlive their work by 10 s (tokio's keep-alive): what the churn
            # started is still there to count.
            grown = threads() - before
        finally:
            churn.stdin.close()
            churn.wait(60)
        assert grown <= 4, f"the gate's process grew by {grown} threads for 1,000 connections"
    finally:
        if gate is not None:
            gate.stop()
        ns.close()
