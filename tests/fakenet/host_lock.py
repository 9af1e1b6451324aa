"""One fake internet per host: a lock every user of the fixed addresses takes first.

The fake internet's addresses are fixed, and the kernel tests share the host's
``gatewrap/`` cgroup parent and BPF attachments, so two test sessions (or the demo and a
test session) on one host would tear down each other's networks. They serialise on an
abstract unix socket (unix(7), "Abstract sockets"): its name lives in the network
namespace, so a chroot of this host (tools/fresh-debian) and the host itself see the same
lock, and the kernel releases it when the holder dies, however it dies. The holder listens
on it, so a waiter can name the holder (SO_PEERCRED of a connection, unix(7)).
"""

from __future__ import annotations

import os
import socket
import struct
import sys
import time

NAME = b"\0gatewrap-fake-internet"
HELD = "GATEWRAP_FAKE_INTERNET_LOCK"  # set in the holder's environment: its children share the lock


def hold_host_lock(who: str, poll: float = 1.0) -> socket.socket | None:
    """Wait until no other session holds the lock, then take it for this process's life.

    ``who`` names the holder in the waiting message (e.g. ``"tests"``, ``"demo"``);
    ``poll`` is seconds between tries. Returns the bound socket: keep a reference (closing
    it, or the process ending, releases the lock). Raises ``OSError`` for anything but
    "in use" (EADDRINUSE). A child of the holder (the demo run by the test session) finds
    ``$GATEWRAP_FAKE_INTERNET_LOCK`` set and returns None: it already has the fake internet.
    """
    if os.environ.get(HELD) == "held":
        return None
    told = False
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            s.bind(NAME)
            # Never accepted: a waiter's connect only names the holder. A unix listener keeps
            # each connection, even one its client closed, until accepted (unix(7)): the
            # queue is as long as the kernel allows, one slot for each waiter's one look.
            s.listen(socket.SOMAXCONN)
            os.environ[HELD] = "held"
            return s
        except OSError as e:
            s.close()
            if e.errno != 98:  # EADDRINUSE
                raise
        if not told:
            print(f"gatewrap {who} (pid {os.getpid()}): another gatewrap test session or demo on this "
                  f"host holds the fake internet ({holder()}); waiting for it to finish", file=sys.stderr, flush=True)
            told = True
        time.sleep(poll)


def holder() -> str:
    """Who holds the lock: ``pid N: its command line`` (the listener's credentials, SO_PEERCRED
    in unix(7), and /proc/N/cmdline, at most 160 characters), or what could not be read."""
    c = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        c.settimeout(1)
        c.connect(NAME)
        pid, _, _ = struct.unpack("3i", c.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    except OSError as e:
        return f"its holder not named: {e.strerror}"
    finally:
        c.close()
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = " ".join(f.read().decode("utf-8", "replace").replace("\0", " ").split())
    except OSError:
        cmd = "gone"
    return f"pid {pid}: {cmd[:160]}"
