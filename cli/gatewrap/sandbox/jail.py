"""The agent's jail: nsjail, with the profile in ``nsjail/agent.cfg`` and per-run flags.

gatewrap's launcher (Rust) has already put the process in the run's netns and cgroup and
dropped it to the agent's uid with no capabilities; it then execs nsjail, which runs
unprivileged in a user namespace that maps that uid and gid to themselves (nsjail(1),
config.proto).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ..errors import GatewrapError

PROFILE = Path(__file__).resolve().parent.parent / "_nsjail" / "agent.cfg"
#: Folders the jail replaces with private ones (or must not be made writable): a working
#: directory among them stays the jail's own, not the host's.
PRIVATE = ("/", "/tmp", "/run", "/var/run", "/dev", "/dev/shm", "/proc", "/sys")
#: What `--jail none` gives up, said on stderr when it is chosen. What still holds without it:
#: the network hooks, the launcher's mount view (cgroupfs, bpffs, /run/gatewrap and the CA key
#: hidden; /proc/sys and the audit log's folder read-only) and its seccomp filter
#: (gate_core/src/launcher/seccomp.rs).
WITHOUT_JAIL = (
    "gatewrap: warning: --jail none: the agent sees the host's files with its user's rights (only "
    "cgroupfs, bpffs, /run/gatewrap and the CA key are hidden, /proc/sys and the audit log's folder "
    "read-only), the host's /tmp and /run (host daemons' sockets included), its processes (it can "
    "signal its user's ones and, through /proc/PID/mem, write their memory: act as them outside the "
    "sandbox) and SysV IPC, with no rlimits. The network hooks and the launcher's seccomp filter (no "
    "ptrace, pidfd_getfd, bpf, io_uring, new namespaces or mounts; only unix, inet, inet6 and netlink "
    "sockets) still hold."
)


def nsjail_path() -> str | None:
    """The nsjail binary: ``$GATEWRAP_NSJAIL``, else ``nsjail`` on PATH, else None."""
    return os.environ.get("GATEWRAP_NSJAIL") or shutil.which("nsjail")


def refuse_root(uid: int) -> None:
    """An agent running as root cannot be jailed: nsjail runs as the agent's user, in a user
    namespace, and a uid 0 without capabilities may not map its gid there.

    Raises:
        GatewrapError: ``uid`` is 0.
    """
    if uid == 0:
        raise GatewrapError(
            "an agent running as root cannot be jailed (nsjail runs unprivileged, in a user namespace): "
            "run it as a user (sudo from that user, or --user USER), or add --jail none (weaker)"
        )


def tini_path() -> str | None:
    """tini, the init the agent runs under in the jail's pid namespace (Debian's ``tini``)."""
    return shutil.which("tini") or (os.path.exists("/usr/bin/tini") and "/usr/bin/tini") or None


def wrap(argv: list[str], uid: int, gid: int, cwd: str, ro_binds: list[str], rw_binds: list[str],
         mounts: list[tuple[str, str]] = ()) -> list[str]:
    """The command line that runs ``argv`` in the jail.

    ``cwd`` becomes the agent's writable working directory (unless it is one of
    :data:`PRIVATE`); ``ro_binds``/``rw_binds`` are extra host paths made visible;
    ``mounts`` are (host path, path in the jail) pairs shown read-only (gatewrap's shims).

    Raises:
        GatewrapError: nsjail or tini is not installed (a root ``uid``: see :func:`refuse_root`).
    """
    nsjail, tini = nsjail_path(), tini_path()
    if nsjail is None or tini is None:
        missing = "nsjail" if nsjail is None else "tini (apt-get install tini)"
        raise GatewrapError(
            f"{missing} is not installed: run scripts/setup.sh install, "
            "or run without the jail with --jail none (weaker: see gatewrap run --help)"
        )
    cmd = [nsjail, "--config", str(PROFILE), "--really_quiet", "-u", f"{uid}:{uid}:1",
           "-g", f"{gid}:{gid}:1", "--cwd", cwd]
    writable = list(rw_binds)
    if os.path.abspath(cwd) not in PRIVATE:
        writable.append(cwd)
    for path in ro_binds:
        cmd += ["-R", path]
    for src, dst in mounts:
        cmd += ["-R", f"{src}:{dst}"]
    for path in writable:
        cmd += ["-B", path]
    return [*cmd, "--", tini, "--", *argv]
