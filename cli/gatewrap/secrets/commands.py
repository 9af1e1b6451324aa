"""``gatewrap secrets list`` and ``gatewrap secrets check``: which rules inject which secret,
where each comes from, and whether each source resolves now. Never a value."""

from __future__ import annotations

import json
import os
from typing import Any

import click

from ..cli import CONTEXT
from ..errors import GatewrapError
from . import HOST_FILE, resolve_one


@click.group("secrets", context_settings=CONTEXT)
def secrets_group() -> None:
    """The secrets the gate injects ([[secret]] in a policy or /etc/gatewrap/secrets.toml):
    the agent holds only placeholders, never a value."""


def _table(policy_file: str | None) -> list[dict[str, Any]]:
    """One entry per secret: name, source, placeholder_env, origin, and the ids of the rules
    that inject it (with where: `header authorization`, `query key`)."""
    from ..policy import build_policy

    policy = build_policy(policy_file, [], [])
    rules = [r for r in policy.describe() if r.get("inject")]
    out = []
    for d in policy.secrets():
        kind, where = d["source"]
        out.append({"name": d["name"], "source": {"kind": kind, "from": where}, "placeholder_env": d["placeholder_env"],
                    "origin": d["origin"], "_def": d,
                    "rules": [{"rule": r["id"], "host": r["host"], "place": r["inject"][1]}
                              for r in rules if r["inject"][0] == d["name"]]})
    return out


def _show_source(s: dict[str, Any]) -> str:
    return f"from_{s['kind']} {' '.join(s['from']) if s['kind'] == 'command' else s['from']}"


_POLICY = click.option("--policy", "policy_file", type=click.Path(exists=True, dir_okay=False), metavar="FILE",
                       help=f"The policy file (its [[secret]]s and rules); {HOST_FILE}'s are always added.")
_JSON = click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")


@secrets_group.command("list", context_settings=CONTEXT)
@_POLICY
@_JSON
def secrets_list(policy_file: str | None, as_json: bool) -> int:
    """List each secret, its source and the rules that inject it (no source is read).

    Exit 0; 125 when the policy or the host's secrets file cannot be read or is invalid.

    \b
    Examples:
      sudo gatewrap secrets list --policy policy.toml
      sudo gatewrap secrets list --json
    """
    table = _table(policy_file)
    if as_json:
        click.echo(json.dumps({"secrets": [{k: v for k, v in t.items() if k != "_def"} for t in table]}))
        return 0
    for t in table:
        ph = f", placeholder in ${t['placeholder_env']}" if t["placeholder_env"] else ""
        click.echo(f"{t['name']}: {_show_source(t['source'])} ({t['origin']}){ph}")
        for r in t["rules"] or [{"rule": "(no rule injects it: never read)", "host": "", "place": ""}]:
            click.echo(f"  {r['rule']} {r['host']} {r['place']}".rstrip())
    if not table:
        click.echo("no secrets defined")
    return 0


@secrets_group.command("check", context_settings=CONTEXT)
@_POLICY
@_JSON
def secrets_check(policy_file: str | None, as_json: bool) -> int:
    """Resolve each secret's source as `gatewrap run` would (this environment; commands in /),
    and say whether it resolves; never print a value.

    Exit 0 when every secret resolves, 1 when one does not (the reason on its line), 125 when
    the policy or the host's secrets file cannot be read or is invalid.

    \b
    Examples:
      sudo gatewrap secrets check --policy policy.toml
      sudo --preserve-env=GH_TOKEN gatewrap secrets check --policy policy.toml --json
    """
    table = _table(policy_file)
    ok = True
    for t in table:
        try:
            resolve_one(t["_def"], dict(os.environ))
            t["resolves"], t["error"] = True, None
        except GatewrapError as e:
            t["resolves"], t["error"], ok = False, str(e), False
    if as_json:
        click.echo(json.dumps({"ok": ok, "secrets": [{k: v for k, v in t.items() if k != "_def"} for t in table]}))
    else:
        for t in table:
            click.echo(f"{t['name']}: {'resolves' if t['resolves'] else 'does not resolve: ' + t['error']} "
                       f"({_show_source(t['source'])}; {len(t['rules'])} rule(s) inject it)")
        if not table:
            click.echo("no secrets defined")
    return 0 if ok else 1
