"""The shared daemon's life: started on demand by the default ``gatewrap run`` (one daemon
for runs starting at once), its exit after an idle time (a run arriving meanwhile is not
lost), a run of its own where no daemon can start and with ``--own``, and what a finished
run leaves in it (nothing). Every daemon here is on a socket of the test's own."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import subprocess
import time

import pytest

from conftest import AGENT_UID, gatewrap_cmd
from gatewrap.shared.daemon import FDS_PER_SANDBOX

from .conftest import Daemon, lock_holder

pytestmark = pytest.mark.kernel


DAEMON_LOG = "/var/log/gatewrap/daemon.log"


def _env(d: Daemon, **more: str) -> dict:
    """The environment of a default ``gatewrap run`` (no GATEWRAP_SHARED) on ``d``'s socket."""
    env = {k: v for k, v in os.environ.items() if k != "GATEWRAP_SHARED"}
    return {**env, "GATEWRAP_DAEMON_SOCKET": d.socket, "SUDO_UID": str(AGENT_UID), "SUDO_GID": str(AGENT_UID), **more}


def _cmd(audit, *flags: str) -> list[str]:
    return gatewrap_cmd("run", *flags, "--audit-log", str(audit), "--workdir", "/tmp", "--", "/bin/true")


def _true_run(d: Daemon, audit, *flags: str, **env: str) -> subprocess.CompletedProcess:
    """``gatewrap run [FLAGS] --audit-log AUDIT -- /bin/true`` on ``d``'s socket."""
    return subprocess.run(_cmd(audit, *flags), capture_output=True, text=True, env=_env(d, **env), timeout=120)


def _ended(audit) -> bool:
    return any('"run_end"' in line for line in audit.read_text().splitlines())


def _started_lines(stderr: str) -> list[int]:
    """The pids of the ``started the shared daemon (pid N, ...)`` lines of a run's stderr."""
    return [int(m) for m in re.findall(r"^gatewrap: started the shared daemon \(pid (\d+),", stderr, re.M)]


def _serving_lines(d: Daemon) -> int:
    """How many daemons started on demand on ``d``'s socket said they serve it."""
    with open(DAEMON_LOG, errors="replace") as f:
        return sum(f"): serving {d.socket} " in line for line in f)


@contextlib.contextmanager
def _private_socket():
    """A socket of the test's own with no daemon yet; any daemon on it is stopped at the end."""
    d = Daemon()
    try:
        yield d
    finally:
        pid = lock_holder(d.socket)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 30
            while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
                time.sleep(0.05)
        d.stop()


def test_the_default_run_starts_the_shared_daemon_on_demand_and_says_so_once(tmp_path):
    with _private_socket() as d:
        first = _true_run(d, tmp_path / "first.jsonl")
        assert first.returncode == 0, first.stderr
        started = _started_lines(first.stderr)
        assert len(started) == 1, first.stderr
        assert "exits after 10m without a run; gatewrap daemon --status" in first.stderr
        assert d.status()["pid"] == started[0]
        with open(f"/proc/{started[0]}/cmdline") as f:
            assert f.read().split("\0")[-3:-1] == ["--idle-exit", "10m"]
        second = _true_run(d, tmp_path / "second.jsonl")
        assert second.returncode == 0 and _started_lines(second.stderr) == [], second.stderr
        assert _ended(tmp_path / "first.jsonl") and _ended(tmp_path / "second.jsonl")
        assert "runs on its own" not in first.stderr + second.stderr


def test_runs_starting_at_once_start_one_daemon(tmp_path):
    with _private_socket() as d:
        procs = [subprocess.Popen(_cmd(tmp_path / f"audit-{i}.jsonl"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=_env(d)) for i in range(4)]
        errs = []
        for p in procs:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
            errs.append(err)
        assert sum(len(_started_lines(e)) for e in errs) == 1, errs
        assert _serving_lines(d) == 1
        assert "runs on its own" not in "".join(errs)


def test_the_daemon_exits_after_its_idle_time_and_the_next_run_starts_another(tmp_path):
    d = Daemon("--idle-exit", "1s").start()
    try:
        r = _true_run(d, tmp_path / "a.jsonl")
        assert r.returncode == 0 and _started_lines(r.stderr) == [], r.stderr
        assert d.proc.wait(timeout=60) == 0, d.log_text()
        assert "exiting: no run for 1 s (--idle-exit)" in d.log_text()
        assert not os.path.exists(d.socket)
    finally:
        d.stop()
    with _private_socket() as again:
        again.socket = d.socket
        r = _true_run(again, tmp_path / "b.jsonl")
        assert r.returncode == 0 and len(_started_lines(r.stderr)) == 1, r.stderr


def test_runs_arriving_while_the_daemon_leaves_on_its_idle_time_are_all_served(tmp_path):
    # runs spaced around the idle time: each finds the daemon, or starts a new one; none is lost
    d = Daemon("--idle-exit", "1s").start()
    with _private_socket() as later:
        later.socket = d.socket
        try:
            for i, pause in enumerate((0.9, 1.0, 1.05, 1.1, 0.95, 1.0)):
                time.sleep(pause)
                r = _true_run(d, tmp_path / f"audit-{i}.jsonl")
                assert r.returncode == 0, r.stderr
                assert "runs on its own" not in r.stderr and _ended(tmp_path / f"audit-{i}.jsonl")
        finally:
            d.stop()


def test_where_no_daemon_can_start_the_run_runs_on_its_own_and_says_so_in_one_line(tmp_path):
    with _private_socket() as d:
        os.makedirs(os.path.dirname(d.socket), exist_ok=True)
        # the socket's lock held by what does not answer (a daemon stuck in its start): the
        # daemon the run starts finds it taken and exits
        with open(d.socket + ".lock", "w") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            r = _true_run(d, tmp_path / "audit.jsonl")
        assert r.returncode == 0, r.stderr
        said = [line for line in r.stderr.splitlines() if "runs on its own" in line]
        assert len(said) == 1 and said[0].startswith("gatewrap: the shared gatewrap daemon did not start (it exited 0;")
        assert _started_lines(r.stderr) == []
        assert _ended(tmp_path / "audit.jsonl")


@pytest.mark.parametrize("how", [("--own",), ()], ids=["--own", "GATEWRAP_SHARED=0"])
def test_own_or_gatewrap_shared_0_is_a_run_of_its_own_and_starts_no_daemon(tmp_path, how):
    with _private_socket() as d:
        r = _true_run(d, tmp_path / "audit.jsonl", *how, **({} if how else {"GATEWRAP_SHARED": "0"}))
        assert r.returncode == 0, r.stderr
        assert _started_lines(r.stderr) == [] and "runs on its own" not in r.stderr
        assert not os.path.exists(d.socket)
        assert _ended(tmp_path / "audit.jsonl")


def _fds(pid: int) -> dict[str, str]:
    """Open descriptors of process ``pid``: fd -> what it is (/proc/PID/fd, proc(5))."""
    out = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out[fd] = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:
            pass
    return out


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def _steady(pid: int) -> tuple[int, int]:
    """(open fds, threads) of ``pid`` once they stayed the same for a second (at most 30 s)."""
    deadline = time.monotonic() + 30
    last = None
    while True:
        now = len(_fds(pid)), _threads(pid)
        if now == last or time.monotonic() > deadline:
            return now
        last = now
        time.sleep(1)


def _settled(pid: int, fds: int, threads: int) -> tuple[int, int]:
    """(open fds, threads) of ``pid`` once both are at most ``fds`` and ``threads``, or as they
    are after 30 s (a run's last teardown steps, and idle pool threads, end on their own)."""
    deadline = time.monotonic() + 30
    while True:
        now = len(_fds(pid)), _threads(pid)
        if (now[0] <= fds and now[1] <= threads) or time.monotonic() > deadline:
            return now
        time.sleep(0.2)


#: What the daemon holds for each idle sandbox, by kind (issue 23, target 4: its descriptors,
#: against its RLIMIT_NOFILE, bound how many sandboxes one daemon serves): the gate's
#: listeners in the run's netns (the proxy and the DNS stub's UDP and TCP, each one socket
#: for 127.0.0.1 and ::1) and the client's connection; the run's lock (it is alive while held:
#: gatewrap.sandbox.registry); its ring buffer (read through its memory: no epoll of its own);
#: the client's stderr (the run's notices: the daemon's and the gate's); its audit log (runs
#: naming the same log share one). Not the netns (the gate's sockets hold it; the client got a
#: descriptor of its own to join it) nor an eventfd (the daemon's one reader polls every run).
IDLE_SANDBOX_FDS = {"socket": 4, "run lock": 1, "bpf-map": 1, "terminal": 2, "audit log": 1}


def _kind(target: str, audit_dir: str) -> str:
    """What a descriptor's /proc/PID/fd link ``target`` is, in :data:`IDLE_SANDBOX_FDS`' words."""
    if target.startswith(audit_dir):
        return "audit log"
    if target.startswith("/run/gatewrap/runs/"):
        return "run lock"
    if target.startswith("pipe:"):
        return "terminal"
    if target.startswith("anon_inode:"):
        return target.removeprefix("anon_inode:").strip("[]")
    return target.split(":")[0]


def _by_kind(pid: int, audit_dir: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for target in _fds(pid).values():
        kind = _kind(target, audit_dir)
        out[kind] = out.get(kind, 0) + 1
    return out


#: Idle sandboxes the descriptor count is taken over (each kind's growth must be a multiple).
IDLE = 3


def _agents_running(d: Daemon, n: int) -> list[str]:
    """The ids of ``d``'s ``n`` runs once each has a process in its cgroup (at most 60 s)."""
    from gatewrap.sandbox import cgroup

    deadline = time.monotonic() + 60
    while True:
        runs = d.status()["runs"]
        if len(runs) == n and all(cgroup.populated(os.path.join(cgroup.parent_dir(), r)) for r in runs):
            return runs
        assert time.monotonic() < deadline, (runs, d.log_text())
        time.sleep(0.1)


def test_an_idle_sandbox_costs_the_daemon_nine_descriptors_no_thread_and_a_finished_run_none(tmp_path):
    d = Daemon().start()
    idle: list[subprocess.Popen] = []
    try:
        pid = d.proc.pid
        first = _true_run(d, tmp_path / "first.jsonl")  # what a first run makes once (the runtime, the reader)
        assert first.returncode == 0, first.stderr
        fds, threads = _steady(pid)
        folder = tmp_path / "idle"
        folder.mkdir()
        before = _by_kind(pid, str(folder))
        for i in range(IDLE):
            idle.append(subprocess.Popen(
                gatewrap_cmd("run", "--audit-log", str(folder / f"audit-{i}.jsonl"), "--workdir", "/tmp", "--",
                             "/bin/sleep", "600"),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=_env(d)))
        _agents_running(d, IDLE)
        _steady(pid)
        now = _by_kind(pid, str(folder))
        each = {k: (now.get(k, 0) - before.get(k, 0)) / IDLE for k in {*now, *before} if now.get(k, 0) != before.get(k, 0)}
        assert each == IDLE_SANDBOX_FDS, (each, sorted(_fds(pid).values()))
        assert sum(IDLE_SANDBOX_FDS.values()) == FDS_PER_SANDBOX  # what the daemon's log says it has room for
        # Nor a thread: each log's writer thread ends after 5 s without a record (audit/queue.rs).
        deadline = time.monotonic() + 30
        while _audit_writers(pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _audit_writers(pid) == 0, f"{IDLE} idle sandboxes with a log each kept writer threads"
        for p in idle:
            p.send_signal(signal.SIGTERM)
        for p in idle:
            p.communicate(timeout=60)
        logs = [tmp_path / f"audit-{i}.jsonl" for i in range(5)]
        for log in logs:
            r = _true_run(d, log)
            assert r.returncode == 0, r.stderr
            assert any(rec for rec in log.read_text().splitlines() if '"run_end"' in rec)
        after = _settled(pid, fds, threads)
        still_open = [what for what in _fds(pid).values() if what.startswith(str(tmp_path))]
        assert still_open == [], d.log_text()
        assert after[0] <= fds, f"open fds {after[0]}, {fds} before the runs: {sorted(_fds(pid).values())}"
        assert after[1] <= threads, f"threads {after[1]}, {threads} before the runs"
    finally:
        for p in idle:
            if p.poll() is None:
                p.kill()
        d.stop()


def _audit_writers(pid: int) -> int:
    """How many of ``pid``'s threads are audit writers (named ``gw-audit``, audit/mod.rs)."""
    n = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError):
            n += open(f"/proc/{pid}/task/{tid}/comm").read().strip() == "gw-audit"
    return n


def _run_id(audit) -> str:
    return next(json.loads(line)["run"] for line in audit.read_text().splitlines() if '"run_start"' in line)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_daemon_stopped_right_after_a_run_leaves_nothing_of_it(tmp_path, sig):
    # The run's staged files (and its ring buffer's release) are removed after its client has
    # been let go: a daemon stopped at that moment finishes that removal before it exits.
    d = Daemon().start()
    try:
        audit = tmp_path / "audit.jsonl"
        r = _true_run(d, audit)
        assert r.returncode == 0, r.stderr
        d.kill(sig)  # at once: the run's end may still be under way
        assert d.proc.returncode is not None, d.log_text()
        run_id = _run_id(audit)
        assert [s for s in os.listdir("/run/gatewrap-staged") if s.startswith(f"{run_id}-")] == [], d.log_text()
    finally:
        d.stop()


def _files_of(d: Daemon) -> list[str]:
    """What of ``d``'s socket is in its folder: the socket, its lock, its start lock."""
    return [p for p in (d.socket, d.socket + ".lock", d.socket + ".start") if os.path.exists(p)]


@pytest.mark.parametrize("how", ["SIGTERM", "its idle time"])
def test_a_daemon_that_stops_leaves_neither_its_socket_nor_its_lock_files(tmp_path, how):
    # /run/gatewrap would otherwise gather a SOCKET.lock and SOCKET.start per socket path ever served
    d = Daemon(*(["--idle-exit", "1s"] if how != "SIGTERM" else [])).start()
    try:
        r = _true_run(d, tmp_path / "audit.jsonl")
        assert r.returncode == 0, r.stderr
        assert d.socket + ".lock" in _files_of(d)
        if how == "SIGTERM":
            d.kill(signal.SIGTERM)
        assert d.proc.wait(timeout=60) == 0, d.log_text()
        assert _files_of(d) == [], d.log_text()
    finally:
        d.stop()


def test_a_daemon_out_of_descriptors_tells_the_next_client_and_serves_on_once_it_has_some(tmp_path):
    # A daemon at its open-file limit (thousands of idle sandboxes, or their agents' connections
    # to their gates) must not die on the next client's accept(2): every run's gate goes with it.
    import resource

    d = Daemon().start()
    try:
        pid = d.proc.pid
        limits = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        # A new descriptor takes the lowest free number, refused (EMFILE) when that is not below
        # the soft limit (getrlimit(2)): the limit set to it, as the idle daemon leaves it.
        lowest = []
        for _ in range(5):
            time.sleep(0.2)
            taken = {int(fd) for fd in _fds(pid)}
            lowest.append(min(set(range(len(taken) + 1)) - taken))
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (min(lowest), limits[1]))
        full = subprocess.run(_cmd(tmp_path / "full.jsonl"), capture_output=True, text=True, env={**_env(d), **d.env},
                              timeout=120)
        assert d.proc.poll() is None, d.log_text()
        assert full.returncode == 125, (full.stderr, d.log_text())
        assert "the gatewrap daemon is out of file descriptors" in full.stderr, full.stderr
        assert "out of file descriptors" in d.log_text()
        resource.prlimit(pid, resource.RLIMIT_NOFILE, limits)
        again = _true_run(d, tmp_path / "again.jsonl", **d.env)
        assert again.returncode == 0, again.stderr
    finally:
        d.stop()
