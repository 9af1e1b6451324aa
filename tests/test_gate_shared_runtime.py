"""Gates on the shared runtime (``core.Gate(shared_runtime=True)``), one per netns: stopping
one leaves the other serving, and each gate's notices reach its own ``notice_fd``."""

from __future__ import annotations

import os
import select
import subprocess
import sys

import pytest

from gatewrap import _gate_core as core
from gatewrap.sandbox import netns

pytestmark = pytest.mark.kernel

#: A client inside the netns: one request to the gate at argv[1] (HOST:PORT), or the errno
#: name of a failed connect; prints the status line.
CLIENT = r"""
import errno, socket, sys
host, port = sys.argv[1].rsplit(":", 1)
try:
    s = socket.create_connection((host, int(port)), timeout=10)
except OSError as e:
    print(errno.errorcode.get(e.errno, e.errno)); sys.exit()
s.sendall(b"GET http://denied.test/x HTTP/1.1\r\nHost: denied.test\r\nConnection: close\r\n\r\n")
data = b""
while chunk := s.recv(65536):
    data += chunk
print(data.split(b"\r\n")[0].decode())
"""


def ask(path: str, addr: str) -> str:
    """The status line the gate at ``addr`` answers from inside the netns ``path``."""
    out = subprocess.run(["nsenter", f"--net={path}", sys.executable, "-c", CLIENT, addr],
                         capture_output=True, text=True, check=True, timeout=60)
    return out.stdout.strip()


@pytest.fixture
def two_netns():
    held = [netns.create() for _ in range(2)]
    try:
        yield [ns.path for ns in held]
    finally:
        for ns in held:
            ns.close()


def test_stopping_one_shared_runtime_gate_leaves_the_other_answering(two_netns, tmp_path):
    read_end, write_end = os.pipe()
    gates = []
    try:
        for i, path in enumerate(two_netns):
            gates.append(core.Gate(
                run_id=f"gw-rt{i}", netns_path=path, policy=core.Policy.new("deny"),
                audit=core.AuditLog(str(tmp_path / f"audit{i}.jsonl"), key=None), listen_port=0,
                nameservers=[], shared_runtime=True, notices=(i == 1),
                notice_fd=write_end if i == 1 else None))
        os.close(write_end)  # the gate keeps its own duplicate
        write_end = -1
        a, b = gates
        addr_a, addr_b = a.listen_addrs[0], b.listen_addrs[0]
        assert ask(two_netns[0], addr_a).startswith("HTTP/1.1 403")
        a.stop()
        assert ask(two_netns[0], addr_a) == "ECONNREFUSED", "the stopped gate still listens"
        assert ask(two_netns[1], addr_b).startswith("HTTP/1.1 403")
        assert a.counts()["denied"] == 1 and b.counts()["denied"] == 1
        ready, _, _ = select.select([read_end], [], [], 30)
        assert ready, "no notice on notice_fd"
        assert os.read(read_end, 4096).decode() == "gatewrap: denied GET denied.test:80 (policy: default deny)\n"
    finally:
        for g in gates:
            g.stop()
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)
