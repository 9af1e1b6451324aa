#!/usr/bin/env python3
"""Start-up of ``gatewrap run -- /bin/true`` against its peers, side by side in one run.

Warm: the hooks are pinned and attached (as after any earlier run). Cold: the hooks are
unloaded before each run (``loader.unload``: compile, load, pin, attach). Cold cache: the
hooks stay pinned, the page cache is dropped before each run (``echo 3 >
/proc/sys/vm/drop_caches``, proc(5)): every file of the interpreter, the package, nsjail and
their libraries is read from disk again, as on the first run after boot. The commands are
run in turns (one of each, then again), so that a busy neighbour slows them alike; each
figure is the median wall time of ``--runs`` runs, output to /dev/null. Ratios are against
``firejail --noprofile --net=none true`` (issue 13, target 1: warm <= 2.5x) and against the
interpreter's own ``python -c pass``.

Every command runs in ``--workdir`` (default: a fresh empty folder the agent's user may
enter): a run shows its working directory to the agent and looks through it first (the
protected paths, the unix sockets), which costs time in proportion to the tree (~100 ms for
this repository's 17,000 entries on the loaded 2-core VM); ``--workdir .`` measures that too.

Needs root. Peers missing from PATH are skipped (Debian: firejail, bubblewrap, util-linux;
nsjail at /usr/local/bin). Usage::

    sudo flock /tmp/gatewrap-kernel.lock .venv/bin/python bench/startup.py [--runs 20] [--cold 3]
        [--cold-cache 3] [--gatewrap PATH]... [--no-jail] [--shared] [--workdir DIR]
        [--json bench/results/startup.json]

Each ``--gatewrap`` adds a build to compare (e.g. another worktree's .venv/bin/gatewrap);
the default is the one beside this interpreter.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from harness.common import SharedDaemon  # noqa: E402
UNLOAD = "from gatewrap.sandbox import cgroup; from gatewrap.bpf import loader; loader.unload(cgroup.parent_dir())"


#: Bytecode is written and used as after a pip install (which compiles it): without it every
#: run compiles gatewrap's modules again.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
#: CPU seconds of each run timed, in order (see :func:`wall`).
CPU: list[float] = []
#: The working directory of every command timed (``--workdir``).
WORKDIR: str | None = None


def wall(argv: list[str], env: dict[str, str] | None = None) -> float:
    """Seconds one run of ``argv`` takes (stdio to /dev/null; ``env``: its environment, default
    :data:`ENV`); exits if it fails. Its CPU time (user + system of it and its waited-for
    children, getrusage(2) RUSAGE_CHILDREN) is appended to :data:`CPU`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    rc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                        env=ENV if env is None else env, cwd=WORKDIR).returncode
    took = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    if rc != 0:
        sys.exit(f"startup.py: {' '.join(argv)} exited {rc}")
    return took


#: The socket of the daemon ``--shared`` starts (one of the bench's own); the Nth build's
#: daemon (N > 0) listens on ``bench-startup-N.sock`` beside it.
SOCKET = "/run/gatewrap/bench-startup.sock"


def socket_of(build: int) -> str:
    """The socket of build number ``build``'s daemon (see :data:`SOCKET`)."""
    return SOCKET if build == 0 else SOCKET.replace(".sock", f"-{build}.sock")


def python_of(gatewrap: str) -> str:
    """The interpreter of a gatewrap console script (its venv's python)."""
    return str(Path(gatewrap).resolve().parent / "python")


def peers() -> dict[str, list[str]]:
    """The peers found on PATH, by name."""
    found = {}
    table = {
        "firejail --noprofile --net=none": ["firejail", "--quiet", "--noprofile", "--net=none", "true"],
        "nsjail (plain)": ["nsjail", "-Mo", "-q", "--chroot", "/", "--", "/bin/true"],
        "bwrap --unshare-net": ["bwrap", "--ro-bind", "/", "/", "--unshare-net", "/bin/true"],
        "unshare -n": ["unshare", "-n", "true"],
    }
    for name, argv in table.items():
        if shutil.which(argv[0]):
            found[name] = argv
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20, help="runs of each command (warm)")
    ap.add_argument("--cold", type=int, default=3, help="cold runs of each gatewrap build (0: none)")
    ap.add_argument("--gatewrap", action="append", help="a gatewrap console script (repeatable)")
    ap.add_argument("--cold-cache", type=int, default=0,
                    help="runs of each gatewrap build after dropping the page cache (0: none)")
    ap.add_argument("--no-jail", action="store_true", help="also time each build with --jail none")
    ap.add_argument("--shared", action="store_true",
                    help="also time each build with run --shared (a daemon of the bench's own, started first)")
    ap.add_argument("--workdir", help="the commands' working directory (default: a fresh empty one)")
    ap.add_argument("--json", default=str(ROOT / "bench/results/startup.json"), help="where to write the figures")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("startup.py: needs root (gatewrap run)")
    builds = args.gatewrap or [str(Path(sys.executable).parent / "gatewrap")]
    global WORKDIR
    if args.workdir is None:
        WORKDIR = tempfile.mkdtemp(prefix="gw-startup-wd-")
        os.chmod(WORKDIR, 0o777)  # the agent (nobody) enters and may write it, as a project folder
    else:
        WORKDIR = os.path.abspath(args.workdir)
    log = os.path.join(tempfile.mkdtemp(prefix="gw-startup-"), "audit.jsonl")
    cmds: dict[str, list[str]] = {}
    #: Each build's shared runs go to that build's own daemon (the client and the daemon
    #: speak one version of the protocol).
    envs: dict[str, dict[str, str]] = {}
    for i, gw in enumerate(builds):
        label = "gatewrap run --own -- /bin/true" + (f" [{gw}]" if len(builds) > 1 else "")
        cmds[label] = [gw, "run", "--own", "--audit-log", log, "--", "/bin/true"]
        if args.no_jail:
            cmds[label.replace("run --own --", "run --own --jail none --")] = [gw, "run", "--own", "--jail", "none", "--audit-log", log,
                                                               "--", "/bin/true"]
        if args.shared:
            name = label.replace("run --own --", "run --shared --")
            cmds[name] = [gw, "run", "--shared", "--audit-log", log, "--", "/bin/true"]
            envs[name] = dict(ENV, GATEWRAP_DAEMON_SOCKET=socket_of(i))
    with contextlib.ExitStack() as daemons:  # stopped however the measuring ends (a failed run exits)
        if args.shared:
            for i, gw in enumerate(builds):
                daemons.enter_context(SharedDaemon([gw], socket_of(i)))
        cmds[f"{python_of(builds[0])} -c pass"] = [python_of(builds[0]), "-c", "pass"]
        cmds.update(peers())
        for name, argv in cmds.items():  # warm-up: pins, page cache
            wall(argv, envs.get(name))
        times: dict[str, list[float]] = {k: [] for k in cmds}
        cpu: dict[str, list[float]] = {k: [] for k in cmds}
        for _ in range(args.runs):
            for name, argv in cmds.items():
                times[name].append(wall(argv, envs.get(name)))
                cpu[name].append(CPU[-1])
        cold: dict[str, list[float]] = {}
        for _ in range(args.cold):
            for gw in builds:
                subprocess.run([python_of(gw), "-c", UNLOAD], check=True)
                cold.setdefault(gw, []).append(wall([gw, "run", "--own", "--audit-log", log, "--", "/bin/true"]))
        cold_cache: dict[str, list[float]] = {}
        for _ in range(args.cold_cache):
            for gw in builds:
                os.sync()
                Path("/proc/sys/vm/drop_caches").write_text("3\n")
                cold_cache.setdefault(gw, []).append(wall([gw, "run", "--audit-log", log, "--", "/bin/true"]))
    med = {k: statistics.median(v) for k, v in times.items()}
    fj = med.get("firejail --noprofile --net=none")
    py = med[f"{python_of(builds[0])} -c pass"]
    print(f"warm, median of {args.runs} (alternating): wall, ratios of wall, CPU (user + sys)")
    for name, m in med.items():
        ratio = f"  {m / fj:5.2f}x firejail" if fj else ""
        print(f"  {m * 1000:8.1f} ms  {m / py:5.2f}x python -c pass{ratio}  cpu {statistics.median(cpu[name]) * 1000:6.1f} ms"
              f"  {name}")
    for gw, v in cold.items():
        print(f"cold, median of {len(v)}: {statistics.median(v) * 1000:8.1f} ms  {gw}")
    for gw, v in cold_cache.items():
        print(f"cold cache, median of {len(v)}: {statistics.median(v) * 1000:8.1f} ms  {gw}")
    print(f"working directory: {WORKDIR}; load average {os.getloadavg()[0]:.1f} at the end")
    out = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": os.uname().nodename, "workdir": WORKDIR,
           "loadavg": os.getloadavg(),
           "cpus": os.cpu_count(), "runs": args.runs, "warm_s": times, "warm_median_s": med,
           "warm_cpu_median_s": {k: statistics.median(v) for k, v in cpu.items()},
           "cold_s": cold, "cold_median_s": {k: statistics.median(v) for k, v in cold.items()},
           "cold_cache_s": cold_cache,
           "cold_cache_median_s": {k: statistics.median(v) for k, v in cold_cache.items()}}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
