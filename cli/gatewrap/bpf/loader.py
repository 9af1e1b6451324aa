"""Compile, pin, attach and configure gatewrap's cgroup sock_addr hooks.

The life of the hooks, in the order a run uses them (modelled on systemd's
bpf-socket-bind.c):

1. :func:`load_or_reuse` compiles ``bpf/sock_addr.bpf.c`` with bcc. Its maps are pinned
   (``BPF_TABLE_PINNED``) under ``/sys/fs/bpf/gatewrap/<hash of the sources>/``, so every
   gatewrap process shares one configuration map. The programs are attached ONCE to the
   ``gatewrap/`` parent cgroup with ``BPF_F_ALLOW_MULTI`` and pinned; later runs find them
   attached and only verify it (``BPF_PROG_QUERY``). Attachments outlive gatewrap: if it
   dies, its sandboxes keep the hooks and, without configuration, have no egress.
2. :meth:`Hooks.configure` gives one run its own ring buffer (an inner map of the
   ``gw_events`` hash-of-maps), its fold quota and overflow entry (``gw_fold_keys``,
   ``gw_folds``) and its gate address, keyed by the run's cgroup id.
3. :meth:`RunHooks.poll` delivers that run's denial events (identical ones folded, with
   counts); :meth:`RunHooks.flush` delivers the counts still folded once the run's cgroup
   is empty; :meth:`RunHooks.release` removes its entries.

Kernel facts used here are measured in shared/KERNEL-NOTES.md.
"""

from __future__ import annotations

import contextlib
import ctypes as ct
import errno
import fcntl
import hashlib
import json
import ipaddress
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BpfError
from . import libbpf
from .bccimport import BccMissing, import_bcc
from .layout import ctype_of

BPFFS = "/sys/fs/bpf"
PIN_ROOT = f"{BPFFS}/gatewrap"
LOCK_PATH = "/run/gatewrap/bpf.lock"
#: The programs, grouped by hook family; bcc sees BPF programs only in the main text,
#: so they are compiled as one text, in this order.
PROGRAMS = ("common.bpf.c", "sock_addr.bpf.c", "sock_create.bpf.c", "skb_egress.bpf.c", "sockopt.bpf.c",
            "unix.bpf.c", "attempts.bpf.c")
SOURCES = ("gate.h", *PROGRAMS)
#: Per-run ring buffer size in bytes (power of two, page multiple): ~2900 events.
RINGBUF_BYTES = 256 * 1024
#: Maps pinned by the C source (BPF_TABLE_PINNED) in the pin directory.
PINNED_MAPS = ("gw_runs", "gw_events", "gw_lost", "gw_fold_keys", "gw_refused_keys", "gw_folds")
#: The pinned maps keyed by a run's cgroup id (u64); gw_folds is keyed by struct gw_fold_key.
PER_RUN_MAPS = ("gw_runs", "gw_events", "gw_lost", "gw_fold_keys", "gw_refused_keys")
#: Maps whose leaf struct Python needs: gw_runs (struct gw_run_config), gw_event_layout (struct
#: gw_event), gw_folds (struct gw_fold; its key struct gw_fold_key too).
LAYOUT_MAPS = ("gw_runs", "gw_event_layout", "gw_folds")
#: Repeats of one denial within this interval of its last event are folded into the next
#: event (GW_FOLD_INTERVAL_NS in bpf/gate.h; part of the pin directory's hash).
FOLD_INTERVAL_NS = 1_000_000_000
#: bcc's struct descriptions, cached per source hash (tmpfs: gone at reboot, like bpffs).
LAYOUT_DIR = "/run/gatewrap/bpf"
#: Attach types probed when cleaning the parent (enum bpf_attach_type has fewer).
MAX_ATTACH_TYPE = 64
#: Must equal GW_MAX_PORTS in bpf/gate.h; the loader refuses more.
MAX_PORTS = 4
#: GW_MAX_FOLDS_PER_RUN of bpf/gate.h: distinct denials a run folds one by one.
MAX_FOLDS_PER_RUN = 4096

#: (program name in C, bcc BPFProgType member, attach type: include/uapi/linux/bpf.h, enum
#: bpf_attach_type, by number so that a warm run needs no bcc; tests/kernel/test_bpf_layout.py
#: checks them against bcc's BPFAttachType names where bcc 0.26 has them)
HOOKS = (
    ("gw_connect4", "CGROUP_SOCK_ADDR", 10),  # BPF_CGROUP_INET4_CONNECT
    ("gw_connect6", "CGROUP_SOCK_ADDR", 11),  # BPF_CGROUP_INET6_CONNECT
    ("gw_sendmsg4", "CGROUP_SOCK_ADDR", 14),  # BPF_CGROUP_UDP4_SENDMSG
    ("gw_sendmsg6", "CGROUP_SOCK_ADDR", 15),  # BPF_CGROUP_UDP6_SENDMSG
    ("gw_sock_create", "CGROUP_SOCK", 2),  # BPF_CGROUP_INET_SOCK_CREATE
    ("gw_skb_egress", "CGROUP_SKB", 1),  # BPF_CGROUP_INET_EGRESS
    ("gw_setsockopt", "CGROUP_SOCKOPT", 22),  # BPF_CGROUP_SETSOCKOPT
    ("gw_connect_unix", "CGROUP_SOCK_ADDR", 49),  # BPF_CGROUP_UNIX_CONNECT
    ("gw_sendmsg_unix", "CGROUP_SOCK_ADDR", 50),  # BPF_CGROUP_UNIX_SENDMSG
)
#: Hooks a kernel may lack (unix socket hooks: Linux 6.7+). They only record (they allow
#: every address), so without them runs go on, unaudited for unix sockets.
OPTIONAL_HOOKS = ("gw_connect_unix", "gw_sendmsg_unix")
#: enum gw_hook and enum gw_verdict of bpf/gate.h, as the audit log names them.
HOOK_NAMES = {1: "connect4", 2: "connect6", 3: "sendmsg4", 4: "sendmsg6", 5: "sock_create", 6: "skb_egress",
              7: "setsockopt", 8: "connect_unix", 9: "sendmsg_unix", 10: "sys_exit"}
#: The hooks of enum gw_hook that see an IPv4 sockaddr (connect4, sendmsg4): one of family
#: AF_UNSPEC there is a destination too (udp_sendmsg takes it as AF_INET).
V4_ADDR_HOOKS = (1, 3)
#: GW_ALLOW_UNIX of enum gw_verdict: the unix socket hooks' (which allow).
VERDICT_ALLOW_UNIX = 7
#: GW_REFUSED_WRITE of enum gw_verdict: a write-class syscall on a path refused with EROFS or
#: EBUSY (attempts.bpf.c; only reported).
VERDICT_REFUSED_WRITE = 8
#: The verdicts of a run's overflow entries in gw_folds (gate.h: denials, unix sockets, refused writes).
OVERFLOW_VERDICTS = (0, VERDICT_ALLOW_UNIX, VERDICT_REFUSED_WRITE)
#: GW_MAX_REFUSED_WRITE_FOLDS of bpf/gate.h.
MAX_REFUSED_WRITE_FOLDS = 1024
#: The raw tracepoint program that reports refused writes, and its pinned link (attempts.bpf.c).
ATTEMPTS_PROG = "gw_sys_exit"
ATTEMPTS_LINK = "link_gw_sys_exit"
#: x86-64 syscall numbers attempts.bpf.c reports (arch/x86/entry/syscalls/syscall_64.tbl).
SYSCALL_NAMES = {2: "open", 76: "truncate", 82: "rename", 83: "mkdir", 84: "rmdir", 85: "creat", 86: "link",
                 87: "unlink", 88: "symlink", 90: "chmod", 92: "chown", 94: "lchown", 132: "utime", 133: "mknod",
                 188: "setxattr", 189: "lsetxattr", 197: "removexattr", 198: "lremovexattr", 235: "utimes",
                 257: "openat", 258: "mkdirat", 259: "mknodat", 260: "fchownat", 261: "futimesat", 263: "unlinkat",
                 264: "renameat", 265: "linkat", 266: "symlinkat", 268: "fchmodat", 280: "utimensat",
                 316: "renameat2", 437: "openat2", 452: "fchmodat2", 463: "setxattrat", 466: "removexattrat"}
#: AT_FDCWD (include/uapi/linux/fcntl.h).
AT_FDCWD = -100
VERDICT_NAMES = {
    1: "not the gate", 2: "no run configured for this cgroup", 3: "no destination address",
    4: "socket kind not allowed (only TCP and UDP)", 5: "IP options or IPv6 extension headers",
    6: "unexpected address family", 7: "unix socket (allowed: the jail's view decides which exist)",
    8: "a write refused by the kernel (read-only mount)",
}


def sources_dir() -> Path:
    """Directory holding the C sources (shipped in the wheel as ``gatewrap/_bpf``)."""
    here = Path(__file__).resolve().parent.parent / "_bpf"
    return here


def sources_hash() -> str:
    """16 hex digits of SHA-256 over the C sources: names the pin directory."""
    h = hashlib.sha256()
    for name in SOURCES:
        h.update(name.encode() + b"\0" + (sources_dir() / name).read_bytes())
    h.update(f"GW_FOLD_INTERVAL_NS={FOLD_INTERVAL_NS}".encode())
    return h.hexdigest()[:16]


def ensure_bpffs() -> None:
    """Mount bpffs at /sys/fs/bpf if nothing is mounted there (needs root).

    Raises:
        BpfError: the mount failed.
    """
    if os.path.ismount(BPFFS):
        return
    rc = os.system(f"mount -t bpf bpf {BPFFS}")
    if rc != 0:
        raise BpfError(f"bpffs is not mounted at {BPFFS} and mounting it failed; run: mount -t bpf bpf {BPFFS}")


@dataclass
class _Event:
    """A decoded denial from the ring buffer (fields of ``struct gw_event``)."""

    cgroup_id: int
    pid: int
    tgid: int
    uid: int
    family: int
    dst_ip: str
    dst_port: int
    sock_type: int
    protocol: int
    hook: str
    verdict: str
    comm: str
    #: Attempts this event stands for (identical denials folded into it), >= 1.
    count: int = 1
    #: CLOCK_MONOTONIC ns (bpf_ktime_get_ns) of the denial's first and latest attempt.
    first_ns: int = 0
    last_ns: int = 0
    #: The count covers any denials of the run beyond the distinct ones it may fold.
    overflow: bool = False
    #: A unix socket hook's event: allowed, recorded (not a denial).
    allowed: bool = False
    #: The unix socket address (``@name`` for an abstract one); None if it had none. A refused
    #: write's: the path as the syscall got it (relative to ``dirfd``), cut at 107 bytes.
    path: str | None = None
    #: A refused write (hook ``sys_exit``): a syscall that changes a path got EROFS or EBUSY.
    refused_write: bool = False
    #: A refused write's syscall name (``openat``, ``renameat2``, ...), errno name (``EROFS``,
    #: ``EBUSY``), the directory fd its path is relative to (:data:`AT_FDCWD`: the cwd), and
    #: whether the path is a rename's or link's destination.
    syscall: str = ""
    errno: str = ""
    dirfd: int = AT_FDCWD
    destination: bool = False


class Hooks:
    """The hooks attached to the ``gatewrap/`` parent, as one gatewrap process uses them.

    Holds fds of the pinned maps and the C struct layouts (``struct gw_run_config``,
    ``struct gw_event``) as ctypes types decoded from bcc's cached description of them
    (:func:`.layout.ctype_of`; no bcc needed).
    """

    def __init__(self, pin_dir: str, layouts: dict[str, Any], attempts_unrecorded: str | None = None) -> None:
        self.pin_dir = pin_dir
        #: Why refused writes are not reported (the raw tracepoint could not be loaded or
        #: attached), or None when they are.
        self.attempts_unrecorded = attempts_unrecorded
        self._config_type = ctype_of(layouts["gw_runs"])
        self._event_type = ctype_of(layouts["gw_event_layout"])
        self._fold_type = ctype_of(layouts["gw_folds"])
        self._fold_key_type = ctype_of(layouts["gw_folds.key"])
        self._fds = {name: libbpf.obj_get(f"{pin_dir}/{name}") for name in PINNED_MAPS}

    def is_current(self) -> bool:
        """True while the maps this process holds are the ones pinned now: hooks loaded again
        (an unload, another gatewrap version, a chroot's gatewrap on the same kernel) pin new
        maps at the same paths, and the programs attached then read only those, so a run
        configured in the old ones would have no egress and none of its denials recorded.
        A missing pin reads as not current."""
        try:
            for name, fd in self._fds.items():
                pinned = libbpf.obj_get(f"{self.pin_dir}/{name}")
                try:
                    if libbpf.obj_id(pinned) != libbpf.obj_id(fd):
                        return False
                finally:
                    os.close(pinned)
        except OSError:
            return False
        return True

    def close(self) -> None:
        """Close the map fds (the pins and attachments stay)."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}

    def configure(self, cgroup_id: int, gate_ip4: str, gate_ip6: str, tcp_ports: list[int],
                  udp_ports: list[int] = ()) -> "RunHooks":
        """Let the run in ``cgroup_id`` reach only ``gate_ip4``/``gate_ip6`` on ``tcp_ports``
        (TCP) and ``udp_ports`` (UDP).

        The run's ring buffer is installed before its configuration, so no denial of
        the run is ever without a buffer.

        Raises:
            BpfError: too many ports, or a map update failed (``gw_folds`` full: too many
                runs at once, or a run folding more distinct denials than it may).
        """
        if not 1 <= len(tcp_ports) <= MAX_PORTS or len(udp_ports) > MAX_PORTS:
            raise BpfError(f"the gate may have 1 to {MAX_PORTS} TCP and 0 to {MAX_PORTS} UDP ports")
        key = ct.c_uint64(cgroup_id)
        try:
            rb_fd = libbpf.ringbuf_create("gw_run_events", RINGBUF_BYTES)
            libbpf.map_update(self._fds["gw_events"], key, ct.c_int(rb_fd))
            libbpf.map_update(self._fds["gw_fold_keys"], key, ct.c_uint64(0))
            libbpf.map_update(self._fds["gw_refused_keys"], key, ct.c_uint64(0))
            for verdict in OVERFLOW_VERDICTS:  # denials, unix sockets (allowed), refused writes
                overflow = self._fold_key_type()
                overflow.cgroup_id, overflow.overflow, overflow.verdict = cgroup_id, 1, verdict
                libbpf.map_update(self._fds["gw_folds"], overflow, self._fold_type())
            cfg = self._config_type()
            cfg.gate_ip4 = int.from_bytes(socket.inet_pton(socket.AF_INET, gate_ip4), "little")
            v6 = socket.inet_pton(socket.AF_INET6, gate_ip6)
            for i in range(4):
                cfg.gate_ip6[i] = int.from_bytes(v6[4 * i : 4 * i + 4], "little")
            for i, p in enumerate(tcp_ports):
                cfg.tcp_ports[i] = p
            for i, p in enumerate(udp_ports):
                cfg.udp_ports[i] = p
            libbpf.map_update(self._fds["gw_runs"], key, cfg)
        except OSError as e:
            # Nothing of a half-made configuration stays in the maps (it would count against
            # GW_MAX_RUNS for good).
            self.forget(cgroup_id)
            if "rb_fd" in locals():
                os.close(rb_fd)
            full = " (the maps hold GW_MAX_RUNS = 4096 runs; sudo gatewrap gc drops what dead runs left)" \
                if e.errno == 7 else ""
            raise BpfError(f"configuring the hooks for cgroup {cgroup_id} failed: {e}{full}") from e
        return RunHooks(self, cgroup_id, rb_fd)

    def orphan(self, cgroup_id: int) -> "RunHooks | None":
        """The ring buffer of a run whose gatewrap died, reopened from the ``gw_events`` map
        (from userspace a hash-of-maps lookup gives the inner map's id); None if it has none."""
        inner_id = ct.c_uint32(0)
        if not libbpf.map_lookup(self._fds["gw_events"], ct.c_uint64(cgroup_id), inner_id):
            return None
        return RunHooks(self, cgroup_id, libbpf.map_fd_by_id(inner_id.value))

    def folds(self, cgroup_id: int) -> list[tuple[Any, Any]]:
        """The ``gw_folds`` entries of ``cgroup_id``: (struct gw_fold_key, struct gw_fold) pairs.

        A run whose ``gw_fold_keys`` and ``gw_refused_keys`` counters are 0 never had a key of
        its own inserted (the programs count each insert; nothing else inserts but
        :meth:`configure`): its entries
        are at most its three overflow entries, looked up by key. Otherwise (or without a
        counter) every key of the map, all runs' (up to GW_MAX_FOLDS), is read."""
        keys, refused = ct.c_uint64(0), ct.c_uint64(0)
        if libbpf.map_lookup(self._fds["gw_fold_keys"], ct.c_uint64(cgroup_id), keys) and keys.value == 0 and \
                libbpf.map_lookup(self._fds["gw_refused_keys"], ct.c_uint64(cgroup_id), refused) and refused.value == 0:
            out = []
            for verdict in OVERFLOW_VERDICTS:
                k, v = self._fold_key_type(), self._fold_type()
                k.cgroup_id, k.overflow, k.verdict = cgroup_id, 1, verdict
                if libbpf.map_lookup(self._fds["gw_folds"], k, v):
                    out.append((k, v))
            return out
        out = []
        for k in libbpf.map_keys(self._fds["gw_folds"], self._fold_key_type):
            if k.cgroup_id != cgroup_id:
                continue
            v = self._fold_type()
            if libbpf.map_lookup(self._fds["gw_folds"], k, v):
                out.append((k, v))
        return out

    def sweep(self, parent: str) -> int:
        """Drop the map entries of every cgroup id that is no run leaf under ``parent`` any
        more (a teardown cut short: its cgroup removed, its entries left), so that they
        cannot fill the maps (GW_MAX_RUNS). Returns how many ids were dropped.

        The keys are read before the leaves are listed: a run configures its entries only
        after its leaf exists, so a run starting meanwhile is either not among the keys or
        among the leaves, never dropped.
        """
        ids: set[int] = set()
        for name in PER_RUN_MAPS:
            ids |= {k.value for k in libbpf.map_keys(self._fds[name], ct.c_uint64)}
        live = set()
        for leaf in os.listdir(parent) if os.path.isdir(parent) else []:
            with contextlib.suppress(OSError):
                live.add(os.stat(os.path.join(parent, leaf)).st_ino)
        gone = ids - live
        for cgroup_id in gone:
            self.forget(cgroup_id)
        return len(gone)

    def forget(self, cgroup_id: int) -> None:
        """Drop every map entry of ``cgroup_id`` (config, ring buffer, lost counter, folds).
        Its cgroup is empty or gone: no program adds a fold of it meanwhile."""
        folds = self.folds(cgroup_id)  # while its gw_fold_keys counter still says how to find them
        key = ct.c_uint64(cgroup_id)
        for name in PER_RUN_MAPS:
            libbpf.map_delete(self._fds[name], key)
        for k, _ in folds:
            libbpf.map_delete(self._fds["gw_folds"], k)

    def decode(self, data: int) -> _Event:
        """Decode one ring-buffer record (the address of a ``struct gw_event``) with the
        struct bcc parsed from bpf/gate.h."""
        e = ct.cast(data, ct.POINTER(self._event_type)).contents
        if e.verdict == VERDICT_REFUSED_WRITE:
            return self._decode_refused_write(e)
        path = None
        if e.family == socket.AF_UNIX:
            ip = ""
            raw = ct.string_at(ct.addressof(e.dst), min(e.path_len, 108))
            if raw:
                # An abstract name starts with a NUL: written @name, as ss(8) does.
                text = "@" + raw[1:].decode("utf-8", "backslashreplace") if raw[0] == 0 else \
                    raw.split(b"\0", 1)[0].decode("utf-8", "backslashreplace")
                path = text
        elif e.family == socket.AF_INET or (e.family == socket.AF_UNSPEC and e.hook in V4_ADDR_HOOKS):
            # udp_sendmsg sends to an AF_UNSPEC address as to an AF_INET one: an IPv4 destination.
            ip = str(ipaddress.IPv4Address(int(e.dst.v4).to_bytes(4, "little")))
        else:
            v6 = ipaddress.IPv6Address(b"".join(int(w).to_bytes(4, "little") for w in e.dst.v6))
            ip = f"::ffff:{v6.ipv4_mapped}" if v6.ipv4_mapped else str(v6)
        family = socket.AF_INET if e.family == socket.AF_UNSPEC and e.hook in V4_ADDR_HOOKS else e.family
        return _Event(
            cgroup_id=e.cgroup_id, pid=e.pid, tgid=e.tgid, uid=e.uid, family=family,
            dst_ip=ip, dst_port=e.dst_port, sock_type=e.sock_type, protocol=e.protocol,
            hook=HOOK_NAMES.get(e.hook, str(e.hook)),
            verdict=VERDICT_NAMES.get(e.verdict, str(e.verdict)),
            comm=bytes(e.comm).split(b"\0", 1)[0].decode("utf-8", "backslashreplace"),
            count=e.count, first_ns=e.first_ns, last_ns=e.last_ns, overflow=bool(e.overflow),
            allowed=e.verdict == VERDICT_ALLOW_UNIX, path=path,
        )


    def _decode_refused_write(self, e: Any) -> _Event:
        """A refused write's event (the socket fields hold its own: bpf/gate.h, struct gw_event)."""
        raw = ct.string_at(ct.addressof(e.dst), min(e.path_len, 107))
        return _Event(
            cgroup_id=e.cgroup_id, pid=e.pid, tgid=e.tgid, uid=e.uid, family=0, dst_ip="", dst_port=0,
            sock_type=0, protocol=0, hook=HOOK_NAMES[10], verdict=VERDICT_NAMES[VERDICT_REFUSED_WRITE],
            comm=bytes(e.comm).split(b"\0", 1)[0].decode("utf-8", "backslashreplace"),
            count=e.count, first_ns=e.first_ns, last_ns=e.last_ns, overflow=bool(e.overflow),
            path=os.fsdecode(raw) if raw else None, refused_write=True,
            syscall=SYSCALL_NAMES.get(e.protocol, str(e.protocol)),
            errno=errno.errorcode.get(e.family, str(e.family)) if e.family else "",
            dirfd=ct.c_int32(e.sock_type).value, destination=e.dst_port == 1,
        )


class RunHooks:
    """One run's view of the hooks: its ring buffer reader and its map entries."""

    def __init__(self, hooks: Hooks, cgroup_id: int, rb_fd: int) -> None:
        self._hooks = hooks
        self.cgroup_id = cgroup_id
        self._rb_fd = rb_fd
        self._reader: Any = None
        self._on_record: Callable[[bytes], None] | None = None
        self._lock = threading.Lock()

    def open(self, on_event: Callable[[_Event], None]) -> None:
        """Start delivering this run's denials to ``on_event`` (called from :meth:`drain`).

        Raises:
            BpfError: the ring buffer could not be mapped.
        """
        from .._gate_core import RingReader

        size = ct.sizeof(self._hooks._event_type)

        def _on_record(data: bytes) -> None:
            try:
                record = ct.create_string_buffer(data, max(len(data), size))
                on_event(self._hooks.decode(ct.addressof(record)))
            except Exception as e:  # one record's failure must not stop the others' delivery
                import sys
                print(f"gatewrap: failed to record a kernel denial: {e}", file=sys.stderr)

        try:
            self._reader = RingReader(self._rb_fd, libbpf.map_max_entries(self._rb_fd))
        except (OSError, ValueError) as e:
            raise BpfError(f"could not open the run's ring buffer: {e}") from e
        self._on_record = _on_record

    def fileno(self) -> int:
        """An fd that polls readable (poll(2)) while events wait in the buffer: the ring
        buffer map's own (kernel/bpf/ringbuf.c, ringbuf_map_poll_kern); call :meth:`drain`
        then. Only after :meth:`open`."""
        assert self._reader is not None, "open() first"
        return self._rb_fd

    def drain(self) -> None:
        """Deliver every event already in the buffer, without waiting."""
        with self._lock:
            if self._reader is not None:
                self._reader.consume(self._on_record)

    def flush(self, on_event: Callable[[_Event], None]) -> int:
        """Deliver the attempts still folded in the kernel as events (one per denial with a
        pending count: its first attempt's task, ``count`` = the pending attempts; the
        overflow entry's has no task nor destination) and drop the run's ``gw_folds``
        entries; returns the attempts delivered.

        Call it once the run's cgroup is empty (after :meth:`drain`): a program still
        running for the run could add to an entry being deleted, and that count would be lost.
        """
        total = 0
        for k, v in self._hooks.folds(self.cgroup_id):
            if v.pending:
                v.first.count, v.first.first_ns, v.first.last_ns = v.pending, v.first_ns, v.last_ns
                v.first.cgroup_id, v.first.overflow = self.cgroup_id, k.overflow
                if k.overflow:
                    v.first.verdict = k.verdict
                on_event(self._hooks.decode(ct.addressof(v.first)))
                total += v.pending
            libbpf.map_delete(self._hooks._fds["gw_folds"], k)
        return total

    def lost(self) -> int:
        """Events the kernel could not put on this run's buffer (full or missing)."""
        n = ct.c_uint64(0)
        found = libbpf.map_lookup(self._hooks._fds["gw_lost"], ct.c_uint64(self.cgroup_id), n)
        return n.value if found else 0

    def release(self) -> None:
        """Remove the run's configuration and buffer. Idempotent."""
        self._hooks.forget(self.cgroup_id)
        with self._lock:
            if self._reader is not None:
                self._reader.close()
                self._reader = None
            # It holds the run's recorder (and so its audit log) in a cycle through this object.
            self._on_record = None
            if self._rb_fd >= 0:
                os.close(self._rb_fd)
                self._rb_fd = -1


def _remove_stale(keep: str | None) -> None:
    """Unpin hooks of other versions of the sources (all of them if ``keep`` is None).

    Their attachments are removed by :func:`_detach_foreign`, which does not need to
    know which hooks an older or newer gatewrap had.
    """
    if not os.path.isdir(PIN_ROOT):
        return
    for d in os.listdir(PIN_ROOT):
        if d == keep:
            continue
        path = os.path.join(PIN_ROOT, d)
        for f in os.listdir(path):
            os.unlink(os.path.join(path, f))
        os.rmdir(path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{LAYOUT_DIR}/{d}.json")


def _detach_foreign(parent_fd: int, keep_ids: set[int]) -> None:
    """Detach from the ``gatewrap/`` parent every program that is not one of ``keep_ids``.

    The parent is gatewrap's own: anything else attached there is a leftover of another
    version (which would deny every run, since it reads maps no run configures).
    Attach types are probed by number, so types this version has no hook for are seen too.
    """
    for at in range(MAX_ATTACH_TYPE):
        try:
            ids = libbpf.prog_query(parent_fd, at)
        except OSError:
            continue  # not a cgroup attach type
        for prog_id in ids:
            if prog_id in keep_ids:
                continue
            fd = libbpf.prog_fd_by_id(prog_id)
            try:
                libbpf.prog_detach(fd, parent_fd, at)
            finally:
                os.close(fd)


def _layout_descs(bpf: Any, bcc: Any) -> dict[str, Any]:
    """bcc's JSON description of the structs Python needs (map leaf types)."""
    lib = bcc.libbcc.lib
    descs = {name: json.loads(lib.bpf_table_leaf_desc(bpf.module, name.encode()).decode())
             for name in LAYOUT_MAPS}
    descs["gw_folds.key"] = json.loads(lib.bpf_table_key_desc(bpf.module, b"gw_folds").decode())
    return descs


def _pinned(pin_dir: str) -> bool:
    """Whether every map and (non-optional) program of the hooks is pinned in ``pin_dir``."""
    names = [*PINNED_MAPS, *(f"prog_{name}" for name, _, _ in HOOKS if name not in OPTIONAL_HOOKS)]
    return all(os.path.exists(f"{pin_dir}/{n}") for n in names)


def _complete(pin_dir: str, layout_path: str) -> bool:
    return os.path.exists(layout_path) and _pinned(pin_dir)


def load_or_reuse(parent_cgroup: str) -> Hooks:
    """Make sure the hooks are loaded, pinned and attached to ``parent_cgroup``; return them.

    The first run after boot (or after the sources change) compiles ``sock_addr.bpf.c``
    with bcc (~0.7 s on a 2-core host), pins its maps and programs, attaches the programs with
    ``BPF_F_ALLOW_MULTI`` and caches bcc's description of the structs in
    ``/run/gatewrap/bpf/<hash>.json``; later runs reuse all of it without compiling, and
    without loading bcc at all, and only check, with ``BPF_PROG_QUERY``, that every program
    is still attached.

    Args:
        parent_cgroup: the ``gatewrap/`` cgroup v2 directory that holds every run's leaf.

    Raises:
        BpfError: bcc is missing, compilation failed (kernel headers?), or attach failed.
    """
    ensure_bpffs()
    digest = sources_hash()
    pin_dir = f"{PIN_ROOT}/{digest}"
    layout_path = f"{LAYOUT_DIR}/{digest}.json"
    os.makedirs(LAYOUT_DIR, exist_ok=True)
    with open(LOCK_PATH, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        parent_fd = os.open(parent_cgroup, os.O_RDONLY | os.O_DIRECTORY)
        try:
            _remove_stale(digest)
            bpf = None
            if not _complete(pin_dir, layout_path):
                pinned = _pinned(pin_dir)
                if not pinned:
                    # Partial state (a pin removed by hand, a crash mid-load): start clean, so
                    # no attached program keeps a map that later runs no longer configure.
                    _remove_stale(None)
                    os.makedirs(pin_dir, exist_ok=True)
                bcc = _bcc()
                bpf = _compile(bcc, pin_dir)
                with open(layout_path + ".tmp", "w") as f:
                    json.dump(_layout_descs(bpf, bcc), f)
                os.replace(layout_path + ".tmp", layout_path)
                if pinned:
                    # Every pin there but no layout here: pinned by a gatewrap whose /run is
                    # not this one's (another install on this kernel: a chroot, a container),
                    # whose runs are configured in those maps. Only the layouts are made here
                    # (bcc opened the pinned maps, BPF_TABLE_PINNED); the pinned programs stay
                    # attached: loading them again would leave its runs without egress.
                    bpf = None
            keep = {_attach_one(bpf, name, at, pin_dir, parent_fd) for name, _, at in HOOKS}
            _detach_foreign(parent_fd, keep - {None})
            attempts = _attach_attempts(bpf, pin_dir)
        except OSError as e:
            raise BpfError(f"attaching the hooks to {parent_cgroup} failed: {e}") from e
        finally:
            os.close(parent_fd)
        with open(layout_path) as f:
            layouts = json.load(f)
    return Hooks(pin_dir, layouts, attempts)


def _bcc() -> Any:
    """bcc's module, for compiling (only the cold path needs it).

    Raises:
        BpfError: bcc is missing.
    """
    try:
        return import_bcc()
    except BccMissing as e:
        raise BpfError(str(e)) from e


def _compile(bcc: Any, pin_dir: str) -> Any:
    try:
        text = "".join((sources_dir() / name).read_text() for name in PROGRAMS)
        return bcc.BPF(text=text, cflags=[f"-I{sources_dir()}", f'-DGW_PIN_DIR="{pin_dir}"',
                                          f"-DGW_FOLD_INTERVAL_NS={FOLD_INTERVAL_NS}ULL"])
    except Exception as e:
        raise BpfError(
            f"compiling the BPF hooks failed ({e}; the compiler's or verifier's output is above); "
            "'gatewrap doctor' checks the kernel headers bcc needs"
        ) from e


def _attach_one(bpf: Any, name: str, at: int, pin_dir: str, parent_fd: int) -> int | None:
    """Attach one hook (from its pin, or freshly loaded and pinned) unless it is; returns its
    id, or None for an optional hook this kernel does not have (never loaded, so no pin)."""
    pin = f"{pin_dir}/prog_{name}"
    optional = name in OPTIONAL_HOOKS
    if bpf is None:
        if optional and not os.path.exists(pin):
            return None
        fd = libbpf.obj_get(pin)
    else:
        prog_type = next(getattr(import_bcc().BPFProgType, t) for n, t, _ in HOOKS if n == name)
        try:
            fn = bpf.load_func(name, prog_type, attach_type=at)
        except Exception as e:  # bcc raises a bare Exception; the verifier log went to stderr
            if optional:  # e.g. unix socket hooks before Linux 6.7: EINVAL
                return None
            raise BpfError(f"the kernel refused BPF program {name}: {e}") from e
        fd = os.dup(fn.fd)
        libbpf.obj_pin(fd, pin)
    try:
        prog_id = libbpf.obj_id(fd)
        if prog_id not in libbpf.prog_query(parent_fd, at):
            # MULTI: a NONE/OVERRIDE attachment could be detached by an unprivileged
            # process holding a read-only fd on the cgroup (KERNEL-NOTES.md).
            libbpf.prog_attach(fd, parent_fd, at, libbpf.BPF_F_ALLOW_MULTI)
        return prog_id
    finally:
        os.close(fd)


def _attach_attempts(bpf: Any, pin_dir: str) -> str | None:
    """Attach the refused-write report (attempts.bpf.c) to raw tracepoint ``sys_exit`` once,
    its link pinned in ``pin_dir`` (``link_gw_sys_exit``), so every gatewrap process and the
    daemon share one attachment, detached with the pins (:func:`unload`, a new digest).
    Returns None when it is attached, else why not: it only reports (the read-only mounts
    enforce), so a run goes on without it.

    ``bpf``: bcc's object just compiled (the program is loaded and pinned from it), or None
    (reuse the pins; a program the kernel refused at the compile has none).
    """
    if os.uname().machine != "x86_64":
        return f"the report is written for x86-64 syscalls, not {os.uname().machine}"
    link = f"{pin_dir}/{ATTEMPTS_LINK}"
    prog = f"{pin_dir}/prog_{ATTEMPTS_PROG}"
    if os.path.exists(link):
        return None
    try:
        if bpf is not None:
            try:
                fn = bpf.load_func(ATTEMPTS_PROG, import_bcc().BPFProgType.RAW_TRACEPOINT)
            except Exception as e:  # bcc raises a bare Exception; the verifier log went to stderr
                return f"the kernel refused the raw tracepoint program: {e}"
            fd = os.dup(fn.fd)
            with contextlib.suppress(FileExistsError):
                libbpf.obj_pin(fd, prog)
        elif os.path.exists(prog):
            fd = libbpf.obj_get(prog)
        else:
            return "the kernel refused the raw tracepoint program when the hooks were loaded"
        try:
            link_fd = libbpf.raw_tracepoint_open("sys_exit", fd)
        finally:
            os.close(fd)
        try:
            libbpf.obj_pin(link_fd, link)
        finally:
            os.close(link_fd)
    except OSError as e:
        return f"raw tracepoint sys_exit could not be attached: {e}"
    return None


def verify_attached(parent_cgroup: str, hooks: Hooks) -> None:
    """Check that every pinned hook is attached to ``parent_cgroup`` and that ``hooks`` holds
    the maps pinned now (:meth:`Hooks.is_current`): fail closed before a spawn.

    Raises:
        BpfError: a hook is missing, or the hooks were loaded again since ``hooks`` was opened.
    """
    pin_dir = hooks.pin_dir
    if not hooks.is_current():
        raise BpfError("the hooks were loaded again since this gatewrap opened them (an unload, or another "
                       "gatewrap version); refusing to start the agent, run again")
    parent_fd = os.open(parent_cgroup, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name, _, at in HOOKS:
            if name in OPTIONAL_HOOKS and not os.path.exists(f"{pin_dir}/prog_{name}"):
                continue  # this kernel has no such hook (see _attach_one)
            try:
                fd = libbpf.obj_get(f"{pin_dir}/prog_{name}")
            except OSError as e:
                raise BpfError(f"hook {name} is no longer pinned ({e}): another gatewrap version "
                               "replaced the hooks; refusing to start the agent, run again") from e
            try:
                if libbpf.obj_id(fd) not in libbpf.prog_query(parent_fd, at):
                    raise BpfError(f"hook {name} is not attached to {parent_cgroup}; refusing to start the agent")
            finally:
                os.close(fd)
    finally:
        os.close(parent_fd)


def unload(parent_cgroup: str) -> None:
    """Detach every gatewrap hook from ``parent_cgroup`` and remove all pins.

    Only when no run is active: a running sandbox would lose its hooks (its netns has
    only ``lo``, so it still reaches nothing, but nothing is audited).

    Raises:
        BpfError: a run is active (its leaf ``gw-*`` is under ``parent_cgroup``).
    """
    from ..sandbox.cgroup import list_leaves

    leaves = list_leaves(parent_cgroup)
    if leaves:
        raise BpfError(f"runs are active under {parent_cgroup} ({', '.join(leaves)}); not unloading the hooks "
                       "(gatewrap ps lists them; gatewrap gc removes what dead runs left)")
    fd = os.open(parent_cgroup, os.O_RDONLY | os.O_DIRECTORY)
    try:
        _remove_stale(None)
        _detach_foreign(fd, set())
    finally:
        os.close(fd)
