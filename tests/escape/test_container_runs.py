"""Escape suite, a container's run (issue 22): what a pod or container creator's annotations
make the daemon read, and what a container does to its own run's life (stop, the daemon's
watch of dead containers, gc).

The daemon (root; in Kubernetes a privileged container with the node's pid namespace,
contrib/kubernetes/20-daemonset.yaml) reads the file the ``gatewrap.policy`` annotation
names. ``container_create`` is sent here as ``gatewrap-oci create`` sends it from the
annotation (gatewrap-oci passes the path on unchanged, :func:`gatewrap.oci.bundle.policy_of`).
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from containers.conftest import oci_daemon  # noqa: F401
from gatewrap.shared import protocol

pytestmark = pytest.mark.kernel

PERMISSIVE = 'version = 1\ndefault = "allow"\n'


def _ask(daemon, message: dict) -> dict:
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(daemon.socket)
        protocol.send(s, message)
        return protocol.Reader(s).message() or {}


def _create(daemon, container: str, policy: str) -> dict:
    """The daemon's answer to ``container_create`` with annotation gatewrap.policy=``policy``;
    a run it set up is deleted again."""
    got = _ask(daemon, {"op": "container_create", "container": container, "policy": policy, "allow": [],
                        "policy_source": "annotations", "argv": ["sh"], "uid": 0, "bounds": {}, "audit_log": None,
                        "resolvers": [], "public_ranges": []})
    if "run" in got:
        _ask(daemon, {"op": "container_delete", "container": container})
    return got


@pytest.fixture
def own_root():
    """A process whose root (as /proc/PID/root shows it) is a folder the container's root
    wrote: a root-owned policy (0644) that allows everything, as a running container (root
    inside is the host's uid 0) leaves in its own file system; yields its pid."""
    d = Path(tempfile.mkdtemp(prefix="gwt-ownroot-"))
    (d / "policy.toml").write_text(PERMISSIVE)
    (d / "policy.toml").chmod(0o644)
    p = subprocess.Popen(["sleep", "60"], cwd=d)
    yield p.pid
    p.kill()
    p.wait()
    subprocess.run(["rm", "-rf", str(d)])


@pytest.mark.parametrize("path", ["/proc/{pid}/cwd/policy.toml", "/proc/{pid}/root/etc/shadow", "/proc/self/environ"],
                         ids=["gatewrap.policy through /proc/PID/cwd (or /root): a file its own container wrote, allow-all",
        "gatewrap.policy=/proc/PID/root/etc/shadow (in Kubernetes /proc/1/root: the daemon has the node's pid namespace)",
        "gatewrap.policy=/proc/self/environ (the daemon's own; /proc/kmsg would block and eat the kernel log)"])
def test_a_policy_annotation_through_proc_is_refused(oci_daemon, outcome, own_root, path):  # noqa: F811
    path = path.format(pid=own_root)
    got = _create(oci_daemon, f"gwt-proc-{os.getpid()}", path)
    said = got.get("error") or f"run {got.get('run')} set up with that file as its policy"
    held = "run" not in got and "/proc" in said and "invalid policy" not in said
    outcome("the daemon's check of gatewrap.policy (checked_policy_file)", said[:160], "held" if held else "OPEN")
    assert held, got
