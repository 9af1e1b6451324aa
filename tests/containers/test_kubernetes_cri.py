"""Pods through containerd's CRI plugin with contrib/kubernetes/'s runtime handler, as
kubelet asks for them (crictl speaks the same CRI calls), on Debian's containerd 1.6: the
pod's ``gatewrap.*`` annotations reach each container (``pod_annotations``), the sandbox
(pause) container and each container get a run of their own, and the container's egress
passes the gate (issue 22). No kubelet, no CNI (the pods use the node's network, which
gatewrap-oci replaces by the gate's, as for ``--network host``)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml

from conftest import _AUDIT_LOGS
from containers import image
from containers.conftest import Container, engine, oci_wrapper, podman_base, wait_until_up
from containers.test_podman import EPERM, PROBE

pytestmark = pytest.mark.kernel

ROOT = Path(__file__).resolve().parent.parent.parent
CRI_ROOT = os.path.join(image.CACHE, "containerd-cri")
CRI_RUN = "/run/gatewrap-tests-cri"
#: The test image with a command that waits (the pod's sandbox container runs the image's own).
K8S_IMAGE = "localhost/gatewrap-test-k8s:bookworm"
K8S_ARCHIVE = os.path.join(image.CACHE, "image-k8s-docker-archive.tar")
#: crictl's version scripts/setup.sh installs (cri-tools, through the Go module proxy).
CRICTL = "crictl"


def _installer() -> dict[str, str]:
    """contrib/kubernetes/'s installer ConfigMap (install.sh, containerd-gatewrap.toml)."""
    for doc in yaml.safe_load_all((ROOT / "contrib" / "kubernetes" / "10-config.yaml").read_text()):
        if doc["metadata"]["name"] == "gatewrap-installer":
            return doc["data"]
    raise AssertionError("no gatewrap-installer ConfigMap")


def _install(config: Path, wrapper: Path, here: Path) -> None:
    """install.sh's containerd step on ``config``, as on a node: the handler as shipped, but
    BinaryName a wrapper carrying the tests' runtime flags."""
    data = _installer()
    assert 'BinaryName = "/usr/local/bin/gatewrap-oci"' in data["containerd-gatewrap.toml"]
    (here / "install.sh").write_text(data["install.sh"])
    (here / "snippet.toml").write_text(data["containerd-gatewrap.toml"].replace('"/usr/local/bin/gatewrap-oci"',
                                                                               json.dumps(str(wrapper))))
    env = {"PATH": os.environ["PATH"], "GATEWRAP_INSTALL_LIB": "1", "GATEWRAP_ON_HOST": "", "GATEWRAP_HOST": "",
           "GATEWRAP_RESTART": "no", "GATEWRAP_SNIPPET": str(here / "snippet.toml"),
           "GATEWRAP_CONTAINERD_CONFIG": str(config)}
    subprocess.run(["sh", "-c", '. "$1" && containerd_config', "sh", str(here / "install.sh")], env=env, check=True,
                   capture_output=True)


def _k8s_archive() -> str:
    """The test image with CMD sleep infinity as a docker archive (made once, cached)."""
    if not os.path.exists(K8S_ARCHIVE):
        base = podman_base("runc")
        subprocess.run([*base, "import", "--change", 'CMD ["/bin/sleep", "infinity"]', image.rootfs_tarball(),
                        K8S_IMAGE], check=True, capture_output=True)
        subprocess.run([*base, "save", "--format", "docker-archive", "-o", K8S_ARCHIVE + ".tmp", K8S_IMAGE],
                       check=True, capture_output=True)
        os.rename(K8S_ARCHIVE + ".tmp", K8S_ARCHIVE)
    return K8S_ARCHIVE


@pytest.fixture(scope="module")
def cri(net, oci_daemon, podman_image, tmp_path_factory):
    """A containerd of the module's own with the CRI plugin and the handler ``gatewrap``;
    yields (crictl command, the runtime's audit log, a folder for pod files)."""
    for tool in ("containerd", "ctr", CRICTL):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is needed: scripts/setup.sh test-deps installs it")
    here = tmp_path_factory.mktemp("cri")
    audit = here / "audit.jsonl"
    wrapper = oci_wrapper(here / "gatewrap-oci", oci_daemon, net, audit)
    os.makedirs(CRI_RUN, exist_ok=True)
    cni = here / "cni"
    cni.mkdir()
    sock = os.path.join(CRI_RUN, "containerd.sock")
    config = Path(CRI_RUN) / "config.toml"
    # The tests' own containerd (root, state, sockets; no CNI: the pods use the node's
    # network), with no runtimes table: the installer adds the handler, and runc with it.
    config.write_text(f'version = 2\nroot = "{CRI_ROOT}"\nstate = "{CRI_RUN}/state"\n[grpc]\n  address = "{sock}"\n'
                      f'[ttrpc]\n  address = "{sock}.ttrpc"\n'
                      f'[plugins."io.containerd.grpc.v1.cri"]\n  sandbox_image = "{K8S_IMAGE}"\n'
                      f'  stream_server_address = "127.0.0.1"\n'
                      # this machine withholds CAP_SYS_RESOURCE: no oom_score_adj below containerd's
                      f'  restrict_oom_score_adj = true\n'
                      f'  [plugins."io.containerd.grpc.v1.cri".cni]\n    bin_dir = "{cni}"\n    conf_dir = "{cni}"\n')
    _install(config, wrapper, here)
    log = open(os.path.join(CRI_RUN, "containerd.log"), "ab")
    proc = subprocess.Popen(engine("containerd", "--config", str(config)), stdout=log, stderr=log, start_new_session=True)
    crictl = [CRICTL, "--runtime-endpoint", f"unix://{sock}", "--image-endpoint", f"unix://{sock}", "--timeout", "60s"]
    try:
        wait_until_up(proc, log.name, [*crictl, "version"], 30)
        ctr = ["ctr", "-a", sock, "-n", "k8s.io"]
        if K8S_IMAGE not in subprocess.run([*ctr, "images", "ls", "-q"], capture_output=True, text=True).stdout:
            subprocess.run([*ctr, "images", "import", _k8s_archive()], check=True, capture_output=True)
        _AUDIT_LOGS.setdefault(audit, 0)
        yield crictl, audit, here
    finally:
        pods = subprocess.run([*crictl, "pods", "-q"], capture_output=True, text=True).stdout.split()
        for pod in pods:
            subprocess.run([*crictl, "stopp", pod], capture_output=True)
            subprocess.run([*crictl, "rmp", "-f", pod], capture_output=True)
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def _run_pod(cri, annotations: dict[str, str], cmd: list[str]) -> tuple[str, Container, Container]:
    """A pod of handler ``gatewrap`` with ``annotations`` and one container running ``cmd``,
    run to its end; (its output, the container, the pod's sandbox container). The pod is
    removed before this returns."""
    crictl, audit, here = cri
    name = "agent-" + secrets.token_hex(4)
    pod = here / f"{name}-pod.json"
    pod.write_text(json.dumps({"metadata": {"name": name, "namespace": "default", "uid": str(uuid.uuid4()), "attempt": 0},
                               "annotations": annotations, "log_directory": str(here / name),
                               "linux": {"security_context": {"namespace_options": {"network": 2}}}}))
    container = here / f"{name}-container.json"
    container.write_text(json.dumps({"metadata": {"name": "agent"}, "image": {"image": K8S_IMAGE}, "command": cmd,
                                     "log_path": "agent.log", "linux": {}}))
    run = subprocess.run([*crictl, "runp", "--runtime", "gatewrap", str(pod)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    pod_id = run.stdout.strip()
    try:
        made = subprocess.run([*crictl, "create", pod_id, str(container), str(pod)], capture_output=True, text=True)
        assert made.returncode == 0, made.stderr
        cid = made.stdout.strip()
        started = subprocess.run([*crictl, "start", cid], capture_output=True, text=True)
        assert started.returncode == 0, started.stderr
        for _ in range(600):
            state = json.loads(subprocess.run([*crictl, "inspect", cid], capture_output=True, text=True,
                                              check=True).stdout)["status"]
            if state["state"] == "CONTAINER_EXITED":
                break
            time.sleep(0.1)
        out = subprocess.run([*crictl, "logs", cid], capture_output=True, text=True)
    finally:
        subprocess.run([*crictl, "stopp", pod_id], capture_output=True)
        subprocess.run([*crictl, "rmp", "-f", pod_id], capture_output=True)
    return (out.stdout, Container(state["exitCode"], out.stdout, out.stderr, cid, audit),
            Container(0, "", "", pod_id, audit))


def _gone(c: Container) -> None:
    assert not os.path.exists(f"/sys/fs/cgroup/unified/gatewrap/{c.run_id}")
    assert not os.path.exists(f"/run/gatewrap/runs/{c.run_id}.lock")


def test_a_pod_of_the_gatewrap_runtime_class_gets_its_annotations_policy_and_only_the_gate(cri):
    out, c, sandbox = _run_pod(cri, {"gatewrap.allow": "allowed.test", "other.example/note": "x"},
                               ["python3", "-c", PROBE])
    assert out.split("\n")[:4] == ["allowed 200", "denied 403", f"direct errno {EPERM}", "vsock refused"], c.stderr
    start, = c.records(event="run_start")
    assert start["container"] == {"id": c.id, "policy": "annotations gatewrap.allow=allowed.test"}
    assert [r["decision"] for r in c.records(event="request")] == ["allowed", "denied"]
    assert c.records(event="direct_egress")
    # The pod's sandbox (pause) container: a run of its own, with the pod's annotations too.
    pause, = sandbox.records(event="run_start")
    assert pause["container"]["policy"] == "annotations gatewrap.allow=allowed.test"
    for each in (c, sandbox):
        end, = each.records(event="run_end")
        assert end["reason"] == "the container was deleted (gatewrap-oci delete)"
        _gone(each)


def test_a_pod_without_gatewrap_annotations_gets_the_default_deny(cri):
    out, c, sandbox = _run_pod(cri, {}, ["python3", "-c", PROBE])
    assert out.split("\n")[:3] == ["allowed 403", "denied 403", f"direct errno {EPERM}"], c.stderr
    start, = c.records(event="run_start")
    assert start["container"]["policy"].startswith("default (deny everything)")
    _gone(c)
    _gone(sandbox)
