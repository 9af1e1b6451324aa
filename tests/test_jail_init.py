"""The jail's init, ``gatewrap-wait --init -- PROGRAM...`` (gate_wait/src/init.rs): pid 1 of the
run's pid namespace in tini's place, now that nsjail execs it and does not stay.

Each test runs it as the init of a pid namespace of its own (``unshare --pid --fork`` with a
/proc of its own: :func:`conftest.in_new_pid_namespace`, as root), as the launcher and nsjail
do, without the rest of a sandbox.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from conftest import in_new_pid_namespace
from gatewrap.shared import waiter

PATIENCE = 30  # seconds

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a pid namespace needs root")


def init_argv(*agent: str) -> list[str]:
    path = waiter.find()
    assert path, "gatewrap-wait is not installed (scripts/setup.sh install)"
    return in_new_pid_namespace(path, "--init", "--", *agent)


@pytest.mark.parametrize("agent, code, says", [
    (["sh", "-c", "exit 7"], 7, ""),
    (["sh", "-c", "kill -TERM $$"], 128 + signal.SIGTERM, ""),
    (["/nonexistent/agent"], 127, "cannot run /nonexistent/agent: No such file or directory"),
    (["{not_executable}"], 126, "Permission denied"),
])
def test_the_init_exits_with_the_agents_code(agent, code, says, tmp_path):
    not_executable = tmp_path / "agent.sh"
    not_executable.write_text("exit 0\n")
    not_executable.chmod(0o644)
    argv = [a.format(not_executable=not_executable) for a in agent]
    r = subprocess.run(init_argv(*argv), capture_output=True, text=True, timeout=PATIENCE)
    assert (r.returncode, says in r.stderr) == (code, True), r.stderr


def test_the_init_is_pid_1_and_the_agent_runs_with_no_signal_blocked_or_ignored_but_what_its_caller_ignored():
    show = "echo $PPID; grep -E '^Sig(Blk|Ign)' /proc/self/status"
    r = subprocess.run(init_argv("sh", "-c", show), capture_output=True, text=True, timeout=PATIENCE)
    assert r.returncode == 0, r.stderr
    # (sh ignores nothing itself: what it shows is what it was given; an ignored disposition
    # is inherited across execve(2), as from nohup: the same as without the init)
    given = subprocess.run(["sh", "-c", show], capture_output=True, text=True, timeout=PATIENCE).stdout.split()[-1]
    assert r.stdout.split() == ["1", "SigBlk:", "0000000000000000", "SigIgn:", given], r.stdout


def test_a_signal_sent_to_the_init_reaches_the_agent():
    p = subprocess.Popen(init_argv("sh", "-c", 'trap "exit 99" TERM; echo up; while :; do sleep 0.05; done'),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "up\n"
        init = int(open(f"/proc/{p.pid}/task/{p.pid}/children").read().split()[0])
        os.kill(init, signal.SIGTERM)
        assert p.wait(PATIENCE) == 99, p.stderr.read()
    finally:
        p.kill()


def test_an_orphan_in_the_namespace_is_reaped_while_the_agent_runs(tmp_path):
    # The subshell exits at once, so its child is orphaned to the namespace's init; once it has
    # exited, its /proc entry goes only when someone reaps it (a zombie stays otherwise).
    f = tmp_path / "orphan.pid"
    agent = (
        f"(sh -c 'echo $$ > {f}.new; mv {f}.new {f}; exit 0' &); "
        f"while [ ! -s {f} ]; do sleep 0.01; done; o=$(cat {f}); i=0; "
        "while [ -e /proc/$o ] && [ $i -lt 1000 ]; do sleep 0.01; i=$((i+1)); done; "
        "if [ -e /proc/$o ]; then grep State /proc/$o/status; else echo reaped; fi"
    )
    r = subprocess.run(init_argv("sh", "-c", agent), capture_output=True, text=True, timeout=PATIENCE)
    assert (r.returncode, r.stdout) == (0, "reaped\n"), r.stderr


def test_the_init_outlives_a_parent_that_dies_although_nsjail_set_a_parent_death_signal():
    # nsjail leaves PR_SET_PDEATHSIG = SIGKILL set (contain.cc) across its execve into the
    # init: a gatewrap that dies must not take the sandbox with it (it stays, without egress,
    # for gc). Here the init's parent is unshare, SIGKILLed; the agent must still answer.
    path = waiter.find()
    set_and_exec = (
        "import ctypes, os, sys; ctypes.CDLL(None).prctl(1, 9, 0, 0, 0); "  # PR_SET_PDEATHSIG, SIGKILL
        f"os.execv({path!r}, [{path!r}, '--init', '--', 'sh', '-c', 'echo up; read line; echo got $line'])"
    )
    p = subprocess.Popen(in_new_pid_namespace(sys.executable, "-c", set_and_exec),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "up\n"
        p.kill()
        p.wait(PATIENCE)
        p.stdin.write("x\n")
        p.stdin.flush()
        assert p.stdout.readline() == "got x\n"
    finally:
        p.kill()
