"""The ``gatewrap`` command. Commands are thin: parse, call one function, format output."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import click

from . import __version__
from .entry import (DEFAULT_AUDIT_LOG, DEFAULT_AUDIT_MAX_SIZE, DEFAULT_CA_DIR, DEFAULT_JAIL, DEFAULT_MEMORY,
                    DEFAULT_PIDS, DEFAULT_PORT, DEFAULT_TMPFS, run_fields)
from .sizes import parse_count, parse_memory
from .errors import EXIT_GATEWRAP, GatewrapError

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class _Group(click.Group):
    """The top-level group; a command in :data:`LAZY` is imported only when it is named (or
    listed, by ``--help``), so that ``gatewrap run`` neither imports their modules (the
    approvals group's pull in re, urllib.parse, datetime and difflib: ~8 ms of every start)
    nor builds their options (the audit group's ``--event`` choices read the schema's JSON
    through importlib.resources, which imports pathlib, tempfile, shutil and zipfile)."""

    #: Command name -> ``module:attribute`` of its click command. Only ``run`` is defined here.
    LAZY = {"approvals": "gatewrap.approvals.commands:approvals", "audit": "gatewrap.cli_audit:audit",
            "daemon": "gatewrap.shared.commands:daemon", "doctor": "gatewrap.cli_host:doctor",
            "gc": "gatewrap.cli_host:gc", "policy": "gatewrap.cli_policy:policy_group",
            "ps": "gatewrap.cli_host:ps", "reload": "gatewrap.cli_host:reload",
            "secrets": "gatewrap.secrets.commands:secrets_group", "stop": "gatewrap.cli_host:stop"}

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
@click.option("--allow-private", "allow_private", multiple=True, metavar="HOST[:PORT]",
              help="As --allow, and HOST (a name) may resolve to a private, loopback, link-local, CGNAT, "
                   "documentation or benchmarking address, which the SSRF guard otherwise refuses: a company "
                   "mirror or registry on 10.x. Never a metadata address. Policy file: allow_private = true "
                   "on the rule. Repeatable.")
@click.option("--policy", "policy_file", type=click.Path(dir_okay=False), metavar="FILE",
              help="Policy file (TOML; format: docs/reference/policy.md). Without it: deny everything "
                   "no --allow names.")
@click.option("--user", metavar="USER", help="Run the agent as USER (name or uid). Default: the user who ran sudo.")
@click.option("--audit-log", default=DEFAULT_AUDIT_LOG, show_default=True, metavar="PATH",
              help="Append audit records (JSON lines) here: a regular file (a link, FIFO or device is "
                   "refused) in a directory only root can write. While a record cannot be written "
                   "(a full disk), the gate answers every request 503.")
@click.option("--audit-max-size", "audit_max_size", default=DEFAULT_AUDIT_MAX_SIZE, show_default=True, metavar="SIZE",
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
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(1, 65535),
              help="Port of the gate inside the sandbox (127.0.0.1 and [::1]).")
@click.option("--workdir", type=click.Path(file_okay=False, exists=True), metavar="DIR",
              help="Working directory of the agent. Default: the current one.")
@click.option("--jail", type=click.Choice(["nsjail", "none"]), default=DEFAULT_JAIL, show_default=True,
              help="Run the agent under nsjail (private mount/pid/ipc/uts namespaces, the system read-only, "
                   "private HOME, /tmp and /run, nothing else unless bound, seccomp). 'none' is weaker and says so.")
@click.option("--ro-bind", "ro_binds", multiple=True, type=click.Path(exists=True), metavar="PATH",
              help="Show host PATH read-only in the jail, every mount below it too (otherwise the jail shows "
                   "only the system's software, the workdir and private HOME, /tmp, /run, /dev/shm). Unix "
                   "sockets in it stay connectable (gatewrap says so). Policy file: [sandbox] ro_bind. Repeatable.")
@click.option("--bind", "rw_binds", multiple=True, type=click.Path(exists=True), metavar="PATH",
              help="Show host PATH writable in the jail (its own file system; mounts below it stay read-only "
                   "unless named too). Policy file: [sandbox] bind. Repeatable.")
@click.option("--unprotect", "unprotect", multiple=True, metavar="PATH",
              help="Leave PATH writable though other tools run it: in the workdir and --bind paths, .git's "
                   "config, hooks and info, .envrc, .vscode/, .idea/, .devcontainer/ (and nested repositories') "
                   "are read-only for the agent, and any it makes is moved aside (NAME.gatewrap-RUN) after the "
                   "run; `gatewrap policy check` lists them. Policy file: [sandbox] unprotect. Repeatable.")
@click.option("--timeout", metavar="DURATION", callback=lambda c, p, v: _duration(v),
              help="Kill the agent and its children after DURATION: seconds (90, 0.5) or the policy file's "
                   "durations (30s, 10m, 2h); exit code 124.")
@click.option("--memory", default=DEFAULT_MEMORY, show_default=True, metavar="SIZE|N%|max",
              callback=lambda c, p, v: _bound(parse_memory, v),
              help="Memory bound of the whole run (its processes, their kernel memory and the files in the "
                   "jail's tmpfs), no swap: a size (512M, 2G), a share of the host's RAM (25%), or max (none; "
                   "all runs together stay under 75% of RAM). Past it the kernel's OOM killer ends a process "
                   "of the run, said in the summary. cgroup v2 memory.max, else cgroup v1 memory.limit_in_bytes.")
@click.option("--cpus", type=click.FloatRange(min=0.01), metavar="N",
              help="CPU limit (cgroup v2 cpu.max, else v1 cpu.cfs_quota_us), e.g. 0.5. Default: none.")
@click.option("--pids", default=DEFAULT_PIDS, show_default=True, metavar="N|max",
              callback=lambda c, p, v: _bound(parse_count, v),
              help="Most tasks (processes + threads) of the run at once, or max (none; all runs together "
                   "stay under half of kernel.pid_max): a fork past it fails with EAGAIN, counted in the "
                   "summary. cgroup v2 pids.max, else cgroup v1 pids.max; with no pids controller, "
                   "RLIMIT_NPROC, which counts all of the agent's user's processes on the host.")
@click.option("--tmpfs", "tmpfs", default=DEFAULT_TMPFS, show_default=True, metavar="SIZE",
              callback=lambda c, p, v: _tmpfs(v),
              help="Budget of the jail's in-memory file systems: /tmp gets half, the agent's home and "
                   "/dev/shm a quarter each (after 1 MiB each for /run and /dev, read-only); a write past "
                   "a part fails with ENOSPC. Their files count against --memory too.")
@click.option("--ca-dir", default=DEFAULT_CA_DIR, show_default=True, metavar="DIR",
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
@click.option("--env", "env_vars", multiple=True, metavar="NAME[=VALUE]",
              help="Pass NAME to the agent: your value, or VALUE (a command line is visible to every user: "
                   "prefer NAME, or --env-file, for a secret; sudo keeps few variables: sudo "
                   "--preserve-env=NAME). The agent gets only PATH, LANG, LANGUAGE, LC_*, TZ, TERM, COLORTERM, "
                   "its user's HOME/USER/LOGNAME, gatewrap's proxy and CA variables, and what is named. "
                   "Never GATEWRAP_* nor the proxy variables. Policy file: [sandbox] env. Repeatable.")
@click.option("--env-file", "env_files", multiple=True, metavar="FILE",
              help="Pass the variables of FILE, read as the user who ran sudo: docker's --env-file format "
                   "(NAME=VALUE or NAME per line, the value verbatim, no quotes removed; # comments). "
                   "--env wins over it. Repeatable.")
@click.option("--shared/--own", "shared", default=True, envvar="GATEWRAP_SHARED", show_default=True,
              help="--shared (the default): the host's one gatewrap daemon sets up and serves the sandbox "
                   "(started on demand, exits after 10 minutes without a run; gatewrap daemon --help): a run "
                   "starts in about twice firejail's time and costs ~1.5 MB of gatewrap's memory. --own: a "
                   "gatewrap process of its own serves the run (also where no daemon can start, said in one "
                   "line). Also $GATEWRAP_SHARED=0 (own) or 1.")
@click.option("--json", "as_json", is_flag=True, help="Print the closing summary as one JSON object on stderr.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(allow: tuple[str, ...], deny: tuple[str, ...], allow_private: tuple[str, ...], policy_file: str | None, user: str | None,
        audit_log: str, audit_max_size: int, audit_keep: int | None, nameservers: tuple[str, ...], public_ranges: tuple[str, ...], port: int, workdir: str | None, jail: str,
        ro_binds: tuple[str, ...], rw_binds: tuple[str, ...], unprotect: tuple[str, ...], timeout: float | None, memory: int | None,
        cpus: float | None, pids: int | None, tmpfs: int, ca_dir: str, upstream_ca: tuple[str, ...], state: str | None,
        notify_webhook: str | None, env_vars: tuple[str, ...], env_files: tuple[str, ...], shared: bool, as_json: bool, command: tuple[str, ...]) -> int:
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
    closed after 10 s without a query), and 1024 tunnels half-closed by the agent (its
    side finished, upstream's still sending; beyond, such a tunnel is closed). When
    the gate's process nears its open-file limit (the last eighth, shared by all the
    daemon's runs), a run holding 64 connections or more gets no new one, nor a new
    upstream connection for those it holds (503). A request head must arrive within
    30 s; a tunnel or WebSocket idle for 300 s is closed.

    \b
    Example:
      sudo gatewrap run --allow pypi.org --allow files.pythonhosted.org -- python agent.py
    """
    fields = run_fields(allow=allow, deny=deny, policy_file=policy_file, user=user, audit_log=audit_log,
                        audit_max_size=audit_max_size, audit_keep=audit_keep, nameservers=nameservers,
                        public_ranges=public_ranges, port=port, workdir=workdir, jail=jail, ro_binds=ro_binds,
                        rw_binds=rw_binds, unprotect=unprotect, timeout=timeout, memory=memory, cpus=cpus, pids=pids, tmpfs=tmpfs, ca_dir=ca_dir,
                        upstream_ca=upstream_ca, state=state, notify_webhook=notify_webhook, env_vars=env_vars,
                        env_files=env_files, command=command, allow_private=allow_private)
    summary = "json" if as_json else "text"
    if shared:
        from .errors import require_root
        from .shared import client

        require_root()
        try:
            return client.run(fields, summary)
        except client.DaemonUnavailable as e:
            click.echo(f"gatewrap: {e}: this run runs on its own", err=True)
    return run_own(fields, summary)


def run_own(fields: dict[str, Any], summary: str) -> int:
    """A run of its own (``run --own``) of ``fields`` (:func:`run_fields`), its closing
    summary (``text`` or ``json``) on stderr; the agent's exit code.

    Raises:
        GatewrapError: as :func:`gatewrap.runner.run` says.
    """
    from .run_types import RunOptions
    from .runner import run as do_run, summary_line
    from .sandbox.limits import Limits

    result = do_run(RunOptions(**{**fields, "limits": Limits(**fields["limits"])}))
    if summary == "json":
        click.echo(json.dumps(result.as_record()), err=True)
    else:
        click.echo(summary_line(result), err=True)
    return result.exit_code


def _size(value: str | None) -> int | None:
    from .sizes import parse_size

    if value is None:
        return None
    try:
        return parse_size(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def _bound(parse, value: str) -> int | None:
    """``--memory``/``--pids``: ``parse`` (:mod:`gatewrap.sizes`) of ``value``, None for ``max``."""
    try:
        return parse(value)
    except (ValueError, OSError) as e:
        raise click.BadParameter(str(e)) from None


def _duration(value: str | None) -> float | None:
    """``--timeout``: seconds (a positive number, ``0.5``), or a duration of the policy file's
    grammar (``30s``, ``10m``, ``2h``: gate_core/src/policy/duration.rs, the one parser of
    both), in seconds."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        from . import _gate_core as core

        try:
            return core.parse_duration(value)
        except ValueError as e:
            raise click.BadParameter(f"{e}; or a number of seconds (90, 0.5)") from None
    if not seconds > 0:  # inf included: no timeout, as before
        raise click.BadParameter(f"{value!r} is not a positive number of seconds")
    return seconds


def _tmpfs(value: str) -> int:
    """``--tmpfs``: a size of at least :data:`gatewrap.sandbox.tmpfs.MIN_BUDGET`."""
    from .sandbox.tmpfs import MIN_BUDGET

    size = _size(value)
    assert size is not None
    if size < MIN_BUDGET:
        raise click.BadParameter(f"{value!r} is below {MIN_BUDGET >> 20}M, the least the jail's tmpfs mounts need")
    return size


def _log_size(value: str) -> int:
    """``--audit-max-size``: a size (:func:`gatewrap.sizes.parse_size`) of at least
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
    """:func:`main` as the console script runs it (:func:`gatewrap.entry.exit_after`)."""
    from .entry import exit_after

    exit_after(main)
