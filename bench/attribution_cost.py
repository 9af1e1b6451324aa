"""Cost of a kernel record's attribution (gatewrap.attribution.Attributor.of): exe and the
parent chain of a process 4 deep (like python -> sh -> tini -> nsjail), uncached (each
record a new process) and cached (records of the same process).

    python bench/attribution_cost.py [N]

Runs in the caller's own cgroup (it stands for the run's); prints microseconds per record.
"""

from __future__ import annotations

import subprocess
import sys
import time

from gatewrap.attribution import Attributor, cgroup_of


def main(n: int = 2000) -> None:
    # sh -> sh -> sh -> sleep: the sleep's chain is 3 parents deep below this process
    tree = subprocess.Popen(["/bin/sh", "-c", "/bin/sh -c '/bin/sh -c \"sleep 30; true\"; true'; true"])
    time.sleep(0.3)
    leaf = int(subprocess.check_output(["pgrep", "-n", "-x", "sleep"]).strip())
    run = cgroup_of(leaf) or "/"
    a = Attributor(run)
    print("attribution:", a.of(leaf))
    t0 = time.perf_counter()
    for _ in range(n):
        Attributor(run).of(leaf)
    uncached = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    for _ in range(n):
        a.of(leaf)
    cached = (time.perf_counter() - t0) / n
    tree.kill()
    print(f"uncached: {uncached * 1e6:.0f} us/record; cached: {cached * 1e6:.0f} us/record ({n} records)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
