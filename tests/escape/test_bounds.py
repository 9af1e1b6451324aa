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
