#!/usr/bin/env python3
"""Issue 13, target 2: N idle sandboxes of the shared mode on this host, what each costs in
gatewrap's memory, whether the N-th starts as fast as the first, and whether every one still
enforces.

Starts a daemon of its own (``gatewrap daemon --socket /run/gatewrap/bench-density.sock``),
then N ``gatewrap run --shared -- /bin/sleep 3600`` one after another, each waited for until
its agent runs (the time of that is its start time). With all N idle:

- **overhead per sandbox** (KiB): PSS (/proc/PID/smaps_rollup, proc(5): shared pages split
  fairly among the processes that map them) of every process of each run's tree except the
  agent — the waiter (``gatewrap-wait``, the client exec'd) and the jail's init
  (``gatewrap-wait --init``; nsjail execs it and does not stay) — plus the daemon's PSS growth
  from before the first run, divided by N. ``--no-jail`` leaves the init out (``--jail
  none``); the figure with the jail is the one the target names (the jail is the sandbox's).
- **host memory per sandbox** (KiB): MemAvailable's fall (/proc/meminfo) over the N, divided
  by N: everything, kernel objects (netns, cgroup, sockets, BPF map entries) included; and the
  kernel's part of it from /proc/meminfo (Slab and its unreclaimable part, KernelStack,
  PageTables, Percpu), each per sandbox. Context, not the target.
- **what else limits N**: processes per sandbox (against kernel.pid_max), the daemon's open
  descriptors per sandbox (against its RLIMIT_NOFILE).
- **enforcing**: for every sandbox (or ``--probe K`` of them, evenly spaced, first and last
  included), a probe process joins its cgroup (cgroup.procs) and its netns (setns(2)), tries a
  TCP connect to 198.51.100.1:9 (documentation range; must fail with EPERM, from the hooks)
  and sends a request through its gate (``GET http://probe.test/``: the gate must answer it,
  403 from the default-deny policy). The count of probed sandboxes where both hold.
- start time of the first and of the last sandbox, medians of the first and last 10.

``--floor-mib M`` stops starting sandboxes when MemAvailable falls under M MiB (the host is
shared: the result says how many ran and why it stopped), and so does a run that fails to
start (the daemon out of descriptors: its ceiling; ``stopped`` says so); ``--pid-max N`` raises
kernel.pid_max (and kernel.threads-max) for the bench only and restores them at its end.

Prints one JSON object and writes bench/results/density.json. Root; take the kernel lock
(``flock /tmp/gatewrap-kernel.lock``). A thousand sandboxes take ~1–3 GB and a few minutes on
2 cores.

Usage: sudo .venv/bin/python bench/density.py [-n N] [--no-jail] [--probe K] [--floor-mib M] [--pid-max N]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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


def meminfo_kib() -> dict[str, int]:
    """/proc/meminfo's fields in KiB (proc(5))."""
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, value = line.split(":", 1)
            out[key] = int(value.split()[0])
    return out


def pss_by_mapping(pid: int) -> dict[str, int]:
    """``pid``'s PSS in KiB by what is mapped (/proc/PID/smaps: a file's name, ``[heap]``,
    ``anon_inode:bpf-map``, ``[anon]`` for an anonymous mapping without a name)."""
    out: dict[str, int] = {}
    name = "[anon]"
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
                name = head[5] if len(head) > 5 else "[anon]"
            elif head[0] == "Pss:":
                out[name] = out.get(name, 0) + int(head[1])
    return out


def mem_available_kib() -> int:
    return meminfo_kib()["MemAvailable"]


#: The kernel's own memory, from /proc/meminfo: what a sandbox's netns, cgroup, sockets and
#: processes cost the kernel (slab objects, kernel stacks, page tables, per-CPU areas).
KERNEL_FIELDS = ("Slab", "SUnreclaim", "KernelStack", "PageTables", "Percpu")


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
s = socket.socket()
s.settimeout(5)
try:
    s.connect(("198.51.100.1", 9))
    out.append("connected")
except OSError as e:
    out.append(errno.errorcode.get(e.errno, str(e.errno)))
s.close()
try:
    s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    s.sendall(b"GET http://probe.test/ HTTP/1.1\r\nHost: probe.test\r\nConnection: close\r\n\r\n")
    out.append(s.recv(64).split(b"\r\n")[0].decode("latin-1").replace(" ", "_") or "no-answer")
except OSError as e:
    out.append(errno.errorcode.get(e.errno, str(e.errno)))
print(" ".join(out))
"""


def enforcing(run_id: str, cgroup_parent: str) -> tuple[bool, str]:
    """Whether sandbox ``run_id`` refuses a direct connect (EPERM) and its gate answers a
    request (403: the default-deny policy); and what the probe said."""
    p = subprocess.run([sys.executable, "-I", "-c", PROBE, os.path.join(cgroup_parent, run_id)],
                       capture_output=True, text=True, timeout=30)
    said = p.stdout.split()
    return said[:1] == ["EPERM"] and said[1:2] == ["HTTP/1.1_403_Forbidden"], " ".join(said) or p.stderr[-200:]


def slab_kib() -> dict[str, int]:
    """KiB held by each slab cache (/proc/slabinfo, slabinfo(5): num_objs x objsize)."""
    out = {}
    with open("/proc/slabinfo") as f:
        for line in f.readlines()[2:]:
            name, _active, num, size = line.split()[:4]
            out[name] = int(num) * int(size) // 1024
    return out


def fd_kinds(pid: int) -> dict[str, int]:
    """``pid``'s open descriptors by what they are (readlink of /proc/PID/fd/N: ``socket``,
    ``anon_inode:bpf-map``, ``net`` for a namespace, a path's first two parts...)."""
    kinds: dict[str, int] = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/"):
            kind = "/".join(target.split("/")[:3])
        else:
            kind = target.split("[")[0].rstrip(":") if not target.startswith("anon_inode:") else target.split("]")[0] + "]"
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def thread_names(pid: int) -> dict[str, int]:
    """``pid``'s threads by name (/proc/PID/task/TID/comm), most first."""
    names: dict[str, int] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        names[name] = names.get(name, 0) + 1
    return dict(sorted(names.items(), key=lambda kv: -kv[1]))


def sample(items: list, k: int | None) -> list:
    """``k`` of ``items`` evenly spaced, the first and the last included (all if k is None or
    not less than their number)."""
    if k is None or k >= len(items) or len(items) < 2:
        return list(items)
    step = (len(items) - 1) / (k - 1)
    return [items[round(i * step)] for i in range(k)]


def sysctl(name: str, value: int | None = None) -> int:
    """Read /proc/sys/kernel/NAME, and set it to ``value`` first when given; the old value."""
    path = f"/proc/sys/kernel/{name}"
    with open(path) as f:
        old = int(f.read())
    if value is not None:
        with open(path, "w") as f:
            f.write(str(value))
    return old


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=(
        "Needs root; take the host's kernel lock (flock /tmp/gatewrap-kernel.lock). Starts a daemon of "
        f"its own on {SOCKET}, prints one JSON object and writes bench/results/density.json. See the "
        "module docstring for what is measured."))
    ap.add_argument("-n", type=int, default=100, help="sandboxes (default 100)")
    ap.add_argument("--no-jail", action="store_true", help="runs with --jail none (no nsjail, no jail init)")
    ap.add_argument("--probe", type=int, default=None, metavar="K",
                    help="probe K sandboxes, evenly spaced, first and last included (default: all)")
    ap.add_argument("--floor-mib", type=int, default=3072, metavar="M",
                    help="stop starting sandboxes when MemAvailable < M MiB (default 3072)")
    ap.add_argument("--pid-max", type=int, default=None, metavar="N",
                    help="raise kernel.pid_max and kernel.threads-max to N for the bench, restored at its end")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("density.py: needs root (sudo)")
    restore = {}
    if args.pid_max:
        restore = {name: sysctl(name) for name in ("pid_max", "threads-max")}
        for name, old in restore.items():
            sysctl(name, max(old, args.pid_max))
        print(f"density: kernel.pid_max and threads-max raised to {args.pid_max} for the bench "
              f"(were {restore}; restored at the end)", file=sys.stderr, flush=True)
    try:
        return bench(args)
    finally:
        for name, old in restore.items():
            sysctl(name, old)


def bench(args: argparse.Namespace) -> int:
    py = os.environ.get("GATEWRAP_PYTHON", VENV_PY)
    env = dict(os.environ, SUDO_UID=str(AGENT_UID), SUDO_GID=str(AGENT_UID), GATEWRAP_DAEMON_SOCKET=SOCKET)
    env.pop("GATEWRAP_SHARED", None)
    log = open("/tmp/gatewrap-bench-density-daemon.log", "ab")
    # The daemon holds descriptors per sandbox (daemon_fds_each): its soft RLIMIT_NOFILE is
    # raised to the hard one (a shell's soft 1024 would cap N at a few dozen; the systemd unit
    # sets LimitNOFILE=1048576), and the hard one is what it is (raising it needs
    # CAP_SYS_RESOURCE, which a container may not have): result["daemon_nofile"].
    def raise_nofile() -> None:
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    daemon = subprocess.Popen([py, "-m", "gatewrap", "daemon", "--socket", SOCKET], stdout=log, stderr=log,
                              start_new_session=True, preexec_fn=raise_nofile)
    procs: list[subprocess.Popen] = []
    result: dict = {"n": args.n, "jail": not args.no_jail, "uptime": open("/proc/loadavg").read().split()[:3]}
    try:
        while not os.path.exists(SOCKET):
            if daemon.poll() is not None:
                raise RuntimeError("the daemon exited; see /tmp/gatewrap-bench-density-daemon.log")
            time.sleep(0.05)
        time.sleep(0.5)
        daemon_before = pss_kib(daemon.pid)
        fds_before = fd_kinds(daemon.pid)
        maps_before = pss_by_mapping(daemon.pid)
        slab_before = slab_kib()
        mem_before = meminfo_kib()
        avail_before = mem_before["MemAvailable"]
        starts = []
        jail = ["--jail", "none", "--user", str(AGENT_UID)] if args.no_jail else []
        os.makedirs("/tmp/gw-bench-density", mode=0o755, exist_ok=True)
        # The agents' working directory: an empty folder of its own, as an agent's project
        # folder would be. (With /tmp, every start would look through /tmp for unix sockets
        # to tell of, and /tmp holds this bench's files: the start would grow with them.)
        workdir = "/var/lib/gatewrap-bench/work"
        os.makedirs(workdir, mode=0o755, exist_ok=True)
        floor_kib = args.floor_mib * 1024
        for i in range(args.n):
            if mem_available_kib() < floor_kib:
                result["stopped"] = f"MemAvailable under {args.floor_mib} MiB after {i} sandboxes"
                print(f"density: {result['stopped']}", file=sys.stderr, flush=True)
                break
            argv = [py, "-m", "gatewrap", "run", "--shared", "--audit-log", f"/tmp/gw-bench-density/audit-{i}.jsonl",
                    "--workdir", workdir, *jail, "--", *AGENT]
            t0 = time.perf_counter()
            with open(f"/tmp/gw-bench-density/run-{i}.err", "wb") as err:
                p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=err, env=env, start_new_session=True)
            procs.append(p)
            while not any(exe(q) == "sleep" for q in descendants(p.pid)):
                if p.poll() is not None:
                    break
                if time.perf_counter() - t0 > 120:
                    raise RuntimeError(f"run {i}: no agent after 120 s")
                time.sleep(0.002)
            if p.poll() is not None:
                # What stops N here (the daemon out of descriptors: EMFILE) is the finding:
                # the sandboxes up so far are measured all the same.
                procs.pop()
                with open(f"/tmp/gw-bench-density/run-{i}.err", errors="replace") as f:
                    said = f.read().strip().splitlines()
                result["stopped"] = f"run {i + 1} exited {p.returncode} before its agent ran: {said[-1] if said else ''}"
                print(f"density: {result['stopped']}", file=sys.stderr, flush=True)
                break
            starts.append(time.perf_counter() - t0)
            if (i + 1) % 100 == 0:
                print(f"density: {i + 1} sandboxes up", file=sys.stderr, flush=True)
        n = len(procs)
        result["n"] = n
        time.sleep(2)  # idle
        kids = children()
        per_proc: dict[str, int] = {}
        trees_kib = 0
        nprocs = 0
        runs = []
        for p in procs:
            for q in tree(p.pid, kids):
                nprocs += 1
                name = exe(q)
                if name == "sleep":
                    runs.append(run_id_of(q))
                    continue
                if name == "gatewrap-wait":
                    name = "waiter" if q == p.pid else "init"
                k = pss_kib(q)
                trees_kib += k
                per_proc[name] = per_proc.get(name, 0) + k
        daemon_growth = pss_kib(daemon.pid) - daemon_before
        mem_after = meminfo_kib()
        avail_fall = avail_before - mem_after["MemAvailable"]
        daemon_fds = len(os.listdir(f"/proc/{daemon.pid}/fd"))
        fds_after = fd_kinds(daemon.pid)
        maps_after = pss_by_mapping(daemon.pid)
        maps_growth = sorted(((v - maps_before.get(k, 0), k) for k, v in maps_after.items()), reverse=True)
        slab_after = slab_kib()
        slab_growth = sorted(((slab_after.get(k, 0) - slab_before.get(k, 0), k) for k in slab_after), reverse=True)
        from gatewrap.sandbox import cgroup

        parent = cgroup.parent_dir()
        probed = sample(runs, args.probe)
        verdicts = [enforcing(r, parent) if r is not None else (False, "no run id") for r in probed]
        ok = sum(1 for good, _ in verdicts if good)
        first, last = starts[: min(10, len(starts))], starts[-min(10, len(starts)):]
        result.update({
            "overhead_kib_each": round((trees_kib + daemon_growth) / n, 1),
            "clients_kib_each": round(trees_kib / n, 1),
            "daemon_kib_each": round(daemon_growth / n, 1),
            "by_process_kib_each": {k: round(v / n, 1) for k, v in sorted(per_proc.items())},
            "host_kib_each": round(avail_fall / n, 1),
            "kernel_kib_each": {k: round((mem_after[k] - mem_before[k]) / n, 1) for k in KERNEL_FIELDS},
            "processes_each": round(nprocs / n, 2),
            "daemon_fds_each": round(daemon_fds / n, 2),
            "daemon_fds_each_by_kind": {k: round((v - fds_before.get(k, 0)) / n, 2)
                                        for k, v in sorted(fds_after.items()) if v - fds_before.get(k, 0) >= n // 2},
            "slab_kib_each_top": {k: round(v / n, 1) for v, k in slab_growth[:12]},
            "daemon_pss_kib_each_by_mapping": {k: round(v / n, 1) for v, k in maps_growth[:6]},
            "daemon_nofile": open(f"/proc/{daemon.pid}/limits").read().split("Max open files")[1].split()[:2],
            "probed": len(probed),
            "probe_said": sorted({said for _, said in verdicts}),
            "enforcing": ok,
            "start_first_s": round(starts[0], 3), "start_last_s": round(starts[-1], 3),
            "start_first10_median_s": round(statistics.median(first), 3),
            "start_last10_median_s": round(statistics.median(last), 3),
            "daemon_threads": int(next(l.split()[1] for l in open(f"/proc/{daemon.pid}/status") if l.startswith("Threads:"))),
            "daemon_threads_by_name": thread_names(daemon.pid),
            "daemon_fds": daemon_fds,
            "pid_max": int(open("/proc/sys/kernel/pid_max").read()),
            "uptime_end": open("/proc/loadavg").read().split()[:3],
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
    return 0 if result.get("enforcing") == result.get("probed") else 1


if __name__ == "__main__":
    sys.exit(main())
