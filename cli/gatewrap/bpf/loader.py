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
   ``gw_events`` hash-of-maps) and its gate address, keyed by the run's cgroup id.
3. :meth:`RunHooks.poll` delivers that run's denial events; :meth:`RunHooks.release`
   removes its entries.

Kernel facts used here are measured in shared/KERNEL-NOTES.md.
"""

from __future__ import annotations

import ctypes as ct
import errno
import fcntl
import hashlib
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

BPFFS = "/sys/fs/bpf"
PIN_ROOT = f"{BPFFS}/gatewrap"
LOCK_PATH = "/run/gatewrap/bpf.lock"
SOURCES = ("gate.h", "sock_addr.bpf.c")
#: Per-run ring buffer size in bytes (power of two, page multiple): ~2900 events.
RINGBUF_BYTES = 256 * 1024
#: Must equal GW_MAX_PORTS in bpf/gate.h; the loader refuses more.
MAX_PORTS = 4

#: (program name in C, bcc BPFAttachType member)
HOOKS = (
    ("gw_connect4", "CGROUP_INET4_CONNECT"),
    ("gw_connect6", "CGROUP_INET6_CONNECT"),
    ("gw_sendmsg4", "CGROUP_UDP4_SENDMSG"),
    ("gw_sendmsg6", "CGROUP_UDP6_SENDMSG"),
)
HOOK_NAMES = {1: "connect4", 2: "connect6", 3: "sendmsg4", 4: "sendmsg6"}
VERDICT_NAMES = {1: "not the gate", 2: "no run configured for this cgroup", 3: "no destination address"}


def sources_dir() -> Path:
    """Directory holding the C sources (shipped in the wheel as ``gatewrap/_bpf``)."""
    here = Path(__file__).resolve().parent.parent / "_bpf"
    return here


def sources_hash() -> str:
    """16 hex digits of SHA-256 over the C sources: names the pin directory."""
    h = hashlib.sha256()
    for name in SOURCES:
        h.update(name.encode() + b"\0" + (sources_dir() / name).read_bytes())
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


class Hooks:
    """The compiled hooks of this gatewrap process, attached to the ``gatewrap/`` parent."""

    def __init__(self, bpf: Any, pin_dir: str, bcc: Any) -> None:
        self._bpf = bpf
        self._bcc = bcc
        self.pin_dir = pin_dir
        self._event_type = bpf["gw_event_layout"].Leaf

    def configure(self, cgroup_id: int, gate_ip4: str, gate_ip6: str, ports: list[int]) -> "RunHooks":
        """Let the run in ``cgroup_id`` reach only ``gate_ip4``/``gate_ip6`` on ``ports``.

        The run's ring buffer is installed before its configuration, so no denial of
        the run is ever without a buffer.

        Raises:
            BpfError: too many ports, or a map update failed.
        """
        if not 1 <= len(ports) <= MAX_PORTS:
            raise BpfError(f"the gate may have 1 to {MAX_PORTS} ports, got {len(ports)}")
        key = ct.c_uint64(cgroup_id)
        try:
            rb_fd = libbpf.ringbuf_create("gw_run_events", RINGBUF_BYTES)
            self._bpf["gw_events"][key] = ct.c_int(rb_fd)
            runs = self._bpf["gw_runs"]
            cfg = runs.Leaf()
            cfg.gate_ip4 = int.from_bytes(socket.inet_pton(socket.AF_INET, gate_ip4), "little")
            v6 = socket.inet_pton(socket.AF_INET6, gate_ip6)
            for i in range(4):
                cfg.gate_ip6[i] = int.from_bytes(v6[4 * i : 4 * i + 4], "little")
            for i, p in enumerate(ports):
                cfg.ports[i] = p
            runs[key] = cfg
        except Exception as e:
            raise BpfError(f"configuring the hooks for cgroup {cgroup_id} failed: {e}") from e
        return RunHooks(self, cgroup_id, rb_fd)

    def decode(self, data: int) -> _Event:
        """Decode one ring-buffer record with the struct bcc parsed from bpf/gate.h."""
        e = ct.cast(data, ct.POINTER(self._event_type)).contents
        if e.family == socket.AF_INET:
            ip = str(ipaddress.IPv4Address(int(e.dst.v4).to_bytes(4, "little")))
        else:
            v6 = ipaddress.IPv6Address(b"".join(int(w).to_bytes(4, "little") for w in e.dst.v6))
            ip = f"::ffff:{v6.ipv4_mapped}" if v6.ipv4_mapped else str(v6)
        return _Event(
            cgroup_id=e.cgroup_id, pid=e.pid, tgid=e.tgid, uid=e.uid, family=e.family,
            dst_ip=ip, dst_port=e.dst_port, sock_type=e.sock_type, protocol=e.protocol,
            hook=HOOK_NAMES.get(e.hook, str(e.hook)),
            verdict=VERDICT_NAMES.get(e.verdict, str(e.verdict)),
            comm=bytes(e.comm).split(b"\0", 1)[0].decode("utf-8", "backslashreplace"),
        )


class RunHooks:
    """One run's view of the hooks: its ring buffer reader and its map entries."""

    def __init__(self, hooks: Hooks, cgroup_id: int, rb_fd: int) -> None:
        self._hooks = hooks
        self.cgroup_id = cgroup_id
        self._rb_fd = rb_fd
        self._mgr: int | None = None
        self._cb: Any = None
        self._lock = threading.Lock()

    def open(self, on_event: Callable[[_Event], None]) -> None:
        """Start delivering this run's denials to ``on_event`` (called from :meth:`poll`)."""
        lib = self._hooks._bcc.libbcc.lib

        def _cb(_ctx: Any, data: Any, _size: int) -> int:
            try:
                on_event(self._hooks.decode(data))
            except Exception as e:  # never let a callback error unwind through C
                import sys
                print(f"gatewrap: failed to record a kernel denial: {e}", file=sys.stderr)
            return 0

        self._cb = self._hooks._bcc.libbcc._RINGBUF_CB_TYPE(_cb)
        mgr = lib.bpf_new_ringbuf(self._rb_fd, self._cb, None)
        if not mgr:
            raise BpfError("could not open the run's ring buffer")
        self._mgr = mgr

    def poll(self, timeout_ms: int) -> None:
        """Wait up to ``timeout_ms`` for events and deliver them."""
        with self._lock:
            if self._mgr:
                self._hooks._bcc.libbcc.lib.bpf_poll_ringbuf(self._mgr, timeout_ms)

    def drain(self) -> None:
        """Deliver every event already in the buffer, without waiting."""
        with self._lock:
            if self._mgr:
                self._hooks._bcc.libbcc.lib.bpf_consume_ringbuf(self._mgr)

    def lost(self) -> int:
        """Events the kernel could not put on this run's buffer (full or missing)."""
        t = self._hooks._bpf["gw_lost"]
        try:
            return int(t[ct.c_uint64(self.cgroup_id)].value)
        except KeyError:
            return 0

    def release(self) -> None:
        """Remove the run's configuration and buffer. Idempotent."""
        key = ct.c_uint64(self.cgroup_id)
        b = self._hooks._bpf
        for name in ("gw_runs", "gw_events", "gw_lost"):
            try:
                del b[name][key]
            except KeyError:
                pass
        with self._lock:
            if self._mgr:
                self._hooks._bcc.libbcc.lib.bpf_free_ringbuf(self._mgr)
                self._mgr = None
            if self._rb_fd >= 0:
                os.close(self._rb_fd)
                self._rb_fd = -1


def _attach_types(bcc: Any) -> list[tuple[str, int]]:
    return [(name, int(getattr(bcc.BPFAttachType, t))) for name, t in HOOKS]


def _remove_stale(parent_fd: int, keep: str | None, bcc: Any) -> None:
    """Detach and unpin hooks left by other versions of the sources (all of them if ``keep`` is None)."""
    if not os.path.isdir(PIN_ROOT):
        return
    for d in os.listdir(PIN_ROOT):
        if d == keep:
            continue
        path = os.path.join(PIN_ROOT, d)
        for name, at in _attach_types(bcc):
            pin = os.path.join(path, f"prog_{name}")
            if not os.path.exists(pin):
                continue
            fd = libbpf.obj_get(pin)
            try:
                libbpf.prog_detach(fd, parent_fd, at)
            except OSError as e:
                if e.errno not in (errno.ENOENT, errno.EINVAL):
                    raise
            finally:
                os.close(fd)
        for f in os.listdir(path):
            os.unlink(os.path.join(path, f))
        os.rmdir(path)


def load_or_reuse(parent_cgroup: str) -> Hooks:
    """Compile the hooks, and attach them to ``parent_cgroup`` unless they already are.

    Args:
        parent_cgroup: the ``gatewrap/`` cgroup v2 directory that holds every run's leaf.

    Raises:
        BpfError: bcc is missing, compilation failed (kernel headers?), or attach failed.
    """
    try:
        bcc = import_bcc()
    except BccMissing as e:
        raise BpfError(str(e)) from e
    ensure_bpffs()
    digest = sources_hash()
    pin_dir = f"{PIN_ROOT}/{digest}"
    os.makedirs(pin_dir, exist_ok=True)
    os.makedirs(os.path.dirname(LOCK_PATH), exist_ok=True)
    with open(LOCK_PATH, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            bpf = bcc.BPF(
                src_file=str(sources_dir() / "sock_addr.bpf.c").encode(),
                cflags=[f"-I{sources_dir()}", f'-DGW_PIN_DIR="{pin_dir}"'],
            )
        except Exception as e:
            raise BpfError(
                f"compiling the BPF hooks failed ({e}); run 'gatewrap doctor' to check kernel headers"
            ) from e
        parent_fd = os.open(parent_cgroup, os.O_RDONLY | os.O_DIRECTORY)
        try:
            _remove_stale(parent_fd, digest, bcc)
            for name, at in _attach_types(bcc):
                _attach_one(bpf, bcc, name, at, pin_dir, parent_fd)
        except OSError as e:
            raise BpfError(f"attaching the hooks to {parent_cgroup} failed: {e}") from e
        finally:
            os.close(parent_fd)
    return Hooks(bpf, pin_dir, bcc)


def _attach_one(bpf: Any, bcc: Any, name: str, at: int, pin_dir: str, parent_fd: int) -> None:
    pin = f"{pin_dir}/prog_{name}"
    if os.path.exists(pin):
        fd = libbpf.obj_get(pin)
    else:
        fn = bpf.load_func(name, bcc.BPFProgType.CGROUP_SOCK_ADDR, attach_type=at)
        fd = os.dup(fn.fd)
        libbpf.obj_pin(fd, pin)
    try:
        if libbpf.obj_id(fd) not in libbpf.prog_query(parent_fd, at):
            # MULTI: a NONE/OVERRIDE attachment could be detached by an unprivileged
            # process holding a read-only fd on the cgroup (KERNEL-NOTES.md).
            libbpf.prog_attach(fd, parent_fd, at, libbpf.BPF_F_ALLOW_MULTI)
    finally:
        os.close(fd)


def verify_attached(parent_cgroup: str, pin_dir: str) -> None:
    """Check that every pinned hook is attached to ``parent_cgroup`` (fail closed before a spawn).

    Raises:
        BpfError: a hook is missing.
    """
    bcc = import_bcc()
    parent_fd = os.open(parent_cgroup, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name, at in _attach_types(bcc):
            fd = libbpf.obj_get(f"{pin_dir}/prog_{name}")
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
        BpfError: a run is active.
    """
    from ..sandbox.cgroup import list_leaves

    if list_leaves(parent_cgroup):
        raise BpfError(f"runs are active under {parent_cgroup}; not unloading the hooks")
    bcc = import_bcc()
    fd = os.open(parent_cgroup, os.O_RDONLY | os.O_DIRECTORY)
    try:
        _remove_stale(fd, None, bcc)
    finally:
        os.close(fd)
