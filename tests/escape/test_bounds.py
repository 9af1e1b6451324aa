"""Escape suite, the host's resources: what an agent can take of the host is bounded by
default (tasks, memory, the jail's in-memory file systems), and it cannot leave the bounds."""

from __future__ import annotations

import json

import pytest

from gatewrap.sandbox import tmpfs
from gatewrap.sizes import parse_size

from .helpers import attempts, python_argv

pytestmark = pytest.mark.kernel


def test_a_fork_bomb_is_refused_at_the_runs_pids_bound(gatewrap, outcome):
    """a fork bomb (fork until refused)."""
    r = gatewrap(python_argv("""
        kids = 0
        while True:
            try:
                pid = os.fork()
            except OSError as e:
                print(json.dumps({"kids": kids, "errno": errno.errorcode[e.errno]}), flush=True)
                break
            if pid == 0:  # the child prints nothing: its output would interleave with its parent's
                time.sleep(5)
                os._exit(0)
            kids += 1
    """), extra=["--pids", "100"], timeout=60)
    a = next(json.loads(x) for x in r.stdout.splitlines() if '"kids"' in x)
    kids = a["kids"]
    end = r.records(event="run_end")[0]
    outcome("pids cgroup of the run (--pids, default 4096)", f"{a['errno']} after {kids} forks; "
            f"run_end pids_refused {end['pids_refused']}", "held" if a["errno"] == "EAGAIN" else "OPEN")
    assert a["errno"] == "EAGAIN" and kids < 100, (a, kids)
    assert end["pids_refused"] >= 1, end


BUDGET = "32M"


@pytest.mark.parametrize("point", ["/tmp", "/dev/shm", "$HOME", "/run", "/dev"],
                         ids=[f"filling the jail's {p}" for p in ["/tmp", "/dev/shm", "$HOME", "/run", "/dev"]])
def test_the_jails_tmpfs_mounts_stop_at_their_part_of_the_budget(gatewrap, outcome, point):
    part = tmpfs.split(parse_size(BUDGET))["home" if point == "$HOME" else point]
    r = gatewrap(python_argv(f"""
        folder = os.environ["HOME"] if {point!r} == "$HOME" else {point!r}
        written = [0]
        def fill():
            with open(os.path.join(folder, "fill"), "wb") as f:
                while True:
                    written[0] += f.write(b"x" * 65536)
                    f.flush()
        attempt("fill", fill)
        print(json.dumps({{"written": written[0]}}), flush=True)
    """), extra=["--tmpfs", BUDGET], timeout=60)
    a = attempts(r.stdout)[-1]
    written = next(json.loads(x)["written"] for x in r.stdout.splitlines() if '"written"' in x)
    expect = "EROFS" if point in ("/run", "/dev") else "ENOSPC"
    outcome("tmpfs size= out of --tmpfs (default 4G); /run and /dev read-only",
            f"{a['errno']} after {written} bytes (its part: {part})",
            "held" if a["errno"] == expect and written <= part else "OPEN")
    assert (a["errno"], written <= part) == (expect, True), (a, written, part, r.stderr)


def test_the_agent_cannot_reach_a_cgroup_to_leave_its_bounds(gatewrap, outcome):
    """moving itself to the host's root pids/memory cgroup (cgroup v1 cgroup.procs)."""
    r = gatewrap(python_argv("""
        for ctrl in ("pids", "memory"):
            attempt(ctrl, lambda: open(f"/sys/fs/cgroup/{ctrl}/cgroup.procs", "w").write("0"))
    """), timeout=60)
    got = attempts(r.stdout)
    outcome("no cgroupfs in the agent's view (the launcher hides every cgroup mount)",
            ", ".join(f"{a['step']}: {a['errno']}" for a in got),
            "held" if all(a["errno"] in ("ENOENT", "EACCES", "EROFS") for a in got) else "OPEN")
    assert [a["errno"] for a in got] == ["ENOENT", "ENOENT"], got


STARVE_VICTIM = r'''
import socket, time
for i in range(20):
    t0 = time.monotonic()
    try:
        s = socket.create_connection(("127.0.0.1", 3128), timeout=2)
        s.sendall(b"GET http://denied.test/%d HTTP/1.1\r\nHost: denied.test\r\nConnection: close\r\n\r\n" % i)
        r = s.recv(16)[9:12].decode() or "closed"
        s.close()
    except OSError as e:
        r = type(e).__name__
    print(r, flush=True)
    time.sleep(0.5)
'''

STARVE_HOSTILE = r'''
import socket, time
ss = [socket.create_connection(("127.0.0.1", 3128), timeout=2) for _ in range(1000)]
print("holding", len(ss), flush=True)
time.sleep(12)
'''


def test_a_runs_connections_to_its_gate_do_not_starve_a_neighbour_run_on_the_same_daemon(tmp_path, outcome):
    """a neighbour run's connections take the shared daemon's last descriptors."""
    import os
    import resource
    import subprocess
    import time

    from conftest import AGENT_UID, gatewrap_cmd
    from shared.conftest import Daemon

    d = Daemon().start()
    env = {**{k: v for k, v in os.environ.items() if k != "GATEWRAP_SHARED"}, **d.env,
           "SUDO_UID": str(AGENT_UID), "SUDO_GID": str(AGENT_UID)}

    def run(name, code):
        return subprocess.Popen(gatewrap_cmd("run", "--audit-log", str(tmp_path / f"{name}.jsonl"), "--workdir", "/tmp",
                                             "--", "/usr/bin/python3", "-c", code),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        victim = run("victim", STARVE_VICTIM)
        time.sleep(3)
        pid = d.proc.pid
        # the daemon's limit: 600 descriptors more than it holds, fewer than one run may take
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (len(os.listdir(f"/proc/{pid}/fd")) + 600,
                                                      resource.prlimit(pid, resource.RLIMIT_NOFILE)[1]))
        hostile = run("hostile", STARVE_HOSTILE)
        out, _ = victim.communicate(timeout=90)
        hostile.communicate(timeout=90)
    finally:
        d.stop()
    answers = out.split()
    short = [r for r in map(json.loads, (tmp_path / "hostile.jsonl").read_text().splitlines())
             if r.get("reason", "").startswith("limit: the gate's process is short of file descriptors")]
    outcome("the shared daemon's open-file limit (a run over 64 connections gets none of its last eighth)",
            f"victim's requests: {answers.count('403')} answered 403, {answers.count('TimeoutError')} timed out; "
            f"the hostile run's refusals audited: {len(short)}",
            "OPEN" if "TimeoutError" in answers else "held")
    assert "TimeoutError" not in answers and answers.count("403") == 20, answers
    assert short and short[0]["decision"] == "denied", short


STARVE_TUNNELS = r'''
import socket, sys, time
ss = []
for _ in range(int(sys.argv[1])):
    try:
        ss.append(socket.create_connection(("127.0.0.1", 3128), timeout=2))
    except OSError:
        break
print("accepted by the kernel", len(ss), flush=True)
time.sleep(1)
tunnels = 0
at_once = sys.argv[2:] == ["at-once"]  # every CONNECT sent before any answer is read
for s in ss:  # the share counted these at accept(2); what each opens later is checked apart
    try:
        s.sendall(b"CONNECT allowed.test:7 HTTP/1.1\r\nHost: allowed.test:7\r\n\r\n")
        if not at_once and s.recv(64)[9:12] == b"200":
            tunnels += 1
    except OSError:
        pass
for s in ss if at_once else ():
    try:
        if s.recv(64)[9:12] == b"200":
            tunnels += 1
    except OSError:
        pass
print("tunnels", tunnels, flush=True)
# the descriptors of the tunnels that failed (and of the refused connections) are holes low in
# the table: accept(2) hands them out again, below the share's threshold
idle = []
for _ in range(int(sys.argv[1])):
    try:
        idle.append(socket.create_connection(("127.0.0.1", 3128), timeout=2))
    except OSError:
        break
print("idle", len(idle), flush=True)
time.sleep(20)
'''


STARVE_VICTIM_LONG = STARVE_VICTIM.replace("range(20)", "range(40)")


def _starve(net, tmp_path, hostile_code, hostile_args=(), headroom=600, allow=("allowed.test:7",)):
    """Run STARVE_VICTIM_LONG and ``hostile_code`` (after the daemon's open-file limit was set to
    ``headroom`` descriptors over what it holds) on one test daemon of their own; the
    victim's answers and the hostile run's output."""
    import os
    import resource
    import subprocess
    import time

    from conftest import AGENT_PYTHON, AGENT_UID, PUBLIC_RANGES, gatewrap_cmd
    from shared.conftest import Daemon

    d = Daemon().start()
    env = {**{k: v for k, v in os.environ.items() if k != "GATEWRAP_SHARED"}, **d.env,
           "SUDO_UID": str(AGENT_UID), "SUDO_GID": str(AGENT_UID)}

    def run(name, code, *args):
        rules = [x for a in (allow if name == "hostile" else ()) for x in ("--allow", a)]
        return subprocess.Popen(gatewrap_cmd("run", "--audit-log", str(tmp_path / f"{name}.jsonl"), "--workdir", "/tmp",
                                             "--resolver", net.dns_server, *PUBLIC_RANGES, *rules,
                                             "--", AGENT_PYTHON, "-c", code, *args),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        victim = run("victim", STARVE_VICTIM_LONG)
        time.sleep(3)
        pid = d.proc.pid
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (len(os.listdir(f"/proc/{pid}/fd")) + headroom,
                                                      resource.prlimit(pid, resource.RLIMIT_NOFILE)[1]))
        hostile = run("hostile", hostile_code, *map(str, hostile_args))
        out, _ = victim.communicate(timeout=90)
        hout, herr = hostile.communicate(timeout=90)
    finally:
        d.stop()
    return out.split(), hout + herr


def test_a_runs_tunnels_opened_on_connections_it_already_holds_do_not_starve_a_neighbour_run(net, tmp_path, outcome):
    """a run's CONNECT tunnels (an upstream socket and two pipes each) take the shared daemon's last descriptors."""
    answers, hout = _starve(net, tmp_path, STARVE_TUNNELS, [600])
    outcome("the shared daemon's open-file limit (a run's share, at accept and before each lookup and dial: fd_room)",
            f"victim's requests: {answers.count('403')} answered 403, {answers.count('TimeoutError')} timed out; "
            f"hostile: {' '.join(hout.split()[:8])}",
            "OPEN" if "TimeoutError" in answers else "held")
    assert "TimeoutError" not in answers and answers.count("403") == 40, (answers, hout)


def test_a_runs_tunnels_asked_all_at_once_do_not_starve_a_neighbour_run(net, tmp_path, outcome):
    """a run's CONNECTs sent together on the connections it holds pass the share's check before any of them dials."""
    answers, hout = _starve(net, tmp_path, STARVE_TUNNELS, [600, "at-once"])
    outcome("the shared daemon's open-file limit (a run's share, checked again after the lookup and before a tunnel's pipes: fd_room)",
            f"victim's requests: {answers.count('403')} answered 403, {answers.count('TimeoutError')} timed out; "
            f"hostile: {' '.join(hout.split()[:8])}",
            "OPEN" if "TimeoutError" in answers else "held")
    assert "TimeoutError" not in answers and answers.count("403") == 40, (answers, hout)
