"""A container's run from its start to its end, whoever ends it, with podman and
gatewrap-oci on the real kernel: ``gatewrap ps`` and ``gatewrap stop``, a container whose
engine never deletes it, a restarted daemon, and the run's default bounds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from conftest import ROOT, gatewrap_cmd
from containers.conftest import podman_base
from shared.conftest import Daemon

pytestmark = pytest.mark.kernel

#: The grace the daemon gives an engine's delete once a container is dead (gatewrap.oci.runs.EXIT_GRACE).
EXIT_GRACE = 5.0
#: A container's first process that exits on SIGTERM (a handler: pid 1 ignores the signals it does not handle).
TERM_EXITS = ["python3", "-c", "import os, signal, time\n"
              "signal.signal(signal.SIGTERM, lambda *_: os._exit(0))\nprint('up', flush=True)\ntime.sleep(300)"]
#: One that ignores SIGTERM (pid 1 without a handler), as `docker stop` then kills it.
TERM_IGNORED = ["sleep", "300"]
#: Fetches the allowed host every 0.3 s, for ever.
FETCHES = ["sh", "-c", "while true; do curl -s -o /dev/null -w '%{http_code}\\n' --max-time 2 http://allowed.test/; "
           "sleep 0.3; done"]


def _gw(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(gatewrap_cmd(*args), capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def _until(what: str, check, wait: float = 30.0, every: float = 0.2):
    """``check()``'s first true value within ``wait`` seconds."""
    deadline = time.monotonic() + wait
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"not within {wait:g} s: {what}"
        time.sleep(every)


def _ps(run_id: str) -> dict | None:
    p = _gw("ps", "--json")
    assert p.returncode == 0, p.stderr
    return next((r for r in json.loads(p.stdout) if r["run"] == run_id), None)


def _live(run_id: str) -> bool:
    return os.path.exists(f"/run/gatewrap/runs/{run_id}.lock") and _ps(run_id) is not None


def _inspect(cid: str, field: str) -> str:
    p = subprocess.run([*podman_base(), "inspect", "--format", "{{" + field + "}}", cid], capture_output=True, text=True)
    return p.stdout.strip()


def _rm(cid: str) -> None:
    subprocess.run([*podman_base(), "rm", "-f", "-t", "0", cid], capture_output=True, timeout=60)


def _last_fetch(cid: str) -> str:
    """The HTTP status of the container's last fetch (:data:`FETCHES`), 000: none."""
    out = subprocess.run([*podman_base(), "logs", cid], capture_output=True, text=True).stdout.split()
    return out[-1] if out else ""


def _sandbox_gone(run_id: str) -> None:
    assert not os.path.exists(f"/sys/fs/cgroup/unified/gatewrap/{run_id}")
    assert not os.path.exists(f"/run/gatewrap/runs/{run_id}.lock")
    assert not os.path.exists(f"/run/gatewrap/runs/{run_id}.json")
    assert not [d for d in os.listdir("/run/gatewrap-staged") if d.startswith(run_id)]


def test_ps_lists_a_containers_run_with_its_container_id_and_no_pid(podman):
    c = podman("-d", "--network", "none", cmd=TERM_EXITS)
    assert c.returncode == 0, c.stderr
    try:
        got = _until("the run in gatewrap ps", lambda: _ps(c.run_id))
        assert (got["container"], got["pid"], got["argv"]) == (c.id, 0, TERM_EXITS)
        assert got["procs"] >= 1
        for flags, shown in [((), c.run_id[:15]), (("--no-trunc",), c.run_id)]:
            # gw- and the 12 characters docker ps shows (a start gatewrap stop takes); whole with --no-trunc
            header, *lines = _gw("ps", *flags).stdout.splitlines()
            line, = [x for x in lines if x.split()[0] == shown]
            assert f"[container {c.id[:12]}] python3" in line
            assert line.split()[1] == "-"  # no gatewrap process of its own
            pid_end, command = header.index("PID") + 3, header.index("COMMAND")
            for x in lines:  # the columns stay under their heads, however long the ids
                assert x[pid_end - 1] != " " and x[pid_end] == " ", (header, x)
                assert x[command - 2:command] == "  " and x[command] != " ", (header, x)
        assert _gw("stop", "--timeout", "2", c.run_id[:15]).returncode == 0
    finally:
        _rm(c.id)


@pytest.mark.parametrize("cmd, signal_name", [(TERM_EXITS, "SIGTERM"), (TERM_IGNORED, "SIGKILL")],
                         ids=["its first process exits on SIGTERM", "SIGTERM ignored: SIGKILL after --timeout"])
def test_gatewrap_stop_ends_a_container_as_docker_stop_does_and_its_run_with_it(podman, cmd, signal_name):
    c = podman("-d", "--network", "none", cmd=cmd)
    assert c.returncode == 0, c.stderr
    try:
        _until("the run in gatewrap ps", lambda: _ps(c.run_id))
        if cmd is TERM_EXITS:
            _until("the handler set", lambda: "up" in subprocess.run([*podman_base(), "logs", c.id],
                                                                      capture_output=True, text=True).stdout)
        started = time.monotonic()
        # by the 12-digit id podman ps and docker ps show (a unique prefix names the run)
        p = _gw("stop", "--timeout", "2", "--json", c.id[:12])
        took = time.monotonic() - started
        assert p.returncode == 0, p.stderr
        got = json.loads(p.stdout)
        assert (got["run"], got["stopped"], got["signal"]) == (c.run_id, True, signal_name)
        waits = (f"gatewrap: sent SIGTERM to container run {c.run_id}'s first process; waiting up to 2 s "
                 f"(--timeout) for the container to exit, then SIGKILL to all of its processes")
        assert p.stderr.splitlines() == ([waits] if signal_name == "SIGKILL" else []), p.stderr
        assert got["run_end"]["event"] == "run_end"
        assert got["run_end"]["reason"] == "the container was deleted (gatewrap-oci delete)"  # podman's --rm
        assert took < 2 + EXIT_GRACE + 5
        assert _gw("stop", c.run_id).returncode == 1  # no live run any more
        assert not _live(c.run_id)
        _sandbox_gone(c.run_id)
        _until("podman's --rm", lambda: c.id not in subprocess.run([*podman_base(), "ps", "-a", "-q", "--no-trunc"],
                                                                  capture_output=True, text=True).stdout)
    finally:
        _rm(c.id)


def test_a_container_whose_engine_died_keeps_its_run_while_it_lives_and_loses_it_once_dead(podman):
    c = podman("-d", "--network", "none", cmd=TERM_IGNORED, rm=False)
    assert c.returncode == 0, c.stderr
    try:
        _until("the run in gatewrap ps", lambda: _ps(c.run_id))
        conmon, init = int(_inspect(c.id, ".State.ConmonPid")), int(_inspect(c.id, ".State.Pid"))
        os.kill(conmon, signal.SIGKILL)  # the engine's monitor: nothing will delete the container now
        time.sleep(EXIT_GRACE + 1.5)
        assert _live(c.run_id), "a live container's run was ended"
        os.kill(init, signal.SIGKILL)  # killed hard: its cgroup empties, and no delete follows
        _until("the run's end", lambda: not os.path.exists(f"/run/gatewrap/runs/{c.run_id}.lock"),
               wait=EXIT_GRACE + 15)
        end, = c.records(event="run_end")
        assert end["reason"].startswith("the container's processes have all exited and its engine did not delete it")
        assert "exit_code" not in end
        _sandbox_gone(c.run_id)
    finally:
        _rm(c.id)
    assert len(c.records(event="run_end")) == 1  # podman's delete, at last, finds nothing left to end


def test_a_restarted_daemon_takes_a_live_containers_run_back_and_its_egress_passes_the_gate_again(podman):
    daemon = Daemon("--idle-exit", "0").start()
    restarted = None
    c = podman("-d", "--network", "none", "--annotation", "gatewrap.allow=allowed.test", cmd=FETCHES, daemon=daemon)
    try:
        assert c.returncode == 0, c.stderr
        _until("an allowed fetch", lambda: c.records(event="request", decision="allowed"))
        daemon.kill()  # SIGKILL: its runs' gates go with it; the hooks stay
        _until("a fetch refused: no gate, no egress", lambda: _last_fetch(c.id) == "000")
        gc = _gw("gc", "--json")  # as a run of its own does at its start
        assert gc.returncode == 0, gc.stderr
        assert [c.run_id, daemon.socket] in json.loads(gc.stdout)["containers"]
        restarted = Daemon.restart_of(daemon)
        _until("run_resumed", lambda: c.records(event="run_resumed"))
        assert _live(c.run_id)
        assert subprocess.run([*podman_base(), "ps", "-q", "--no-trunc"], capture_output=True,
                              text=True).stdout.count(c.id) == 1
        records = c.records()
        resumed_at = next(i for i, r in enumerate(records) if r["event"] == "run_resumed")
        _until("a fetch through the new gate", lambda: _last_fetch(c.id) == "200")
        _until("an allowed fetch through the new gate",
               lambda: [r for r in c.records()[resumed_at:]
                        if r.get("event") == "request" and r["decision"] == "allowed"])
        assert "took container run" in restarted.log_text() or f"took run {c.run_id} back" in restarted.log_text()
        denied = subprocess.run([*podman_base(), "exec", c.id, "curl", "-s", "http://denied.test/"],
                                capture_output=True, text=True, timeout=60)
        assert "create the container with the annotation gatewrap.allow=denied.test:80" in denied.stdout, denied
        _rm(c.id)
        _until("the run's end", lambda: c.records(event="run_end"))
        end, = c.records(event="run_end")
        assert end["reason"] == "the container was deleted (gatewrap-oci delete)"
        assert end["allowed"] >= 2  # before and after the restart
        _sandbox_gone(c.run_id)
    finally:
        _rm(c.id)
        (restarted or daemon).stop()
        daemon.stop()


MiB = 1 << 20


def _ram() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


#: What the container prints: the bounds of its own cgroups (runc binds them at /sys/fs/cgroup/CONTROLLER).
SHOW_BOUNDS = ["sh", "-c", "cat /sys/fs/cgroup/pids/pids.max /sys/fs/cgroup/memory/memory.limit_in_bytes"]


@pytest.mark.parametrize("flags, pids, memory", [
    ([], 2048, None),  # podman's own default pids limit (containers.conf pids_limit), kept; no memory bound: the run's
    (["--pids-limit", "-1"], 4096, None),  # no pids limit from podman: the run's default
    (["--pids-limit", "100", "--memory", "256m"], 100, 256 * MiB),  # the engine's, tighter, kept
], ids=["podman's defaults", "no pids limit", "the engine's own bounds"])
def test_a_container_gets_a_runs_default_bounds_where_its_engine_set_none(podman, flags, pids, memory):
    c = podman("--network", "none", *flags, cmd=SHOW_BOUNDS)
    assert c.returncode == 0, c.stderr
    start, = c.records(event="run_start")
    bounds = start["limits"]
    assert (bounds["pids"], bounds["pids_by"]) == (pids, "cgroup1")
    if memory is None:  # gatewrap run's default: half of the host's RAM
        assert abs(bounds["memory"] - _ram() // 2) <= 4096, bounds
    else:
        assert bounds["memory"] == memory
    assert c.stdout.split() == [str(pids), str(bounds["memory"])]


def test_a_container_removed_while_its_daemon_is_down_has_its_run_collected_by_a_daemon_its_delete_starts(podman):
    daemon = Daemon("--idle-exit", "0").start()
    c = podman("-d", "--network", "none", cmd=TERM_IGNORED, daemon=daemon)
    try:
        assert c.returncode == 0, c.stderr
        _until("the run in gatewrap ps", lambda: _ps(c.run_id))
        daemon.kill()
        rm = subprocess.run([*podman_base(), "rm", "-f", "-t", "0", c.id], capture_output=True, text=True, timeout=120)
        assert rm.returncode == 0, rm.stderr
        end, = c.records(event="run_end")
        assert end["reason"] == "gatewrap died; collected by the gatewrap daemon"
        _sandbox_gone(c.run_id)
    finally:
        _rm(c.id)
        _stop_daemon_of(daemon.socket)
        daemon.stop()


def _stop_daemon_of(socket_path: str) -> None:
    """Stop the daemon that serves ``socket_path`` (one started on demand: its pid is in the lock beside it)."""
    try:
        with open(socket_path + ".lock") as f:
            pid = int(f.read().strip() or 0)
    except (OSError, ValueError):
        return
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if socket_path.encode() not in f.read():
                return
        os.kill(pid, signal.SIGTERM)
        import select

        select.select([fd], [], [], 30)
    finally:
        os.close(fd)
