"""The ``gatewrap`` command. Commands are thin: parse, call one function, format output."""

from __future__ import annotations

import json
import os
import signal
import sys
from dataclasses import asdict
from typing import Any

import click

from . import __version__, audit_schema
from .syslog_facility import FACILITIES
from .errors import EXIT_GATEWRAP, GatewrapError

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class _Group(click.Group):
    """The top-level group; a command in :data:`LAZY` is imported only when it is named (or
    listed, by ``--help``), so that ``gatewrap run`` does not import its modules (the
    approvals group's pull in re, urllib.parse, datetime and difflib: ~8 ms of every start)."""

    #: Command name -> ``module:attribute`` of its click command.
    LAZY = {"approvals": "gatewrap.approvals.commands:approvals", "daemon": "gatewrap.shared.commands:daemon"}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.LAZY})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.LAZY and name not in self.commands:
            import importlib

            module, attr = self.LAZY[name].split(":")
            self.add_command(getattr(importlib.import_module(module), attr), name)
        return super().get_command(ctx, name)


@click.group(cls=_Group, context_settings=CONTEXT)
@click.version_option(__version__, prog_name="gatewrap")
def cli() -> None:
    """Run an AI agent so that all of its network egress passes one admission gate.

    \b
    The agent gets its own network namespace and cgroup; eBPF hooks refuse (EPERM) every
    connection that is not addressed to the gate, a local HTTP/HTTPS forward proxy that
    allows or denies each request by policy. Every decision goes to the audit log.

    \b
    Examples:
      sudo gatewrap run --allow pypi.org --allow files.pythonhosted.org -- pip download requests
      sudo gatewrap run --policy policy.toml -- python agent.py
      gatewrap audit --denied
      sudo gatewrap ps
      sudo gatewrap doctor
    """


@cli.command(context_settings={**CONTEXT, "allow_interspersed_args": False})
@click.option("--allow", "allow", multiple=True, metavar="HOST[:PORT]",
              help="Allow HOST (exact, or *.suffix for strict subdomains). Without :PORT, ports 80 and 443. Repeatable.")
@click.option("--deny", "deny", multiple=True, metavar="HOST[:PORT]",
              help="Deny HOST; checked before --allow and the policy file. Repeatable.")
@click.option("--policy", "policy_file", type=click.Path(dir_okay=False), metavar="FILE",
              help="Policy file (TOML; format in the README's Policy section). Without it: deny everything "
                   "no --allow names.")
@click.option("--user", metavar="USER", help="Run the agent as USER (name or uid). Default: the user who ran sudo.")
@click.option("--audit-log", default="/var/log/gatewrap/audit.jsonl", show_default=True, metavar="PATH",
              help="Append audit records (JSON lines) here: a regular file (a link, FIFO or device is "
                   "refused) in a directory only root can write. While a record cannot be written "
                   "(a full disk), the gate answers every request 503.")
@click.option("--audit-max-size", "audit_max_size", default="100M", show_default=True, metavar="SIZE",
              callback=lambda c, p, v: _log_size(v),
              help="Rotate the audit log before it grows past SIZE (bytes, or K, M, G; at least 4K; 0: never): "
                   "the file becomes PATH.<first seq, 12 digits> and the new file's first record, a signed "
                   "checkpoint, continues the hash chain.")
@click.option("--audit-keep", "audit_keep", type=click.IntRange(min=0), metavar="N",
              help="Keep the N newest rotated audit segments, deleting older ones. Default: keep all.")
@click.option("--resolver", "nameservers", multiple=True, metavar="IP[:PORT]", callback=lambda c, p, v: [_with_port(x, 53) for x in v],
              help="DNS server the gate resolves through (port 53 by default; IPv6 as [ADDR]:PORT). "
                   "Default: the host's /etc/resolv.conf. Repeatable.")
@click.option("--public-range", "public_ranges", multiple=True, metavar="CIDR",
              help="Treat addresses in CIDR as public for the SSRF guard (e.g. a lab network in a "
                   "documentation range). Never covers metadata addresses. Repeatable.")
@click.option("--port", default=3128, show_default=True, type=click.IntRange(1, 65535),
              help="Port of the gate inside the sandbox (127.0.0.1 and [::1]).")
@click.option("--workdir", type=click.Path(file_okay=False, exists=True), metavar="DIR",
              help="Working directory of the agent. Default: the current one.")
@click.option("--jail", type=click.Choice(["nsjail", "none"]), default="nsjail", show_default=True,
              help="Run the agent under nsjail (private mount/pid/ipc/uts namespaces, the system read-only, "
                   "private HOME, /tmp and /run, nothing else unless bound, seccomp). 'none' is weaker and says so.")
@click.option("--ro-bind", "ro_binds", multiple=True, type=click.Path(exists=True), metavar="PATH",
              help="Show host PATH read-only in the jail, every mount below it too (otherwise the jail shows "
                   "only the system's software, the workdir and private HOME, /tmp, /run, /dev/shm). Unix "
                   "sockets in it stay connectable (gatewrap says so). Policy file: [sandbox] ro_bind. Repeatable.")
@click.option("--bind", "rw_binds", multiple=True, type=click.Path(exists=True), metavar="PATH",
              help="Show host PATH writable in the jail (its own file system; mounts below it stay read-only "
                   "unless named too). Policy file: [sandbox] bind. Repeatable.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="Kill the agent and its children after SECONDS; exit code 124.")
@click.option("--memory", metavar="SIZE", callback=lambda c, p, v: _size(v),
              help="Memory limit of the whole run (cgroup v2 memory.max), e.g. 512M, 2G; no swap.")
@click.option("--cpus", type=click.FloatRange(min=0.01), metavar="N", help="CPU limit (cgroup v2 cpu.max), e.g. 0.5.")
@click.option("--pids", type=click.IntRange(min=1), metavar="N", help="Most tasks (processes + threads) at once (pids.max).")
@click.option("--ca-dir", default="/var/lib/gatewrap/ca", show_default=True, metavar="DIR",
              help="The TLS inspection CA (made on first use: ca.crt, and private/ca.key, hidden from the agent).")
@click.option("--upstream-ca", "upstream_ca", multiple=True, type=click.Path(exists=True, dir_okay=False), metavar="FILE",
              help="PEM CA certificates the gate trusts upstream when inspecting, besides Mozilla's roots. Repeatable.")
@click.option("--state", "state", metavar="URL",
              help="The approvals store that holds this run's breakpoints (ask rules): PATH, sqlite:PATH or "
                   "postgresql://USER@HOST:PORT/DB. Default: $GATEWRAP_STATE, else [state] url in "
                   "/etc/gatewrap/config.toml, else sqlite:/var/lib/gatewrap/state.db when the policy asks.")
@click.option("--notify-webhook", "notify_webhook", metavar="URL",
              help="POST each approval the run asks for to URL (a Slack incoming webhook takes it as it is), "
                   "signed as Standard Webhooks do with the secret in /etc/gatewrap/webhook-secret. "
                   "Default: the policy's [notify] webhook, else the config file's.")
@click.option("--shared", is_flag=True, envvar="GATEWRAP_SHARED",
              help="Let the host's one gatewrap daemon set up and serve the sandbox (started on demand; "
                   "see gatewrap daemon --help): a run then costs ~1.5 MB of gatewrap's memory instead of a "
                   "Python process of its own. Also $GATEWRAP_SHARED=1.")
@click.option("--json", "as_json", is_flag=True, help="Print the closing summary as one JSON object on stderr.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(allow: tuple[str, ...], deny: tuple[str, ...], policy_file: str | None, user: str | None,
        audit_log: str, audit_max_size: int, audit_keep: int | None, nameservers: tuple[str, ...], public_ranges: tuple[str, ...], port: int, workdir: str | None, jail: str,
        ro_binds: tuple[str, ...], rw_binds: tuple[str, ...], timeout: float | None, memory: int | None,
        cpus: float | None, pids: int | None, ca_dir: str, upstream_ca: tuple[str, ...], state: str | None,
        notify_webhook: str | None, shared: bool, as_json: bool, command: tuple[str, ...]) -> int:
    """Run COMMAND in a sandbox whose only egress is the gate.

    \b
    The agent runs as the invoking user (SUDO_UID), with no capabilities and
    no_new_privs, in a new netns with only `lo` and a new cgroup under gatewrap/.
    HTTP_PROXY, HTTPS_PROXY and ALL_PROXY (both spellings) point at the gate; any other
    connection fails with EPERM and a notice here. The agent runs under nsjail: a
    read-only view of the system, a writable working directory, private /tmp and /run.
    A request that matches an `ask` rule (a breakpoint) is held until a human answers
    it (gatewrap approvals --help); the line printed here says how.
    The exit code is the agent's; gatewrap's own failures exit 125 (126/127: COMMAND
    not executable / not found; 124: --timeout).

    \b
    The gate's listeners are bounded: at most 1024 open connections per run over the
    proxy port and the DNS stub's TCP side (of which DNS over TCP at most 64, each
    closed after 10 s without a query); a request head must arrive within 30 s; a tunnel
    or WebSocket idle for 300 s is closed.

    \b
    Example:
      sudo gatewrap run --allow pypi.org --allow files.pythonhosted.org -- python agent.py
    """
    from .run_types import RunOptions
    from .sandbox.limits import Limits

    opts = RunOptions(argv=list(command), allow=list(allow), deny=list(deny), policy_file=policy_file,
                      user=user, audit_log=audit_log, audit_max_size=audit_max_size, audit_keep=audit_keep,
                      nameservers=list(nameservers) or None, port=port,
                      cwd=workdir, jail=jail, ro_binds=[os.path.abspath(p) for p in ro_binds],
                      rw_binds=[os.path.abspath(p) for p in rw_binds], timeout=timeout,
                      limits=Limits(memory=memory, cpus=cpus, pids=pids), public_ranges=list(public_ranges),
                      ca_dir=os.path.abspath(ca_dir), upstream_ca=[os.path.abspath(p) for p in upstream_ca],
                      state=state, notify_webhook=notify_webhook)
    if shared:
        from .errors import require_root
        from .shared import client

        require_root()
        return client.run(opts, "json" if as_json else "text")
    from .runner import run as do_run, summary_line

    result = do_run(opts)
    if as_json:
        click.echo(json.dumps(result.as_record()), err=True)
    else:
        click.echo(summary_line(result), err=True)
    return result.exit_code


DEFAULT_LOG = "/var/log/gatewrap/audit.jsonl"


def _log_option(f):  # type: ignore[no-untyped-def]
    return click.option("--log", "path", default=DEFAULT_LOG, show_default=True, metavar="PATH",
                        help="The audit log to read.")(f)


def _time_option(name: str, what: str):  # type: ignore[no-untyped-def]
    return click.option(name, metavar="TIME", callback=lambda c, p, v: _time(c, p, v),
                        help=f"Only records {what} TIME: ISO 8601 (2026-12-01T09:30; UTC with Z; no offset = "
                             "local time) or a time ago (90s, 10m, 2h, 1d).")


@cli.group("audit", context_settings=CONTEXT, invoke_without_command=True)
@click.option("--run", "run_id", metavar="ID", help="Only records of run ID (gw-...).")
@click.option("--event", "events", multiple=True, metavar="EVENT", type=click.Choice(audit_schema.events()),
              help=f"Only EVENT records, one of (schema/audit.schema.json): {', '.join(audit_schema.events())}. "
                   "Repeatable.")
@click.option("--decision", "decisions", multiple=True, type=click.Choice(["allowed", "denied", "failed"]),
              help="Only records with this decision (schema/audit.schema.json). Repeatable.")
@click.option("--denied", is_flag=True, help="Only denials (by policy, at the kernel, rejected, expired).")
@click.option("--host", "hosts", multiple=True, metavar="GLOB",
              help="Only records whose destination (the canonical host, else the IP) matches GLOB "
                   "(fnmatch: *.example.com, 203.0.113.*), case-insensitively. Repeatable.")
@_time_option("--since", "at or after")
@_time_option("--until", "at or before")
@click.option("--pid", type=int, metavar="PID", help="Only records of process PID (kernel denials name it).")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv"]),
              help="table (the default on a terminal), json (JSON lines, the default otherwise) or csv.")
@click.option("--json", "as_json", is_flag=True, help="Same as --format json.")
@click.option("--follow", "-f", is_flag=True,
              help="Keep printing new records as they are written (follows rotation and truncation; Ctrl-C ends).")
@_log_option
@click.pass_context
def audit(ctx: click.Context, run_id: str | None, events: tuple[str, ...], decisions: tuple[str, ...],
          denied: bool, hosts: tuple[str, ...], since: str | None, until: str | None, pid: int | None,
          fmt: str | None, as_json: bool, follow: bool, path: str) -> int:
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
    filters = ar.Filters(run=run_id, events=events, decisions=decisions, denied=denied, hosts=hosts,
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
                    out.write(af.header() + "\n")
                out.write(af.row(rec) + "\n")
            shown += 1
            if follow:
                out.flush()
        if not shown:
            click.echo(f"gatewrap: no matching records in {path}", err=True)
        out.flush()
    except FileNotFoundError:
        raise GatewrapError(f"no audit log at {path}: nothing has run yet, or pass --log PATH", exit_code=1)
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:
        _quiet_stdout()
    return 0


@audit.command("stats", context_settings=CONTEXT)
@click.option("--run", "run_id", metavar="ID", help="Only run ID (gw-...).")
@_time_option("--since", "at or after")
@_time_option("--until", "at or before")
@click.option("--top", default=10, show_default=True, type=click.IntRange(min=1),
              help="How many of the most denied destinations to list.")
@click.option("--json", "as_json", is_flag=True, help='Print {"runs": [...], "top_denied": [...]} as one JSON object.')
@_log_option
def audit_stats(run_id: str | None, since: str | None, until: str | None, top: int, as_json: bool, path: str) -> int:
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
        s = stats(ar.records(path, filters=ar.Filters(run=run_id, since=since, until=until)))
    except FileNotFoundError:
        raise GatewrapError(f"no audit log at {path}: nothing has run yet, or pass --log PATH", exit_code=1)
    for line in [json.dumps(s.as_record(top))] if as_json else s.lines(top):
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
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def audit_verify(files: tuple[str, ...], keys: tuple[str, ...], notes: tuple[str, ...], as_json: bool) -> int:
    """Check the audit log's hash chain and the signatures of its checkpoints.

    \b
    Names the first broken line (FILE:LINE); records after the last checkpoint are
    reported as an unverified tail. A log cut back to a point before a checkpoint it once
    had is only seen with that checkpoint kept off the host (--checkpoint). Exit 0
    verified, 1 broken or truncated, 125 if it cannot check. A live log (FILE, default
    the host's) is checked with its rotated segments (FILE.<first seq>), each file on its
    own line, then that each segment continues the one before it.

    \b
    Examples:
      gatewrap audit verify
      gatewrap audit verify --key "$(cat host.key)" --checkpoint last.note audit.jsonl
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
    joins = av.check_joins(reports)
    ok = all(r.broken is None for r in reports) and all(c.problem is None for c in checked) and not joins
    if as_json:
        click.echo(json.dumps({"ok": ok, "files": [r.as_record() for r in reports],
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
                   + (f", from record {r.first_seq} (continues {r.continues})" if r.continues else ""))
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


@cli.command(context_settings=CONTEXT)
@click.option("--json", "as_json", is_flag=True, help="Print the runs as a JSON array.")
def ps(as_json: bool) -> int:
    """List the live runs: id, gatewrap's pid (with --shared, its gatewrap-wait's), the
    agent's user, uptime, pending approvals, counts so far, command.

    \b
    Counts are the run's own records in its audit log so far (read from where the log
    ended when the run started); PENDING is its approvals asked and not answered yet
    (gatewrap approvals list --run ID shows them). Needs root (the run registry,
    /run/gatewrap/runs, is root's).

    \b
    Example:
      sudo gatewrap ps --json | jq -r '.[].run'
    """
    from .live_runs import live_runs, ps_lines
    from .errors import require_root

    require_root("ps")
    runs = live_runs()
    if as_json:
        click.echo(json.dumps([r.as_record() for r in runs]))
    elif runs:
        for line in ps_lines(runs):
            click.echo(line)
    else:
        click.echo("gatewrap: no live runs", err=True)
    return 0


@cli.command(context_settings=CONTEXT)
@click.argument("run_id", metavar="RUN")
@click.option("--timeout", default=30.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              metavar="SECONDS", help="How long to wait for the run to end.")
@click.option("--json", "as_json", is_flag=True, help="Print {run, stopped, signal, exit_code, run_end} as one JSON object.")
def stop(run_id: str, timeout: float, as_json: bool) -> int:
    """End run RUN as SIGTERM would, and wait for it to end.

    \b
    gatewrap forwards the signal to the agent, tears the sandbox down and writes the
    run_end record. Exit 0 when the run has ended, 1 when RUN is not a live run
    (gatewrap ps lists them), 125 when it is still running after --timeout.

    \b
    Example:
      sudo gatewrap stop gw-0123456789
    """
    from .live_runs import stop as do_stop
    from .errors import require_root

    require_root("stop")
    res = do_stop(run_id, timeout)
    if as_json:
        click.echo(json.dumps(res.as_record()))
    else:
        end = f"the agent exited {res.exit_code}" if res.exit_code is not None else "no run_end record in its log"
        click.echo(f"gatewrap: stopped {run_id}: {end}")
    return 0


@cli.command(context_settings=CONTEXT)
@click.option("--json", "as_json", is_flag=True, help="Print the checks as a JSON array.")
def doctor(as_json: bool) -> int:
    """Check this machine: root, cgroup v2, BTF, bcc, kernel headers, bpffs, nsjail.

    Exit 0 when gatewrap can run here, 1 when a check failed (each says how to fix it).
    Nothing is changed: the fixes are printed, for you to run.

    \b
    Examples:
      sudo gatewrap doctor
      sudo gatewrap doctor --json | jq -r '.[] | select(.status != "ok") | .fix'
    """
    from .doctor import checks

    results = checks()
    if as_json:
        click.echo(json.dumps([asdict(c) for c in results], indent=2))
    else:
        marks = {"ok": "ok  ", "warn": "warn", "fail": "FAIL"}
        for c in results:
            click.echo(f"[{marks[c.status]}] {c.name}: {c.detail}")
            if c.fix:
                click.echo(f"       fix: {c.fix}")
    return 1 if any(c.status == "fail" for c in results) else 0


@cli.command(context_settings=CONTEXT)
@click.option("--json", "as_json", is_flag=True, help="Print what was removed as a JSON object.")
def gc(as_json: bool) -> int:
    """Remove sandboxes whose gatewrap died: kill their processes, delete their netns and cgroup.

    A sandbox is stale when no gatewrap process holds its lock in /run/gatewrap/runs/.
    `gatewrap run` does the same at start-up. A shared-mode run whose daemon died while its
    `gatewrap run` still waits is left alone (no egress meanwhile): a restarted daemon takes it
    back; kill that waiter to end it. Exit 1 if something could not be removed.
    """
    from .runner import collect_stale

    out = collect_stale()
    if as_json:
        click.echo(json.dumps(asdict(out)))
    else:
        for run_id in out.runs:
            click.echo(f"removed {run_id}")
        for run_id, pid in out.waiting:
            click.echo(f"left {run_id}: its gatewrap run (pid {pid}) waits for the gatewrap daemon to take it back "
                       f"(no egress meanwhile); `kill {pid}` ends it")
        for e in out.errors:
            click.echo(f"gatewrap: could not remove {e}", err=True)
        if not out.runs and not out.errors and not out.waiting:
            click.echo("no stale sandboxes")
    return 1 if out.errors else 0


@cli.group("policy", context_settings=CONTEXT)
def policy_group() -> None:
    """Validate a policy file, ask it what it would decide, or draft one from a run."""


@policy_group.command("check", context_settings=CONTEXT)
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
def policy_check(file: str, as_json: bool) -> int:
    """Load FILE and summarise it: default, mode, and its rules in evaluation order.

    Exit 0 when FILE is valid (warnings, e.g. a policy that allows everything, go to stderr),
    1 when it is not (`gatewrap: FILE:LINE: message`), 125 when it cannot be read.

    \b
    Example:
      gatewrap policy check policy.toml
    """
    from .policy_cmd import check_file, check_lines

    res = check_file(file)
    for line in [json.dumps(res.as_record())] if as_json else check_lines(res):
        click.echo(line)
    for w in res.warnings:
        click.echo(f"gatewrap: warning: {w}", err=True)
    if res.error:
        click.echo(f"gatewrap: {res.error}", err=True)
    return 0 if res.ok else 1


@policy_group.command("test", context_settings=CONTEXT)
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.argument("method")
@click.argument("url")
@click.option("--allow", "allow", multiple=True, metavar="HOST[:PORT]", help="As in `run`: an allow rule. Repeatable.")
@click.option("--deny", "deny", multiple=True, metavar="HOST[:PORT]",
              help="As in `run`: a deny rule, checked before --allow and FILE's rules. Repeatable.")
@click.option("--json", "as_json", is_flag=True,
              help="Print {decision, reason, rule, host, port, method, url, mode, scheme, path, stage, userinfo} "
                   "as one JSON object.")
def policy_test(file: str, method: str, url: str, allow: tuple[str, ...], deny: tuple[str, ...], as_json: bool) -> int:
    """Print what FILE (plus --deny/--allow) decides for METHOD URL, and the rule that decided.

    \b
    URL is http:// or https:// (default port 80 / 443); userinfo is ignored for matching.
    An http:// URL is decided as one request (methods, path, schemes). An https:// URL is
    first a CONNECT tunnel, decided on host and port; METHOD and the path count only when
    a rule inspects the tunnel (inspect = true, TLS inspection). This is the policy's
    decision, as in enforce mode, before budgets; the gate's SSRF guard, which needs DNS,
    may still refuse an allowed name's addresses. Exit 0 allow, 1 deny, 2 ask (the gate
    denies an ask until approvals exist); 125 for a bad file, flag, METHOD or URL.

    \b
    Examples:
      gatewrap policy test policy.toml GET https://api.openai.com/v1/models
      gatewrap policy test policy.toml POST https://pypi.org/ --allow pypi.org --json
    """
    from .policy_cmd import decide_url, decision_lines

    d = decide_url(file, method, url, list(allow), list(deny))
    for line in [json.dumps(d.as_record())] if as_json else decision_lines(d):
        click.echo(line)
    return d.exit_code


@policy_group.command("suggest", context_settings=CONTEXT)
@click.option("--run", "run_id", required=True, metavar="ID", help="The run (gw-...) whose audit records to use.")
@click.option("--log", "path", default="/var/log/gatewrap/audit.jsonl", show_default=True, metavar="PATH",
              help="The audit log to read.")
@click.option("--json", "as_json", is_flag=True, help="Print {run, policy, rules} as one JSON object.")
def policy_suggest(run_id: str, path: str, as_json: bool) -> int:
    """Print a draft policy from what run ID did (typically a run in mode = "report").

    \b
    The draft denies by default, enforces, and allows each host the run reached on the
    ports it used (hosts sorted; a comment says how many requests each rule covers).
    Kernel-refused connections, DNS queries and SSRF refusals, which no allow rule
    fixes, are listed as comments. Review it, then `gatewrap policy check` it.
    Exit 1 when the run has no records in the log.

    \b
    Example:
      sudo gatewrap policy suggest --run gw-0123456789 > policy.toml
    """
    from . import audit_reader as ar
    from .policy_suggest import suggest

    try:
        s = suggest(ar.records(path), run_id)
    except FileNotFoundError:
        raise GatewrapError(f"no audit log at {path}: nothing has run yet, or pass --log PATH", exit_code=1)
    if as_json:
        click.echo(json.dumps({"run": s.run, "policy": s.toml(), "rules": s.rules()}))
    else:
        click.echo(s.toml(), nl=False)
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


def _size(value: str | None) -> int | None:
    from .sandbox.limits import parse_size

    if value is None:
        return None
    try:
        return parse_size(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def _log_size(value: str) -> int:
    """``--audit-max-size``: a size (:func:`gatewrap.sandbox.limits.parse_size`) of at least
    4 KiB (gate_core/src/audit/rotate.rs MIN_MAX_SIZE), or 0 for never."""
    if value.strip() == "0":
        return 0
    size = _size(value)
    assert size is not None
    if size < 4096:
        raise click.BadParameter(f"{value!r} is below 4K, the least a new file needs (0: never rotate)")
    return size


def _with_port(addr: str, port: int) -> str:
    """``IP`` -> ``IP:port``; ``[v6]`` -> ``[v6]:port``; a bare IPv6 -> ``[v6]:port``."""
    if addr.startswith("["):
        return addr if "]:" in addr else f"{addr}:{port}"
    if addr.count(":") > 1:
        return f"[{addr}]:{port}"
    return addr if ":" in addr else f"{addr}:{port}"


def _stale_extension(e: AttributeError | ImportError) -> str | None:
    """What to say when the Python package asks the built gate extension for something it
    lacks (a checkout pulled, not rebuilt: ``from ._gate_core import X`` raises ImportError,
    ``core.X`` AttributeError), or when it is not built at all; None for any other error."""
    if isinstance(e, ImportError):
        if e.name != "gatewrap._gate_core":
            return None
        what = "is not built" if isinstance(e, ModuleNotFoundError) else "is older than this checkout's Python code"
    elif getattr(getattr(e, "obj", None), "__name__", "") == "gatewrap._gate_core":
        what = f"has no {e.name!r}: it is older than this checkout's Python code"
    else:
        return None
    return f"the gate extension (gatewrap._gate_core) {what}; rebuild it with `sudo scripts/setup.sh install`"


def main(argv: list[str] | None = None) -> None:
    """Entry point: usage errors and gatewrap's failures exit 125 with a message on stderr."""
    try:
        code = cli.main(args=argv, prog_name="gatewrap", standalone_mode=False)
    except click.UsageError as e:
        e.show()
        sys.exit(EXIT_GATEWRAP)
    except click.Abort:
        click.echo("gatewrap: aborted", err=True)
        sys.exit(130)
    except GatewrapError as e:
        click.echo(f"gatewrap: {e}", err=True)
        sys.exit(e.exit_code)
    except click.ClickException as e:
        e.show()
        sys.exit(EXIT_GATEWRAP)
    except (AttributeError, ImportError) as e:
        stale = _stale_extension(e)
        if stale is None:
            raise
        click.echo(f"gatewrap: {stale}", err=True)
        sys.exit(EXIT_GATEWRAP)
    sys.exit(code if isinstance(code, int) else 0)


def entry_point() -> None:
    """The ``gatewrap`` console script and ``python -m gatewrap``: :func:`main`, then exit
    without the interpreter's finalization (about 10 ms of CPU tearing down every module of
    a process that ends anyway). By then everything gatewrap writes is written: the audit log
    is synced by the run, stdout and stderr are flushed here. While a thread other than the
    main one is still running, or on an uncaught exception, Python exits as usual."""
    import threading

    try:
        main()
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
