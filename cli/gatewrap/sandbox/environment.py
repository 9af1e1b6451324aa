"""The agent's environment: default-deny (DESIGN.md, contract 6).

Of the environment gatewrap was started with, only a short set rides in:

- ``PATH`` (the caller's, else :data:`DEFAULT_PATH`): where the agent's commands are found;
- ``LANG``, ``LANGUAGE``, ``LC_*`` (the 13 categories of locale(7)), ``TZ``: how text, dates
  and times are shown;
- ``TERM``, ``COLORTERM``: what the terminal the agent shares can display.

``HOME``, ``USER`` and ``LOGNAME`` are the agent's user's (its passwd entry), never the
caller's (under sudo they would be root's). Then what is named, later entries winning: the
policy's ``[sandbox] env``, each ``--env-file FILE`` in order, each ``--env`` in order; an
entry is ``NAME`` (the caller's value; unset: not passed) or ``NAME=VALUE``. gatewrap then
adds its shims' variables (:mod:`gatewrap.shims`: the proxy and CA variables, the Python and
Node shims', ``GATEWRAP_GATE``/``GATEWRAP_RUN``/``GATEWRAP_AUDIT``/``GATEWRAP_ALLOW`` for their messages) and
``PWD``. Nothing else: ``GITHUB_TOKEN``, ``SSH_AUTH_SOCK``, ``LD_PRELOAD``, ``PYTHONPATH``
and gatewrap's own ``GATEWRAP_STATE`` (which may hold a database password) stay outside.

Refused when named (exit 125): ``GATEWRAP_*`` (gatewrap's own settings, never the agent's),
the variables gatewrap sets in every run (``env.toml``'s ``[env]``: the proxy variables,
whose only other value would fail at the kernel; ``PWD``). Refused rather than overridden:
a user who names one expects it to take effect, and it cannot.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
from dataclasses import dataclass

from ..errors import GatewrapError
from .user import Target

#: The caller's variables the agent gets: the locale's (``LC_*``: glibc's categories,
#: locale(7), not any name that starts so: ssh's ``AcceptEnv LC_*`` has made ``LC_`` a way to
#: carry anything), the time zone, the terminal's.
KEPT = frozenset({"PATH", "LANG", "LANGUAGE", "TZ", "TERM", "COLORTERM", "LC_ALL", "LC_CTYPE", "LC_COLLATE",
                  "LC_MESSAGES", "LC_MONETARY", "LC_NUMERIC", "LC_TIME", "LC_ADDRESS", "LC_IDENTIFICATION",
                  "LC_MEASUREMENT", "LC_NAME", "LC_PAPER", "LC_TELEPHONE"})
#: The agent's PATH when the caller has none (sudo's secure_path has the same folders).
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
#: A name: letters, digits and ``_``, not starting with a digit (POSIX.1-2017 XBD 8.1, with
#: lower case, which tools use: ``http_proxy``).
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
#: The most bytes of an ``--env-file`` (the kernel takes at most 128 KiB a variable and
#: about a quarter of the stack limit for all of them: execve(2), "Limits on size").
MAX_FILE = 1 << 20
#: How long reading an ``--env-file`` may take, in seconds (a FIFO swapped in never ends).
READ_TIMEOUT = 10.0


@dataclass(frozen=True)
class Named:
    """One named variable: ``value`` None takes the caller's; ``source`` says where it was
    named, for messages (``--env``, ``FILE:LINE``, ``POLICY:LINE: [sandbox] env``)."""

    name: str
    value: str | None
    source: str


def parse_entry(text: str, source: str) -> Named:
    """``NAME`` or ``NAME=VALUE`` (the value verbatim, ``=`` and spaces included).

    Raises:
        GatewrapError: not a name, a NUL byte, or a name gatewrap does not pass (:func:`refusal`).
    """
    name, eq, value = text.partition("=")
    if not NAME.match(name):
        shown = name if len(name) <= 40 else name[:40] + "…"
        raise GatewrapError(f"{source}: {shown!r} is not a variable name (letters, digits and _, not "
                            "starting with a digit); write NAME or NAME=VALUE")
    if "\0" in value:
        raise GatewrapError(f"{source}: {name}'s value has a NUL byte, which no environment can hold")
    why = refusal(name)
    if why:
        raise GatewrapError(f"{source}: {name}: {why}")
    return Named(name, value if eq else None, source)


def refusal(name: str) -> str | None:
    """Why ``name`` cannot be named for the agent, or None."""
    from ..shims import env_table

    if name.startswith("GATEWRAP_"):
        return ("gatewrap's own settings never reach the agent (GATEWRAP_STATE may hold a database "
                "password); gatewrap sets the GATEWRAP_ variables its shims need itself")
    if name in env_table("env"):
        return (f"gatewrap sets {name} in every run, to send the agent's traffic through the gate "
                "(another value would only fail at the kernel); remove it")
    if name == "PWD":
        return "gatewrap sets PWD to the agent's working directory; choose that with --workdir"
    return None


def parse_file(text: str, path: str) -> list[Named]:
    """The entries of an env file, as ``docker run --env-file`` reads one (docker/cli
    ``opts/file.go``): UTF-8 (a leading byte-order mark is dropped); per line, leading
    whitespace dropped, then an empty line or one starting with ``#`` is skipped;
    ``NAME=VALUE`` takes the rest of the line verbatim (no quotes removed, nothing
    expanded, trailing spaces kept; a CR before the newline dropped), ``NAME`` alone the
    caller's value. Messages name ``path:LINE``, never a value.

    Raises:
        GatewrapError: a line that is not an entry (:func:`parse_entry`).
    """
    out = []
    for number, line in enumerate(text.removeprefix("\ufeff").split("\n"), 1):
        line = line.removesuffix("\r").lstrip()
        if line and not line.startswith("#"):
            out.append(parse_entry(line, f"{path}:{number}"))
    return out


def read_file(path: str, environ: dict[str, str]) -> str:
    """The text of ``--env-file`` ``path``, read as the user who invoked gatewrap (sudo's
    ``SUDO_UID``/``SUDO_GID`` in ``environ``, with their groups; else gatewrap's own user):
    gatewrap runs as root, and must not hand the agent a file its user could not read. A
    child process with that user's uid, gid and groups reads it (``head``), so the kernel's
    own permission check applies (ACLs too); it must be a regular file of at most
    :data:`MAX_FILE` bytes.

    Raises:
        GatewrapError: it cannot be read by that user, is not a regular file, is too big, is
            not UTF-8, or did not end within :data:`READ_TIMEOUT` seconds.
    """
    creds: dict = {}
    who = "you"
    if environ.get("SUDO_UID", "").isdigit() and int(environ["SUDO_UID"]) != os.getuid():
        try:
            pw = pwd.getpwuid(int(environ["SUDO_UID"]))
        except KeyError:
            raise GatewrapError(f"--env-file {path}: SUDO_UID {environ['SUDO_UID']} is no user, so "
                                "who may read the file is unknown") from None
        gid = int(environ["SUDO_GID"]) if environ.get("SUDO_GID", "").isdigit() else pw.pw_gid
        creds = {"user": pw.pw_uid, "group": gid, "extra_groups": os.getgrouplist(pw.pw_name, gid)}
        who = pw.pw_name
    head = shutil.which("head", path=os.defpath) or "head"
    script = 'test -f "$1" || { echo "no regular file there that this user can reach" >&2; exit 2; }; exec "$2" -c "$3" -- "$1"'
    try:
        p = subprocess.run(["/bin/sh", "-c", script, "sh", path, head, str(MAX_FILE + 1)], capture_output=True,
                           timeout=READ_TIMEOUT, env={}, cwd="/", **creds)
    except subprocess.TimeoutExpired:
        raise GatewrapError(f"--env-file {path}: not read within {READ_TIMEOUT:g} s") from None
    if p.returncode != 0:
        why = p.stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"exit {p.returncode}"]
        why = why[0].split(": ")[-1] if p.returncode != 2 else why[0]
        raise GatewrapError(f"--env-file {path}: {why} (read as {who}, who ran gatewrap)")
    if len(p.stdout) > MAX_FILE:
        raise GatewrapError(f"--env-file {path}: larger than {MAX_FILE >> 10} KiB; an environment holds less")
    try:
        return p.stdout.decode("utf-8")
    except UnicodeDecodeError as e:
        line = p.stdout[:e.start].count(b"\n") + 1
        raise GatewrapError(f"{path}:{line}: not UTF-8 text") from None


def named(policy_env: list[tuple[str, int]], policy_file: str | None, env_files: list[str], env_vars: list[str],
          environ: dict[str, str]) -> list[Named]:
    """Every named entry, in the order they apply: the policy's ``[sandbox] env`` (entry,
    line), each ``--env-file`` (read by :func:`read_file`), each ``--env``.

    Raises:
        GatewrapError: as :func:`parse_entry`, :func:`read_file` say.
    """
    out = [parse_entry(text, f"{policy_file}:{line}: [sandbox] env") for text, line in policy_env]
    for path in env_files:
        out += parse_file(read_file(path, environ), path)
    return out + [parse_entry(text, "--env") for text in env_vars]


def build(environ: dict[str, str], target: Target, entries: list[Named]) -> tuple[dict[str, str], list[str], list[str]]:
    """The agent's environment before the shims' variables: :data:`KEPT` of ``environ`` (the
    caller's), HOME/USER/LOGNAME of ``target``, then ``entries`` (later
    winning). Returns (the environment, the names passed because they were named, sorted;
    notes for stderr: a named variable the caller does not have).
    """
    env = {k: v for k, v in environ.items() if k in KEPT}
    env.setdefault("PATH", DEFAULT_PATH)
    env.update(HOME=target.home, USER=target.name, LOGNAME=target.name)
    passed: set[str] = set()
    notes = []
    for e in entries:
        value = e.value if e.value is not None else environ.get(e.name)
        if value is None:
            notes.append(f"gatewrap: note: {e.source} {e.name}: not in gatewrap's environment, so not passed "
                         f"(sudo keeps few variables: sudo --preserve-env={e.name}, or --env-file)")
            continue
        env[e.name] = value
        passed.add(e.name)
    return env, sorted(passed), notes
