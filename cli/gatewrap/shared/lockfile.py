"""The lock files beside the daemon's socket (``SOCKET.lock``: a daemon serves it;
``SOCKET.start``: a client is starting one), which their holder removes when it is done.

flock(2) locks an open file, not a name: a process that opened ``PATH`` and waits for its lock
would get it once its holder unlinked the file and let go, while a third process creates
and locks a new file at ``PATH``; both would then hold "the" lock. So a file is unlinked only
by a process that holds its lock, before it lets go (:func:`remove`), and whoever takes a lock
checks, once it holds it, that ``PATH`` still names the file it locked (the same device and
inode, stat(2)), and otherwise opens ``PATH`` again (:func:`take`). Then at most one process
holds the lock of the file ``PATH`` names, and nothing is left in ``/run/gatewrap`` of a
socket no daemon serves, but by a holder killed before it let go (SIGKILL, a crash): the
next daemon on that socket reuses its files, and :func:`sweep` (``gatewrap gc``, every
daemon's start) removes those of a socket no daemon serves any more.
"""

from __future__ import annotations

import fcntl
import os
import stat


def take(path: str, wait: bool = True) -> int:
    """A file descriptor of the file at ``path`` (made, 0600, when missing) holding its
    exclusive flock(2), ``path`` naming that file still; close it (or :func:`remove`) to let go.
    ``wait``: block until the lock is free; else raise at once.

    Raises:
        BlockingIOError: not ``wait``, and another open file description holds the lock.
        OSError: ``path`` cannot be opened (its folder is missing, ...).
    """
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            held = os.fstat(fd)
            try:
                named = os.stat(path)
            except FileNotFoundError:
                named = None
        except BaseException:
            os.close(fd)
            raise
        if named is not None and (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino):
            return fd
        os.close(fd)  # its holder removed it while we waited: the lock is the new file's


def remove(path: str, fd: int) -> None:
    """Unlink ``path``, whose lock ``fd`` holds (:func:`take`), then let go of it. A file at
    ``path`` that is not ``fd``'s (someone unlinked the holder's meanwhile) is left alone."""
    try:
        held = os.fstat(fd)
        named = os.stat(path)
        if (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino):
            os.unlink(path)
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)


def sweep(folder: str, socket: str | None = None) -> list[list[str]]:
    """Remove what daemons killed before they let go left in ``folder``: of each unix socket
    there, and of ``socket`` (the path this gatewrap's daemon has, whose ``.start`` a client
    killed while it started one leaves without a socket), the socket file, ``SOCKET.lock``
    and ``SOCKET.start``, when no process holds either lock. Returns the paths removed, one
    list per socket.

    Under both locks, as a daemon that stops removes them (the start lock first: a client
    starting a daemon holds it, and its socket is left alone); a lock held (a daemon serves
    the socket, or one is starting) leaves the socket's files as they are. A daemon that
    starts while a sweep holds its lock waits for the instant it takes
    (:func:`gatewrap.shared.daemon.Daemon._claim`). A ``SOCKET.lock`` whose socket file is
    gone (removed by hand) is left, unless ``socket`` names it: nothing else tells it from
    another lock file of ``folder`` (``bpf.lock``).
    """
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return []
    sockets = [os.path.join(folder, n) for n in names if _is_socket(os.path.join(folder, n))]
    if socket is not None and socket not in sockets:
        sockets.append(socket)
    out = []
    for path in sockets:
        removed = _sweep_one(path)
        if removed:
            out.append(removed)
    return out


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def _sweep_one(path: str) -> list[str]:
    """:func:`sweep` of one socket: the paths removed."""
    lock_path, start_path = path + ".lock", path + ".start"
    there = [p for p in (path, lock_path, start_path) if os.path.lexists(p)]
    if not there:
        return []
    try:
        start = take(start_path, wait=False)
    except OSError:  # BlockingIOError: a client is starting a daemon, or one is leaving
        return []
    gone: list[str] = []
    try:
        try:
            lock = take(lock_path, wait=False)
        except OSError:  # BlockingIOError: a daemon serves the socket, or is starting
            return []
        try:
            if _is_socket(path):
                os.unlink(path)
                gone.append(path)
        finally:
            remove(lock_path, lock)
        gone += [p for p in (lock_path, start_path) if p in there]
        return gone
    finally:
        if gone or start_path not in there:  # swept, or the file is take()'s: nothing of the sweep stays
            remove(start_path, start)
        else:
            os.close(start)


def said(removed: list[str]) -> str:
    """The line ``gatewrap gc`` and a daemon say of the files of one socket :func:`sweep`
    removed."""
    return f"removed {', '.join(removed)} (no daemon serves it: its daemon had died)"
