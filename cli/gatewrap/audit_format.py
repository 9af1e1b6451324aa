"""How ``gatewrap audit`` prints records: a table (a terminal), JSON lines or CSV.

Every format is safe to print to a terminal: the table and CSV escape control characters
with :func:`gatewrap.text.printable`; JSON lines are printable ASCII (Python's json escapes
everything else, DEL included; a line of the log that already is passes through as written).
"""

from __future__ import annotations

import csv
import functools
import json
import re
import urllib.parse
from typing import Any, TextIO

from . import run_ids
from .text import command_line, printable

FORMATS = ("table", "json", "csv")
#: Columns of the table: (header, width); 0: the last, as wide as its cell; None: as wide as
#: what it must hold, as :func:`columns` makes it.
COLUMNS = (("TIME", 27), ("RUN", None), ("EVENT", None), ("DECISION", None), ("DESTINATION", 34), ("WHO / WHY", 0))
#: Columns of CSV, in order: the fields of gate and kernel records that say what, where, who and why.
CSV_FIELDS = ("time", "run", "event", "decision", "proto", "dst_host", "dst_ip", "dst_port", "method",
              "target", "status", "client", "pid", "uid", "comm", "cmdline", "hook", "rule", "reason", "error")
#: A line that is printable ASCII through and through (JSON whitespace included).
_PLAIN = re.compile(rb"[ -~]*\n?")
#: Cell starts a spreadsheet reads as a formula (OWASP, "CSV Injection").
_FORMULA = ("=", "+", "-", "@")


def json_line(line: bytes, rec: dict[str, Any]) -> str:
    """The record as one line of JSON: ``line`` itself when it is printable ASCII, else
    ``rec`` re-encoded (non-ASCII and controls as ``\\uXXXX``)."""
    if _PLAIN.fullmatch(line):
        return line.rstrip(b"\n").decode("ascii")
    return json.dumps(rec)


class CsvOut:
    """CSV (RFC 4180, a header row first) of :data:`CSV_FIELDS` on ``out``.

    Cells are escaped with :func:`printable` and a cell that a spreadsheet would run as a
    formula gets a leading ``'``; lists and objects are written as JSON.
    """

    def __init__(self, out: TextIO) -> None:
        self._w = csv.writer(out, lineterminator="\n")
        self._w.writerow(CSV_FIELDS)

    def write(self, rec: dict[str, Any]) -> None:
        """One row; ``pid`` and ``comm`` of a gate record are its client's (``client_pid``,
        ``client_comm``)."""
        pid, comm = process(rec)
        self._w.writerow([_cell(pid if k == "pid" else comm if k == "comm" else rec.get(k)) for k in CSV_FIELDS])


def process(rec: dict[str, Any]) -> tuple[Any, Any]:
    """``(pid, comm)`` of the process a record names: the kernel's ``pid``/``comm``, else the
    gate's ``client_pid``/``client_comm`` (the process holding the client socket); None
    where the record has none."""
    if rec.get("pid") is not None:
        return rec["pid"], rec.get("comm")
    return rec.get("client_pid"), rec.get("client_comm")


def path_of(rec: dict[str, Any]) -> str | None:
    """The path of a gate ``request`` record's ``target`` (absolute form for plain http,
    origin form inside a TLS-inspected tunnel), ``?…`` marking a query left out (it may
    carry a credential); None for other records."""
    target = rec.get("target")
    if rec.get("event") != "request" or not isinstance(target, str) or not target:
        return None
    u = urllib.parse.urlsplit(target)
    return (u.path or "/") + ("?…" if u.query else "")


def _cell(value: Any) -> str:
    if value is None:
        return ""
    text = printable(value if isinstance(value, str) else json.dumps(value))
    return "'" + text if text.startswith(_FORMULA) else text


def destination(rec: dict[str, Any]) -> str:
    """``proto host:port`` or ``proto ip:port`` of a record, with the path of a request
    (:func:`path_of`); ``unix PATH`` for a unix socket; ``-``."""
    if rec.get("event") == "unix_socket" and rec.get("path"):
        return f"unix {rec['path']}"
    host = rec.get("dst_host") or rec.get("dst_ip")
    if not host:
        return "-"
    host = f"[{host}]" if ":" in str(host) else str(host)
    port = rec.get("dst_port")
    proto = rec.get("proto", "")
    return f"{proto} {host}{f':{port}' if port is not None else ''}{path_of(rec) or ''}".strip()


def who_why(rec: dict[str, Any]) -> str:
    """Process and reason columns, merged."""
    parts = []
    if rec.get("event") == "admit":  # the allowed request's outcome follows; run_end counts that one
        parts.append(f"before the dial (counted in its {'connect' if rec.get('proto') == 'connect' else 'request'} row)")
    if rec.get("would"):
        parts.append(f"report mode: enforce would {rec['would']}")
    if rec.get("event") == "connect" and rec.get("inspected") is True:
        parts.append("TLS-inspected tunnel")
    if rec.get("count", 1) != 1:  # folded: the kernel's, the gate's denials, DNS over the record rate
        parts.append(f"×{rec['count']} attempts")
    if rec.get("event") == "protected_path" and rec.get("change") == "refused":
        parts.append(f"refused {rec.get('syscall', '?')} {rec.get('errno', '?')} on {rec.get('path')}"
                     + (f" ×{rec['count']} attempts" if rec.get("count", 1) != 1 else ""))
    if rec.get("event") == "request" and rec.get("method"):
        status = rec.get("status")
        parts.append(f"{rec['method']}{'' if status is None else f' -> {status}'}")
    pid, comm = process(rec)
    if pid is not None:
        parts.append(f"pid {pid} {comm or rec.get('cmdline') or ''}".strip())
    for key in ("reason", "error", "rule"):
        value = rec.get(key)
        if value and not any(str(value) in p for p in parts):
            parts.append(str(value))
    if rec.get("event") == "run_end":
        parts.append(
            # a container's run has no exit code of its own: only its engine knows it
            (f"exit {rec['exit_code']}: " if rec.get("exit_code") is not None else "")
            + f"{rec.get('allowed', 0)} allowed, {rec.get('denied', 0)} denied, "
            f"{rec.get('failed', 0)} failed, {rec.get('direct_egress', 0)} direct egress blocked"
            + (f", {rec['held']} held (409, waiting for approval)" if rec.get("held") else "")
            + (f", {rec['inspected']} tunnels TLS-inspected" if rec.get("inspected") else "")
            + (f", {rec['would_deny']} would be denied in enforce mode" if rec.get("would_deny") else "")
            + (f", {rec['unsent']} not sent (503: not recordable)" if rec.get("unsent") else "")
            + (f", {rec['lost_events']} kernel events lost (ring buffer full)" if rec.get("lost_events") else "")
            + (f", {rec['unrecorded_events']} kernel events not recorded" if rec.get("unrecorded_events") else "")
        )
    if rec.get("event") == "run_start" and rec.get("argv"):
        parts.append(command_line([str(a) for a in rec["argv"]]))
    return "; ".join(parts)


@functools.cache
def columns(whole_ids: bool = False) -> tuple[tuple[str, int], ...]:
    """:data:`COLUMNS` with the widths of what they must hold, known before the first row (the
    rows are printed as the log is read, before their widest is known): EVENT and DECISION as
    wide as the longest event and decision the audit schema names (``approval_cancelled``,
    ``attempted``: :func:`gatewrap.audit_schema.events`, :func:`~gatewrap.audit_schema.decisions`);
    RUN as wide as a container's whole run id when ``whole_ids`` (``--no-trunc``). A value
    the schema does not name (a cut record's) may be wider: it is shown whole, never cut."""
    from . import audit_schema

    widest = {"EVENT": max(map(len, audit_schema.events())), "DECISION": max(map(len, audit_schema.decisions())),
              "RUN": run_ids.CONTAINER_ID if whole_ids else run_ids.SHORT_ID}
    return tuple((h, max(widest[h], len(h)) if w is None else w) for h, w in COLUMNS)


def row(rec: dict[str, Any], whole_ids: bool = False) -> str:
    """One table row, control characters escaped; the run's id as :func:`run_ids.short`
    makes it (as ``gatewrap ps`` shows it), whole when ``whole_ids``."""
    run = str(rec.get("run", "-"))
    cells = [
        str(rec.get("time", "-")), run if whole_ids else run_ids.short(run), str(rec.get("event", "-")),
        str(rec.get("decision", "-")), destination(rec), who_why(rec),
    ]
    out = []
    for (_, width), cell in zip(columns(whole_ids), cells):
        cell = printable(cell)
        out.append(cell.ljust(width) if width else cell)
    return " ".join(out).rstrip()


def header(whole_ids: bool = False) -> str:
    """The table's header line."""
    return " ".join(h.ljust(w) if w else h for h, w in columns(whole_ids))
