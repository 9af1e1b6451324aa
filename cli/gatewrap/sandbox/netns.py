"""The run's network namespace: a new one with only ``lo``, up.

Named namespaces are bind mounts under /var/run/netns, made as ip-netns(8) makes them, so
that the gate can open one by path and setns(2) into it and ``ip netns`` lists it. A
short-lived thread unshares its network namespace (unshare(2): CLONE_NEWNET changes the
calling thread's only), binds ``/proc/thread-self/ns/net`` to the name and brings ``lo``
up with SIOCSIFFLAGS (netdevice(7)); the kernel gives an up loopback 127.0.0.1/8 and ::1
itself (net/ipv4/devinet.c, net/ipv6/addrconf.c). Plain syscalls through ctypes: no
netlink library, no helper process.
"""

from __future__ import annotations

import ctypes
import errno
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
MS_BIND = 4096
MS_REC = 16384
MS_SHARED = 1 << 20
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


def path_of(name: str) -> str:
    """Path of a named netns (``/var/run/netns/NAME``)."""
    return os.path.join(NETNS_DIR, name)


def _share_dir() -> None:
    """Make NETNS_DIR a shared mount (a bind of itself first if it is not a mount point), so
    that the namespaces bound there show in every mount namespace: iproute2's netns_add."""
    os.makedirs(NETNS_DIR, exist_ok=True)
    if _libc.mount(b"", NETNS_DIR.encode(), b"none", MS_SHARED | MS_REC, None) == 0:
        return
    if ctypes.get_errno() != errno.EINVAL:  # EINVAL: not a mount point yet
        _check(-1, f"mount --make-rshared {NETNS_DIR}")
    _check(_libc.mount(NETNS_DIR.encode(), NETNS_DIR.encode(), b"none", MS_BIND | MS_REC, None),
           f"mount --rbind {NETNS_DIR}")
    _check(_libc.mount(b"", NETNS_DIR.encode(), b"none", MS_SHARED | MS_REC, None),
           f"mount --make-rshared {NETNS_DIR}")


def _loopback_up() -> None:
    """Set IFF_UP on ``lo`` of the calling thread's network namespace (netdevice(7))."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        _, flags = struct.unpack(_IFREQ, fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack(_IFREQ, b"lo", 0)))
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack(_IFREQ, b"lo", flags | IFF_UP))


def _new_bound_to(path: str) -> None:
    """In a thread of its own: a new network namespace, bound to ``path``, ``lo`` up."""
    failure: list[BaseException] = []

    def enter() -> None:
        try:
            _check(_libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
            _check(_libc.mount(b"/proc/thread-self/ns/net", path.encode(), b"none", MS_BIND, None),
                   f"mount --bind /proc/thread-self/ns/net {path}")
            _loopback_up()
        except BaseException as e:  # reported by the caller's thread
            failure.append(e)

    t = threading.Thread(target=enter, name="gatewrap-netns")
    t.start()
    t.join()
    if failure:
        raise failure[0]


def create(name: str) -> str:
    """Create netns ``name`` with ``lo`` up (127.0.0.1/8, ::1/128); returns its path.

    Raises:
        SandboxError: it could not be created or configured (what is made is removed).
    """
    path = path_of(name)
    try:
        _share_dir()
        os.close(os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0))
    except OSError as e:
        raise SandboxError(f"cannot create network namespace {name}: {e}") from e
    try:
        _new_bound_to(path)
    except OSError as e:
        remove(name)
        raise SandboxError(f"cannot create network namespace {name}: {e}") from e
    return path


def remove(name: str) -> None:
    """Remove netns ``name`` (lazy unmount, then the mount point); a missing one is fine.

    Raises:
        SandboxError: the mount point could not be removed.
    """
    path = path_of(name)
    if not os.path.exists(path):
        return
    _libc.umount2(path.encode(), MNT_DETACH)  # EINVAL: not bound (a failed create); unlink anyway
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise SandboxError(f"cannot remove network namespace {name}: {e}") from e


def list_gatewrap() -> list[str]:
    """Names of gatewrap's namespaces (``gw-*``)."""
    try:
        return sorted(n for n in os.listdir(NETNS_DIR) if n.startswith("gw-"))
    except FileNotFoundError:
        return []
