"""Escape suite, the gate's own faults: a full disk under the audit log makes the gate admit
nothing (503, nothing dialled) until records can be written again, and the run still ends
with the agent's exit code; an audit log path that is a FIFO, a link or in a directory
others can write is refused at once; idle DNS-over-TCP connections cannot take the gate's
connections."""

from __future__ import annotations

import errno
import json
import os
import queue
import re
import subprocess
import textwrap
import threading
import time
from pathlib import Path

import pytest

from gatewrap import _gate_core as core

from conftest import AGENT_PYTHON, AGENT_UID, PUBLIC_RANGES, TEST_FILLER, gatewrap_cmd, run_gatewrap

pytestmark = pytest.mark.kernel

ALLOWED = "allowed.test"
ALLOWED_IP = "198.51.100.138"
#: The agent's exit code, which gatewrap must return whatever happened to the audit log.
AGENT_EXIT = 7

#: An agent that asks the gate for ``GET http://HOST/PATH`` over a raw socket and prints
#: one JSON line per answer: {"step", "status", "body"}; it waits for a line on stdin at
#: each ``wait(step)``.
RAW_AGENT = r'''
import json, socket, sys
def ask(step, host, path):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    s.sendall(f"GET http://{host}{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1]) if head.startswith(b"HTTP/") else None
    print(json.dumps({"step": step, "status": status, "body": body.decode(errors="replace")}), flush=True)
    return status
def wait(step):
    print(json.dumps({"wait": step}), flush=True)
    sys.stdin.readline()
'''


def _reader(p: subprocess.Popen) -> queue.Queue:
    """The agent's stdout lines, as they come (None at its end), read by a thread."""
    q: queue.Queue = queue.Queue()

    def pump() -> None:
        for line in p.stdout:
            q.put(line)
        q.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return q


def _lines(q: queue.Queue, want: str, deadline: float) -> list[dict]:
    """The agent's JSON lines up to (and with) ``{"wait": want}``; fails on a deadline."""
    got = []
    while True:
        try:
            line = q.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"the agent did not reach {want!r}: {got}") from None
        assert line is not None, f"the agent ended before {want!r}: {got}"
        if line.startswith("{"):
            got.append(json.loads(line))
            if got[-1].get("wait") == want:
                return got


def _fill(filler: Path, audit: Path) -> None:
    """Fill the audit log's file system: ``filler`` until ENOSPC, then the log's own last
    page (tmpfs allocates whole pages) with records of a writer of its own, smaller and
    smaller, until not even one of ~80 bytes fits."""
    block = b"f" * 65536
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(block)
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
    log = core.AuditLog(str(audit))
    for size in (4096, 2048, 1024, 512, 256, 128, 64, 32, 16, 8, 4, 2, 1, 0):
        try:
            while True:
                log.write({"run": "test", "event": TEST_FILLER, "pad": "x" * size})
        except OSError as e:
            assert e.errno == errno.ENOSPC, e


@pytest.fixture
def small_fs(tmp_path):
    """A 1 MiB tmpfs (mode 0755, root's) for the audit log, unmounted afterwards."""
    d = tmp_path / "auditfs"
    d.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "tmpfs", str(d)], check=True)
    yield d
    subprocess.run(["umount", "-l", str(d)], check=False)


def _connects(net, local: str) -> int:
    return len(net.access_entries(event="connect", local=local))


def test_a_full_disk_makes_the_gate_admit_nothing_and_the_run_keeps_its_exit_code(net, small_fs, outcome):
    """the audit log's disk fills up during a run"""
    audit = small_fs / "audit.jsonl"
    filler = small_fs / "filler"
    long_path = "/status/200?during-the-full-disk-" + "x" * 60
    code = RAW_AGENT + textwrap.dedent(f"""
        ask("first", "{ALLOWED}", "/status/200?first")
        wait("fill")
        ask("denied", "denied.test", "/")
        ask("during", "{ALLOWED}", "{long_path}")
        try:  # a kernel denial whose record the full disk cannot take
            socket.create_connection(("{ALLOWED_IP}", 9), timeout=2)
        except OSError as e:
            print(json.dumps({{"step": "direct", "errno": e.errno}}), flush=True)
        wait("free")
        ask("after", "{ALLOWED}", "/status/200?after")
        wait("refill")
        sys.exit({AGENT_EXIT})
    """)
    cmd = gatewrap_cmd("run", "--audit-log", str(audit), "--resolver", net.dns_server, "--workdir", "/tmp",
                       *PUBLIC_RANGES, "--allow", f"{ALLOWED}:80", "--", AGENT_PYTHON, "-c", code)
    env = dict(os.environ, SUDO_UID=str(AGENT_UID), SUDO_GID=str(AGENT_UID))
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env)
    deadline = time.monotonic() + 120
    try:
        lines = _reader(p)
        first = _lines(lines, "fill", deadline)
        assert first[0]["status"] == 200, first
        _fill(filler, audit)
        before = _connects(net, ALLOWED_IP)
        p.stdin.write("go\n")
        p.stdin.flush()
        during = _lines(lines, "free", deadline)
        dialled = _connects(net, ALLOWED_IP) - before
        time.sleep(0.5)  # the kernel denial's record is tried (and fails) before the disk is freed
        os.remove(filler)
        p.stdin.write("go\n")
        p.stdin.flush()
        after = _lines(lines, "refill", deadline)
        _fill(filler, audit)
        p.stdin.write("go\n")
        p.stdin.flush()
        p.stdin.close()
        p.wait(timeout=max(1.0, deadline - time.monotonic()))
        err = p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    by_step = {a["step"]: a for a in during + after if "step" in a}
    got = by_step["during"]
    outcome("gate: audit log", f"{got['status']} before any dial; {dialled} connections upstream; exit {p.returncode}",
            "held" if got["status"] == 503 and dialled == 0 else "OPEN")
    assert by_step["denied"]["status"] == 503, "a refusal it cannot record is a 503 too"
    assert got["status"] == 503, during
    assert "the request was not sent: cannot write audit log" in got["body"] and str(audit) in got["body"], got
    assert "No space left on device" in got["body"], got
    assert dialled == 0, "the upstream saw a connection for a request the log could not record"
    assert net.access_entries(path=long_path) == []
    assert by_step["after"]["status"] == 200, after
    assert p.returncode == AGENT_EXIT, err
    assert "the gate refuses every request until it can record it" in err, err
    assert "can be written again" in err, err
    assert "gatewrap: the run_end record could not be written: cannot write audit log" in err, err
    # The summary says what happened: a request refused unsent is no upstream failure, and a
    # kernel denial the log could not take was not lost to the ring buffer.
    assert by_step["direct"]["errno"] == errno.EPERM, during
    summary = next(line for line in err.splitlines() if f"exited {AGENT_EXIT}:" in line)
    assert "upstream failed" not in summary and "1 NOT SENT (503: the audit log could not record them)" in summary, summary
    # (the direct connect, and the unix socket attempts at the run's end, after the refill)
    assert "ring buffer" not in summary and re.search(r", [1-9][0-9]* kernel events NOT RECORDED \(the audit log "
                                                      r"could not be written\)", summary), summary
    records = [json.loads(line) for line in audit.read_text().splitlines()]  # every line whole: none cut by the full disk
    assert audit.read_text().endswith("\n")
    targets = [r.get("target") for r in records]
    assert f"http://{ALLOWED}{long_path}" not in targets, "no record (hence no request) of the refused one"
    admits = [r for r in records if r["event"] == "admit"]
    assert [r["target"] for r in admits] == [f"http://{ALLOWED}/status/200?first", f"http://{ALLOWED}/status/200?after"]
    assert not [r for r in records if r["event"] == "run_end"]
    assert not [r for r in records if r.get("target") == "http://denied.test/"]


def _open_refused(tmp_path: Path, net, make) -> tuple[subprocess.CompletedProcess, Path]:
    audit = make(tmp_path)
    r = subprocess.run(gatewrap_cmd("run", "--audit-log", str(audit), "--resolver", net.dns_server,
                                    "--workdir", "/tmp", "--", "/bin/true"),
                       capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, SUDO_UID=str(AGENT_UID), SUDO_GID=str(AGENT_UID)))
    return r, audit


def _fifo(d: Path) -> Path:
    os.mkfifo(d / "audit.jsonl")
    return d / "audit.jsonl"


def _link(d: Path) -> Path:
    (d / "audit.jsonl").symlink_to(d / "elsewhere.jsonl")
    return d / "audit.jsonl"


def _shared_dir(d: Path) -> Path:
    (d / "shared").mkdir()
    os.chmod(d / "shared", 0o777)
    return d / "shared" / "audit.jsonl"


@pytest.mark.parametrize("make, said", [
    pytest.param(_fifo, "is a FIFO, not a regular file", id="an audit log path that is a FIFO (a run would hang at start)"),
    pytest.param(_link, "is a symbolic link (never followed), not a regular file", id="an audit log path that is a symbolic link"),
    pytest.param(_shared_dir, "is writable by others", id="an audit log in a directory others can write"),
])
def test_an_unsafe_audit_log_path_is_refused_at_once(tmp_path, net, outcome, make, said):
    r, audit = _open_refused(tmp_path, net, make)
    outcome("gatewrap: audit log open", f"exit {r.returncode}: {said}" if said in r.stderr else f"exit {r.returncode}",
            "held" if r.returncode == 125 else "OPEN")
    assert r.returncode == 125, r.stderr
    assert said in r.stderr and str(audit.parent) in r.stderr and "--audit-log" in r.stderr, r.stderr
    assert not (tmp_path / "elsewhere.jsonl").exists(), "the link was not followed"
    assert not os.path.isfile(audit) or os.path.getsize(audit) == 0


DNS_FLOOD = r'''
import json, resource, select, socket, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
held, failed = [], 0
for i in range(2100):
    try:
        s = socket.create_connection(("127.0.0.1", 53), timeout=5)
        held.append(s)
    except OSError:
        failed += 1
s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
s.sendall(b"GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n")
s.settimeout(10)
data = b""
while True:
    chunk = s.recv(65536)
    if not chunk:
        break
    data += chunk
status = int(data.split(b" ")[1]) if data.startswith(b"HTTP/") else None
# Wait (up to a minute) for the stub to close every connection: at once beyond its cap,
# after its idle timeout within it. poll(2), not select(2): the fds are above 1024.
open_ = {s.fileno(): s for s in held}
poller = select.poll()
for fd in open_:
    poller.register(fd, select.POLLIN)
deadline = time.monotonic() + 60
while open_ and time.monotonic() < deadline:
    for fd, _ in poller.poll(1000):
        try:
            gone = open_[fd].recv(1) == b""
        except OSError:
            gone = True
        if gone:
            poller.unregister(fd)
            del open_[fd]
print(json.dumps({"connected": len(held), "failed": failed, "http": status, "still_open": len(open_)}), flush=True)
'''


def test_idle_dns_tcp_connections_cannot_take_the_gate(net, tmp_path, outcome):
    """2100 idle TCP connections to the DNS stub, then a request through the gate"""
    run = run_gatewrap(net, tmp_path / "audit.jsonl", python=DNS_FLOOD, allow=[f"{ALLOWED}:80"], timeout=180)
    got = next(json.loads(line) for line in run.stdout.splitlines() if line.startswith("{"))
    outcome("gate: DNS stub (64 TCP connections, 10 s idle)",
            f"HTTP {got['http']}; {got['still_open']} of {got['connected']} left open",
            "held" if got["http"] == 200 else "OPEN")
    assert run.returncode == 0, run.stderr
    assert got["connected"] >= 2000, got
    assert got["http"] == 200, got
    assert got["still_open"] == 0, f"idle DNS connections were not closed: {got}"
    refused = run.records(event="dns", decision="denied", reason="limit: more than 64 open DNS-over-TCP connections")
    assert refused, run.audit()[-5:]


def test_a_checkpoint_that_cannot_follow_run_end_is_named_as_such(small_fs, tmp_path):
    """The disk fills up between the run_end record and its checkpoint."""
    import io

    from gatewrap.runner import _write_run_end

    end = {"run": "gw-test", "event": "run_end", "exit_code": 0, "allowed": 0, "denied": 0, "failed": 0,
           "direct_egress": 0, "lost_events": 0}
    scratch = core.AuditLog(str(tmp_path / "scratch.jsonl"), key=None)
    scratch.write(dict(end))
    room = len((tmp_path / "scratch.jsonl").read_bytes()) + 60  # run_end fits, a checkpoint (~400 bytes) does not
    audit = small_fs / "audit.jsonl"
    log = core.AuditLog(str(audit), key=str(tmp_path / "keys" / "signing-key"), checkpoint_every=0)
    log.write({"run": "test", "event": TEST_FILLER, "pad": ""})
    base = audit.stat().st_size
    # Pad the log so that its last page has `room` bytes free, then fill the rest of the disk.
    want = (-base - room) % 4096
    while want < base:
        want += 4096
    log.write({"run": "test", "event": TEST_FILLER, "pad": "x" * (want - base)})
    assert 4096 - audit.stat().st_size % 4096 == room, audit.stat().st_size
    with open(small_fs / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"f" * 65536)
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
    err = io.StringIO()
    _write_run_end(log, end, err)
    assert err.getvalue().startswith("gatewrap: the checkpoint after run_end could not be written (run_end is in "
                                     "the log, unsigned until the next checkpoint): cannot write audit log"), err.getvalue()
    assert "No space left on device" in err.getvalue()
    assert json.loads(audit.read_text().splitlines()[-1])["event"] == "run_end"


#: Agent threads asking for allowed requests as fast as the gate answers, each path unique
#: (``/status/200?flood-T-I``), until the gate is gone; "flooding" once 200 were answered.
FLOOD_AGENT = r'''
import socket, sys, threading
answered = 0
lock = threading.Lock()
def worker(t):
    global answered
    for i in range(1_000_000):
        try:
            s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
            s.sendall(f"GET http://{HOST}/status/200?flood-{t}-{i} HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n".encode())
            while s.recv(65536):
                pass
            s.close()
        except OSError:
            return
        with lock:
            answered += 1
            if answered == 200:
                print("flooding", flush=True)
ts = [threading.Thread(target=worker, args=(t,)) for t in range(32)]
for t in ts:
    t.start()
for t in ts:
    t.join()
print("gate gone", flush=True)
'''


@pytest.mark.parametrize("mode", ["own", "shared", "own, the log renamed aside first"])
def test_every_request_upstream_saw_has_its_admit_record_when_the_gate_is_killed_mid_flood(net, tmp_path, outcome, mode):
    """the gate killed with SIGKILL during a flood of allowed requests (the log renamed aside
    during the flood first, as logrotate does)"""
    from shared.conftest import Daemon

    audit = tmp_path / "audit.jsonl"
    net.clear_logs()
    cmd = gatewrap_cmd("run", "--audit-log", str(audit), "--resolver", net.dns_server, "--workdir", "/tmp",
                       *PUBLIC_RANGES, "--allow", f"{ALLOWED}:80", "--",
                       AGENT_PYTHON, "-c", FLOOD_AGENT.replace("{HOST}", ALLOWED))
    env = dict(os.environ, SUDO_UID=str(AGENT_UID), SUDO_GID=str(AGENT_UID))
    daemon = None
    if mode == "shared":
        daemon = Daemon("--idle-exit", "0").start()
        env.update(daemon.env)
    else:
        env["GATEWRAP_SHARED"] = "0"
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert p.stdout.readline() == "flooding\n", p.stderr.read()
        if "renamed" in mode:
            audit.rename(tmp_path / "audit.jsonl.1")
            time.sleep(1)
        victim = daemon.proc if daemon else p
        victim.kill()
        victim.wait(timeout=30)
        gone = p.stdout.readline()
        time.sleep(1)  # the fake internet logs what it got
    finally:
        if daemon is not None:
            daemon.stop()
        subprocess.run(gatewrap_cmd("gc"), capture_output=True, timeout=60)
        if p.poll() is None:
            p.kill()
        p.wait(timeout=30)
    upstream = {e["path"].split("?", 1)[1] for e in net.access_entries(event="request")
                if "?flood-" in e.get("path", "")}
    admitted = set()
    logs = [audit, tmp_path / "audit.jsonl.1"]
    for line in [x for log in logs if log.exists() for x in log.read_text().splitlines()]:
        rec = json.loads(line)
        if rec.get("event") == "admit" and "?flood-" in rec.get("target", ""):
            admitted.add(rec["target"].split("?", 1)[1])
    unrecorded = sorted(upstream - admitted)
    outcome("admit record written (write(2) done) before the dial",
            f"{'the daemon' if mode == 'shared' else 'gatewrap'} killed mid-flood{' (log renamed first)' if 'renamed' in mode else ''}: upstream got {len(upstream)} "
            f"requests, {len(admitted)} admit records; {len(unrecorded)} without one",
            "OPEN" if unrecorded else "held")
    assert gone == "gate gone\n", gone
    assert len(upstream) >= 200, len(upstream)
    assert unrecorded == [], unrecorded[:10]
