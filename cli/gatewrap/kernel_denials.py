"""Turn the run's ring-buffer events into audit records and live stderr notices."""

from __future__ import annotations

import os
import select
import socket
import sys
import threading
import time
from datetime import datetime, timezone
from collections.abc import Callable
from typing import Any, TextIO

from .attribution import Attributor
from .bpf.loader import AT_FDCWD, MAX_FOLDS_PER_RUN, MAX_REFUSED_WRITE_FOLDS, RunHooks, _Event
from .text import printable

#: Live notices per run on stderr; beyond it one line says they are suppressed (the audit
#: log keeps every record).
MAX_NOTICES = 20

#: IPPROTO_* numbers (include/uapi/linux/in.h) and the names the audit log uses.
PROTOCOLS = {1: "icmp", 6: "tcp", 17: "udp", 58: "icmpv6", 132: "sctp", 136: "udplite", 262: "mptcp"}
#: The decision of a ``unix_socket`` record: attempted and not blocked; its outcome unknown.
ATTEMPTED = "attempted"
#: SOCK_* numbers (include/linux/net.h), for unix socket records.
SOCK_TYPES = {1: "stream", 2: "dgram", 5: "seqpacket"}


#: Bytes of /proc/PID/cmdline a record carries (and characters, once decoded); beyond it
#: the record says ``truncated: ["cmdline"]``. An agent chooses its argv: unbounded, every record
#: would carry all of it.
MAX_CMDLINE = 4096


def _cmdline(pid: int) -> tuple[str, bool] | None:
    """The process's command line from /proc (at most :data:`MAX_CMDLINE` bytes and
    characters, arguments joined by spaces) and whether it was cut; None if it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read(MAX_CMDLINE + 1)
    except OSError:
        return None
    cut = len(raw) > MAX_CMDLINE
    text = raw[:MAX_CMDLINE].rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "backslashreplace")
    if len(text) > MAX_CMDLINE:  # undecodable bytes became \xNN
        text, cut = text[:MAX_CMDLINE], True
    return (text, cut) if text else None


def _wall_time(monotonic_ns: int) -> str:
    """A CLOCK_MONOTONIC time (bpf_ktime_get_ns) as the audit log's UTC time text."""
    ns = time.time_ns() - time.clock_gettime_ns(time.CLOCK_MONOTONIC) + monotonic_ns
    return datetime.fromtimestamp(ns / 1e9, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _dest(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def record_of(ev: _Event, run_id: str, attribute: Attributor | None = None) -> dict[str, Any]:
    """The audit record of one kernel event (field names as in the gate's records).

    ``count`` is the number of identical attempts the event stands for (folded in the
    kernel: same process, hook, verdict and destination); with more than one,
    ``first_seen``/``last_seen`` give the span of that denial in the run, and tid/comm are
    those of one of the attempts. An ``overflow`` record counts any denials of the run beyond
    the distinct ones it may fold, and has no destination.

    With ``attribute``, a record with a process also gets its ``exe`` and ``parents`` (see
    :meth:`Attributor.of`), read now, once per record (a folded record's attempts are one
    process's); without it (gc, when the process is long gone and its pid may be another's),
    ``attribution: "partial"``.
    """
    rec: dict[str, Any] = {
        "run": run_id,
        "event": "unix_socket" if ev.allowed else "direct_egress",
        # A unix socket hook lets the call through and runs before it: it cannot know whether
        # the connect or send then succeeded (ENOENT, ECONNREFUSED are the kernel's), so the
        # record says what it knows: the attempt, not blocked.
        "decision": ATTEMPTED if ev.allowed else "denied",
        "reason": f"kernel: {ev.verdict}",
        "count": ev.count,
    }
    if ev.overflow:
        what = "unix socket addresses" if ev.allowed else "denials"
        rec.update(reason=f"kernel: {what} beyond the {MAX_FOLDS_PER_RUN} distinct ones a run folds, "
                          "folded together (any hook and address)", overflow=True)
    if ev.count > 1:
        rec.update(first_seen=_wall_time(ev.first_ns), last_seen=_wall_time(ev.last_ns))
    if ev.tgid:  # 0 from the packet hook, which runs without a reliable task
        rec.update(pid=ev.tgid, tid=ev.pid, uid=ev.uid, comm=ev.comm)
        cmd = _cmdline(ev.tgid)
        if cmd is not None:
            rec["cmdline"] = cmd[0]
            if cmd[1]:
                rec["truncated"] = ["cmdline"]
        rec.update(attribute.of(ev.tgid) if attribute is not None else {"attribution": "partial"})
    if ev.overflow:
        rec["cgroup_id"] = ev.cgroup_id
        return rec
    if ev.allowed:
        if ev.path is not None:
            rec["path"] = ev.path
        rec.update(sock_type=SOCK_TYPES.get(ev.sock_type, str(ev.sock_type)), hook=ev.hook,
                   cgroup_id=ev.cgroup_id)
        return rec
    if ev.hook == "setsockopt":
        rec.update(family="ipv4" if ev.family == socket.AF_INET else "ipv6",
                   sockopt=f"{'IPPROTO_IP' if ev.family == socket.AF_INET else 'IPPROTO_IPV6'}/{ev.protocol}",
                   hook=ev.hook, cgroup_id=ev.cgroup_id)
        return rec
    rec.update({
        "dst_ip": ev.dst_ip,
        "dst_port": ev.dst_port,
        "proto": PROTOCOLS.get(ev.protocol, str(ev.protocol)),
        "family": "ipv4" if ev.family == socket.AF_INET else "ipv6",
        "hook": ev.hook,
        "cgroup_id": ev.cgroup_id,
    })
    return rec


def notice_of(rec: dict[str, Any], gate_url: str) -> str:
    """The one-line stderr notice for a kernel denial (the process name is escaped)."""
    who = f"{printable(rec['comm'])} (pid {rec['pid']})" if "pid" in rec else (
        "the agent" if rec.get("overflow") else "a packet")
    if "sockopt" in rec:
        what = f"setsockopt {rec['sockopt']} (IP options / IPv6 extension headers)"
    elif rec.get("dst_port"):
        what = f"{rec['proto']} {_dest(rec['dst_ip'], rec['dst_port'])}"
    else:
        what = f"a {rec['proto']} socket"
    times = f" (×{rec['count']})" if rec.get("count", 1) > 1 else ""
    if rec.get("overflow"):
        return (f"gatewrap: blocked direct egress{times}: {who} -> more destinations than are folded one by "
                f"one: only the gate ({gate_url}) is reachable")
    return (f"gatewrap: blocked direct egress{times}: {who} -> {what} [{rec['hook']}]: only the gate "
            f"({gate_url}) is reachable" + _loopback_hint(rec))


def _loopback_hint(rec: dict[str, Any]) -> str:
    """For a TCP connect to a loopback address: why it was not sent to the gate and how to.
    The agent's environment names loopback in NO_PROXY (agent_shims/env.toml; Go never
    proxies loopback either), so its clients dial it themselves, and the sandbox's loopback
    holds only the gate; through the gate the request goes to the host's loopback, which
    the SSRF guard refuses unless a rule names that address (docs/guide/policy.md)."""
    if rec.get("proto") != "tcp" or not _is_loopback(rec.get("dst_ip", "")):
        return ""
    return (f"; clients skip it for loopback (NO_PROXY): to send this through it, to the host's "
            f"{_dest(rec['dst_ip'], rec['dst_port'])} if the policy allows that address, use curl --noproxy '' "
            "or unset NO_PROXY")


def _is_loopback(ip: str) -> bool:
    """Whether ``ip`` is a loopback address: 127.0.0.0/8 (RFC 1122 3.2.1.3), ::1 (RFC 4291
    2.5.3), or 127.0.0.0/8 mapped into IPv6 (::ffff:127.x.y.z)."""
    import ipaddress

    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


def _proc_link(tgid: int, name: str) -> str | None:
    """readlink(2) of /proc/TGID/NAME (``cwd``, ``fd/N``); None when the process or fd is gone."""
    try:
        return os.readlink(f"/proc/{tgid}/{name}")
    except OSError:
        return None


def _agent_view(tgid: int, link: str | None) -> str | None:
    """``link`` (a /proc/TGID/{cwd,fd/N} target) as the process itself names it: relative to
    its own root. The kernel writes such a link relative to the reader's root only when the
    reader's root is reachable from it (proc(5), /proc/pid/cwd; d_path() stops at the reader's
    root or at the top of the process's mount namespace): gatewrap in a chroot (a root that is
    no mount point) reading a process of another mount namespace gets the full path, chroot
    folder included, and /proc/TGID/root says which prefix that is. None when the process is
    gone."""
    if link is None:
        return None
    root = _proc_link(tgid, "root")
    if root is None:
        return None
    if root in ("/", "") or not root.startswith("/"):
        return link
    if link == root:
        return "/"
    return link[len(root):] if link.startswith(root + "/") else link


def refused_path(ev: _Event, workdir: str | None) -> str | None:
    """The absolute path a refused write named: its path as given, joined to the directory
    it was relative to (the process's cwd or ``dirfd``, read from /proc now if it still
    lives; a cwd it no longer has: ``workdir``, the run's working directory), normalised
    (``..`` taken lexically). None when a ``dirfd``'s folder cannot be known any more.

    The process may have changed its cwd between the attempt and this read (events are
    read a moment later): the path is then joined to the wrong folder, as with any /proc read.
    """
    if not ev.path:
        return None
    if ev.path.startswith("/"):
        return os.path.normpath(ev.path)
    base = _agent_view(ev.tgid, _proc_link(ev.tgid, "cwd" if ev.dirfd == AT_FDCWD else f"fd/{ev.dirfd}"))
    if base is None:
        if ev.dirfd != AT_FDCWD or workdir is None:
            return None
        base = workdir
    if not base.startswith("/"):  # e.g. "pipe:[...]": no folder
        return None
    return os.path.normpath(os.path.join(base, ev.path))


def protected_match(path: str, protected: dict[str, str]) -> str | None:
    """The host path of ``path`` (as the agent names it) when it is a protected path or lies
    below one; None otherwise. ``protected``: the run's protected paths as the agent sees
    them (in the jail: :func:`gatewrap.sandbox.view.in_jail`) -> their host paths."""
    probe = path
    while True:
        host = protected.get(probe)
        if host is not None:
            return host + path[len(probe):]
        if probe in ("/", ""):
            return None
        probe = os.path.dirname(probe)


def refused_record_of(ev: _Event, run_id: str, host_path: str) -> dict[str, Any]:
    """The ``protected_path`` record of an attempt to change a protected path that the
    kernel refused (``change: "refused"``): the syscall, its errno, and how many identical
    attempts (same path as given, syscall and errno, any process of the run) it stands for,
    with tid/comm of one of them."""
    rec: dict[str, Any] = {"run": run_id, "event": "protected_path", "path": host_path, "change": "refused",
                           "syscall": ev.syscall, "errno": ev.errno, "count": ev.count}
    if ev.count > 1:
        rec.update(first_seen=_wall_time(ev.first_ns), last_seen=_wall_time(ev.last_ns))
    if ev.tgid:
        rec.update(pid=ev.tgid, tid=ev.pid, uid=ev.uid, comm=ev.comm)
    return rec


class KernelDenials:
    """A thread that polls the run's ring buffer and records every denial.

    Each event becomes one audit record (``event = "direct_egress"``, with the number of
    attempts it stands for) and one line on ``stderr``. :meth:`stop` drains what is left,
    then flushes the counts still folded in the kernel. :attr:`count` is the number of
    attempts recorded (the sum of the records' counts); :attr:`records` the records;
    :attr:`unix` the unix socket connects and sends recorded (``event = "unix_socket"``,
    decision ``attempted``: no notice).
    """

    def __init__(self, hooks: RunHooks, audit: Any, run_id: str, gate_url: str,
                 stderr: TextIO | None = None, run_cgroup: str | None = None,
                 audit_command: str | None = None, reader: "SharedReader | None" = None,
                 protected: dict[str, str] | None = None, workdir: str | None = None) -> None:
        self._hooks = hooks
        #: The run's protected paths as the agent names them -> their host paths
        #: (:func:`protected_match`), and its working directory (:func:`refused_path`).
        self._protected = protected or {}
        self._workdir = workdir
        #: Refused attempts to change each protected path (host path -> attempts), as recorded.
        self.refused: dict[str, int] = {}
        #: Refused writes beyond the MAX_REFUSED_WRITE_FOLDS distinct ones a run folds, without
        #: their path (not checked against the protected paths).
        self.refused_unsorted = 0
        #: The one thread that polls every run's buffer (the daemon's); None: a thread of our own.
        self._reader = reader
        self._audit = audit
        self._run_id = run_id
        #: The command that shows the run's records (``gatewrap audit --run ID [--log PATH]``).
        self._audit_command = audit_command or f"gatewrap audit --run {run_id}"
        self._gate_url = gate_url
        self._stderr = stderr or sys.stderr
        #: Reads exe and parents of the run's processes (``run_cgroup``: its cgroup path as
        #: /proc/PID/cgroup shows it); None: records say ``attribution: "partial"``.
        self._attribute = Attributor(run_cgroup) if run_cgroup is not None else None
        #: Written by :meth:`stop` to wake the polling thread of a run of its own at once
        #: (eventfd(2)), made with it: on the daemon's one reader a run needs none (a daemon
        #: holds its descriptors for every idle sandbox: issue 23, target 4). -1: none.
        self._wake = -1
        #: The polling thread of a run of its own (made by :meth:`start`): an unstarted one
        #: would hold this object in a cycle (its target), and with it the run's audit log.
        self._thread: threading.Thread | None = None
        #: Between :meth:`start` and :meth:`stop`.
        self._polling = False
        self.count = 0
        self.records = 0
        self.unix = 0
        #: Attempts whose record the audit log could not take (a full disk): denied all the
        #: same, counted in run_end's unrecorded_events, said once on stderr.
        self.unrecorded = 0

    def _on_refused(self, ev: _Event) -> None:
        """A write the kernel refused with EROFS/EBUSY: recorded when it named a protected path."""
        if ev.overflow:
            if not self.refused_unsorted:
                print(f"gatewrap: more than {MAX_REFUSED_WRITE_FOLDS} distinct writes to read-only paths: "
                      "further ones are refused but not checked against the protected paths",
                      file=self._stderr, flush=True)
            self.refused_unsorted += ev.count
            return
        path = refused_path(ev, self._workdir)
        host = None if path is None else protected_match(path, self._protected)
        if host is None:
            return
        rec = refused_record_of(ev, self._run_id, host)
        try:
            self._audit.write(rec)
        except OSError as e:
            if not self.unrecorded:
                print(f"gatewrap: kernel events cannot be written to the audit log ({e})", file=self._stderr, flush=True)
            self.unrecorded += ev.count
        first = host not in self.refused
        self.refused[host] = self.refused.get(host, 0) + ev.count
        if first and len(self.refused) <= MAX_NOTICES:
            print(f"gatewrap: refused: {printable(ev.comm)} (pid {ev.tgid}) tried to change the protected path "
                  f"{printable(host)} ({ev.syscall}: {ev.errno})", file=self._stderr, flush=True)

    def _on_event(self, ev: _Event) -> None:
        if ev.refused_write:
            self._on_refused(ev)
            return
        rec = record_of(ev, self._run_id, self._attribute)
        try:
            self._audit.write(rec)
        except OSError as e:
            # Inside bcc's ring-buffer callback: an exception would end the poll loop. The
            # attempt was refused already; what is lost is its record, which is counted.
            if not self.unrecorded:
                print(f"gatewrap: kernel denials cannot be written to the audit log ({e}); they are "
                      "still refused, and counted in run_end as unrecorded_events", file=self._stderr, flush=True)
            self.unrecorded += ev.count
        if ev.allowed:  # a unix socket address: recorded, no notice
            self.unix += ev.count
            return
        self.count += ev.count
        self.records += 1
        if self.records <= MAX_NOTICES:
            print(notice_of(rec, self._gate_url), file=self._stderr, flush=True)
        elif self.records == MAX_NOTICES + 1:
            print(f"gatewrap: more direct egress blocked; further notices suppressed "
                  f"(all are in the audit log, {self._audit_command} --denied)",
                  file=self._stderr, flush=True)

    def start(self) -> None:
        """Open the ring buffer and start polling (on the shared reader, if given)."""
        self._hooks.open(self._on_event)
        if self._reader is not None:
            self._reader.add(self._hooks.fileno(), self._hooks.drain)
        else:
            self._wake = os.eventfd(0, os.EFD_CLOEXEC)
            self._thread = threading.Thread(target=self._loop, name="gatewrap-kernel-denials", daemon=True)
            self._thread.start()
        self._polling = True

    def _loop(self) -> None:
        poller = select.poll()
        poller.register(self._hooks.fileno(), select.POLLIN)
        poller.register(self._wake, select.POLLIN)
        while True:
            ready = {fd for fd, _ in poller.poll()}
            if self._wake in ready:
                return
            self._hooks.drain()

    def stop(self) -> None:
        """Stop polling, deliver what the buffer still holds, then the attempts still
        folded in the kernel. Call it once the run's cgroup is empty. Idempotent."""
        if self._polling and self._reader is not None:
            self._reader.remove(self._hooks.fileno())
        self._polling = False
        if self._wake >= 0:
            os.eventfd_write(self._wake, 1)
            if self._thread is not None:
                self._thread.join()
                self._thread = None
            os.close(self._wake)
            self._wake = -1
        self._hooks.drain()
        self._hooks.flush(self._on_event)


class SharedReader:
    """One thread that polls the ring buffers of many runs (the daemon's): each run adds its
    buffer's fd with the function that drains it, and removes it before its last drain.

    epoll(7): fds are added and removed from any thread while the poller waits.
    """

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._drains: dict[int, Callable[[], None]] = {}
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="gatewrap-kernel-denials", daemon=True)
        self._thread.start()

    def add(self, fd: int, drain: Callable[[], None]) -> None:
        """Call ``drain`` whenever ``fd`` polls readable (until :meth:`remove`)."""
        with self._lock:
            self._drains[fd] = drain
        self._epoll.register(fd, select.EPOLLIN)

    def remove(self, fd: int) -> None:
        """Stop polling ``fd``; a drain already under way may still finish after this returns,
        which the run's own lock on its buffer makes harmless (RunHooks.drain)."""
        with self._lock:
            self._drains.pop(fd, None)
        try:
            self._epoll.unregister(fd)
        except (OSError, ValueError):
            pass

    def _loop(self) -> None:
        while True:
            try:
                ready = self._epoll.poll(1.0)
            except InterruptedError:
                continue
            for fd, _ in ready:
                with self._lock:
                    drain = self._drains.get(fd)
                if drain is not None:
                    drain()


def salvage(hooks: Any, audit_factory: Callable[[str], Any], run_id: str, cgroup_id: int | None,
            audit_path: str | None, reason: str = "gatewrap died; collected by gatewrap gc", close: bool = True) -> int:
    """Record what a dead run's ring buffer still holds, then drop its map entries.

    Writes each event, then (``close``: the run started and its log has no ``run_end``) a
    ``run_end`` with ``reason``, to the run's own audit log (``audit_path``, from its lock
    file; skipped when unknown). ``cgroup_id`` None: the run's cgroup is gone already (its
    gatewrap died in its teardown), so is its ring buffer. Returns the number of records written.
    """
    rb = None if cgroup_id is None else hooks.orphan(cgroup_id)
    records: list[dict[str, Any]] = []
    if rb is not None and audit_path is not None:
        rb.open(lambda ev: records.append(record_of(ev, run_id)))
        rb.drain()
        rb.flush(lambda ev: records.append(record_of(ev, run_id)))
    written = 0
    if audit_path is not None and (records or close):
        audit = audit_factory(audit_path)
        for rec in records:
            audit.write(rec)
        if close:
            audit.write({"run": run_id, "event": "run_end", "reason": reason,
                         "direct_egress": sum(r["count"] for r in records if r["event"] == "direct_egress"),
                         "lost_events": 0 if rb is None else rb.lost()})
        audit.checkpoint()
        audit.sync()
        written = len(records) + int(close)
    if rb is not None:
        rb.release()
    elif cgroup_id is not None:
        hooks.forget(cgroup_id)
    return written
