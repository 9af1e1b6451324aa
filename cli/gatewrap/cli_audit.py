"""``gatewrap audit`` and its subcommands (stats, ship, verify, key). Imported only when the
command is named (or listed by ``gatewrap --help``): see :class:`gatewrap.cli._Group`."""

from __future__ import annotations

import json
import os
import signal
import sys

import click

from . import audit_schema
from .cli import CONTEXT
from .errors import GatewrapError
from .syslog_facility import FACILITIES

DEFAULT_LOG = "/var/log/gatewrap/audit.jsonl"


def run_in_log(name: str | None, path: str) -> str | None:
    """``--run``'s value (``gatewrap audit``, ``audit stats``, ``policy suggest``) as the run it
    names in the log at ``path``: itself when it has a whole id's shape (no search: the read
    stays as fast as with an id) or is a run's id there, else the one run whose id starts with
    it (:func:`gatewrap.run_ids.named`, :func:`gatewrap.audit_reader.runs_starting`; with
    --follow, of the runs logged so far); unchanged when none does.

    Raises:
        click.BadParameter: it starts more than one run's id (they are listed; exit 125).
        GatewrapError: the log cannot be read by this user (without a log, ``name`` is
            returned: the read then says there is none).
    """
    from . import audit_reader as ar
    from . import run_ids

    if name is None or run_ids.whole(name):
        return name
    try:
        return run_ids.named(name, lambda begins: ar.runs_starting(path, begins, most=run_ids.LISTED + 1),
                             f"run in {path}")
    except FileNotFoundError:
        return name
    except run_ids.Ambiguous as e:
        raise click.BadParameter(str(e), param_hint="'--run'") from None


def _log_option(f):  # type: ignore[no-untyped-def]
    return click.option("--log", "path", default=DEFAULT_LOG, show_default=True, metavar="PATH",
                        help="The audit log to read.")(f)


def _time_option(name: str, what: str):  # type: ignore[no-untyped-def]
    return click.option(name, metavar="TIME", callback=lambda c, p, v: _time(c, p, v),
                        help=f"Only records {what} TIME: ISO 8601 (2026-12-01T09:30; UTC with Z; no offset = "
                             "local time) or a time ago (90s, 10m, 2h, 1d).")


def _elsewhere(run_id: str | None, path: str) -> str:
    """For a live run named by ``run_id`` (or a unique start of it) that writes another audit
    log than ``path`` (``gatewrap run --audit-log``): where to look; else ``""``."""
    if not run_id:
        return ""
    from .live_runs import resolve
    from .sandbox import registry

    try:
        run = resolve(run_id)
        info = registry.info(run) or {}
    except (GatewrapError, OSError, ValueError):
        return ""
    log = info.get("audit_log")
    if not isinstance(log, str) or os.path.abspath(log) == os.path.abspath(path):
        return ""
    return f"; run {run} writes to {log}: gatewrap audit --log {log} --run {run}"


@click.group("audit", context_settings=CONTEXT, invoke_without_command=True)
@click.option("--run", "run_id", metavar="ID",
              help="Only records of run ID: a whole id (gw-...), or a start of one run's in the log, with or "
                   "without gw- (as gatewrap ps and docker ps show a container's).")
@click.option("--event", "events", multiple=True, metavar="EVENT", type=click.Choice(audit_schema.events()),
              help=f"Only EVENT records, one of (schema/audit.schema.json): {', '.join(audit_schema.events())}. "
                   "Repeatable.")
@click.option("--decision", "decisions", multiple=True, type=click.Choice(audit_schema.decisions()),
              help="Only records with this decision (schema/audit.schema.json). Repeatable.")
@click.option("--denied", is_flag=True, help="Only denials (by policy, at the kernel, rejected, expired).")
@click.option("--host", "hosts", multiple=True, metavar="GLOB",
              help="Only records whose destination (the canonical host, else the IP) matches GLOB "
                   "(fnmatch: *.example.com, 203.0.113.*), case-insensitively. Repeatable.")
@_time_option("--since", "at or after")
@_time_option("--until", "at or before")
@click.option("--pid", type=int, metavar="PID", help="Only records of process PID: the kernel's records name it (pid), the gate's its "
                   "client (client_pid: the process holding the connection).")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv"]),
              help="table (the default on a terminal), json (JSON lines, the default otherwise) or csv.")
@click.option("--json", "as_json", is_flag=True, help="Same as --format json.")
@click.option("--no-trunc", "whole_ids", is_flag=True,
              help="Table: show whole run ids (a container's run: gw- and its 64 characters), not gw- and 12 "
                   "characters as gatewrap ps shows them.")
@click.option("--follow", "-f", is_flag=True,
              help="Keep printing new records as they are written (follows rotation and truncation; Ctrl-C ends).")
@_log_option
@click.pass_context
def audit(ctx: click.Context, run_id: str | None, events: tuple[str, ...], decisions: tuple[str, ...],
          denied: bool, hosts: tuple[str, ...], since: str | None, until: str | None, pid: int | None,
          fmt: str | None, as_json: bool, whole_ids: bool, follow: bool, path: str) -> int:
    """Show the audit log: a table on a terminal, JSON lines otherwise, or CSV.

    \b
    Filters combine (a record must pass all); a repeated one is a choice (any).
    Table and CSV escape control characters; JSON lines are printable ASCII.
    Exit 1 when there is no log. `gatewrap audit stats` counts per run.

    \b
    Examples:
      gatewrap audit --denied
      gatewrap audit --run gw-0123456789 --json | jq .dst_host
      gatewrap audit --host '*.github.com' --since 2h --format csv > github.csv
      gatewrap audit --follow
    """
    if ctx.invoked_subcommand is not None:
        given = [p.opts[0] for p in ctx.command.params if p.name is not None
                 and ctx.get_parameter_source(p.name) is not click.core.ParameterSource.DEFAULT]
        if given:
            raise click.UsageError(f"{', '.join(given)}: options of `gatewrap audit {ctx.invoked_subcommand}` go "
                                   f"after it (gatewrap audit {ctx.invoked_subcommand} --help)")
        return 0
    from . import audit_format as af
    from . import audit_reader as ar

    fmt = "json" if as_json else fmt or ("table" if sys.stdout.isatty() else "json")
    filters = ar.Filters(run=run_in_log(run_id, path), events=events, decisions=decisions, denied=denied, hosts=hosts,
                         since=since, until=until, pid=pid)
    out = sys.stdout
    shown = 0
    try:
        csv_out = None
        for line, rec in ar.entries(path, filters, follow=follow):
            if fmt == "json":
                out.write(af.json_line(line, rec) + "\n")
            elif fmt == "csv":
                csv_out = csv_out or af.CsvOut(out)
                csv_out.write(rec)
            else:
                if not shown:
                    out.write(af.header(whole_ids) + "\n")
                out.write(af.row(rec, whole_ids) + "\n")
            shown += 1
            if follow:
                out.flush()
        if not shown:
            click.echo(f"gatewrap: no matching records in {path}" + _elsewhere(run_id, path), err=True)
        out.flush()
    except FileNotFoundError:
        raise GatewrapError(f"no audit log at {path}: nothing has run yet, or pass --log PATH", exit_code=1)
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:
        _quiet_stdout()
    return 0


@audit.command("stats", context_settings=CONTEXT)
@click.option("--run", "run_id", metavar="ID",
              help="Only run ID: a whole id (gw-...), or a start of one run's, as for audit.")
@_time_option("--since", "at or after")
@_time_option("--until", "at or before")
@click.option("--top", default=10, show_default=True, type=click.IntRange(min=1),
              help="How many of the most denied destinations to list.")
@click.option("--json", "as_json", is_flag=True, help='Print {"runs": [...], "top_denied": [...]} as one JSON object.')
@click.option("--no-trunc", "whole_ids", is_flag=True,
              help="Show whole run ids (a container's run: gw- and its 64 characters), as gatewrap ps --no-trunc does.")
@_log_option
def audit_stats(run_id: str | None, since: str | None, until: str | None, top: int, as_json: bool, whole_ids: bool,
                path: str) -> int:
    """Count each run's records (allowed, denied, direct egress, failed) and list the most
    denied destinations.

    \b
    Counts follow the run_end record's: allowed leaves out TLS-inspected tunnels (their
    requests are counted), denied is the gate's, direct egress the kernel's.

    \b
    Examples:
      gatewrap audit stats
      gatewrap audit stats --since 1d --top 20 --json | jq '.top_denied'
    """
    from . import audit_reader as ar
    from .audit_stats import stats

    try:
        s = stats(ar.records(path, filters=ar.Filters(run=run_in_log(run_id, path), since=since, until=until)))
    except FileNotFoundError:
        raise GatewrapError(f"no audit log at {path}: nothing has run yet, or pass --log PATH", exit_code=1)
    for line in [json.dumps(s.as_record(top))] if as_json else s.lines(top, whole_ids):
        click.echo(line)
    return 0


@audit.command("ship", context_settings=CONTEXT)
@click.option("--to", "to", required=True, metavar="URL",
              help="The collector: tcp://HOST:PORT (RFC 6587 octet counting) or tls://HOST:PORT (RFC 5425).")
@click.option("--ca", metavar="FILE", type=click.Path(exists=True, dir_okay=False),
              help="With tls://: trust the collector's certificate if this CA (PEM) signed it (default: the "
                   "system's trust store). Its name must match HOST.")
@click.option("--state", "state", default="/var/lib/gatewrap/ship/state", show_default=True, metavar="FILE",
              help="Where the position reached is kept (one per collector: two shippers cannot share one).")
@click.option("--follow", "-f", is_flag=True,
              help="Keep shipping what is appended (follows rotation and truncation; Ctrl-C or SIGTERM ends). "
                   "Without it: ship up to the end of the log, then exit.")
@click.option("--facility", type=click.Choice(list(FACILITIES)), default="authpriv", show_default=True,
              help="The syslog facility (RFC 5424 6.2.1).")
@click.option("--hostname", metavar="NAME", help="HOSTNAME of the messages (default: this host's name).")
@click.option("--retry-max", default=30.0, show_default=True, type=click.FloatRange(min=0.01), metavar="SECONDS",
              help="Longest wait between reconnection attempts (the waits double from 0.5 s).")
@_log_option
def audit_ship(to: str, ca: str | None, state: str, follow: bool, facility: str, hostname: str | None,
               retry_max: float, path: str) -> int:
    """Ship the audit log to a syslog collector, one RFC 5424 message per line.

    \b
    The shipper reads the log and never blocks the gate: while the collector is
    gone it reconnects (waits doubling up to --retry-max) and the log keeps every
    record. The position is saved after the collector's TCP acknowledged each
    batch; a batch cut by a failure is sent again (at least once: the collector
    may hold a line twice; the ino and off parameters tell them apart).

    \b
    Examples:
      gatewrap audit ship --to tcp://logs.example.net:514 --follow
      gatewrap audit ship --to tls://logs.example.net:6514 --ca /etc/ssl/fleet-ca.pem --follow
    """
    from .audit_ship import parse_destination, ship

    try:
        dest = parse_destination(to)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--to") from None
    if ca is not None and dest.scheme != "tls":
        raise click.BadParameter("--ca is for tls:// collectors", param_hint="--ca")
    def _interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _interrupt)  # systemd's stop ends it as Ctrl-C does
    try:
        done = ship(path, dest, state, ca=ca, follow=follow, hostname=hostname, facility=FACILITIES[facility],
                    retry_max=retry_max)
    except FileNotFoundError:
        raise GatewrapError(f"no audit log at {path}: nothing has run yet, or pass --log PATH", exit_code=1)
    click.echo(f"gatewrap: shipped {done.lines} lines to {dest} ({done.resent} sent again after a failure)", err=True)


DEFAULT_AUDIT_KEY = "/var/lib/gatewrap/audit/signing-key"  # as runner.DEFAULT_AUDIT_KEY (audit commands do not import the runner)


@audit.command("verify", context_settings=CONTEXT)
@click.argument("files", nargs=-1, metavar="[FILE]...")
@click.option("--key", "keys", multiple=True, metavar="KEY",
              help="A verifier key (<name>+<id>+<base64>, as `gatewrap audit key` prints it); "
                   "default: this host's key.")
@click.option("--checkpoint", "notes", multiple=True, type=click.Path(dir_okay=False), metavar="NOTE",
              help="A checkpoint note kept off the host (a file): the log must still hold it.")
@click.option("--partial", is_flag=True,
              help="Accept a log that starts mid-chain without the file before it (its oldest segments "
                   "deleted by --audit-keep, or an excerpt): each file then says where it starts, and "
                   "whether a signed rotation or a cut front begins it.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def audit_verify(files: tuple[str, ...], keys: tuple[str, ...], notes: tuple[str, ...], partial: bool,
                 as_json: bool) -> int:
    """Check the audit log's hash chain and the signatures of its checkpoints.

    \b
    Names the first broken line (FILE:LINE); records after the last checkpoint are
    reported as an unverified tail. A log cut back to a point before a checkpoint it once
    had is only seen with that checkpoint kept off the host (--checkpoint). Exit 0
    verified, 1 broken or truncated, 125 if it cannot check. A live log (FILE, default
    the host's) is checked with its rotated segments (FILE.<first seq>), each file on its
    own line, then that each segment continues the one before it. A log that starts
    mid-chain without the file before it (a segment alone, segments deleted by
    --audit-keep, or a cut front: the files alone cannot tell them apart) exits 1 unless
    --partial is given; each file then says where it starts.

    \b
    Examples:
      gatewrap audit verify
      gatewrap audit verify --key "$(cat host.key)" --checkpoint last.note audit.jsonl
      gatewrap audit verify --partial audit.jsonl.000000350001
    """
    from . import audit_verify as av

    try:
        vkeys = [av.VerifierKey.parse(k) for k in keys]
    except av.KeyFormatError as e:
        raise click.UsageError(str(e))
    if not vkeys:
        if os.geteuid() != 0:
            raise GatewrapError("this host's audit key is root's: run with sudo, or pass --key (as "
                                "`sudo gatewrap audit key` prints it)")
        if not os.path.exists(DEFAULT_AUDIT_KEY):
            raise GatewrapError(f"no audit key at {DEFAULT_AUDIT_KEY}: pass --key (`gatewrap audit key` on the "
                                "host that wrote the log prints it)")
        vkeys = [av.VerifierKey.parse(_host_verifier_key())]
    off_host = []
    for note in notes:
        try:
            with open(note, encoding="utf-8") as f:
                off_host.append(av.open_note(f.read(), vkeys))
        except OSError as e:
            raise GatewrapError(f"cannot read checkpoint {note}: {e.strerror}")
        except ValueError as e:
            raise GatewrapError(f"checkpoint {note}: {e}", exit_code=1)
    from . import audit_reader as ar

    reports = []
    # A live log stands for all its files: its rotated segments, oldest first, then itself.
    paths = [p for f in files or (DEFAULT_LOG,) for p in (ar.log_files(f) if av.log_base(f) == f else [f])]
    for path in dict.fromkeys(paths):
        try:
            reports.append(av.verify_file(path, vkeys, [c.size for c in off_host]))
        except OSError as e:
            raise GatewrapError(f"cannot read audit log {path}: {e.strerror}")
    checked = [av.check_off_host(c, reports) for c in off_host]
    joins = av.check_joins(reports, partial)
    ok = all(r.broken is None for r in reports) and all(c.problem is None for c in checked) and not joins
    if as_json:
        click.echo(json.dumps({"ok": ok, "partial": partial, "files": [r.as_record() for r in reports],
                               "checkpoints": [c.as_record() for c in checked],
                               "joins": [{"file": f, "error": e} for f, e in joins]}))
        return 0 if ok else 1
    for r in reports:
        if r.broken:
            click.echo(f"{r.path}:{r.broken[0]}: {r.broken[1]}")
            continue
        cp = (f"the last at line {r.last_checkpoint_line}, size {r.last_checkpoint_size}"
              if r.last_checkpoint_line else "none")
        click.echo(f"{r.path}: chain verified: {r.records} records, {r.checkpoints} "
                   f"checkpoint{'' if r.checkpoints == 1 else 's'} ({cp})"
                   + (f", {r.unchained} older lines before the chain" if r.unchained else "")
                   + (f", from record {r.first_seq} ({av.STARTS[r.start].format(name=r.continues)})"
                      if r.mid_chain() else ""))
        if r.tail:
            click.echo(f"{r.path}: {r.tail} records after the last checkpoint (unverified tail: no signature "
                       "covers them yet)")
    for f, e in joins:
        click.echo(f"{f}: {e}")
    for c in checked:
        click.echo(f"checkpoint of {c.size} records: " + (f"found in {c.found}" if c.found else str(c.problem)))
    return 0 if ok else 1


def _host_verifier_key() -> str:
    from . import _gate_core as core

    try:
        return core.audit_verifier_key(DEFAULT_AUDIT_KEY)
    except (OSError, ValueError) as e:
        raise GatewrapError(f"cannot read the audit key: {e}")


@audit.command("key", context_settings=CONTEXT)
def audit_key() -> int:
    """Print this host's audit verifier key (C2SP signed-note: <name>+<id>+<base64 key>),
    made on first use, for `gatewrap audit verify --key` off the host. Needs root.

    \b
    Examples:
      gatewrap audit key > host.key
    """
    if os.geteuid() != 0:
        raise GatewrapError("gatewrap audit key needs root (the key is root's, 0600): run it with sudo")
    click.echo(_host_verifier_key())
    return 0


def _time(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    from .audit_reader import parse_time

    if value is None:
        return None
    try:
        return parse_time(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def _quiet_stdout() -> None:
    """The reader of our output went away (``| head``): stop writing, exit quietly (Python's
    "Note on SIGPIPE", signal module docs)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
