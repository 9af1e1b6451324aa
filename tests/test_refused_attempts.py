"""Which refused writes are a run's protected paths (kernel_denials.refused_path and
protected_match), and how the summary names them (run_types.summary_line). The kernel side
is tests/escape/test_protected_attempts.py."""

from __future__ import annotations

import os
import time

import pytest

from gatewrap.bpf.loader import AT_FDCWD, _Event
from gatewrap.kernel_denials import protected_match, refused_path
from gatewrap.run_types import RunResult, summary_line

PROTECTED = {"/w/.git/config": "/w/.git/config", "/w/.git/hooks": "/w/.git/hooks",
             "/tmp/x/.envrc": "/var/tmp/x/.envrc"}


def _ev(path: str, tgid: int = 0, dirfd: int = AT_FDCWD) -> _Event:
    return _Event(cgroup_id=1, pid=tgid, tgid=tgid, uid=0, family=0, dst_ip="", dst_port=0, sock_type=0,
                  protocol=0, hook="sys_exit", verdict="", comm="sh", path=path, refused_write=True,
                  syscall="openat", errno="EROFS", dirfd=dirfd)


@pytest.mark.parametrize("path, expected", [
    ("/w/.git/config", "/w/.git/config"),
    ("/w/.git/hooks/pre-commit", "/w/.git/hooks/pre-commit"),
    ("/w/.git/hooks", "/w/.git/hooks"),
    ("/tmp/x/.envrc", "/var/tmp/x/.envrc"),          # shown elsewhere in the jail: named by its host path
    ("/w/.git/config.lock", None),                   # a sibling, not below
    ("/w/.git/hooks-old/x", None),
    ("/usr/x", None),
    ("/", None),
])
def test_a_path_is_reported_only_when_it_is_or_lies_below_a_protected_path(path, expected):
    assert protected_match(path, PROTECTED) == expected


def test_a_relative_path_is_joined_to_the_living_process_cwd(tmp_path):
    os.chdir(tmp_path)
    assert refused_path(_ev("a/../.git/config", tgid=os.getpid()), "/elsewhere") == f"{tmp_path}/.git/config"


def test_a_relative_path_of_a_process_gone_is_joined_to_the_runs_working_directory():
    assert refused_path(_ev(".git/config", tgid=2**22 + 1), "/w") == "/w/.git/config"


def test_a_path_relative_to_a_directory_fd_that_is_gone_is_unknown():
    assert refused_path(_ev("config", tgid=2**22 + 1, dirfd=5), "/w") is None


def test_a_path_relative_to_a_directory_fd_is_joined_to_that_folder(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert refused_path(_ev("hooks/x", tgid=os.getpid(), dirfd=fd), "/w") == f"{tmp_path}/hooks/x"
    finally:
        os.close(fd)


def test_a_relative_path_of_a_process_in_a_chroot_is_joined_in_its_own_view(tmp_path):
    """A process whose root is a folder (a chroot, as gatewrap's own in fresh-debian, seen
    from another mount namespace): /proc/PID/cwd names the folder too; the path is the
    process's own."""
    (tmp_path / "w" / ".git").mkdir(parents=True)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: chroot into tmp_path, cwd /w, wait for the parent
        try:
            os.close(r)
            os.chroot(tmp_path)
            os.chdir("/w")
            os.write(w, b"x")
            time.sleep(30)
        finally:
            os._exit(0)
    try:
        os.close(w)
        assert os.read(r, 1) == b"x"
        assert refused_path(_ev(".git/config", tgid=pid), "/elsewhere") == "/w/.git/config"
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(r)


def test_the_summary_names_each_refused_path_once_with_its_count():
    r = RunResult("gw-1", 0, 0, 0, 0, 0, 0, "/var/log/gatewrap/audit.jsonl",
                  refused={"/w/.git/config": 2, "/w/.git/hooks/x": 10_000})
    line = summary_line(r)
    assert "refused changes to 2 protected paths (attempts): '/w/.git/config' ×2, '/w/.git/hooks/x' ×10000" in line
    assert r.as_record()["protected_refused"] == [{"path": "/w/.git/config", "count": 2},
                                                  {"path": "/w/.git/hooks/x", "count": 10_000}]
    assert "refused" not in summary_line(RunResult("gw-1", 0, 0, 0, 0, 0, 0, "/a"))
