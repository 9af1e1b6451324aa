"""Escape suite, the launcher's baseline: the seccomp filter it installs in every mode
(gate_core/src/launcher/seccomp.rs) and the mount view it gives the agent (cgroupfs and bpffs
absent, /proc/sys and the audit log's folder read-only).

Each vector runs under ``--jail none`` (the filter is then the only one) and, where it applies,
in the default jail (the launcher's filter under nsjail's). The agent's inputs are its own:
high bits set on an ioctl request or a socket family, a pty it made its controlling
terminal, a victim process started outside the run."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import AGENT_PYTHON, AGENT_UID, Run, gatewrap_cmd

from .helpers import assert_audited, assert_bounded, assert_nothing_reached, attempts, python_argv, spawn

pytestmark = pytest.mark.kernel

NOJAIL = ["--jail", "none"]
NOJAIL_ROOT = ["--user", "root", "--jail", "none"]
MODES = {"jail": [], "none": NOJAIL, "none-root": NOJAIL_ROOT}

#: x86_64 system call numbers (asm/unistd_64.h) and the flags the vectors use (linux/sched.h).
SYSCALLS = """
NR_IOCTL, NR_CLONE, NR_UNSHARE, NR_SOCKET = 16, 56, 272, 41
NR_PROCESS_VM_READV, NR_IO_URING_SETUP, NR_PIDFD_OPEN, NR_CLONE3, NR_PIDFD_GETFD = 310, 425, 434, 435, 438
NR_PIDFD_SEND_SIGNAL = 424
CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x2000000, 0x10000000, 0x20000000, 0x40000000
CLONE_INTO_CGROUP, SIGCHLD = 0x200000000, 17
def sys(nr, *args):
    return check(libc.syscall(ctypes.c_long(nr), *(ctypes.c_ulong(a) if isinstance(a, int) else a for a in args)))
def fork_like(nr, *args):
    # clone/clone3 that the filter let through made a child: it leaves at once.
    rc = sys(nr, *args)
    if rc == 0:
        os._exit(0)
    os.waitpid(rc, 0)
    return rc
"""


@dataclass
class Case:
    id: str
    body: str        # agent code; every attempt() in it must fail with errno
    errno: str | tuple[str, ...]
    layer: str
    mode: str = "none"


def _cgroup_mounts() -> list[str]:
    from gatewrap import runner

    return [p for p in runner._kernel_fs_mounts() if os.path.isdir(p)]


def _cases() -> list[Case]:
    cg = _cgroup_mounts()
    clone3 = ("cg = attempt('open the cgroup2 root', os.open, {root!r}, os.O_RDONLY | os.O_DIRECTORY)\n"
              "fd = cg['result'] if cg['errno'] is None else os.open('/', os.O_RDONLY | os.O_DIRECTORY)\n"
              "args = struct.pack('=QQQQQQQQQQQ', CLONE_INTO_CGROUP, 0, 0, 0, SIGCHLD, 0, 0, 0, 0, 0, fd)\n"
              "buf = ctypes.create_string_buffer(args, len(args))\n"
              "attempt('clone3(CLONE_INTO_CGROUP)', fork_like, NR_CLONE3, buf, len(args))\n")
    root = next((p for p in cg if p.endswith("unified") or p == "/sys/fs/cgroup"), "/sys/fs/cgroup")
    ns_clone = ("for name in ('CLONE_NEWUSER', 'CLONE_NEWNS', 'CLONE_NEWPID', 'CLONE_NEWNET', 'CLONE_NEWCGROUP'):\n"
                "    attempt(f'clone({name})', fork_like, NR_CLONE, globals()[name] | SIGCHLD, 0, 0, 0, 0)\n")
    sysctl = ("for path in ('/proc/sys/kernel/core_pattern', '/proc/sys/kernel/hostname'):\n"
              "    old = open(path).read()  # written back unchanged: harmless even if it got through\n"
              "    attempt(f'write {path}', lambda: open(path, 'w').write(old))\n")
    cgroupfs = (f"for path in {cg!r}:\n"
                "    attempt(f'open {path}/cgroup.procs', lambda: open(os.path.join(path, 'cgroup.procs'), 'w'))\n"
                "    attempt(f'listdir {path}', lambda: os.listdir(path) or 'empty')\n")
    tty = ("m, s = os.openpty()\n"
           "name = os.ttyname(s)\n"
           "os.close(s)\n"
           "t = os.open(name, os.O_RDWR)\n"
           "import fcntl, termios\n"
           "try:  # the launcher's setsid made the agent a session leader: its own controlling tty\n"
           "    fcntl.ioctl(t, termios.TIOCSCTTY, 0)\n"
           "except OSError:  # in the jail it is not one (nsjail keeps the session)\n"
           "    pass\n"
           "assert fcntl.ioctl(t, termios.TIOCGWINSZ, b'\\0' * 8)  # the fd takes other ioctls\n"
           "c = ctypes.c_char(b'x')\n"
           "for req in (0x5412, 0x100005412, 0xffffffff00005412, 0x541c, 0x10000541c):\n"
           "    attempt(f'ioctl({req:#x})', sys, NR_IOCTL, t, req, ctypes.byref(c))\n")
    families = ("for fam, kind in ((40, 1), (0x100000028, 1), (17, 3), (17, 2), (0x100000011, 3), (30, 5), (38, 5)):\n"
                "    attempt(f'socket({fam:#x}, {kind})', sys, NR_SOCKET, fam, kind, 0)\n")
    uring = ("p = ctypes.create_string_buffer(120)\n"
             "attempt('io_uring_setup', sys, NR_IO_URING_SETUP, 8, p)\n")
    userns = ("attempt('unshare(CLONE_NEWUSER)', sys, NR_UNSHARE, CLONE_NEWUSER)\n"
              "attempt('unshare(CLONE_NEWUSER | CLONE_NEWNET)', sys, NR_UNSHARE, CLONE_NEWUSER | CLONE_NEWNET)\n")
    return [
        Case("clone3(CLONE_INTO_CGROUP) on the cgroup2 root as a root agent without the jail",
             clone3.format(root=root), ("EACCES", "ENOSYS"),
             "mount ns: cgroupfs hidden; seccomp (launcher): clone3 ENOSYS", "none-root"),
        Case("clone3 in the jail", clone3.format(root=root), ("EACCES", "ENOENT", "ENOSYS"),
             "seccomp (launcher and jail): clone3 ENOSYS", "jail"),
        Case("the fallback clone with namespace flags as a root agent without the jail", ns_clone, "EPERM",
             "seccomp (launcher): clone namespace flags", "none-root"),
        Case("the fallback clone with namespace flags in the jail", ns_clone, "EPERM",
             "seccomp (jail: NEWUSER/NEWNET; launcher: NEWNET/NEWCGROUP); kernel: no CAP_SYS_ADMIN", "jail"),
        Case("writing /proc/sys (kernel.core_pattern, kernel.hostname) as a root agent without the jail",
             sysctl, "EROFS", "mount ns: /proc/sys read-only", "none-root"),
        Case("writing /proc/sys (kernel.core_pattern, kernel.hostname) in the jail", sysctl, ("EROFS", "EACCES"),
             "the jail's read-only /proc", "jail"),
        Case("cgroupfs (every cgroup and cgroup2 mount) as a root agent without the jail", cgroupfs,
             ("EACCES", "ENOENT"), "mount ns: an empty mode-000 tmpfs over each", "none-root"),
        Case("cgroupfs (every cgroup and cgroup2 mount) in the jail", cgroupfs, ("EACCES", "ENOENT"),
             "jail: the view has no /sys; mount ns: an empty mode-000 tmpfs over each", "jail"),
        Case("TIOCSTI/TIOCLINUX with high bits set on its own controlling pty, without the jail", tty, "EPERM",
             "seccomp (launcher): request compared on 32 bits", "none"),
        Case("TIOCSTI/TIOCLINUX with high bits set on its own controlling pty, in the jail", tty, "EPERM",
             "seccomp (jail and launcher): request compared on 32 bits", "jail"),
        Case("AF_VSOCK, AF_PACKET, AF_BLUETOOTH, AF_ALG sockets (domain high bits too) without the jail",
             families, "EAFNOSUPPORT", "seccomp (launcher): socket family", "none"),
        Case("AF_VSOCK, AF_PACKET, AF_BLUETOOTH, AF_ALG sockets as a root agent without the jail",
             families, "EAFNOSUPPORT", "seccomp (launcher): socket family", "none-root"),
        Case("io_uring_setup without the jail", uring, "ENOSYS", "seccomp (launcher)", "none"),
        Case("unshare(CLONE_NEWUSER) without the jail", userns, "EPERM", "seccomp (launcher)", "none"),
        Case("unshare(CLONE_NEWUSER) as a root agent without the jail", userns, "EPERM", "seccomp (launcher)",
             "none-root"),
        Case("unshare(CLONE_NEWUSER) in the jail", userns, "EPERM", "seccomp (jail)", "jail"),
    ]


CASES = _cases()


def _check(r: Run, outcome, layer: str, errno) -> list[dict]:
    got = attempts(r.stdout)
    assert got, (r.stdout, r.stderr)
    errnos = sorted({a["errno"] or "succeeded" for a in got})
    outcome(layer, f"{'/'.join(errnos)} ({', '.join(a['step'] for a in got)})",
            "OPEN" if any(a["errno"] is None for a in got) else "held")
    allowed = (errno,) if isinstance(errno, str) else errno
    for a in got:
        assert a["errno"] in allowed, (a, r.stderr)
        assert_bounded(a)
    return got


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_baseline_refuses(gatewrap, quiet_net, outcome, c):
    r = gatewrap(python_argv(SYSCALLS + c.body), extra=MODES[c.mode], user_env=c.mode != "none-root", timeout=30)
    got = _check(r, outcome, c.layer, c.errno)
    if c.id.startswith("clone3"):
        assert got[-1]["errno"] == "ENOSYS", got
    assert_audited(r, None)
    assert_nothing_reached(quiet_net)


VICTIM = r"""
import json, os, socket, sys, time
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
print(json.dumps({"pid": os.getpid(), "connected": c.fileno(), "unconnected": u.fileno()}), flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("mode", ["none", "jail"], ids=[
    "pidfd_getfd of sockets held by another process of the same user, without the jail",
    "pidfd_getfd of sockets held by another process of the same user, in the jail"])
def test_pidfd_getfd_of_a_same_user_process(tmp_path, quiet_net, outcome, mode):
    """pidfd_getfd of a socket held by a process of the agent's user started outside the run."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def as_agent_user():
        os.setgroups([])
        os.setgid(AGENT_UID)
        os.setuid(AGENT_UID)

    victim = subprocess.Popen([AGENT_PYTHON, "-c", VICTIM, str(srv.getsockname()[1])], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, preexec_fn=as_agent_user)
    try:
        v = json.loads(victim.stdout.readline())
        conn, _ = srv.accept()
        conn.settimeout(0.3)
        body = SYSCALLS + f"""
pid = attempt('pidfd_open', sys, NR_PIDFD_OPEN, {v['pid']}, 0)
pidfd = pid['result'] if pid['errno'] is None else 0
for fd in ({v['connected']}, {v['unconnected']}):
    got = attempt(f'pidfd_getfd(victim, {{fd}})', sys, NR_PIDFD_GETFD, pidfd, fd, 0)
    if got['errno'] is None:
        attempt('send on the taken socket', socket.socket(fileno=got['result']).send, b'escaped')
buf = ctypes.create_string_buffer(8)
local = ctypes.create_string_buffer(struct.pack('=QQ', ctypes.addressof(buf), 8))
remote = ctypes.create_string_buffer(struct.pack('=QQ', 0x400000, 8))
attempt('process_vm_readv(victim)', sys, NR_PROCESS_VM_READV, {v['pid']}, local, 1, remote, 1, 0)
"""
        p, audit = spawn(tmp_path, quiet_net, python_argv(body), extra=MODES[mode])
        out, err = p.communicate(timeout=30)
        try:
            data = conn.recv(100)
        except TimeoutError:
            data = b""
        conn.close()
    finally:
        victim.kill()
        victim.wait()
        srv.close()
    got = [a for a in attempts(out) if a["step"] != "pidfd_open"]
    opened = next((a for a in attempts(out) if a["step"] == "pidfd_open"), {})
    outcome("seccomp (launcher): pidfd_getfd, process_vm_readv",
            f"pidfd_open: {opened.get('errno') or 'opened'}; "
            + ", ".join(f"{a['step']}: {a['errno'] or 'succeeded'}" for a in got),
            "OPEN" if data or any(a["errno"] is None for a in got) else "held")
    assert [a["errno"] for a in got] == ["EPERM", "EPERM", "EPERM"], (got, err)
    if mode == "none":
        assert opened.get("errno") is None, opened  # the victim is visible: only the filter stops it
    assert data == b""
    assert Run(p.returncode, out, err, audit).records(event="direct_egress") == []


@pytest.mark.parametrize("mode", ["none", "none-root", "jail"], ids=[
    "an audit log folder owned by the agent's user, without the jail",
    "the audit log's folder is hidden from a root agent without the jail",
    "an audit log folder owned by the agent's user, in the jail"])
def test_the_audit_log_folder_is_read_only(net, quiet_net, outcome, mode):
    """the audit log's folder: no new file (a FIFO in its place), no rename, no unlink."""
    top = tempfile.mkdtemp(prefix="gw-auditdir-", dir="/var/tmp")
    folder = os.path.join(top, "logs")
    os.mkdir(folder)
    owner = 0 if mode == "none-root" else AGENT_UID
    for d in (top, folder):  # the agent's own: only the mount view stands in its way
        os.chown(d, owner, owner)
        os.chmod(d, 0o755)
    log = os.path.join(folder, "audit.jsonl")
    body = f"""
folder, log = {folder!r}, {log!r}
attempt('mkfifo in the folder', os.mkfifo, os.path.join(folder, 'fifo'))
attempt('create a file in the folder', lambda: open(os.path.join(folder, 'new'), 'w'))
attempt('unlink the audit log', os.unlink, log)
attempt('rename the audit log', os.rename, log, log + '.old')
attempt('rename the folder', os.rename, folder, folder + '.old')
"""
    try:
        cmd = [*gatewrap_cmd("run", "--audit-log", log, "--resolver", net.dns_server, "--workdir", "/tmp"),
               *MODES[mode], "--", *python_argv(body)]
        env = dict(os.environ)
        if mode == "none-root":
            env.pop("SUDO_UID", None)
            env.pop("SUDO_GID", None)
        else:
            env.update(SUDO_UID=str(AGENT_UID), SUDO_GID=str(AGENT_UID))
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
        r = Run(p.returncode, p.stdout, p.stderr, Path(log))
        if owner != 0:
            # A folder the agent's user owns is refused before anything starts: it could swap
            # the folder (a FIFO at the log's path) between runs, whatever this run's view.
            assert p.returncode == 125 and "is not owned by root" in p.stderr, p.stderr
            outcome("gatewrap: the audit log's folder must be root's", "exit 125 before the agent starts")
            assert not os.path.exists(log)
            return
        if mode == "none-root":
            # Hidden, not only read-only: a root agent could open the log and hold its flock(2),
            # stalling every gate that writes to it. EACCES: the empty mode-000 tmpfs over the
            # folder; EBUSY: renaming a mount point (rename(2)).
            _check(r, outcome, "mount ns: the audit log's folder hidden (an empty mode-000 tmpfs)", ("EACCES", "EBUSY"))
        else:
            # EROFS: the read-only folder; EBUSY: renaming a mount point (rename(2)).
            _check(r, outcome, "mount ns: the audit log's folder bound read-only", ("EROFS", "EBUSY"))
        assert sorted(os.listdir(folder)) == ["audit.jsonl"]
        assert r.records(event="run_end"), p.stderr
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _as_agent_user():
    os.setgroups([])
    os.setgid(AGENT_UID)
    os.setuid(AGENT_UID)


#: What stops each vector on a process of the agent's user outside the run, by mode.
LANDLOCK = "Landlock (launcher): the agent's domain"
OUTSIDE = {"none": LANDLOCK, "jail": "jail: pid namespace"}


@pytest.mark.parametrize("mode", ["none", "jail"], ids=[
    "/proc/PID/mem of another process of the same user, without the jail",
    "/proc/PID/mem of another process of the same user, in the jail"])
def test_proc_pid_mem_of_a_same_user_process(gatewrap, quiet_net, outcome, mode):
    """/proc/PID/mem of a process of the agent's user started outside the run: Landlock's
    ptrace restriction without the jail (landlock.rst, "Ptrace restrictions"), which open(2)
    of /proc/PID/mem checks (ptrace_may_access); absent from the jail's pid namespace."""
    victim = subprocess.Popen(["/bin/sleep", "60"], preexec_fn=_as_agent_user)
    try:
        r = gatewrap(python_argv(f"""
            def peek():
                start = int(open('/proc/{victim.pid}/maps').readline().split('-')[0], 16)
                fd = os.open('/proc/{victim.pid}/mem', os.O_RDWR)
                return os.pread(fd, 4, start).hex()
            attempt('open /proc/{victim.pid}/mem O_RDWR and read', peek)
        """), extra=MODES[mode], timeout=30)
    finally:
        victim.kill()
        victim.wait()
    got = attempts(r.stdout)
    assert got, r.stderr
    a = got[-1]
    outcome(OUTSIDE[mode], f"{a['errno'] or 'read ' + str(a['result'])} (open+pread)",
            "OPEN" if a["errno"] is None else "held")
    assert a["errno"] == ("ENOENT" if mode == "jail" else "EACCES"), a
    assert_bounded(a)


@pytest.mark.parametrize("mode", ["none", "jail"], ids=[
    "SIGTERM to another process of the same user, without the jail",
    "SIGTERM to another process of the same user, in the jail"])
def test_a_signal_to_a_same_user_process(gatewrap, quiet_net, outcome, mode):
    """kill(2) and pidfd_send_signal(2) of SIGTERM to a process of the agent's user started
    outside the run: Landlock's LANDLOCK_SCOPE_SIGNAL (ABI 6) without the jail (EPERM); the
    jail's pid namespace does not show it (ESRCH). The victim must be alive afterwards."""
    victim = subprocess.Popen(["/bin/sleep", "60"], preexec_fn=_as_agent_user)
    try:
        r = gatewrap(python_argv(SYSCALLS + f"""
attempt('kill({victim.pid}, SIGTERM)', os.kill, {victim.pid}, 15)
pidfd = attempt('pidfd_open', sys, NR_PIDFD_OPEN, {victim.pid}, 0)
if pidfd['errno'] is None:
    attempt('pidfd_send_signal(SIGTERM)', sys, NR_PIDFD_SEND_SIGNAL, pidfd['result'], 15, 0, 0)
"""), extra=MODES[mode], timeout=30)
        alive = victim.poll() is None
    finally:
        victim.kill()
        victim.wait()
    got = [a for a in attempts(r.stdout) if a["step"] != "pidfd_open"]
    assert got, r.stderr
    outcome(OUTSIDE[mode], ", ".join(f"{a['errno'] or 'sent'} ({a['step'].split('(')[0]})" for a in got),
            "held" if alive and all(a["errno"] for a in got) else "OPEN")
    assert alive, "the victim was killed"
    expect = ["ESRCH"] if mode == "jail" else ["EPERM", "EPERM"]
    assert [a["errno"] for a in got] == expect, (got, r.stderr)


LISTENER = r"""
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(b"\0" + sys.argv[1].encode())
s.listen(4)
print("ready", flush=True)
for line in sys.stdin:  # one line per client that tried: report what reached the listener
    s.settimeout(0.5)
    try:
        s.accept()[0].close()
        print("accepted", flush=True)
    except TimeoutError:
        print("nothing", flush=True)
"""
#: The control: a process of the agent's user outside the run, in the run's netns.
CONTROL = "import socket, sys; socket.socket(socket.AF_UNIX).connect(b'\\0' + sys.argv[1].encode())"


def test_an_abstract_unix_socket_outside_the_run(tmp_path, quiet_net, outcome):
    """connect(2) to an abstract unix socket that a process of the agent's user, outside the
    run but in the run's network namespace (abstract names are per netns), listens on:
    Landlock's LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET (ABI 6) refuses it with EPERM, while the
    same connect from outside the run (the control) reaches the listener."""
    name = f"gw-landlock-{os.getpid()}"
    body = f"""
print(json.dumps({{"pid": os.getpid()}}), flush=True)
sys.stdin.readline()
def dial():
    s = sock(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(b"\\0{name}")
attempt('connect to @{name}', dial)
"""
    p, audit = spawn(tmp_path, quiet_net, python_argv(body), extra=NOJAIL, stdin=subprocess.PIPE)
    listener = None
    try:
        pid = json.loads(p.stdout.readline())["pid"]
        def in_netns_of(pid):
            return ["nsenter", f"--net=/proc/{pid}/ns/net", f"--setuid={AGENT_UID}", f"--setgid={AGENT_UID}",
                    "--", AGENT_PYTHON, "-c"]
        listener = subprocess.Popen([*in_netns_of(pid), LISTENER, name], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    text=True)
        assert listener.stdout.readline().strip() == "ready"
        p.stdin.write("go\n")
        p.stdin.flush()
        out, err = p.communicate(timeout=30)
        listener.stdin.write("agent\n")
        listener.stdin.flush()
        from_agent = listener.stdout.readline().strip()
        subprocess.run([*in_netns_of(listener.pid), CONTROL, name], check=True, timeout=30)
        listener.stdin.write("control\n")
        listener.stdin.flush()
        from_control = listener.stdout.readline().strip()
    finally:
        p.kill()
        p.wait()
        if listener:
            listener.kill()
            listener.wait()
    got = attempts(out)
    assert got, err
    a = got[-1]
    outcome("Landlock (launcher): abstract unix socket scope", f"{a['errno'] or 'connected'} (connect)",
            "held" if a["errno"] and from_agent == "nothing" else "OPEN")
    assert a["errno"] == "EPERM", (a, err)
    assert (from_agent, from_control) == ("nothing", "accepted")
