"""``gatewrap policy check`` and ``gatewrap policy test``: validate a policy file, and ask it
what it would decide for a URL, without running anything.

The decision is the policy's, as the gate judges in ``enforce`` mode: an ``http://`` URL is one
request (``Policy.decide_request``); an ``https://`` URL is first a CONNECT tunnel
(``Policy.decide_connect``), and its method and path are looked at only when the tunnel is
inspected (``inspect = true``). Before the SSRF guard, which judges the addresses a name
resolves to and so needs DNS, and before budgets, which count a run's requests.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from .errors import GatewrapError
from .policy import build_policy

#: Exit codes of ``policy test``: the decision.
EXIT_CODES = {"allow": 0, "deny": 1, "ask": 2}
DEFAULT_PORTS = {"http": 80, "https": 443}
#: RFC 9110 §5.6.2 token (a method).
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_CONTROL_OR_SPACE = re.compile(r"[\x00-\x20\x7f]")


@dataclass
class CheckResult:
    """What ``policy check`` found: the policy's summary, or the error (``ok`` False)."""

    file: str
    ok: bool
    error: str | None = None
    default: str | None = None
    mode: str | None = None
    rules: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    #: The ``[sandbox]`` table: {"ro_bind": [(path, line)], "bind": [(path, line)],
    #: "unprotect": [(path, line)], "env": [(NAME or NAME=VALUE, line)]}.
    sandbox: dict[str, list] = field(default_factory=lambda: {"ro_bind": [], "bind": [], "unprotect": [], "env": []})
    #: The protected paths of a run in ``workdir`` (:func:`gatewrap.sandbox.protect.scan`), or
    #: None when not asked.
    protected: Any = None
    workdir: str | None = None
    #: The file's top-level ``public_ranges`` (CIDR strings, as the gate normalises them).
    public_ranges: list[str] = field(default_factory=list)
    #: The ``[[secret]]``s, the policy's and the host secrets file's (:func:`secret_summary`):
    #: never a value, nor where one is read beyond its kind.
    secrets: list[dict[str, Any]] = field(default_factory=list)

    def as_record(self) -> dict[str, Any]:
        sandbox = {k: [{"path": p, "line": n} for p, n in v] for k, v in self.sandbox.items() if k != "env"}
        # names only: a value the policy sets may be a secret
        sandbox["env"] = [{"name": e.partition("=")[0], "value": "=" in e, "line": n} for e, n in self.sandbox["env"]]
        out = {"file": self.file, "valid": self.ok, "error": self.error, "default": self.default,
               "mode": self.mode, "rules": self.rules, "warnings": self.warnings, "sandbox": sandbox,
               "public_ranges": self.public_ranges, "secrets": self.secrets}
        if self.protected is not None:
            pr = self.protected
            out["protected"] = {"workdir": self.workdir, "readonly": pr.readonly,
                                "watched": sorted(pr.watched), "unprotected": pr.unprotected,
                                "outside": [{"path": p, "why": w} for p, w in pr.outside],
                                "truncated": pr.truncated}
        return out


#: What a check without a policy file names as its file (a run with only --allow/--deny).
NO_POLICY_FILE = "(no policy file)"


def check_file(path: str | None, workdir: str | None = None, unprotect: list[str] = ()) -> CheckResult:
    """Load the policy file ``path`` (None: the empty policy of a run without one); with ``workdir``, also find the protected paths a run
    there would have (its ``[sandbox] bind`` paths too; ``unprotect`` and the policy's
    ``[sandbox] unprotect`` left writable).

    Returns a :class:`CheckResult`; an invalid file is a result with ``ok`` False and
    ``error`` ``"FILE:LINE: message"`` (one line). Raises :class:`GatewrapError` (exit 125)
    if the file cannot be read.
    """
    from . import _gate_core as core

    try:
        if path is None:  # a run without --policy: the empty policy (default deny)
            path, text = NO_POLICY_FILE, ""
        else:
            with open(path, encoding="utf-8") as f:
                text = f.read()
    except UnicodeDecodeError as e:
        return CheckResult(path, False, error=f"{path}: not UTF-8 text ({e.reason} at byte {e.start})")
    except OSError as e:
        raise GatewrapError(f"cannot read policy {path}: {e.strerror or e}") from e
    try:
        policy = core.Policy.from_toml(text, path)
    except core.PolicyError as e:
        return CheckResult(path, False, error=_one_line(str(e)))
    from .sandbox import environment

    from .secrets import add_host_secrets

    try:
        for entry, line in policy.sandbox()["env"]:
            environment.parse_entry(entry, f"{path}:{line}: [sandbox] env")
        add_host_secrets(policy)  # the host's [[secret]]s; every inject names one
    except GatewrapError as e:
        return CheckResult(path, False, error=_one_line(str(e)))
    rules = policy.describe()
    res = CheckResult(path, True, default=policy.default, mode=policy.mode, rules=rules,
                      warnings=_warnings(policy.default, policy.mode, rules), sandbox=policy.sandbox(),
                      public_ranges=list(policy.public_ranges), secrets=secret_summary(policy.secrets(), rules))
    if workdir is not None:
        from .sandbox import protect

        binds = [p for p, _ in res.sandbox.get("bind", [])]
        extra = [p for p, _ in res.sandbox.get("unprotect", [])]
        try:
            res.protected = protect.scan(protect.writable_roots(workdir, binds), [*unprotect, *extra])
        except GatewrapError as e:
            res.warnings.append(f"a run in {workdir} would not start: {e}")
        res.workdir = workdir
    return res


def secret_summary(secrets: list[dict[str, Any]], rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What ``policy check`` shows of each ``[[secret]]`` (``Policy.secrets()``) and the
    ``rules`` (``Policy.describe()``) that inject it: ``{"name", "source": {"kind": "file" |
    "env" | "command"}, "placeholder_env": NAME | None, "budget": requests per run | None,
    "origin": "FILE:LINE", "rules": [{"rule": id, "host": pattern, "place": "header
    authorization" | "header NAME" | "query NAME"}]}``, as ``gatewrap secrets list --json``
    has it without the source's path, variable or command (root's business: ``sudo gatewrap
    secrets list`` shows them). Never a value."""
    return [{"name": d["name"], "source": {"kind": d["source"][0]}, "placeholder_env": d["placeholder_env"],
             "budget": d["budget"], "origin": d["origin"],
             "rules": [{"rule": r["id"], "host": r["host"], "place": r["inject"][1]}
                       for r in rules if r.get("inject") and r["inject"][0] == d["name"]]}
            for d in secrets]


def _warnings(default: str, mode: str, rules: list[dict[str, Any]]) -> list[str]:
    """What a valid policy does that its author may not expect."""
    warnings = []
    if default == "allow" and not any(r["action"] in ("deny", "ask") for r in rules):
        warnings.append('this policy allows everything (default = "allow" and no deny rule)')
    if mode == "report":
        warnings.append('mode = "report": the gate allows every request and only records what '
                        "enforce mode would have denied")
    for r in rules:
        if (r["methods"] or r["path"]) and not r["inspect"] and "https" in (r["schemes"] or ["https"]):
            what = "is skipped on them" if r["action"] == "allow" else "denies the whole tunnel"
            warnings.append(f"rule {r['id']} matches methods or paths but has no `inspect = true`: https "
                            f"requests travel in CONNECT tunnels that hide both, so this {r['action']} rule "
                            f'{what}; add `inspect = true`, or `schemes = ["http"]` if it is meant for http only')
    return warnings


def rule_extras(r: dict[str, Any]) -> str:
    """The keys of a rule beyond host, ports and action: ``methods POST,PUT  path /v1  inspect
    inject [secret github] into header authorization`` (a secret by name, never its value)."""
    parts = []
    if r.get("methods"):
        parts.append("methods " + ",".join(r["methods"]))
    if r.get("path"):
        parts.append(f"path {r['path']}")
    if r.get("schemes"):
        parts.append("schemes " + ",".join(r["schemes"]))
    for key in ("inspect", "allow_private"):
        if r.get(key):
            parts.append(key)
    if r.get("budget"):
        parts.append(f"budget {r['budget'][0]} per {r['budget'][1]}")
    if r.get("timeout"):
        parts.append(f"timeout {r['timeout']}")
    if r.get("inject"):
        parts.append(f"inject [secret {r['inject'][0]}] into {r['inject'][1]}")
    return "  ".join(parts)


def check_lines(res: CheckResult) -> list[str]:
    """The text summary of a valid policy (empty for an invalid one)."""
    if not res.ok:
        return []
    n = len(res.rules)
    lines = [f"{res.file}: valid",
             f"default {res.default}, mode {res.mode}, {n} rule{'' if n == 1 else 's'} (first match decides)"]
    if res.rules:
        rows = [(r["id"], r["host"], ",".join(map(str, r["ports"])), r["action"], rule_extras(r))
                for r in res.rules]
        widths = [max(len(row[i]) for row in rows) for i in range(4)]
        for row in rows:
            lines.append(("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)) + f"  {row[4]}").rstrip())
    if res.public_ranges:
        lines.append(f"public_ranges: {', '.join(res.public_ranges)} (the SSRF guard counts these addresses as "
                     "public, as --public-range)")
    if res.secrets:
        lines.append("secrets the gate injects where a rule says (by name; sudo gatewrap secrets list shows where "
                     "each is read, secrets check whether it resolves):")
        for d in res.secrets:
            origin = d["origin"]
            where = f"line {origin[len(res.file) + 1:]}" if origin.startswith(res.file + ":") else origin
            extras = (f"  placeholder in ${d['placeholder_env']}" if d["placeholder_env"] else "") + (
                f"  budget {d['budget']} per run" if d["budget"] is not None else "")
            lines.append(f"  {d['name']}  from_{d['source']['kind']}{extras}  ({where})")
            lines += [f"    {r['rule']}  {r['host']}  into {r['place']}" for r in d["rules"]] or [
                "    (no rule injects it: never read)"]
    shown = [(key, p, n) for key in ("ro_bind", "bind", "unprotect") for p, n in res.sandbox.get(key, [])]
    if shown:
        lines.append("sandbox: host paths shown in the jail, besides the system (read-only) and the workdir")
        lines += [f"  {key} {p}  (line {n})" for key, p, n in shown]
    if res.sandbox["env"]:
        lines.append("sandbox: environment variables the agent gets by name, besides PATH, LANG, LC_*, TZ, TERM, "
                     "HOME and gatewrap's (=…: a value the policy sets, not shown; else the caller's)")
        lines += [f"  env {entry.partition('=')[0]}{'=…' if '=' in entry else ''}  (line {n})"
                  for entry, n in res.sandbox["env"]]
    pr = res.protected
    if pr is not None:
        lines.append(f"protected in {res.workdir} and the bind paths (read-only for the agent; one it makes is "
                     "moved aside after the run):")
        lines += [f"  {_shown(p)}" for p in pr.readonly] or ["  (none yet)"]
        absent = [p for p, ident in sorted(pr.watched.items()) if ident is None]
        if absent:
            lines.append(f"  + {len(absent)} absent now, moved aside if the run makes them (e.g. {_shown(absent[0])})")
        from .sandbox.protect import EDITOR_NAMES

        lines.append(f"  + any {', '.join(EDITOR_NAMES)} or repository (.git) the run makes in them, moved aside "
                     "after it (NAME.gatewrap-RUN: review it, then rename it back to use it)")
        lines += [f"  left writable: {_shown(p)}" for p in pr.unprotected]
        lines += [f"  not protected: {_shown(p)} ({why})" for p, why in pr.outside]
        if pr.truncated:
            lines.append("  (the walk stopped at its bound: deeper repositories are not protected)")
    return lines


def _shown(path: str) -> str:
    """A path on one line: control characters (a newline in a name) escaped."""
    return path if path.isprintable() else repr(path)


@dataclass
class Decision:
    """What ``policy test`` decided for one request."""

    decision: str
    reason: str
    rule: dict[str, Any] | None
    host: str
    port: int
    method: str
    url: str
    given_host: str
    mode: str
    scheme: str = "http"
    path: str = "/"
    #: ``"request"`` (decided on method and path) or ``"tunnel"`` (an https CONNECT, decided
    #: on host and port only: not inspected, or denied before inspection).
    stage: str = "request"
    userinfo: dict[str, Any] | None = None

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.decision]

    def as_record(self) -> dict[str, Any]:
        return {"decision": self.decision, "reason": self.reason, "rule": self.rule, "host": self.host,
                "port": self.port, "method": self.method, "url": self.url, "mode": self.mode,
                "scheme": self.scheme, "path": self.path, "stage": self.stage, "userinfo": self.userinfo}


def decide_url(path: str, method: str, url: str, allow: list[str], deny: list[str]) -> Decision:
    """Decide on ``METHOD URL`` with the policy file ``path`` plus ``--allow``/``--deny`` rules
    (evaluated first, as in ``gatewrap run``).

    Raises :class:`GatewrapError` (exit 125): unreadable or invalid policy, bad flag, a
    method that is not an HTTP token, a URL that is not ``http``/``https`` with a valid host
    and port.
    """
    from . import _gate_core as core

    if not _TOKEN.fullmatch(method):
        raise GatewrapError(f"invalid method {method!r}: not an HTTP token (e.g. GET, POST)")
    scheme, host, port, userinfo, shown, target = _parse_url(url)
    policy = build_policy(path, list(allow), list(deny))
    stage = "request"
    try:
        if scheme == "https":
            action, reason, rule_id, inspect = policy.decide_connect(host, port)
            stage = "tunnel" if action != "allow" or not inspect else "request"
        if stage == "request":
            action, reason, rule_id = policy.decide_request(host, port, scheme, method, target)
    except core.PolicyError as e:
        raise GatewrapError(f"URL {shown!r}: {e}") from e
    rule = next((r for r in policy.describe() if r["id"] == rule_id), None) if rule_id else None
    return Decision(action, reason, rule, _canonical(core, host), port, method, shown,
                    given_host=host, mode=policy.mode, scheme=scheme, path=target, stage=stage,
                    userinfo=userinfo)


def decision_lines(d: Decision) -> list[str]:
    """``deny  GET https://x.test/  (policy: default deny)`` and notes on how it was reached."""
    lines = [f"{d.decision:<6}{d.method} {d.url}  ({d.reason})"]
    shown = f"[{d.host}]" if ":" in d.host else d.host
    if d.given_host != d.host:
        lines.append(f"  host {d.given_host} is matched as {d.host}")
    if d.rule is not None:
        r = d.rule
        where = f"line {r['line']}" if r.get("line") else "command line"
        ports = ",".join(map(str, r["ports"])) + (" (no port given)" if r["ports_default"] else "")
        extra = rule_extras(r).replace("  ", ", ")
        extra = f", {extra}" if extra else ""
        lines.append(f"  rule {r['id']} ({where}): host {r['host']}, ports {ports}, {r['action']}{extra}")
    elif d.reason.endswith("default " + d.decision):
        lines.append(f"  no rule matched {shown}:{d.port}")
    if d.scheme == "https" and d.stage == "tunnel":
        lines.append("  https: decided on the CONNECT tunnel (host and port); method and path are seen only "
                     "when a rule inspects it (inspect = true)")
    elif d.scheme == "https":
        lines.append("  https: the tunnel is inspected; this request was decided on its method and path")
    if d.decision == "ask":
        lines.append("  ask: a breakpoint; the gate holds the request until a human answers (gatewrap approvals) or its timeout denies it")
    if d.userinfo is not None:
        pw = " and a password" if d.userinfo["password"] else ""
        lines.append(f"  userinfo (user {d.userinfo['user']!r}{pw}) is ignored for matching")
    if d.mode == "report":
        lines.append("  mode = report: the gate would let it through and record what enforce decides")
    if d.decision == "allow":
        lines.append("  policy decision only: the SSRF guard may still refuse the addresses the name resolves to")
    return lines


def _parse_url(url: str) -> tuple[str, str, int, dict[str, Any] | None, str, str]:
    """``(scheme, host, port, userinfo, url to show, request target)``; the password is masked
    in the shown URL; the target is the path (``/`` when empty) and query, as sent."""
    if _CONTROL_OR_SPACE.search(url):
        raise GatewrapError(f"URL {url!r}: contains a space or control character")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise GatewrapError(f"URL {url!r}: {e}") from e
    if parts.scheme not in DEFAULT_PORTS:
        raise GatewrapError(f"URL {url!r}: give an http:// or https:// URL, e.g. https://example.com/")
    if "\\" in parts.netloc:
        raise GatewrapError(f"URL {url!r}: backslash in the host part (clients disagree on where the host ends)")
    host = parts.hostname
    if not host:
        raise GatewrapError(f"URL {url!r}: no host")
    if port is None:
        port = DEFAULT_PORTS[parts.scheme]
    elif port == 0:
        raise GatewrapError(f"URL {url!r}: port 0 is not a destination (1-65535)")
    userinfo = None
    shown = url
    if "@" in parts.netloc:
        userinfo = {"user": parts.username or "", "password": parts.password is not None}
        if parts.password:
            user_part = parts.netloc.rpartition("@")[0]
            shown = url.replace(user_part + "@", f"{user_part.partition(':')[0]}:***@", 1)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.scheme, host, port, userinfo, shown, target


def _canonical(core: Any, host: str) -> str:
    """The host as the policy compares it (lower case, no trailing dot, punycode, IP normalised)."""
    p = core.Policy.new("deny")
    try:
        p.add_rule(f"[{host}]" if ":" in host else host, "allow", "canonical")
    except core.PolicyError:  # the unspecified address: no rule may name it
        return host
    return p.describe()[0]["host"]


def _one_line(msg: str) -> str:
    return ": ".join(part.strip() for part in msg.splitlines() if part.strip())
