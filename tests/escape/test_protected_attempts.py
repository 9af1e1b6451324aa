"""Escape suite, what the agent tried: an attempt to change a protected path, refused by the
kernel (EROFS on a read-only mount, EBUSY for git's rename of ``config.lock`` onto the mounted
``.git/config``), leaves a ``protected_path`` record with ``change: "refused"``, the syscall
and errno, and the run's summary names the path once with its count (issue 21, item 1: "the
run's summary names any protected-class file the agent tried to change"). The report is a
raw tracepoint on ``sys_exit`` (cli/gatewrap/_bpf/attempts.bpf.c); a relative path is joined
to the process's cwd while it lives (the subshell that names ``config`` inside ``.git`` waits a
second: one that exits before its event is read is joined to the run's working directory
instead, and then not recognised); a read-only folder that is
no protected path (``/usr``) is not reported, and a flood of attempts is folded with exact
counts. Both jail modes; with ``GATEWRAP_SHARED=1`` through the daemon.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import AGENT_UID, gatewrap_cmd

pytestmark = pytest.mark.kernel

#: Attempts of the flood (one process, the same path and syscall).
FLOOD = 10_000

SCRIPT = f"""set +e
git config core.fsmonitor "touch /tmp/planted"; echo "FSMONITOR $?"
printf '#!/bin/sh\\n' > .git/hooks/post-commit; echo "HOOK $?"
touch /usr/gatewrap-attempt; echo "USR $?"
(cd .git && echo x >> config; r=$?; sleep 1; exit $r); echo "RELATIVE $?"
python3 -c '
n = 0
for _ in range({FLOOD}):
    try:
        open(".git/hooks/flood", "w")
    except OSError:
        n += 1
print("FLOOD", n)
'
"""


@pytest.fixture(scope="module", params=["nsjail", "none"])
def attempted(request):
    """One run per jail mode making every attempt; yields (mode, workdir, the run, its records)."""
    mode = request.param
    top = Path(tempfile.mkdtemp(prefix="gwt-attempts-"))
    top.chmod(0o755)
    work = top / "work"
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    subprocess.run(["chown", "-R", f"{AGENT_UID}:{AGENT_UID}", str(top)], check=True)
    logdir = Path(tempfile.mkdtemp(prefix="gwt-attempts-log-"))
    audit = logdir / "audit.jsonl"
    cmd = gatewrap_cmd("run", "--audit-log", str(audit), "--workdir", str(work), "--jail", mode,
                       "--", "/bin/sh", "-c", SCRIPT)
    env = {**os.environ, "SUDO_UID": str(AGENT_UID), "SUDO_GID": str(AGENT_UID)}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    records = [json.loads(x) for x in audit.read_text().splitlines()] if audit.exists() else []
    yield mode, work, p, records
    shutil.rmtree(top, ignore_errors=True)
    shutil.rmtree(logdir, ignore_errors=True)


def _refused(records: list[dict]) -> list[dict]:
    return [r for r in records if r.get("event") == "protected_path" and r.get("change") == "refused"]


def _start(records: list[dict]) -> dict:
    return next(r for r in records if r.get("event") == "run_start")


@pytest.mark.parametrize("case, marker, path, syscalls, errno", [
    ("git config core.fsmonitor: git's rename of config.lock onto .git/config",
     "FSMONITOR", ".git/config", ("rename", "renameat", "renameat2"), "EBUSY"),
    ("a hook file written into .git/hooks", "HOOK", ".git/hooks/post-commit", ("open", "openat", "creat"), "EROFS"),
    ("a protected file named relative to a cwd inside .git", "RELATIVE", ".git/config", ("open", "openat"), "EROFS"),
])
def test_an_attempt_to_change_a_protected_path_is_recorded_with_its_syscall(attempted, case, marker, path,
                                                                           syscalls, errno):
    mode, work, p, records = attempted
    assert p.returncode == 0, p.stderr
    assert "attempts_unrecorded" not in _start(records), _start(records)
    assert f"{marker} 0" not in p.stdout, f"{case}: the change succeeded inside ({mode})"
    matching = [r for r in _refused(records) if r["path"] == str(work / path) and r["syscall"] in syscalls
                and r["errno"] == errno]
    assert matching, f"{case} ({mode}): no refused record; all: {_refused(records)}"
    assert all(r["pid"] >= 1 and r["comm"] for r in matching)


def test_a_read_only_folder_that_is_no_protected_path_is_not_reported(attempted):
    mode, work, p, records = attempted
    assert "USR 0" not in p.stdout
    assert not [r for r in _refused(records) if not r["path"].startswith(str(work) + "/")], _refused(records)
    assert not [line for line in p.stderr.splitlines() if line.startswith("gatewrap: refused") and "/usr/" in line]


def test_a_flood_of_attempts_is_folded_with_exact_counts(attempted):
    mode, work, p, records = attempted
    assert f"FLOOD {FLOOD}" in p.stdout, p.stdout + p.stderr
    flood = [r for r in _refused(records) if r["path"] == str(work / ".git/hooks/flood")]
    assert sum(r["count"] for r in flood) == FLOOD, flood
    assert 1 <= len(flood) <= 10, f"{len(flood)} records for one path and syscall"
    assert "LOST" not in p.stderr


def test_the_summary_names_each_refused_path_once_with_its_count(attempted):
    mode, work, p, records = attempted
    summary = [line for line in p.stderr.splitlines() if line.startswith("gatewrap: run ")][-1]
    assert "refused changes to 3 protected paths" in summary, summary
    flood = str(work / ".git/hooks/flood")
    assert summary.count(repr(flood)) == 1 and f"{flood!r} ×{FLOOD}" in summary, summary
    assert summary.count(repr(str(work / ".git/config"))) == 1, summary
    end = next(r for r in records if r.get("event") == "run_end")
    assert "protected_refused" not in end and end["lost_events"] == 0, end


@pytest.mark.own_process  # the session's daemon holds the hooks it loaded at its start
def test_without_the_report_the_run_goes_on_refused_and_says_it_is_unrecorded(tmp_path):
    """The read-only mounts enforce; the tracepoint only reports. A kernel that refused the
    program (its pins gone: as after a refusal at load) leaves the run going, the attempt
    refused, and the gap said on stderr and in run_start."""
    from gatewrap.bpf import loader
    from gatewrap.sandbox import cgroup

    hooks = loader.load_or_reuse(cgroup.parent_dir())
    pin_dir = hooks.pin_dir
    hooks.close()
    top = Path(tempfile.mkdtemp(prefix="gwt-attempts-off-"))
    try:
        for name in (loader.ATTEMPTS_LINK, f"prog_{loader.ATTEMPTS_PROG}"):
            os.unlink(f"{pin_dir}/{name}")
        top.chmod(0o755)
        subprocess.run(["git", "init", "-q", str(top / "w")], check=True)
        subprocess.run(["chown", "-R", f"{AGENT_UID}:{AGENT_UID}", str(top)], check=True)
        audit = tmp_path / "audit.jsonl"
        cmd = gatewrap_cmd("run", "--audit-log", str(audit), "--workdir", str(top / "w"), "--", "/bin/sh", "-c",
                           "git config core.fsmonitor x; echo \"FSMONITOR $?\"")
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                           env={**os.environ, "SUDO_UID": str(AGENT_UID), "SUDO_GID": str(AGENT_UID)})
        records = [json.loads(x) for x in audit.read_text().splitlines()]
        assert p.returncode == 0 and "FSMONITOR 0" not in p.stdout, p.stderr
        assert p.stderr.count("attempts to change protected paths are refused but not recorded") == 1, p.stderr
        assert "refused the raw tracepoint program" in _start(records)["attempts_unrecorded"]
        assert not _refused(records) and "refused changes" not in p.stderr
    finally:
        shutil.rmtree(top, ignore_errors=True)
        # The next run loads the hooks afresh (a partial pin directory is started clean).
        for name in os.listdir(pin_dir):
            os.unlink(f"{pin_dir}/{name}")
