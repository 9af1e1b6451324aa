"""The run's network namespace: a new one with only ``lo``, up, held by an open file
descriptor of the gatewrap process that made it (a run of its own, or the shared mode's
daemon), not named under /var/run/netns.

A short-lived thread unshares its network namespace (unshare(2): CLONE_NEWNET changes the
calling thread's only), opens ``/proc/thread-self/ns/net`` (the descriptor keeps the
namespace alive: namespaces(7), "The namespace lifetime") and brings ``lo`` up with
SIOCSIFFLAGS (netdevice(7)); the kernel gives an up loopback 127.0.0.1/8 and ::1 itself
(net/ipv4/devinet.c, net/ipv6/addrconf.c). Plain syscalls through ctypes: no netlink
library, no helper process. The gate and the launcher open it by
``/proc/PID/fd/FD``; a restarted daemon finds it again through ``/proc/PID/ns/net`` of a
process in the run's cgroup (:func:`of_cgroup`). It goes away with the last process in
it and the last descriptor.

Why not a bind mount under /var/run/netns as ip-netns(8) makes: every named namespace is
a mount in the host's mount table, and every new mount namespace (the launcher's, the
jail's: two per run) copies that table; with 800 runs, `unshare -m true` took 7.8 ms
instead of 2.7 (the shared mode's 1,000th run started 2.2x slower than its first). Older
gatewrap versions named them ``gw-*`` there: :func:`list_named` and :func:`remove_named`
let gc remove those.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct
import threading

from ..errors import SandboxError

NETNS_DIR = "/var/run/netns"

#: include/uapi/linux/sched.h, include/uapi/linux/mount.h, include/uapi/linux/if.h and
#: include/uapi/linux/sockios.h
CLONE_NEWNET = 0x40000000
MNT_DETACH = 2
IFF_UP = 0x1
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
#: struct ifreq: the name (IFNAMSIZ = 16 bytes), then ifr_flags (a short) in a 24-byte union.
_IFREQ = "16sh22x"

_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _loopback_up() -> None:
    """Set IFF_UP on ``lo`` of the calling thread's network namespace (netdevice(7))."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        _, flags = struct.unpack(_IFREQ, fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack(_IFREQ, b"lo", 0)))
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack(_IFREQ, b"lo", flags | IFF_UP))


class Netns:
    """A network namespace held open by this process: ``fd`` (O_RDONLY|O_CLOEXEC, an nsfs
    file), ``ino`` (its inode: the namespace's identity, as ``lsns`` shows it). :meth:`close`
    drops this process's hold; the namespace lives on while a process is in it."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.ino = os.fstat(fd).st_ino

    @property
    def path(self) -> str:
        """``/proc/PID/fd/FD``: a path another root process (the shared mode's client) or the
        gate can open and setns(2) into while this one holds it."""
        return f"/proc/{os.getpid()}/fd/{self.fd}"

    def close(self) -> None:
        """Close the descriptor (idempotent)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _new_held() -> int:
    """In a thread of its own: a new network namespace, ``lo`` up; returns an fd of it."""
    result: list[int] = []
    failure: list[BaseException] = []

    def enter() -> None:
        try:
            _check(_libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
            fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            try:
                _loopback_up()
            except BaseException:
                os.close(fd)
                raise
            result.append(fd)
        except BaseException as e:  # reported by the caller's thread
            failure.append(e)

    t = threading.Thread(target=enter, name="gatewrap-netns")
    t.start()
    t.join()
    if failure:
        raise failure[0]
    return result[0]


def create() -> Netns:
    """A new network namespace with ``lo`` up (127.0.0.1/8, ::1/128), held by this process.

    Raises:
        SandboxError: it could not be created or configured (nothing is left).
    """
    try:
        return Netns(_new_held())
    except OSError as e:
        raise SandboxError(f"cannot create a network namespace: {e}") from e


def of_cgroup(cgroup_dir: str, ino: int) -> Netns | None:
    """The network namespace ``ino`` of a process in ``cgroup_dir`` (its cgroup.procs),
    opened through ``/proc/PID/ns/net``; None if no process there is in it (all gone, or
    the namespace is another: a pid reused between the read and the open shows another
    inode, or is in another cgroup, and is skipped)."""
    try:
        with open(os.path.join(cgroup_dir, "cgroup.procs")) as f:
            pids = [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return None
    for pid in pids:
        try:
            fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        ns = Netns(fd)
        if ns.ino == ino:
            return ns
        ns.close()
    return None


def list_named() -> list[str]:
    """Names of namespaces older gatewrap versions bound under /var/run/netns (``gw-*``)."""
    try:
        return sorted(n for n in os.listdir(NETNS_DIR) if n.startswith("gw-"))
    except FileNotFoundError:
        return []


def remove_named(name: str) -> None:
    """Remove the named netns ``name`` an older version left (lazy unmount, then the mount
    point); a missing one is fine.

    Raises:
        SandboxError: the mount point could not be removed.
    """
    path = os.path.join(NETNS_DIR, name)
    if not os.path.exists(path):
        return
    _libc.umount2(path.encode(), MNT_DETACH)  # EINVAL: not bound; unlink anyway
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise SandboxError(f"cannot remove network namespace {name}: {e}") from e
