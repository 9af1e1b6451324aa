"""Attacks on the shared mode: what one run (its agent, its terminal, its client) can do to the
daemon and to the other runs it serves. One bad run must not hurt the others."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from conftest import AGENT_PYTHON, AGENT_UID, gatewrap_cmd

pytestmark = pytest.mark.kernel


def _env(d, **more) -> dict:
    return {**os.environ, **d.env, "SUDO_UID": str(AGENT_UID), "SUDO_GID": str(AGENT_UID), **more}


def _records(audit: Path) -> list[dict]:
    if not audit.exists():
        return []
    return [json.loads(line) for line in audit.read_text().splitlines() if line.strip()]


def _run(audit: Path, argv: list[str], *extra: str) -> list[str]:
    return [*gatewrap_cmd("run", "--audit-log", str(audit), "--workdir", "/tmp", *extra), "--", *argv]


def _agent_said(audit: Path, script: str, d, first: str, *extra: str) -> subprocess.Popen:
    """``gatewrap run --shared`` of the Python ``script`` on daemon ``d``, once its first line
    of output was ``first``."""
    p = subprocess.Popen(_run(audit, [AGENT_PYTHON, "-c", script], *extra),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(d))
    assert p.stdout.readline().split() == [first], p.stderr.read() if p.poll() is not None else ""
    return p


@pytest.fixture
def shown():
    """A folder the agent's user can reach (pytest's tmp_path is under a 0700 folder)."""
    d = tempfile.mkdtemp(prefix="gwt-atk-")
    os.chmod(d, 0o777)
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


def _wait_for(what, deadline_s: float = 30.0) -> bool:
    """Poll ``what()`` until true; False if it is still false after ``deadline_s`` (a bound
    for a hang, not a timing claim: the condition is met within milliseconds when it holds)."""
    deadline = time.monotonic() + deadline_s
    while not what():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_run_whose_terminal_stalls_does_not_stop_the_kernel_denials_of_the_others(daemon, tmp_path, shown):
    """Run A's agent fills its own stderr (a pipe nobody reads: a stalled terminal, Ctrl-S, a
    paused pager) and then makes a direct connect: the daemon's notice to A's terminal cannot be
    written. Run B's direct connect must still be recorded while B runs (the daemon's one
    ring-buffer reader serves every run), and A's live notice is dropped, not waited for."""
    go = shown / "go"
    fill = ("import fcntl, os, socket, sys, time\n"
            "fl = fcntl.fcntl(2, fcntl.F_GETFL)\n"
            "fcntl.fcntl(2, fcntl.F_SETFL, fl | os.O_NONBLOCK)\n"
            "try:\n    while True: os.write(2, b'x' * 4096)\nexcept BlockingIOError:\n    pass\n"
            "fcntl.fcntl(2, fcntl.F_SETFL, fl)\n"
            "s = socket.socket()\n"
            "try:\n    s.connect(('198.51.100.1', 80))\nexcept OSError as e:\n    print('denied', e.errno, flush=True)\n"
            f"while not os.path.exists('{go}'): time.sleep(0.05)\n")
    r, w = os.pipe()
    a_audit, b_audit = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a = subprocess.Popen(_run(a_audit, [AGENT_PYTHON, "-c", fill], "--ro-bind", str(shown)),
                         stdout=subprocess.PIPE, stderr=w, text=True, env=_env(daemon))
    os.close(w)
    drained = threading.Event()
    try:
        assert a.stdout.readline().split() == ["denied", "1"]
        # A's direct egress reaches the daemon's reader, which now has a notice for A's full pipe
        assert _wait_for(lambda: any(x.get("event") == "direct_egress" for x in _records(a_audit)))
        probe = ("import os, socket, time\n"
                 "s = socket.socket()\n"
                 "try:\n    s.connect(('198.51.100.2', 80))\nexcept OSError as e:\n    print('denied', e.errno, flush=True)\n"
                 "s = socket.socket()\n"
                 "try:\n    s.connect(('198.51.100.3', 80))\nexcept OSError as e:\n    print('denied', e.errno, flush=True)\n"
                 f"while not os.path.exists('{go}'): time.sleep(0.05)\n")
        b_err = tmp_path / "b.err"
        with open(b_err, "w") as berr:
            b = subprocess.Popen(_run(b_audit, [AGENT_PYTHON, "-c", probe], "--ro-bind", str(shown)),
                                 stdout=subprocess.PIPE, stderr=berr, text=True, env=_env(daemon))
        assert b.stdout.readline().split() == ["denied", "1"]
        recorded = _wait_for(lambda: sum(x.get("event") == "direct_egress" for x in _records(b_audit)) >= 1)
        go.write_text("")
        b.communicate(timeout=120)
        assert recorded, ("run B's kernel denial was not recorded while B ran: the daemon's ring-buffer "
                          "reader is stuck writing run A's notice to A's stalled terminal")
        assert b.returncode == 0
    finally:
        go.write_text("")
        def drain():
            while os.read(r, 1 << 16):
                pass
            drained.set()
        threading.Thread(target=drain, daemon=True).start()
        a.communicate(timeout=120)
    assert a.returncode == 0
    assert [x["event"] for x in _records(a_audit)].count("run_end") == 1


CURL = ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}\n", "--max-time", "10"]


def test_a_taken_back_run_keeps_the_policy_it_started_with_though_its_agent_rewrote_the_file(tmp_path, shown):
    """The policy file lies in the agent's project folder (shown with --bind). The agent's
    rewrite to allow everything is refused (a policy file in a writable path is protected:
    read-only for the agent), and when the file changes all the same (here: its 0666 mode lets
    any local user rewrite it) while the run waits for a daemon restart (an upgrade, a crash),
    the daemon that takes the run back must not read the new text, only the one the run was
    started with."""
    from .conftest import Daemon

    policy = shown / "policy.toml"
    policy.write_text('version = 1\ndefault = "deny"\n')
    os.chmod(policy, 0o666)
    step = shown / "step"
    script = (f"import os, subprocess, time\n"
              f"def fetch():\n"
              f"    return subprocess.run({CURL!r} + ['http://evil.test/'], capture_output=True, text=True).stdout.strip()\n"
              f"print('before', fetch(), flush=True)\n"
              f"try:\n"
              f"    open('{policy}', 'w').write('version = 1\\ndefault = \"allow\"\\n')\n"
              f"    print('rewritten', flush=True)\n"
              f"except OSError as e:\n"
              f"    print('refused', e.errno, flush=True)\n"
              f"while not os.path.exists('{step}'): time.sleep(0.05)\n"
              f"print('after', fetch(), flush=True)\n")
    first = Daemon().start()
    second = None
    audit = tmp_path / "audit.jsonl"
    try:
        p = subprocess.Popen(_run(audit, [AGENT_PYTHON, "-c", script], "--policy", str(policy), "--bind", str(shown),
                                  "--resolver", "127.0.0.1:9"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(first))
        assert p.stdout.readline().split() == ["before", "403"]
        assert p.stdout.readline().split() == ["refused", str(errno.EROFS)]
        policy.write_text('version = 1\ndefault = "allow"\n')  # a local user, outside the sandbox
        first.kill()
        second = Daemon.restart_of(first)  # the same socket: a restart
        assert _wait_for(lambda: second.status()["runs"], 60), second.log_text()
        step.write_text("")
        out, err = p.communicate(timeout=120)
        assert out.split() == ["after", "403"], err
        requests = [r for r in _records(audit) if r.get("event") == "request"]
        assert [(r["decision"], r["reason"]) for r in requests] == [("denied", "policy: default deny")] * 2, requests
    finally:
        first.stop()
        if second is not None:
            second.stop()
        subprocess.run(gatewrap_cmd("gc"), capture_output=True, timeout=120)


def _talk(path: str, data: bytes, fds: list[int] | None = None) -> bytes:
    """Send ``data`` (with ``fds``) on a new connection to the daemon; its answer until it closes."""
    import socket

    with socket.socket(socket.AF_UNIX) as s:
        s.connect(path)
        if fds:
            socket.send_fds(s, [data], fds)
        else:
            s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except ConnectionResetError:  # the daemon closed with our unread bytes still queued
            out += b"<reset>"
        return out


def _fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_hostile_requests_are_refused_and_leave_the_daemon_and_its_runs_as_they_were(daemon, tmp_path):
    """Bad JSON, a line over the limit, too many or too few fds, unknown options, an empty argv,
    options of the wrong type, a resume of a run that is not the caller's: each is answered
    with a refusal; the daemon leaks no fd, and a run it serves meanwhile is not disturbed."""
    import dataclasses

    from gatewrap.run_types import RunOptions

    audit = tmp_path / "audit.jsonl"
    live = subprocess.Popen(_run(audit, ["/usr/bin/sleep", "300"]), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env(daemon))
    assert _wait_for(lambda: daemon.status()["runs"], 60), daemon.log_text()
    run_id = daemon.status()["runs"][0]
    before = _fd_count(daemon.proc.pid)
    ok = dataclasses.asdict(RunOptions(argv=["/usr/bin/true"], audit_log=str(tmp_path / "x.jsonl"), cwd="/tmp",
                                       environ={"PATH": "/usr/bin:/bin", "SUDO_UID": str(AGENT_UID),
                                                "SUDO_GID": str(AGENT_UID)}))
    r, w = os.pipe()
    try:
        cases = {
            "not json": (b"{nope\n", [w]),
            "not an object": (b"[1, 2]\n", None),
            "unknown op": (b'{"op": "rm"}\n', None),
            "no fd": (json.dumps({"op": "run", "opts": ok}).encode() + b"\n", None),
            "two fds": (json.dumps({"op": "run", "opts": ok}).encode() + b"\n", [w, w]),
            "too many fds": (json.dumps({"op": "run", "opts": ok}).encode() + b"\n", [w] * 6),
            "unknown option": (json.dumps({"op": "run", "opts": {**ok, "setuid": True}}).encode() + b"\n", [w]),
            "empty argv": (json.dumps({"op": "run", "opts": {**ok, "argv": []}}).encode() + b"\n", [w]),
            "argv not a list": (json.dumps({"op": "run", "opts": {**ok, "argv": "/usr/bin/true"}}).encode() + b"\n", [w]),
            "a port of the wrong type": (json.dumps({"op": "run", "opts": {**ok, "port": "x"}}).encode() + b"\n", [w]),
            "limits of the wrong shape": (json.dumps({"op": "run", "opts": {**ok, "limits": {"no": 1}}}).encode() + b"\n", [w]),
            "opts not an object": (json.dumps({"op": "run", "opts": [1]}).encode() + b"\n", [w]),
        }
        for case, (data, fds) in cases.items():
            got = _talk(daemon.socket, data, fds)
            assert b'"error"' in got, (case, got)
        import socket

        # a run whose client says an exit code that is no number: still ended, and recorded
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(daemon.socket)
            socket.send_fds(s, [json.dumps({"op": "run", "opts": ok}).encode() + b"\n"], [w])
            reply = json.loads(s.makefile("rb").readline())
            assert "spawn" in reply, reply
            s.sendall("exit \u00b2\n".encode())
            while s.recv(65536):
                pass
        ended = [x for x in _records(tmp_path / "x.jsonl") if x.get("event") == "run_end" and x["run"] == reply["run"]]
        assert len(ended) == 1, ended
        huge = _talk(daemon.socket, b"x" * ((4 << 20) + 70000))
        assert b"longer than" in huge or huge == b"<reset>", huge[:200]
        for other in (run_id, "gw-0000000000", "../../../etc/passwd", "gw-\xff".encode("latin-1").decode("latin-1")):
            got = _talk(daemon.socket, b"resume " + other.encode("latin-1", "replace") + b"\n")
            assert got.startswith(b"refused:"), (other, got)
        fds_now = lambda: {f: os.readlink(f"/proc/{daemon.proc.pid}/fd/{f}") for f in os.listdir(f"/proc/{daemon.proc.pid}/fd")}
        # (the ended run's audit log is closed by the daemon's cyclic garbage collection, some time later)
        leaked = not _wait_for(lambda: len([f for f in fds_now().values() if not f.endswith("/x.jsonl")]) <= before, 30)
        assert not leaked, f"{before} fds before, now: {sorted(fds_now().items())}"
        assert daemon.status()["runs"] == [run_id]
    finally:
        os.close(r)
        os.close(w)
        live.terminate()
        _, err = live.communicate(timeout=60)
    assert live.returncode == 143, err
    ends = [x for x in _records(audit) if x.get("event") == "run_end"]
    assert [e.get("exit_code") for e in ends] == [143]


#: ``gatewrap`` whose run, right after its cgroup is removed, lets a ``gatewrap gc`` run: what
#: an admin's gc (or a daemon's start, or its take-back window's end, which sweep the maps
#: too) does when it comes at that moment of another run's teardown.
_GC_IN_TEARDOWN = """
import os, subprocess, sys
from gatewrap.sandbox import cgroup
real = cgroup.kill_and_remove
def kill_and_remove(path, *a, **k):
    real(path, *a, **k)
    if os.path.basename(path).startswith("gw-"):
        subprocess.run([sys.executable, "-m", "gatewrap", "gc"], check=True, capture_output=True)
cgroup.kill_and_remove = kill_and_remove
from gatewrap.cli import main
sys.argv[0] = "gatewrap"
main()
"""


@pytest.mark.own_process
def test_a_gc_during_a_runs_teardown_does_not_lose_its_folded_kernel_denials(tmp_path):
    """Repeated identical kernel denials are folded in the kernel and counted at the run's
    end. hooks.sweep (gc, a daemon's start) drops the map entries of every cgroup that is
    gone: the run's teardown must count its folded denials before its cgroup goes."""
    import sys

    audit = tmp_path / "audit.jsonl"
    probe = ("import socket\n"
             "for _ in range(5):\n"
             "    s = socket.socket()\n"
             "    try:\n        s.connect(('198.51.100.9', 80))\n    except OSError as e:\n        pass\n"
             "    s.close()\n")
    gatewrap_cmd("run", "--audit-log", str(audit))  # noted for the schema check
    p = subprocess.run([sys.executable, "-c", _GC_IN_TEARDOWN, "run", "--audit-log", str(audit), "--workdir", "/tmp",
                        "--", AGENT_PYTHON, "-c", probe],
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "SUDO_UID": str(AGENT_UID), "SUDO_GID": str(AGENT_UID)})
    assert p.returncode == 0, p.stderr
    recs = _records(audit)
    egress = sum(r["count"] for r in recs if r.get("event") == "direct_egress")
    end = [r for r in recs if r.get("event") == "run_end"]
    assert (egress, [e["direct_egress"] for e in end]) == (5, [5]), p.stderr


def test_an_agent_holding_its_audit_logs_lock_does_not_freeze_the_other_runs_gates(daemon, tmp_path, shown):
    """Run A's agent (root, unjailed) tries to open its audit log read-only, to take
    flock(LOCK_EX) and send requests to its gate, whose records would then wait for the lock on
    the daemon's shared runtime. The log's folder is hidden from a root agent without the jail,
    so it cannot; and run B (another user, another audit log, jailed) gets its answers."""
    go = shown / "go"
    a_audit = tmp_path / "a.jsonl"  # root's folder: the root agent would reach it
    hold = ("import fcntl, os, subprocess, time\n"
            "try:\n"
            f"    f = open('{a_audit}', 'rb')\n"
            "except OSError as e:\n"
            "    print('hidden', e.errno, flush=True)\n"
            "    f = open('/dev/null', 'rb')\n"
            "fcntl.flock(f, fcntl.LOCK_EX)\n"
            "procs = [subprocess.Popen(" + repr(CURL) + " + [f'http://a{i}.test/'], stdout=subprocess.DEVNULL) for i in range(4)]\n"
            "print('locked', flush=True)\n"
            f"while not os.path.exists('{go}'): time.sleep(0.05)\n"
            "fcntl.flock(f, fcntl.LOCK_UN)\n"
            "for p in procs: p.wait()\n")
    env = _env(daemon)
    for k in ("SUDO_UID", "SUDO_GID"):
        env.pop(k)
    a = subprocess.Popen(_run(a_audit, [AGENT_PYTHON, "-c", hold], "--jail", "none", "--user", "root"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert a.stdout.readline().split()[0] == "hidden"
        assert a.stdout.readline().split() == ["locked"]
        b = subprocess.run(_run(tmp_path / "b.jsonl", [*CURL, "http://b.test/"]), capture_output=True, text=True,
                           timeout=60, env=_env(daemon))  # with the hole: B never even starts
        assert b.stdout.split() == ["403"], b.stderr
    finally:
        go.write_text("")
        a.communicate(timeout=120)


@pytest.mark.parametrize("timeout", ["inf", "1e300"])
def test_a_timeout_beyond_the_waiters_clock_is_no_timeout_as_in_a_run_of_its_own(daemon, tmp_path, timeout):
    """--timeout takes any positive float, inf included; the native waiter's clock does not:
    it refused them after the agent had started (exit 125, the agent killed)."""
    p = subprocess.run(_run(tmp_path / "audit.jsonl", ["/usr/bin/sh", "-c", "echo ran; exit 3"], "--timeout", timeout),
                       capture_output=True, text=True, timeout=120, env=_env(daemon))
    assert (p.returncode, p.stdout.split()) == (3, ["ran"]), p.stderr


def test_a_taken_back_runs_counts_are_not_inflated_by_what_its_agent_does_as_the_gate_comes_back(tmp_path, shown):
    """A hostile agent fills the log with its own denied requests (so the take-back's count of
    them takes a while), makes direct connects while its daemon is dead (the kernel keeps them
    in the run's ring buffer), then hammers the gate until it listens again. The daemon that
    takes the run back counts the records from before the take-back and adds the new gate's
    and reader's counts: a record the new gate or reader wrote while that count was being read
    must not be counted twice. run_end must say what the run's records say."""
    from gatewrap.audit_stats import RunCounts

    from .conftest import Daemon

    step = shown / "step"
    script = (f"import os, socket, time\n"
              f"def ask():\n"
              f"    s = socket.create_connection(('127.0.0.1', 3128))\n"
              f"    s.sendall(b'GET http://evil.test/ HTTP/1.1\\r\\nHost: evil.test\\r\\nConnection: close\\r\\n\\r\\n')\n"
              f"    while s.recv(65536): pass\n"
              f"    s.close()\n"
              f"for _ in range(3000): ask()\n"
              f"print('filled', flush=True)\n"
              f"while not os.path.exists('{step}'): time.sleep(0.05)\n"
              f"for _ in range(20):\n"
              f"    try: socket.create_connection(('198.51.100.1', 80))\n"
              f"    except OSError: pass\n"
              f"n = 0\n"
              f"while n < 500:\n"
              f"    try: ask(); n += 1\n"
              f"    except OSError: time.sleep(0.001)\n"
              f"print('done', flush=True)\n")
    first = Daemon().start()
    second = None
    audit = tmp_path / "audit.jsonl"
    try:
        p = subprocess.Popen(_run(audit, [AGENT_PYTHON, "-c", script], "--ro-bind", str(shown),
                                  "--resolver", "127.0.0.1:9", "--json"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(first))
        assert p.stdout.readline().split() == ["filled"], p.stderr.read() if p.poll() is not None else ""
        first.kill()
        step.write_text("")
        second = Daemon.restart_of(first)  # the same socket: a restart
        assert p.stdout.readline().split() == ["done"]
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        recs = _records(audit)
        run_id = next(r["run"] for r in recs if r["event"] == "run_start")
        counted = RunCounts(run_id)
        for r in recs:
            if r.get("run") == run_id and r["event"] != "run_end":
                counted.add(r)
        end = next(r for r in recs if r["event"] == "run_end")
        assert [r["event"] for r in recs].count("run_resumed") == 1
        # The gap's mark comes before every record of the new gate and reader.
        mine = [r for r in recs if r.get("run") == run_id]
        gap = next(i for i, r in enumerate(mine) if r["event"] == "run_resumed")
        # Denials are folded (a record with their count): each record counts as many.
        counts = tuple(sum(r.get("count", 1) for r in part if r["event"] == "request")
                       for part in (mine[:gap], mine[gap + 1:]))
        assert counts[1] == 500 and counts[0] <= 3000, counts
        assert counted.denied == sum(counts) and counted.direct_egress == 20, (counted.denied, counted.direct_egress)
        assert (end["denied"], end["direct_egress"]) == (counted.denied, counted.direct_egress)
        assert json.loads(err.strip().splitlines()[-1])["denied"] == counted.denied
        if counts[0] < 3000:
            pytest.xfail(f"known gap (issue 21, item 11): {3000 - counts[0]} of the killed daemon's denials were "
                         "folded in its memory (the last second's repeats) and died with it; the kernel's folds "
                         "live in pinned maps, the gate's need a store that outlives the process")
    finally:
        first.stop()
        if second is not None:
            second.stop()
        subprocess.run(gatewrap_cmd("gc"), capture_output=True, timeout=120)


def test_a_daemon_of_another_socket_leaves_the_runs_that_wait_for_theirs(tmp_path, shown):
    """Run R's daemon (socket A) dies; R's waiter waits for a daemon of A to take R back. A
    daemon started on another socket B (another team's, a test's) removes the stale sandboxes
    at its start and at the end of its take-back window: it must leave R alone (only a daemon
    of A takes R back or gives up on it), as gc and runs of their own do."""
    from gatewrap.sandbox import cgroup

    from .conftest import Daemon

    step = shown / "step"
    script = (f"import os, time\n"
              f"print('up', flush=True)\n"
              f"while not os.path.exists('{step}'): time.sleep(0.05)\n")
    a = Daemon().start()
    b = None
    audit = tmp_path / "audit.jsonl"
    try:
        p = _agent_said(audit, script, a, "up", "--ro-bind", str(shown))
        run_id = next(r["run"] for r in _records(audit) if r["event"] == "run_start")
        a.kill()
        b = Daemon().start()  # another socket: its start collects stale sandboxes
        assert b.status()["runs"] == []
        assert p.poll() is None, p.communicate(timeout=60)
        assert cgroup.populated(os.path.join(cgroup.parent_dir(), run_id))
        again = Daemon.restart_of(a)  # A's daemon comes back and takes R back
        assert _wait_for(lambda: again.status()["runs"] == [run_id], 60), again.log_text()
        step.write_text("")
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert "daemon is back" in err, err
        again.stop()
    finally:
        a.stop()
        if b is not None:
            b.stop()
        subprocess.run(gatewrap_cmd("gc"), capture_output=True, timeout=120)


def test_dns_queries_held_over_the_record_rate_are_counted_though_the_daemon_stops(tmp_path, shown):
    """The agent sends DNS queries faster than the stub records them one by one (its first
    window's queries beyond RECORDS_PER_SECOND are held, to be counted in one record when the
    next window opens or the gate stops), then waits. The daemon is stopped (SIGTERM: an
    upgrade, systemctl restart) and a new one takes the run back: every query must be in the
    log, the held ones too (a gate that stops with its daemon must not take them along)."""
    from .conftest import Daemon

    step = shown / "step"
    script = (f"import os, socket, struct, time\n"
              f"s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
              f"s.settimeout(5)\n"
              f"q = lambda i: struct.pack('>HHHHHH', i, 0x0100, 1, 0, 0, 0) + b'\\x04leak\\x04test\\x00\\x00\\x01\\x00\\x01'\n"
              f"for i in range(1000):\n"
              f"    s.sendto(q(i), ('127.0.0.1', 53)); s.recv(512)\n"
              f"print('sent', flush=True)\n"
              f"while not os.path.exists('{step}'): time.sleep(0.05)\n")
    first = Daemon().start()
    second = None
    audit = tmp_path / "audit.jsonl"
    try:
        p = _agent_said(audit, script, first, "sent", "--ro-bind", str(shown))
        first.kill(signal.SIGTERM)
        second = Daemon.restart_of(first)  # the same socket: a restart
        assert _wait_for(lambda: second.status()["runs"], 60), second.log_text()
        step.write_text("")
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        dns = [r for r in _records(audit) if r.get("event") == "dns"]
        assert sum(r.get("count", 1) for r in dns) == 1000, [r for r in dns if "count" in r]
    finally:
        first.stop()
        if second is not None:
            second.stop()
        subprocess.run(gatewrap_cmd("gc"), capture_output=True, timeout=120)


def test_a_shared_runs_relative_policy_and_audit_log_are_the_clients_files_not_the_daemons(daemon, tmp_path):
    # The daemon's working directory is / (or wherever it was started): a relative --policy
    # read there is another file than the one the user named (or none), and a relative
    # --audit-log writes the run's records somewhere else.
    (tmp_path / "rel-policy.toml").write_text('version = 1\ndefault = "deny"\n\n[[rule]]\nhost = "rel.test"\naction = "allow"\n')
    p = subprocess.run([*gatewrap_cmd("run", "--policy", "rel-policy.toml", "--audit-log", "rel-audit.jsonl",
                                      "--workdir", "/tmp"), "--", "/bin/true"],
                       capture_output=True, text=True, env=_env(daemon), cwd=tmp_path, timeout=120)
    assert p.returncode == 0, p.stderr
    records = _records(tmp_path / "rel-audit.jsonl")
    start = [r for r in records if r.get("event") == "run_start"]
    assert len(start) == 1, records
    assert not os.path.exists("/rel-audit.jsonl")


def test_a_shared_runs_relative_workdir_is_the_clients_folder_not_the_daemons(daemon, shown, tmp_path):
    p = subprocess.run([*gatewrap_cmd("run", "--audit-log", str(tmp_path / "audit.jsonl"),
                                      "--workdir", shown.name), "--", AGENT_PYTHON, "-c", "import os; print(os.getcwd())"],
                       capture_output=True, text=True, env=_env(daemon), cwd=shown.parent, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == [str(shown)]
