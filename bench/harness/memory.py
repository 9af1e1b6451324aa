"""Memory per idle sandbox: N sandboxes of each kind running ``sleep``, their overhead summed.

Sandboxes are started one after another, each waited for until its agent (``sleep``) runs,
so the start time of the first and the last can be compared (issue 13, target 2: the
1,000th as fast as the first). With all N idle, the overhead is every process of each
sandbox's tree (the command started and its descendants, from /proc/PID/stat's ppid)
except the agent itself: RSS and PSS from /proc/PID/smaps_rollup (proc(5)), PSS sharing
pages shared between sandboxes fairly. For ``gatewrap run`` (the default, the shared daemon; issue 13, target 2:
<= 2 MB each) the daemon's PSS growth from before the first run, divided by N, is added
(``daemon_mib_each``); bench/density.py measures the same at 1,000.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time

from .common import Missing, SharedDaemon, agent_env, gatewrap_argv, need

AGENT = ["/bin/sleep", "3600"]
KINDS = {
    "unshare -n": lambda tmp, i: [need("unshare"), "-n", *AGENT],
    "bwrap --unshare-net": lambda tmp, i: [need("bwrap"), "--unshare-net", "--ro-bind", "/", "/", *AGENT],
    "firejail --net=none": lambda tmp, i: [need("firejail"), "--noprofile", "--net=none", "--quiet", *AGENT],
    "nsjail": lambda tmp, i: [need("nsjail"), "-Mo", "-Q", "--chroot", "/", "--", *AGENT],
    "gatewrap run --own": lambda tmp, i: gatewrap_argv(os.path.join(tmp, f"audit-{i}.jsonl"), "--", *AGENT),
    "gatewrap run": lambda tmp, i: gatewrap_argv(os.path.join(tmp, f"audit-s{i}.jsonl"), "--shared", "--", *AGENT),
}


def children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    return kids


def tree(pid: int, kids: dict[int, list[int]]) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def _is_agent(pid: int) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/exe").endswith("/sleep")
    except OSError:
        return False


def _rollup(pid: int) -> tuple[int, int]:
    """(RSS, PSS) of ``pid`` in KiB, from /proc/PID/smaps_rollup; (0, 0) if it is gone."""
    rss = pss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Rss:"):
                    rss = int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss = int(line.split()[1])
    except OSError:
        pass
    return rss, pss


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 60
    for p in procs:
        try:
            p.wait(max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def one_kind(kind: str, n: int, tmp: str) -> dict:
    """Start ``n`` sandboxes of ``kind``; ``{"n", "rss_mib_each", "pss_mib_each",
    "start_first_s", "start_last_s", "processes_each"}`` (and ``daemon_mib_each``, already in
    ``pss_mib_each``, for the shared mode)."""
    if kind == "gatewrap run":
        with SharedDaemon() as daemon:
            before = _rollup(daemon.proc.pid)[1]
            out = _one_kind(kind, n, tmp, daemon.env, lambda: _rollup(daemon.proc.pid)[1] - before)
            out["daemon_mib_each"] = round(out.pop("extra_kib") / 1024 / n, 2)
            return out
    out = _one_kind(kind, n, tmp, agent_env() if kind == "gatewrap run --own" else None, lambda: 0)
    out.pop("extra_kib")
    return out


def _one_kind(kind: str, n: int, tmp: str, env: dict | None, extra_pss_kib) -> dict:
    procs: list[subprocess.Popen] = []
    starts = []
    try:
        for i in range(n):
            argv = KINDS[kind](tmp, i)
            t0 = time.perf_counter()
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, env=env, start_new_session=True)
            procs.append(p)
            while not any(_is_agent(q) for q in tree(p.pid, children())):
                if p.poll() is not None:
                    raise RuntimeError(f"{kind} exited {p.returncode} before its agent ran")
                if time.perf_counter() - t0 > 60:
                    raise RuntimeError(f"{kind}: no agent after 60 s")
                time.sleep(0.005)
            starts.append(time.perf_counter() - t0)
        time.sleep(1)  # idle
        kids = children()
        rss = pss = nproc = 0
        for p in procs:
            for q in tree(p.pid, kids):
                if not _is_agent(q):
                    r, s = _rollup(q)
                    rss, pss, nproc = rss + r, pss + s, nproc + 1
        extra = extra_pss_kib()
        pss += extra
    finally:
        _stop(procs)
    return {"n": n, "extra_kib": extra, "rss_mib_each": round(rss / 1024 / n, 2), "pss_mib_each": round(pss / 1024 / n, 2),
            "processes_each": round(nproc / n, 1), "start_first_s": round(starts[0], 3),
            "start_last_s": round(starts[-1], 3)}


def measure(counts: list[int]) -> dict:
    """For each N in ``counts`` and each kind: :func:`one_kind`. Kinds that are not
    installed or fail are listed in ``missing`` with the cause."""
    tmp = tempfile.mkdtemp(prefix="gw-bench-mem-")
    os.chmod(tmp, 0o755)
    out: dict = {"counts": counts, "kinds": {}, "missing": [],
                 "note": "overhead = the sandbox's process tree minus the agent; for --shared, plus the daemon's PSS growth / N"}
    for kind in KINDS:
        for n in counts:
            try:
                out["kinds"].setdefault(kind, {})[str(n)] = one_kind(kind, n, tmp)
            except (Missing, RuntimeError, OSError) as e:
                out["missing"].append(f"{kind} N={n}: {e}")
                break
    shutil.rmtree(tmp, ignore_errors=True)
    return out
