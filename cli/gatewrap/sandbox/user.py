"""Which user the agent runs as: the one who invoked sudo, unless ``--user`` says otherwise."""

from __future__ import annotations

import grp
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


def group_name(gid: int) -> str:
    """Group name for display, or the number."""
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)
