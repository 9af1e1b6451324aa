"""``gatewrap ps`` and ``gatewrap stop``: the runs alive now, from the run registry.

A live run is one whose lock file a gatewrap process holds (sandbox/registry.py). What it
runs and as whom come from its ``run_start`` record; its counts so far from its own
records in its audit log, read from where the log ended when the run started (the lock
file's ``audit_offset``): exact, and costs a read of what was written since then (every
run's records in that log), never the whole log. Its pending approvals are counted from
the same records: an ``approval_asked`` whose approval has no ``approval_approved``,
``_rejected``, ``_expired`` or ``_cancelled`` record yet (``gatewrap approvals list --run
ID`` reads the store itself). What its processes use now (CPU %, RSS, count) is sampled
from its cgroup (run_usage.py).

A container's run (``gw-`` and the container's id: :mod:`gatewrap.oci`) has no gatewrap
process of its own (the daemon holds its lock): ``ps`` names the container instead of a
pid, and ``stop`` ends the container as ``docker stop`` does (:func:`stop_container`).
"""

from __future__ import annotations

import io
import os
import pwd
import select
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from . import audit_reader as ar
from . import run_ids
from .audit_stats import RunCounts
from .errors import GatewrapError
from .oci.argv import RUN_PREFIX
from .run_usage import Usage, sample
from .sandbox import registry
from .text import command_line, printable


@dataclass
class LiveRun:
    """One live run: its gatewrap's pid (0 for a container's run, which has none), the
    agent's argv and user (None until its ``run_start`` record is written), its age in
    seconds, its counts so far, what its processes use now
    (:class:`gatewrap.run_usage.Usage`, zero until sampled) and, for a container's run, the
    container's id."""

    run: str
    pid: int
    argv: list[str] | None
    user: str | None
    uid: int | None
    started: float | None
    uptime_s: float | None
    audit_log: str | None
    counts: RunCounts = field(default_factory=lambda: RunCounts(""))
    #: Approvals asked and not answered yet, as the run's audit records say so far.
    pending_approvals: int = 0
    usage: Usage = field(default_factory=Usage)
    container: str | None = None

    def as_record(self) -> dict[str, Any]:
        """``{run, pid, argv, user, uid, started, uptime_s, audit_log, pending_approvals,
        container, allowed, denied, direct_egress, failed, cpu_percent, rss, procs}``
        (``started``: Unix seconds; ``container``: its id, None for another run;
        ``cpu_percent`` a float, of one CPU; ``rss`` bytes; ``procs`` an int)."""
        c = self.counts
        rec = {k: v for k, v in asdict(self).items() if k not in ("counts", "usage")}
        rec.update(allowed=c.allowed, denied=c.denied, direct_egress=c.direct_egress, failed=c.failed)
        rec.update(asdict(self.usage))
        return rec


def _user(uid: Any) -> str | None:
    if not isinstance(uid, int):
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _own_records(run_id: str, info: dict[str, Any], **filters: Any) -> Iterator[dict[str, Any]]:
    """The run's records passing ``filters``, from its audit log after its offset in the file
    that was the log when it started, then through the segments rotated since
    (:func:`gatewrap.audit_reader.tail`); nothing when the log is unknown or gone."""
    path, offset = info.get("audit_log"), info.get("audit_offset", 0)
    if not isinstance(path, str):
        return
    dev, ino = info.get("audit_dev"), info.get("audit_ino")
    if isinstance(dev, int) and isinstance(ino, int) and isinstance(offset, int):
        f = ar.Filters(run=run_id, **filters)
        try:
            for item in ar.tail(path, io.StringIO(), start=ar.Position(dev, ino, offset), follow=False):
                if item is not None and f.quick(item[2]):
                    try:
                        rec = ar.parse(item[2])
                    except ValueError:
                        continue
                    if isinstance(rec, dict) and f.match(rec):
                        yield rec
        except FileNotFoundError:
            return
        return
    try:
        if not isinstance(offset, int) or offset > os.path.getsize(path):
            offset = 0
        for _, rec in ar.entries(path, ar.Filters(run=run_id, **filters), offset=offset, err=io.StringIO()):
            yield rec
    except FileNotFoundError:
        return


def unended(run_id: str, info: dict[str, Any]) -> bool:
    """Whether run ``run_id`` started (its ``run_start`` is in its audit log, read from where
    its lock file ``info`` says its records start) and has no ``run_end`` after it."""
    last = None
    for rec in _own_records(run_id, info, events=("run_start", "run_end")):
        last = rec.get("event")
    return last == "run_start"


def counts_so_far(run_id: str, info: dict[str, Any]) -> tuple[RunCounts, str | None]:
    """Run ``run_id``'s counts from its records written so far (as ``run_end`` counts them),
    read from the position its lock file ``info`` (:func:`registry.info`) names, and the
    ``time`` of the last of them (None if there is none)."""
    counts, last = RunCounts(run_id), None
    for rec in _own_records(run_id, info):
        counts.add(rec)
        last = rec.get("time", last)
    return counts, last


#: The events that answer an approval (``approval_sent`` follows an ``approval_approved``).
ANSWERED = frozenset({"approval_approved", "approval_rejected", "approval_expired", "approval_cancelled"})


def live_run(run_id: str, now: float | None = None) -> LiveRun | None:
    """The live run ``run_id``, or None when no gatewrap process owns it (:func:`registry.owned`)."""
    info = registry.info(run_id)
    if info is None or not registry.owned(run_id):
        return None
    counts, start = RunCounts(run_id), None
    asked: set[str] = set()
    answered: set[str] = set()
    for rec in _own_records(run_id, info):
        counts.add(rec)
        event = rec.get("event")
        if event == "run_start":
            start = rec
        elif event == "approval_asked" and isinstance(rec.get("approval"), str):
            asked.add(rec["approval"])
        elif event in ANSWERED and isinstance(rec.get("approval"), str):
            answered.add(rec["approval"])
    started = info.get("started")
    if not isinstance(started, (int, float)):
        try:
            started = os.stat(registry.lock_path(run_id)).st_mtime
        except OSError:
            started = None
    now = time.time() if now is None else now
    uid = start.get("uid") if start else None
    container = container_of(run_id)
    pid = info.get("pid") if container is None else 0  # the pid of the gatewrap-oci that made it, long gone
    return LiveRun(run=run_id, pid=pid if isinstance(pid, int) else 0, argv=start.get("argv") if start else None,
                   user=_user(uid), uid=uid if isinstance(uid, int) else None, started=started,
                   uptime_s=None if started is None else max(0.0, now - started),
                   audit_log=info.get("audit_log"), counts=counts, pending_approvals=len(asked - answered),
                   container=container)


def container_of(run_id: str) -> str | None:
    """The id of the container whose run ``run_id`` is (what the daemon keeps of it:
    :func:`registry.saved`), None for another run."""
    got = (registry.saved(run_id) or {}).get("container")
    return got if isinstance(got, str) else None


def live_runs(usage: bool = True) -> list[LiveRun]:
    """Every live run, oldest first (by ``started``; one whose start is unknown last, then by
    id), with what its processes use now when ``usage`` (:func:`gatewrap.run_usage.sample`:
    takes :data:`gatewrap.run_usage.SAMPLE_S` seconds)."""
    runs = [r for r in (live_run(i) for i in registry.live()) if r is not None]
    runs.sort(key=lambda r: (r.started is None, r.started or 0.0, r.run))
    if usage:
        used = sample([r.run for r in runs])
        for r in runs:
            r.usage = used[r.run]
    return runs


def uptime(seconds: float | None) -> str:
    """``3s``, ``4m05s``, ``2h03m``, ``3d04h``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def ps_lines(runs: list[LiveRun], whole_ids: bool = False) -> list[str]:
    """The table of ``gatewrap ps``: a run's id as :func:`run_ids.shown` makes it, the column
    as wide as its widest; the agent's command on one line as a shell reads it
    (:func:`gatewrap.text.command_line`: a ``-c`` script's newlines as ``$'...\\n...'``)."""
    shown = run_ids.shown([r.run for r in runs], whole_ids)
    width = max([len("gw-0123456789"), *map(len, shown.values())])
    out = [f"{'RUN':<{width}} {'PID':>7} {'USER':<10} {'UPTIME':>7} {'CPU%':>6} {'RSS':>6} {'PROCS':>5} "
           f"{'PENDING':>7} {'ALLOWED':>7} {'DENIED':>7} {'DIRECT':>7} {'FAILED':>7}  COMMAND"]
    for r in runs:
        c, u = r.counts, r.usage
        cmd = command_line(r.argv) if r.argv else "(starting)"
        if r.container is not None:
            cmd = f"[container {r.container[:12]}] {cmd}"
        out.append(f"{printable(shown[r.run]):<{width}} {r.pid or '-':>7} {printable(r.user or '-'):<10} "
                   f"{uptime(r.uptime_s):>7} "
                   f"{u.cpu_percent:>6.1f} {size(u.rss):>6} {u.procs:>5} "
                   f"{r.pending_approvals:>7} {c.allowed:>7} {c.denied:>7} {c.direct_egress:>7} {c.failed:>7}  "
                   f"{printable(cmd)}")
    return out


def size(n: int) -> str:
    """Bytes as ps tables show them: ``812K``, ``23.4M``, ``1.2G`` (powers of 1024)."""
    value, unit = n / 1024, "K"
    for bigger in "MGT":
        if value < 1000:
            break
        value, unit = value / 1024, bigger
    return f"{value:.0f}K" if unit == "K" else f"{value:.1f}{unit}"


@dataclass
class Stopped:
    """How ``gatewrap stop`` ended a run: the agent's exit code and the run's ``run_end``
    record (None when the log does not hold one: gatewrap died before writing it)."""

    run: str
    exit_code: int | None
    run_end: dict[str, Any] | None
    #: What ended it: ``SIGTERM``, or for a container that outlived --timeout ``SIGKILL``.
    signal: str = "SIGTERM"

    def as_record(self) -> dict[str, Any]:
        """``{run, stopped: true, signal: "SIGTERM" | "SIGKILL", exit_code, run_end}``."""
        return {"run": self.run, "stopped": True, "signal": self.signal, "exit_code": self.exit_code,
                "run_end": self.run_end}


class NoSuchRun(GatewrapError):
    """No gatewrap process owns the run (exit 1)."""

    exit_code = 1


def resolve(name: str) -> str:
    """The live run ``name`` names: itself if it is one; else the one live run whose id
    starts with it, or with ``gw-`` and it (a container's short id, as ``docker ps`` and
    ``podman ps`` show it, names its run ``gw-<full id>``: :mod:`gatewrap.run_ids`); else
    ``name`` unchanged.

    Raises:
        NoSuchRun: more than one live run starts with it (they are listed).
    """
    if registry.info(name) is not None:
        return name
    try:
        return run_ids.named(name, lambda begins: (r for r in registry.live() if r.startswith(begins)), "live run")
    except run_ids.Ambiguous as e:
        raise NoSuchRun(str(e)) from None


#: Seconds ``gatewrap stop`` waits quietly after its SIGTERM before it says it is waiting
#: (a run that ends at once prints only its end).
QUIET_WAIT = 1.0


def stop(run_id: str, timeout: float, say: Callable[[str], None] = lambda line: None) -> Stopped:
    """End run ``run_id`` as SIGTERM would: signal its gatewrap process, which forwards the
    signal to the agent and, once the agent has exited, tears the sandbox down and writes
    the ``run_end`` record; wait up to ``timeout`` seconds for that process to exit. When
    it has not exited :data:`QUIET_WAIT` seconds after the signal, ``say`` gets one line
    saying what was sent, how long gatewrap waits and what it does then.

    The signal goes through a pidfd (pidfd_open(2), pidfd_send_signal(2)) taken while the
    run's lock is held, so it cannot reach another process that reused the pid.

    Raises:
        NoSuchRun: no live run ``run_id`` (a name with ``/`` names none: registry's paths).
        GatewrapError: the run is still alive after ``timeout`` (the agent may ignore SIGTERM).
    """
    run_id = resolve(run_id)
    info = registry.info(run_id)
    if info is None or not registry.owned(run_id) or not isinstance(info.get("pid"), int):
        raise NoSuchRun(f"no live run {run_id} (gatewrap ps lists them)")
    if container_of(run_id) is not None:
        return stop_container(run_id, info, timeout, say)
    foreign = registry.unproven(run_id, info)
    if foreign is not None:  # its pid numbers another process here
        raise GatewrapError(f"run {run_id} is not this gatewrap's to stop: {foreign}")
    try:
        pidfd = os.pidfd_open(info["pid"])
    except ProcessLookupError:
        raise NoSuchRun(f"no live run {run_id}: it has just ended") from None
    try:
        if not registry.owned(run_id):  # the pid might be another process's by now
            raise NoSuchRun(f"no live run {run_id}: it has just ended")
        signal.pidfd_send_signal(pidfd, signal.SIGTERM)
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)  # readable once the process has exited (pidfd_open(2))
        quiet = min(QUIET_WAIT, timeout)
        if not poller.poll(quiet * 1000):
            say(f"gatewrap: sent SIGTERM to run {run_id}; waiting up to {timeout:g} s (--timeout) for its agent "
                f"to exit, then giving up (exit 125) and leaving it running")
            ended = bool(poller.poll((timeout - quiet) * 1000))
        else:
            ended = True
        if not ended:
            raise GatewrapError(
                f"run {run_id} is still running {timeout:g} s after SIGTERM (its agent may catch or ignore "
                f"SIGTERM): wait longer with --timeout, or kill the agent's processes with "
                f"`echo 1 > {_leaf(run_id)}/cgroup.kill` (gatewrap then ends the run and records it)")
    finally:
        os.close(pidfd)
    run_end = None
    for rec in _own_records(run_id, info, events=("run_end",)):
        run_end = rec
    code = run_end.get("exit_code") if run_end else None
    return Stopped(run_id, code if isinstance(code, int) else None, run_end)


def stop_container(run_id: str, info: dict[str, Any], timeout: float,
                   say: Callable[[str], None] = lambda line: None) -> Stopped:
    """End container run ``run_id`` as ``docker stop`` does: SIGTERM to the container's first
    process (:func:`container_init`), and after ``timeout`` seconds SIGKILL to every process
    of its cgroup (``cgroup.kill``; ``say`` gets a line saying so when the container still
    runs :data:`QUIET_WAIT` seconds after the SIGTERM); then wait for the run's end, which follows the
    container's: its engine's ``delete``, or the daemon's, once the container's cgroup is
    empty and its engine has not deleted it (:data:`gatewrap.oci.runs.EXIT_GRACE`). The
    engine sees its container exit as after its own stop (``podman ps -a``: Exited).
    ``info``: the run's lock file (:func:`registry.info`).

    Raises:
        GatewrapError: the run has not ended once its container is dead (its daemon is down:
            ``gatewrap gc`` collects it then).
    """
    from .oci.runs import EXIT_GRACE
    from .sandbox import cgroup

    leaf = _leaf(run_id)
    sent = "SIGTERM"
    for pidfd in container_init(leaf):
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGTERM)
        except ProcessLookupError:
            pass
        finally:
            os.close(pidfd)
    quiet = min(QUIET_WAIT, timeout)
    ended = cgroup.wait_empty(leaf, quiet)
    if not ended:
        say(f"gatewrap: sent SIGTERM to container run {run_id}'s first process; waiting up to {timeout:g} s "
            f"(--timeout) for the container to exit, then SIGKILL to all of its processes")
        ended = cgroup.wait_empty(leaf, timeout - quiet)
    if not ended:
        sent = "SIGKILL"
        cgroup.kill(leaf)
    wait = EXIT_GRACE + 10
    deadline = time.monotonic() + wait
    while registry.alive(run_id):
        if time.monotonic() > deadline:
            raise GatewrapError(f"container run {run_id}: the container has exited, but its run has not ended "
                                f"{wait:g} s later (is its gatewrap daemon down? `gatewrap gc` then ends it)")
        time.sleep(0.05)
    run_end = None
    for rec in _own_records(run_id, info, events=("run_end",)):
        run_end = rec
    return Stopped(run_id, None, run_end, sent)


def container_init(leaf: str) -> list[int]:
    """pidfds (pidfd_open(2)) of the first process of the container in cgroup ``leaf``: the
    one that is pid 1 of its own pid namespace (``NSpid``'s last field, proc(5)); in the
    host's pid namespace (``--pid host``), those whose parent is outside the cgroup (the
    engine's monitor's children: conmon's, a containerd shim's). Each is checked in the
    cgroup after its pidfd is open, so a pid reused meanwhile is never signalled. Empty: no
    process left."""
    try:
        with open(os.path.join(leaf, "cgroup.procs")) as f:
            pids = {int(p) for p in f.read().split()}
    except (OSError, ValueError):
        return []
    firsts, tops = [], []
    for pid in sorted(pids):
        status = _status(pid)
        nspid = status.get("NSpid", "").split()
        if len(nspid) > 1 and nspid[-1] == "1":
            firsts.append(pid)
        elif status.get("PPid", "").isdigit() and int(status["PPid"]) not in pids:
            tops.append(pid)
    inside = "0::/" + os.path.relpath(leaf, os.path.dirname(os.path.dirname(leaf)))  # /proc/PID/cgroup's v2 line
    out = []
    for pid in firsts or tops:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            with open(f"/proc/{pid}/cgroup") as f:
                there = inside in f.read().splitlines()
        except OSError:
            there = False
        if there:
            out.append(fd)
        else:
            os.close(fd)
    return out


def _status(pid: int) -> dict[str, str]:
    """/proc/PID/status as ``{field: value}`` (proc(5)); empty if the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return {k: v.strip() for k, _, v in (line.partition(":") for line in f)}
    except OSError:
        return {}


def _leaf(run_id: str) -> str:
    """The run's cgroup directory, for a message."""
    from .sandbox import cgroup

    try:
        return os.path.join(cgroup.parent_dir(), run_id)
    except GatewrapError:
        return f"/sys/fs/cgroup/gatewrap/{run_id}"
