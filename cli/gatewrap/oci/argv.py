"""runc's command line (runc(8), ``runc --help``, ``runc create --help``): global flags, then a
command, then its flags and the container id; and gatewrap's own global flags, which the
engine's runtime configuration passes (docker's ``runtimeArgs``, podman's ``--runtime-flag``,
containerd's runc options) and which are taken out before runc sees them."""

from __future__ import annotations

import re

#: A container's run id is this and the engine's container id (gc, ps and the hooks' sweep
#: know runs by this prefix).
RUN_PREFIX = "gw-"
#: runc's global flags that take a value (runc 1.1: ``runc --help``); the others are switches.
RUNC_VALUED = {"--root", "--log", "--log-format", "--criu", "--rootless"}
#: gatewrap's global flags (each takes a value; the repeatable ones are lists).
GATEWRAP_FLAGS = {"--gatewrap-socket": "socket", "--gatewrap-audit-log": "audit_log",
                  "--gatewrap-resolver": "resolvers", "--gatewrap-public-range": "public_ranges",
                  "--gatewrap-runc": "runc", "--gatewrap-policy": "policy", "--gatewrap-allow": "allow"}
REPEATED = {"resolvers", "public_ranges", "allow"}
#: Flags of ``create`` (``runc create --help``) that take a value.
CREATE_VALUED = {"--bundle", "-b", "--console-socket", "--pid-file", "--preserve-fds"}


#: Container ids runc accepts (libcontainer's idRegex), bounded: the id is a path component
#: (of the run id, the registry's files, the cgroup leaf).
CONTAINER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
#: Flags of ``exec`` (``runc exec --help``, runc 1.1) that take a value.
EXEC_VALUED = {"--console-socket", "--cwd", "--env", "-e", "--user", "-u", "--additional-gids", "-g", "--process", "-p",
               "--apparmor", "--process-label", "--cap", "-c", "--pid-file", "--preserve-fds", "--cgroup"}
#: ``exec``'s switches; any other flag is refused (it could be a valued flag this list lacks,
#: or short flags run together, whose value would go unchecked).
EXEC_SWITCHES = {"--tty", "-t", "--detach", "-d", "--no-new-privs", "--ignore-paused", "--help", "-h"}


class UsageError(Exception):
    """A command line this runtime cannot read (the message says which part)."""


class CommandLine:
    """runc's command line split: ``runc_globals`` (passed on as given), ``command`` (None:
    none, e.g. ``--version``), ``args`` (the command's own), and gatewrap's settings.
    (No dataclass: importing dataclasses imports inspect, ~20 ms of every runtime call.)"""

    def __init__(self, runc_globals: list[str], command: str | None, args: list[str],
                 gatewrap: dict[str, object]) -> None:
        self.runc_globals = runc_globals
        self.command = command
        self.args = args
        self.gatewrap = gatewrap

    def runc_argv(self, runc: str) -> list[str]:
        """The argv of the runc this command line is delegated to."""
        return [runc, *self.runc_globals, *([self.command] if self.command else []), *self.args]


def split(argv: list[str]) -> CommandLine:
    """``argv`` (without the program name) split as runc reads it: ``--flag value`` and
    ``--flag=value`` alike.

    Raises:
        UsageError: a gatewrap flag without its value, or a ``--gatewrap-`` flag it does not
            know (a misspelt one would otherwise reach runc, whose usage text hides it).
    """
    runc_globals: list[str] = []
    settings: dict[str, object] = {key: [] for key in REPEATED}
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        name, eq, value = argv[i].partition("=")
        if name in GATEWRAP_FLAGS:
            if not eq:
                if i + 1 >= len(argv):
                    raise UsageError(f"{name} needs a value")
                i += 1
                value = argv[i]
            key = GATEWRAP_FLAGS[name]
            if key in REPEATED:
                settings[key].append(value)  # type: ignore[union-attr]
            else:
                settings[key] = value
        elif name.startswith("--gatewrap-"):
            raise UsageError(f"unknown flag {name}{_did_you_mean(name)}; gatewrap-oci's flags: "
                             f"{', '.join(sorted(GATEWRAP_FLAGS))} (gatewrap-oci --help)")
        else:
            runc_globals.append(argv[i])
            if name in RUNC_VALUED and not eq and i + 1 < len(argv):
                i += 1
                runc_globals.append(argv[i])
        i += 1
    command = argv[i] if i < len(argv) else None
    return CommandLine(runc_globals, command, argv[i + 1:], settings)


def _did_you_mean(name: str) -> str:
    import difflib  # only on this error's path

    close = difflib.get_close_matches(name, GATEWRAP_FLAGS, n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def create_args(args: list[str]) -> tuple[str, str]:
    """(bundle folder, container id) of ``create``'s arguments; the bundle defaults to the
    working directory, as runc's does.

    Raises:
        UsageError: no container id.
    """
    bundle, positional = ".", []
    i = 0
    while i < len(args):
        name, eq, value = args[i].partition("=")
        if name in CREATE_VALUED:
            if not eq and i + 1 < len(args):
                i += 1
                value = args[i]
            if name in ("--bundle", "-b"):
                bundle = value
        elif not args[i].startswith("-"):
            positional.append(args[i])
        i += 1
    if not positional:
        raise UsageError("create: no container id")
    return bundle, positional[-1]


def check_id(container: str) -> None:
    """Raises UsageError if ``container`` is not an id runc accepts (:data:`CONTAINER_ID`):
    checked before the id names any file (``gw-../..`` would name the registry's parent)."""
    if not CONTAINER_ID.match(container):
        raise UsageError(f"container id {container!r} is not one runc accepts")


def exec_container(args: list[str]) -> str | None:
    """The container id of ``exec``'s arguments (the first one after its flags; the
    command's own arguments follow it), None if there is none.

    Raises:
        UsageError: as :func:`exec_options`.
    """
    at = _exec_flags(args)[1]
    return args[at] if at < len(args) else None


def exec_options(args: list[str]) -> list[tuple[str, str]]:
    """(flag, value) of ``exec``'s valued flags (:data:`EXEC_VALUED`), ``--flag value`` and
    ``--flag=value`` alike, up to the container id (the command's own arguments follow it).

    Raises:
        UsageError: a flag that is neither (:data:`EXEC_SWITCHES`).
    """
    return _exec_flags(args)[0]


def _exec_flags(args: list[str]) -> tuple[list[tuple[str, str]], int]:
    """:func:`exec_options` and the index of the container id (``len(args)``: none)."""
    out, i = [], 0
    while i < len(args) and args[i].startswith("-"):
        name, eq, value = args[i].partition("=")
        if name not in EXEC_VALUED and name not in EXEC_SWITCHES:
            raise UsageError(f"exec: flag {name} is not one gatewrap-oci knows (runc 1.1's exec flags); refused")
        if name in EXEC_VALUED:
            if not eq and i + 1 < len(args):
                i += 1
                value = args[i]
            out.append((name, value))
        i += 1
    return out, i


def last_positional(args: list[str]) -> str | None:
    """The container id of a command whose only positional argument it is (``delete``)."""
    positional = [a for a in args if not a.startswith("-")]
    return positional[-1] if positional else None
