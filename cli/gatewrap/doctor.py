"""``gatewrap doctor``: check what gatewrap needs on this machine and say how to fix it."""

from __future__ import annotations

import glob
import os
import platform
from dataclasses import dataclass

from .sandbox import limits
from .sandbox.cgroup import cgroup2_mount


@dataclass
class Check:
    """One check: ``status`` is "ok", "warn" (works, with a caveat) or "fail"."""

    name: str
    status: str
    detail: str
    fix: str = ""


def _headers() -> Check:
    rel = platform.release()
    build = f"/lib/modules/{rel}/build"
    if os.path.exists(os.path.join(build, "include")):
        return Check("kernel headers", "ok", f"{build} -> {os.path.realpath(build)}")
    candidates = sorted(glob.glob("/usr/src/linux-headers-*-amd64")) + sorted(glob.glob("/usr/src/linux-headers-*-arm64"))
    if candidates:
        best = candidates[-1]
        common = best.rsplit("-", 1)[0] + "-common"
        return Check(
            "kernel headers", "fail",
            f"bcc compiles the hooks against {build}, which is missing; this kernel ({rel}) has no "
            f"packaged headers, but the nearest installed Debian headers ({os.path.basename(best)}) can serve: "
            "the hooks use only uapi structs",
            f"mkdir -p /lib/modules/{rel} && ln -sfn {best} {build} && ln -sfn {common} /lib/modules/{rel}/source",
        )
    return Check("kernel headers", "fail", f"{build} is missing",
                 f"apt-get install linux-headers-{rel} (or linux-headers-amd64 for the nearest version)")


def _landlock() -> Check:
    """The launcher's Landlock domain (launcher/landlock.rs): ABI 6 (Linux 6.12) scopes
    signals and abstract unix sockets; any ABI stops /proc/PID/mem of processes outside it."""
    from ._gate_core import landlock_abi

    abi = landlock_abi()
    if abi is None:
        return Check("landlock", "warn",
                     "absent: --jail none cannot stop /proc/PID/mem of the user's other processes",
                     "boot a kernel with CONFIG_SECURITY_LANDLOCK=y and landlock in lsm= (Linux 6.12+ for scopes)")
    if abi < 6:
        return Check("landlock", "warn",
                     f"ABI {abi}: no signal or abstract unix socket scopes (ABI 6, Linux 6.12); "
                     "--jail none then leaves signals to the user's other processes",
                     "boot Linux 6.12 or later")
    return Check("landlock", "ok", f"ABI {abi}")


#: gatewrap's state folder: the inspection CA the agent reads (ca/) and root's files, each
#: closed on its own (audit/ 0700, ca/private 0700, state.db 0600).
STATE_DIR = "/var/lib/gatewrap"


def _state_dir(path: str = STATE_DIR) -> Check:
    """An older gatewrap made ``path`` 0700, which closes ``ca/`` to the agent's user (its
    HTTPS clients then cannot read the inspection CA); new installs make it 0755."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return Check("state folder", "ok", f"{path} (made on the first run)")
    if st.st_mode & 0o005 != 0o005:
        return Check("state folder", "warn",
                     f"{path} is {st.st_mode & 0o777:04o}: the agent's user cannot reach the inspection CA in {path}/ca "
                     "(an older gatewrap made it so; each file in it is closed on its own)",
                     f"chmod 0755 {path}")
    return Check("state folder", "ok", f"{path} {st.st_mode & 0o777:04o}")


def checks() -> list[Check]:
    """Run every check; cheap and side-effect free (nothing is compiled or mounted)."""
    out = []
    root = os.geteuid() == 0
    out.append(Check("root", "ok" if root else "fail", f"euid {os.geteuid()}",
                     "" if root else "run gatewrap with sudo"))
    cg = cgroup2_mount()
    if cg:
        layout = "unified" if cg == "/sys/fs/cgroup" else "hybrid"
        out.append(Check("cgroup v2", "ok", f"mounted at {cg} ({layout} layout)"))
        # Each bound is enforced through cgroup v2 where it has the controller, else through
        # cgroup v1 (hybrid hosts), as gatewrap.sandbox.limits.where decides for a run.
        places = {c: limits.where(c, cg) for c in ("pids", "memory", "cpu")}
        found = ", ".join(f"{c} by {p[0]}" for c, p in places.items() if p is not None)
        lacking = [c for c, p in places.items() if p is None]
        flags = {"pids": "--pids (RLIMIT_NPROC instead: it counts the user's processes host-wide)",
                 "memory": "--memory (its default too: a run needs --memory max)", "cpu": "--cpus"}
        out.append(Check("resource bounds", "warn" if lacking else "ok",
                         f"{found or 'no controller'}" + (f"; no {', '.join(flags[c] for c in lacking)} here" if lacking else ""),
                         "boot with systemd.unified_cgroup_hierarchy=1, or mount the cgroup v1 controllers" if lacking else ""))
    else:
        out.append(Check("cgroup v2", "fail", "no cgroup2 mount in /proc/self/mounts",
                         "mount -t cgroup2 none /sys/fs/cgroup/unified (or boot with systemd.unified_cgroup_hierarchy=1)"))
    btf = os.path.exists("/sys/kernel/btf/vmlinux")
    out.append(Check("BTF", "ok" if btf else "warn",
                     "/sys/kernel/btf/vmlinux present" if btf else "no /sys/kernel/btf/vmlinux (not needed by the current hooks)",
                     "" if btf else "use a kernel built with CONFIG_DEBUG_INFO_BTF=y"))
    try:
        from .bpf.bccimport import import_bcc

        bcc = import_bcc()
        out.append(Check("bcc", "ok", f"{bcc.__file__}"))
    except Exception as e:
        out.append(Check("bcc", "fail", str(e), "apt-get install python3-bpfcc"))
    out.append(_headers())
    out.append(_state_dir())
    bpffs = os.path.ismount("/sys/fs/bpf")
    out.append(Check("bpffs", "ok" if bpffs else "warn",
                     "mounted at /sys/fs/bpf" if bpffs else "not mounted (gatewrap run mounts it)",
                     "" if bpffs else "mount -t bpf bpf /sys/fs/bpf"))
    from .sandbox.jail import nsjail_path

    nsjail = nsjail_path()
    out.append(Check("nsjail", "ok" if nsjail else "fail",
                     nsjail or "not found: gatewrap run needs it unless given --jail none",
                     "" if nsjail else "apt-get install libnl-route-3-200 && python3 scripts/install_nsjail.py /usr/local/bin/nsjail"))
    out.append(_landlock())
    out.append(_waiter())
    return out


def _waiter() -> Check:
    """The native waiter and the jail's init (``gatewrap-wait``, gate_wait/)."""
    from .shared import waiter

    found = waiter.find()
    if found:
        return Check("gatewrap-wait", "ok", found)
    return Check("gatewrap-wait", "fail",
                 "not found: it is the jail's init (gatewrap run needs it unless given --jail none), and a shared "
                 "run's waiter (without it the client waits in Python, ~5 MB per run instead of ~0.1 MB)",
                 "sudo scripts/setup.sh install (builds gate_wait/ and installs it beside the venv's python)")
