"""``gatewrap policy check`` and ``gatewrap policy test``: validate a policy file, and ask it
what it would decide for a URL, without running anything.

The decision is the policy's (:meth:`Policy.decide`, as the gate judges in ``enforce`` mode),
before the SSRF guard, which judges the addresses a name resolves to and so needs DNS.
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

    def as_record(self) -> dict[str, Any]:
        return {"file": self.file, "valid": self.ok, "error": self.error, "default": self.default,
                "mode": self.mode, "rules": self.rules, "warnings": self.warnings}


def check_file(path: str) -> CheckResult:
    """Load the policy file ``path``.

    Returns a :class:`CheckResult`; an invalid file is a result with ``ok`` False and
    ``error`` ``"FILE:LINE: message"`` (one line). Raises :class:`GatewrapError` (exit 125)
    if the file cannot be read.
    """
    from . import _gate_core as core

    try:
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
    rules = policy.describe()
    warnings = []
    if policy.default == "allow" and not any(r["action"] == "deny" for r in rules):
        warnings.append('this policy allows everything (default = "allow" and no deny rule)')
    if policy.mode == "report":
        warnings.append('mode = "report": the gate allows every request and only records what '
                        "enforce mode would have denied")
    return CheckResult(path, True, default=policy.default, mode=policy.mode, rules=rules, warnings=warnings)


def check_lines(res: CheckResult) -> list[str]:
    """The text summary of a valid policy (empty for an invalid one)."""
    if not res.ok:
        return []
    n = len(res.rules)
    lines = [f"{res.file}: valid",
             f"default {res.default}, mode {res.mode}, {n} rule{'' if n == 1 else 's'} (first match decides)"]
    if res.rules:
        rows = [(r["id"], r["host"], ",".join(map(str, r["ports"])), r["action"],
                 "allow_private" if r["allow_private"] else "") for r in res.rules]
        widths = [max(len(row[i]) for row in rows) for i in range(4)]
        for row in rows:
            lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()
                         + (f"  {row[4]}" if row[4] else ""))
    return lines


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
    userinfo: dict[str, Any] | None = None

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.decision]

    def as_record(self) -> dict[str, Any]:
        return {"decision": self.decision, "reason": self.reason, "rule": self.rule, "host": self.host,
                "port": self.port, "method": self.method, "url": self.url, "mode": self.mode,
                "userinfo": self.userinfo}


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
    scheme, host, port, userinfo, shown = _parse_url(url)
    policy = build_policy(path, list(allow), list(deny))
    try:
        action, reason, rule_id = policy.decide(host, port)
    except core.PolicyError as e:
        raise GatewrapError(f"URL {shown!r}: {e}") from e
    rule = next((r for r in policy.describe() if r["id"] == rule_id), None) if rule_id else None
    return Decision(action, reason, rule, _canonical(core, host), port, method, shown,
                    given_host=host, mode=policy.mode, userinfo=userinfo)


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
        extra = ", allow_private" if r["allow_private"] else ""
        lines.append(f"  rule {r['id']} ({where}): host {r['host']}, ports {ports}, {r['action']}{extra}")
    elif d.reason.endswith("default " + d.decision):
        lines.append(f"  no rule matched {shown}:{d.port}")
    if d.userinfo is not None:
        pw = " and a password" if d.userinfo["password"] else ""
        lines.append(f"  userinfo (user {d.userinfo['user']!r}{pw}) is ignored for matching")
    if d.mode == "report":
        lines.append("  mode = report: the gate would let it through and record what enforce decides")
    if d.decision == "allow":
        lines.append("  policy decision only: the SSRF guard may still refuse the addresses the name resolves to")
    return lines


def _parse_url(url: str) -> tuple[str, str, int, dict[str, Any] | None, str]:
    """``(scheme, host, port, userinfo, url to show)``; the password is masked in the shown URL."""
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
    return parts.scheme, host, port, userinfo, shown


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
