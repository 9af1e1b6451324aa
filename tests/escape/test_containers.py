"""Escape suite, containers (issue 22): a hostile container, and a careless or hostile
container creator, against ``gatewrap-oci`` on the real kernel with Debian's podman and runc.

Two kinds of vector:

- what the creator asks in ``config.json`` (flags of ``podman run``/``exec``, or a
  config.json written by hand, as ``ctr`` or a direct runc caller may): held when
  ``gatewrap-oci`` refuses it before anything is set up (exit 125, the reason on stderr), or
  when the container it runs cannot use it to get out;
- what the container's root then tries from inside (the same prelude as the other escape
  modules: one JSON line per attempt, with its errno).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from containers.conftest import (PODMAN_ROOT, PODMAN_RUN_FLAGS, PODMAN_RUNROOT, Container, dockerd, engine,  # noqa: F401
                                 image, oci_daemon, podman, podman_gatewrap, podman_image)
from gatewrap.oci import bundle

from .helpers import agent_code, attempts

pytestmark = pytest.mark.kernel

REFUSED = "gatewrap-oci: config.json refused before the run is set up"
#: The runtime as installed in this environment (as tests/containers/conftest.py names it).
OCI = str(Path(os.sys.executable).parent / "gatewrap-oci")
#: A block device of this machine's (the root file system's disk), for --device.
DISK = next((f"/dev/{d}" for d in ("vda", "sda", "nvme0n1", "xvda") if os.path.exists(f"/dev/{d}")), "/dev/vda")


#: In a flag, the path of a symbolic link to the host's /sys/fs/bpf the test makes.
LINK_TO_BPF = "LINK_TO_BPF"


# --- what the creator asks: refused before the container starts ---------------------------

@pytest.mark.parametrize("flags, why", [
    (["-v", "/var/run:/mnt"], "bind mount of the host's /run"),
    (["--mount", f"type=bind,src={LINK_TO_BPF},dst=/mnt"], "bind mount of the host's /sys/fs/bpf"),
    (["--pid", "host"], "no pid namespace"),
    (["--device", DISK], "block device"),
    (["--device-cgroup-rule", "b *:* rwm"], "block devices"),
    (["--cap-add", "DAC_READ_SEARCH"], "CAP_DAC_READ_SEARCH"),
    (["--cap-add", "NET_ADMIN"], "CAP_NET_ADMIN"),
], ids=["the host's /run bound through the /var/run symlink (the daemon's socket)",
        "a symlink to the host's /sys/fs/bpf bound in",
        "--pid host (the container's root could signal the daemon and the gate)",
        "--device of the host's disk (its root could read gatewrap's state off it)",
        "--device-cgroup-rule of every block device (then mknod, in the default capabilities)",
        "--cap-add DAC_READ_SEARCH (open_by_handle_at: the host's files through any bind)",
        "--cap-add NET_ADMIN"])
def test_a_container_creators_request_that_reaches_the_host_is_refused(podman, outcome, tmp_path, flags, why):
    (tmp_path / "link").symlink_to("/sys/fs/bpf")
    flags = [f.replace(LINK_TO_BPF, str(tmp_path / "link")) for f in flags]
    c = podman("--network", "none", *flags, cmd=["true"])
    refused = c.returncode != 0 and why in c.stderr
    outcome(REFUSED, f"refused, exit {c.returncode}" if refused else f"the container ran (exit {c.returncode})",
            "held" if refused else "OPEN")
    assert refused, c.stderr[-2000:]
    assert c.records() == []


@pytest.mark.parametrize("device", ["/run/gatewrap", "/var/lib/gatewrap"],
                         ids=["a podman volume made as a bind of /run/gatewrap (the daemons' sockets)",
                              "a podman volume made as a bind of /var/lib/gatewrap (the CA, state.db)"])
def test_a_volume_that_is_a_bind_of_gatewraps_state_is_refused(podman, outcome, device):
    """a podman volume made with -o type=none,o=bind,device=DEVICE (the bind's source is the volume's folder)"""
    os.makedirs(device, exist_ok=True)
    name = f"gwt-atk-{os.getpid()}-{device.rsplit('/', 1)[-1]}"
    base = engine("podman", "--root", PODMAN_ROOT, "--runroot", PODMAN_RUNROOT)
    subprocess.run([*base, "volume", "create", "--opt", "type=none", "--opt", "o=bind", "--opt", f"device={device}", name],
                   check=True, capture_output=True)
    try:
        c = podman("--network", "none", "-v", f"{name}:/mnt", cmd=["ls", "/mnt"])
    finally:
        subprocess.run([*base, "volume", "rm", "-f", name], capture_output=True)
    held = c.returncode != 0 and "bind mount of the host's" in c.stderr
    outcome(REFUSED, "refused" if held else f"ran; /mnt lists {c.stdout.split()[:6]}", "held" if held else "OPEN")
    assert held, (c.stdout, c.stderr[-1000:])


# --- config.json written by hand (ctr --mount, a direct runc caller): the same check --------

def _mount(**m):
    return {"process": {"capabilities": {"bounding": sorted(bundle.DEFAULT_CAPS)}},
            "linux": {"namespaces": [{"type": t} for t in ("pid", "mount", "ipc", "uts", "network")]},
            "mounts": [m]}


@pytest.mark.parametrize("cfg, why", [
    (_mount(destination="/mnt", type="none", source="/sys/fs/bpf", options=["rbind", "rw"]),
     "bind mount of the host's /sys/fs/bpf"),
    (_mount(destination="/mnt", source="/run/gatewrap", options=["rbind"]), "bind mount of the host's /run/gatewrap"),
    (_mount(destination="/mnt", type="bind", source="../../../../../../../../sys/fs/bpf", options=["bind"]),
     "bind mount of the host's /sys/fs/bpf"),
    (_mount(destination="/host", type="ext4", source=DISK, options=["rw"]), "an ext4 mount"),
    (_mount(destination="/mnt/proc", type="proc", source="proc"), "a proc mount at /mnt/proc"),
    (_mount(destination="/sys", type="sysfs", source="sysfs", options=["nosuid"]), "read-write sysfs"),
    (_mount(destination="/sys/fs/cgroup", type="cgroup", source="cgroup", options=["rw"]), "read-write cgroup"),
    ({"linux": {"namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "network")]}}, "no mount namespace"),
    ({"linux": {"namespaces": [{"type": "mount", "path": "/proc/self/ns/mnt"}, {"type": "pid"}]}},
     "the host's mount namespace"),
    ({"linux": {"namespaces": [{"type": "mount"}, {"type": "pid", "path": "/proc/self/ns/pid"}]}},
     "the host's pid namespace"),
    ({"linux": {"namespaces": [{"type": "mount"}, {"type": "pid"}], "devices": [
        {"path": "/dev/xda", "type": "b", "major": 254, "minor": 0}]}}, "block device"),
    ({"linux": {"namespaces": [{"type": "mount"}, {"type": "pid"}], "netDevices": {"eth0": {"name": "eth0"}}}},
     "linux.netDevices"),
    ({"linux": {"namespaces": [{"type": "mount"}, {"type": "pid"}]}, "vm": {"hypervisor": {"path": "/bin/sh"}}}, "vm"),
], ids=["a bind with type none and option rbind (ctr --mount type=none,options=rbind)",
        "a bind with no type, option rbind",
        "a bind whose source is relative to the bundle (runc resolves it there)",
        "the host's disk mounted by type (runc mounts what config.json says)",
        "a second procfs outside /proc (no masked or read-only paths there: /proc/sys/kernel/core_pattern)",
        "a read-write sysfs (/sys/kernel/uevent_helper)",
        "a read-write cgroup mount",
        "no mount namespace (the host's file system)",
        "the host's mount namespace joined by path",
        "the host's pid namespace joined by path",
        "a block device node in linux.devices",
        "linux.netDevices (runtime-spec 1.2: a host interface moved into the run's netns by a runc that knows it)",
        "a field of another platform (vm: a hypervisor to run)"])
def test_a_hand_written_config_that_reaches_the_host_is_refused(outcome, cfg, why):
    got = bundle.refusals(cfg, bundle_dir="/run/containerd/io.containerd.runtime.v2.task/ns/id")
    held = any(why in r for r in got)
    outcome(REFUSED, "refused: " + "; ".join(got) if held else f"passed ({got})",
            "held" if held else "OPEN")
    assert held, got


# --- the policy file: root's, but the container's root is the host's uid 0 ----------------

DENIED_FETCH = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "http://denied.test/"]
PERMISSIVE = 'version = 1\ndefault = "allow"\n'


@pytest.fixture
def policy_dir():
    """A root-owned folder (0755) holding a root-owned policy (0644) that denies everything."""
    d = Path(tempfile.mkdtemp(prefix="gwt-policies-"))
    d.chmod(0o755)
    (d / "policy.toml").write_text('version = 1\ndefault = "deny"\n')
    (d / "policy.toml").chmod(0o644)
    yield d
    subprocess.run(["rm", "-rf", str(d)])


def test_a_policy_file_in_a_folder_bound_read_write_into_its_own_container_is_refused(podman, outcome, policy_dir):
    """the container's own policy file in a folder bound into it read-write"""
    c = podman("--network", "none", "-v", f"{policy_dir}:/p", "--annotation", f"gatewrap.policy={policy_dir}/policy.toml",
               cmd=["sh", "-c", f"printf '{PERMISSIVE}' > /p/policy.toml"])
    held = c.returncode != 0 and "bound into the container read-write" in c.stderr
    outcome("gatewrap-oci: the policy's path against the container's binds",
            "refused" if held else f"ran; the policy now: {(policy_dir / 'policy.toml').read_text()!r}",
            "held" if held else "OPEN")
    assert held, c.stderr[-2000:]


@pytest.mark.xfail(strict=True, reason="the policy file is checked by owner and mode: a container that has its folder "
                   "bound read-write (root inside is the host's uid 0) rewrites it, root's still, for every later "
                   "container named to it; gatewrap-oci cannot see other containers' binds (keep policies out of "
                   "what containers have bound, or use user namespaces)")
def test_a_policy_file_rewritten_by_another_container_is_not_taken(podman, outcome, policy_dir):
    """another container rewrites a policy file (root's, 0644) in a folder bound into it read-write"""
    first = podman("--network", "none", "-v", f"{policy_dir}:/p", cmd=["sh", "-c", f"printf '{PERMISSIVE}' > /p/policy.toml"])
    assert first.returncode == 0, first.stderr
    c = podman("--network", "none", "--annotation", f"gatewrap.policy={policy_dir}/policy.toml", cmd=DENIED_FETCH)
    held = c.returncode != 0 or c.stdout == "403"
    outcome("gatewrap.policy: owner and mode checked (root's, 0644)",
            "refused or denied" if held else f"denied.test {c.stdout} under the rewritten policy", "held" if held else "OPEN")
    assert held, (c.stdout, c.stderr[-1000:])


# --- a host daemon's unix socket bound in (docker.sock, as devcontainers do) --------------

SOCKET_BINDS = {
    "socket": ("{path}", "/var/run/docker.sock"),
    "folder": ("{d}", "/var/run/docker/daemon.sock"),
    "symlink": ("{d}/link", "/var/run/docker.sock"),
    "relative": ("../../../..{path}", "/var/run/docker.sock"),
    "later": ("{d}", "/var/run/docker/daemon.sock"),
}


@pytest.mark.parametrize("how", [
    "socket", "folder", pytest.param("later", marks=pytest.mark.xfail(strict=True, reason="open: a bind of a folder is "
                                                            "checked only for the sockets it holds at create")),
    "symlink", "relative"],
    ids=["a host daemon's unix socket bound in (-v /var/run/docker.sock:/var/run/docker.sock)",
         "a host daemon's socket reached through a bind of its folder (-v /run/docker:/var/run/docker)",
         "a socket the host daemon makes in a bound folder after the container started (a daemon's restart)",
         "a symbolic link to a host daemon's socket bound in", "a relative source leading to it"])
def test_a_host_daemons_socket_bound_in_is_not_reachable(podman, outcome, how):  # noqa: F811
    """a host daemon's unix socket bound in, by its own path or another."""
    import socket
    import threading

    d = tempfile.mkdtemp(prefix="gwt-sock-")
    os.chmod(d, 0o755)
    path = os.path.join(d, "daemon.sock")
    server = socket.socket(socket.AF_UNIX)
    if how != "later":
        server.bind(path)
        server.listen(1)
    if how == "symlink":
        os.symlink(path, os.path.join(d, "link"))
    server.settimeout(30)
    heard: list[bytes] = []

    def serve():
        try:
            if how == "later":
                time.sleep(3)
                server.bind(path)
                server.listen(1)
            conn, _ = server.accept()
            heard.append(conn.recv(100))
            conn.close()
        except OSError:
            pass
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    source, inside = SOCKET_BINDS[how]
    target = os.path.dirname(inside) if how in ("folder", "later") else inside
    connect = (f"for _ in range(100):\n    if os.path.exists({inside!r}): break\n    time.sleep(0.1)\n"
               f"s = socket.socket(socket.AF_UNIX); s.connect({inside!r}); s.send(b'GET /containers/json HTTP/1.0')")
    try:
        c = podman("--network", "none", "-v", f"{source.format(d=d, path=path)}:{target}",
                   cmd=["python3", "-c", "import os, socket, time\n" + connect])
    finally:
        server.close()
        t.join(5)
        subprocess.run(["rm", "-rf", d])
    held = not heard
    outcome("gatewrap-oci: a bind of a host unix socket, unless gatewrap.unix_sockets names it",
            f"the host's listener read {heard[0]!r}" if heard else f"refused or not reached (exit {c.returncode}: "
            f"{c.stderr.strip()[-120:]})", "held" if held else "OPEN")
    assert held, c.stderr[-1000:]
    if how in ("socket", "folder"):
        said = f"unix socket {path}" if how == "socket" else f"holds the host's unix socket {path}"
        assert c.returncode != 0 and said in c.stderr and "gatewrap.unix_sockets" in c.stderr, c.stderr[-1000:]

# --- what the container's root tries from inside -----------------------------------------

#: The container's root tries the host's kernel knobs that run code as the host's root.
SYSCTL_WRITE = """
attempt('open /proc/sys/kernel/core_pattern for writing', lambda: os.close(os.open('/proc/sys/kernel/core_pattern', os.O_WRONLY)))
attempt('open /proc/sysrq-trigger for writing', lambda: os.close(os.open('/proc/sysrq-trigger', os.O_WRONLY)))
"""

#: A user, cgroup and mount namespace of the container's own, its root the host's uid 0 (the
#: container's root); the seccomp profile gatewrap-oci gives every container refuses it
#: (bundle.seal_namespaces).
OWN_NAMESPACES = """
CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUSER = 0x20000, 0x02000000, 0x10000000
def enter():
    check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWCGROUP))
    open('/proc/self/setgroups', 'w').write('deny')
    open('/proc/self/uid_map', 'w').write('0 0 1')
    open('/proc/self/gid_map', 'w').write('0 0 1')
attempt('unshare(user, cgroup, mount)', enter)
"""

#: The container's root, without seccomp, in its own namespaces (:data:`OWN_NAMESPACES`):
#: cgroupfs mounted anew, a child cgroup of its leaf, then a direct connect and bpf().
OWN_USERNS = OWN_NAMESPACES + """
os.makedirs('/tmp/cg', exist_ok=True)
attempt('mount cgroup2', lambda: check(libc.mount(b'none', b'/tmp/cg', b'cgroup2', 0, None)))
def move():
    os.makedirs('/tmp/cg/esc', exist_ok=True)
    open('/tmp/cg/esc/cgroup.procs', 'w').write(str(os.getpid()))
attempt('move into a child cgroup', move)
attempt('connect 198.51.100.148:80', lambda: sock(V4, TCP).connect(('198.51.100.148', 80)))
attempt('bpf(BPF_PROG_GET_NEXT_ID)', bpf, 11, struct.pack('=II', 0, 0))
"""

#: The container's root with the host's cgroup namespace: the cgroup tree it sees.
CGROUPNS_HOST = """
for path in ('/sys/fs/cgroup/unified/cgroup.procs', '/sys/fs/cgroup/pids/cgroup.procs', '/sys/fs/cgroup/memory/cgroup.procs'):
    attempt(f'write {path}', lambda: open(path, 'w').write(str(os.getpid())))
attempt('its cgroup', lambda: [l for l in open('/proc/self/cgroup').read().split() if l.startswith('0::')])
attempt('connect 198.51.100.148:80', lambda: sock(V4, TCP).connect(('198.51.100.148', 80)))
"""

#: Raw and packet sockets with the default capabilities (CAP_NET_RAW is one).
RAW = """
def ping():
    s = sock(V4, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    s.sendto(b'\\x08\\x00\\xf7\\xff\\x00\\x00\\x00\\x00', ('198.51.100.148', 0))
attempt('raw ICMP to 198.51.100.148', ping)
def packet():
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
    return sorted(n for _, n in socket.if_nameindex())
attempt('AF_PACKET socket: the interfaces it could send on', packet)
attempt('connect 198.51.100.148:80', lambda: sock(V4, TCP).connect(('198.51.100.148', 80)))
"""


#: The image has python3-minimal (no ctypes): the host's standard library (the same Debian
#: Python 3.11) and libffi, bound read-only, give the prelude its ctypes.
CTYPES = ["-v", "/usr/lib/python3.11:/usr/lib/python3.11:ro",
          "-v", "/usr/lib/x86_64-linux-gnu/libffi.so.8:/usr/lib/x86_64-linux-gnu/libffi.so.8:ro"]


#: Abstract unix sockets are per network namespace: those in the run's (the gate's?) that
#: accept a connection.
ABSTRACT = """
def abstract():
    names = [l.split()[-1] for l in open('/proc/net/unix').read().splitlines()[1:] if l.split()[-1].startswith('@')]
    for n in names:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(1)
        try:
            s.connect('\\0' + n[1:])
        except OSError:
            continue
        raise OSError(errno.EEXIST, 'connected to ' + n)
    return names
attempt('connect to the abstract unix sockets of its netns', abstract)
attempt('connect 198.51.100.148:80', lambda: sock(V4, TCP).connect(('198.51.100.148', 80)))
"""

#: The engine's /etc (and the staged shims' folder) under a tmpfs of the container's.
TMPFS = """
attempt('its resolv.conf', lambda: open('/etc/resolv.conf').read().split())
attempt('connect 198.51.100.148:80', lambda: sock(V4, TCP).connect(('198.51.100.148', 80)))
"""


#: The pins and the daemon's files, as the container's root sees the paths.
PINS = """
attempt('list /sys/fs/bpf', lambda: os.listdir('/sys/fs/bpf'))
attempt('list /run/gatewrap', lambda: os.listdir('/run/gatewrap'))
p = ctypes.create_string_buffer(b'/sys/fs/bpf/gatewrap')
attempt('bpf(BPF_OBJ_GET) /sys/fs/bpf/gatewrap', bpf, 7, struct.pack('=QII', ctypes.addressof(p), 0, 0))
attempt('its netns interfaces', lambda: sorted(n for _, n in socket.if_nameindex()))
attempt('connect 198.51.100.148:80', lambda: sock(V4, TCP).connect(('198.51.100.148', 80)))
"""


def _by_step(out: str) -> dict[str, dict]:
    return {a["step"]: a for a in attempts(out)}


@pytest.mark.parametrize("flags, body, expected", [
    (["--security-opt", "unmask=ALL"], SYSCTL_WRITE,
     {"open /proc/sys/kernel/core_pattern for writing": "EROFS", "open /proc/sysrq-trigger for writing": ("EROFS", "ENOENT")}),
    (["--security-opt", "seccomp=unconfined"], OWN_USERNS,
     {"connect 198.51.100.148:80": "EPERM", "bpf(BPF_PROG_GET_NEXT_ID)": "EPERM"}),
    (["--cgroupns", "host"], CGROUPNS_HOST,
     {"write /sys/fs/cgroup/unified/cgroup.procs": ("ENOENT", "EROFS"), "write /sys/fs/cgroup/pids/cgroup.procs": "EROFS",
      "write /sys/fs/cgroup/memory/cgroup.procs": "EROFS", "connect 198.51.100.148:80": "EPERM"}),
    (["--cap-add", "NET_RAW", "--sysctl", "net.ipv4.ping_group_range=0 0", "--sysctl", "net.ipv4.ip_forward=1"], RAW,
     {"raw ICMP to 198.51.100.148": "EPERM", "connect 198.51.100.148:80": "EPERM",
      "AF_PACKET socket: the interfaces it could send on": (None, "EPERM")}),
    ([], ABSTRACT, {"connect to the abstract unix sockets of its netns": None, "connect 198.51.100.148:80": "EPERM"}),
    (["--tmpfs", "/etc", "--tmpfs", "/run"], TMPFS, {"its resolv.conf": None, "connect 198.51.100.148:80": "EPERM"}),
    (["--network", "host", "--ipc", "host", "--uts", "host", "--userns", "host"], PINS,
     {"list /sys/fs/bpf": (None, "ENOENT"), "list /run/gatewrap": "ENOENT", "bpf(BPF_OBJ_GET) /sys/fs/bpf/gatewrap": "EPERM",
      "its netns interfaces": None, "connect 198.51.100.148:80": "EPERM"}),
], ids=["unmask=ALL: the container's root writes the host's core_pattern (runs code as the host's root)",
        "seccomp=unconfined: its own user namespace, cgroupfs mounted anew, a child cgroup, then connect and bpf",
        "--cgroupns host: the container's root writes cgroup.procs of the tree it sees",
        "NET_RAW and net sysctls: raw ICMP, AF_PACKET, a direct connect",
        "abstract unix sockets of the run's netns (the gate's, the daemon's)",
        "tmpfs over /etc and /run (the staged resolv.conf and shims)",
        "--network, --ipc, --uts and --userns host: the pins, the daemon's folder, bpf(BPF_OBJ_GET)"])
def test_what_the_containers_root_tries_from_inside_fails(podman, outcome, flags, body, expected):
    network = [] if "--network" in flags else ["--network", "none"]
    c = podman(*network, *CTYPES, *flags, cmd=["python3", "-c", agent_code(body)])
    got = _by_step(c.stdout)
    seen = {step: (got.get(step) or {}).get("errno", "no attempt") for step in expected}
    held = c.returncode == 0 and all(seen[s] in (e if isinstance(e, tuple) else (e,)) for s, e in expected.items())
    said = {s: seen[s] or repr((got.get(s) or {}).get("result")) for s in expected}
    outcome("container: " + (" ".join(flags) or "podman's defaults"), "; ".join(f"{s}: {said[s]}" for s in expected),
            "held" if held else "OPEN")
    assert held, (c.returncode, c.stdout, c.stderr[-2000:])
    assert not os.path.exists(f"/sys/fs/cgroup/unified/gatewrap/{c.run_id}"), "the run's leaf (and a child) stayed"
    if "its cgroup" in got:
        assert got["its cgroup"]["result"] == [f"0::/gatewrap/{c.run_id}"]
    if "list /sys/fs/bpf" in got:
        assert not got["list /sys/fs/bpf"]["result"] and got["its netns interfaces"]["result"] == ["lo"], got
    if "its resolv.conf" in got:  # the staged one, bound over the container's tmpfs
        words = got["its resolv.conf"]["result"]
        assert "gatewrap" in " ".join(words) and words[words.index("nameserver") + 1] == "127.0.0.1", words
    if "AF_PACKET socket: the interfaces it could send on" in got:  # only the run's netns: lo
        assert got["AF_PACKET socket: the interfaces it could send on"]["result"] in (None, ["lo"])


def test_io_uring_connect_from_a_container_without_seccomp_is_refused_by_the_hooks(podman, outcome, probe):
    """io_uring connect (IORING_OP_CONNECT) from a container without seccomp"""
    c = podman("--network", "none", "--security-opt", "seccomp=unconfined", "-v", f"{probe}:/probe:ro",
               cmd=["/probe", "uring-connect", "198.51.100.148", "80"])
    got = attempts(c.stdout)
    errno_ = got[0]["errno"] if got else f"no attempt ({c.stderr.strip()[-200:]})"
    outcome("cgroup/connect4 (io_uring's connect runs the same hook)", errno_, "held" if errno_ == "EPERM" else "OPEN")
    assert errno_ == "EPERM", (c.stdout, c.stderr[-1000:])
    assert c.records(event="direct_egress")


# --- exec into a running container --------------------------------------------------------

@pytest.fixture
def running(net, oci_daemon, podman_image, tmp_path):  # noqa: F811
    """A detached container (sleeping) with gatewrap-oci and no seccomp profile (which alone
    is held, above); yields (podman command, container)."""
    audit = tmp_path / "audit.jsonl"
    base = podman_gatewrap(oci_daemon, net, audit)
    p = subprocess.run([*base, "run", "-d", "--network", "none", "--security-opt", "seccomp=unconfined",
                        *PODMAN_RUN_FLAGS, *CTYPES, podman_image, "sleep", "120"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    cid = p.stdout.strip()
    yield base, Container(0, "", "", cid, audit)
    subprocess.run([*base, "rm", "-f", "-t", "0", cid], capture_output=True, timeout=60)


EXEC_PROBE = """
attempt('its cgroup', lambda: open('/proc/self/cgroup').read().strip().splitlines())
attempt('its netns interfaces', lambda: sorted(n for _, n in socket.if_nameindex()))
attempt('CapEff', lambda: [l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')][0])
attempt('connect 198.51.100.148:80', lambda: sock(V4, TCP).connect(('198.51.100.148', 80)))
attempt('bpf(BPF_PROG_GET_NEXT_ID)', bpf, 11, struct.pack('=II', 0, 0))
"""


def test_podman_exec_lands_in_the_runs_cgroup_and_netns(running, outcome):
    """podman exec into a running container (runc exec: does it join the run's cgroup and netns?)"""
    base, c = running
    p = subprocess.run([*base, "exec", c.id, "python3", "-c", agent_code(EXEC_PROBE)], capture_output=True, text=True,
                       timeout=60)
    got = _by_step(p.stdout)
    cgroup = got.get("its cgroup", {}).get("result") or []
    held = (p.returncode == 0 and any(line.endswith(f"/gatewrap/{c.run_id}") for line in cgroup)
            and got["its netns interfaces"]["result"] == ["lo"] and got["connect 198.51.100.148:80"]["errno"] == "EPERM")
    outcome("runc exec: the container's cgroup (the run's leaf) and netns",
            f"connect: {got.get('connect 198.51.100.148:80', {}).get('errno')}; interfaces "
            f"{got.get('its netns interfaces', {}).get('result')}", "held" if held else "OPEN")
    assert held, (p.stdout, p.stderr[-2000:])
    assert c.records(event="direct_egress"), "the exec'd process's direct connect has no record"


def test_podman_exec_privileged_is_refused(running, outcome):
    """podman exec --privileged into a container without seccomp (CAP_SYS_ADMIN and CAP_BPF in the run's cgroup)"""
    base, c = running
    p = subprocess.run([*base, "exec", "--privileged", c.id, "python3", "-c", agent_code(EXEC_PROBE)],
                       capture_output=True, text=True, timeout=60)
    got = _by_step(p.stdout)
    held = p.returncode != 0 and "capabilities beyond the default set" in p.stderr
    outcome("gatewrap-oci exec: process.json's capabilities checked",
            "refused" if held else f"ran with CapEff {got.get('CapEff', {}).get('result')}, "
            f"bpf(BPF_PROG_GET_NEXT_ID): {got.get('bpf(BPF_PROG_GET_NEXT_ID)', {}).get('errno', '?')}",
            "held" if held else "OPEN")
    assert held, (p.returncode, p.stdout, p.stderr[-2000:])


@pytest.mark.parametrize("flags, held_when", [
    ([], "ran"), (["--privileged"], "refused"), (["--cap-add", "SYS_ADMIN"], "refused")],
    ids=["docker exec (containerd's shim: runc exec --process FILE --detach)", "docker exec --privileged",
         "docker exec with a capability added by its process.json"])
def test_docker_exec_is_checked_as_docker_passes_it(dockerd, outcome, flags, held_when):  # noqa: F811
    docker, _ = dockerd
    p = subprocess.run([*docker, "run", "-d", "--runtime", "gatewrap", "--network", "none", image.NAME, "sleep", "60"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    cid = p.stdout.strip()
    try:
        if flags[:1] == ["--cap-add"]:  # docker exec has no --cap-add: the same process.json, by runc's own flag
            e = subprocess.run([OCI, "--root", "/run/gatewrap-tests-docker/exec/runtime-runc/moby", "exec", "--cap",
                                flags[1], cid, "true"], capture_output=True, text=True, timeout=60)
        else:
            e = subprocess.run([*docker, "exec", *flags, cid, "grep", "CapEff", "/proc/self/status"],
                               capture_output=True, text=True, timeout=60)
    finally:
        subprocess.run([*docker, "rm", "-f", cid], capture_output=True, timeout=60)
    said = e.stdout + e.stderr  # docker exec says the runtime's error on stdout
    got = "ran" if e.returncode == 0 else "refused" if "capabilities beyond the default set" in said else "failed"
    outcome("gatewrap-oci exec: process.json's and --cap's capabilities checked",
            f"{got}: {(e.stdout.strip() or e.stderr.strip())[-160:]}", "held" if got == held_when else "OPEN")
    assert got == held_when, (e.returncode, e.stdout, e.stderr[-1000:])


def test_runc_update_cannot_loosen_what_bounds_the_container(running, outcome):
    """runc update --pids-limit -1 of a container (as an engine's update calls it; podman 4.3's needs cgroup v2)"""
    base, c = running
    parent = "/sys/fs/cgroup/pids/gatewrap/pids.max"
    before = open(parent).read().strip()
    p = subprocess.run([OCI, "update", "--pids-limit", "-1", c.id], capture_output=True, text=True, timeout=60)
    after = open(parent).read().strip()
    leaf = open(f"/sys/fs/cgroup/pids/gatewrap/{c.run_id}/pids.max").read().strip()
    held = after == before != "max"
    outcome("cgroup v1 pids: the gatewrap/ parent's bound (runc update writes the container's leaf only)",
            f"update exit {p.returncode}; leaf pids.max {leaf}; gatewrap/ pids.max {after}", "held" if held else "OPEN")
    assert held, (p.stderr[-1000:], before, after)


# --- gatewrap-oci's own input: the container id, config.json ------------------------------


@pytest.mark.parametrize("container, config, why", [
    ("../../../../tmp/gwt-evil", "{}", "is not one runc accepts"),
    ("x" * 300, "{}", "is not one runc accepts"),
    ("gwt-malformed", "{not json", "is not a runtime-spec config.json"),
    ("gwt-list", "[1, 2]", "is not a runtime-spec config.json"),
    ("gwt-wrong-types", '{"mounts": [1], "linux": {"namespaces": [{"type": "pid"}, {"type": "mount"}]}}',
     "is not a runtime-spec config.json"),
    ("gwt-huge", '{"annotations": {"x": "' + "a" * (64 << 20) + '"}, "linux": {"namespaces": "pid"}}',
     "is not a runtime-spec config.json"),
], ids=["a container id with path traversal (names the registry's files)", "a container id of 300 characters",
        "a malformed config.json", "a config.json that is a list", "a mount that is not an object",
        "a 64 MiB config.json with a namespaces string"])
def test_a_hostile_container_id_or_config_is_refused_before_the_daemon_is_asked(tmp_path, outcome, container,
                                                                                   config, why):
    (tmp_path / "config.json").write_text(config)
    p = subprocess.run([OCI, "--gatewrap-socket", str(tmp_path / "no-daemon.sock"), "--gatewrap-runc", "/bin/false",
                        "create", "--bundle", str(tmp_path), container], capture_output=True, text=True, timeout=60)
    held = p.returncode == 125 and why in p.stderr and "Traceback" not in p.stderr
    said = p.stderr.strip().replace(str(tmp_path), "BUNDLE")[:160]
    outcome("gatewrap-oci create: checked before the daemon is asked", f"exit {p.returncode}: {said}",
            "held" if held else "OPEN")
    assert held, p.stderr[-2000:]


@pytest.mark.parametrize("command", ["restore", "run"],
                         ids=["runc restore (podman container restore: a container made without create)",
                              "runc run (create and start at once, without gatewrap-oci's create)"])
def test_a_container_made_without_create_is_refused(tmp_path, outcome, command):
    p = subprocess.run([OCI, "--gatewrap-runc", "/bin/false", command, "--bundle", str(tmp_path), "gwt-restored"],
                       capture_output=True, text=True, timeout=60)
    held = p.returncode == 125 and f"gatewrap-oci: {command}:" in p.stderr
    outcome("gatewrap-oci: the command refused", f"exit {p.returncode}: {p.stderr.strip()[:120]}", "held" if held else "OPEN")
    assert held, p.stderr
