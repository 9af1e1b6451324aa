"""Build the run's policy from ``--policy FILE`` and the ``--allow``/``--deny`` flags."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from .errors import GatewrapError


def read_policy_text(policy_file: str) -> str:
    """The policy file's text (UTF-8).

    Raises:
        GatewrapError: the file cannot be read or is not UTF-8.
    """
    try:
        with open(policy_file, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise GatewrapError(f"cannot read policy {policy_file}: {e}") from e


def policy_where(policy_file: str) -> dict[str, Any]:
    """Where the policy file lies, to read it again only from there (:func:`read_policy_again`):
    ``{"path": its real path (links resolved), "folders": [[st_dev, st_ino], ...] of each
    folder from / down to the file's own}``.

    Raises:
        GatewrapError: a folder on the way cannot be looked at.
    """
    real = os.path.realpath(policy_file)
    folders = []
    here = "/"
    try:
        for part in ["", *real.strip("/").split("/")[:-1]]:
            here = os.path.join(here, part)
            st = os.lstat(here)
            folders.append([st.st_dev, st.st_ino])
    except OSError as e:
        raise GatewrapError(f"cannot look at {here}, on the way to policy {policy_file}: {e.strerror}") from e
    return {"path": real, "folders": folders}


def read_policy_again(policy_file: str, where: dict[str, Any] | None) -> str:
    """The policy file's text (UTF-8), read through the very folders it lay in at the run's
    start (``where``: :func:`policy_where` then): each opened from / without following a link
    (``O_PATH | O_NOFOLLOW | O_DIRECTORY``, openat(2)) and compared with the start's, the file
    opened in the last. A folder the agent can write may be renamed away and made again with
    a policy of its own in it (the file itself is a read-only mount point, the folder is not):
    that file is never read.

    Raises:
        GatewrapError: ``where`` is unknown, a folder on the way was replaced (or is a link
            now), or the file cannot be read or is not UTF-8.
    """
    if not where:
        raise GatewrapError(f"where {policy_file} lay at the run's start was not kept (a daemon of another "
                            "version started the run): restart the run to read the file again")
    real, folders = where["path"], where["folders"]
    parts = ["", *real.strip("/").split("/")]
    fd = None
    here = "/"
    try:
        for i, part in enumerate(parts[:-1]):
            here = os.path.join(here, part)
            flags = os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC
            try:
                nxt = os.open(part or "/", flags, dir_fd=fd)
            except OSError as e:
                raise GatewrapError(f"the folder {here}, on the way to policy {policy_file}, was replaced during the "
                                    f"run ({e.strerror}): only the file the run started with is read again; the "
                                    "agent may have made this one") from None
            if fd is not None:
                os.close(fd)
            fd = nxt
            st = os.fstat(fd)
            if i >= len(folders) or [st.st_dev, st.st_ino] != list(folders[i]):
                raise GatewrapError(f"the folder {here}, on the way to policy {policy_file}, was replaced during the "
                                    "run (another folder than at its start): only the file the run started with is "
                                    "read again; the agent may have made this one")
        try:
            f = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=fd)
        except OSError as e:
            raise GatewrapError(f"cannot read policy {policy_file}: {e.strerror}") from None
        with open(f, "rb") as file:
            data = file.read()
    finally:
        if fd is not None:
            os.close(fd)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise GatewrapError(f"cannot read policy {policy_file}: {e}") from e


def build_policy(policy_file: str | None, allow: list[str], deny: list[str], text: str | None = None,
                 allow_private: Sequence[str] = ()) -> Any:
    """Return a ``gatewrap._gate_core.Policy``.

    Command-line rules are evaluated before the file's, ``--deny`` before ``--allow``
    before ``--allow-private`` (``allow_private``: allow rules whose names may resolve to
    private addresses), each in the order given; then the file's rules; then its
    ``default`` (deny without a file). ``text``: the file's text as read before (a run taken back keeps the policy it
    started with, whatever the file says now); None: read ``policy_file`` now.

    The host's secrets file (``/etc/gatewrap/secrets.toml``) adds its ``[[secret]]``s, and
    every rule's ``inject`` must name one of the policy's or the host's.

    Raises:
        GatewrapError: the file cannot be read or is invalid, or a flag is malformed.
    """
    from . import _gate_core as core

    try:
        if policy_file is not None:
            if text is None:
                text = read_policy_text(policy_file)
            policy = core.Policy.from_toml(text, policy_file)
        else:
            policy = core.Policy.new("deny")
    except core.PolicyError as e:
        raise GatewrapError(f"invalid policy: {e}") from e
    from .secrets import add_host_secrets

    add_host_secrets(policy)
    for flag, action, specs in (("--deny", "deny", deny), ("--allow", "allow", allow),
                                ("--allow-private", "allow_private", allow_private)):
        for spec in specs:
            try:
                if action == "allow_private":
                    policy.add_private_rule(spec, f"{flag} {spec}")
                else:
                    policy.add_rule(spec, action, f"{flag} {spec}")
            except core.PolicyError as e:
                if "is an address" in str(e):
                    raise GatewrapError(f"{flag} {spec}: an address, which a rule naming it allows already: "
                                        f"use --allow {spec} (--allow-private is for names)") from e
                hint = " (a host, not a URL)" if "://" in spec else ""
                raise GatewrapError(
                    f"{flag} {spec!r}: {e}; give HOST, HOST:PORT, *.SUFFIX or [IPv6]:PORT{hint}, "
                    f"e.g. {flag} example.com:443"
                ) from e
    return policy


def sandbox_binds(policy: Any, policy_file: str | None) -> tuple[list[str], list[str]]:
    """The policy file's ``[sandbox]`` paths: (read-only, writable), as ``--ro-bind`` and
    ``--bind`` would give them.

    Raises:
        GatewrapError: a path does not exist on this host (``FILE:LINE: ...``).
    """
    table = policy.sandbox()
    out: tuple[list[str], list[str]] = ([], [])
    for key, paths in (("ro_bind", out[0]), ("bind", out[1])):
        for path, line in table[key]:
            if not os.path.lexists(path):
                raise GatewrapError(f"{policy_file}:{line}: [sandbox] {key}: {path} does not exist on this host; "
                                    "create it or remove it from the policy")
            paths.append(path)
    return out


def sandbox_unprotect(policy: Any) -> list[str]:
    """The policy file's ``[sandbox] unprotect`` paths (absolute, or relative to each writable
    path), as ``--unprotect`` would give them; [] from an extension without the key."""
    return [path for path, _line in policy.sandbox().get("unprotect", [])]
