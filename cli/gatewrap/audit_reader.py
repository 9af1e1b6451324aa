"""Read the audit log (JSON lines) for ``gatewrap audit``: filter, follow, format."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from typing import Any, TextIO

from .errors import GatewrapError
from .text import printable

#: Decisions that count as a denial for ``--denied``.
DENIED = {"denied", "rejected", "expired"}
#: Columns of the table: (header, width).
COLUMNS = (("TIME", 27), ("RUN", 13), ("EVENT", 13), ("DECISION", 8), ("DESTINATION", 34), ("WHO / WHY", 0))


def records(path: str, follow: bool = False, err: TextIO | None = None) -> Iterator[dict[str, Any]]:
    """Yield records from ``path``; with ``follow``, keep waiting for new lines (like tail -f).

    Lines that are not JSON objects are reported on ``err`` with their line number and skipped.

    Raises:
        FileNotFoundError: the log does not exist (and not following).
        GatewrapError: the log cannot be read by this user (exit 125; it is root's, 0600).
    """
    err = err or sys.stderr
    while follow and not os.path.exists(path):
        time.sleep(0.2)
    try:
        f = open(path, encoding="utf-8", errors="backslashreplace")
    except PermissionError as e:
        raise GatewrapError(f"cannot read the audit log {path} ({e.strerror}): it is root's; run gatewrap "
                            "with sudo, or pass --log PATH") from e
    with f:
        n = 0
        buf = ""
        while True:
            line = f.readline()
            if not line:
                if not follow:
                    break
                time.sleep(0.2)
                continue
            buf += line
            if not buf.endswith("\n") and follow:
                continue  # a writer is mid-line
            n += 1
            text, buf = buf.strip(), ""
            if not text:
                continue
            try:
                rec = json.loads(text)
            except json.JSONDecodeError as e:
                print(f"gatewrap: {path}:{n}: not a JSON record ({e.msg}); skipped", file=err)
                continue
            if isinstance(rec, dict):
                yield rec


def matches(rec: dict[str, Any], run: str | None, denied: bool) -> bool:
    """Whether ``rec`` passes the ``--run`` and ``--denied`` filters."""
    if run is not None and rec.get("run") != run:
        return False
    if denied and rec.get("decision") not in DENIED:
        return False
    return True


def destination(rec: dict[str, Any]) -> str:
    """``proto host:port`` or ``proto ip:port`` of a record, or ``-``."""
    if rec.get("event") == "unix_socket" and rec.get("path"):
        return f"unix {rec['path']}"
    host = rec.get("dst_host") or rec.get("dst_ip")
    if not host:
        return "-"
    host = f"[{host}]" if ":" in str(host) else str(host)
    port = rec.get("dst_port")
    proto = rec.get("proto", "")
    return f"{proto} {host}{f':{port}' if port is not None else ''}".strip()


def who_why(rec: dict[str, Any]) -> str:
    """Process and reason columns, merged."""
    parts = []
    if rec.get("would"):
        parts.append(f"report mode: enforce would {rec['would']}")
    if rec.get("event") == "connect" and rec.get("inspected") is True:
        parts.append("TLS-inspected tunnel")
    if rec.get("event") in ("direct_egress", "unix_socket") and rec.get("count", 1) != 1:
        parts.append(f"×{rec['count']} attempts")
    if rec.get("pid") is not None:
        parts.append(f"pid {rec['pid']} {rec.get('comm') or rec.get('cmdline') or ''}".strip())
    for key in ("reason", "error", "rule"):
        value = rec.get(key)
        if value and not any(str(value) in p for p in parts):
            parts.append(str(value))
    if rec.get("event") == "run_end":
        parts.append(
            f"exit {rec.get('exit_code')}: {rec.get('allowed', 0)} allowed, {rec.get('denied', 0)} denied, "
            f"{rec.get('failed', 0)} failed, {rec.get('direct_egress', 0)} direct egress blocked"
            + (f", {rec['inspected']} tunnels TLS-inspected" if rec.get("inspected") else "")
            + (f", {rec['would_deny']} would be denied in enforce mode" if rec.get("would_deny") else "")
        )
    if rec.get("event") == "run_start" and rec.get("argv"):
        parts.append(" ".join(map(str, rec["argv"])))
    return "; ".join(parts)


def row(rec: dict[str, Any]) -> str:
    """One table row, control characters escaped."""
    cells = [
        str(rec.get("time", "-")), str(rec.get("run", "-")), str(rec.get("event", "-")),
        str(rec.get("decision", "-")), destination(rec), who_why(rec),
    ]
    out = []
    for (_, width), cell in zip(COLUMNS, cells):
        cell = printable(cell)
        out.append(cell.ljust(width) if width else cell)
    return " ".join(out).rstrip()


def header() -> str:
    """The table's header line."""
    return " ".join(h.ljust(w) if w else h for h, w in COLUMNS)
