"""``gatewrap approvals``: the click group. Thin: parse, call one function, format output."""

from __future__ import annotations

import functools
import json
import os
import sys
from typing import Any, Callable

import click

from ..errors import GatewrapError
from ..run_types import DEFAULT_AUDIT_LOG
from ..text import counted, printable
from . import decide as dec
from . import render, state

#: Longest ``prune --older-than``: 100 years, in seconds.
PRUNE_MAX_SECONDS = 100 * 366 * 86400
CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def _common(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--state`` and ``--json`` on every subcommand; a Refused decision printed as JSON
    under ``--json`` (``{"ok": false, "why", "error"}``, exit 1)."""
    f = click.option("--json", "as_json", is_flag=True, help="Print JSON (one object) instead of text.")(f)
    f = click.option("--state", "state_url", metavar="URL",
                     help="The approvals store: PATH, sqlite:PATH or postgresql://USER@HOST:PORT/DB. Default: "
                          "$GATEWRAP_STATE, else [state] url in /etc/gatewrap/config.toml, else "
                          "sqlite:/var/lib/gatewrap/state.db.")(f)

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return f(*args, **kwargs)
        except GatewrapError as e:
            if kwargs.get("as_json"):
                click.echo(json.dumps({"ok": False, "why": getattr(e, "why", "error"), "error": str(e)}))
            raise
    return wrapper


def _store(url: str | None) -> Any:
    """The store the flag, environment or config file names; never made here (only a run
    makes one): a missing one is said (125)."""
    return state.open_store(state.resolve_url(url), create=False)


def _run_in_store(store: Any, name: str | None) -> str | None:
    """``--run``'s value as the run it names among the store's runs (ended ones too): itself
    when it is one, else the one whose id starts with it, as ``gatewrap stop`` and ``audit
    --run`` take a start (:func:`gatewrap.run_ids.named`); unchanged when none does.

    Raises:
        click.BadParameter: it starts more than one run's id (they are listed; exit 125).
    """
    from .. import run_ids

    if name is None:
        return None
    try:
        return run_ids.named(name, lambda begins: (r["run_id"] for r in store.runs() if r["run_id"].startswith(begins)),
                             "run in the approvals store")
    except run_ids.Ambiguous as e:
        raise click.BadParameter(str(e), param_hint="'--run'") from None


def _of_run(store: Any, name: str | None, run: str | None) -> str:
    """For an empty listing of ``--run NAME`` (``run``: the run it names, :func:`_run_in_store`):
    which run, and what to do when the store has none of that id (a run is in the store only
    if it ran with approvals on: gatewrap.runner opens the store for a policy that
    asks or a store named)."""
    if name is None:
        return ""
    if any(r["run_id"] == run for r in store.runs()):
        return f" of run {run}"
    return (f" of run {name}: the approvals store has no run of that id or starting with it (a run is in it "
            "when its policy asks or it named a store; --state names another store)")


def _on_a_terminal() -> bool:
    """Whether a human can see a prompt and answer it: stdin and stdout are terminals."""
    return sys.stdin.isatty() and sys.stdout.isatty()


def _confirmed(store: Any, approval_id: str, verdict: str, version: int | None, digest: str | None,
               yes: bool) -> tuple[int | None, str | None]:
    """What a decision names: ``(version, digest)``. With ``--digest`` or ``--yes``, as given.
    Else, on a terminal, the approval as the store holds it is printed (as ``show`` does,
    every byte of the agent's escaped) and the human asked y/N: the decision then names the
    version and digest shown, so a change meanwhile is refused as stale. The notice line on
    the run's stderr is not what is decided on: the agent shares that stderr and can forge
    it. Without a terminal: a usage error that says what to give.

    Raises:
        click.UsageError: no terminal, and neither ``--digest`` nor ``--yes``.
        dec.Refused: (exit 1) the human answered no, or the approval is not there.
    """
    if digest is not None or yes:
        return version, digest
    if not _on_a_terminal():
        raise click.UsageError(
            f"{verdict} without a terminal must name what it decides on: --digest HEX (and --version N) as "
            f"`gatewrap approvals show {approval_id}` prints them, or --yes to decide on the approval as it is now")
    a = dec.current(store, approval_id)
    click.echo(render.show(a))
    click.echo("")
    body = f"{a['body_len']} bytes of body" if a["body_len"] else "no body"
    click.echo(printable(f"{verdict} {a['method']} {a['url']} ({body}) of run {a['run_id']}, version "
                         f"{a['version']}, digest {a['digest']}"))
    if not click.confirm(f"{verdict.capitalize()} {a['id']}?", default=False):
        raise dec.Refused(f"{a['id']}: nothing was decided (you answered no)", "declined")
    return a["version"] if version is None else version, a["digest"]


def _yes(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--yes", "-y", "yes", is_flag=True,
                        help="Decide without showing the request and asking (scripts). Without --yes or "
                             "--digest, on a terminal, the request is shown and you are asked y/N; "
                             "elsewhere the command refuses.")(f)


def _out(as_json: bool, obj: Any, text: str) -> None:
    click.echo(json.dumps(obj) if as_json else text)


@click.group("approvals", context_settings=CONTEXT)
def approvals() -> None:
    """Answer the breakpoints of runs: approve, edit or reject a held request.

    \b
    A request that matches an `ask` rule is held by the gate and kept as an approval
    in the store (SQLite by default, PostgreSQL for several hosts) until a human
    decides or its deadline passes (a timeout is a denial, never a yes). Each decision
    names the version and digest of the request you saw; if it changed since (someone
    edited or answered first, it expired, its run ended), the decision is refused as
    stale, with the why, and nothing is sent.

    \b
    Exit codes: 0 done; 1 refused (stale, expired, not found, answered no; the message
    says why); 125 gatewrap itself failed (the store cannot be opened...).

    \b
    The notice line a run prints goes to the stderr its agent shares: the agent can print
    a forged one. approve and reject show the request the store holds and ask y/N before
    they decide (the line's digest is the first characters of the one they show).

    \b
    Examples:
      sudo gatewrap approvals list
      sudo gatewrap approvals show ap-...
      sudo gatewrap approvals approve ap-...
      sudo gatewrap approvals approve ap-... --grant 'POST mail.test/v3/' --for 30m
      sudo gatewrap approvals reject ap-... --reason 'not to customers'
      sudo gatewrap approvals edit ap-...
      sudo gatewrap approvals serve      # the review pages on http://127.0.0.1:8377
      sudo gatewrap approvals prune --older-than 30d
    """


@approvals.command("list", context_settings=CONTEXT)
@click.option("--status", type=click.Choice(["pending", "approved", "rejected", "expired", "sending", "sent",
                                             "cancelled"]), help="Only approvals in this status.")
@click.option("--run", "run_id", metavar="ID",
              help="Only approvals of run ID: a whole id (gw-...), or a start of one run's in the store.")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 10000), help="Newest N.")
@_common
def list_cmd(status: str | None, run_id: str | None, limit: int, state_url: str | None, as_json: bool) -> int:
    """List approvals, newest first (history too: no run needs to be active).

    \b
    Examples:
      sudo gatewrap approvals list --status pending
      sudo gatewrap approvals list --run gw-0123456789 --json | jq '.approvals[].id'
    """
    store = _store(state_url)
    run = _run_in_store(store, run_id)
    items = store.list(status=status, run_id=run, limit=limit)
    if as_json:
        click.echo(json.dumps({"approvals": [_brief(a) for a in items]}))
        return 0
    if not items:
        click.echo("gatewrap: no approvals" + (f" {status}" if status else "") + _of_run(store, run_id, run), err=True)
        return 0
    click.echo(render.list_header())
    for a in items:
        click.echo(render.list_row(a))
    return 0


def _brief(a: dict[str, Any]) -> dict[str, Any]:
    """An approval in ``list --json``: everything but the bodies and the review token."""
    out = render.as_json({k: v for k, v in a.items() if k not in ("body", "orig_body", "token", "review_path")})
    return out


@approvals.command("show", context_settings=CONTEXT)
@click.argument("approval_id", metavar="ID")
@_common
def show(approval_id: str, state_url: str | None, as_json: bool) -> int:
    """Print the exact request held (credentials redacted), its facts and, after an edit,
    the diff from what the agent sent. The version and digest printed are what a
    decision with --version/--digest names.

    \b
    Example:
      sudo gatewrap approvals show ap-...
    """
    store = _store(state_url)
    a = dec.current(store, approval_id)
    if as_json:
        out = render.as_json(a)
        out["diff"] = render.diff(a) if a.get("edited") else None
        click.echo(json.dumps(out))
    else:
        click.echo(render.show(a))
    return 0


def _seen(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option("--digest", metavar="HEX",
                     help="The digest you saw (show prints it); refused if the request changed since.")(f)
    return click.option("--version", "version", type=int, metavar="N",
                        help="The version you saw (show prints it); refused if it moved since. Without "
                             "--version/--digest: the approval as it is now.")(f)


@approvals.command("approve", context_settings=CONTEXT)
@click.argument("approval_id", metavar="ID")
@_seen
@click.option("--grant", "grant", metavar="'METHOD HOST/PATH-PREFIX'",
              help="Also let this run's later requests matching METHOD on HOST under PATH-PREFIX through "
                   "without asking (the request's own host only; never other runs). Needs --for.")
@click.option("--for", "duration", metavar="DURATION", help="How long the grant holds: 90s, 30m, 2h, 1d.")
@_yes
@_common
def approve(approval_id: str, version: int | None, digest: str | None, grant: str | None, duration: str | None,
            yes: bool, state_url: str | None, as_json: bool) -> int:
    """Approve: the gate sends the held request (the edited one, if edited) once, and the
    agent gets upstream's answer. Recorded with your name ($SUDO_USER, else your login).
    On a terminal, without --digest, the request is shown first and you are asked y/N.

    \b
    Examples:
      sudo gatewrap approvals approve ap-...                # shows it, asks y/N
      sudo gatewrap approvals approve ap-... --version 2 --digest 3f1c...
      sudo gatewrap approvals approve ap-... --grant 'POST mail.test/v3/' --for 30m
      sudo gatewrap approvals approve ap-... --yes          # a script: no question
    """
    if (grant is None) != (duration is None):
        raise click.UsageError("--grant and --for go together, e.g. --grant 'POST mail.test/v3/' --for 30m")
    store = _store(state_url)
    version, digest = _confirmed(store, approval_id, "approve", version, digest, yes)
    a = dec.decide(store, approval_id, "approve", by=state.decider(), version=version, digest=digest,
                   grant=(grant, duration) if grant and duration else None)
    g = f"; grant {a['grant_id']} lets later matching requests of run {a['run_id']} through" if a.get("grant_id") else ""
    _out(as_json, {"ok": True, "approval": render.as_json(a)},
         printable(f"gatewrap: approved {a['id']} (version {a['version']}): {a['method']} {a['url']} is sent once{g}"))
    return 0


@approvals.command("reject", context_settings=CONTEXT)
@click.argument("approval_id", metavar="ID")
@click.option("--reason", required=True, metavar="TEXT", callback=lambda _c, _p, v: _reason(v),
              help="Why (up to 1000 characters); the agent gets it in its 403.")
@_seen
@_yes
@_common
def reject(approval_id: str, reason: str, version: int | None, digest: str | None, yes: bool,
           state_url: str | None, as_json: bool) -> int:
    """Reject: the agent gets 403 with your reason; nothing is sent upstream. On a
    terminal, without --digest, the request is shown first and you are asked y/N.

    \b
    Examples:
      sudo gatewrap approvals reject ap-... --reason 'no mail to customers from tests'
      sudo gatewrap approvals reject ap-... --reason 'not now' --yes
    """
    store = _store(state_url)
    version, digest = _confirmed(store, approval_id, "reject", version, digest, yes)
    a = dec.decide(store, approval_id, "reject", by=state.decider(), version=version, digest=digest, reason=reason)
    _out(as_json, {"ok": True, "approval": render.as_json(a)},
         printable(f"gatewrap: rejected {a['id']}: the agent gets 403 ({reason})"))
    return 0


def _reason(text: str | None) -> str | None:
    """``--reason``, at most ``MAX_REASON`` characters (the agent gets it in a 403, the audit
    log keeps it). Raises click.BadParameter past it."""
    from .. import _gate_core as core

    if text is not None and len(text) > core.MAX_REASON:
        raise click.BadParameter(f"{len(text)} characters; give at most {core.MAX_REASON}", param_hint="--reason")
    return text


@approvals.command("edit", context_settings=CONTEXT)
@click.argument("approval_id", metavar="ID")
@_common
def edit(approval_id: str, state_url: str | None, as_json: bool) -> int:
    """Edit the held request's body and editable headers in $EDITOR, then approve or reject
    it. Credentials, Host and hop-by-hop headers, the method and the URL stay as they are.
    The edit makes a new version: a decision on the old one is refused as stale.

    \b
    Examples:
      EDITOR=nano gatewrap approvals edit ap-...        # as root
      sudo EDITOR=nano gatewrap approvals edit ap-...   # through sudo
    """
    from . import editor

    store = _store(state_url)
    a = dec.current(store, approval_id)
    if a["status"] != "pending":
        raise dec.Refused(f"refused: {a['id']} is {a['status']}, not pending: it cannot be edited", "decided")
    text = editor.to_text(a)
    edited = editor.run_editor(text)
    try:
        parsed = None if edited == text else editor.from_text(edited, a)
    except ValueError as e:
        raise dec.Refused(f"edit refused: {e}; nothing was changed", "invalid") from None
    if parsed is None or (parsed[1] == bytes(a["body"]) and parsed[0] == [tuple(h) for h in a["headers"]]):
        _out(as_json, {"ok": True, "changed": False}, f"gatewrap: {a['id']} unchanged")
        return 0
    after = dec.edit(store, a["id"], by=state.decider(), version=a["version"], digest=a["digest"],
                     headers=parsed[0], body=parsed[1])
    if as_json:
        click.echo(json.dumps({"ok": True, "changed": True, "approval": render.as_json(after),
                               "diff": render.diff(after)}))
    else:
        click.echo("\n".join(render.diff(after)))
        prefix, suffix = state.answer_hint(state.resolve_url(state_url), os.environ)
        click.echo(f"gatewrap: edited {after['id']}: now version {after['version']}; approve it with: "
                   f"{prefix} approve {after['id']} --version {after['version']} "
                   f"--digest {after['digest']}{suffix}")
    return 0


@approvals.command("grants", context_settings=CONTEXT)
@click.option("--run", "run_id", metavar="ID",
              help="Only grants of run ID: a whole id (gw-...), or a start of one run's in the store.")
@click.option("--all", "show_all", is_flag=True, help="Expired and revoked grants too.")
@_common
def grants(run_id: str | None, show_all: bool, state_url: str | None, as_json: bool) -> int:
    """List grants: a human's scoped, expiring allows, each bound to one run.

    \b
    Example:
      sudo gatewrap approvals grants --all
    """
    store = _store(state_url)
    run = _run_in_store(store, run_id)
    items = store.grants(run_id=run, active=not show_all)
    if as_json:
        click.echo(json.dumps({"grants": [render.as_json(g) for g in items]}))
    elif not items:
        click.echo("gatewrap: no grants" + ("" if show_all else " active (--all for the others)") + _of_run(store, run_id, run),
                   err=True)
    else:
        for g in items:
            click.echo(render.grant_row(g))
    return 0


@approvals.command("revoke", context_settings=CONTEXT)
@click.argument("grant_id", metavar="GRANT")
@_common
def revoke(grant_id: str, state_url: str | None, as_json: bool) -> int:
    """Revoke a grant at once: the run's next matching request is asked again.

    \b
    Example:
      sudo gatewrap approvals revoke gr-...
    """
    g = dec.revoke(_store(state_url), grant_id, by=state.decider())
    _out(as_json, {"ok": True, "grant": render.as_json(g)}, f"gatewrap: revoked {g['id']}")
    return 0


@approvals.command("prune", context_settings=CONTEXT)
@click.option("--older-than", "older_than", required=True, metavar="DURATION",
              help="Remove what was over before this long ago: N and a unit, e.g. 90s, 30m, 2h, 30d.")
@_common
def prune(older_than: str, state_url: str | None, as_json: bool) -> int:
    """Remove approvals rejected, sent, cancelled or expired more than DURATION ago (their
    bodies with them), grants revoked or expired that long ago, and ended runs with nothing
    left. Never a pending approval still to be decided, nor an approved one still to be
    sent. The audit log keeps every decision. SQLite reuses the freed pages (the file does
    not shrink; `sqlite3 FILE VACUUM` does that).

    \b
    Examples:
      sudo gatewrap approvals prune --older-than 30d
      sudo gatewrap approvals prune --older-than 12h --json
    """
    import time

    try:
        seconds = dec.seconds(older_than)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--older-than") from None
    if seconds > PRUNE_MAX_SECONDS:
        raise click.BadParameter(f"{older_than!r} is more than 100 years: give N and a unit, e.g. 90s, 30m, 2h, 30d",
                                 param_hint="--older-than")
    before = time.time() - seconds
    done = _store(state_url).prune(before)
    if as_json:
        click.echo(json.dumps({"ok": True, "before": render.when(before), **done}))
    else:
        click.echo(f"gatewrap: pruned {counted(done['approvals'], 'approval')}, {counted(done['grants'], 'grant')} and "
                   f"{counted(done['runs'], 'run')} "
                   f"over before {render.when(before)}")
    return 0


@approvals.command("serve", context_settings=CONTEXT)
@click.option("--listen", default=None, metavar="HOST:PORT",
              help="Address of the review server. Default: [review] listen in the config file, else "
                   "127.0.0.1:8377.")
@click.option("--name", "names", multiple=True, metavar="HOST",
              help="A host name the pages may be reached by (repeatable), besides the listen address; "
                   "default: [review] names in the config file (space-separated). Requests for any other "
                   "Host are refused with 421.")
@click.option("--log", "audit_log", default=None, metavar="PATH",
              help="The audit log the pages read a run's user, command and last records from. Default: "
                   "/var/log/gatewrap/audit.jsonl (give the runs' --audit-log if they used another).")
@click.option("--allow-remote", is_flag=True,
              help="Listen on a non-loopback address anyway (the pages are plain HTTP: put TLS and "
                   "authentication in front).")
@_common
def serve(listen: str | None, names: tuple[str, ...], audit_log: str | None, allow_remote: bool,
          state_url: str | None, as_json: bool) -> int:
    """Serve the review pages on the host: a list of approvals and one page per approval
    (its link holds the approval's own secret token): who asks (the run's user and command)
    for what (the full URL), the time left, the request (a JSON body re-indented, the raw one
    a click away), what the run did before asking (its last 20 audit records), and Approve,
    Grant (approve, and let the run's later requests of a method, host and path prefix
    through for a while), Edit and Reject. The form carries a CSRF token and the version and
    digest it showed; the name you type is recorded with the decision. Never reachable from
    a sandbox (it listens on the host).

    \b
    The list's address, printed at start, holds a key made anew each time: other users
    of this host can reach a loopback port, not the list. A request whose Host is not the
    listen address nor a --name is refused (421): a web page whose name was rebound to this
    address (DNS rebinding) reaches nothing. Ctrl-C ends.

    \b
    Examples:
      sudo gatewrap approvals serve
      sudo gatewrap approvals serve --listen 127.0.0.1:9000 --state postgresql://gw@db/gatewrap
    """
    from .web import ReviewServer, is_loopback, parse_listen

    config = state.load_config()
    try:
        host, port = parse_listen(listen or config.get("review", {}).get("listen") or "127.0.0.1:8377")
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--listen") from None
    if not is_loopback(host) and not allow_remote:
        raise click.BadParameter(f"{host} is not a loopback address: the review pages would be reachable from "
                                 "the network; add --allow-remote if that is meant", param_hint="--listen")
    store = state.open_store(state.resolve_url(state_url, config), create=False)
    names = names or tuple(config.get("review", {}).get("names", "").replace(",", " ").split())
    try:
        server = ReviewServer(store, (host, port), names=names, audit_log=audit_log or DEFAULT_AUDIT_LOG)
    except OSError as e:
        raise GatewrapError(f"cannot listen on {host}:{port}: {e.strerror}; choose another with --listen") from e
    url = f"{server.base}/l/{server.list_key}"
    if as_json:
        click.echo(json.dumps({"listen": server.base, "list": url, "store": store.url}))
    else:
        click.echo(f"gatewrap: review pages at {url} (store {store.url}); Ctrl-C ends", err=True)
    sys.stdout.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
