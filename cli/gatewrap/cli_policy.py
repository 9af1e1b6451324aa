"""``gatewrap policy`` and its subcommands (check, test, suggest). Imported only when the
command is named (or listed by ``gatewrap --help``): see :class:`gatewrap.cli._Group`."""

from __future__ import annotations

import json

import click

from .cli import CONTEXT
from .errors import GatewrapError

@click.group("policy", context_settings=CONTEXT)
def policy_group() -> None:
    """Validate a policy file, ask it what it would decide, or draft one from a run."""


@policy_group.command("check", context_settings=CONTEXT)
@click.argument("file", type=click.Path(exists=True, dir_okay=False), required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
@click.option("--workdir", type=click.Path(file_okay=False, exists=True), metavar="DIR",
              help="List the protected paths a run in DIR would have (in DIR and the policy's [sandbox] bind "
                   "paths): read-only for the agent; one it makes is moved aside after the run.")
@click.option("--unprotect", "unprotect", multiple=True, metavar="PATH",
              help="As in `run`: a protected path left writable. Repeatable.")
def policy_check(file: str | None, as_json: bool, workdir: str | None, unprotect: tuple[str, ...]) -> int:
    """Load FILE and summarise it: default, mode, its rules in evaluation order, its
    public_ranges, its [[secret]]s and the host's (/etc/gatewrap/secrets.toml) by name, with
    the kind of source (from_file, from_env, from_command), placeholder variable, budget and
    the rules that inject each and where (never a value, nor where it is read: sudo gatewrap
    secrets list), and its [sandbox]; with --workdir DIR, the protected paths of a run there
    (.git's config, hooks and info, .envrc, .vscode/...: read-only for the agent, and any it
    makes moved aside after the run).
    Without FILE (--workdir only): those of a run with no policy file (--allow/--deny only).

    Exit 0 when FILE is valid (warnings, e.g. a policy that allows everything, go to stderr),
    1 when it is not (`gatewrap: FILE:LINE: message`), 125 when it cannot be read.

    \b
    Examples:
      gatewrap policy check policy.toml
      gatewrap policy check policy.toml --workdir ~/src/project
      gatewrap policy check --workdir .
    """
    import os

    if file is None and workdir is None:
        raise click.UsageError("give a policy FILE, or --workdir DIR for the protected paths of a run without one")

    from .policy_cmd import check_file, check_lines

    res = check_file(file, workdir=None if workdir is None else os.path.abspath(workdir),
                     unprotect=[os.path.abspath(u) for u in unprotect])
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
@click.option("--run", "run_id", required=True, metavar="ID",
              help="The run whose audit records to use: a whole id (gw-...), or a start of one run's in the "
                   "log, as for gatewrap audit.")
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
    from .cli_audit import run_in_log
    from .policy_suggest import suggest

    try:
        s = suggest(ar.records(path), run_in_log(run_id, path) or run_id)
    except FileNotFoundError:
        raise GatewrapError(f"no audit log at {path}: nothing has run yet, or pass --log PATH", exit_code=1)
    if as_json:
        click.echo(json.dumps({"run": s.run, "policy": s.toml(), "rules": s.rules()}))
    else:
        click.echo(s.toml(), nl=False)
    return 0
