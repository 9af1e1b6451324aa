"""Escape suite, a container's run (issue 22): what a pod or container creator's annotations
make the daemon read, and what a container does to its own run's life (stop, the daemon's
watch of dead containers, gc).

The daemon (root; in Kubernetes a privileged container with the node's pid namespace,
contrib/kubernetes/20-daemonset.yaml) reads the file the ``gatewrap.policy`` annotation
names. ``container_create`` is sent here as ``gatewrap-oci create`` sends it from the
annotation (gatewrap-oci passes the path on unchanged, :func:`gatewrap.oci.bundle.policy_of`).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import ROOT, gatewrap_cmd
from containers.conftest import image, oci_daemon, podman, podman_base, podman_image  # noqa: F401
from gatewrap.shared import protocol

from .helpers import agent_code, attempts
from .test_containers import CTYPES, OWN_NAMESPACES

pytestmark = pytest.mark.kernel

PERMISSIVE = 'version = 1\ndefault = "allow"\n'


def _ask(daemon, message: dict) -> dict:
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(daemon.socket)
        protocol.send(s, message)
        return protocol.Reader(s).message() or {}


def _create(daemon, container: str, policy: str) -> dict:
    """The daemon's answer to ``container_create`` with annotation gatewrap.policy=``policy``;
    a run it set up is deleted again."""
    got = _ask(daemon, {"op": "container_create", "container": container, "policy": policy, "allow": [],
                        "policy_source": "annotations", "argv": ["sh"], "uid": 0, "bounds": {}, "audit_log": None,
                        "resolvers": [], "public_ranges": []})
    if "run" in got:
        _ask(daemon, {"op": "container_delete", "container": container})
    return got


@pytest.fixture
def own_root():
    """A process whose root (as /proc/PID/root shows it) is a folder the container's root
    wrote: a root-owned policy (0644) that allows everything, as a running container (root
    inside is the host's uid 0) leaves in its own file system; yields its pid."""
    d = Path(tempfile.mkdtemp(prefix="gwt-ownroot-"))
    (d / "policy.toml").write_text(PERMISSIVE)
    (d / "policy.toml").chmod(0o644)
    p = subprocess.Popen(["sleep", "60"], cwd=d)
    yield p.pid
    p.kill()
    p.wait()
    subprocess.run(["rm", "-rf", str(d)])


@pytest.mark.parametrize("path", ["/proc/{pid}/cwd/policy.toml", "/proc/{pid}/root/etc/shadow", "/proc/self/environ"],
                         ids=["gatewrap.policy through /proc/PID/cwd (or /root): a file its own container wrote, allow-all",
        "gatewrap.policy=/proc/PID/root/etc/shadow (in Kubernetes /proc/1/root: the daemon has the node's pid namespace)",
        "gatewrap.policy=/proc/self/environ (the daemon's own; /proc/kmsg would block and eat the kernel log)"])
def test_a_policy_annotation_through_proc_is_refused(oci_daemon, outcome, own_root, path):  # noqa: F811
    path = path.format(pid=own_root)
    got = _create(oci_daemon, f"gwt-proc-{os.getpid()}", path)
    said = got.get("error") or f"run {got.get('run')} set up with that file as its policy"
    held = "run" not in got and "/proc" in said and "invalid policy" not in said
    outcome("the daemon's check of gatewrap.policy (checked_policy_file)", said[:160], "held" if held else "OPEN")
    assert held, got


# --- a container whose processes are in a child cgroup of its run's ----------------------

EXIT_GRACE = 5.0  # gatewrap.oci.runs.EXIT_GRACE


def _gw(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(gatewrap_cmd(*args), capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_a_container_hidden_in_a_child_cgroup_keeps_its_run_and_gatewrap_stop_still_ends_it(podman, outcome):  # noqa: F811
    """a container whose processes are in a child cgroup of its run's (the run's cgroup.procs empty)

    Does the daemon's watch take it for dead and remove its sandbox while it runs, or gatewrap stop miss it? The
    container's root could move itself there from its own user and cgroup namespace before seal_namespaces; the
    host's root does it here (its first process, pid 1 of its pid namespace, ignores SIGTERM)."""
    c = podman("-d", "--network", "none", cmd=["sleep", "300"])
    assert c.returncode == 0, c.stderr
    leaf = f"/sys/fs/cgroup/unified/gatewrap/{c.run_id}"
    try:
        deadline = time.monotonic() + 30
        while not open(f"{leaf}/cgroup.procs").read().split():
            assert time.monotonic() < deadline, "the container's process never appeared in its run's cgroup"
            time.sleep(0.2)
        os.makedirs(f"{leaf}/hidden", exist_ok=True)
        for pid in open(f"{leaf}/cgroup.procs").read().split():
            with open(f"{leaf}/hidden/cgroup.procs", "w") as f:
                f.write(pid)
        assert open(f"{leaf}/cgroup.procs").read().strip() == ""
        assert open(f"{leaf}/hidden/cgroup.procs").read().strip()
        time.sleep(EXIT_GRACE + 1.5)
        kept = os.path.exists(f"/run/gatewrap/runs/{c.run_id}.lock") and os.path.isdir(leaf)
        p = _gw("stop", "--timeout", "2", "--json", c.run_id)
        stopped = json.loads(p.stdout) if p.returncode == 0 else {}
        running = c.id in subprocess.run([*podman_base(), "ps", "-q", "--no-trunc"], capture_output=True,
                                         text=True).stdout
        held = kept and stopped.get("signal") == "SIGKILL" and not running and not os.path.exists(leaf)
        outcome("cgroup.events populated (the subtree's) for the daemon's watch; cgroup.kill for stop",
                f"run kept {EXIT_GRACE + 1.5:g} s: {kept}; stop: {stopped.get('signal') or p.stderr.strip()[-120:]}; "
                f"container running after: {running}", "held" if held else "OPEN")
        assert held, (kept, p.stdout, p.stderr[-1000:], running)
    finally:
        subprocess.run([*podman_base(), "rm", "-f", "-t", "0", c.id], capture_output=True, timeout=60)


def test_a_policy_annotation_naming_a_huge_root_file_is_refused_unread(oci_daemon, outcome, tmp_path):  # noqa: F811
    """gatewrap.policy naming a huge root-owned file (the node's audit log: GBs, read whole into the daemon's memory)"""
    big = tmp_path / "audit.jsonl"
    with open(big, "wb") as f:
        f.truncate(64 << 20)  # sparse: 64 MiB of NULs, no disk
    big.chmod(0o640)
    tmp_path.chmod(0o755)
    got = _create(oci_daemon, f"gwt-big-{os.getpid()}", str(big))
    said = got.get("error") or f"run {got.get('run')} set up"
    held = "run" not in got and "invalid policy" not in said and "bytes" in said
    outcome("the daemon's check of gatewrap.policy (its size, before the read)", said.replace(str(tmp_path), "TMP")[:160],
            "held" if held else "OPEN")
    assert held, got


# --- another engine's delete of the same container id --------------------------------------

#: The container's first process: a direct connect every 0.5 s, its errno on stdout.
CONNECTS = """
while True:
    attempt('connect 198.51.100.148:80', lambda: sock(V4, TCP).connect(('198.51.100.148', 80)))
    time.sleep(0.5)
"""


def test_a_delete_that_runc_refuses_does_not_end_a_live_containers_run(podman, outcome, tmp_path):  # noqa: F811
    """gatewrap-oci delete of a live container's id that runc refuses (another engine's runc --root)

    The same for a live container's delete without --force: is its run ended, its sandbox removed under it?"""
    from .test_containers import OCI

    c = podman("-d", "--network", "none", *CTYPES, cmd=["python3", "-c", agent_code(CONNECTS)])
    assert c.returncode == 0, c.stderr
    leaf = f"/sys/fs/cgroup/unified/gatewrap/{c.run_id}"
    try:
        time.sleep(1)
        d = subprocess.run([OCI, "--root", str(tmp_path / "other-engine"), "delete", c.id], capture_output=True,
                           text=True, timeout=60)
        time.sleep(1.5)
        kept = os.path.exists(f"/run/gatewrap/runs/{c.run_id}.lock")
        running = c.id in subprocess.run([*podman_base(), "ps", "-q", "--no-trunc"], capture_output=True,
                                         text=True).stdout
        procs = open(f"{leaf}/cgroup.procs").read().split() if os.path.isdir(leaf) else []
        logs = subprocess.run([*podman_base(), "logs", c.id], capture_output=True, text=True).stdout
        last = [a.get("errno") for a in attempts(logs)][-2:]
        held = kept and running
        outcome("gatewrap-oci delete: the run ended only when runc deleted its container",
                f"runc delete exit {d.returncode}; run kept: {kept}; container running: {running}, its leaf's "
                f"processes {len(procs)}; its last connects: {last}", "held" if held else "OPEN")
        assert held, (d.returncode, d.stderr[-500:], kept, running, procs, last)
    finally:
        subprocess.run([*podman_base(), "rm", "-f", "-t", "0", c.id], capture_output=True, timeout=60)


# --- the bounds: a child cgroup of its own ------------------------------------------------

#: Without seccomp, in a user, cgroup and mount namespace of its own: cgroup v1's pids
#: hierarchy mounted anew (to make a child without the bound), a child cgroup in cgroup2,
#: then forks until one fails.
FORKS = OWN_NAMESPACES + """
os.makedirs('/tmp/v1', exist_ok=True)
attempt('mount cgroup v1 pids', lambda: check(libc.mount(b'none', b'/tmp/v1', b'cgroup', 0, b'pids')))
def write(path, value):
    if not os.path.ismount(os.path.dirname(path)):  # not cgroupfs: a plain file would be made
        raise FileNotFoundError(2, 'not mounted', path)
    with open(path, 'w') as f:
        f.write(value)
attempt('write its own pids.max', write, '/tmp/v1/pids.max', 'max')
attempt('its own pids.max', lambda: open('/tmp/v1/pids.max').read().strip())
os.makedirs('/tmp/v1m', exist_ok=True)
attempt('mount cgroup v1 memory', lambda: check(libc.mount(b'none', b'/tmp/v1m', b'cgroup', 0, b'memory')))
if os.path.exists('/tmp/v1m/memory.memsw.limit_in_bytes'):  # memory's may not go above memory+swap's
    attempt('write its own memory.memsw.limit_in_bytes', write, '/tmp/v1m/memory.memsw.limit_in_bytes', '-1')
attempt('write its own memory.limit_in_bytes', write, '/tmp/v1m/memory.limit_in_bytes', '-1')
attempt('its own memory.limit_in_bytes', lambda: open('/tmp/v1m/memory.limit_in_bytes').read().strip())
os.makedirs('/tmp/cg', exist_ok=True)
def child():
    check(libc.mount(b'none', b'/tmp/cg', b'cgroup2', 0, None))
    os.makedirs('/tmp/cg/child', exist_ok=True)
    open('/tmp/cg/child/cgroup.procs', 'w').write(str(os.getpid()))
attempt('a child cgroup in cgroup2', child)
def forks():
    kids = []
    try:
        for _ in range(200):
            pid = os.fork()
            if pid == 0:
                time.sleep(30)
                os._exit(0)
            kids.append(pid)
    finally:
        print(json.dumps({'forked': len(kids)}), flush=True)
        for k in kids:
            os.kill(k, 9)
attempt('fork 200 from a child cgroup', forks)
"""


@pytest.mark.parametrize("flags", [[], ["--security-opt", "seccomp=unconfined"]],
                         ids=["the container's root writes its own cgroup v1 pids.max and memory limit "
                              "(own user and cgroup namespace; podman's seccomp profile)",
                              "the same without a seccomp profile (Kubernetes' default: Unconfined)"])
def test_a_containers_root_cannot_loosen_its_own_bounds(podman, outcome, flags):  # noqa: F811
    """its own user and cgroup namespace, cgroup v1's pids and memory mounted anew: it writes its own pids.max and
    memory.limit_in_bytes (its cgroupns root's: v1 has no nsdelegate) and forks past the bound (the engine's 64
    here; the default 4096 the same)"""
    c = podman("--network", "none", *flags, "--pids-limit", "64", *CTYPES, cmd=["python3", "-c", agent_code(FORKS)])
    got = {a["step"]: a for a in attempts(c.stdout)}
    forked = next((json.loads(line)["forked"] for line in c.stdout.splitlines() if line.startswith('{"forked"')), None)
    said = {s: (got.get(s) or {"errno": "no attempt"}) for s in (
        "unshare(user, cgroup, mount)", "mount cgroup v1 pids", "write its own pids.max", "write its own memory.limit_in_bytes")}
    said = {s: a["errno"] or "done" for s, a in said.items()}
    held = forked is not None and forked < 64 and said["write its own memory.limit_in_bytes"] != "done"
    outcome("gatewrap-oci's seccomp: no user or cgroup namespace of its own (bundle.seal_namespaces); the run's "
            "cgroup v1 bounds on its leaf",
            "; ".join(f"{s}: {e}" for s, e in said.items()) + f"; forked {forked} of 200", "held" if held else "OPEN")
    assert held, (c.returncode, c.stdout[-2000:], c.stderr[-1000:])



#: podman's own profile (containers-common), the base of the engine profiles below.
PODMAN_PROFILE = "/usr/share/containers/seccomp.json"


def _podman_profile_with(path: Path, default: str | None = None, moved: tuple[str, ...] = (), action: str = "") -> str:
    """podman's profile written to ``path``, its default action ``default`` (if given) and
    the calls ``moved`` taken out of its allowing rules into one rule of ``action``; returns
    the ``--security-opt`` value."""
    profile = json.loads(Path(PODMAN_PROFILE).read_text())
    if default:
        profile["defaultAction"] = default
    if moved:
        for rule in profile["syscalls"]:
            if rule["action"] == "SCMP_ACT_ALLOW":
                rule["names"] = [n for n in rule["names"] if n not in moved]
        profile["syscalls"] = [r for r in profile["syscalls"] if r["names"]] + [{"names": list(moved), "action": action}]
    path.write_text(json.dumps(profile))
    return f"seccomp={path}"


#: ``BODY`` (an agent's code) in a child under ptrace(2) with PTRACE_O_TRACESECCOMP: a call
#: the profile answers SCMP_ACT_TRACE stops the child, and the parent lets it go on (seccomp(2)
#: "SECCOMP_RET_TRACE": the tracer may let the call run); a tracer is any process of the
#: container that may ptrace the child (its parent: Yama's scope 1).
TRACED = """
import signal
L = ctypes.c_long
kid = os.fork()
if kid == 0:
    libc.ptrace(L(0), L(0), L(0), L(0))  # PTRACE_TRACEME
    os.kill(os.getpid(), signal.SIGSTOP)
    exec(compile(BODY, 'traced', 'exec'))
    sys.stdout.flush()
    os._exit(0)
os.waitpid(kid, 0)
libc.ptrace(L(0x4200), L(kid), L(0), L(0x80 | 0x100000))  # PTRACE_SETOPTIONS: TRACESECCOMP, EXITKILL
libc.ptrace(L(7), L(kid), L(0), L(0))  # PTRACE_CONT
while True:
    _, st = os.waitpid(kid, 0)
    if os.WIFEXITED(st) or os.WIFSIGNALED(st):
        break
    sig = 0 if st >> 8 == (signal.SIGTRAP | (7 << 8)) else os.WSTOPSIG(st)  # PTRACE_EVENT_SECCOMP: let it run
    libc.ptrace(L(7), L(kid), L(0), L(sig))
"""


@pytest.mark.parametrize("case", ["log-rules", "trace-rules", "trace-default", "vsock-log-default"],
                         ids=["an engine profile allowing clone, unshare and mount with SCMP_ACT_LOG: the container's "
                              "root writes its own cgroup v1 pids.max and memory limit",
                              "the same with SCMP_ACT_TRACE rules for unshare and mount, a tracer in the container",
                              "an engine profile whose default is SCMP_ACT_TRACE, a tracer in the container: the same",
                              "an engine profile whose default is SCMP_ACT_LOG: socket(AF_VSOCK)"])
def test_an_engine_profile_that_lets_calls_through_another_way_does_not_give_a_container_its_own_namespaces(
        podman, outcome, tmp_path, case):  # noqa: F811
    """seccomp actions that let a call run other than SCMP_ACT_ALLOW (LOG, TRACE with a tracer of the container's own)."""
    traced = f"BODY = {FORKS!r}\n{TRACED}"
    opt, body = {
        "log-rules": lambda: (_podman_profile_with(tmp_path / "p.json", moved=("clone", "unshare", "mount"),
                                                   action="SCMP_ACT_LOG"), FORKS),
        "trace-rules": lambda: (_podman_profile_with(tmp_path / "p.json", moved=("unshare", "mount"),
                                                     action="SCMP_ACT_TRACE"), traced),
        "trace-default": lambda: (_podman_profile_with(tmp_path / "p.json", default="SCMP_ACT_TRACE"), traced),
        "vsock-log-default": lambda: (_podman_profile_with(tmp_path / "p.json", default="SCMP_ACT_LOG"),
                                      "attempt('socket(AF_VSOCK)', lambda: socket.socket(socket.AF_VSOCK, "
                                      "socket.SOCK_STREAM).close())"),
    }[case]()
    c = podman("--network", "none", "--security-opt", opt, "--pids-limit", "64", *CTYPES,
               cmd=["python3", "-c", agent_code(body)])
    got = {a["step"]: a["errno"] or "done" for a in attempts(c.stdout)}
    forked = next((json.loads(line)["forked"] for line in c.stdout.splitlines() if line.startswith('{"forked"')), None)
    refused = "seccomp profile whose default action is" in c.stderr
    if case == "vsock-log-default":
        held = got.get("socket(AF_VSOCK)") not in (None, "done") or refused
    else:
        held = (forked is None or forked < 64) and got.get("write its own memory.limit_in_bytes") != "done"
    said = "; ".join(f"{s}: {e}" for s, e in got.items()) + (f"; forked {forked} of 200" if forked is not None else "")
    outcome("gatewrap-oci's seccomp: a rule that lets clone/unshare/socket through in any way is narrowed "
            "(bundle.seal_namespaces, seal_vsock); a default that does, but ALLOW, is refused at create",
            said if not refused else "refused at create: " + c.stderr.split("refused: ")[-1][:120],
            "held" if held else "OPEN")
    assert held, (c.returncode, c.stdout[-2000:], c.stderr[-1000:])
    assert refused == (case in ("trace-default", "vsock-log-default")), c.stderr[-1000:]

# --- contrib/kubernetes's installer: what the node's containerd config holds ---------------

def test_the_installer_runs_nothing_the_nodes_containerd_config_holds(tmp_path, outcome):
    """the node's containerd config with shell in its comment and default runtime's name ($(...), backquotes)"""
    from test_contrib_kubernetes import _installer

    marks = [tmp_path / "ran-comment", tmp_path / "ran-name"]
    conf = tmp_path / "config.toml"
    conf.write_text(f'version = 2\n# $(touch {marks[0]})\n[plugins."io.containerd.grpc.v1.cri".containerd]\n'
                    f'  default_runtime_name = "x`touch {marks[1]}`$(touch {marks[1]})"\n')
    before = conf.read_text()
    done = _installer(tmp_path, "containerd_config", GATEWRAP_HOST="", GATEWRAP_CONTAINERD_CONFIG=str(conf))
    ran = [m.name for m in marks if m.exists()]
    held = not ran and conf.read_text() == before and "left unchanged" in done.stderr
    outcome("install.sh: the config's text as data (printf '%s', grep -F, no eval)",
            f"ran: {ran or 'nothing'}; config {'unchanged' if conf.read_text() == before else 'changed'}",
            "held" if held else "OPEN")
    assert held, done.stderr


# --- gatewrap stop: whom it signals -------------------------------------------------------

def test_gatewrap_stop_signals_only_the_runs_processes_whatever_their_pid_namespaces(podman, outcome):  # noqa: F811
    """gatewrap stop of a container with a pid namespace of its own inside (a second "first process"), beside a host
    process that is pid 1 of another pid namespace"""
    victim = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "sleep", "120"])
    # the run's second "first process": the container's root made it itself with a user namespace
    # before seal_namespaces; the host's root puts one in the run's cgroup here
    inner = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "sleep", "300"])
    c = podman("-d", "--network", "none", cmd=["sleep", "300"])
    assert c.returncode == 0, c.stderr
    try:
        leaf = f"/sys/fs/cgroup/unified/gatewrap/{c.run_id}"
        deadline = time.monotonic() + 30
        while not open(f"{leaf}/cgroup.procs").read().split():
            assert time.monotonic() < deadline, "the container's process never appeared in its run's cgroup"
            time.sleep(0.2)
        while not open(f"/proc/{inner.pid}/task/{inner.pid}/children").read().split():
            assert time.monotonic() < deadline, "unshare's child never started"
            time.sleep(0.05)
        for pid in [inner.pid, *open(f"/proc/{inner.pid}/task/{inner.pid}/children").read().split()]:
            with open(f"{leaf}/cgroup.procs", "w") as f:
                f.write(str(pid))
        assert len(open(f"{leaf}/cgroup.procs").read().split()) >= 3
        p = _gw("stop", "--timeout", "2", "--json", c.run_id)
        stopped = json.loads(p.stdout) if p.returncode == 0 else {}
        alive = victim.poll() is None
        gone = not os.path.exists(leaf)
        held = alive and gone and stopped.get("stopped") is True
        outcome("gatewrap stop: pidfds of the run's cgroup.procs, each checked in the cgroup once open; cgroup.kill",
                f"stop: {stopped.get('signal') or p.stderr.strip()[-120:]}; the host's pid-1-of-its-namespace process "
                f"{'alive' if alive else 'KILLED'}; the run's cgroup {'gone' if gone else 'left'}",
                "held" if held else "OPEN")
        assert held, (p.stdout, p.stderr[-1000:], alive, gone)
    finally:
        subprocess.run([*podman_base(), "rm", "-f", "-t", "0", c.id], capture_output=True, timeout=60)
        for p in (victim, inner):
            p.kill()
            p.wait()
