"""``gatewrap ps`` and ``gatewrap stop`` on real runs: a sandboxed sleep and an agent that
tries a direct connection, both live at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import AGENT_PYTHON, AGENT_UID, ROOT, gatewrap_cmd, in_new_pid_namespace

pytestmark = pytest.mark.kernel

#: Tries one direct connection (refused by connect4: EPERM, an audit record; nothing leaves
#: the sandbox, whose netns has only lo), then waits to be stopped.
CONNECTS_THEN_WAITS = textwrap.dedent("""
    import socket, time
    try:
        socket.create_connection(("198.51.100.137", 80), timeout=5)
    except OSError:
        pass
    time.sleep(300)
""")

#: Forks one child that sleeps, then spins for 30 s (CPU for ps to see while the tests run),
#: then waits to be stopped.
BUSY_WITH_A_CHILD = textwrap.dedent("""
    import os, time
    if os.fork() == 0:
        time.sleep(300)
        os._exit(0)
    end = time.monotonic() + 30
    while time.monotonic() < end:
        pass
    time.sleep(300)
""")


def _gw(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(gatewrap_cmd(*args), capture_output=True, text=True, timeout=120, cwd=ROOT)


def _start(audit, *argv: str) -> subprocess.Popen:
    env = dict(os.environ, SUDO_UID=str(AGENT_UID), SUDO_GID=str(AGENT_UID))
    return subprocess.Popen(gatewrap_cmd("run", "--audit-log", str(audit), "--workdir", "/tmp", "--", *argv),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def _live(pid: int, until, wait: float = 60.0) -> dict:
    """The ``ps --json`` entry of the run whose gatewrap is ``pid``, once ``until(entry)``."""
    deadline = time.monotonic() + wait
    while True:
        p = _gw("ps", "--json")
        assert p.returncode == 0, p.stderr
        got = [r for r in json.loads(p.stdout) if r["pid"] == pid]
        if got and until(got[0]):
            return got[0]
        assert time.monotonic() < deadline, f"run of gatewrap {pid} not as expected in ps: {got}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("ps")
    sleeper = _start(d / "sleep.jsonl", "/bin/sleep", "300")
    connector = _start(d / "connect.jsonl", AGENT_PYTHON, "-c", CONNECTS_THEN_WAITS)
    busy = _start(d / "busy.jsonl", AGENT_PYTHON, "-c", BUSY_WITH_A_CHILD)
    yield {"sleep": (sleeper, d / "sleep.jsonl"), "connect": (connector, d / "connect.jsonl"),
           "busy": (busy, d / "busy.jsonl")}
    for p in (sleeper, connector, busy):
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def test_ps_shows_a_live_run_with_its_command_user_and_uptime(runs):
    p, audit = runs["sleep"]
    r = _live(p.pid, lambda r: r["argv"] is not None)
    assert r["argv"] == ["/bin/sleep", "300"] and r["user"] == "nobody" and r["uid"] == AGENT_UID
    assert r["run"].startswith("gw-") and r["audit_log"] == str(audit) and r["uptime_s"] >= 0
    assert (r["pending_approvals"], r["allowed"], r["denied"], r["direct_egress"], r["failed"]) == (0, 0, 0, 0, 0)
    table = _gw("ps").stdout.splitlines()
    assert table[0].split() == ["RUN", "PID", "USER", "UPTIME", "CPU%", "RSS", "PROCS", "PENDING", "ALLOWED",
                                "DENIED", "DIRECT", "FAILED", "COMMAND"]
    row = next(line for line in table if line.startswith(r["run"]))
    assert row.split()[1:3] == [str(p.pid), "nobody"] and row.endswith("/bin/sleep 300")


def _cgroup_procs(run: str) -> list[int]:
    from gatewrap.sandbox import cgroup

    with open(os.path.join(cgroup.cgroup2_mount(), "gatewrap", run, "cgroup.procs")) as f:
        return [int(line) for line in f]


def test_ps_shows_a_busy_runs_cpu_memory_and_processes(runs):
    """The busy agent spins (one CPU's worth) beside a sleeping child: its run's CPU % is
    well above zero, its process count is what its cgroup holds (the jail's init, the agent
    and its child), and a sleeping run's CPU % is about zero."""
    p, _ = runs["busy"]
    r = _live(p.pid, lambda r: r["argv"] is not None and r["procs"] >= 3)
    s = _live(runs["sleep"][0].pid, lambda r: r["argv"] is not None)
    assert isinstance(r["cpu_percent"], float) and r["cpu_percent"] > 20, r
    assert isinstance(r["rss"], int) and r["rss"] > 1 << 20, r
    assert isinstance(r["procs"], int) and r["procs"] == len(_cgroup_procs(r["run"])) == 3, r
    assert s["procs"] == 2 and s["cpu_percent"] < 20 and s["rss"] > 0, s
    row = next(line for line in _gw("ps").stdout.splitlines() if line.startswith(r["run"]))
    assert row.split()[6] == "3", row


def test_ps_lists_runs_by_start_oldest_first(runs):
    for p, _ in runs.values():
        _live(p.pid, lambda r: r["argv"] is not None)
    got = json.loads(_gw("ps", "--json").stdout)
    started = [r["started"] for r in got]
    assert started == sorted(started), [(r["run"], r["started"]) for r in got]
    table = [line.split()[0] for line in _gw("ps").stdout.splitlines()[1:]]
    assert [r for r in table if r in {g["run"] for g in got}] == [g["run"] for g in got if g["run"] in table]


def test_ps_counts_what_the_run_did_so_far(runs):
    p, _ = runs["connect"]
    r = _live(p.pid, lambda r: r["direct_egress"] >= 1)
    assert r["argv"][0] == AGENT_PYTHON
    assert (r["allowed"], r["denied"], r["direct_egress"], r["failed"]) == (0, 0, 1, 0)


def test_ps_shows_a_multi_line_python_c_script_on_one_line_as_bash_reads_it(runs):
    """The connecting agent's ``python3 -c SCRIPT``: one row, the script's newlines shown as
    ``\\n`` inside bash's ``$'...'`` (tests/test_ps_command.py: what bash reads back)."""
    p, _ = runs["connect"]
    r = _live(p.pid, lambda r: r["argv"] is not None)
    assert r["argv"] == [AGENT_PYTHON, "-c", CONNECTS_THEN_WAITS]
    row = next(line for line in _gw("ps").stdout.splitlines() if line.startswith(r["run"]))
    assert row.endswith(" -c $'" + CONNECTS_THEN_WAITS.replace("\n", "\\n") + "'"), row


def test_audit_of_a_live_run_in_another_log_says_which_log_it_writes(runs, tmp_path):
    # The new user's trip: `gatewrap audit --run ID` read the default log, found nothing, and
    # said only that; the run (ps knows it) writes to the log its --audit-log named.
    p, audit = runs["busy"]
    run = _live(p.pid, lambda r: r["argv"] is not None)["run"]
    other = tmp_path / "other.jsonl"
    other.write_text("")
    a = _gw("audit", "--log", str(other), "--run", run[:7])
    assert a.returncode == 0 and a.stdout == "", a
    assert f"run {run} writes to {audit}: gatewrap audit --log {audit} --run {run}" in a.stderr, a.stderr


def test_stop_ends_the_run_as_sigterm_would_and_it_records_run_end(runs):
    p, audit = runs["sleep"]
    run = _live(p.pid, lambda r: r["argv"] is not None)["run"]
    s = _gw("stop", run, "--json")
    assert s.returncode == 0 and s.stderr == "", s.stderr  # ended at once: no line saying it waits
    got = json.loads(s.stdout)
    # sleep dies of SIGTERM (forwarded by gatewrap to the jail's init): 128 + 15
    assert got["run"] == run and got["stopped"] is True and got["exit_code"] == 143, got
    assert p.wait(timeout=30) == 143
    ends = [json.loads(line) for line in audit.read_text().splitlines() if '"run_end"' in line]
    assert [(e["run"], e["exit_code"]) for e in ends] == [(run, 143)] and got["run_end"] == ends[0]
    assert run not in _gw("ps", "--json").stdout
    again = _gw("stop", run)
    assert again.returncode == 1 and f"no live run {run}" in again.stderr


#: Ignores SIGTERM (gatewrap forwards it to the agent), then waits to be stopped another way.
IGNORES_SIGTERM = textwrap.dedent("""
    import signal, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("ignoring", flush=True)
    time.sleep(300)
""")


def test_stop_of_an_agent_that_ignores_sigterm_says_on_stderr_that_it_waits_and_for_how_long(tmp_path):
    p = _start(tmp_path / "ignores.jsonl", AGENT_PYTHON, "-c", IGNORES_SIGTERM)
    try:
        assert p.stdout.readline() == "ignoring\n"
        run = _live(p.pid, lambda r: r["argv"] is not None)["run"]
        s = _gw("stop", "--timeout", "2", "--json", run)
        assert s.returncode == 125 and s.stdout == "", s
        said = s.stderr.splitlines()
        assert said[0] == (f"gatewrap: sent SIGTERM to run {run}; waiting up to 2 s (--timeout) for its agent to "
                           f"exit, then giving up (exit 125) and leaving it running"), said
        assert f"run {run} is still running 2 s after SIGTERM" in said[1], said
        with open(f"/sys/fs/cgroup/unified/gatewrap/{run}/cgroup.kill", "w") as f:  # as the error says
            f.write("1")
        assert p.wait(timeout=30) != 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_stop_by_a_start_of_the_id_says_the_whole_id_it_stopped(runs):
    p, _ = runs["connect"]
    run = _live(p.pid, lambda r: r["argv"] is not None)["run"]
    s = _gw("stop", run[:8])
    assert s.returncode == 0 and s.stdout.startswith(f"gatewrap: stopped {run}: "), s


def test_stop_of_an_unknown_run_exits_1():
    p = _gw("stop", "gw-0000000000")
    assert p.returncode == 1 and "no live run gw-0000000000 (gatewrap ps lists them)" in p.stderr, p.stderr
    p = _gw("stop", "gw-0000000000", "--json")
    assert p.returncode == 1 and p.stdout == ""


@pytest.mark.parametrize("cmd", [["ps"], ["stop", "gw-0000000000"]], ids=["ps", "stop"])
def test_without_root_ps_and_stop_exit_125_and_say_to_use_sudo(cmd):
    code = ("import os; from gatewrap.cli import main; import gatewrap.cli_host, gatewrap.runner, gatewrap.live_runs; "
            f"os.setresuid(65534, 65534, 0); main({cmd!r})")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 125 and f"sudo gatewrap {cmd[0]}" in p.stderr, p.stderr


@pytest.mark.parametrize("cmd", ["stop", "reload"])
def test_stop_and_reload_refuse_a_start_of_two_live_runs_ids_listing_both_and_signal_nothing(tmp_path, cmd):
    """Two live runs (lock files held by a process of this test's, naming a sleep of its
    own) whose ids share a start: that start names neither; the error lists both, as
    ``gatewrap audit --run`` does for the runs of a log."""
    start = "gw-" + os.urandom(4).hex()
    ids = [start + "0a", start + "0b"]
    bystander = subprocess.Popen(["sleep", "60"])
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
            import sys
            from gatewrap.sandbox import registry
            fds = [registry.claim(i, {str(tmp_path / 'audit.jsonl')!r}, pid={bystander.pid}) for i in {ids!r}]
            print("held", flush=True)
            sys.stdin.read()
            for i, fd in zip({ids!r}, fds):
                registry.release(i, fd)
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        got = [_gw(cmd, name, "--timeout", "1") for name in (start, start[3:])]
        time.sleep(0.2)
        bystander_alive = bystander.poll() is None
    finally:
        holder.communicate("", timeout=30)
        bystander.kill()
        bystander.wait()
    assert bystander_alive, f"{cmd} signalled the process the runs name"
    for name, p in zip((start, start[3:]), got):
        assert p.returncode == 1, p.stderr
        said = " ".join(p.stderr.split())
        assert f"{name} starts the id of more than one live run ({ids[0]}, {ids[1]}): give more of it" in said, said


def test_stop_refuses_a_run_whose_gatewrap_is_in_another_pid_namespace_and_signals_nothing(tmp_path):
    """A registry shared with a gatewrap in another pid namespace (a container given the
    host's /run): the pid its lock file names is another process here (a sleep of this
    test's, standing for whatever has that number), so stop refuses and signals nothing."""
    run_id = "gw-" + os.urandom(5).hex()
    bystander = subprocess.Popen(["sleep", "60"])
    holder = subprocess.Popen(
        in_new_pid_namespace(sys.executable, "-c", textwrap.dedent(f"""
            import sys
            from gatewrap.sandbox import registry
            fd = registry.claim({run_id!r}, {str(tmp_path / 'audit.jsonl')!r}, pid={bystander.pid})
            print("held", flush=True)
            sys.stdin.read()
            registry.release({run_id!r}, fd)
        """)), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        s = subprocess.run(gatewrap_cmd("stop", run_id, "--timeout", "1"), capture_output=True, text=True, timeout=60)
        time.sleep(0.2)
        bystander_alive = bystander.poll() is None
    finally:
        holder.communicate("", timeout=30)
        bystander.kill()
        bystander.wait()
    assert bystander_alive, "stop signalled the process its pid names here"
    assert s.returncode == 125, s.stderr
    assert f"run {run_id} is not this gatewrap's to stop" in s.stderr and "another pid namespace" in s.stderr


def test_ps_survives_processes_that_come_and_go_between_listing_and_reading(tmp_path):
    """An agent that starts a short-lived process every 10 ms: processes leave its cgroup
    between ps's listing and its reads (psutil.NoSuchProcess), and every ps still answers."""
    p = _start(tmp_path / "churn.jsonl", "/bin/sh", "-c", "end=$(($(date +%s) + 60)); "
               "while [ $(date +%s) -lt $end ]; do sleep 0.01; done")
    try:
        _live(p.pid, lambda r: r["argv"] is not None and r["procs"] >= 2)
        for _ in range(15):
            got = _gw("ps", "--json")
            assert got.returncode == 0, got.stderr
            (r,) = [r for r in json.loads(got.stdout) if r["pid"] == p.pid]
            assert isinstance(r["procs"], int) and r["procs"] >= 2, r
    finally:
        p.terminate()
        p.wait(timeout=30)
