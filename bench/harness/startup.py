"""Start-up: ``gatewrap run -- /bin/true`` against other sandboxes' start of the same command.

Every round runs each command once, in the same order (so a slow moment of the shared
machine hits all of them); the figure is the median wall time, ``first`` the first run of
the section. gatewrap's cold figure is one run right after its pinned hooks were unloaded
(compile, load, pin, attach), as after a reboot (issue 13, target 1: warm <= 2.5x firejail,
cold <= 1.5 s).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

from .common import Missing, SharedDaemon, agent_env, gatewrap_argv, median, need, ratio, timed

PEERS = {
    "unshare -n": lambda: [need("unshare"), "-n", "true"],
    "bwrap --unshare-net": lambda: [need("bwrap"), "--unshare-net", "--ro-bind", "/", "/", "true"],
    "firejail --net=none": lambda: [need("firejail"), "--noprofile", "--net=none", "--quiet", "true"],
    "nsjail": lambda: [need("nsjail"), "-Mo", "-Q", "--chroot", "/", "--", "/bin/true"],
    "python3 -c pass": lambda: ["/usr/bin/python3", "-c", "pass"],
}


def unload_hooks() -> None:
    """Detach and unpin gatewrap's BPF hooks (the next run loads them again)."""
    py = os.environ.get("GATEWRAP_PYTHON") or gatewrap_argv("x")[0]
    subprocess.run([py, "-c", "from gatewrap.sandbox import cgroup; from gatewrap.bpf import loader; "
                    "loader.unload(cgroup.parent_dir())"], check=True)


def measure(rounds: int) -> dict:
    """``{"rounds", "commands": {name: {"median_s", "first_s", "ratio"}}, "missing": [...],
    "gatewrap_cold_s"}``; ratio is gatewrap's median over the command's."""
    tmp = tempfile.mkdtemp(prefix="gw-bench-start-")
    os.chmod(tmp, 0o755)
    cmds: dict[str, tuple[list[str], dict | None]] = {
        "gatewrap run --own": (gatewrap_argv(os.path.join(tmp, "audit.jsonl"), "--", "/bin/true"), agent_env())}
    missing = []
    for name, argv in PEERS.items():
        try:
            cmds[name] = (argv(), None)
            timed(*cmds[name])  # it works here (firejail, bwrap may not in a container)
        except (Missing, subprocess.CalledProcessError, OSError) as e:
            cmds.pop(name, None)
            missing.append(f"{name} ({e})")
    unload_hooks()
    cold = timed(*cmds["gatewrap run --own"])
    with SharedDaemon() as daemon:  # the shared mode: a daemon of the bench's own, started first
        cmds = {"gatewrap run --own": cmds["gatewrap run --own"],
                "gatewrap run": (gatewrap_argv(os.path.join(tmp, "audit-shared.jsonl"), "--shared", "--",
                                                        "/bin/true"), daemon.env),
                **{k: v for k, v in cmds.items() if k != "gatewrap run --own"}}
        samples: dict[str, list[float]] = {name: [] for name in cmds}
        for _ in range(rounds):
            for name, (argv, env) in cmds.items():
                samples[name].append(timed(argv, env))
    shutil.rmtree(tmp, ignore_errors=True)
    gw = median(samples["gatewrap run"])  # the default: the shared daemon
    out = {name: {"median_s": round(median(xs), 4), "first_s": round(xs[0], 4),
                  "gatewrap_ratio": ratio(gw, median(xs))} for name, xs in samples.items()}
    fj = samples.get("firejail --net=none")
    for name in ("gatewrap run --own", "gatewrap run"):  # target 1's ratio, from the same rounds
        if fj:
            out[name]["firejail_ratio"] = ratio(median(samples[name]), median(fj))
    return {"rounds": rounds, "commands": out, "missing": missing, "gatewrap_cold_s": round(cold, 3)}
