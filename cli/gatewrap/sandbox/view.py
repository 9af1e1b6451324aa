"""The agent's file system view in the jail: default-deny (DESIGN.md, contract 6).

nsjail starts from an empty root (a tmpfs it remounts read-only once every mount is made;
nsjail's ``mnt.cc``). The profile adds private ``/tmp``, ``/run``, ``/dev/shm``, ``/proc``, a
minimal ``/dev`` and the symlinks ``/var/run -> /run``, ``/var/tmp -> /tmp``; this module adds,
per run and in this order of depth (a parent before what is mounted inside it):

- :data:`BASE`, the system's software, read-only (a symlink on the host, as ``/bin -> usr/bin``
  with a merged ``/usr``, stays a symlink);
- a private, empty, writable tmpfs at the agent's ``$HOME`` (unless the home is itself named);
- the working directory, writable;
- the paths the user names (``--ro-bind``/``--bind``, the policy's ``[sandbox]`` table) and
  gatewrap's own shim mounts;
- the protected paths in the writable ones (:mod:`.protect`: ``.git/config``, ``.git/hooks``,
  ``.envrc``...), each bound read-only over itself after the writable bind that holds it.

Nothing else of the host is there: host sockets, the user's secrets and other file systems
are absent, not merely read-only.

Read-only means every mount below a bound path too: nsjail binds with ``MS_BIND | MS_REC``
and remounts only the top of the tree read-only (``mnt_legacy.cc``), so a host mount below a
bound path (a separate ``/usr/local``, a tmpfs under a bound folder) would stay writable. Each
such mount is bound again over itself, read-only, right after its parent (a ``--bind`` path is
writable on its own file system only). A mount whose mount point the agent's user cannot reach
is left as it is: the agent cannot reach it in the jail either (the same folders lead to it).
"""

from __future__ import annotations

import os
import stat
from collections import deque
from dataclasses import dataclass

from ..errors import GatewrapError
from . import user
from .mounts import mount_table

#: The system's software, shown read-only: what the dynamic loader, Python, Node, Java, Go
#: programs, git, curl, wget, pip and npm read (their programs and libraries live under
#: /usr; configuration, CA roots and the loader cache under /etc). A third-party tree
#: elsewhere (/opt/..., a virtualenv, /nix) is named with --ro-bind.
BASE = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
#: Folders the jail makes its own (or leaves out): a working directory or home that is one
#: of them is the jail's, not the host's.
PRIVATE = ("/", "/tmp", "/run", "/var/run", "/dev", "/dev/shm", "/proc", "/sys")
#: At most this many folder entries are looked at for sockets under the bound paths.
SOCKET_SCAN_LIMIT = 100_000


@dataclass(frozen=True)
class Mount:
    """One mount of the view: ``kind`` "ro", "rw", "tmpfs" (``src`` unused) or "symlink"
    (``src`` is the link's target); ``dst`` is the path in the jail."""

    kind: str
    src: str
    dst: str

    def nsjail_args(self, tmpfs_options: str) -> list[str]:
        """nsjail's command-line flags for this mount (nsjail --help: -R, -B, -m, -s); a tmpfs
        gets ``tmpfs_options`` (the home's: :func:`gatewrap.sandbox.tmpfs.home_options`)."""
        if self.kind == "symlink":
            return ["-s", f"{self.src}:{self.dst}"]
        if self.kind == "tmpfs":
            return ["-m", f"none:{self.dst}:tmpfs:{tmpfs_options}"]
        spec = self.dst if self.src == self.dst else f"{self.src}:{self.dst}"
        return ["-R" if self.kind == "ro" else "-B", spec]


def _depth(path: str) -> int:
    return len([p for p in path.split("/") if p])


def _inside(path: str, folder: str) -> bool:
    """``path`` is ``folder`` or below it (both absolute and normalised)."""
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def host_mount_points() -> list[str]:
    """Every mount point of gatewrap's mount namespace (``/proc/self/mounts``, octal escapes
    decoded: :func:`.mounts.mount_table`)."""
    return sorted({point for point, _ in mount_table()})


#: Host trees no bind may show, whatever path leads to them: the kernel's views of the host
#: (its processes, devices, sysfs), which the jail replaces with its own.
HOST_VIEWS = ("/proc", "/sys", "/dev")


#: The profile's symbolic links in the jail (agent.cfg): a path below one is made below its target.
JAIL_LINKS = (("/var/tmp", "/tmp"), ("/var/run", "/run"))


def in_jail(path: str) -> str:
    """Where host ``path`` is shown in the jail: itself, or below the target of the profile's
    link it lies below (host ``/var/tmp/x`` at ``/tmp/x``: the jail's ``/var/tmp`` is a link
    to its ``/tmp``, which nsjail cannot mount through)."""
    for link, target in JAIL_LINKS:
        if path == link or path.startswith(link + "/"):
            return target + path[len(link):]
    return path


def _checked(path: str) -> str:
    """``path`` made absolute; refused if nsjail's ``src:dst`` flags cannot carry it, or if what
    it resolves to (symbolic links followed, as mount(2) follows them) is ``/``, one of the
    folders the jail makes private (:data:`PRIVATE`) or inside :data:`HOST_VIEWS`: a link
    planted at a bound path (``data -> /``) must not show the host."""
    path = os.path.abspath(path)
    if ":" in path:
        raise GatewrapError(f"cannot show {path} in the jail: nsjail's mount flags cannot name a path "
                            "with ':'; bind a folder above it, or rename it")
    real = os.path.realpath(path)
    shown = path if real == path else f"{path} (a link to {real})"
    if real == "/":
        raise GatewrapError(f"binding {shown} would show the whole host in the jail (its sockets and "
                            "secrets too); name the folders the agent needs")
    if real in PRIVATE or any(real == t or real.startswith(t + "/") for t in HOST_VIEWS):
        raise GatewrapError(f"cannot bind {shown}: the jail has its own {real}; the host's would show "
                            "its processes, devices or sockets. Bind a folder inside it, or the file the agent needs")
    return path


def protected_mounts(paths: list[str]) -> list[Mount]:
    """The read-only mounts of the protected paths ``paths`` (host paths: :func:`.protect.scan`),
    each over itself where the jail shows it.

    Raises:
        GatewrapError: a path nsjail's mount flags cannot name (a ``:`` in it).
    """
    for path in paths:
        if ":" in path:
            raise GatewrapError(f"cannot protect {path!r} in the jail: nsjail's mount flags cannot name a path "
                                "with ':'; rename it, or --unprotect it (what the agent writes there then runs "
                                "later, outside)")
    return [Mount("ro", path, in_jail(path)) for path in paths]


def build(cwd: str, home: str, target: user.Target, ro_binds: list[str], rw_binds: list[str],
          extra: list[tuple[str, str]] = (), mount_points: list[str] | None = None,
          protected: list[str] = ()) -> list[Mount]:
    """The run's mounts, in the order nsjail must make them (after the profile's).

    ``cwd``: the working directory (writable unless it is one of :data:`PRIVATE`); ``home``:
    the agent's home, an empty tmpfs unless it is one of :data:`PRIVATE`, the working
    directory or a named path (or missing below a bound folder, where it cannot be made); ``ro_binds``/``rw_binds``: host paths shown read-only / writable; ``extra``:
    (host path, path in the jail) pairs shown read-only (gatewrap's shims); ``mount_points``:
    the host's (default :func:`host_mount_points`); ``protected``: paths in the writable ones
    shown read-only (:func:`protected_mounts`).

    Raises:
        GatewrapError: a path nsjail cannot name (a ``:`` in it), or one that resolves to ``/``,
            a private folder of the jail or a host view (:func:`_checked`).
    """
    points = host_mount_points() if mount_points is None else mount_points
    named: dict[str, str] = {}
    for path in ro_binds:
        named[_checked(path)] = "ro"
    for path in rw_binds:
        named[_checked(path)] = "rw"
    cwd = os.path.abspath(cwd)
    if cwd not in PRIVATE:
        named[_checked(cwd)] = "rw"
    mounts: list[Mount] = []
    trees: list[tuple[str, str]] = []   # (path in the jail, the host folder it shows)
    for path in BASE:
        if os.path.islink(path):
            mounts.append(Mount("symlink", os.readlink(path), path))
        elif os.path.isdir(path) and path not in named:
            mounts.append(Mount("ro", path, path))
            trees.append((path, path))
    for path, kind in named.items():
        # A link is shown as itself, pointing at its target bound where it lies (nsjail cannot
        # bind onto a path through a link; the target is what _checked vetted).
        real = os.path.realpath(path)
        mounts.append(Mount(kind, real, in_jail(real)))
        if real != path:
            mounts.append(Mount("symlink", real, in_jail(path)))
        trees.append((in_jail(real), real))
    home = os.path.abspath(home) if home else ""
    private_home = bool(home) and home not in PRIVATE and home not in named \
        and (os.path.isdir(home) or not any(_inside(home, dst) for dst, _ in trees))
    if private_home:
        mounts.append(Mount("tmpfs", "", home))
    for src, dst in extra:
        mounts.append(Mount("ro", src, dst))
    mounts += protected_mounts(list(protected))
    covered = {m.dst for m in mounts}
    for dst, real in trees:
        for point in points:
            if point == real or not _inside(point, real):
                continue
            shown = dst + point[len(real.rstrip("/")):]
            if shown in covered or (private_home and _inside(shown, home)) \
                    or not user.can_enter(os.path.dirname(point), target):
                continue
            mounts.append(Mount("ro", point, shown))
            covered.add(shown)
    # A parent before the mounts inside it; sorted() is stable, so equal depths keep their order.
    return sorted(mounts, key=lambda m: _depth(m.dst))


def nsjail_args(mounts: list[Mount], tmpfs_options: str) -> list[str]:
    """The flags of every mount, in order (a tmpfs with ``tmpfs_options``)."""
    return [arg for m in mounts for arg in m.nsjail_args(tmpfs_options)]


def sockets_under(paths: list[str], hidden: list[str] = (), limit: int = SOCKET_SCAN_LIMIT) -> list[str]:
    """The sockets :func:`scan_sockets` finds (what it found before ``limit``)."""
    return scan_sockets(paths, hidden, limit)[0]


def scan_sockets(paths: list[str], hidden: list[str] = (), limit: int = SOCKET_SCAN_LIMIT) -> tuple[list[str], bool]:
    """(unix sockets below ``paths``, whether every entry was looked at): not following
    symlinks, folders in ``hidden`` skipped, looking at no more than ``limit`` entries
    (folders too) in all, top-down. A socket
    is connectable in the jail even on a read-only mount (connect(2) needs write permission
    on the socket file, not a writable file system; unix(7)).

    The type of each entry comes from its folder listing (``d_type`` of getdents(2), through
    :func:`os.scandir`): only an entry that is neither a folder, a regular file nor a link
    (or whose type the file system does not say) costs an lstat(2). A folder that cannot be
    read is skipped (the agent's user may still reach nothing in it either)."""
    found: list[str] = []
    seen = 0
    skip = set(hidden)
    for top in paths:
        pending = deque([top])
        while pending:
            folder = pending.popleft()
            try:
                entries = list(os.scandir(folder))
            except OSError:
                continue
            for entry in entries:
                seen += 1
                if seen > limit:
                    return found, False
                try:
                    if entry.is_dir(follow_symlinks=False):
                        if entry.path not in skip:
                            pending.append(entry.path)
                        continue
                    if entry.is_file(follow_symlinks=False) or entry.is_symlink():
                        continue
                    if stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode):
                        found.append(entry.path)
                except OSError:
                    continue
    return found, True


def socket_notice(mounts: list[Mount], home: str) -> str | None:
    """One stderr line when a path the user bound (or the working directory) holds a unix
    socket, which the agent can connect to; None when none does."""
    named = [m.dst for m in mounts if m.kind in ("ro", "rw") and m.src == m.dst and m.dst not in BASE
             and not any(_inside(m.dst, b) for b in BASE)]
    named = [p for p in named if not any(q != p and _inside(p, q) for q in named)]  # a protected path: its bind's
    found = sockets_under([p for p in named if os.path.isdir(p)], hidden=[home]) + \
        [p for p in named if not os.path.isdir(p) and _is_socket(p)]
    if not found:
        return None
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    return (f"gatewrap: note: a path shown in the jail holds a unix socket, which the agent can connect to "
            f"(read-only does not stop connect): {found[0]}{more}; bind a folder without it to hide it")


def shows(mounts: list[Mount], path: str) -> bool:
    """Whether host file ``path`` (absolute) is in the view at the same path, as execve(2) in
    the jail will look for it: the folder holding it and the file it finally resolves to
    (symbolic links followed, as a virtualenv's ``bin/python3`` links to ``/usr/bin``) each lie
    below a read-only or writable mount, and not below a deeper tmpfs (the private home)."""
    def covered(p: str) -> bool:
        p = in_jail(p)
        best: Mount | None = None
        for m in mounts:
            if m.kind in ("ro", "rw", "tmpfs") and _inside(p, m.dst) and (best is None or _depth(m.dst) >= _depth(best.dst)):
                best = m
        return best is not None and best.kind != "tmpfs"
    folder = os.path.realpath(os.path.dirname(path))
    return covered(os.path.join(folder, os.path.basename(path))) and covered(os.path.realpath(path))


def notes(cwd: str, home: str) -> list[str]:
    """What to tell the user about the view at once, one line each: a working directory that
    is the user's home (whose secrets the agent then sees). (A bound path that holds a unix
    socket is told by :func:`socket_notice`, whose look through the tree the run makes
    beside the agent's start.)"""
    out = []
    if home and os.path.abspath(cwd) == os.path.abspath(home):
        out.append(f"gatewrap: note: the working directory is the agent's home {home}: the agent sees "
                   "everything in it (~/.ssh, tokens); run from a project folder, or --workdir DIR")
    return out


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except OSError:
        return False
