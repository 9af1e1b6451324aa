"""``gatewrap policy suggest``: turn what one run did (typically a ``mode = "report"`` run) into a
draft policy: default deny, enforce mode, one allow rule per host with the ports it used.

The draft is TOML that ``gatewrap policy check`` accepts. What no rule can cover goes into
comments: connections the kernel refused (``direct_egress``), DNS queries to the sandbox's
stub, and requests the SSRF guard refused that no rule for the name can open (metadata,
embedded IPv4). A name the guard refused for a private-range address (a company mirror on
10.x) gets its rule with ``allow_private = true``; an address, a rule naming it.
"""

from __future__ import annotations

import json
import ipaddress
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .audit_stats import attempts
from .errors import GatewrapError
from .text import printable

#: Gate events that name a destination the policy decided on.
GATE_EVENTS = ("request", "connect")
#: Reasons of gate records that are not policy decisions on a destination (malformed
#: requests, limits): they suggest no rule.
NOT_A_DESTINATION = ("protocol:", "limit:")
#: Reason of the gate's fixed denial of an unspecified address (0.0.0.0, ::): no rule can
#: allow it (``policy check`` refuses one), so it goes into a comment, never a rule.
UNSPECIFIED = "policy: unspecified address"
#: Address classes (the guard's reason ``ssrf: <class> address <ip>``) a rule opens: with
#: ``allow_private = true`` for a name, by naming the address for a literal
#: (gate_core/src/policy/ssrf/mod.rs ``Class::allow_private_covers``).
ALLOW_PRIVATE_COVERS = frozenset({"loopback", "private", "link-local", "cgnat", "documentation", "benchmarking",
                                  "reserved"})


@dataclass
class HostUse:
    """What the run sent to one host: ports, methods, and denials by the policy."""

    ports: set[int] = field(default_factory=set)
    methods: Counter[str] = field(default_factory=Counter)
    denied: Counter[str] = field(default_factory=Counter)
    #: The SSRF guard refused the name for a private-range address: its rule needs
    #: ``allow_private = true``.
    private: bool = False

    @property
    def requests(self) -> int:
        return sum(self.methods.values())


@dataclass
class Suggestion:
    """The draft: hosts to allow, and what goes into comments only."""

    run: str
    hosts: dict[str, HostUse]
    ssrf: Counter[str]
    direct: Counter[str]
    dns: Counter[str]
    unspecified: Counter[str] = field(default_factory=Counter)
    #: Denials folded together past the distinct ones a run folds (no host recorded).
    overflow: Counter[str] = field(default_factory=Counter)

    def rules(self) -> list[dict[str, Any]]:
        """``[{host, ports, requests, methods, allow_private}]``, sorted by host; ports sorted."""
        return [{"host": h, "ports": sorted(u.ports), "requests": u.requests, "methods": dict(sorted(u.methods.items())),
                 "allow_private": u.private}
                for h, u in sorted(self.hosts.items())]

    def toml(self) -> str:
        """The draft policy text."""
        n = sum(u.requests for u in self.hosts.values())
        out = [f"# Draft policy from run {self.run} (gatewrap policy suggest): {_count(n, 'request')} "
               f"to {_count(len(self.hosts), 'host')}.",
               "# Review it: it allows every host the run reached, on the ports it used.",
               "version = 1", 'default = "deny"', 'mode = "enforce"']
        for h, u in sorted(self.hosts.items()):
            methods = ", ".join(f"{m} {c}" for m, c in sorted(u.methods.items()))
            out += ["", f"# {h}: covers {_count(u.requests, 'request')} ({methods})"]
            for reason, c in sorted(u.denied.items()):
                out.append(f"# denied in that run: {_count(c, 'request')} ({printable(reason)})")
            out += ["[[rule]]", f"host = {json.dumps(h)}", f"ports = [{', '.join(map(str, sorted(u.ports)))}]",
                    'action = "allow"']
            if u.private:
                out.append("allow_private = true")
        notes = [("unspecified addresses, which the gate always refuses (no rule can allow them)", self.unspecified),
                 ("refused by the SSRF guard (no rule for a name opens these: only a rule naming the "
                  "address, which then reaches it)", self.ssrf),
                 ("direct egress blocked by the kernel (no rule can allow it: send it through the gate)", self.direct),
                 ("DNS queries refused by the sandbox's stub (the gate resolves what it allows)", self.dns),
                 ("denied by the gate beyond the distinct denials a run records one by one (hosts not "
                  "recorded: see the run's first records)", self.overflow)]
        for title, counter in notes:
            if counter:
                out += ["", f"# {title}:"]
                out += [f"#   {printable(what)} ({_count(c, 'time')})" for what, c in sorted(counter.items())]
        return "\n".join(out) + "\n"


def _not_global(ip: Any) -> bool:
    """Whether ``ip`` (a record's ``dst_ip``) is an address outside the public internet
    (Python's ``ipaddress`` ``is_global``: the IANA special-purpose registries, RFC 6890),
    which the guard opens to a name only with ``allow_private``."""
    try:
        return not ipaddress.ip_address(str(ip)).is_global
    except ValueError:
        return False


def suggest(records: Iterable[dict[str, Any]], run: str) -> Suggestion:
    """Collect the records of ``run`` into a :class:`Suggestion`.

    Raises :class:`GatewrapError` (exit 1) when the run has no records.
    """
    hosts: dict[str, HostUse] = defaultdict(HostUse)
    ssrf: Counter[str] = Counter()
    direct: Counter[str] = Counter()
    dns: Counter[str] = Counter()
    unspecified: Counter[str] = Counter()
    overflow: Counter[str] = Counter()
    seen = False
    for rec in records:
        if rec.get("run") != run:
            continue
        seen = True
        event, reason = rec.get("event"), str(rec.get("reason") or "")
        n = attempts(rec)  # a folded record stands for its count
        if event in GATE_EVENTS and rec.get("overflow") is True:
            overflow[reason] += n
        elif event in GATE_EVENTS and rec.get("dst_host") and isinstance(rec.get("dst_port"), int):
            if reason.startswith(NOT_A_DESTINATION):
                continue
            if reason == UNSPECIFIED:
                unspecified[_hostport(rec["dst_host"], rec["dst_port"])] += n
                continue
            ssrf_class = reason.split()[1] if reason.startswith("ssrf:") and len(reason.split()) > 1 else None
            if ssrf_class is not None and ssrf_class not in ALLOW_PRIVATE_COVERS:
                ssrf[f"{_hostport(rec['dst_host'], rec['dst_port'])}: {reason}"] += n
                continue
            use = hosts[str(rec["dst_host"])]
            if not _is_address(str(rec["dst_host"])) and (ssrf_class is not None or _not_global(rec.get("dst_ip"))):
                use.private = True  # refused for it, or reached it through --allow-private/--public-range
            use.ports.add(rec["dst_port"])
            use.methods[str(rec.get("method") or "?")] += n
            if rec.get("decision") == "denied" or rec.get("would") == "deny":
                use.denied[reason or "denied"] += n
        elif event == "direct_egress":
            dst = _hostport(rec.get("dst_ip") or "?", rec.get("dst_port") or 0)
            direct[f"{rec.get('comm') or '?'} -> {rec.get('proto') or '?'} {dst} [{rec.get('hook') or '?'}]"] += n
        elif event == "dns":
            dns[str(rec.get("dst_host") or ("queries over the record rate" if "count" in rec else "a malformed query"))] += n
    if not seen:
        raise GatewrapError(f"no audit records of run {run}; check the id with `gatewrap audit`, or pass --log PATH",
                            exit_code=1)
    return Suggestion(run, dict(hosts), ssrf, direct, dns, unspecified, overflow)


def _is_address(host: str) -> bool:
    """True for an IP literal (the gate records canonical hosts: no brackets)."""
    import ipaddress

    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _hostport(host: Any, port: Any) -> str:
    host = str(host)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"

