"""The ``gatewrap`` console script and ``python -m gatewrap``.

The common shared run, ``gatewrap run --shared [--allow H] [--deny H] [--policy F]
[--audit-log P] [--json] -- COMMAND...`` (or ``$GATEWRAP_SHARED=1`` instead of ``--shared``),
is parsed here without click: importing click (and the inspect, uuid, platform and datetime
modules it imports) was about a third of such a run's client start-up, before it even asks
the daemon for a sandbox. Every other command line, and any option, value or form this
parser does not take exactly as click would (``--help``, a value starting with ``-``, an
unknown option, a policy path that is a folder...), goes to the click CLI
(:func:`gatewrap.cli.main`), which parses, checks and reports as always.
"""

from __future__ import annotations

import os
import sys
#: typing is not imported (~3 ms of every shared run's client start): annotations only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

#: The options of ``run`` this parser takes (each with one value), by the name of their field.
VALUED = {"--allow": "allow", "--deny": "deny", "--policy": "policy_file", "--audit-log": "audit_log"}
#: ``run``'s defaults of the fields it sends (gatewrap.cli's options say the same).
DEFAULT_AUDIT_LOG = "/var/log/gatewrap/audit.jsonl"
DEFAULT_AUDIT_MAX_SIZE = "100M"
DEFAULT_CA_DIR = "/var/lib/gatewrap/ca"
DEFAULT_PORT = 3128


def shared_run(args: list[str], environ: dict[str, str] | os._Environ[str]) -> tuple[dict[str, Any], str] | None:
    """The fields (:func:`gatewrap.cli.run_fields`) and summary form (``text`` or ``json``) of
    the shared run ``args`` (the command line after ``gatewrap``) asks for, exactly as click
    would parse them; None for anything else (click's to parse)."""
    if not args or args[0] != "run":
        return None
    picked: dict[str, Any] = {"allow": [], "deny": [], "policy_file": None, "audit_log": DEFAULT_AUDIT_LOG}
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
    if not shared and environ.get("GATEWRAP_SHARED") != "1":
        return None  # a run of its own, or a $GATEWRAP_SHARED click reads its own way
    policy = picked["policy_file"]
    if policy is not None and os.path.exists(policy) and (os.path.isdir(policy) or not os.access(policy, os.R_OK)):
        return None  # click.Path(dir_okay=False) says what is wrong with it
    from .sizes import parse_size

    fields = dict(argv=list(command), allow=picked["allow"], deny=picked["deny"], policy_file=policy, user=None,
                  audit_log=picked["audit_log"], audit_max_size=parse_size(DEFAULT_AUDIT_MAX_SIZE), audit_keep=None,
                  nameservers=None, port=DEFAULT_PORT, cwd=None, jail="nsjail", ro_binds=[], rw_binds=[],
                  timeout=None, limits=dict(memory=None, cpus=None, pids=None), public_ranges=[],
                  ca_dir=os.path.abspath(DEFAULT_CA_DIR), upstream_ca=[], state=None, notify_webhook=None)
    return fields, "json" if as_json else "text"


def _run_shared(fields: dict[str, Any], summary: str) -> None:
    """``gatewrap run --shared`` with parsed ``fields``, its failures reported and its exit
    code returned as :func:`gatewrap.cli.main` does for the same run."""
    from .errors import EXIT_GATEWRAP, GatewrapError, require_root

    try:
        require_root()
        from .shared import client

        code = client.run(fields, summary)
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
