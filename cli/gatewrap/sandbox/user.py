"""Which user the agent runs as: the one who invoked sudo, unless ``--user`` says otherwise."""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass

from ..errors import GatewrapError


#: The agent's user when root runs gatewrap without sudo and without --user.
UNPRIVILEGED = "nobody"


@dataclass(frozen=True)
class Target:
    """The agent's identity: uid, primary gid, supplementary groups, name and home."""

    uid: int
    gid: int
    groups: tuple[int, ...]
    name: str
    home: str


def resolve(user: str | None, environ: dict[str, str] | None = None) -> Target:
    """Resolve ``--user`` (name or uid) or, without it, SUDO_UID/SUDO_GID, else the current uid;
    but root not through sudo (a root shell, CI, a container) gets ``nobody``: an agent is
    never root unless ``--user root`` says so.

    Supplementary groups come from the group database (getgrouplist(3)).

    Raises:
        GatewrapError: the user does not exist.
    """
    env = os.environ if environ is None else environ
    try:
        if user is not None:
            pw = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
            gid = pw.pw_gid
        elif env.get("SUDO_UID", "").isdigit():
            pw = pwd.getpwuid(int(env["SUDO_UID"]))
            gid = int(env["SUDO_GID"]) if env.get("SUDO_GID", "").isdigit() else pw.pw_gid
        elif os.getuid() == 0:
            pw = pwd.getpwnam(UNPRIVILEGED)
            gid = pw.pw_gid
        else:
            pw = pwd.getpwuid(os.getuid())
            gid = pw.pw_gid
    except (KeyError, ValueError):
        raise GatewrapError(f"no such user: {user!r}; give --user an existing name or uid") from None
    groups = tuple(sorted(set(os.getgrouplist(pw.pw_name, gid))))
    return Target(uid=pw.pw_uid, gid=gid, groups=groups, name=pw.pw_name, home=pw.pw_dir)


def _allowed(path: str, target: Target, bit: int) -> bool:
    """Whether ``target`` has permission ``bit`` (4 r, 2 w, 1 x) on ``path`` by its mode bits
    (owner, group, other, as in path_resolution(7)); uid 0 has all but needs some x to execute."""
    st = os.stat(path)
    if target.uid == 0:
        return bit != 1 or bool(st.st_mode & 0o111) or os.path.isdir(path)
    if st.st_uid == target.uid:
        return bool(st.st_mode & (bit << 6))
    if st.st_gid in target.groups or st.st_gid == target.gid:
        return bool(st.st_mode & (bit << 3))
    return bool(st.st_mode & bit)


def _traversable(path: str, target: Target) -> bool:
    parts = os.path.abspath(path).split("/")[1:-1]
    cur = "/"
    for p in parts:
        cur = os.path.join(cur, p)
        if not _allowed(cur, target, 1):
            return False
    return True


def can_execute(path: str, target: Target) -> bool:
    """Whether ``target`` can reach and execute ``path`` (symlinks resolved)."""
    real = os.path.realpath(path)
    try:
        return _traversable(path, target) and _traversable(real, target) and _allowed(real, target, 1)
    except OSError:
        return False


def can_enter(folder: str, target: Target) -> bool:
    """Whether ``target`` can make ``folder`` its working directory (search permission on it
    and every folder above it)."""
    try:
        return _traversable(os.path.join(folder, "x"), target)
    except OSError:
        return False


def can_write(folder: str, target: Target) -> bool:
    """Whether ``target`` can create files in ``folder``."""
    try:
        return _traversable(os.path.join(folder, "x"), target) and _allowed(folder, target, 2) \
            and _allowed(folder, target, 1)
    except OSError:
        return False
