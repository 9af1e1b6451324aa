"""Raw requests to the gate from inside a sandbox: bytes written by hand on a socket.

Clients (curl, requests) clean up what they send; an attacker does not. :func:`agent_code`
gives the Python source of an agent that, for each case, opens a TCP connection to the
gate (``127.0.0.1:3128``), writes the case's bytes as they are, reads the response head
and its ``Content-Length`` body, and prints one JSON line::

    {"id": str, "client": "127.0.0.1:PORT", "status": int | None, "head": str, "body": str}

``client`` is the connection's own address, which the gate writes in the audit record's
``client`` field, so each answer is matched with its record (:func:`record_of`).
"""

from __future__ import annotations

import json

#: Python source for agents' code: ``answer(s)`` reads one response from the socket ``s``,
#: its head up to the blank line (a byte at a time, so the next response on a kept-alive
#: connection stays unread) and its ``Content-Length`` body; returns (status line, body bytes).
READ_ANSWER = r'''
def answer(s):
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        c = s.recv(1)
        if not c:
            break
        head += c
    lines = head.decode("latin-1").split("\r\n")
    n = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            n = int(value.strip())
    body = b""
    while len(body) < n:
        c = s.recv(n - len(body))
        if not c:
            break
        body += c
    return lines[0], body
'''

_AGENT = r'''
import json, socket
CASES = json.loads({cases!r})
{read_answer}
for case_id, raw in CASES:
    out = {{"id": case_id, "client": None, "status": None, "head": "", "body": ""}}
    try:
        s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
        out["client"] = "%s:%d" % s.getsockname()[:2]
        s.sendall(raw.encode("latin-1"))
        line, body = answer(s)
        s.close()
        parts = line.split(" ")
        out["head"] = line
        out["status"] = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
        out["body"] = body.decode("utf-8", "replace")
    except OSError as e:
        out["error"] = repr(e)
    print(json.dumps(out), flush=True)
'''


def agent_code(cases: list[tuple[str, str]]) -> str:
    """Source of an agent that sends each ``(id, request)`` (a str of latin-1 bytes) on a
    connection of its own, one after the other, and prints one JSON line per case."""
    return _AGENT.format(cases=json.dumps(cases), read_answer=READ_ANSWER)


def get(target: str, host: str | None = None, *, headers: str = "") -> str:
    """An absolute-form GET of ``target`` with ``Host: host`` (omitted when None)."""
    host_line = "" if host is None else f"Host: {host}\r\n"
    return f"GET {target} HTTP/1.1\r\n{host_line}{headers}Connection: close\r\n\r\n"


def connect(authority: str) -> str:
    """A CONNECT to ``authority`` (host:port), with a Host header naming the same."""
    return f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n"


def results(stdout: str) -> dict[str, dict]:
    """The agent's JSON lines, by case id."""
    return {r["id"]: r for r in map(json.loads, stdout.splitlines()) if r.get("id")}


def folded_record(run, decision: str, reason: str, dst_host: str | None) -> dict | None:
    """The gate's folded record (with ``count``) of repeated denials with ``reason`` (a
    prefix when it ends in ``*``) to ``dst_host``: a denial identical to an earlier one within
    a second has no record of its own (gate_core/src/gate/fold.rs)."""
    def same(r: dict) -> bool:
        why = r.get("reason", "")
        return (why.startswith(reason[:-1]) if reason.endswith("*") else why == reason) \
            and (dst_host is None or r.get("dst_host") == dst_host)
    recs = [r for r in run.audit() if "count" in r and r.get("decision") == decision and same(r)]
    return recs[0] if recs else None


def record_of(run, answer: dict) -> dict | None:
    """The one gate record (event request or connect) of the connection ``answer`` used."""
    recs = [r for r in run.audit() if r.get("client") == answer["client"] and r.get("event") in ("request", "connect")]
    assert len(recs) <= 1, recs
    return recs[0] if recs else None
