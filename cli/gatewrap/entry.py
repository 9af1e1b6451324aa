"""The ``gatewrap`` console script and ``python -m gatewrap``.

The common run, ``gatewrap run [--shared] [--allow H] [--deny H] [--policy F]
[--audit-log P] [--env NAME[=VALUE]] [--env-file F] [--json] -- COMMAND...`` (the shared mode,
the default: without ``--own`` and without ``$GATEWRAP_SHARED=0``), is parsed here without
click: importing click (and the inspect, uuid, platform and datetime modules it imports) was
about a third of such a run's client start-up, before it even asks the daemon for a sandbox.
Every other command line, and any option, value or form this parser does not take exactly as
click would (``--help``, ``--own``, a value starting with ``-``, an unknown option, a policy
path that is a folder...), goes to the click CLI (:func:`gatewrap.cli.main`), which parses,
checks and reports as always.
"""

from __future__ import annotations

import os
import sys
#: typing is not imported (~3 ms of every shared run's client start): annotations only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

#: The options of ``run`` this parser takes (each with one value), by the name of their field.
VALUED = {"--allow": "allow", "--deny": "deny", "--allow-private": "allow_private", "--policy": "policy_file", "--audit-log": "audit_log",
          "--env": "env_vars", "--env-file": "env_files",
          "--unprotect": "unprotect"}
#: ``run``'s defaults: the click options of gatewrap.cli take them from here, so that both
#: parsers make the same fields.
DEFAULT_AUDIT_LOG = "/var/log/gatewrap/audit.jsonl"
DEFAULT_AUDIT_MAX_SIZE = "100M"
DEFAULT_CA_DIR = "/var/lib/gatewrap/ca"
DEFAULT_PORT = 3128
DEFAULT_JAIL = "nsjail"
#: The run's bounds (README "Resource bounds"; gatewrap.sandbox.limits enforces them).
#: Tasks (processes + threads) at once: room for a large parallel build with a headless
#: browser (hundreds), while a fork bomb stops at an eighth of the smallest default
#: kernel.pid_max (32768); all runs together stay under half of the host's pids.
DEFAULT_PIDS = "4096"
#: Memory (processes, their kernel memory, the jail's tmpfs files): half of the host's RAM,
#: so one run's hog is killed in its run before the host's memory runs out (all runs
#: together: three quarters).
DEFAULT_MEMORY = "50%"
#: The jail's in-memory file systems together (gatewrap.sandbox.tmpfs splits it): /tmp
#: keeps the 2 GiB it had.
DEFAULT_TMPFS = "4G"


def shared_run(args: list[str], environ: dict[str, str] | os._Environ[str]) -> tuple[dict[str, Any], str] | None:
    """The fields (:func:`run_fields`) and summary form (``text`` or ``json``) of
    the shared run ``args`` (the command line after ``gatewrap``) asks for, exactly as click
    would parse them; None for anything else (click's to parse)."""
    if not args or args[0] != "run":
        return None
    picked: dict[str, Any] = {"allow": [], "deny": [], "allow_private": [], "policy_file": None, "audit_log": DEFAULT_AUDIT_LOG,
                              "env_vars": [], "env_files": [], "unprotect": []}
    shared = as_json = False
    i = 1
    while i < len(args):
        arg = args[i]
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-"):
            break  # the command's first word: run takes no option after it (click: no interspersed args)
        if arg == "--shared":
            shared = True
        elif arg == "--json":
            as_json = True
        else:
            name, eq, value = arg.partition("=")
            if name not in VALUED:
                return None
            if not eq:
                if i + 1 >= len(args):
                    return None
                i += 1
                value = args[i]
            if not value or value.startswith("-"):
                return None
            field = VALUED[name]
            if isinstance(picked[field], list):
                picked[field].append(value)
            else:
                picked[field] = value
        i += 1
    command = args[i:]
    if not command:
        return None
    if not shared and environ.get("GATEWRAP_SHARED", "") not in ("", "1"):
        return None  # a run of its own (0), or a $GATEWRAP_SHARED click reads its own way
    policy = picked["policy_file"]
    if policy is not None and os.path.exists(policy) and (os.path.isdir(policy) or not os.access(policy, os.R_OK)):
        return None  # click.Path(dir_okay=False) says what is wrong with it
    from .sizes import parse_count, parse_memory, parse_size

    fields = run_fields(allow=picked["allow"], deny=picked["deny"], policy_file=policy, user=None,
                        audit_log=picked["audit_log"], audit_max_size=parse_size(DEFAULT_AUDIT_MAX_SIZE),
                        audit_keep=None, nameservers=(), public_ranges=(), port=DEFAULT_PORT, workdir=None,
                        jail=DEFAULT_JAIL, ro_binds=(), rw_binds=(), unprotect=picked["unprotect"], timeout=None,
                        memory=parse_memory(DEFAULT_MEMORY), cpus=None, pids=parse_count(DEFAULT_PIDS),
                        tmpfs=parse_size(DEFAULT_TMPFS), ca_dir=DEFAULT_CA_DIR, upstream_ca=(), state=None, notify_webhook=None,
                        env_vars=picked["env_vars"], env_files=picked["env_files"], command=command,
                        allow_private=picked["allow_private"])
    return fields, "json" if as_json else "text"


def run_fields(allow: Any, deny: Any, policy_file: str | None, user: str | None, audit_log: str, audit_max_size: int,
               audit_keep: int | None, nameservers: Any, public_ranges: Any, port: int, workdir: str | None,
               jail: str, ro_binds: Any, rw_binds: Any, unprotect: Any, timeout: float | None, memory: int | None,
               cpus: float | None, pids: int | None, tmpfs: int, ca_dir: str, upstream_ca: Any, state: str | None,
               notify_webhook: str | None, env_vars: Any, env_files: Any, command: Any,
               allow_private: Any = ()) -> dict[str, Any]:
    """The fields of a RunOptions, as its JSON form (limits a dict; every path absolute), from
    ``run``'s parsed options (click's in gatewrap.cli, or :func:`shared_run`'s): a shared run
    sends them to the daemon, which makes the RunOptions (run_types' dataclasses are not built
    in the client)."""
    # Every path absolute, as the client's working directory makes it: a shared run's paths are
    # used by the daemon, whose working directory is another (/).
    return dict(argv=list(command), allow=list(allow), deny=list(deny), allow_private=list(allow_private),
                policy_file=None if policy_file is None else os.path.abspath(policy_file),
                user=user, audit_log=os.path.abspath(audit_log), audit_max_size=audit_max_size,
                audit_keep=audit_keep, nameservers=list(nameservers) or None, port=port,
                cwd=None if workdir is None else os.path.abspath(workdir), jail=jail,
                ro_binds=[os.path.abspath(p) for p in ro_binds],
                rw_binds=[os.path.abspath(p) for p in rw_binds], unprotect=[os.path.abspath(p) for p in unprotect],
                timeout=timeout,
                limits=dict(memory=memory, cpus=cpus, pids=pids, tmpfs=tmpfs), public_ranges=list(public_ranges),
                ca_dir=os.path.abspath(ca_dir), upstream_ca=[os.path.abspath(p) for p in upstream_ca],
                state=state, notify_webhook=notify_webhook, env_vars=list(env_vars),
                env_files=[os.path.abspath(p) for p in env_files])


def _run_shared(fields: dict[str, Any], summary: str) -> None:
    """``gatewrap run`` in the shared mode with parsed ``fields`` (a run of its own where no
    daemon can start, said in one line), its failures reported and its exit code returned as
    :func:`gatewrap.cli.main` does for the same run."""
    from .errors import EXIT_GATEWRAP, GatewrapError, require_root

    try:
        require_root()
        from .shared import client

        try:
            code = client.run(fields, summary)
        except client.DaemonUnavailable as e:
            print(f"gatewrap: {e}: this run runs on its own", file=sys.stderr, flush=True)
            from .cli import run_own

            code = run_own(fields, summary)
    except KeyboardInterrupt:  # as click turns it into Abort, and main reports that
        print(file=sys.stderr)
        print("gatewrap: aborted", file=sys.stderr)
        sys.exit(130)
    except GatewrapError as e:
        print(f"gatewrap: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except (AttributeError, ImportError) as e:
        from .cli import _stale_extension

        stale = _stale_extension(e)
        if stale is None:
            raise
        print(f"gatewrap: {stale}", file=sys.stderr)
        sys.exit(EXIT_GATEWRAP)
    sys.exit(code if isinstance(code, int) else 0)


def entry_point() -> None:
    """The console script: the common shared run (:func:`shared_run`) without click, any
    other command line through :func:`gatewrap.cli.main`; then :func:`exit_after`."""
    parsed = shared_run(sys.argv[1:], os.environ)
    if parsed is None:
        from .cli import main

        exit_after(main)
    else:
        exit_after(lambda: _run_shared(*parsed))


def exit_after(fn: Callable[[], Any]) -> None:
    """Run ``fn`` (which exits through SystemExit), then exit without the interpreter's
    finalization (about 10 ms of CPU tearing down every module of a process that ends
    anyway). By then everything gatewrap writes is written: the audit log is synced by the
    run, stdout and stderr are flushed here. While a thread other than the main one is still
    running, or on an uncaught exception, Python exits as usual."""
    import threading

    try:
        fn()
        code: Any = 0
    except SystemExit as e:
        code = e.code
    if threading.active_count() > 1:
        sys.exit(code)
    if code is None:
        code = 0
    elif not isinstance(code, int):  # sys.exit("message"): printed, exit 1, as Python does
        print(code, file=sys.stderr)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can reach it
            pass
    os._exit(code & 0xFF)
