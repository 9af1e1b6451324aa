"""Resource bounds of a run: --timeout, and --pids, --memory, --cpus and --tmpfs, bounded by
default, on cgroup v2 controllers or (hybrid hosts, as these VMs) cgroup v1."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time

import pytest

from conftest import run_gatewrap
from gatewrap.entry import DEFAULT_PIDS
from gatewrap.sandbox import limits, tmpfs
from gatewrap.sandbox.cgroup import cgroup2_mount
from gatewrap.sandbox.limits import parse_size
from gatewrap.sizes import parse_memory, ram_bytes

pytestmark = pytest.mark.kernel


def _controllers() -> list[str]:
    with open(f"{cgroup2_mount()}/cgroup.controllers") as f:
        return f.read().split()


@pytest.mark.parametrize("text,size", [("1048576", 1 << 20), ("512M", 512 << 20), ("2g", 2 << 30), ("1GiB", 1 << 30)])
def test_sizes_are_read_in_binary_units(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "0", "12X", "-1M", "1.5G"])
def test_bad_sizes_are_refused(text):
    with pytest.raises(ValueError):
        parse_size(text)


def test_timeout_kills_the_whole_tree_and_exits_124(gatewrap):
    t0 = time.monotonic()
    r = gatewrap(["/bin/sh", "-c", "sleep 30 & sleep 30"], extra=["--timeout", "1"])
    assert r.returncode == 124, r.stderr
    assert time.monotonic() - t0 < 10
    assert "--timeout 1 s reached" in r.stderr


def _started(audit, timeout: float = 30.0) -> dict:
    """The run_start record of the run writing ``audit``, once it is there."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if audit.exists():
            for line in audit.read_text().splitlines():
                rec = json.loads(line)
                if rec.get("event") == "run_start":
                    return rec
        time.sleep(0.05)
    raise AssertionError(f"no run_start in {audit}")


def _in_background(fn, *args, **kw) -> tuple[threading.Thread, list]:
    box: list = []
    t = threading.Thread(target=lambda: box.append(fn(*args, **kw)), daemon=True)
    t.start()
    return t, box


def _cgroup_file(run_id: str, controller: str, name: str) -> str:
    """A file of the run's cgroup for ``controller``, where this host enforces it."""
    kind, root = limits.where(controller)
    folder = os.path.join(root, "gatewrap", run_id)
    with open(os.path.join(folder, name)) as f:
        return f.read().strip()


def test_every_run_is_bounded_by_default_as_its_view_and_its_cgroups_show(net, tmp_path):
    """No option given: the run's pids and memory bounds are the documented defaults, in its
    cgroups (v1 here) with the agent in them, in run_start; its tmpfs mounts are sized out of the
    --tmpfs default, /run and /dev read-only; its oom_score_adj is the agent's."""
    audit = tmp_path / "audit.jsonl"
    agent = """
        import os, time
        print(open("/proc/self/oom_score_adj").read().strip())
        for line in open("/proc/self/mounts"):
            dev, point, kind, opts = line.split()[:4]
            if kind == "tmpfs" and point != "/":
                print(point, opts)
        time.sleep(2)
    """
    t, out = _in_background(run_gatewrap, net, audit, python=agent)
    start = _started(audit)
    run_id, bounds = start["run"], start["limits"]
    memory = parse_memory("50%")
    assert bounds == {"pids": int(DEFAULT_PIDS), "pids_by": limits.where("pids")[0], "memory": memory,
                      "memory_by": limits.where("memory")[0], "tmpfs": parse_size("4G")}
    assert _cgroup_file(run_id, "pids", "pids.max") == DEFAULT_PIDS
    if limits.where("memory")[0] == "cgroup1":
        assert int(_cgroup_file(run_id, "memory", "memory.limit_in_bytes")) == memory
        assert int(_cgroup_file("", "memory", "memory.limit_in_bytes")) <= ram_bytes() * 3 // 4
        assert int(_cgroup_file("", "pids", "pids.max")) <= limits.host_pids() // 2
    deadline = time.monotonic() + 10  # run_start is written before the agent is spawned
    while not (procs := _cgroup_file(run_id, "pids", "cgroup.procs").split()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert procs and all(open(f"/proc/{p}/oom_score_adj").read().strip() == "1000" for p in procs)
    # gatewrap's own process (a run of its own; the shared mode's client, which becomes the
    # waiter) is protected from the OOM killer's choice where the kernel lets root lower a score
    # (CAP_SYS_RESOURCE, which these VMs' root lacks: then it stays as it was).
    from gatewrap.agent_process import GATEWRAP_OOM_SCORE_ADJ
    from gatewrap.sandbox import registry

    owner = registry.info(run_id)["pid"]
    with open("/proc/self/status") as f:
        caps = int(next(l for l in f if l.startswith("CapEff:")).split()[1], 16)
    expected = GATEWRAP_OOM_SCORE_ADJ if caps & (1 << 24) else int(open("/proc/self/oom_score_adj").read())
    assert int(open(f"/proc/{owner}/oom_score_adj").read()) == expected
    t.join(60)
    r = out[0]
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "1000"
    mounts = dict(line.split(" ", 1) for line in lines[1:])
    parts = tmpfs.split(parse_size("4G"))
    for point, part in (("/tmp", "/tmp"), ("/dev/shm", "/dev/shm"), ("/run", "/run"), ("/dev", "/dev")):
        assert f"size={parts[part] >> 10}k" in mounts[point], (point, mounts[point])
        assert "nr_inodes=" in mounts[point], point
    assert mounts["/run"].startswith("ro,") and mounts["/dev"].startswith("ro,"), mounts
    home = [p for p in mounts if p not in ("/tmp", "/dev/shm", "/run", "/dev")]
    assert [f"size={parts['home'] >> 10}k" in mounts[h] for h in home] == [True], mounts
    assert sum(parts.values()) <= parse_size("4G")
    assert not os.path.exists(os.path.join(limits.where("pids")[1], "gatewrap", run_id)), "removed at the run's end"


def test_the_profile_sizes_run_and_dev_as_the_tmpfs_budget_counts_them():
    from gatewrap.sandbox import jail

    text = jail.PROFILE.read_text()
    for point in ("/run", "/dev"):
        line = next(l for l in text.splitlines() if l.startswith(f'mount {{ dst: "{point}" fstype: "tmpfs"'))
        assert f"size={tmpfs.FIXED}," in line and "rw: false" in line, line


@pytest.mark.parametrize("text,value", [("max", None), ("4096", 4096), (" 12 ", 12)])
def test_pids_are_a_count_or_max(text, value):
    from gatewrap.sizes import parse_count

    assert parse_count(text) == value


def test_memory_is_a_size_a_share_of_ram_or_max():
    assert parse_memory("max") is None
    assert parse_memory("512M") == 512 << 20
    assert parse_memory("25%") == ram_bytes() // 4 // 4096 * 4096
    for bad in ("0%", "101%", "x%", "-1M"):
        with pytest.raises(ValueError):
            parse_memory(bad)


FORK_BOMB = """
    import os, sys, time
    kids = 0
    while True:
        try:
            pid = os.fork()
        except OSError as e:
            print("refused", e.errno, "after", kids, flush=True)
            break
        if pid == 0:
            time.sleep(6)
            os._exit(0)
        kids += 1
    time.sleep(4)
"""


def test_a_fork_bomb_stops_at_its_bound_while_the_host_and_another_run_still_fork_and_fetch(net, tmp_path):
    bomb_log = tmp_path / "bomb.jsonl"
    t, out = _in_background(run_gatewrap, net, bomb_log, python=FORK_BOMB, extra=["--pids", "200"])
    run_id = _started(bomb_log)["run"]
    deadline = time.monotonic() + 20
    while int(_cgroup_file(run_id, "pids", "pids.current")) < 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert int(_cgroup_file(run_id, "pids", "pids.current")) == 200, "the bomb reached its bound"
    assert subprocess.run(["/bin/true"], timeout=10).returncode == 0, "the host forks"
    other = run_gatewrap(net, tmp_path / "other.jsonl", ["/bin/sh", "-c", "curl -sS --max-time 10 -o /dev/null "
                                                         "-w '%{http_code}' http://allowed.test/status/200"],
                         allow=["allowed.test"])
    assert (other.returncode, other.stdout) == (0, "200"), other.stderr
    t.join(60)
    bomb = out[0]
    assert bomb.returncode == 0, bomb.stderr
    assert bomb.stdout.startswith("refused 11 after "), bomb.stdout  # EAGAIN (fork(2))
    end = bomb.records(event="run_end")[0]
    assert end["pids_refused"] >= 1 and end["oom_kills"] == 0, end
    assert "refused at the pids bound (--pids)" in bomb.stderr


MEMORY_HOG = """
    import time
    hog = []
    while True:
        hog.append(bytearray(16 << 20))
"""


def test_a_memory_hog_is_killed_in_its_run_which_says_so_while_another_run_fetches(net, tmp_path):
    hog = run_gatewrap(net, tmp_path / "hog.jsonl", python=MEMORY_HOG, extra=["--memory", "96M"])
    assert hog.returncode == 137, hog.stderr  # SIGKILL from the OOM killer
    end = hog.records(event="run_end")[0]
    assert end["oom_kills"] >= 1, end
    assert "killed for memory (OOM; --memory)" in hog.stderr
    other = run_gatewrap(net, tmp_path / "other.jsonl", ["/bin/sh", "-c", "curl -sS --max-time 10 -o /dev/null "
                                                         "-w '%{http_code}' http://allowed.test/status/200"],
                         allow=["allowed.test"])
    assert (other.returncode, other.stdout) == (0, "200"), other.stderr


def test_the_jails_tmpfs_files_count_against_the_runs_memory(net, tmp_path):
    """tmpfs pages are charged to the memory cgroup of the task that writes them: a /tmp fill
    past --memory (under its tmpfs part) ends in the run's OOM kill, not the host's memory."""
    fill = "import os\nwith open('/tmp/fill', 'wb') as f:\n    for _ in range(512):\n        f.write(os.urandom(1 << 20))\n"
    r = run_gatewrap(net, tmp_path / "a.jsonl", ["/usr/bin/python3", "-c", fill], extra=["--memory", "96M"])
    assert r.returncode == 137, (r.stdout, r.stderr)
    assert r.records(event="run_end")[0]["oom_kills"] >= 1


def test_gc_removes_the_cgroup_v1_leaves_a_dead_run_left(tmp_path):
    """A gatewrap killed before its teardown leaves its cgroup v1 leaves (hybrid hosts): gc
    collects them with the rest of the run."""
    from conftest import gatewrap_cmd

    mounts = [m for m in (limits.v1_mount(c) for c in ("pids", "memory")) if m]
    if not mounts:  # a unified host: nothing of a run lives in cgroup v1
        assert limits.v1_runs() == set()
        return
    run_id = "gw-" + os.urandom(5).hex()
    leaves = [os.path.join(m, "gatewrap", run_id) for m in mounts]
    for leaf in leaves:
        os.makedirs(leaf)
    g = subprocess.run(gatewrap_cmd("gc", "--json"), capture_output=True, text=True, timeout=60)
    assert g.returncode == 0, g.stderr
    assert run_id in json.loads(g.stdout)["runs"]
    assert [os.path.exists(leaf) for leaf in leaves] == [False] * len(leaves)


MOUNTS = """\
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,nosuid,nodev,noexec,relatime 0 0
cgroup /sys/fs/cgroup/pids cgroup rw,nosuid,nodev,noexec,relatime,pids 0 0
cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,nodev,noexec,relatime,cpu,cpuacct 0 0
cgroup /sys/fs/cgroup/net_cls cgroup rw,nosuid,nodev,noexec,relatime,net_cls 0 0
"""


@pytest.mark.parametrize("controller,mount", [
    ("pids", "/sys/fs/cgroup/pids"),
    ("cpu", "/sys/fs/cgroup/cpu,cpuacct"),  # co-mounted: the option list names it
    ("memory", None),  # no v1 hierarchy has it: memory is refused, not ignored
    ("cls", None),  # a word inside another controller's name is not that controller
])
def test_a_controllers_v1_hierarchy_is_found_by_its_mount_options(tmp_path, controller, mount):
    mounts = tmp_path / "mounts"
    mounts.write_text(MOUNTS)
    assert limits.v1_mount(controller, str(mounts)) == mount


@pytest.mark.parametrize("budget", ["18M", "32M", "4G", "100G"])
def test_the_tmpfs_parts_are_whole_pages_within_the_budget(budget):
    parts = tmpfs.split(parse_size(budget))
    assert sum(parts.values()) <= parse_size(budget)
    assert all(v % 4096 == 0 and v >= 1 << 20 for v in parts.values()), parts
    assert parts["/tmp"] >= parts["home"] == parts["/dev/shm"]
