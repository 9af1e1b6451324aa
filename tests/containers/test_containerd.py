"""containerd (Debian's 1.6) through ctr, with gatewrap-oci as the runc binary of the
io.containerd.runc.v2 shim: the container's egress passes the gate (issue 22)."""

from __future__ import annotations

import os
import secrets
import subprocess

import pytest

from containers.conftest import Container, image
from containers.test_podman import EPERM, PROBE

pytestmark = pytest.mark.kernel


def ctr_run(containerd, *args: str, cmd: list[str]) -> Container:
    ctr, wrapper, audit = containerd
    cid = "gwt-" + secrets.token_hex(6)
    p = subprocess.run([*ctr, "run", "--rm", "--runc-binary", wrapper, *args, image.NAME, cid, *cmd],
                       capture_output=True, text=True, timeout=60)
    return Container(p.returncode, p.stdout, p.stderr, cid, audit)


def test_a_containerd_container_reaches_allowed_hosts_through_the_gate_only(containerd):
    c = ctr_run(containerd, "--annotation", "gatewrap.allow=allowed.test", cmd=["python3", "-c", PROBE])
    assert c.returncode == 0, c.stderr
    assert c.stdout.split("\n")[:4] == ["allowed 200", "denied 403", f"direct errno {EPERM}", "vsock refused"]
    start, = c.records(event="run_start")
    assert start["container"] == {"id": c.id, "policy": "annotations gatewrap.allow=allowed.test"}
    assert [r["decision"] for r in c.records(event="request")] == ["allowed", "denied"]
    direct, = c.records(event="direct_egress")
    assert direct["reason"] == "kernel: not the gate"
    end, = c.records(event="run_end")
    assert end["reason"] == "the container was deleted (gatewrap-oci delete)"
    assert not os.path.exists(f"/sys/fs/cgroup/unified/gatewrap/{c.run_id}")
    assert not os.path.exists(f"/run/gatewrap/runs/{c.run_id}.lock")
    assert c.id not in subprocess.run([*containerd[0], "containers", "ls", "-q"], capture_output=True, text=True).stdout


def test_a_containerd_container_with_host_networking_still_has_only_the_gate(containerd):
    c = ctr_run(containerd, "--net-host", cmd=["python3", "-c", PROBE])
    assert c.stdout.split("\n")[:3] == ["allowed 403", "denied 403", f"direct errno {EPERM}"], c.stderr
    start, = c.records(event="run_start")
    assert start["container"]["policy"].startswith("default (deny everything)")


def test_a_containerd_task_killed_and_never_deleted_loses_its_run_once_its_processes_are_gone(containerd):
    import time

    ctr, wrapper, audit = containerd
    c = Container(0, "", "", "gwt-" + secrets.token_hex(6), audit)
    p = subprocess.run([*ctr, "run", "-d", "--runc-binary", wrapper, image.NAME, c.id, "sleep", "300"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    try:
        assert c.records(event="run_start")
        subprocess.run([*ctr, "task", "kill", "-s", "SIGKILL", c.id], check=True, capture_output=True, timeout=30)
        deadline = time.monotonic() + 20  # the daemon's grace for a delete (5 s), and the load's
        while os.path.exists(f"/run/gatewrap/runs/{c.run_id}.lock"):
            assert time.monotonic() < deadline, "the run of a dead task outlived it"
            time.sleep(0.2)
        end, = c.records(event="run_end")
        assert end["reason"].startswith("the container's processes have all exited and its engine did not delete it")
        assert not os.path.exists(f"/sys/fs/cgroup/unified/gatewrap/{c.run_id}")
        status = subprocess.run([*ctr, "task", "ls"], capture_output=True, text=True).stdout
        assert any(line.split()[:1] == [c.id] and "STOPPED" in line for line in status.splitlines())  # never deleted
    finally:
        subprocess.run([*ctr, "task", "rm", "-f", c.id], capture_output=True, timeout=60)
        subprocess.run([*ctr, "containers", "rm", c.id], capture_output=True, timeout=60)
    assert len(c.records(event="run_end")) == 1
