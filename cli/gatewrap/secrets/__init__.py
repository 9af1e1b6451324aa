"""Secrets the gate injects (issue 20): where each value comes from, resolved on the host at
the run's start, before the agent starts, and never written anywhere.

A ``[[secret]]`` (in the policy, or in the host's :data:`HOST_FILE`, root's, mode 0600) names
its source: ``from_file`` (a root-owned file no one else may read), ``from_env`` (a variable
of gatewrap's own environment: the caller's; in shared mode the client's, sent over the
daemon's root-only socket) or ``from_command`` (argv, run on the host with that environment,
in ``/``: never the run's working directory, the agent's, where ``python3 -m MODULE`` would
import a module it left; at most :data:`COMMAND_TIMEOUT` seconds; its stdout). One trailing
newline is dropped. A secret with ``placeholder_env`` gets a random per-run placeholder the agent holds instead
(:func:`placeholder`); the gate swaps it only where a rule injects that secret.

Every failure raises :class:`~gatewrap.errors.GatewrapError` (exit 125) naming the secret and
the source, never the value.
"""

from __future__ import annotations

import os
import secrets as _random
import stat
import subprocess
from dataclasses import dataclass, field
from typing import Any

from ..errors import GatewrapError

#: The host's secrets file: ``[[secret]]`` tables only, root's, mode 0600.
HOST_FILE = "/etc/gatewrap/secrets.toml"
#: How long a ``from_command`` may run, in seconds.
COMMAND_TIMEOUT = 30.0
#: The most bytes a source may give (a token, not a file).
MAX_VALUE = 64 * 1024


@dataclass
class Resolved:
    """One resolved secret. ``repr`` never shows the value."""

    name: str
    value: str = field(repr=False)
    placeholder: str | None = field(default=None, repr=False)
    placeholder_env: str | None = None


def placeholder() -> str:
    """A fresh placeholder: ``gwsecret_`` and 32 lower-case hex digits (128 random bits from
    the kernel's CSPRNG, :mod:`secrets`); letters and digits only, so that it survives URL,
    header and DNS-label encodings the gate searches."""
    return "gwsecret_" + _random.token_hex(16)


def private_file_problem(st: os.stat_result) -> str | None:
    """Why a file of this ``stat`` may not hold a secret: not a regular file, not root's, or
    readable or writable by others (mode & 0o077); None when it may."""
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_uid != 0:
        return f"is owned by uid {st.st_uid}, not root"
    if st.st_mode & 0o077:
        return f"is mode {stat.S_IMODE(st.st_mode):04o}; others may read or change it (chmod 600)"
    return None


def _read_private(path: str, what: str) -> str:
    """The text of root-only file ``path`` (checked on the open descriptor: no swap between
    the check and the read; O_NOFOLLOW: not through a link)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        raise GatewrapError(f"{what}: cannot open {path}: {e.strerror}") from None
    try:
        problem = private_file_problem(os.fstat(fd))
        if problem:
            raise GatewrapError(f"{what}: {path} {problem}")
        data = os.read(fd, MAX_VALUE + 1)
    except OSError as e:
        raise GatewrapError(f"{what}: cannot read {path}: {e.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_VALUE:
        raise GatewrapError(f"{what}: {path} is over {MAX_VALUE} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise GatewrapError(f"{what}: {path} is not UTF-8 text") from None


def host_file_text(path: str = HOST_FILE) -> str | None:
    """The host secrets file's text, None when there is none.

    Raises:
        GatewrapError: it exists but is not root's 0600 regular file, or cannot be read.
    """
    if not os.path.lexists(path):
        return None
    return _read_private(path, "the host's secrets file")


def add_host_secrets(policy: Any, path: str = HOST_FILE) -> None:
    """Add the host's secrets file to ``policy`` and check each rule's ``inject`` names a
    defined secret (``Policy.add_host_secrets``).

    Raises:
        GatewrapError: the file is unsafe or invalid, or an inject names no secret.
    """
    from .. import _gate_core as core

    text = host_file_text(path)
    try:
        policy.add_host_secrets(text, path)
    except core.PolicyError as e:
        raise GatewrapError(f"invalid policy: {e}") from e


def _strip_one_newline(text: str) -> str:
    return text[:-2] if text.endswith("\r\n") else text[:-1] if text.endswith("\n") else text


def resolve_one(definition: dict[str, Any], environ: dict[str, str]) -> str:
    """The value of one ``Policy.secrets()`` entry, from its source.

    Raises:
        GatewrapError: the source is missing, unsafe, unreadable, empty, or its command failed
            (its exit status and the last line of its stderr; never its stdout).
    """
    name, (kind, where) = definition["name"], definition["source"]
    what = f"secret {name} ({definition['origin']})"
    if kind == "file":
        value = _strip_one_newline(_read_private(where, what))
    elif kind == "env":
        if where not in environ:
            raise GatewrapError(f"{what}: from_env {where} is not in gatewrap's environment "
                                f"(sudo keeps few variables: sudo --preserve-env={where})")
        value = environ[where]
    else:
        try:
            done = subprocess.run(list(where), capture_output=True, timeout=COMMAND_TIMEOUT, env=environ,
                                  cwd="/", stdin=subprocess.DEVNULL, check=False)
        except FileNotFoundError:
            raise GatewrapError(f"{what}: from_command: {where[0]} not found") from None
        except subprocess.TimeoutExpired:
            raise GatewrapError(f"{what}: from_command {where[0]} ran over {COMMAND_TIMEOUT:g} s") from None
        except OSError as e:
            raise GatewrapError(f"{what}: from_command {where[0]}: {e.strerror}") from None
        if done.returncode != 0:
            last = (done.stderr.decode(errors="replace").strip().splitlines() or ["(no message)"])[-1]
            raise GatewrapError(f"{what}: from_command {where[0]} exited {done.returncode}: {last[:200]}")
        if len(done.stdout) > MAX_VALUE:
            raise GatewrapError(f"{what}: from_command {where[0]} wrote over {MAX_VALUE} bytes")
        value = _strip_one_newline(done.stdout.decode("utf-8", errors="replace"))
    if not value:
        raise GatewrapError(f"{what}: its source gave an empty value")
    if any(c in value for c in "\r\n\0") or not value.isprintable():
        raise GatewrapError(f"{what}: its value holds line breaks or control characters, which no header "
                            "may carry (one trailing newline is dropped)")
    return value


def resolve(policy: Any, environ: dict[str, str]) -> list[Resolved]:
    """Every secret a rule of ``policy`` injects, resolved (with a placeholder when it has
    ``placeholder_env``). Secrets no rule injects are not read. Before the first is read, the
    process stops being dumpable (:func:`gatewrap.agent_process.no_core_dumps`).

    Raises:
        GatewrapError: as :func:`resolve_one`.
    """
    used = {r["inject"][0] for r in policy.describe() if r.get("inject")}
    if used:
        from ..agent_process import no_core_dumps

        no_core_dumps()  # the process (gatewrap's own or the daemon) holds values from now on
    out = []
    for d in policy.secrets():
        if d["name"] not in used:
            continue
        ph = d.get("placeholder_env")
        out.append(Resolved(d["name"], resolve_one(d, environ), placeholder() if ph else None, ph))
    return out


def resolve_again(policy: Any, environ: dict[str, str], old: list[Resolved]) -> list[Resolved]:
    """A rotation: ``old``'s secrets resolved again from their sources, placeholders kept
    (the agent holds them). Hand the result to ``Gate.set_secrets(for_gate(...))``; the lead's
    reload (SIGHUP) calls this.

    Raises:
        GatewrapError: as :func:`resolve_one`; the old values then stay in use.
    """
    by_name = {d["name"]: d for d in policy.secrets()}
    return [Resolved(r.name, resolve_one(by_name[r.name], environ), r.placeholder, r.placeholder_env)
            for r in old if r.name in by_name]


def for_gate(resolved: list[Resolved]) -> list[tuple[str, str, str | None]]:
    """``Gate(secrets=...)``'s shape: ``[(name, value, placeholder)]``."""
    return [(r.name, r.value, r.placeholder) for r in resolved]


def agent_env(env: dict[str, str], resolved: list[Resolved]) -> dict[str, str]:
    """``env`` with each placeholder under its ``placeholder_env`` (replacing what was named).

    Raises:
        GatewrapError: a variable of ``env`` holds a secret's value (named with --env, an
            env file or the policy's [sandbox] env): the agent must never hold it.
    """
    out = dict(env)
    for r in resolved:
        if r.placeholder_env:
            out[r.placeholder_env] = r.placeholder or ""
    for k, v in out.items():
        for r in resolved:
            if r.value in v:
                raise GatewrapError(f"the agent's environment variable {k} holds the value of secret {r.name}, "
                                    f"which only the gate may hold: drop it from --env/--env-file/[sandbox] env"
                                    + (f" (the agent gets a placeholder in {r.placeholder_env})" if r.placeholder_env else ""))
    return out
