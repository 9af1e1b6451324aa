"""The shared mode: one ``gatewrap daemon`` sets up and serves every run's sandbox, each
``gatewrap run --shared`` stays its agent's parent, and the contracts hold as in a run of its
own: complete mediation, fail closed when the daemon dies, a sandbox torn down when its
client dies, the exit code the agent's."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import AGENT_PYTHON, AGENT_UID, PUBLIC_RANGES, gatewrap_cmd
from gatewrap.shared.daemon import FDS_PER_SANDBOX

from .conftest import Daemon

pytestmark = pytest.mark.kernel

CURL = ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}\n", "--max-time", "10"]


def _run_cmd(net, audit, argv, *, allow=(), extra=()):
    cmd = gatewrap_cmd("run", "--audit-log", str(audit), "--resolver", net.dns_server, "--workdir", "/tmp",
                       "--ro-bind", net.tmpdir, *PUBLIC_RANGES)
    for a in allow:
        cmd += ["--allow", a]
    return [*cmd, *extra, "--", *argv]


def _env(d: Daemon, **more) -> dict:
    return {**os.environ, **d.env, "SUDO_UID": str(AGENT_UID), "SUDO_GID": str(AGENT_UID), **more}


def _records(audit) -> list[dict]:
    return [json.loads(line) for line in audit.read_text().splitlines() if line.strip()]


def _leftovers(run_id: str) -> list[str]:
    from gatewrap.sandbox import cgroup, netns

    return [*(n for n in netns.list_named() if n == run_id),
            *(c for c in cgroup.list_leaves(cgroup.parent_dir()) if c == run_id)]


def test_a_shared_run_decides_like_a_run_of_its_own_and_keeps_the_agents_exit_code(net, daemon, tmp_path):
    audit = tmp_path / "audit.jsonl"
    probe = ("import socket, subprocess, sys\n"
             "print(subprocess.run(" + repr(CURL) + " + ['http://allowed.test/'], capture_output=True, text=True).stdout.strip())\n"
             "print(subprocess.run(" + repr(CURL) + " + ['http://denied.test/'], capture_output=True, text=True).stdout.strip())\n"
             "s = socket.socket()\n"
             "try:\n    s.connect(('198.51.100.138', 80))\nexcept OSError as e:\n    print(e.errno)\n"
             "sys.exit(7)\n")
    p = subprocess.run(_run_cmd(net, audit, [AGENT_PYTHON, "-c", probe], allow=["allowed.test"]),
                       capture_output=True, text=True, timeout=120, env=_env(daemon))
    assert p.returncode == 7, p.stderr
    assert p.stdout.split() == ["200", "403", "1"], p.stderr  # EPERM = 1
    assert "gatewrap: denied GET denied.test:80 (policy: default deny)" in p.stderr
    assert "direct egress" in p.stderr.lower() or "EPERM" in p.stderr
    assert "exited 7: 1 allowed, 1 denied by the gate, 1 direct egress blocked" in p.stderr
    recs = _records(audit)
    run_id = next(r["run"] for r in recs if r["event"] == "run_start")
    end = [r for r in recs if r["event"] == "run_end"]
    assert len(end) == 1 and end[0]["exit_code"] == 7 and end[0]["direct_egress"] == 1
    assert _leftovers(run_id) == []


@pytest.fixture
def shown(tmp_path):
    """A folder the agent's user can reach (pytest's tmp_path is under a 0700 folder)."""
    d = tempfile.mkdtemp(prefix="gwt-shared-")
    os.chmod(d, 0o777)
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


def test_runs_share_one_daemon_and_each_keeps_its_own_policy_and_audit_log(net, daemon, tmp_path, shown):
    procs = []
    for i, host in enumerate(("allowed.test", "evil.test")):
        audit = tmp_path / f"audit-{i}.jsonl"
        # each waits until the test lets it go, so both sandboxes are up at once
        script = (f"import os, subprocess, time\n"
                  f"while not os.path.exists('{shown}/go'): time.sleep(0.05)\n"
                  f"for h in ('allowed.test', 'evil.test'):\n"
                  f"    print(h, subprocess.run({CURL!r} + ['http://' + h + '/'], capture_output=True, text=True).stdout.strip())\n")
        procs.append((audit, subprocess.Popen(
            _run_cmd(net, audit, [AGENT_PYTHON, "-c", script], allow=[host], extra=["--ro-bind", str(shown)]),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(daemon))))
    deadline = time.monotonic() + 60
    while len(daemon.status()["runs"]) < 2:
        assert time.monotonic() < deadline, daemon.log_text()
        time.sleep(0.1)
    (shown / "go").write_text("")
    outs = []
    for audit, p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        outs.append((out.split(), {r["run"] for r in _records(audit) if "run" in r}))
    assert outs[0][0] == ["allowed.test", "200", "evil.test", "403"]
    assert outs[1][0] == ["allowed.test", "403", "evil.test", "200"]
    assert len(outs[0][1]) == 1 and len(outs[1][1]) == 1 and outs[0][1] != outs[1][1]


def _fetching_agent(net, audit, script: str, shown, d: Daemon, *extra: str, stderr=subprocess.PIPE) -> subprocess.Popen:
    """``gatewrap run --shared [EXTRA]`` of ``script`` (allowed.test allowed, ``shown`` visible),
    once its first line said ``before 200`` (a request through the gate went out)."""
    p = subprocess.Popen(_run_cmd(net, audit, [AGENT_PYTHON, "-c", script], allow=["allowed.test"],
                                  extra=["--ro-bind", str(shown), *extra]),
                         stdout=subprocess.PIPE, stderr=stderr, text=True, env=_env(d))
    assert p.stdout.readline().split() == ["before", "200"], p.stderr.read() if p.poll() is not None and p.stderr else ""
    return p


def test_a_dead_daemon_leaves_the_sandbox_without_egress_and_the_agent_runs_on(net, tmp_path, shown):
    d = Daemon().start()
    try:
        audit = tmp_path / "audit.jsonl"
        marker = shown / "dead"
        script = (f"import os, socket, subprocess, sys, time\n"
                  f"print('before', subprocess.run({CURL!r} + ['http://allowed.test/'], capture_output=True, text=True).stdout.strip(), flush=True)\n"
                  f"while not os.path.exists('{marker}'): time.sleep(0.05)\n"
                  f"print('after', subprocess.run({CURL!r} + ['http://allowed.test/'], capture_output=True, text=True).stdout.strip() or 'none', flush=True)\n"
                  f"s = socket.socket()\n"
                  f"try:\n    s.connect(('198.51.100.138', 80)); print('direct CONNECTED')\nexcept OSError as e:\n    print('direct', e.errno)\n"
                  f"sys.exit(3)\n")
        p = _fetching_agent(net, audit, script, shown, d)
        d.kill(signal.SIGKILL)
        # gc (and a run of its own, which collects first) leaves a run whose waiter still waits
        # for a daemon: only a daemon may give up on it.
        run_id = next(r["run"] for r in _records(audit) if r["event"] == "run_start")
        g = subprocess.run(gatewrap_cmd("gc", "--json"), capture_output=True, text=True, timeout=120)
        assert g.returncode == 0, g.stderr
        assert json.loads(g.stdout)["waiting"] == [[run_id, p.pid]] and run_id not in json.loads(g.stdout)["runs"]
        g = subprocess.run(gatewrap_cmd("gc"), capture_output=True, text=True, timeout=120)
        assert f"left {run_id}: its gatewrap run (pid {p.pid}) waits" in g.stdout, g.stdout
        # ps still lists it (its waiter's pid), so `gatewrap stop` can reach it.
        ps = subprocess.run(gatewrap_cmd("ps", "--json"), capture_output=True, text=True, timeout=60)
        assert [(r["run"], r["pid"]) for r in json.loads(ps.stdout) if r["run"] == run_id] == [(run_id, p.pid)], ps.stdout
        marker.write_text("")
        out, err = p.communicate(timeout=120)
        assert out.split() == ["after", "000", "direct", "1"], err   # curl: no gate to connect to
        assert p.returncode == 3, err
        assert "daemon went away" in err
    finally:
        d.stop()
        subprocess.run(gatewrap_cmd("gc"), capture_output=True, timeout=120)


def test_a_client_that_dies_has_its_sandbox_torn_down_and_its_run_ended(net, daemon, tmp_path):
    audit = tmp_path / "audit.jsonl"
    p = subprocess.Popen(_run_cmd(net, audit, ["/usr/bin/sleep", "300"]), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=_env(daemon))
    deadline = time.monotonic() + 60
    while not daemon.status()["runs"]:
        assert time.monotonic() < deadline, daemon.log_text()
        time.sleep(0.1)
    run_id = daemon.status()["runs"][0]
    time.sleep(0.5)  # let the client spawn and become the waiter
    p.kill()
    p.wait(timeout=30)
    deadline = time.monotonic() + 60
    while run_id in daemon.status()["runs"] or _leftovers(run_id):
        assert time.monotonic() < deadline, (daemon.log_text(), _leftovers(run_id))
        time.sleep(0.1)
    end = [r for r in _records(audit) if r["event"] == "run_end"]
    assert len(end) == 1 and "exit_code" not in end[0] and "went away" in end[0]["reason"]


def test_sigterm_to_the_client_reaches_the_agent_and_timeout_kills_it(net, daemon, tmp_path):
    audit = tmp_path / "a.jsonl"
    p = subprocess.Popen(_run_cmd(net, audit, ["/usr/bin/sleep", "300"]), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=_env(daemon))
    deadline = time.monotonic() + 60
    while not any(r.get("event") == "run_start" for r in (_records(audit) if audit.exists() else [])):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    time.sleep(0.5)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 143, err
    t = subprocess.run(_run_cmd(net, tmp_path / "b.jsonl", ["/usr/bin/sleep", "300"], extra=["--timeout", "1"]),
                       capture_output=True, text=True, timeout=120, env=_env(daemon))
    assert t.returncode == 124, t.stderr
    assert "--timeout 1 s reached" in t.stderr


def test_the_daemon_socket_is_roots_alone_and_a_refused_run_leaves_nothing(net, daemon, tmp_path):
    st = os.stat(daemon.socket)
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == 0
    pid = os.fork()
    if pid == 0:  # a non-root process cannot even connect
        os.setgid(AGENT_UID)
        os.setuid(AGENT_UID)
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(daemon.socket)
            os._exit(1)
        except PermissionError:
            os._exit(0)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    bad = subprocess.run(_run_cmd(net, tmp_path / "audit.jsonl", ["/nonexistent/agent"]),
                         capture_output=True, text=True, timeout=60, env=_env(daemon))
    assert bad.returncode == 127 and "command not found" in bad.stderr
    assert daemon.status()["runs"] == []
    elsewhere = subprocess.run(gatewrap_cmd("daemon", "--socket", "/tmp/gatewrap.sock"), capture_output=True,
                               text=True, timeout=30)
    assert elsewhere.returncode == 125 and "must be a file directly in /run/gatewrap" in elsewhere.stderr


def test_the_daemon_serves_the_review_pages_too(tmp_path):
    import re
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    d = Daemon("--review", f"127.0.0.1:{port}", "--state", f"sqlite:{tmp_path}/state.db").start()
    try:
        deadline = time.monotonic() + 30
        while not (m := re.search(r"review pages at (http://\S+/l/\S+)", d.log_text())):
            assert time.monotonic() < deadline, d.log_text()
            time.sleep(0.05)
        with urllib.request.urlopen(m.group(1), timeout=10) as page:
            assert page.status == 200 and b"approvals" in page.read().lower()
        refused = Daemon("--review", "198.51.100.1:80")
        p = subprocess.run(gatewrap_cmd("daemon", "--socket", refused.socket, "--review", "198.51.100.1:80"),
                           capture_output=True, text=True, timeout=30)
        assert p.returncode == 125 and "not a loopback address" in p.stderr
    finally:
        d.stop()


def test_a_restarted_daemon_takes_its_runs_back_and_the_agent_never_noticed_but_the_gap(net, tmp_path, shown):
    first = Daemon().start()
    second = None
    try:
        audit = tmp_path / "audit.jsonl"
        step = shown / "step"
        script = (f"import os, subprocess, sys, time\n"
                  f"def fetch():\n"
                  f"    return subprocess.run({CURL!r} + ['http://allowed.test/'], capture_output=True, text=True).stdout.strip()\n"
                  f"def wait(n):\n"
                  f"    while not os.path.exists('{step}') or open('{step}').read() != n: time.sleep(0.05)\n"
                  f"print('before', fetch(), flush=True)\n"
                  f"wait('1'); print('gap', fetch() or 'none', flush=True)\n"
                  f"wait('2'); print('after', fetch(), flush=True)\n"
                  f"sys.exit(5)\n")
        # stderr to a file opened as a shell's `>` opens it (no O_APPEND): the daemon writes
        # through the waiter's own descriptor (sent with `resume`), so nothing overwrites.
        stderr_file = tmp_path / "stderr"
        with open(stderr_file, "w") as err_out:
            p = _fetching_agent(net, audit, script, shown, first, "--json", stderr=err_out)
        first.kill(signal.SIGKILL)
        step.write_text("1")
        assert p.stdout.readline().split() == ["gap", "000"]   # no gate: fail closed
        second = Daemon.restart_of(first)          # the same socket: a restart
        deadline = time.monotonic() + 60
        while not second.status()["runs"]:
            assert time.monotonic() < deadline, second.log_text()
            time.sleep(0.1)
        # ps reads the run from its run_start on (its user, its request before the restart).
        ps = subprocess.run(gatewrap_cmd("ps", "--json"), capture_output=True, text=True, timeout=60)
        row = next(r for r in json.loads(ps.stdout) if r["run"] == second.status()["runs"][0])
        assert row["user"] is not None and row["argv"] is not None and row["allowed"] == 1, row
        step.write_text("2")
        out, _ = p.communicate(timeout=120)
        err = stderr_file.read_text()
        assert out.split() == ["after", "200"], err
        assert p.returncode == 5, err
        assert 0 <= err.index("daemon went away") < err.index("daemon is back"), err
        assert json.loads(err.strip().splitlines()[-1])["exit_code"] == 5  # --json kept across the restart
        assert "\x00" not in err and all(line.startswith(("gatewrap", "{")) for line in err.splitlines()), err
        recs = _records(audit)
        run_id = next(r["run"] for r in recs if r["event"] == "run_start")
        assert [r["exit_code"] for r in recs if r["event"] == "run_end"] == [5]
        # The gap is on the record: one run_resumed, after the request before it, before the one after.
        events = [r["event"] for r in recs if r.get("run") == run_id and r["event"] in ("request", "run_resumed")]
        assert events == ["request", "run_resumed", "request"], events
        resumed = next(r for r in recs if r["event"] == "run_resumed")
        assert "refused every connection to the gate" in resumed["reason"]
        assert resumed["since"] >= next(r["time"] for r in recs if r["event"] == "request")
        # run_end and the summary count the whole run: the request before the restart too.
        assert [r["allowed"] for r in recs if r["event"] == "run_end"] == [2]
        assert json.loads(err.strip().splitlines()[-1])["allowed"] == 2
        assert len([r for r in recs if r.get("event") == "request" and r.get("decision") == "allowed"]) == 2
        assert _leftovers(run_id) == []
    finally:
        first.stop()
        if second is not None:
            second.stop()


def test_gc_drops_map_entries_a_cut_short_teardown_left():
    """A daemon killed mid-teardown can leave a run's entries in the hooks' maps after its
    cgroup is gone; gc (and a daemon's start) drop them, so the maps (GW_MAX_RUNS) never fill."""
    from gatewrap.bpf import loader
    from gatewrap.sandbox import cgroup

    parent = cgroup.parent_dir()
    hooks = loader.load_or_reuse(parent)
    try:
        ghost = 0x7FFF_FFFF_0000_0001  # no cgroup has this inode number
        hooks.configure(ghost, "127.0.0.1", "::1", [3128, 53], [53])
        assert hooks.orphan(ghost) is not None
        g = subprocess.run(gatewrap_cmd("gc", "--json"), capture_output=True, text=True, timeout=60)
        assert g.returncode == 0, g.stderr
        assert hooks.orphan(ghost) is None
    finally:
        hooks.close()


def test_a_daemon_started_on_demand_runs_in_a_cgroup_of_its_own(net, tmp_path):
    """The first ``run --shared`` with no daemon starts one, outside the client's cgroup (a
    login session's scope, whose end would take the daemon and every run's gate with it)."""
    d = Daemon()  # not started: the run starts it
    try:
        audit = tmp_path / "audit.jsonl"
        r = subprocess.run(_run_cmd(net, audit, ["/bin/true"]), capture_output=True, text=True, env=_env(d), timeout=120)
        assert r.returncode == 0, r.stderr
        pid = d.status()["pid"]
        with open(f"/proc/{pid}/cgroup") as f:
            assert f.read().strip().endswith(":/gatewrap-daemon"), f"daemon pid {pid}"
    finally:
        with contextlib.suppress(Exception):
            os.kill(d.status()["pid"], signal.SIGTERM)
        d.stop()


def test_a_daemon_whose_hooks_were_loaded_again_starts_new_runs_on_the_new_ones(net, daemon, tmp_path):
    # Hooks loaded again (an unload, another version, a chroot's gatewrap on this kernel) pin
    # new maps: a run configured in the daemon's old ones could not even reach its gate.
    from gatewrap.bpf import loader
    from gatewrap.sandbox import cgroup

    audit = tmp_path / "before.jsonl"
    p = subprocess.run(_run_cmd(net, audit, [*CURL, "http://allowed.test/"], allow=["allowed.test"]),
                       capture_output=True, text=True, env=_env(daemon), timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "200", p.stderr
    # The hooks are the host's: no run of any test may be active while they are unloaded. A
    # run of an earlier test whose client was killed is torn down by its daemon afterwards.
    deadline = time.monotonic() + 30
    while cgroup.list_leaves(cgroup.parent_dir()) and time.monotonic() < deadline:
        time.sleep(0.1)
    loader.unload(cgroup.parent_dir())
    loader.load_or_reuse(cgroup.parent_dir()).close()
    audit = tmp_path / "after.jsonl"
    p = subprocess.run(_run_cmd(net, audit, [*CURL, "http://allowed.test/"], allow=["allowed.test"]),
                       capture_output=True, text=True, env=_env(daemon), timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "200", p.stderr + daemon.log_text()
    assert "new runs use the new ones" in daemon.log_text()


def test_a_daemon_started_with_a_low_open_file_limit_raises_it_and_says_how_many_sandboxes_it_has_room_for():
    """FDS_PER_SANDBOX descriptors an idle sandbox: a daemon started from a shell's soft limit
    (1,024) would stop near a hundred sandboxes; it raises the limit to the hard one (to fs.nr_open where it
    may raise that: CAP_SYS_RESOURCE) and says what room that leaves."""
    d = Daemon()
    with open(d.log, "ab") as log:
        d.proc = subprocess.Popen(["prlimit", "--nofile=1024:", "--", *gatewrap_cmd("daemon", "--socket", d.socket)],
                                  stdout=log, stderr=log, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while "serving" not in d.log_text():
            assert d.proc.poll() is None and time.monotonic() < deadline, d.log_text()
            time.sleep(0.05)
        with open(f"/proc/{d.proc.pid}/limits") as f:
            soft, hard = next(line for line in f if line.startswith("Max open files")).split()[3:5]
    finally:
        d.stop()
    assert soft == hard and int(soft) > 1024, (soft, hard)
    said = re.search(r"file descriptor limit ([\d,]+), (\d+) its own: room for about ([\d,]+) idle sandboxes", d.log_text())
    assert said, d.log_text()
    limit, own, room = (int(x.replace(",", "")) for x in said.groups())
    assert limit == int(soft) and 3 < own < 200 and room == (limit - own) // FDS_PER_SANDBOX, said.group(0)


def test_daemon_stop_stops_the_daemon_and_says_which_runs_lost_their_gates(tmp_path):
    d = Daemon().start()
    try:
        stop = subprocess.run(gatewrap_cmd("daemon", "--socket", d.socket, "--stop"), capture_output=True, text=True,
                              timeout=90)
        assert stop.returncode == 0, stop.stderr
        assert f"stopped the daemon (pid {d.proc.pid}) on {d.socket}" in stop.stdout, stop.stdout
        assert d.proc.wait(timeout=10) is not None
        again = subprocess.run(gatewrap_cmd("daemon", "--socket", d.socket, "--stop"), capture_output=True, text=True,
                               timeout=30)
        assert again.returncode == 1 and "no gatewrap daemon answers" in again.stderr, again.stderr
    finally:
        d.stop()


def test_a_sigterm_any_thread_of_the_daemon_takes_stops_it():
    """kill(2) hands a signal to any thread that does not block it (signal(7)); Python runs
    its handler on the main thread alone, which sleeps in poll(2): the daemon must wake for a
    SIGTERM another thread took (on main a daemon went on serving: CI, test_stale_files)."""
    import ctypes

    d = Daemon().start()
    try:
        others = sorted(int(t) for t in os.listdir(f"/proc/{d.proc.pid}/task") if int(t) != d.proc.pid)
        assert others, "an idle daemon has threads besides its main one"
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.tgkill(d.proc.pid, others[-1], signal.SIGTERM) == 0, os.strerror(ctypes.get_errno())
        assert d.proc.wait(timeout=10) == 0, d.log_text()
        assert "stopping; 0 runs lose" in d.log_text()
        assert not os.path.exists(d.socket) and not os.path.exists(d.socket + ".lock")
    finally:
        d.stop()


def _soft_nofile(pid: int) -> int:
    with open(f"/proc/{pid}/limits") as f:
        return int(next(line for line in f if line.startswith("Max open files")).split()[3])


def test_status_says_the_daemons_descriptor_limit_and_the_room_left_for_idle_sandboxes(daemon):
    got = daemon.status()
    limit, held = _soft_nofile(got["pid"]), len(os.listdir(f"/proc/{got['pid']}/fd"))
    fds = got["fds"]
    assert fds["limit"] == limit and abs(fds["open"] - held) <= 2, (fds, limit, held)  # the asking connection's
    assert fds["sandbox_room"] == (limit - fds["open"]) // FDS_PER_SANDBOX, fds
    text = subprocess.run(gatewrap_cmd("daemon", "--socket", daemon.socket, "--status"), capture_output=True, text=True,
                          timeout=30)
    assert (f"file descriptor limit {limit:,}, " in text.stdout and " open: room for about " in text.stdout
            and "more idle sandboxes" in text.stdout), text
