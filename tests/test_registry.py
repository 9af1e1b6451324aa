"""The run registry's view of processes (gatewrap.sandbox.registry): which owner a lock file names,
and when this gatewrap can judge it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import in_new_pid_namespace

from gatewrap import procstat
from gatewrap.sandbox import cgroup, registry


def test_a_process_start_time_is_its_ticks_since_boot_and_names_that_process_only():
    me = registry.process_started(os.getpid())
    assert isinstance(me, int) and me == registry.process_started(os.getpid())
    # A command name with spaces and parentheses does not shift the fields.
    child = subprocess.Popen([sys.executable, "-c", "import sys; open('/proc/self/comm', 'w').write('a) b (c');"
                              " print('ready', flush=True); sys.stdin.read()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline() == b"ready\n"
        with open(f"/proc/{child.pid}/comm") as f:
            assert f.read().strip() == "a) b (c"
        started = registry.process_started(child.pid)
        assert isinstance(started, int) and started >= me
    finally:
        child.communicate(b"")
    assert registry.process_started(child.pid) is None  # gone (reaped)


def _in_child_pid_namespace(code: str, mount_proc: bool = True) -> str:
    """What ``code`` (Python, this interpreter) prints run as pid 1 of a new pid namespace
    (``unshare --pid --fork``, with a /proc of its own unless ``mount_proc`` is False)."""
    argv = (sys.executable, "-c", code)
    cmd = in_new_pid_namespace(*argv) if mount_proc else ["unshare", "--pid", "--fork", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=True).stdout.strip()


def test_the_pid_view_is_this_pid_namespace_and_none_where_proc_shows_another():
    ours = procstat.pid_view()
    st = os.stat("/proc/self/ns/pid")
    assert ours == [st.st_dev, st.st_ino]
    show = "from gatewrap import procstat; print(procstat.pid_view())"
    theirs = _in_child_pid_namespace(show)
    assert theirs not in ("None", str(ours)), theirs
    # unshare --pid without --mount-proc: /proc still numbers the host's pids, so no pid read
    # there can be checked against the recorded ones.
    assert _in_child_pid_namespace(show, mount_proc=False) == "None"


def test_a_lock_file_names_its_owner_by_pid_start_time_pid_namespace_and_registry(tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "RUNS_DIR", str(tmp_path / "runs"))
    fd = registry.claim("gw-0000000001", str(tmp_path / "audit.jsonl"))
    try:
        got = registry.info("gw-0000000001")
        st = os.stat(tmp_path / "runs")
        assert {k: got[k] for k in ("pid", "pid_start", "pid_view", "registry")} == {
            "pid": os.getpid(), "pid_start": registry.process_started(os.getpid()),
            "pid_view": procstat.pid_view(), "registry": [st.st_dev, st.st_ino]}
        assert registry.alive("gw-0000000001")
        assert registry.unproven("gw-0000000001", got) is None
        assert registry.owner_lives(got) == os.getpid()
    finally:
        registry.release("gw-0000000001", fd)


#: Lock files whose owner's death this gatewrap cannot prove, and the clause it says.
FOREIGN = {
    "written through another registry (another mount, an overlay's copy)":
        ({"registry": [1, 2]}, "its registry entry was written through another mount of"),
    "its gatewrap in another pid namespace":
        ({"pid_view": [1, 2]}, "is in another pid namespace than this gatewrap's"),
    "its gatewrap where /proc showed another pid namespace":
        ({"pid_view": None}, "is in another pid namespace than this gatewrap's"),
}


@pytest.mark.parametrize("case", list(FOREIGN), ids=list(FOREIGN))
def test_a_lock_file_of_another_registry_or_pid_namespace_is_not_judged_here(tmp_path, monkeypatch, case):
    monkeypatch.setattr(registry, "RUNS_DIR", str(tmp_path))
    st = os.stat(tmp_path)
    ours = {"pid": 123, "pid_start": 1, "pid_view": procstat.pid_view(), "registry": [st.st_dev, st.st_ino]}
    changed, said = FOREIGN[case]
    why = registry.unproven("gw-0000000002", {**ours, **changed})
    assert why is not None and said in why
    assert registry.unproven("gw-0000000002", ours) is None
    # An older version's lock file (none of these fields): its free lock decides, as then.
    assert registry.unproven("gw-0000000002", {"pid": 123, "started": 1.0}) is None


def test_an_owner_lives_only_as_the_very_process_its_pid_and_start_time_name():
    child = subprocess.Popen(["sleep", "30"])
    try:
        got = {"pid": child.pid, "pid_start": registry.process_started(child.pid)}
        assert registry.owner_lives(got) == child.pid
        assert registry.owner_lives({**got, "pid_start": got["pid_start"] - 1}) is None  # the pid reused
        assert registry.owner_lives({"pid": child.pid}) is None  # an older lock file: no start time
    finally:
        child.kill()
        child.wait()
    assert registry.owner_lives(got) is None


def test_a_cgroup_holding_a_process_of_another_pid_namespace_shows_it_as_pid_0_there():
    root = cgroup.cgroup2_mount()
    assert root is not None
    leaf = os.path.join(root, f"gwt-unseen-{os.urandom(3).hex()}")
    os.mkdir(leaf)
    host = subprocess.Popen(["sleep", "30"])
    try:
        with open(os.path.join(leaf, "cgroup.procs"), "w") as f:
            f.write(str(host.pid))
        ask = f"from gatewrap.sandbox import cgroup; print(cgroup.has_unseen({leaf!r}))"
        assert _in_child_pid_namespace(ask) == "True"
        assert cgroup.has_unseen(leaf) is False  # the host sees its own process
    finally:
        host.kill()
        host.wait()
        cgroup.kill_and_remove(leaf)
