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
