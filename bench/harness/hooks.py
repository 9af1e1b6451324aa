"""Kernel hook cost: bench/hook_loop.c (>= 200k calls) in a netns of its own, in a cgroup
with gatewrap's hooks (a leaf under gatewrap/, configured as a run's: gate 127.0.0.1, TCP
3128, UDP 53) and in one without (a cgroup beside gatewrap/), alternating, median of 3.

Cases: a TCP connect the hooks allow (to the gate's port; nothing listens in the netns, so
ECONNREFUSED: the SYN and RST pass the packet hook too), a TCP connect they refuse (EPERM
with hooks, a folded record; ECONNREFUSED without), and an allowed UDP sendto. Target 4 of
issue 13: <= 1 us added per connect and per sendto.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile

from gatewrap.bpf import loader
from gatewrap.sandbox import cgroup

from .common import ROOT, median, need
from .gate import Netns

CASES = {"tcp connect allowed": ("tcp", "127.0.0.1", 3128), "tcp connect refused (EPERM; without hooks ECONNREFUSED)": ("tcp", "127.0.0.1", 9),
         "udp sendto allowed": ("udp", "127.0.0.1", 53)}


def _loop(exe: str, cg: str, ns: Netns, case: tuple[str, str, int], n: int) -> dict:
    mode, ip, port = case
    script = 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"'
    p = subprocess.run(["sh", "-c", script, "sh", cg, *ns.exec([exe, mode, ip, str(port), str(n)])],
                       capture_output=True, text=True, check=True, timeout=300)
    return json.loads(p.stdout)


def measure(n: int, reps: int = 3) -> dict:
    """``{case: {"wall_with_ns", "wall_without_ns", "wall_added_ns", "cpu_..." (the same for
    the loop's CPU time), "errno_with", "errno_without"}}``, nanoseconds per call (medians)."""
    tmp = tempfile.mkdtemp(prefix="gw-bench-hooks-")
    exe = os.path.join(tmp, "hook_loop")
    subprocess.run([need("cc"), "-O2", "-o", exe, os.path.join(ROOT, "bench", "hook_loop.c")], check=True)
    parent = cgroup.parent_dir()
    hooks = loader.load_or_reuse(parent)
    leaf, cg_id = cgroup.create_leaf(parent, f"bench-hooks-{os.getpid()}")
    bare = os.path.join(os.path.dirname(parent), f"gatewrap-bench-nohooks-{os.getpid()}")
    os.mkdir(bare)
    run_hooks = hooks.configure(cg_id, "127.0.0.1", "::1", [3128], [53])
    out: dict = {"calls": n}
    try:
        with Netns(f"gwb-hooks-{os.getpid()}") as ns:
            for name, case in CASES.items():
                with_, without = [], []
                for _ in range(reps):
                    with_.append(_loop(exe, leaf, ns, case, n))
                    without.append(_loop(exe, bare, ns, case, n))
                cell: dict = {}
                for key, label in (("ns_per_call", "wall"), ("cpu_ns_per_call", "cpu")):
                    w, wo = median([r[key] for r in with_]), median([r[key] for r in without])
                    cell.update({f"{label}_with_ns": round(w), f"{label}_without_ns": round(wo),
                                 f"{label}_added_ns": round(w - wo)})
                out[name] = {**cell, "errno_with": with_[0]["errno"], "errno_without": without[0]["errno"]}
    finally:
        run_hooks.release()
        hooks.close()
        cgroup.kill_and_remove(leaf)
        cgroup.kill_and_remove(bare)
        shutil.rmtree(tmp, ignore_errors=True)
    return out
