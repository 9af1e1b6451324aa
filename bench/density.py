#!/usr/bin/env python3
"""Issue 13, target 2: N idle sandboxes of the shared mode on this host, what each costs in
gatewrap's memory, whether the N-th starts as fast as the first, and whether every one still
enforces.

Starts a daemon of its own (``gatewrap daemon --socket /run/gatewrap/bench-density.sock``),
then N ``gatewrap run --shared -- /bin/sleep 3600`` one after another, each waited for until
its agent runs (the time of that is its start time). With all N idle:

- **overhead per sandbox** (KiB): PSS (/proc/PID/smaps_rollup, proc(5): shared pages split
  fairly among the processes that map them) of every process of each run's tree except the
  agent — the waiter (``gatewrap-wait``), nsjail, tini — plus the daemon's PSS growth from
  before the first run, divided by N. ``--no-jail`` leaves nsjail and tini out (``--jail
  none``); the figure with the jail is the one the target names (the jail is the sandbox's).
- **host memory per sandbox** (KiB): MemAvailable's fall (/proc/meminfo) over the N, divided
  by N: everything, kernel objects (netns, cgroup, sockets, BPF map entries) included. Context,
  not the target.
- **enforcing**: for every sandbox, a probe process joins its cgroup (cgroup.procs) and its
  netns (setns(2)) and tries a TCP connect to 198.51.100.1:9 (documentation range; must fail
  with EPERM, from the hooks) and to the gate at 127.0.0.1:3128 (must connect). The count of
  sandboxes where both hold.
- start time of the first and of the last sandbox, medians of the first and last 10.

Prints one JSON object and writes bench/results/density.json. Root; take the kernel lock
(``flock /tmp/gatewrap-kernel.lock``). A thousand sandboxes take ~1–3 GB and a few minutes on
2 cores.

Usage: sudo .venv/bin/python bench/density.py [-n N] [--no-jail]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

from harness.common import AGENT_UID, RESULTS, VENV_PY  # noqa: E402
from harness.memory import children, tree  # noqa: E402

SOCKET = "/run/gatewrap/bench-density.sock"
AGENT = ["/bin/sleep", "3600"]


def descendants(pid: int) -> list[int]:
    """``pid`` and its descendants, from /proc/PID/task/TID/children (proc(5)): cheap, unlike a
    scan of all of /proc, whose cost would grow with the sandboxes already running."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return out


def exe(pid: int) -> str:
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return ""


def pss_kib(pid: int) -> int:
    """PSS of ``pid`` in KiB (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def mem_available_kib() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def run_id_of(pid: int) -> str | None:
    """The run id of the sandbox ``pid`` (an agent) is in, from /proc/PID/cgroup."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            path = f.read().strip().rsplit(":", 1)[-1]
    except OSError:
        return None
    leaf = os.path.basename(path)
    return leaf if leaf.startswith("gw-") else None


PROBE = r"""
import ctypes, errno, os, socket, sys
leaf = sys.argv[1]
with open(os.path.join(leaf, "cgroup.procs")) as f:  # the run's netns: its agent's
    ns = "/proc/%s/ns/net" % f.read().split()[0]
with open(os.path.join(leaf, "cgroup.procs"), "w") as f:
    f.write(str(os.getpid()))
libc = ctypes.CDLL(None, use_errno=True)
fd = os.open(ns, os.O_RDONLY)
if libc.setns(fd, 0x40000000) != 0:
    sys.exit(3)
out = []
for addr in (("198.51.100.1", 9), ("127.0.0.1", 3128)):
    s = socket.socket()
    s.settimeout(5)
    try:
        s.connect(addr)
        out.append("connected")
    except OSError as e:
        out.append(errno.errorcode.get(e.errno, str(e.errno)))
    s.close()
print(" ".join(out))
"""


def enforcing(run_id: str, cgroup_parent: str) -> bool:
    """Whether sandbox ``run_id`` refuses a direct connect (EPERM) and serves the gate."""
    p = subprocess.run([sys.executable, "-I", "-c", PROBE, os.path.join(cgroup_parent, run_id)],
                       capture_output=True, text=True, timeout=30)
    return p.stdout.split() == ["EPERM", "connected"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=(
        "Needs root; take the host's kernel lock (flock /tmp/gatewrap-kernel.lock). Starts a daemon of "
        f"its own on {SOCKET}, prints one JSON object and writes bench/results/density.json. See the "
        "module docstring for what is measured."))
    ap.add_argument("-n", type=int, default=100, help="sandboxes (default 100)")
    ap.add_argument("--no-jail", action="store_true", help="runs with --jail none (no nsjail, no tini)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("density.py: needs root (sudo)")
    py = os.environ.get("GATEWRAP_PYTHON", VENV_PY)
    env = dict(os.environ, SUDO_UID=str(AGENT_UID), SUDO_GID=str(AGENT_UID), GATEWRAP_DAEMON_SOCKET=SOCKET)
    env.pop("GATEWRAP_SHARED", None)
    log = open("/tmp/gatewrap-bench-density-daemon.log", "ab")
    daemon = subprocess.Popen([py, "-m", "gatewrap", "daemon", "--socket", SOCKET], stdout=log, stderr=log,
                              start_new_session=True)
    procs: list[subprocess.Popen] = []
    result: dict = {"n": args.n, "jail": not args.no_jail}
    try:
        while not os.path.exists(SOCKET):
            if daemon.poll() is not None:
                raise RuntimeError("the daemon exited; see /tmp/gatewrap-bench-density-daemon.log")
            time.sleep(0.05)
        time.sleep(0.5)
        daemon_before = pss_kib(daemon.pid)
        avail_before = mem_available_kib()
        starts = []
        jail = ["--jail", "none", "--user", str(AGENT_UID)] if args.no_jail else []
        os.makedirs("/tmp/gw-bench-density", mode=0o755, exist_ok=True)
        # The agents' working directory: an empty folder of its own, as an agent's project
        # folder would be. (With /tmp, every start would look through /tmp for unix sockets
        # to tell of, and /tmp holds this bench's files: the start would grow with them.)
        workdir = "/var/lib/gatewrap-bench/work"
        os.makedirs(workdir, mode=0o755, exist_ok=True)
        for i in range(args.n):
            argv = [py, "-m", "gatewrap", "run", "--shared", "--audit-log", f"/tmp/gw-bench-density/audit-{i}.jsonl",
                    "--workdir", workdir, *jail, "--", *AGENT]
            t0 = time.perf_counter()
            with open(f"/tmp/gw-bench-density/run-{i}.err", "wb") as err:
                p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=err, env=env, start_new_session=True)
            procs.append(p)
            while not any(exe(q) == "sleep" for q in descendants(p.pid)):
                if p.poll() is not None:
                    with open(f"/tmp/gw-bench-density/run-{i}.err", errors="replace") as f:
                        raise RuntimeError(f"run {i} exited {p.returncode} before its agent ran: {f.read()[-2000:]}")
                if time.perf_counter() - t0 > 120:
                    raise RuntimeError(f"run {i}: no agent after 120 s")
                time.sleep(0.002)
            starts.append(time.perf_counter() - t0)
            if (i + 1) % 100 == 0:
                print(f"density: {i + 1} sandboxes up", file=sys.stderr, flush=True)
        time.sleep(2)  # idle
        kids = children()
        per_proc: dict[str, int] = {}
        trees_kib = 0
        runs = []
        for p in procs:
            for q in tree(p.pid, kids):
                name = exe(q)
                if name == "sleep":
                    runs.append(run_id_of(q))
                    continue
                k = pss_kib(q)
                trees_kib += k
                per_proc[name] = per_proc.get(name, 0) + k
        daemon_growth = pss_kib(daemon.pid) - daemon_before
        avail_fall = avail_before - mem_available_kib()
        from gatewrap.sandbox import cgroup

        parent = cgroup.parent_dir()
        ok = sum(1 for r in runs if r is not None and enforcing(r, parent))
        first, last = starts[: min(10, len(starts))], starts[-min(10, len(starts)):]
        result.update({
            "overhead_kib_each": round((trees_kib + daemon_growth) / args.n, 1),
            "clients_kib_each": round(trees_kib / args.n, 1),
            "daemon_kib_each": round(daemon_growth / args.n, 1),
            "by_process_kib_each": {k: round(v / args.n, 1) for k, v in sorted(per_proc.items())},
            "host_kib_each": round(avail_fall / args.n, 1),
            "enforcing": ok,
            "start_first_s": round(starts[0], 3), "start_last_s": round(starts[-1], 3),
            "start_first10_median_s": round(statistics.median(first), 3),
            "start_last10_median_s": round(statistics.median(last), 3),
            "daemon_threads": int(next(l.split()[1] for l in open(f"/proc/{daemon.pid}/status") if l.startswith("Threads:"))),
            "daemon_fds": len(os.listdir(f"/proc/{daemon.pid}/fd")),
            "pid_max": int(open("/proc/sys/kernel/pid_max").read()),
        })
    finally:
        t0 = time.perf_counter()
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(120)
            except subprocess.TimeoutExpired:
                p.kill()
        result["stop_all_s"] = round(time.perf_counter() - t0, 2)
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(60)
    print(json.dumps(result, indent=1))
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "density.json"), "w") as f:
        json.dump(result, f, indent=1)
    return 0 if result.get("enforcing") == args.n else 1


if __name__ == "__main__":
    sys.exit(main())
