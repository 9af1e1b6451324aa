"""``gatewrap audit stats``: counts per run and the most denied destinations, in one pass."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from .audit_format import destination
from .audit_reader import DENIED
from . import run_ids
from .text import printable


@dataclass
class RunCounts:
    """One run's records, counted as its ``run_end`` counts them (runner.py, the gate's
    ``counts()``): ``allowed`` leaves out TLS-inspected tunnels (their requests count);
    ``denied`` is the gate's denials (policy, SSRF, DNS, budget; rejected and expired
    approvals); ``direct_egress`` the kernel's; ``failed`` what upstream or the client broke.
    ``held``: requests answered 409 while their approval waits (``hold = "return"``: the
    agent asks again later), which the gate records as denied and run_end counts so: not a
    refusal, so counted apart here."""

    run: str
    allowed: int = 0
    denied: int = 0
    direct_egress: int = 0
    failed: int = 0
    held: int = 0
    #: Refused with 503 before any dial: their record could not be written (``failed`` with
    #: an ``internal:`` error; run_end's ``unsent``).
    unsent: int = 0
    #: The time of its ``run_start`` record, if the log holds it.
    started: str | None = None
    #: ``exit_code`` of its ``run_end`` record; None while running (or when gatewrap died).
    exit_code: int | None = None
    ended: bool = False

    def add(self, rec: dict[str, Any]) -> None:
        """Count one record of this run."""
        event, decision = rec.get("event"), rec.get("decision")
        if event == "run_start":
            self.started = rec.get("time")
        elif event == "run_end":
            self.ended = True
            self.exit_code = rec.get("exit_code")
        elif event == "direct_egress":
            self.direct_egress += attempts(rec)
        elif event not in GATE_DECISIONS:
            return  # an admit (its request/connect record follows), a unix socket, ...
        elif decision == "allowed":
            if not (event == "connect" and rec.get("inspected") is True):
                self.allowed += 1
        elif returned(rec):
            self.held += attempts(rec)
        elif decision in DENIED:
            self.denied += attempts(rec)
        elif decision == "failed" and str(rec.get("error") or "").startswith("internal:"):
            self.unsent += 1
        elif decision == "failed":
            self.failed += 1


#: The events that are one decision of the gate each (as run_end counts them): not ``admit``,
#: written before the dial and followed by its ``request``/``connect`` record, nor
#: ``unix_socket``, which the kernel records and allows.
GATE_DECISIONS = frozenset({"request", "connect", "dns"})


#: How the reason of a held 409 begins (gate_core/src/gate/hold.rs HELD_REASON).
HELD_REASON = "ask: held for approval "


def returned(rec: dict[str, Any]) -> bool:
    """Whether a gate record is a request answered 409 while its approval waits (``hold =
    "return"``, gate_core hold.rs: status 409, the approval named, the reason
    :data:`HELD_REASON`; not the 409 of a retry after the approved one was sent), whatever
    its ``decision`` says. The gate counts the same ones as ``held`` (run_end)."""
    return (rec.get("event") in ("request", "connect") and rec.get("status") == 409 and bool(rec.get("approval"))
            and str(rec.get("reason", "")).startswith(HELD_REASON))


def attempts(rec: dict[str, Any]) -> int:
    """How many attempts a record stands for: a folded record's ``count`` (the kernel folds
    identical denials, _bpf/common.bpf.c; the gate its own, gate_core/src/gate/fold.rs; the
    DNS stub counts queries over its record rate), else 1."""
    n = rec.get("count", 1)
    return n if isinstance(n, int) and n > 0 else 1


#: Most distinct denied destinations counted one by one; denials to further ones are counted
#: together (``other_denied``), so a hostile log (a DNS tunnel's unique names) cannot make
#: the count's memory grow without bound.
MAX_DESTINATIONS = 100_000


@dataclass
class Stats:
    """Per-run counts (in order of first record), denied destinations with their counts (the
    first :data:`MAX_DESTINATIONS` distinct ones) and the denials to destinations beyond them."""

    runs: dict[str, RunCounts] = field(default_factory=dict)
    denied_to: Counter[str] = field(default_factory=Counter)
    other_denied: int = 0

    def add(self, rec: dict[str, Any]) -> None:
        """Count one record. A record of no run (a ``checkpoint``: the chain's, not a run's)
        is no row of its own."""
        if "run" not in rec:
            return
        run = str(rec["run"])
        counts = self.runs.get(run)
        if counts is None:
            counts = self.runs[run] = RunCounts(run)
        counts.add(rec)
        if rec.get("decision") in DENIED and not returned(rec):
            dest = destination(rec)
            if dest in self.denied_to or len(self.denied_to) < MAX_DESTINATIONS:
                self.denied_to[dest] += attempts(rec)
            else:
                self.other_denied += attempts(rec)

    def as_record(self, top: int) -> dict[str, Any]:
        """``{"runs": [RunCounts...], "top_denied": [{"destination", "count"}...] (``top`` of them),
        "other_denied": N}`` (denials to destinations beyond :data:`MAX_DESTINATIONS`)."""
        return {"runs": [asdict(c) for c in self.runs.values()],
                "top_denied": [{"destination": d, "count": n} for d, n in self.denied_to.most_common(top)],
                "other_denied": self.other_denied}

    def lines(self, top: int, whole_ids: bool = False) -> list[str]:
        """The two tables, for a terminal (values escaped); run ids as :func:`run_ids.shown`
        makes them, the column as wide as its widest."""
        shown = run_ids.shown(list(self.runs), whole_ids)
        width = max([14, *(len(printable(r)) for r in shown.values())])
        out = [f"{'RUN':<{width}} {'ALLOWED':>8} {'DENIED':>8} {'DIRECT':>8} {'FAILED':>8} {'UNSENT':>8} {'HELD':>8}  STATUS"]
        for c in self.runs.values():
            status = f"exit {c.exit_code}" if c.exit_code is not None else ("ended" if c.ended else "running or died")
            out.append(f"{printable(shown[c.run]):<{width}} {c.allowed:>8} {c.denied:>8} {c.direct_egress:>8} {c.failed:>8} "
                       f"{c.unsent:>8} {c.held:>8}  {status}")
        out += ["", f"{'DENIED':>8}  DESTINATION (top {top})"]
        out += [f"{n:>8}  {printable(d)}" for d, n in self.denied_to.most_common(top)] or ["       0  -"]
        if self.other_denied:
            out.append(f"{self.other_denied:>8}  (to destinations beyond the first {MAX_DESTINATIONS} distinct ones)")
        return out


def stats(records: Iterable[dict[str, Any]]) -> Stats:
    """Count ``records`` (any iterable; read once)."""
    s = Stats()
    for rec in records:
        s.add(rec)
    return s
