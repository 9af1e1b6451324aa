#!/usr/bin/env python3
"""Where the time from a human's approval to upstream goes, step by step, from system calls.

Runs bench/approval_gate_latency.py (its options pass through) under ``perf trace -a`` (one
clock for every process: the deciding one, the gate's threads, the fake DNS and the fake
upstream) and splits each approval's path at the calls that mark its steps:

========================  ==================================================================
``decided``               the deciding process sends the wake datagram (after its commit)
``noticed``               a gate thread's ``recvfrom`` returns that datagram (same length)
``store``                 the gate's first store call after it (``pread64``/``pwrite64``)
``claimed``               the gate's last store write before the ``approval_approved`` record
``recorded``              that record's ``write`` (the first of 200 bytes or more)
``dns_sent``              the gate's first UDP ``sendto`` (the lookup started with the claim)
``dns_answered``          the gate's last ``recvfrom`` of a DNS answer before the send
``sent``                  the gate's ``writev`` (a kept connection) or ``connect`` upstream
``arrived``               the fake upstream's ``recvfrom`` of the request
========================  ==================================================================

The agent asks one request at a time, so the first matching call after each mark is that
approval's; a step with no match (no DNS query when the resolver's cache answered) is left
out. Prints per step (ms) the median, p90, p99 and max as JSON and writes
bench/results/approval_trace.json. ``perf trace`` slows every traced call a little (a few
µs): the total is a little above the untraced bench's.

Usage: sudo flock /tmp/gatewrap-kernel.lock .venv/bin/python bench/approval_trace.py [-n N] [--ttl S]
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CALLS = "sendto,recvfrom,connect,write,writev,pwrite64,pread64"
LINE = re.compile(r"^\s*([\d.]+) \(\s*([\d.]*)\s*(?:ms)?\): (\S+?)/(\d+)\s+(.*)$")
#: (step, from mark, to mark), as the table above names the marks.
STEPS = [
    ("decided -> noticed (the wake datagram)", "decided", "noticed"),
    ("noticed -> store (to the store's thread)", "noticed", "store"),
    ("store -> claimed (read, lookup started, claim)", "store", "claimed"),
    ("claimed -> recorded (approval_approved)", "claimed", "recorded"),
    ("noticed -> dns_sent", "noticed", "dns_sent"),
    ("dns_sent -> dns_answered (the resolver)", "dns_sent", "dns_answered"),
    ("recorded -> sent (admit, the lookup's answer)", "recorded", "sent"),
    ("sent -> arrived (the fake upstream)", "sent", "arrived"),
    ("decided -> sent (the gate's part: the bytes are in upstream's socket)", "decided", "sent"),
    ("decided -> arrived (total)", "decided", "arrived"),
]


def calls(path: str) -> list[dict]:
    """The finished calls of a ``perf trace`` output, by end time (ms): start, end, comm,
    tid, name, text (a call that blocked is the ``[continued]`` line, with its full span)."""
    out = []
    with open(path) as f:
        for line in f:
            m = LINE.match(line)
            if not m or not m.group(2):
                continue
            t, dur, comm, tid, rest = m.groups()
            name = re.match(r"(?:\.\.\. \[continued\]: )?(\w+)\(", rest)
            out.append({"start": float(t), "end": float(t) + float(dur), "comm": comm, "tid": int(tid),
                        "name": name.group(1) if name else "?", "text": rest})
    return sorted(out, key=lambda c: c["end"])


def marks(cs: list[dict]) -> list[dict[str, float]]:
    """Each approval's marks (ms on perf's clock), keyed as in the module's table."""
    deciders = {c["tid"] for c in cs if c["name"] == "sendto" and "addr_len: 0x2b" in c["text"]}
    # The gate's threads: named gate-* (perf trace sometimes misses a thread's rename, and
    # shows it as "python"), or seen receiving a wake datagram or using the store.
    tids = {c["tid"] for c in cs if c["comm"].startswith(("gate-", "approvals-"))
            or (c["tid"] not in deciders and (c["name"] in ("pread64", "pwrite64") or "size: 256)" in c["text"]))}
    gate = lambda c: c["tid"] in tids
    size = lambda c: int(m.group(1)) if (m := re.search(r"(?:count|len): (\d+)", c["text"])) else 0
    returned = lambda c: int(m.group(1)) if (m := re.search(r"= (\d+)\s*$", c["text"])) else -1

    def first(after: float, ok, within: float = 50.0) -> dict | None:
        return next((c for c in cs if after <= c["end"] <= after + within and ok(c)), None)

    out = []
    # The wake datagram: a unix sendto with a path address (addr_len 0x2b is sockaddr_un's
    # family and "/run/gatewrap/<run-id>/control.sock").
    for d in (c for c in cs if c["name"] == "sendto" and "addr_len: 0x2b" in c["text"]):
        m = {"decided": d["start"]}
        n = first(d["start"], lambda c: gate(c) and c["name"] == "recvfrom" and returned(c) == size(d))
        if not n:
            continue
        m["noticed"] = n["end"]
        store = first(n["end"], lambda c: gate(c) and c["name"] in ("pread64", "pwrite64"))
        rec = first(d["start"], lambda c: gate(c) and c["name"] == "write" and size(c) >= 200 and "fd: 2," not in c["text"])
        if not (store and rec):
            continue
        m["store"], m["recorded"] = store["start"], rec["start"]
        wrote = [c for c in cs if gate(c) and c["name"] == "pwrite64" and store["start"] <= c["end"] <= rec["start"]]
        m["claimed"] = wrote[-1]["end"] if wrote else store["end"]
        sent = first(rec["end"], lambda c: gate(c) and c["name"] in ("writev", "connect"))
        if not sent:
            continue
        m["sent"] = sent["start"]
        q = first(n["end"], lambda c: gate(c) and c["name"] == "sendto" and re.search(r"addr_len: 0x(10|1c)", c["text"]),
                  within=sent["start"] - n["end"])
        if q:
            m["dns_sent"] = q["start"]
            answers = [c for c in cs if gate(c) and c["name"] == "recvfrom" and "size: 512" in c["text"]
                       and q["start"] <= c["end"] <= sent["start"]]
            if answers:
                m["dns_answered"] = answers[-1]["end"]
        a = first(sent["start"], lambda c: c["comm"] == "python" and c["tid"] != d["tid"] and c["name"] == "recvfrom"
                  and "addr:" not in c["text"] and returned(c) > 0, within=20)
        if a:
            m["arrived"] = a["end"]
        out.append(m)
    return out


def pick(v: list[float], q: float) -> float:
    return round(v[min(len(v) - 1, int(q * len(v)))], 3)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "trace.txt")
        bench = [sys.executable, os.path.join(ROOT, "bench", "approval_gate_latency.py"), *sys.argv[1:]]
        run = subprocess.run(["perf", "trace", "-a", "-o", trace, "-e", CALLS, "--", *bench],
                             stdout=subprocess.PIPE, text=True, check=True)
        cs = calls(trace)
        ms = marks(cs)
        print(f"{len(cs)} calls traced", file=sys.stderr)
    steps = {}
    for name, a, b in STEPS:
        v = sorted(m[b] - m[a] for m in ms if a in m and b in m)
        if v:
            steps[name] = {"n": len(v), "median": pick(v, 0.5), "p90": pick(v, 0.9), "p99": pick(v, 0.99), "max": round(v[-1], 3)}
    out = {"bench": json.loads(run.stdout.strip().splitlines()[-1]), "approvals_traced": len(ms), "steps_ms": steps,
           "loadavg_1m": round(os.getloadavg()[0], 2)}
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", "approval_trace.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
