"""Containers run by real engines with ``gatewrap-oci`` as their runtime, against the fake
internet, on the image :mod:`image` builds once (no registry).

Each engine gets a storage of its own under /var/cache/gatewrap-tests (the imported image
stays between sessions; containers do not) and the module's own gatewrap daemon, named to
the runtime with ``--gatewrap-socket`` (podman's ``--runtime-flag``), never the host's.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import _AUDIT_LOGS, PUBLIC_RANGES
from containers import image
from shared.conftest import Daemon

#: The runtime as installed in this environment (the project's venv).
OCI = str(Path(sys.executable).parent / "gatewrap-oci")
PODMAN_ROOT = os.path.join(image.CACHE, "podman")
PODMAN_RUNROOT = "/run/gatewrap-tests-podman"
#: What podman needs on this machine (issue 22): runc (crun refuses hybrid cgroups), the
#: cgroupfs manager (no systemd), and ulimits within the host's hard limits.
PODMAN_RUN_FLAGS = ["--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"]


def podman_base(runtime: str = OCI) -> list[str]:
    """podman with the tests' storage, ``runtime`` and no systemd (in :func:`engine`'s root)."""
    return engine("podman", "--root", PODMAN_ROOT, "--runroot", PODMAN_RUNROOT, "--runtime", runtime,
                  "--cgroup-manager=cgroupfs", "--events-backend=file")


#: The folder the engines' root is bound to where / is no mount point (:func:`engine`).
ENGINE_ROOT = "/run/gatewrap-tests-root"
_holder: subprocess.Popen | None = None


def _root_is_a_mount_point() -> bool:
    """Whether this process's / is the root of a mount: mountinfo(5) lists a mount point
    ``/`` then; a chroot into a plain folder (fresh-debian's) lists none."""
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == "/" for line in f)


def _unbind(holder: subprocess.Popen) -> None:
    """End :func:`engine`'s holder, and unmount its bind of / where it propagated here."""
    holder.kill()
    holder.wait()
    with open("/proc/self/mountinfo") as f:
        if any(line.split()[4] == ENGINE_ROOT for line in f):
            subprocess.run(["umount", "--lazy", "--recursive", ENGINE_ROOT], check=False)


def engine(*argv: str) -> list[str]:
    """``argv`` (a container engine, or a command that mounts as one) as run here: as it is
    where / is a mount point, else in a mount namespace whose / is one.

    The engines make their root's mounts private or slave first (runc's prepareRoot,
    containers/storage's chrootarchive: ``mount("", "/", MS_REC|MS_PRIVATE)``), which fails
    with EINVAL where / is no mount point, as in a chroot of a plain folder. There, one holder
    process (for the session) makes a mount namespace of its own, binds / to
    :data:`ENGINE_ROOT` and chroots into it, whose / is then a mount's root; the engines run
    in its namespace and root (nsenter(1) ``--mount --root``), and so see each other's
    mounts (podman's across its commands). Files, sockets, /proc and /sys are the same."""
    global _holder
    if _root_is_a_mount_point():
        return list(argv)
    if _holder is None or _holder.poll() is not None:
        import ctypes
        import signal

        def die_with_pytest() -> None:  # PR_SET_PDEATHSIG (prctl(2)): no holder outlives the session
            ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)

        os.makedirs(ENGINE_ROOT, exist_ok=True)
        # unshare's own --propagation would remount / (EINVAL here): the new / is made private
        # once it is a mount point; where the host's mounts are shared, the bind itself shows
        # outside too, and is taken away at the session's end (_unbind).
        _holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "unchanged", "sh", "-c",
             f"mount --rbind / {ENGINE_ROOT} && exec chroot {ENGINE_ROOT} sh -c "
             '"mount --make-rprivate / && echo ready && exec sleep infinity"'],
            stdout=subprocess.PIPE, text=True, preexec_fn=die_with_pytest)
        assert _holder.stdout.readline() == "ready\n", "could not make a mount namespace whose / is a mount point"
        atexit.register(_unbind, _holder)
    return ["nsenter", f"--target={_holder.pid}", "--mount", "--root", f"--wd={os.getcwd()}", *argv]


def podman_gatewrap(oci_daemon, net, audit: Path) -> list[str]:
    """:func:`podman_base` with gatewrap-oci's flags (``--runtime-flag``): the module's
    daemon, the audit log ``audit``, the fake internet's resolver and public ranges."""
    base = podman_base()
    for f in [f"gatewrap-socket={oci_daemon.socket}", f"gatewrap-audit-log={audit}",
              f"gatewrap-resolver={net.dns_server}", *(f"gatewrap-public-range={r}" for r in PUBLIC_RANGES[1::2])]:
        base += ["--runtime-flag", f]
    return base


@pytest.fixture(scope="session")
def podman_image() -> str:
    """The test image in the tests' podman storage (imported once from :func:`image.rootfs_tarball`)."""
    if shutil.which("podman") is None or shutil.which("runc") is None:
        pytest.fail("podman and runc are needed (apt-get install podman runc): scripts/setup.sh installs them")
    base = podman_base("runc")
    if subprocess.run([*base, "image", "exists", image.NAME]).returncode != 0:
        subprocess.run([*base, "import", image.rootfs_tarball(), image.NAME], check=True, capture_output=True)
    return image.NAME


@pytest.fixture(scope="module")
def oci_daemon():
    """A gatewrap daemon of the module's own."""
    d = Daemon("--idle-exit", "0").start()
    yield d
    d.stop()


@dataclass
class Container:
    """One container's outcome: the engine's exit code and output, its id, its audit log."""

    returncode: int
    stdout: str
    stderr: str
    id: str
    audit_path: Path

    @property
    def run_id(self) -> str:
        return "gw-" + self.id

    def records(self, **eq) -> list[dict]:
        """The audit records of this container's run whose fields equal ``eq``."""
        if not self.audit_path.exists():
            return []
        recs = [json.loads(line) for line in self.audit_path.read_text().splitlines() if line.strip()]
        return [r for r in recs if r.get("run") == self.run_id and all(r.get(k) == v for k, v in eq.items())]


@pytest.fixture
def podman(net, oci_daemon, podman_image, tmp_path):
    """``podman(*run_args, cmd=[...])``: ``podman run --rm`` of the test image with
    gatewrap-oci, resolving through the fake internet's DNS, ``run_args`` before the image
    (annotations, --network, --privileged); returns a :class:`Container`."""
    n = [0]

    def run(*run_args: str, cmd: list[str], timeout: float = 60, daemon: Daemon | None = None,
            rm: bool = True) -> Container:
        """``daemon``: another gatewrap daemon than the module's; ``run_args`` with ``-d``: returns
        once the container started (its id), podman's ``--rm`` unless ``rm`` is False."""
        n[0] += 1
        audit = tmp_path / f"audit-{n[0]}.jsonl"
        cidfile = tmp_path / f"cid-{n[0]}"
        _AUDIT_LOGS.setdefault(audit, 0)  # its records are checked against the schema at the test's end
        base = podman_gatewrap(daemon or oci_daemon, net, audit)
        p = subprocess.run([*base, "run", *(["--rm"] if rm else []), "--cidfile", str(cidfile), *PODMAN_RUN_FLAGS,
                            *run_args,
                            podman_image, *cmd], capture_output=True, text=True, timeout=timeout)
        cid = cidfile.read_text().strip() if cidfile.exists() else ""
        return Container(p.returncode, p.stdout, p.stderr, cid, audit)

    return run


DOCKER_ROOT = os.path.join(image.CACHE, "docker")
DOCKER_RUN = "/run/gatewrap-tests-docker"
#: Debian's docker CLI (a newer one may be first on PATH).
DOCKER_CLI = "/usr/bin/docker"
#: The runtimes the tests' dockerd knows: docker 20.10 has no --annotation, so a policy is
#: the runtime entry's (gatewrap-oci's --gatewrap-allow).
DOCKER_RUNTIMES = {"gatewrap": [], "gatewrap-allowed": ["--gatewrap-allow=allowed.test"]}


@pytest.fixture(scope="module")
def dockerd(net, oci_daemon, tmp_path_factory):
    """A dockerd of the module's own (socket, exec root and a data root under the cache),
    with gatewrap-oci as runtimes :data:`DOCKER_RUNTIMES` (cgroupfs, no bridge, no
    iptables); yields (docker command, the runtimes' audit log)."""
    if shutil.which("dockerd") is None or not os.path.exists(DOCKER_CLI):
        pytest.fail("docker.io is needed (apt-get install docker.io): scripts/setup.sh installs it")
    audit = tmp_path_factory.mktemp("docker-audit") / "audit.jsonl"
    common = [f"--gatewrap-socket={oci_daemon.socket}", f"--gatewrap-audit-log={audit}",
              f"--gatewrap-resolver={net.dns_server}", *(f"--gatewrap-public-range={r}" for r in PUBLIC_RANGES[1::2])]
    config = {"runtimes": {name: {"path": OCI, "runtimeArgs": [*common, *extra]} for name, extra in DOCKER_RUNTIMES.items()},
              "exec-opts": ["native.cgroupdriver=cgroupfs"], "bridge": "none", "iptables": False,
              "ip6tables": False, "ip-masq": False}
    os.makedirs(DOCKER_RUN, exist_ok=True)
    with open(os.path.join(DOCKER_RUN, "daemon.json"), "w") as f:
        json.dump(config, f)
    sock = os.path.join(DOCKER_RUN, "docker.sock")
    log = open(os.path.join(DOCKER_RUN, "dockerd.log"), "ab")
    proc = subprocess.Popen(engine("dockerd", "--config-file", os.path.join(DOCKER_RUN, "daemon.json"), "--data-root",
                             DOCKER_ROOT, "--exec-root", os.path.join(DOCKER_RUN, "exec"), "--pidfile",
                             os.path.join(DOCKER_RUN, "dockerd.pid"), "-H", f"unix://{sock}"),
                            stdout=log, stderr=log, start_new_session=True)
    docker = [DOCKER_CLI, "-H", f"unix://{sock}"]
    try:
        wait_until_up(proc, log.name, [*docker, "version"], 60)
        if subprocess.run([*docker, "image", "inspect", image.NAME], capture_output=True).returncode != 0:
            subprocess.run([*docker, "import", image.rootfs_tarball(), image.NAME], check=True, capture_output=True)
        _AUDIT_LOGS.setdefault(audit, 0)
        yield docker, audit
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


CONTAINERD_ROOT = os.path.join(image.CACHE, "containerd")
CONTAINERD_RUN = "/run/gatewrap-tests-containerd"
#: The image as a docker archive, which ``ctr images import`` reads (exported from podman's storage).
ARCHIVE = os.path.join(image.CACHE, "image-docker-archive.tar")


def wait_until_up(proc: subprocess.Popen, log: str, probe: list[str], seconds: float) -> None:
    """Wait until ``probe`` (an engine's client asking its version) succeeds, up to
    ``seconds``; the engine ``proc`` exiting first, or the time running out, fails the
    fixture with the tail of its ``log``."""
    deadline = time.monotonic() + seconds
    while subprocess.run(probe, capture_output=True).returncode != 0:
        assert proc.poll() is None and time.monotonic() < deadline, (
            f"{probe[0]} got no answer from its engine: " + open(log).read()[-3000:])
        time.sleep(0.1)


def oci_wrapper(path: Path, oci_daemon, net, audit: Path) -> Path:
    """A script at ``path`` that runs gatewrap-oci with the module's settings (the daemon,
    the audit log ``audit``, the fake internet's resolver and public ranges): containerd's
    runc binary (ctr and the CRI plugin pass no runtime flags; moby writes such a wrapper
    for daemon.json's runtimeArgs)."""
    flags = [f"--gatewrap-socket={oci_daemon.socket}", f"--gatewrap-audit-log={audit}",
             f"--gatewrap-resolver={net.dns_server}", *(f"--gatewrap-public-range={r}" for r in PUBLIC_RANGES[1::2])]
    path.write_text(f'#!/bin/sh\nexec {OCI} {" ".join(flags)} "$@"\n')
    path.chmod(0o755)
    return path


@pytest.fixture(scope="module")
def containerd(net, oci_daemon, podman_image, tmp_path_factory):
    """A containerd of the module's own (no CRI plugin) and the runc binary ctr is to use:
    a wrapper that runs gatewrap-oci with the module's settings (ctr passes no runtime
    flags; moby writes such a wrapper for daemon.json's runtimeArgs). Yields (ctr command,
    the wrapper, the runtime's audit log)."""
    if shutil.which("containerd") is None or shutil.which("ctr") is None:
        pytest.fail("containerd is needed (apt-get install containerd): scripts/setup.sh installs it")
    here = tmp_path_factory.mktemp("containerd")
    audit = here / "audit.jsonl"
    wrapper = oci_wrapper(here / "gatewrap-oci", oci_daemon, net, audit)
    os.makedirs(CONTAINERD_RUN, exist_ok=True)
    sock = os.path.join(CONTAINERD_RUN, "containerd.sock")
    config = os.path.join(CONTAINERD_RUN, "config.toml")
    with open(config, "w") as f:
        f.write(f'version = 2\nroot = "{CONTAINERD_ROOT}"\nstate = "{CONTAINERD_RUN}/state"\n'
                f'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n[grpc]\n  address = "{sock}"\n'
                f'[ttrpc]\n  address = "{sock}.ttrpc"\n')
    log = open(os.path.join(CONTAINERD_RUN, "containerd.log"), "ab")
    proc = subprocess.Popen(engine("containerd", "--config", config), stdout=log, stderr=log, start_new_session=True)
    ctr = ["ctr", "-a", sock, "-n", "gatewrap-tests"]
    try:
        wait_until_up(proc, log.name, [*ctr, "version"], 30)
        if subprocess.run([*ctr, "images", "check", f"name=={image.NAME}"], capture_output=True,
                          text=True).stdout.count(image.NAME) == 0:
            if not os.path.exists(ARCHIVE):
                subprocess.run([*podman_base("runc"), "save", "--format", "docker-archive", "-o", ARCHIVE + ".tmp",
                                image.NAME], check=True, capture_output=True)
                os.rename(ARCHIVE + ".tmp", ARCHIVE)
            subprocess.run([*ctr, "images", "import", ARCHIVE], check=True, capture_output=True)
        _AUDIT_LOGS.setdefault(audit, 0)
        yield ctr, str(wrapper), audit
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
