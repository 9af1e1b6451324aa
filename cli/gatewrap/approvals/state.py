"""Where the approvals store is and how it is opened.

Resolution order of the store's URL (first that is set wins):

1. ``--state URL`` on the command line;
2. the environment variable ``GATEWRAP_STATE``;
3. ``[state] url`` in the config file (``$GATEWRAP_CONFIG``, default ``/etc/gatewrap/config.toml``);
4. ``sqlite:/var/lib/gatewrap/state.db``.

URL forms (APPROVALS.md): a path or ``sqlite:PATH``; ``postgresql://user@host:port/db?...``.
"""

from __future__ import annotations

import os
import pwd
import tomllib
from collections.abc import Mapping
from typing import Any

from ..errors import GatewrapError

DEFAULT_STATE = "sqlite:/var/lib/gatewrap/state.db"
DEFAULT_CONFIG = "/etc/gatewrap/config.toml"
#: Keys the config file may hold, per table; anything else is refused with its name.
CONFIG_KEYS = {
    "state": {"url"},
    "notify": {"webhook", "secret_file", "review_url"},
    "review": {"listen", "names"},
}


def config_path(environ: Mapping[str, str] | None = None) -> str:
    """The config file's path: ``$GATEWRAP_CONFIG`` (of ``environ``, else this process's
    environment) or ``/etc/gatewrap/config.toml``."""
    return (os.environ if environ is None else environ).get("GATEWRAP_CONFIG") or DEFAULT_CONFIG


def load_config(path: str | None = None) -> dict[str, dict[str, Any]]:
    """The config file as ``{table: {key: value}}``; ``{}`` when it does not exist.

    Raises:
        GatewrapError: unreadable, not TOML, or an unknown table or key (named).
    """
    path = path or config_path()
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise GatewrapError(f"cannot read the config file {path}: {e.strerror}") from e
    except tomllib.TOMLDecodeError as e:
        raise GatewrapError(f"{path}: not valid TOML: {e}") from e
    for table, keys in data.items():
        if table not in CONFIG_KEYS or not isinstance(keys, dict):
            raise GatewrapError(f"{path}: unknown table [{table}] (known: "
                                f"{', '.join(sorted(CONFIG_KEYS))})")
        for key, value in keys.items():
            if key not in CONFIG_KEYS[table]:
                raise GatewrapError(f"{path}: [{table}] unknown key {key!r} (known: "
                                    f"{', '.join(sorted(CONFIG_KEYS[table]))})")
            if not isinstance(value, str):
                raise GatewrapError(f"{path}: [{table}] {key} must be a string")
    return data


def resolve_url(flag: str | None, config: dict[str, dict[str, Any]] | None = None,
                environ: Mapping[str, str] | None = None) -> str:
    """The store URL by the order in this module's docstring (``$GATEWRAP_STATE`` of
    ``environ``, else of this process's environment)."""
    env = os.environ if environ is None else environ
    if flag:
        return flag
    if env.get("GATEWRAP_STATE"):
        return env["GATEWRAP_STATE"]
    config = load_config() if config is None else config
    return config.get("state", {}).get("url") or DEFAULT_STATE


def explicit_url(flag: str | None, config: dict[str, dict[str, Any]] | None = None,
                 environ: Mapping[str, str] | None = None) -> str | None:
    """The store URL if one was named (flag, environment or config file), else None."""
    url = resolve_url(flag, config, environ)
    if flag or (os.environ if environ is None else environ).get("GATEWRAP_STATE"):
        return url
    return url if (config or {}).get("state", {}).get("url") else None


def open_store(url: str, *, create: bool = True) -> Any:
    """Open the store at ``url``: a ``gatewrap._gate_core.ApprovalStore``. ``create``: make a
    SQLite store (and its folder) that does not exist, as a run does; the ``approvals``
    commands only read or decide, and never make one (a mistyped path is said).

    Raises:
        GatewrapError: (125) the store cannot be opened, does not exist (not ``create``), or is
            not root's alone; the message names the URL (password redacted by the store) and
            what to do.
    """
    from .. import _gate_core as core

    try:
        return core.ApprovalStore(url, create=create)
    except core.UnsafeStore as e:  # the message says why and what to do
        raise GatewrapError(f"cannot open the approvals store: {e}") from e
    except (OSError, ValueError) as e:
        shown = _redact(url)
        where = "check --state, $GATEWRAP_STATE or [state] url in " + config_path()
        if isinstance(e, FileNotFoundError) and not create:
            hint = f"no run has used this store yet, or it is another one: {where}"
        elif isinstance(e, PermissionError):
            hint = "run with sudo (the default store is root's)"
        else:
            hint = where
        raise GatewrapError(f"cannot open the approvals store {shown}: {e}; {hint}") from e


def answer_hint(url: str, environ: Mapping[str, str]) -> tuple[str, str]:
    """What the live line of a run puts around ``approve ID`` (gate_core hold.rs
    ``AnswerHint``): ``(prefix, suffix)``.

    ``prefix`` is ``sudo gatewrap approvals`` when the human who started the run is not root
    (``SUDO_UID`` of ``environ`` names another user: sudo(8) sets it), else ``gatewrap
    approvals``. ``suffix`` is `` --state URL`` (shell-quoted, a password redacted: the agent
    reads that stderr) when ``approvals`` run from a fresh ``sudo`` (no ``$GATEWRAP_STATE``:
    sudo's env_reset drops it; the default config file) would open another store than
    ``url``, else empty."""
    import shlex

    uid = environ.get("SUDO_UID", "")
    human_is_root = not (uid.isdigit() and int(uid) != 0) and os.getuid() == 0
    prefix = "gatewrap approvals" if human_is_root else "sudo gatewrap approvals"
    try:
        found = resolve_url(None, load_config(DEFAULT_CONFIG), environ={})
    except GatewrapError:
        found = DEFAULT_STATE
    same = _sqlite_path(found) is not None and _sqlite_path(found) == _sqlite_path(url) or found == url
    return prefix, "" if same else " --state " + shlex.quote(_redact(url))


def _sqlite_path(url: str) -> str | None:
    """The absolute file of a SQLite store URL (a path or ``sqlite:PATH``), else None."""
    if "://" in url:
        return None
    return os.path.abspath(url.removeprefix("sqlite:"))


def _redact(url: str) -> str:
    """``url`` with the password of a ``scheme://user:password@host`` form replaced by ``***``."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest.split("/", 1)[0]:
        return url
    cred, at, host = rest.partition("@")
    user, colon, _ = cred.partition(":")
    return f"{scheme}://{user}{':***' if colon else ''}{at}{host}"


def decider() -> str:
    """Who decides from this shell: ``$SUDO_USER`` if sudo ran us, else the login user of the
    real uid (getpwuid(3)), else ``uid N``."""
    if os.environ.get("SUDO_USER"):
        return os.environ["SUDO_USER"]
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return f"uid {os.getuid()}"
