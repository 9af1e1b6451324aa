"""docker (Debian's docker.io 20.10) with gatewrap-oci as a runtime of its daemon.json: the
container's egress passes the gate (issue 22)."""

from __future__ import annotations

import os
import subprocess

import pytest

from containers.conftest import Container, image
from containers.test_podman import EPERM, PROBE

pytestmark = pytest.mark.kernel


def docker_run(dockerd, tmp_path, *args: str, cmd: list[str]) -> Container:
    docker, audit = dockerd
    cidfile = tmp_path / "cid"
    p = subprocess.run([*docker, "run", "--rm", "--cidfile", str(cidfile), *args, image.NAME, *cmd],
                       capture_output=True, text=True, timeout=60)
    cid = cidfile.read_text().strip() if cidfile.exists() else ""
    return Container(p.returncode, p.stdout, p.stderr, cid, audit)


def test_a_docker_container_reaches_allowed_hosts_through_the_gate_only(dockerd, tmp_path):
    c = docker_run(dockerd, tmp_path, "--runtime", "gatewrap-allowed", "--network", "none",
                   cmd=["python3", "-c", PROBE])
    assert c.returncode == 0, c.stderr
    assert c.stdout.split("\n")[:3] == ["allowed 200", "denied 403", f"direct errno {EPERM}"]
    start, = c.records(event="run_start")
    assert start["container"] == {"id": c.id, "policy": "runtime flags --gatewrap-allow=allowed.test"}
    assert [r["decision"] for r in c.records(event="request")] == ["allowed", "denied"]
    direct, = c.records(event="direct_egress")
    assert direct["reason"] == "kernel: not the gate"
    assert c.records(event="run_end")
    assert not os.path.exists(f"/sys/fs/cgroup/unified/gatewrap/{c.run_id}")
    assert not os.path.exists(f"/run/gatewrap/runs/{c.run_id}.lock")
    ps = subprocess.run([*dockerd[0], "ps", "-a", "-q", "--no-trunc"], capture_output=True, text=True)
    assert c.id not in ps.stdout


def test_a_docker_container_without_a_policy_is_denied_everything(dockerd, tmp_path):
    c = docker_run(dockerd, tmp_path, "--runtime", "gatewrap", "--network", "none",
                   cmd=["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "http://allowed.test/"])
    assert c.stdout == "403", c.stderr
    start, = c.records(event="run_start")
    assert start["container"]["policy"].startswith("default (deny everything)")


def test_a_privileged_docker_container_is_refused(dockerd, tmp_path):
    c = docker_run(dockerd, tmp_path, "--runtime", "gatewrap", "--privileged", cmd=["true"])
    assert c.returncode != 0
    assert "capabilities beyond the default set" in c.stderr
