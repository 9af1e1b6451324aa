"""Rotation of the audit log by size: the real writer (the extension's AuditLog, and real
runs) rotating under its lock, then ``gatewrap audit verify`` across the segments and on
each alone, a tampered or missing segment named, and ``gatewrap audit`` (with --follow) and
``gatewrap audit ship`` reading on across rotations, each line once."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from conftest import AGENT_UID, ROOT, gatewrap_cmd
from gatewrap import _gate_core as core
from gatewrap import audit_reader as ar
from test_audit_ship import _ship, needs_rsyslog, rsyslog  # noqa: F401 (a fixture)

MAX = 4096


def _verify(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(gatewrap_cmd("audit", "verify", *args), capture_output=True, text=True, timeout=300, cwd=ROOT)


@pytest.fixture
def rotating(tmp_path):
    """A log at tmp_path/audit.jsonl rotated past 4 KiB, signed by a key of its own;
    returns (log, path, verifier key)."""
    key_path = tmp_path / "keys" / "signing-key"
    path = tmp_path / "audit.jsonl"
    log = core.AuditLog(str(path), key=str(key_path), checkpoint_every=0, max_size=MAX)
    return log, path, core.audit_verifier_key(str(key_path))


def _write(log, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        log.write({"run": "gw-test", "event": "request", "decision": "allowed", "i": i, "target": f"http://x.test/{i}" + "p" * 150})


def _mine(lines) -> list[int]:
    return [r["i"] for r in map(json.loads, lines) if r.get("event") == "request"]


def test_the_segments_verify_together_and_each_alone(rotating):
    log, path, key = rotating
    _write(log, 120)
    log.checkpoint()
    segs = ar.segments(str(path))
    assert len(segs) >= 4, segs
    assert all(os.path.getsize(p) <= MAX + 1024 for _, p in segs), "a segment ends at the limit, plus its closing checkpoint"
    p = _verify("--key", key, "--json", str(path))
    assert p.returncode == 0, p.stdout + p.stderr
    rep = json.loads(p.stdout)
    assert [f["file"] for f in rep["files"]] == [s for _, s in segs] + [str(path)], "every file of the log, in order"
    assert rep["joins"] == [] and all(f["ok"] and f["unverified_tail"] == 0 for f in rep["files"]), rep
    firsts = [f["first_seq"] for f in rep["files"]]
    assert firsts == [1] + [s for s, _ in segs[1:]] + [rep["files"][-2]["last_seq"] + 1]
    # One segment alone starts mid-chain: refused, unless a partial log is asked for; then
    # its opening checkpoint vouches for where it starts and which segment it continues.
    middle = segs[2][1]
    p = _verify("--key", key, middle)
    assert p.returncode == 1 and f"{middle}: starts mid-chain at record {segs[2][0]} without the file before it" \
        in p.stdout, p.stdout
    p = _verify("--key", key, "--partial", middle)
    assert p.returncode == 0, p.stdout
    assert f"from record {segs[2][0]} (continues {os.path.basename(segs[1][1])}: a rotation, signed)" in p.stdout, p.stdout
    # Reading the log reads every file: each record once, in order.
    out = subprocess.run(gatewrap_cmd("audit", "--json", "--log", str(path)), capture_output=True, timeout=120, cwd=ROOT)
    assert _mine(out.stdout.splitlines()) == list(range(120)), out.stderr


def test_a_tampered_or_missing_segment_is_named(rotating):
    log, path, key = rotating
    _write(log, 80)
    log.checkpoint()
    segs = [p for _, p in ar.segments(str(path))]
    lines = open(segs[1], "rb").read().splitlines(keepends=True)
    lines[3] = lines[3].replace(b"x.test", b"y.test")
    open(segs[1], "wb").write(b"".join(lines))
    p = _verify("--key", key, str(path))
    assert p.returncode == 1 and f"{segs[1]}:4: this line was changed" in p.stdout, p.stdout
    assert f"{segs[0]}: chain verified" in p.stdout and f"{segs[2]}: chain verified" in p.stdout, "the others verify"
    # Its last line changed: the segment after it no longer joins.
    lines = open(segs[0], "rb").read().splitlines(keepends=True)
    last = json.loads(lines[-1])
    open(segs[0], "wb").write(b"".join(lines[:-1]))  # the closing checkpoint removed
    p = _verify("--key", key, str(path))
    assert p.returncode == 1 and f"{segs[1]}: starts at record {last['seq'] + 1} but {segs[0]} ends at {last['seq'] - 1}" in p.stdout, p.stdout
    # A segment removed from the middle.
    os.unlink(segs[2])
    p = _verify("--key", key, str(path))
    assert p.returncode == 1 and f"{segs[3]}: continues {os.path.basename(segs[2])}, which is missing" in p.stdout, p.stdout


def test_the_oldest_segments_deleted_by_keep_leave_a_log_that_verifies_as_partial(tmp_path):
    key_path = tmp_path / "keys" / "signing-key"
    path = tmp_path / "audit.jsonl"
    log = core.AuditLog(str(path), key=str(key_path), max_size=MAX, keep=2)
    _write(log, 120)
    log.checkpoint()
    assert len(ar.segments(str(path))) == 2
    vkey = core.audit_verifier_key(str(key_path))
    p = _verify("--key", vkey, str(path))
    oldest = ar.segments(str(path))[0]
    assert p.returncode == 1 and (f"{oldest[1]}: starts mid-chain at record {oldest[0]} without the file before it"
                                  in p.stdout and "pass --partial" in p.stdout), p.stdout
    p = _verify("--key", vkey, "--partial", str(path))
    assert p.returncode == 0 and f"from record {oldest[0]} (continues " in p.stdout and "a rotation, signed" in p.stdout, p.stdout


def test_follow_reads_on_across_rotations(rotating):
    log, path, _ = rotating
    _write(log, 30)
    f = subprocess.Popen(gatewrap_cmd("audit", "--follow", "--json", "--event", "request", "--log", str(path)),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    try:
        got: list[int] = []
        _write(log, 200, start=30)  # several rotations while it polls
        while len(got) < 230:
            line = f.stdout.readline()
            assert line, f.stderr.read().decode() if f.poll() is not None else "eof"
            got += _mine([line])
        assert got == list(range(230)), "each record once, in order"
    finally:
        f.kill()
        f.wait()


@needs_rsyslog
def test_the_shipper_ships_every_line_once_across_rotations(rotating, rsyslog, tmp_path):  # noqa: F811
    log, path, _ = rotating
    r = rsyslog()
    state = tmp_path / "ship.state"
    _write(log, 20)
    assert _ship(path, state, f"tcp://127.0.0.1:{r.port}").returncode == 0
    saved = json.loads(state.read_text())
    _write(log, 100, start=20)  # rotated several times since the position was saved
    assert saved["segment"] == ar.segment_path(str(path), saved["seq"] + 1), saved  # where it goes on
    p = _ship(path, state, f"tcp://127.0.0.1:{r.port}")
    assert p.returncode == 0, p.stderr
    every = [ln.decode() for f in ar.log_files(str(path)) for ln in open(f, "rb").read().split(b"\n")[:-1]]
    got = r.wait_for(set(every))
    assert len(got) == len(every), "no line twice, none missing"
    assert "in no file" not in p.stderr, p.stderr


@needs_rsyslog
def test_a_following_shipper_ships_every_line_once_across_rotations(rotating, rsyslog, tmp_path):  # noqa: F811
    log, path, _ = rotating
    r = rsyslog()
    _write(log, 10)
    p = subprocess.Popen(gatewrap_cmd("audit", "ship", "--follow", "--to", f"tcp://127.0.0.1:{r.port}", "--log", str(path),
                                      "--state", str(tmp_path / "ship.state")),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _write(log, 150, start=10)  # rotated many times while it follows
        every = [ln.decode() for f in ar.log_files(str(path)) for ln in open(f, "rb").read().split(b"\n")[:-1]]
        got = r.wait_for(set(every))
        assert len(got) == len(every), "no line twice, none missing"
    finally:
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    assert "in no file" not in err, err


def _start(audit, *argv: str, max_size: str = "4K") -> subprocess.Popen:
    env = dict(os.environ, SUDO_UID=str(AGENT_UID), SUDO_GID=str(AGENT_UID))
    return subprocess.Popen(gatewrap_cmd("run", "--audit-log", str(audit), "--audit-max-size", max_size, "--workdir", "/tmp",
                                         "--", *argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


@pytest.mark.kernel
def test_concurrent_runs_crossing_rotations_keep_one_chain(tmp_path):
    audit = tmp_path / "audit.jsonl"
    runs = [_start(audit, "/bin/true") for _ in range(12)]
    for r in runs:
        _, err = r.communicate(timeout=300)
        assert r.returncode == 0, err
    assert ar.segments(str(audit)), "the runs rotated the log"
    v = _verify("--json", str(audit))
    assert v.returncode == 0, v.stdout + v.stderr
    rep = json.loads(v.stdout)
    assert rep["joins"] == [] and all(f["unverified_tail"] == 0 for f in rep["files"]), rep
    recs = [json.loads(x) for f in ar.log_files(str(audit)) for x in open(f, "rb").read().splitlines()]
    assert sum(1 for x in recs if x["event"] == "run_end") == 12
    assert [x["seq"] for x in recs] == list(range(1, len(recs) + 1)), "one chain over the files"


def test_a_size_below_4k_is_refused():
    p = subprocess.run(gatewrap_cmd("run", "--audit-max-size", "1K", "--", "/bin/true"), capture_output=True, text=True,
                       timeout=60, cwd=ROOT)
    assert p.returncode == 125 and "below 4K" in p.stderr, p.stderr
