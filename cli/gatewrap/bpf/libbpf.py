"""Thin ctypes bindings to the libbpf calls gatewrap makes itself: everything a warm run
needs (pinned objects, attachments, map entries, ring buffers), so that only compiling the
hooks loads bcc. A ring buffer's records are read by ``gatewrap._gate_core.RingReader``
(its memory, mapped: no epoll instance per buffer, which libbpf's ``ring_buffer__new`` makes).

libbpf (``libbpf.so.1``, Debian's ``libbpf1``, a dependency of libbcc) wraps the bpf(2)
syscall; see bpf(2) and the kernel's Documentation/bpf/. Every call raises
:class:`OSError` with the kernel's errno on failure.
"""

from __future__ import annotations

import ctypes as ct
import os

_lib = ct.CDLL("libbpf.so.1", use_errno=True)

_lib.bpf_obj_get.argtypes = [ct.c_char_p]
_lib.bpf_obj_pin.argtypes = [ct.c_int, ct.c_char_p]
_lib.bpf_prog_attach.argtypes = [ct.c_int, ct.c_int, ct.c_int, ct.c_uint]
_lib.bpf_prog_detach2.argtypes = [ct.c_int, ct.c_int, ct.c_int]
_lib.bpf_prog_query.argtypes = [
    ct.c_int, ct.c_int, ct.c_uint, ct.POINTER(ct.c_uint), ct.POINTER(ct.c_uint), ct.POINTER(ct.c_uint),
]
_lib.bpf_prog_get_fd_by_id.argtypes = [ct.c_uint]
_lib.bpf_map_get_fd_by_id.argtypes = [ct.c_uint]
_lib.bpf_obj_get_info_by_fd.argtypes = [ct.c_int, ct.c_void_p, ct.POINTER(ct.c_uint)]
_lib.bpf_map_create.argtypes = [ct.c_int, ct.c_char_p, ct.c_uint, ct.c_uint, ct.c_uint, ct.c_void_p]
_lib.bpf_map_update_elem.argtypes = [ct.c_int, ct.c_void_p, ct.c_void_p, ct.c_ulonglong]
_lib.bpf_map_lookup_elem.argtypes = [ct.c_int, ct.c_void_p, ct.c_void_p]
_lib.bpf_map_delete_elem.argtypes = [ct.c_int, ct.c_void_p]
_lib.bpf_map_get_next_key.argtypes = [ct.c_int, ct.c_void_p, ct.c_void_p]
_lib.bpf_raw_tracepoint_open.argtypes = [ct.c_char_p, ct.c_int]

#: include/uapi/linux/bpf.h
BPF_MAP_TYPE_RINGBUF = 27
BPF_F_ALLOW_MULTI = 2
BPF_ANY = 0


def _check(ret: int, what: str) -> int:
    if ret < 0:
        # libbpf ≥ 1.0 returns -errno and also sets errno.
        err = ct.get_errno() or -ret
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return ret


def obj_get(path: str) -> int:
    """Open a pinned BPF object (program or map) under bpffs; returns a new fd."""
    return _check(_lib.bpf_obj_get(path.encode()), f"bpf_obj_get {path}")


def obj_pin(fd: int, path: str) -> None:
    """Pin the object behind ``fd`` at ``path`` (a bpffs path that must not exist)."""
    _check(_lib.bpf_obj_pin(fd, path.encode()), f"bpf_obj_pin {path}")


def prog_attach(prog_fd: int, cgroup_fd: int, attach_type: int, flags: int) -> None:
    """BPF_PROG_ATTACH a program to a cgroup (``cgroup_fd``: the directory opened O_RDONLY)."""
    _check(_lib.bpf_prog_attach(prog_fd, cgroup_fd, attach_type, flags), "bpf_prog_attach")


def prog_detach(prog_fd: int, cgroup_fd: int, attach_type: int) -> None:
    """BPF_PROG_DETACH one MULTI attachment of ``prog_fd`` from a cgroup."""
    _check(_lib.bpf_prog_detach2(prog_fd, cgroup_fd, attach_type), "bpf_prog_detach")


def prog_query(cgroup_fd: int, attach_type: int) -> list[int]:
    """Ids of the programs attached directly to a cgroup for one attach type."""
    ids = (ct.c_uint * 64)()
    cnt = ct.c_uint(64)
    flags = ct.c_uint(0)
    _check(_lib.bpf_prog_query(cgroup_fd, attach_type, 0, ct.byref(flags), ids, ct.byref(cnt)),
           "bpf_prog_query")
    return list(ids[: cnt.value])


def raw_tracepoint_open(name: str, prog_fd: int) -> int:
    """BPF_RAW_TRACEPOINT_OPEN: attach a raw tracepoint program to tracepoint ``name`` (e.g.
    ``sys_exit``; no tracefs needed); returns the attachment's fd, a BPF link (Linux 5.8+)
    that :func:`obj_pin` can pin, and that stays attached while it is pinned or open."""
    return _check(_lib.bpf_raw_tracepoint_open(name.encode(), prog_fd), f"bpf_raw_tracepoint_open {name}")


def prog_fd_by_id(prog_id: int) -> int:
    """Open a loaded program by its kernel id; returns a new fd."""
    return _check(_lib.bpf_prog_get_fd_by_id(prog_id), f"bpf_prog_get_fd_by_id {prog_id}")


def map_fd_by_id(map_id: int) -> int:
    """Open a map by its kernel id; returns a new fd."""
    return _check(_lib.bpf_map_get_fd_by_id(map_id), f"bpf_map_get_fd_by_id {map_id}")


def _info(fd: int) -> bytes:
    """The first bytes of the kernel's info on a BPF program or map fd (``struct bpf_prog_info``
    / ``struct bpf_map_info``, include/uapi/linux/bpf.h)."""
    buf = (ct.c_ubyte * 256)()
    size = ct.c_uint(256)
    _check(_lib.bpf_obj_get_info_by_fd(fd, buf, ct.byref(size)), "bpf_obj_get_info_by_fd")
    return bytes(buf[: size.value])


def obj_id(fd: int) -> int:
    """Kernel id of a BPF program or map fd (``id`` at offset 4 of either info struct)."""
    return int.from_bytes(_info(fd)[4:8], "little")


def map_max_entries(fd: int) -> int:
    """A map's ``max_entries`` (``struct bpf_map_info``, offset 16): a ring buffer's data size in bytes."""
    return int.from_bytes(_info(fd)[16:20], "little")


def ringbuf_create(name: str, size_bytes: int) -> int:
    """Create a BPF ring buffer map; ``size_bytes`` must be a power of two and a page multiple."""
    return _check(_lib.bpf_map_create(BPF_MAP_TYPE_RINGBUF, name.encode()[:15], 0, 0, size_bytes, None),
                  "bpf_map_create ringbuf")


def map_update(map_fd: int, key: ct._SimpleCData | ct.Structure, value: ct._SimpleCData | ct.Structure) -> None:
    """Insert or replace one element (BPF_ANY)."""
    _check(_lib.bpf_map_update_elem(map_fd, ct.byref(key), ct.byref(value), BPF_ANY), "bpf_map_update_elem")


def map_lookup(map_fd: int, key: ct._SimpleCData | ct.Structure, value: ct._SimpleCData | ct.Structure) -> bool:
    """Read one element into ``value``; False when the key is absent."""
    ret = _lib.bpf_map_lookup_elem(map_fd, ct.byref(key), ct.byref(value))
    if ret < 0 and (ct.get_errno() or -ret) == 2:
        return False
    _check(ret, "bpf_map_lookup_elem")
    return True


def map_delete(map_fd: int, key: ct._SimpleCData | ct.Structure) -> None:
    """Delete one element; absent keys are ignored."""
    ret = _lib.bpf_map_delete_elem(map_fd, ct.byref(key))
    if ret < 0 and (ct.get_errno() or -ret) != 2:
        _check(ret, "bpf_map_delete_elem")


def map_keys(map_fd: int, key_type: type) -> list:
    """Every key of a hash map (``BPF_MAP_GET_NEXT_KEY`` from no key to ENOENT), as
    ``key_type`` instances. Keys inserted or deleted meanwhile may be missed or repeated
    (bpf(2)); callers read maps no program is writing to the keys they want."""
    keys = []
    prev: ct.Structure | None = None
    while True:
        nxt = key_type()
        ret = _lib.bpf_map_get_next_key(map_fd, None if prev is None else ct.byref(prev), ct.byref(nxt))
        if ret < 0 and (ct.get_errno() or -ret) == 2:
            return keys
        _check(ret, "bpf_map_get_next_key")
        keys.append(nxt)
        prev = nxt
