"""Shared pieces of the escape suite: the agent-side prelude, result parsing, audit checks."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

from conftest import AGENT_PYTHON, AGENT_UID, Run, gatewrap_cmd

#: Every attempt must return within this bound (seconds), measured inside the agent.
BOUND = 2.0

#: Python the agent runs before a case's code. ``attempt(step, fn)`` runs ``fn`` and prints
#: one JSON line: {"step", "errno" (name; None if it succeeded; "TIMEOUT"), "result", "elapsed"}.
PRELUDE = r'''
import ctypes, errno, json, os, socket, struct, sys, threading, time
def attempt(step, fn, *args):
    t0 = time.monotonic()
    out = {"step": step, "errno": None, "result": None}
    try:
        r = fn(*args)
        out["result"] = r if isinstance(r, (int, str, list, type(None))) else repr(r)
    except OSError as e:
        if e.errno is None:
            out["errno"] = "TIMEOUT"
        else:
            out["errno"] = errno.errorcode.get(e.errno, str(e.errno))
    out["elapsed"] = round(time.monotonic() - t0, 6)
    print(json.dumps(out), flush=True)
    return out
def sock(family, kind, proto=0):
    s = socket.socket(family, kind, proto)
    s.settimeout(2)
    return s
V4, V6 = socket.AF_INET, socket.AF_INET6
TCP, UDP = socket.SOCK_STREAM, socket.SOCK_DGRAM
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def check(rc):
    if rc < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return rc
NR_BPF = 321
def bpf(cmd, attr):
    buf = ctypes.create_string_buffer(bytes(attr).ljust(144, b"\0"), 144)
    return check(libc.syscall(ctypes.c_long(NR_BPF), ctypes.c_long(cmd), buf, ctypes.c_long(144)))
'''


def agent_code(body: str) -> str:
    """The full ``python3 -c`` text of an agent: the prelude, then ``body``."""
    return PRELUDE + "\n" + textwrap.dedent(body)


def attempts(out: str) -> list[dict]:
    """The JSON lines an agent printed (other lines are ignored)."""
    res = []
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("{"):
            d = json.loads(line)
            if "step" in d:
                res.append(d)
    return res


def last_attempt(run_or_out) -> dict:
    out = run_or_out if isinstance(run_or_out, str) else run_or_out.stdout
    got = attempts(out)
    if not got:
        stderr = "" if isinstance(run_or_out, str) else run_or_out.stderr
        raise AssertionError(f"the agent printed no attempt; stdout={out!r} stderr={stderr!r}")
    return got[-1]


def assert_bounded(a: dict) -> None:
    assert a["elapsed"] < BOUND, f"{a['step']} took {a['elapsed']:.3f} s (a hang; bound {BOUND} s): {a}"


def kernel_records(run: Run) -> list[dict]:
    return run.records(event="direct_egress")


def assert_audited(run: Run, expect: dict | None, count: int | None = 1) -> list[dict]:
    """Every ``direct_egress`` record matches ``expect`` (field subset); ``count`` of them
    (None: at least one). ``expect=None``: there is no such record (no hook fired)."""
    recs = kernel_records(run)
    if expect is None:
        assert recs == [], f"expected no kernel denial record, got {recs}"
        return recs
    assert recs, f"no direct_egress record; expected {expect}; stderr={run.stderr}"
    for r in recs:
        assert r["decision"] == "denied"
        assert {k: r.get(k) for k in expect} == expect, f"record {r} does not match {expect}"
    if count is not None:
        assert len(recs) == count, f"expected {count} records, got {recs}"
    return recs


def hook_of(expect: dict | None, fallback: str) -> str:
    return expect["hook"] if expect and "hook" in expect else fallback


def spawn(tmp_path: Path, net, argv: list[str], *, root: bool = False, workdir: str = "/tmp",
          extra: list[str] = (), **popen) -> tuple[subprocess.Popen, Path]:
    """Start ``gatewrap run`` in the background (for tests that act during the run), with
    ``extra`` options (e.g. ``--jail none``); returns the process and its audit log path."""
    audit = tmp_path / f"audit-bg-{len(list(tmp_path.iterdir()))}.jsonl"
    cmd = gatewrap_cmd("run", "--audit-log", str(audit), "--resolver", net.dns_server, "--workdir", workdir)
    if root:
        cmd += ["--user", "root"]
    cmd += [*extra, "--", *argv]
    env = dict(os.environ)
    if not root:
        env.update(SUDO_UID=str(AGENT_UID), SUDO_GID=str(AGENT_UID))
    else:
        env.pop("SUDO_UID", None)
        env.pop("SUDO_GID", None)
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    popen.setdefault("text", True)
    return subprocess.Popen(cmd, env=env, **popen), audit


def python_argv(body: str) -> list[str]:
    return [AGENT_PYTHON, "-c", agent_code(body)]


def run_id_of(audit: Path) -> str:
    for line in audit.read_text().splitlines():
        r = json.loads(line)
        if r.get("event") == "run_start":
            return r["run"]
    raise AssertionError(f"no run_start in {audit}")


def assert_nothing_reached(net) -> None:
    """The fake internet saw no connection, datagram or DNS query."""
    assert net.access_entries() == [], net.access_entries()
    assert net.dns_queries() == [], net.dns_queries()
