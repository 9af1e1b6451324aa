"""Escape suite, tampering: the agent cannot leave its cgroup, enter the host's netns,
detach or replace the hooks, load BPF, ptrace the gate, or use a socket from outside.

Each vector runs as the invoking user in the jail (the default) and, where the layer
under the jail matters, as a root agent with ``--jail none`` (no capabilities; the
mount and cgroup namespaces of the launcher and its baseline seccomp filter still apply)."""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass

import pytest

from conftest import Run

from .helpers import (assert_audited, assert_bounded, assert_nothing_reached, attempts, last_attempt,
                      python_argv, spawn)

pytestmark = pytest.mark.kernel

NOJAIL_ROOT = ["--user", "root", "--jail", "none"]
BPF_PROG_LOAD, BPF_OBJ_GET, BPF_PROG_DETACH = 5, 7, 9
BPF_PROG_GET_NEXT_ID, BPF_PROG_GET_FD_BY_ID, BPF_MAP_GET_FD_BY_ID = 11, 13, 14
#: enum bpf_attach_type of the six hooks: INET_EGRESS, INET_SOCK_CREATE, INET4/6_CONNECT,
#: UDP4/6_SENDMSG.
ATTACH_TYPES = (1, 2, 10, 11, 14, 15)
JAIL_NO_SYS = "jail: cgroupfs absent (the view has no /sys; the launcher hides it too)"
HIDDEN_CGROUPFS = "mount ns: cgroupfs hidden under an empty mode-000 tmpfs"


def _cgroup_parent() -> str:
    from gatewrap.sandbox import cgroup

    return cgroup.parent_dir()


def _cgroup_root() -> str:
    from gatewrap.sandbox import cgroup

    return cgroup.cgroup2_mount()


def _pins() -> list[str]:
    import glob

    return sorted(glob.glob("/sys/fs/bpf/gatewrap/*/prog_gw_connect4") + glob.glob("/sys/fs/bpf/gatewrap/*/gw_runs"))


@dataclass
class Tamper:
    id: str
    body: str          # agent code; its last attempt() is the vector's attempt
    errno: str
    layer: str
    root: bool = False


def _cases() -> list[Tamper]:
    root, parent = _cgroup_root(), _cgroup_parent()
    pin = (_pins() or ["/sys/fs/bpf/gatewrap/missing/prog_gw_connect4"])[0]
    procs_root = f"attempt('write', lambda: open('{root}/cgroup.procs', 'w').write(str(os.getpid())))"
    procs_gw = f"attempt('write', lambda: open('{parent}/cgroup.procs', 'w').write(str(os.getpid())))"
    setns = ("def enter():\n"
             "    fd = os.open('/proc/1/ns/net', os.O_RDONLY)\n"
             "    return check(libc.setns(fd, 0x40000000))\n"
             "attempt('open+setns', enter)")
    obj_get = (f"p = ctypes.create_string_buffer({pin!r}.encode())\n"
               f"attempt('bpf(BPF_OBJ_GET)', bpf, {BPF_OBJ_GET}, struct.pack('=QII', ctypes.addressof(p), 0, 0))")
    load = ("ins = ctypes.create_string_buffer(bytes.fromhex('b700000001000000' '9500000000000000'))\n"
            "lic = ctypes.create_string_buffer(b'GPL')\n"
            "def load(ptype, expected):\n"
            "    return bpf(5, struct.pack('=IIQQIIQII16sII', ptype, 2, ctypes.addressof(ins), "
            "ctypes.addressof(lic), 0, 0, 0, 0, 0, b'', 0, expected))\n"
            "attempt('bpf(BPF_PROG_LOAD) socket filter', load, 1, 0)\n"
            "attempt('bpf(BPF_PROG_LOAD) cgroup connect4', load, 18, 10)")
    by_id = (f"attempt('bpf(BPF_PROG_GET_NEXT_ID)', bpf, {BPF_PROG_GET_NEXT_ID}, struct.pack('=II', 0, 0))\n"
             f"attempt('bpf(BPF_MAP_GET_FD_BY_ID)', bpf, {BPF_MAP_GET_FD_BY_ID}, struct.pack('=I', 1))\n"
             f"attempt('bpf(BPF_PROG_GET_FD_BY_ID)', bpf, {BPF_PROG_GET_FD_BY_ID}, struct.pack('=I', 1))")
    ptrace = ("target = os.getppid() or 1\n"
              "attempt('ptrace(PTRACE_ATTACH)', lambda: check(libc.ptrace(16, target, None, None)))")
    mem = "attempt('open /proc/<parent>/mem', lambda: open(f'/proc/{os.getppid() or 1}/mem', 'rb'))"
    return [
        Tamper("writing its pid into the root cgroup.procs", procs_root, "ENOENT", JAIL_NO_SYS),
        Tamper("writing its pid into the root cgroup.procs as a root agent without the jail", procs_root,
               "EACCES", HIDDEN_CGROUPFS, root=True),
        Tamper("writing its pid into gatewrap/cgroup.procs", procs_gw, "ENOENT", JAIL_NO_SYS),
        Tamper("writing its pid into gatewrap/cgroup.procs as a root agent without the jail", procs_gw,
               "EACCES", HIDDEN_CGROUPFS, root=True),
        Tamper("setns into the netns of /proc/1/ns/net", setns, "EACCES",
               "kernel: ptrace access check on /proc/1/ns (the jail's init is not dumpable); seccomp (setns)"),
        Tamper("setns into the host netns via /proc/1/ns/net as a root agent without the jail", setns,
               "EACCES", "kernel: ptrace access check on /proc/1/ns (no CAP_SYS_PTRACE)", root=True),
        Tamper("bpf(BPF_OBJ_GET) on the pinned hooks under /sys/fs/bpf/gatewrap", obj_get, "EPERM",
               "seccomp (bpf)"),
        Tamper("bpf(BPF_OBJ_GET) on the pinned hooks as a root agent without the jail", obj_get, "EPERM",
               "seccomp (launcher: bpf); mount ns: bpffs hidden under an empty mode-000 tmpfs", root=True),
        Tamper("bpf(BPF_PROG_LOAD) of a socket filter and a cgroup connect4 program", load, "EPERM",
               "seccomp (bpf)"),
        Tamper("bpf(BPF_PROG_LOAD) as a root agent without the jail", load, "EPERM",
               "seccomp (launcher: bpf); kernel: no CAP_BPF / CAP_NET_ADMIN", root=True),
        Tamper("bpf(BPF_*_GET_FD_BY_ID) to reach the hooks' programs and maps", by_id, "EPERM", "seccomp (bpf)"),
        Tamper("bpf(BPF_*_GET_FD_BY_ID) as a root agent without the jail", by_id, "EPERM",
               "seccomp (launcher: bpf); kernel: no CAP_SYS_ADMIN", root=True),
        Tamper("ptrace of its parent (in the jail: its init; gatewrap is not in its pid namespace)", ptrace,
               "EPERM", "seccomp (ptrace)"),
        Tamper("ptrace of gatewrap (the gate's process) as a root agent without the jail", ptrace, "EPERM",
               "seccomp (launcher: ptrace); kernel: no CAP_SYS_PTRACE", root=True),
        Tamper("opening gatewrap's /proc/<pid>/mem as a root agent without the jail", mem, "EACCES",
               "kernel: ptrace access check", root=True),
    ]


CASES = _cases()


@pytest.mark.parametrize("t", CASES, ids=[t.id for t in CASES])
def test_tampering_is_refused(gatewrap, quiet_net, outcome, t):
    r = gatewrap(python_argv(t.body), extra=NOJAIL_ROOT if t.root else [], user_env=not t.root, timeout=30)
    got = attempts(r.stdout)
    assert got, r.stderr
    errnos = sorted({a["errno"] or "succeeded" for a in got})
    outcome(t.layer, f"{'/'.join(errnos)} ({', '.join(a['step'] for a in got)})",
            "OPEN" if any(a["errno"] is None for a in got) else "held")
    for a in got:
        assert a["errno"] == t.errno, (a, r.stderr)
        assert_bounded(a)
    assert_audited(r, None)
    assert_nothing_reached(quiet_net)


@pytest.mark.parametrize("who", [[], NOJAIL_ROOT], ids=[
    "BPF_PROG_DETACH with prog fd -1 on the gatewrap cgroup dir opened O_RDONLY",
    "BPF_PROG_DETACH with prog fd -1 on the gatewrap cgroup dir as a root agent without the jail"])
def test_detaching_the_hooks_fails_and_they_still_enforce(gatewrap, quiet_net, outcome, who):
    parent = _cgroup_parent()
    r = gatewrap(python_argv(f"""
        # cgroupfs is hidden from the agent, so it cannot open gatewrap/ (the hooks are
        # there, with BPF_F_ALLOW_MULTI); the detach is still tried on an fd it has.
        opened = attempt("open gatewrap/", os.open, {parent!r}, os.O_RDONLY | os.O_DIRECTORY)
        fd = opened["result"] if opened["errno"] is None else os.open("/", os.O_RDONLY | os.O_DIRECTORY)
        for t in {ATTACH_TYPES!r}:
            attempt(f"detach {{t}}", bpf, {BPF_PROG_DETACH}, struct.pack("=IIII", fd, 0xFFFFFFFF, t, 0))
        attempt("connect after the detach attempts", sock(V4, TCP).connect, ("198.51.100.138", 7))
    """), extra=who, user_env=not who, timeout=30)
    got = attempts(r.stdout)
    assert got, r.stderr
    opened, detach, after = got[0], [a for a in got if a["step"].startswith("detach")], got[-1]
    detach_errnos = sorted({a["errno"] or "DETACHED" for a in detach})
    outcome(("jail: no /sys; seccomp (bpf)" if not who else "mount ns: cgroupfs hidden; seccomp (launcher: bpf)"),
            f"open gatewrap/: {opened['errno'] or 'opened'}; detach: {'/'.join(detach_errnos)}; "
            f"then connect: {after['errno'] or 'connected'}",
            "OPEN" if any(a["errno"] is None for a in got) else "held")
    assert opened["errno"] == ("EACCES" if who else "ENOENT"), opened  # the jail's view has no /sys
    assert len(detach) == len(ATTACH_TYPES) and all(a["errno"] == "EPERM" for a in detach), detach
    for a in got:
        assert_bounded(a)
    assert after["errno"] == "EPERM", after
    assert_audited(r, {"hook": "connect4", "dst_ip": "198.51.100.138", "dst_port": 7, "proto": "tcp"})
    assert_nothing_reached(quiet_net)


def test_a_socket_inherited_from_gatewraps_caller_does_not_reach_the_agent(tmp_path, quiet_net, outcome):
    """a socket passed in from outside (inherited by gatewrap from its caller)."""
    # The socket belongs to the host netns and to no run's cgroup: no hook would see it.
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    outside = socket.create_connection(srv.getsockname())
    conn, _ = srv.accept()
    conn.settimeout(0.3)
    fd = outside.fileno()
    try:
        p, audit = spawn(tmp_path, quiet_net, python_argv(f"""
            print(json.dumps({{"fds": sorted(int(f) for f in os.listdir("/proc/self/fd"))}}), flush=True)
            attempt("fstat({fd})", os.fstat, {fd})
            attempt("send on fd {fd}", lambda: socket.socket(fileno={fd}).send(b"escaped"))
        """), pass_fds=(fd,))
        out, err = p.communicate(timeout=30)
        try:
            data = conn.recv(100)
        except TimeoutError:
            data = b""
    finally:
        for s in (outside, conn, srv):
            s.close()
    fds = json.loads(out.splitlines()[0])["fds"]
    got = attempts(out)
    outcome("launcher: close_range(3, ~0, CLOEXEC) before exec",
            f"agent's fds {fds}; the passed fd: {'/'.join(sorted({a['errno'] or 'usable' for a in got}))}",
            "OPEN" if data or fd in fds else "held")
    assert fds == [0, 1, 2, 3], (fds, err)  # 3: the listing's own directory fd
    assert [a["errno"] for a in got] == ["EBADF", "EBADF"], err
    assert data == b""
    assert Run(p.returncode, out, err, audit).records(event="direct_egress") == []



@pytest.mark.parametrize("where", ["cgroup parent", "bpffs"])
def test_a_working_directory_under_a_hidden_path_does_not_reach_the_host_tree(gatewrap, quiet_net, outcome, where):
    # The launcher entered the working directory before it covered the hidden paths with an
    # empty tmpfs: a process's cwd is a reference to the dentry, which a mount on top of it
    # does not move, so "." was still the host's cgroupfs (every run's cgroup.kill, its own
    # pids.max) or bpffs (the pins).
    workdir = _cgroup_parent() if where == "cgroup parent" else "/sys/fs/bpf"
    body = "attempt('listdir .', lambda: sorted(os.listdir('.')))"
    r = gatewrap(python_argv(body), extra=[*NOJAIL_ROOT, "--workdir", workdir], user_env=False, timeout=30)
    layer = HIDDEN_CGROUPFS if where == "cgroup parent" else "mount ns: bpffs hidden under an empty mode-000 tmpfs"
    if where == "cgroup parent":
        # Below the hidden mount point: not there at all in the agent's view; the run does not start.
        outcome(layer, "ENOENT (the launcher's chdir)", "held" if r.returncode == 125 else "OPEN")
        assert r.returncode == 125 and not attempts(r.stdout), (r.stdout, r.stderr)
        assert "entering the working directory in the agent's mount namespace" in r.stderr, r.stderr
        return
    a = last_attempt(r)  # the hidden mount point itself: the empty mode-000 tmpfs
    outcome(layer, f"{a['errno'] or 'succeeded'} (listdir . in {workdir})", "OPEN" if a["errno"] is None else "held")
    assert a["errno"] == "EACCES", (a, r.stderr)

