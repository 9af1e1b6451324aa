#!/usr/bin/env python3
"""Start-up cost of a container with gatewrap-oci against without (issue 22): ``podman run
--rm --network none IMAGE true`` with ``--runtime runc`` and with ``--runtime gatewrap-oci``,
alternating (A B A B ..., ROUNDS pairs: the machine is shared, alternation spreads its noise
over both), wall time of the whole ``podman run`` each. Also the runtime's own start-up alone:
``gatewrap-oci --version`` (Python, then exec of runc) against ``runc --version``.

The image is the tests' (tests/containers/image.py, imported into the tests' podman storage);
gatewrap-oci talks to a daemon of this bench's own socket, started and stopped here.
Prints one JSON object (medians, ratio, each round's figures) and writes it to
bench/results/oci_startup.json.

Usage: sudo .venv/bin/python bench/oci_startup.py [ROUNDS]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from containers import image  # noqa: E402
from containers.conftest import OCI, PODMAN_RUN_FLAGS, podman_base  # noqa: E402

SOCKET = "/run/gatewrap/bench-oci.sock"


def timed(argv: list[str]) -> float:
    """Seconds ``argv`` took (it must succeed)."""
    t = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return time.perf_counter() - t


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    base = podman_base("runc")
    if subprocess.run([*base, "image", "exists", image.NAME]).returncode != 0:
        subprocess.run([*base, "import", image.rootfs_tarball(), image.NAME], check=True, capture_output=True)
    audit_dir = tempfile.mkdtemp(prefix="gw-bench-oci-")
    daemon = subprocess.Popen([sys.executable, "-m", "gatewrap", "daemon", "--socket", SOCKET],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not os.path.exists(SOCKET):
            time.sleep(0.05)
        with_oci = [*podman_base(), "--runtime-flag", f"gatewrap-socket={SOCKET}",
                    "--runtime-flag", f"gatewrap-audit-log={audit_dir}/audit.jsonl"]
        tail = ["run", "--rm", "--network", "none", *PODMAN_RUN_FLAGS, image.NAME, "true"]
        timed([*base, *tail])  # warm caches for both
        timed([*with_oci, *tail])
        runc, oci = [], []
        for _ in range(rounds):
            runc.append(timed([*base, *tail]))
            oci.append(timed([*with_oci, *tail]))
        bare = [timed(["runc", "--version"]) for _ in range(rounds)]
        wrapped = [timed([OCI, "--version"]) for _ in range(rounds)]
    finally:
        daemon.terminate()
        daemon.wait()
    ms = lambda xs: round(statistics.median(xs) * 1000, 1)  # noqa: E731
    out = {"rounds": rounds, "load": os.getloadavg()[0],
           "podman_run_runc_ms": ms(runc), "podman_run_gatewrap_oci_ms": ms(oci),
           "ratio": round(statistics.median(oci) / statistics.median(runc), 2),
           "paired_diff_ms": round(statistics.median([b - a for a, b in zip(runc, oci)]) * 1000, 1),
           "runc_version_ms": ms(bare), "gatewrap_oci_version_ms": ms(wrapped),
           "each": {"runc": [round(x * 1000, 1) for x in runc], "gatewrap_oci": [round(x * 1000, 1) for x in oci]}}
    print(json.dumps(out, indent=1))
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", "oci_startup.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
