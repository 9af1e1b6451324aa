"""The run's network namespace: created with pyroute2, with only ``lo``, up.

Named namespaces are bind mounts under /var/run/netns (ip-netns(8)), so the gate can
open one by path and setns(2) into it.
"""

from __future__ import annotations

import os

from ..errors import SandboxError

NETNS_DIR = "/var/run/netns"


def path_of(name: str) -> str:
    """Path of a named netns (``/var/run/netns/NAME``)."""
    return os.path.join(NETNS_DIR, name)


def create(name: str) -> str:
    """Create netns ``name`` with ``lo`` up (127.0.0.1/8, ::1/128); returns its path.

    Raises:
        SandboxError: pyroute2 could not create or configure it.
    """
    from pyroute2 import NetNS, netns

    try:
        netns.create(name)
        with NetNS(name) as ns:
            idx = ns.link_lookup(ifname="lo")[0]
            ns.link("set", index=idx, state="up")
    except Exception as e:
        remove(name)
        raise SandboxError(f"cannot create network namespace {name}: {e}") from e
    return path_of(name)


def remove(name: str) -> None:
    """Remove netns ``name``; a missing one is fine."""
    from pyroute2 import netns

    if os.path.exists(path_of(name)):
        try:
            netns.remove(name)
        except Exception as e:
            raise SandboxError(f"cannot remove network namespace {name}: {e}") from e


def list_gatewrap() -> list[str]:
    """Names of gatewrap's namespaces (``gw-*``)."""
    try:
        return sorted(n for n in os.listdir(NETNS_DIR) if n.startswith("gw-"))
    except FileNotFoundError:
        return []
