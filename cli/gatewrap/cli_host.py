"""``gatewrap ps``, ``stop``, ``doctor`` and ``gc``: the host's live runs, sandboxes and
readiness. Imported only when a command is named (or listed by ``gatewrap --help``): see
:class:`gatewrap.cli._Group`."""

from __future__ import annotations

import json
from dataclasses import asdict

import click

from .cli import CONTEXT

@click.command(context_settings=CONTEXT)
@click.option("--json", "as_json", is_flag=True, help="Print the runs as a JSON array (whole run ids).")
@click.option("--no-trunc", "whole_ids", is_flag=True,
              help="Show whole run ids (a container's run: gw- and its 64 characters).")
def ps(as_json: bool, whole_ids: bool) -> int:
    """List the live runs, oldest first: id, gatewrap's pid (a shared run: its
    gatewrap-wait's; a container's run, gw-<container id>, has none: -), the agent's user,
    uptime, CPU %, RSS, processes, pending approvals, counts so far, command (a container's:
    [container <id>] first; --json: container).

    \b
    RUN shows gw- and 12 characters of a container's run id, as docker ps shows 12 of its
    container's (more where two runs start so), which gatewrap stop and gatewrap audit
    --run take; --no-trunc shows whole ids.

    \b
    CPU%, RSS and PROCS are the processes in the run's cgroup (its cgroup.procs: the jail's
    init, gatewrap-wait, the agent and its children): CPU% is the CPU time they used over one
    0.2 s sample (taken for every run at once, so ps takes 0.2 s), of one CPU (200 = two
    CPUs busy); RSS sums their resident memory (shared pages once per process). --json
    gives cpu_percent (a number), rss (bytes) and procs (an int).

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
        for line in ps_lines(runs, whole_ids):
            click.echo(line)
    else:
        click.echo("gatewrap: no live runs", err=True)
    return 0


@click.command(context_settings=CONTEXT)
@click.argument("run_id", metavar="RUN")
@click.option("--timeout", default=30.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              metavar="SECONDS", help="How long to wait for the run to end.")
@click.option("--json", "as_json", is_flag=True, help="Print {run, stopped, signal, exit_code, run_end} as one JSON object once the run "
                   "has ended (exit 1 or 125: nothing on stdout, the error on stderr).")
def stop(run_id: str, timeout: float, as_json: bool) -> int:
    """End run RUN as SIGTERM would, and wait for it to end.

    \b
    gatewrap forwards the signal to the agent, tears the sandbox down and writes the
    run_end record. RUN: a run id, or the start of one live run's (of its part after
    gw-: a container's short id). Exit 0 when the run has ended, 1 when RUN is not a live
    run (gatewrap ps lists them), 125 when it is still running after --timeout.

    \b
    A container's run (gw-<container id>, gatewrap-oci) is stopped as `docker stop` does:
    SIGTERM to the container's first process, SIGKILL to all of its processes after
    --timeout; its engine sees it exit (Exited, or removed with --rm) and its run ends
    (the engine's delete, or the daemon 5 s after its last process).

    \b
    A run still running 1 s after the SIGTERM gets a line on stderr saying how long
    gatewrap waits for it and what it does then (--json too: stdout keeps only the object).

    \b
    Example:
      sudo gatewrap stop gw-0123456789
      sudo gatewrap stop 9a109c573f51    # a container, by the id docker ps shows
    """
    from .live_runs import stop as do_stop
    from .errors import require_root

    require_root("stop")
    res = do_stop(run_id, timeout, lambda line: click.echo(line, err=True))
    if as_json:
        click.echo(json.dumps(res.as_record()))
    else:
        end = (f"the agent exited {res.exit_code}" if res.exit_code is not None else
               f"{res.signal}; the run ended: {res.run_end.get('reason')}" if res.run_end is not None else
               "no run_end record in its log yet (a shared run whose daemon is down: gatewrap gc or the "
               "restarted daemon removes its sandbox and writes it)")
        click.echo(f"gatewrap: stopped {res.run}: {end}")
    return 0


@click.command(context_settings=CONTEXT)
@click.argument("run_id", metavar="RUN")
@click.option("--timeout", default=10.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              metavar="SECONDS", help="How long to wait for the run's answer.")
@click.option("--json", "as_json", is_flag=True, help="Print the run's policy_reload record as one JSON object.")
def reload(run_id: str, timeout: float, as_json: bool) -> int:
    """Read run RUN's policy file (its --policy) again and decide new requests by it.

    \b
    The new file's rules, default, mode, public_ranges and [approvals] limits apply to the
    requests that come next (requests already admitted or held go on as decided); the
    command-line rules (--allow, --deny, --allow-private) stay first. The sandbox is fixed
    at the run's start and a reload never changes it: [sandbox] paths and env, the
    protected paths, the jail. A file that cannot be read or does not parse leaves the
    policy in force as it was, and says why. Either way a policy_reload record (old and
    new digest) goes to the run's audit log. SIGHUP to a run's own gatewrap process does
    the same (a shared run, the default, is reloaded through its daemon).

    \b
    RUN: a run id, or the start of one live run's, as for gatewrap stop. Exit 0 when
    reloaded, 1 when RUN is not a live run or its file was refused, 125 when the run did
    not answer within --timeout.

    \b
    Example:
      sudo gatewrap reload gw-0123456789
    """
    from .errors import require_root
    from .reload import reload_run

    require_root("reload")
    rec = reload_run(run_id, timeout)
    if as_json:
        click.echo(json.dumps(rec))
    else:
        click.echo(f"gatewrap: reloaded {rec.get('run', run_id)}'s policy from {rec['policy_file']} "
                   f"({rec['old_digest'][:19]}… -> {rec['new_digest'][:19]}…)" + (f"; {rec['note']}" if rec.get("note") else ""))
    return 0


@click.command(context_settings=CONTEXT)
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


@click.command(context_settings=CONTEXT)
@click.option("--json", "as_json", is_flag=True, help="Print what was removed as a JSON object.")
def gc(as_json: bool) -> int:
    """Remove sandboxes whose gatewrap died: kill their processes and delete their cgroups.

    A sandbox is stale when no gatewrap process holds its lock in /run/gatewrap/runs/.
    `gatewrap run` does the same at start-up. A shared-mode run whose daemon died while its
    `gatewrap run` still waits is left alone (no egress meanwhile): a restarted daemon takes it
    back; kill that waiter to end it. So is a container's run (gatewrap-oci) whose container
    still runs. Only what this gatewrap can prove dead is removed: a
    sandbox whose lock file is not in this registry or whose gatewrap is in another pid
    namespace (another install on this kernel: a chroot, a container) is left alone, and said.
    gc also removes what a killed shared daemon left in /run/gatewrap (its socket,
    SOCKET.lock, SOCKET.start) once no process holds their locks; a daemon's start does too.
    Exit 1 if something could not be removed.
    """
    from .runner import collect_stale
    from .sandbox import gc as gc_module
    from .shared import lockfile

    out = collect_stale()
    if as_json:
        click.echo(json.dumps(asdict(out)))
    else:
        for run_id in out.runs:
            click.echo(f"removed {run_id}")
        for run_id, pid in out.waiting:
            click.echo(f"left {run_id}: its gatewrap run (pid {pid}) waits for the gatewrap daemon to take it back "
                       f"(no egress meanwhile); `kill {pid}` ends it")
        for run_id, sock in out.containers:
            click.echo(f"left {run_id}: its container lives on and waits for the gatewrap daemon of {sock} to take "
                       "it back (no egress meanwhile); start that daemon, or stop the container with its engine")
        for run_id, why in out.left:
            click.echo(gc_module.left_line(run_id, why))
        for removed in out.dead_daemons:
            click.echo(lockfile.said(removed))
        for e in out.errors:
            click.echo(f"gatewrap: could not remove {e}", err=True)
        if not out.runs and not out.errors and not out.waiting and not out.left and not out.containers:
            click.echo("no stale sandboxes")
    return 1 if out.errors else 0
