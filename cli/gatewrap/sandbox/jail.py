"""The agent's jail: nsjail, with the profile in ``nsjail/agent.cfg`` and per-run flags.

gatewrap's launcher (Rust) has already put the process in the run's netns, cgroup, a pid
namespace (as its init) and a mount namespace of its own, with no_new_privs; it then execs
nsjail as root, which adds its namespaces (no user namespace: the kernel refuses those in a
chroot, and some distributions restrict them), becomes the agent's uid, gid and groups, drops
every capability and execs the jail's init in its own place (execve mode: no resident
nsjail), which runs the agent (nsjail(1), config.proto).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from ..errors import GatewrapError
from . import tmpfs, user, view

PROFILE = Path(__file__).resolve().parent.parent / "_nsjail" / "agent.cfg"
#: What `--jail none` gives up, said on stderr when it is chosen. What still holds without it:
#: the network hooks, the launcher's mount view (cgroupfs, bpffs, /run/gatewrap and the CA key
#: hidden; /proc/sys and the audit log's folder read-only) and its seccomp filter
#: (gate_core/src/launcher/seccomp.rs).
WITHOUT_JAIL = (
    "gatewrap: warning: --jail none: the agent sees the host's files with its user's rights (only "
    "cgroupfs, bpffs, /run/gatewrap and the CA key are hidden, /proc/sys and the audit log's folder "
    "read-only), the host's /tmp and /run (host daemons' sockets included), its processes and SysV "
    "IPC, with no rlimits. The network hooks, the launcher's seccomp filter (no ptrace, pidfd_getfd, "
    "bpf, io_uring, new namespaces or mounts; only unix, inet, inet6 and netlink sockets) and its "
    "Landlock domain still hold: no /proc/PID/mem of a process outside the run and, with Landlock ABI "
    "6 (Linux 6.12), no signal to one and no connect to an abstract unix socket bound outside the run "
    "(`gatewrap doctor` shows the ABI; without Landlock the agent can write its user's processes' "
    "memory through /proc/PID/mem and act as them outside the sandbox)."
)


def refuse_root(uid: int) -> None:
    """An agent running as root is not jailed: without capabilities uid 0 still passes the
    owner bits of root's files, and the jail shows the system's /etc whole (/etc/shadow, TLS
    and SSH host keys are 0600/0640 root).

    Raises:
        GatewrapError: ``uid`` is 0.
    """
    if uid == 0:
        raise GatewrapError(
            "an agent running as root would read root's files the jail shows (/etc/shadow, host keys): run "
            "it as a user (sudo from that user, or --user USER), or add --jail none (weaker: it sees the host)")


#: Where nsjail is looked for after PATH: where scripts/setup.sh installs it, then the usual
#: folders of system binaries (sudo's secure_path and a root shell have them, a user's PATH
#: often not).
NSJAIL_DIRS = ("/usr/local/bin", "/usr/local/sbin", "/usr/sbin", "/usr/bin", "/sbin")


def nsjail_path(environ: Mapping[str, str] | None = None) -> str | None:
    """The nsjail binary: ``$GATEWRAP_NSJAIL`` (of ``environ``, else this process's
    environment), else ``nsjail`` on PATH, else the first executable ``nsjail`` in
    :data:`NSJAIL_DIRS`, else None."""
    named = (os.environ if environ is None else environ).get("GATEWRAP_NSJAIL")
    return named or shutil.which("nsjail") or shutil.which("nsjail", path=os.pathsep.join(NSJAIL_DIRS))


def init_path() -> str | None:
    """The jail's init: ``gatewrap-wait`` (its ``--init`` mode, in tini's place; the crate
    ``gate_wait/``), installed beside the virtualenv's interpreter; None when missing."""
    from ..shared import waiter

    return waiter.find()


def wrap(argv: list[str], target: user.Target, cwd: str, mounts: list[view.Mount],
         nsjail: str | None = None, tmpfs_budget: int = tmpfs.MIN_BUDGET) -> list[str]:
    """The command line that runs ``argv`` in the jail as ``target``, in ``cwd``, with the
    file system view ``mounts`` (:func:`gatewrap.sandbox.view.build`) added to the profile's,
    its tmpfs mounts sized out of ``tmpfs_budget`` bytes (:mod:`gatewrap.sandbox.tmpfs`).
    ``nsjail``: the binary (default :func:`nsjail_path`).

    nsjail runs in execve mode (the profile's ``mode: EXECVE``): it sets up the jail in the
    launcher's child, already the init of a pid namespace of its own, and execs the jail's
    init, ``gatewrap-wait --init`` (:func:`init_path`), through a descriptor it opened before
    its mounts (``--execute_fd``: the virtualenv is not in the jail's view), under the name
    :data:`gatewrap.shared.waiter.NAME` (its host path is not the agent's to know); that
    init runs ``argv``. No nsjail stays resident.

    Raises:
        GatewrapError: nsjail or gatewrap-wait is not installed.
    """
    nsjail, init = nsjail or nsjail_path(), init_path()
    if nsjail is None or init is None:
        missing = "nsjail" if nsjail is None else "gatewrap-wait (beside the virtualenv's python)"
        raise GatewrapError(
            f"{missing} is not installed: run scripts/setup.sh install, "
            "or run without the jail with --jail none (weaker: see gatewrap run --help)"
        )
    uid, gid = target.uid, target.gid
    # nsjail starts as root (no user namespace: see the profile) and becomes uid, gid and the
    # supplementary groups (every -g after the first) before it execs the agent.
    cmd = [nsjail, "--config", str(PROFILE), "--really_quiet", "-u", str(uid), "-g", str(gid)]
    for g in target.groups:
        if g != gid:
            cmd += ["-g", str(g)]
    cmd += ["--cwd", cwd, *tmpfs.nsjail_args(tmpfs_budget),
            *view.nsjail_args(mounts, tmpfs.home_options(tmpfs_budget))]
    # --exec_file: the binary nsjail opens (a host path); argv[0] is only its name, which the
    # agent sees in /proc/1/cmdline (the init makes the rest of its /proc/1 root's).
    from ..shared import waiter

    return [*cmd, "--execute_fd", "--exec_file", init, "--", waiter.NAME, "--init", "--", *argv]
