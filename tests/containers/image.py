"""The tests' container image, built once on this machine without a registry: a Debian
bookworm root file system (``debootstrap --variant=minbase`` from the host's own Debian
mirror, with python3 and curl), packed as a tarball under :data:`CACHE` that each engine
imports (``podman import``, ``docker import``, ``ctr images import``)."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile

#: Where the root file system's tarball is kept between test sessions.
CACHE = "/var/cache/gatewrap-tests"
TARBALL = os.path.join(CACHE, "bookworm-python3-curl.tar")
#: The packages the tests run in the container.
PACKAGES = ["python3-minimal", "curl", "ca-certificates"]
#: The image's name in each engine.
NAME = "localhost/gatewrap-test:bookworm"


def rootfs_tarball() -> str:
    """The tarball's path, made first if it is not cached (debootstrap: a few minutes,
    once per machine; a lock keeps two sessions from making it together).

    Raises:
        subprocess.CalledProcessError: debootstrap or tar failed (the mirror unreachable).
    """
    os.makedirs(CACHE, exist_ok=True)
    with open(TARBALL + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(TARBALL):
            return TARBALL
        root = tempfile.mkdtemp(prefix="rootfs-", dir=CACHE)
        try:
            subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", "bookworm",
                            root, "http://deb.debian.org/debian"], check=True, capture_output=True)
            shutil.rmtree(os.path.join(root, "var/cache/apt/archives"), ignore_errors=True)
            subprocess.run(["tar", "-C", root, "--numeric-owner", "-cf", TARBALL + ".tmp", "."], check=True)
            os.rename(TARBALL + ".tmp", TARBALL)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    return TARBALL
