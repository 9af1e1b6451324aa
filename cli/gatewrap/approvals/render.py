"""How approvals, grants and runs are shown: text for a terminal (every value from the agent
escaped with :func:`gatewrap.text.printable`) and JSON objects (bytes as base64).

An approval is the dict ``ApprovalStore.get`` returns (APPROVALS.md: every column of the
``approvals`` table, ``headers`` as ``[[name, value], ...]``, ``body`` as bytes,
``body_truncated``, ``review_path``).
"""

from __future__ import annotations

import base64
import datetime as dt
import difflib
import json
import urllib.parse
from typing import Any

from ..text import printable

#: Columns of ``approvals list``: (header, width; 0 = the rest of the line).
LIST_COLUMNS = (("ID", 23), ("STATUS", 9), ("RUN", 13), ("EXPIRES", 20), ("REQUEST", 0))


def when(t: float | None) -> str | None:
    """A Unix time (seconds) as RFC 3339 UTC with ``Z``, seconds precision; None stays None."""
    if t is None:
        return None
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def body_text(body: bytes) -> str:
    """``body`` as text for a terminal: UTF-8 (other bytes as ``\\xNN``), each line escaped,
    line breaks kept."""
    text = body.decode("utf-8", errors="surrogateescape")
    return "\n".join(printable(line) for line in text.split("\n"))


def request_lines(method: str, url: str, headers: list[Any], body: bytes) -> list[str]:
    """The request as it would go upstream, one list item per line: the request line
    (origin-form), ``Host`` and the headers in order, an empty line, the body. Escaped."""
    u = urllib.parse.urlsplit(url)
    target = (u.path or "/") + (f"?{u.query}" if u.query else "") if u.scheme in ("http", "https") else url
    lines = [printable(f"{method} {target} HTTP/1.1")]
    if u.netloc and not any(str(n).lower() == "host" for n, _ in headers):
        lines.append(printable(f"Host: {u.netloc}"))
    lines += [printable(f"{n}: {v}") for n, v in headers]
    lines.append("")
    if body:
        lines += body_text(body).split("\n")
    return lines


def pretty_body(body: bytes) -> str | None:
    """``body`` re-indented for reading when it is a JSON object or array (RFC 8259, UTF-8):
    two spaces a level, non-ASCII kept, every line escaped as :func:`body_text` does; None
    for anything else (shown as it is). What is sent stays the raw body."""
    text = body.lstrip()[:1]
    if text not in (b"{", b"["):
        return None
    try:
        doc = json.loads(body.decode("utf-8"), object_pairs_hook=_no_key_twice, parse_float=_float_as_written,
                         parse_int=_int_as_written, parse_constant=_not_json)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return body_text(json.dumps(doc, indent=2, ensure_ascii=False).encode("utf-8"))


# The body is the agent's: its re-indented form must say what the raw bytes say, or the
# human approves what is not sent. Where it could not, pretty_body gives None (the raw
# body is shown): a key twice (servers differ on which one counts, RFC 8259 §4), a number
# that would be written back otherwise (1e2 as 100.0, digits beyond a double's), NaN and
# Infinity (not JSON).

def _no_key_twice(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("a key given twice")
    return out


def _float_as_written(s: str) -> float:
    f = float(s)
    if json.dumps(f) != s:
        raise ValueError(f"{s} would be shown otherwise")
    return f


def _int_as_written(s: str) -> int:
    i = int(s)
    if str(i) != s:
        raise ValueError(f"{s} would be shown otherwise")
    return i


def _not_json(s: str) -> None:
    raise ValueError(f"{s} is not JSON")


def time_left(deadline: float, now: float) -> str:
    """The time from ``now`` to ``deadline`` (Unix seconds) as ``1 h 02 min``, ``4 min 05 s``
    or ``12 s``; ``none (past the deadline)`` when it has passed."""
    left = int(deadline - now)
    if left <= 0:
        return "none (past the deadline)"
    h, rest = divmod(left, 3600)
    m, s = divmod(rest, 60)
    if h:
        return f"{h} h {m:02d} min"
    return f"{m} min {s:02d} s" if m else f"{s} s"


def show(a: dict[str, Any]) -> str:
    """``approvals show``: the facts, the exact request, and after an edit the diff from the
    agent's original."""
    facts = [
        ("approval", a["id"]), ("status", a["status"]), ("run", a["run_id"]), ("rule", a["rule"]),
        ("asked", when(a["created"])), ("expires", when(a["deadline"])), ("version", a["version"]),
        ("digest", a["digest"]), ("hold", a["hold"]),
        ("grants", "allowed" if a.get("grants_allowed") else "forbidden by the rule"),
    ]
    if a.get("decided_by"):
        facts.append(("decided", f"{a['decided_by']} at {when(a.get('decided_at'))}"))
    if a.get("reason"):
        facts.append(("reason", a["reason"]))
    if a.get("grant_id"):
        facts.append(("grant", a["grant_id"]))
    if a.get("sent_at"):
        facts.append(("sent", f"{when(a['sent_at'])}, upstream answered {a.get('upstream_status')}"))
    if a.get("waiters", 0) > 1:
        facts.append(("waiting", f"{a['waiters']} identical requests share this approval"))
    out = [f"{k + ':':10} {printable(str(v))}" for k, v in facts]
    out += ["", "request (credentials redacted):", *("  " + ln for ln in
            request_lines(a["method"], a["url"], a["headers"], a["body"]))]
    if a.get("body_truncated"):
        out.append(f"  [body truncated: {a['body_len']} bytes in all, sha256 {a['body_digest']}]")
    if a.get("edited"):
        out += ["", "edited: the diff from the agent's request:", *("  " + ln for ln in diff(a))]
    return "\n".join(out)


def diff(a: dict[str, Any]) -> list[str]:
    """Unified diff (difflib) of the agent's original request to the current one."""
    before = request_lines(a["method"], a["url"], a.get("orig_headers") or a["headers"],
                           a["body"] if a.get("orig_body") is None else a["orig_body"])
    after = request_lines(a["method"], a["url"], a["headers"], a["body"])
    return [ln.rstrip("\n") for ln in difflib.unified_diff(before, after, "agent", "edited", lineterm="")]


def list_header() -> str:
    """The header row of ``approvals list``."""
    return "".join(f"{h:{w}} " if w else h for h, w in LIST_COLUMNS)


def list_row(a: dict[str, Any]) -> str:
    """One row of ``approvals list``."""
    cells = (a["id"], a["status"], a["run_id"], when(a["deadline"]) or "",
             printable(f"{a['method']} {a['url']} (rule {a['rule']})"))
    return "".join(f"{c:{w}} " if w else c for c, (_, w) in zip(cells, LIST_COLUMNS))


def grant_row(g: dict[str, Any]) -> str:
    """One line of ``approvals grants``."""
    state = (f"revoked {when(g['revoked'])} by {g.get('revoked_by')}" if g.get("revoked")
             else f"until {when(g['expires'])}")
    return printable(f"{g['id']}  {g['run_id']}  {g['method']} {g['host']}{g['path_prefix']}  {state}, "
                     f"used {g.get('uses', 0)}x, by {g.get('created_by')} (from {g.get('approval_id')})")


#: The store's fields that are times (Unix seconds there), of approvals, grants and runs.
TIME_FIELDS = frozenset({"created", "deadline", "decided_at", "sent_at", "expires", "revoked", "started", "ended"})


def as_json(a: dict[str, Any]) -> dict[str, Any]:
    """An approval (or grant, run) as a JSON-ready dict: each bytes value as
    ``<name>_base64``, plus ``<name>`` as text when it is valid UTF-8 (else null); the
    times (:data:`TIME_FIELDS`) as RFC 3339 UTC (:func:`when`), as the audit log and the
    rest of the CLI write them."""
    out: dict[str, Any] = {}
    for k, v in a.items():
        if k in TIME_FIELDS and isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = when(v)
        elif isinstance(v, (bytes, bytearray, memoryview)):
            raw = bytes(v)
            out[k + "_base64"] = base64.b64encode(raw).decode("ascii")
            try:
                out[k] = raw.decode("utf-8")
            except UnicodeDecodeError:
                out[k] = None
        elif isinstance(v, tuple):
            out[k] = list(v)
        else:
            out[k] = v
    return out
