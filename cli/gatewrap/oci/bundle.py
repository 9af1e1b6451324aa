"""What ``gatewrap-oci create`` checks and changes in a bundle's ``config.json`` (OCI
runtime-spec 1.0.2, config.md and config-linux.md).

Checked first (:func:`refusals`), so that a container that could undo its sandbox or reach
the host is refused before anything is set up: capabilities beyond Docker's default set
(``--privileged``, ``--cap-add SYS_ADMIN``: with CAP_SYS_ADMIN or CAP_BPF the container's
root could detach the hooks or leave its cgroup), the host's pid or mount namespace, block
devices, mount types beyond the engines' own, binds (resolved as runc resolves them) of the
host's cgroup, BPF, proc or sys file systems or of gatewrap's state, of a host unix socket
that the ``gatewrap.unix_sockets`` annotation does not name, and a systemd-managed cgroup. The container's root is the host's uid 0 (no user namespace): what it may write,
it may write as root.

Changed (:func:`confine`): the network namespace (the run's, with only ``lo`` and the gate;
``--network host`` gets it too), ``linux.cgroupsPath`` (the run's leaf under ``gatewrap/``,
where the hooks are attached), the environment (the proxy and CA variables, the shims) and
read-only bind mounts of the run's staged shims, resolv.conf and hosts, the engines' masked
and read-only paths (kept whatever the container asks); and the seccomp
profile (:func:`seal_vsock`), so that socket(AF_VSOCK) fails: no cgroup hook sees AF_VSOCK,
which reaches the hypervisor's host from any netns (KERNEL-NOTES), and the engines' default
profiles allow it (podman 4.3's, measured); and so that the container makes no user or
cgroup namespace of its own (:func:`seal_namespaces`), in which its root could rewrite the
run's cgroup v1 bounds on its own leaf.
"""

from __future__ import annotations

import json
import os
import re
import stat
from typing import Any

from ..sandbox import view

#: Docker's and Podman's default capabilities (moby oci/caps/defaults.go; containers.conf
#: default_capabilities): a container with these cannot touch BPF, cgroups or namespaces.
DEFAULT_CAPS = frozenset(f"CAP_{c}" for c in (
    "CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "NET_RAW", "SETGID", "SETUID", "SETFCAP",
    "SETPCAP", "NET_BIND_SERVICE", "SYS_CHROOT", "KILL", "AUDIT_WRITE"))
#: Host paths no container may have bound in (nor a folder holding one): the pins, the
#: daemon's socket and runs, gatewrap's state (approvals, CA key, audit signing key).
HIDDEN = ("/sys/fs/bpf", "/sys/fs/cgroup", "/run/gatewrap", "/var/lib/gatewrap", "/proc")
#: File systems no bind may come from, wherever they are mounted (a volume or a bind of a
#: bind names them by another path): the pins, the cgroup tree, the host's processes and
#: kernel knobs (proc(5), sysfs(5)) and the kernel's debugging file systems.
HIDDEN_FS = {"bpf", "cgroup", "cgroup2", "proc", "sysfs", "debugfs", "tracefs", "securityfs"}
#: The mount types a container may have (default-deny: what the engines' own configs hold,
#: docker 20.10, podman 4.3, containerd 1.6); any other (``ext4`` of the host's disk, a new
#: ``bpf`` or ``cgroup2``, ``overlay`` of host folders) is refused. ``proc`` only at /proc
#: (where the masked and read-only paths are, :data:`MASKED`), ``sysfs`` and ``cgroup`` only
#: read-only (as the engines mount them for a container that is not privileged).
MOUNT_TYPES = {"bind", "none", "proc", "sysfs", "tmpfs", "devpts", "mqueue", "cgroup"}
READ_ONLY_TYPES = {"sysfs", "cgroup"}
#: Namespaces a container must have of its own (or another container's, by path), never the
#: host's: with the host's pid namespace its root (CAP_KILL, uid 0) could signal gatewrap's
#: daemon and gate; with the host's mount namespace it has the host's files. (The network
#: namespace is always replaced by the run's; sharing the host's ipc, uts, user or cgroup
#: namespace reaches nothing of gatewrap's.) linux.namespaces type -> /proc/<pid>/ns/ name.
OWN_NAMESPACES = {"pid": "pid", "mount": "mnt"}
#: The fields config.json may have, at its top and in ``linux`` (runtime-spec 1.0.2 config.md,
#: config-linux.md; default-deny): a field this list lacks, such as runtime-spec 1.2's
#: ``linux.netDevices`` (a host interface moved into the container's network namespace, the
#: run's, by a runc that knows it), is refused rather than passed on unchecked.
CONFIG_FIELDS = {"ociVersion", "process", "root", "hostname", "domainname", "mounts", "hooks", "annotations", "linux"}
LINUX_FIELDS = {"namespaces", "uidMappings", "gidMappings", "devices", "cgroupsPath", "resources", "rootfsPropagation",
                "seccomp", "sysctl", "maskedPaths", "readonlyPaths", "mountLabel", "intelRdt", "personality"}
#: Annotations (config.md "Annotations") a container names its policy with.
POLICY_ANNOTATION = "gatewrap.policy"
ALLOW_ANNOTATION = "gatewrap.allow"
#: The annotation naming the host's unix sockets (comma-separated paths) a container may
#: have bound in: any other socket bound in is refused.
SOCKETS_ANNOTATION = "gatewrap.unix_sockets"


def refusals(config: dict[str, Any], systemd_cgroup: bool = False, bundle_dir: str = ".") -> list[str]:
    """Why the container must not run in a gatewrap sandbox (empty: it may), one sentence
    each. ``bundle_dir``: where runc resolves a relative mount source (it runs there).

    Raises:
        TypeError, AttributeError, ValueError: ``config`` is not shaped as the runtime-spec says.
    """
    out = []
    if systemd_cgroup:
        out.append("--systemd-cgroup: gatewrap places the container's cgroup under its own gatewrap/ parent; "
                   "use the cgroupfs manager (podman --cgroup-manager=cgroupfs; dockerd's "
                   "native.cgroupdriver=cgroupfs)")
    unknown = sorted(set(config) - CONFIG_FIELDS) + [f"linux.{k}" for k in sorted(set(config.get("linux") or {}) - LINUX_FIELDS)]
    if unknown:
        out.append(f"config.json fields gatewrap-oci does not know ({', '.join(unknown)}; it knows runtime-spec 1.0.2's "
                   "for Linux): what they would do is not checked")
    notes = config.get("annotations") or {}
    theirs = sorted(k for k in notes if k.startswith("gatewrap.")
                    and k not in (POLICY_ANNOTATION, ALLOW_ANNOTATION, SOCKETS_ANNOTATION))
    if theirs:
        out.append(f"annotations gatewrap does not know ({', '.join(theirs)}): it reads {POLICY_ANNOTATION}, "
                   f"{ALLOW_ANNOTATION} and {SOCKETS_ANNOTATION} (a misspelt one would leave the container the "
                   "default policy)")
    sockets = set(unix_sockets_of(config))
    extra = beyond_default_caps((config.get("process") or {}).get("capabilities") or {})
    if extra:
        out.append(f"capabilities beyond the default set ({', '.join(extra)}; --privileged or --cap-add): "
                   "with them the container's root could detach gatewrap's hooks or leave its cgroup")
    out += _namespace_refusals((config.get("linux") or {}).get("namespaces") or [])
    out += _device_refusals(config.get("linux") or {})
    out += _seccomp_refusals((config.get("linux") or {}).get("seccomp") or {})
    table = _mount_table()
    hidden = [(h, _place(os.path.realpath(h), table)) for h in HIDDEN]
    for m in config.get("mounts") or []:
        out += _mount_refusals(m, bundle_dir, table, hidden, sockets)
    return out


def beyond_default_caps(caps: dict[str, Any]) -> list[str]:
    """The capabilities of ``caps`` (runtime-spec ``process.capabilities``: set name -> names)
    that are not in :data:`DEFAULT_CAPS`, sorted."""
    return sorted({c for kind in caps.values() for c in (kind or [])} - DEFAULT_CAPS)


def _same_file(a: str, b: str) -> bool:
    sa, sb = os.stat(a), os.stat(b)
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _namespace_refusals(namespaces: list[dict[str, Any]]) -> list[str]:
    out = []
    for kind, proc_name in OWN_NAMESPACES.items():
        mine = [n for n in namespaces if n.get("type") == kind]
        if not mine:
            flag = "--pid host" if kind == "pid" else kind
            out.append(f"no {kind} namespace: the container would share the host's ({flag}); "
                       "its root could reach gatewrap's daemon, gate or files")
            continue
        path = mine[-1].get("path")
        if not path:
            continue
        try:
            host = _same_file(path, f"/proc/self/ns/{proc_name}")  # gatewrap-oci runs in the engine's: the host's
        except OSError as e:
            out.append(f"the {kind} namespace {path} cannot be checked ({e.strerror})")
            continue
        if host:
            out.append(f"the host's {kind} namespace ({path}): its root could reach gatewrap's daemon, gate or files")
    return out


def _device_refusals(linux: dict[str, Any]) -> list[str]:
    """Block devices: with one (or with a device cgroup rule that lets it open block devices,
    and CAP_MKNOD, a default capability) the container's root reads the host's disks, and on
    them gatewrap's state. Character devices stay (those that matter need capabilities)."""
    out = []
    block = [str(d.get("path")) for d in linux.get("devices") or [] if d.get("type") == "b"]
    if block:  # --privileged lists every one of the host's: named up to 3, then counted
        named = ", ".join(block[:3]) + (f" and {len(block) - 3} more" if len(block) > 3 else "")
        out.append(f"block devices ({named}; --device, --privileged): its root could read the host's disks")
    for rule in (linux.get("resources") or {}).get("devices") or []:
        if rule.get("allow") and rule.get("type", "a") in ("a", "b") and set(rule.get("access") or "rwm") & {"r", "w"}:
            out.append(f"a device cgroup rule allowing block devices ({rule.get('type', 'a')} "
                       f"{rule.get('major', '*')}:{rule.get('minor', '*')} {rule.get('access') or 'rwm'}; "
                       "--device or --device-cgroup-rule): its root could read the host's disks")
    return out


def _seccomp_refusals(profile: dict[str, Any]) -> list[str]:
    """A profile whose default action lets calls through but is not SCMP_ACT_ALLOW (LOG,
    TRACE, NOTIFY): what :func:`seal_vsock` and :func:`seal_namespaces` refuse would need
    rules beside the profile's allowing ones that libseccomp 2.5.4 refuses (EEXIST, measured
    with runc 1.1.5 on podman's profile, default SCMP_ACT_LOG), and under TRACE a tracer of
    the container's own runs every call no rule names."""
    default = profile.get("defaultAction")
    if default is None or default == "SCMP_ACT_ALLOW" or not _lets_through(default):
        return []
    return [f"a seccomp profile whose default action is {default}: it lets calls through (a tracer in the container, "
            "a listener or the log decides), and gatewrap-oci seals only a profile whose default refuses or is "
            "SCMP_ACT_ALLOW (use one of those, e.g. the engine's default profile)"]


def _path_holds(a: str, b: str) -> bool:
    """Whether path ``a`` is ``b`` or a folder holding it (both normalised, absolute)."""
    return a == b or b.startswith(a.rstrip("/") + "/")


def _mount_refusals(m: dict[str, Any], bundle_dir: str, table: list[tuple[str, str, str, str]],
                    hidden: list[tuple[str, tuple[str, str, str] | None]], sockets: set[str]) -> list[str]:
    """Why mount ``m`` must not be (empty: it may); ``table``: :func:`_mount_table`,
    ``hidden``: each of :data:`HIDDEN` with its :func:`_place`; ``sockets``: the real paths of
    the unix sockets :data:`SOCKETS_ANNOTATION` names."""
    kind, options, dst = m.get("type") or "none", m.get("options") or [], m.get("destination")
    if kind not in MOUNT_TYPES:
        article = "an" if kind[:1] in "aeiou" else "a"
        return [f"{article} {kind} mount at {dst} (gatewrap-oci allows {', '.join(sorted(MOUNT_TYPES))} mounts)"]
    if kind == "proc" and os.path.normpath(dst or "/") != "/proc":
        return [f"a proc mount at {dst}: only /proc has the masked and read-only paths"]
    if kind in READ_ONLY_TYPES and "ro" not in options:
        return [f"a read-write {kind} mount at {dst}"]
    if kind != "bind" and not {"bind", "rbind"} & set(options):
        return []
    # runc runs in the bundle (a relative source is the bundle's) and mount(2) follows symlinks.
    src = os.path.realpath(os.path.join(bundle_dir, m.get("source") or "/"))
    if any(_path_holds(src, h) or _path_holds(h, src) for h in HIDDEN):
        return [f"a bind mount of the host's {src} (it holds or is in one of {', '.join(HIDDEN)})"]
    try:
        is_socket = stat.S_ISSOCK(os.stat(src).st_mode)
    except OSError:
        is_socket = False
    if is_socket and src not in sockets:
        return [f"a bind mount of the host's unix socket {src} at {dst}: through it the container's root talks to a "
                "host daemon, outside the gate (docker.sock starts containers of another runtime); name it in the "
                f"{SOCKETS_ANNOTATION} annotation to bind it anyway"]
    held = _unnamed_socket_in(src, sockets) if not is_socket and os.path.isdir(src) else None
    if held:
        return [f"a bind mount of the host's {src} at {dst}, which holds " + (
                f"the host's unix socket {held}: through it the container's root talks to a host daemon, outside the "
                f"gate; name the socket in the {SOCKETS_ANNOTATION} annotation to bind the folder anyway"
                if held.startswith("/") else held)]
    place = _place(src, table)
    if place is None:
        return []
    if place[2] in HIDDEN_FS:
        return [f"a bind mount of the host's {src}, on a {place[2]} file system"]
    # A bind of a bind (a volume made with o=bind, device=/run/gatewrap) is the same folder of
    # the same file system under another path: compared by (device, path in the file system).
    for h, there in hidden:
        if there and there[0] == place[0] and (_path_holds(place[1], there[1]) or _path_holds(there[1], place[1])):
            return [f"a bind mount of the host's {src}, which is (or holds, or is in) the host's {h} under another path"]
    return []


#: Most entries :func:`_unnamed_socket_in` looks at in one bound folder (about 0.05 s a
#: 100,000 here: :func:`gatewrap.sandbox.view.scan_sockets` reads each type from the listing).
MAX_WALK = 1_000_000


def _unnamed_socket_in(folder: str, sockets: set[str]) -> str | None:
    """The first unix socket under ``folder`` (a real path; symbolic links not followed: in
    the container they lead into its own view) that ``sockets`` does not name; or, when
    ``folder`` has more than :data:`MAX_WALK` entries, a sentence saying so (unchecked is
    refused); None when it holds none. A socket made there after this look is not seen."""
    found, whole = view.scan_sockets([folder], limit=MAX_WALK)
    unnamed = [f for f in found if f not in sockets]
    if unnamed:
        return unnamed[0]
    if not whole:
        return f"more than {MAX_WALK:,} entries, too many to look for the host's unix sockets in (bind a smaller folder)"
    return None


def _mount_table() -> list[tuple[str, str, str, str]]:
    """(mount point, device major:minor, root of the mount in its file system, type) of each
    mount of /proc/self/mountinfo (proc(5): fields 5, 3 and 4; the type follows ``-``), in its
    order (a later mount at the same point covers an earlier one); empty if unreadable."""
    def unescape(field: str) -> str:
        return re.sub(r"\\([0-7]{3})", lambda o: chr(int(o[1], 8)), field)
    out = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields, _, rest = line.partition(" - ")
                parts = fields.split(" ")
                out.append((unescape(parts[4]), parts[2], unescape(parts[3]), rest.split(" ")[0]))
    except (OSError, IndexError):
        return []
    return out


def _place(path: str, table: list[tuple[str, str, str, str]]) -> tuple[str, str, str] | None:
    """(device, path in its file system, file system type) of ``path`` (a real path): the
    deepest mount holding it in ``table`` (:func:`_mount_table`); None if none does."""
    best = None
    for point, dev, root, fs in table:
        if _path_holds(point, path) and (best is None or len(point) >= len(best[0])):
            best = (point, dev, root, fs)
    if best is None:
        return None
    rest = os.path.relpath(path, best[0])
    return best[1], os.path.normpath(os.path.join(best[2], "" if rest == "." else rest)), best[3]


def policy_of(config: dict[str, Any]) -> tuple[str | None, list[str]]:
    """(the ``gatewrap.policy`` path or None, the hosts of ``gatewrap.allow``)."""
    notes = config.get("annotations") or {}
    allow = [h.strip() for h in notes.get(ALLOW_ANNOTATION, "").split(",") if h.strip()]
    return notes.get(POLICY_ANNOTATION) or None, allow


def unix_sockets_of(config: dict[str, Any]) -> list[str]:
    """The host unix sockets :data:`SOCKETS_ANNOTATION` names (comma-separated), as real paths
    (realpath(3): what a bind mount of them resolves to), sorted, each once."""
    notes = config.get("annotations") or {}
    return sorted({os.path.realpath(p.strip()) for p in str(notes.get(SOCKETS_ANNOTATION, "")).split(",") if p.strip()})


def engine_bounds(config: dict[str, Any]) -> dict[str, int | None]:
    """The bounds the engine set (``linux.resources``, config-linux.md): ``{"pids": tasks,
    "memory": bytes}``, None where it set none (absent, or 0 or below: unlimited, as runc
    reads -1 and docker's ``--pids-limit 0``)."""
    res = (config.get("linux") or {}).get("resources") or {}
    out: dict[str, int | None] = {}
    for key, got in (("pids", (res.get("pids") or {}).get("limit")), ("memory", (res.get("memory") or {}).get("limit"))):
        out[key] = got if isinstance(got, int) and not isinstance(got, bool) and got > 0 else None
    return out


def policy_refusal(config: dict[str, Any], policy: str, bundle_dir: str = ".") -> str | None:
    """Why ``policy`` (a policy file's host path) must not be this container's (None: it may
    be): it lies in a folder bound into the container read-write, where the container's root,
    the host's uid 0, could rewrite it (root's still, so :func:`gatewrap.oci.runs.checked_policy_file`
    passes it) for the run's ``gatewrap reload``."""
    real = os.path.realpath(policy)
    for m in config.get("mounts") or []:
        if m.get("type") != "bind" and not {"bind", "rbind"} & set(m.get("options") or []):
            continue
        if "ro" in (m.get("options") or []):
            continue
        src = os.path.realpath(os.path.join(bundle_dir, m.get("source") or "/"))
        if real == src or real.startswith(src.rstrip("/") + "/"):
            return (f"the policy {policy} is in {src}, bound into the container read-write at {m.get('destination')}: "
                    "its root could rewrite it; keep policies out of what containers have bound, or bind it read-only")
    return None


def container_uid(config: dict[str, Any]) -> int:
    """The uid the container's process runs as (``process.user.uid``; 0 if unset)."""
    return int(((config.get("process") or {}).get("user") or {}).get("uid", 0))


#: Variables whose container value is kept after gatewrap's (a search path), and the separator.
JOINED = {"PYTHONPATH": ":", "NODE_OPTIONS": " "}


def confine(config: dict[str, Any], netns: str, cgroups_path: str, env: dict[str, str],
            mounts: list[tuple[str, str]]) -> dict[str, Any]:
    """``config`` changed to run in the sandbox: the network namespace ``netns`` (a path
    runc opens and joins, setns(2)), ``cgroups_path`` (runc's ``linux.cgroupsPath``, relative
    to each hierarchy's root), ``env`` over the container's own (:data:`JOINED` ones
    prepended), ``mounts`` as (host path, container path) read-only binds replacing any
    mount at the same destination, and the engines' masked and read-only paths
    (:data:`MASKED`, :data:`READ_ONLY`) added to the container's own."""
    linux = config.setdefault("linux", {})
    spaces = [n for n in linux.get("namespaces") or [] if n.get("type") != "network"]
    linux["namespaces"] = [*spaces, {"type": "network", "path": netns}]
    linux["cgroupsPath"] = cgroups_path
    process = config.setdefault("process", {})
    own = dict(e.partition("=")[::2] for e in process.get("env") or [])
    for name, value in env.items():
        if name in JOINED and own.get(name):
            value = value + JOINED[name] + own[name]
        own[name] = value
    process["env"] = [f"{k}={v}" for k, v in own.items()]
    ours = {dst for _, dst in mounts}
    kept = [m for m in config.get("mounts") or [] if m.get("destination") not in ours]
    config["mounts"] = kept + [{"destination": dst, "type": "bind", "source": src,
                                "options": ["rbind", "ro", "nosuid", "nodev"]} for src, dst in mounts]
    for key, ours in (("maskedPaths", MASKED), ("readonlyPaths", READ_ONLY)):
        theirs = linux.get(key) or []
        linux[key] = [*theirs, *(p for p in ours if p not in theirs)]
    return config


#: The engines' default masked and read-only paths (moby oci/defaults.go, containers/common
#: pkg/config): kept whatever the container asks (``--security-opt unmask=ALL``, docker's
#: ``systempaths=unconfined``), since the container's root is the host's uid 0: with
#: /proc/sys writable it sets kernel.core_pattern, which the host's kernel runs as root.
MASKED = ("/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats",
          "/proc/sched_debug", "/proc/scsi", "/sys/firmware", "/sys/fs/selinux", "/sys/dev/block")
READ_ONLY = ("/proc/asound", "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")


#: socket(2)'s AF_VSOCK (linux/socket.h) and the error a refused one gets (EAFNOSUPPORT), as
#: the launcher's seccomp filter answers it for a gatewrap run.
AF_VSOCK = 40
EAFNOSUPPORT = 97
#: The seccomp actions (config-linux.md) under which a call does not run. Every other one lets
#: it run: SCMP_ACT_ALLOW, SCMP_ACT_LOG (allowed, then logged), SCMP_ACT_TRACE (a ptrace
#: tracer decides, and any process of the container that may trace the caller can be one:
#: seccomp(2) SECCOMP_RET_TRACE), SCMP_ACT_NOTIFY (a listener decides), and any action this
#: list does not know.
_REFUSING = frozenset({"SCMP_ACT_ERRNO", "SCMP_ACT_TRAP", "SCMP_ACT_KILL", "SCMP_ACT_KILL_THREAD",
                       "SCMP_ACT_KILL_PROCESS"})


def _lets_through(action: Any) -> bool:
    """Whether a seccomp action lets the call run (not in :data:`_REFUSING`)."""
    return action not in _REFUSING


#: The rule added to a profile without one, and to a profile that allows everything by default.
_REFUSE_VSOCK = {"names": ["socket"], "action": "SCMP_ACT_ERRNO", "errnoRet": EAFNOSUPPORT,
                 "args": [{"index": 0, "value": AF_VSOCK, "op": "SCMP_CMP_EQ"}]}
#: The address families there are (linux/socket.h AF_MAX on Linux 6.x): socket(2) refuses the others.
AF_MAX = 46
#: socketcall(2) passes socket's arguments through a pointer, which seccomp cannot read: never allowed.
_OPAQUE = "socketcall"


def seal_vsock(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` whose seccomp profile refuses socket(AF_VSOCK) and socketcall(2): with no
    profile, one that allows everything else; with one, every rule that lets socket(2)
    through (any action but a refusal, :data:`_REFUSING`: LOG and TRACE too) is rewritten
    to do the same but for AF_VSOCK (:func:`_without_vsock`), so the call falls to the
    profile's default action (a refusal in the engines' profiles), or, where that default
    lets it through, to the added refusing rule.

    Raises:
        ValueError: a socket rule with a comparison operator the runtime-spec does not have.
    """
    linux = config.setdefault("linux", {})
    profile = linux.get("seccomp")
    if not profile:
        linux["seccomp"] = {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [
            _REFUSE_VSOCK, {"names": [_OPAQUE], "action": "SCMP_ACT_ERRNO", "errnoRet": EAFNOSUPPORT}]}
        return config
    syscalls = profile.get("syscalls") or []
    # The engines' refusing socket rules (podman's ERRNO for NETLINK_AUDIT without
    # CAP_AUDIT_WRITE) carve exceptions out of its allowing ones. libseccomp 2.5.4 refuses
    # (EEXIST) such a rule beside one EQ rule per family (measured with runc 1.1.5), so they
    # are dropped and what they refused is left out of the allowing rules instead: the call
    # then gets the profile's default action (a refusal, another errno).
    refusing = [r for r in syscalls if "socket" in (r.get("names") or []) and not _lets_through(r.get("action"))]
    rules: list[dict[str, Any]] = []
    seen = set()  # libseccomp refuses a rule added twice (EEXIST): rewritten rules can become equal
    for rule in syscalls:
        names = rule.get("names") or []
        if rule in refusing and profile.get("defaultAction") != "SCMP_ACT_ALLOW":
            if len(names) > 1:
                rules.append({**rule, "names": [n for n in names if n != "socket"]})
            continue
        if not _lets_through(rule.get("action")) or not ({"socket", _OPAQUE} & set(names)):
            rules.append(rule)
            continue
        rest = [n for n in names if n not in ("socket", _OPAQUE)]
        if rest:
            rules.append({**rule, "names": rest})
        if "socket" in names:
            for args in _without_vsock(rule.get("args") or []):
                if any(_overlaps(args, r.get("args") or []) for r in refusing):
                    continue
                key = json.dumps(args, sort_keys=True)
                if key not in seen:
                    seen.add(key)
                    rules.append({**rule, "names": ["socket"], "args": args})
    if _lets_through(profile.get("defaultAction")):
        rules += [_REFUSE_VSOCK, {"names": [_OPAQUE], "action": "SCMP_ACT_ERRNO", "errnoRet": EAFNOSUPPORT}]
    profile["syscalls"] = rules
    return config


#: clone(2)/unshare(2) flags of the namespaces a container may not make (linux/sched.h): its
#: own user namespace gives its root CAP_SYS_ADMIN there, enough to mount cgroup v1's pids
#: and memory anew and rewrite the bounds on its own leaf (its cgroup namespace's root; v1
#: has no nsdelegate). Docker's default profile refuses these (and every other namespace
#: flag) to a container without CAP_SYS_ADMIN; podman's allows them.
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUSER = 0x10000000
_OWN_NAMESPACES = CLONE_NEWUSER | CLONE_NEWCGROUP
EPERM, ENOSYS = 1, 38
#: clone(2)'s flags argument: the first on x86-64 and arm64, the second on s390 (clone(2) NOTES).
_CLONE_FLAGS = 1 if os.uname().machine.startswith("s390") else 0
_FLAGS_OF = {"clone": _CLONE_FLAGS, "unshare": 0}


def _refuse_own_namespaces() -> list[dict[str, Any]]:
    """Rules refusing (EPERM) clone(2)/unshare(2) with CLONE_NEWUSER or CLONE_NEWCGROUP, one
    per flag (a masked comparison says "all of the mask's bits", not "any"), and clone3(2)
    (its flags are in a struct seccomp cannot read) with ENOSYS, on which glibc and the
    language runtimes fall back to clone(2), as with Docker's profile."""
    return [*({"names": [name], "action": "SCMP_ACT_ERRNO", "errnoRet": EPERM,
               "args": [{"index": index, "value": flag, "valueTwo": flag, "op": "SCMP_CMP_MASKED_EQ"}]}
              for name, index in _FLAGS_OF.items() for flag in (CLONE_NEWUSER, CLONE_NEWCGROUP)),
            {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS}]


def seal_namespaces(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` whose seccomp profile refuses the container a user or cgroup namespace of
    its own (:data:`CLONE_NEWUSER`, :data:`CLONE_NEWCGROUP`): each rule that lets clone(2)
    or unshare(2) through (any action but a refusal, :data:`_REFUSING`: SCMP_ACT_LOG, and
    SCMP_ACT_TRACE, whose tracer may be the container's own process) is narrowed to the
    calls without those flags (:func:`_without_own_namespaces`), clone3(2) gets ENOSYS, and
    where the default action lets calls through (the profile :func:`seal_vsock` adds where
    there was none) refusing rules are added (:func:`_refuse_own_namespaces`). Call it
    after :func:`seal_vsock`.

    Raises:
        ValueError: a clone or unshare rule with a comparison operator the runtime-spec does not have.
    """
    profile = config.setdefault("linux", {}).setdefault("seccomp", {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": []})
    syscalls = profile.get("syscalls") or []
    allows = _lets_through(profile.get("defaultAction"))
    rules: list[dict[str, Any]] = []
    for rule in syscalls:
        names = rule.get("names") or []
        ours = [n for n in names if n in _FLAGS_OF or n == "clone3"]
        if not ours:
            rules.append(rule)
            continue
        rest = [n for n in names if n not in ours]
        if rest:
            rules.append({**rule, "names": rest})
        if not _lets_through(rule.get("action")):
            # a refusing rule stays (but clone3's: ours below)
            kept = [n for n in ours if n != "clone3"]
            if kept:
                rules.append({**rule, "names": kept})
            continue
        for name in ours:
            if name == "clone3":
                continue
            args = _without_own_namespaces(rule.get("args") or [], _FLAGS_OF[name])
            if args is not None:
                rules.append({**rule, "names": [name], "args": args})
    refusing = _refuse_own_namespaces()
    rules += [r for r in refusing if allows or r["names"] == ["clone3"]]
    deduped: list[dict[str, Any]] = []
    for r in rules:  # libseccomp refuses a rule added twice (EEXIST)
        if r not in deduped:
            deduped.append(r)
    profile["syscalls"] = deduped
    return config


def _without_own_namespaces(args: list[dict[str, Any]], index: int) -> list[dict[str, Any]] | None:
    """The conditions of a rule that allows what an allowing clone/unshare rule with ``args``
    allows, but a call whose flags (argument ``index``) hold :data:`_OWN_NAMESPACES`; None
    when no such rule can be written (then the call falls to the profile's refusing default).
    libseccomp keeps one comparison per argument: an existing masked comparison on the flags
    is widened to the namespace bits (Docker's clone rule already holds them), an equality
    kept when its value holds none of them."""
    on_flags = [a for a in args if a.get("index") == index]
    rest = [a for a in args if a.get("index") != index]
    if not on_flags:
        return [{"index": index, "value": _OWN_NAMESPACES, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}, *rest]
    if len(on_flags) > 1:
        return None
    (cond,) = on_flags
    op, value, two = cond.get("op"), int(cond.get("value", 0)), int(cond.get("valueTwo", 0))
    if op == "SCMP_CMP_MASKED_EQ" and not two & _OWN_NAMESPACES:
        return [{**cond, "value": value | _OWN_NAMESPACES}, *rest]
    if op == "SCMP_CMP_EQ" and not value & _OWN_NAMESPACES:
        return args
    _holds(cond, 0)  # raises on an operator the runtime-spec does not have
    return None


def _without_vsock(args: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The conditions of rules that allow what an allowing socket(2) rule with ``args``
    allows, but AF_VSOCK: one rule per address family the rule's domain conditions admit
    (EQ), with its other conditions. libseccomp 2.5.4 keeps one comparison per argument in
    a rule (a second on the domain is dropped), and refuses (EEXIST) a domain NE beside
    another rule's domain EQ (both measured with runc 1.1.5 on podman's profile): one EQ
    per family is the form it takes."""
    on_domain = [a for a in args if a.get("index") == 0]
    rest = [a for a in args if a.get("index") != 0]
    # The domain's comparison first: runc hands them to libseccomp in order, and the same
    # rules with it last were refused (EEXIST) beside the engines' ERRNO rule on the domain.
    return [[{"index": 0, "value": f, "op": "SCMP_CMP_EQ"}, *rest] for f in range(AF_MAX)
            if f != AF_VSOCK and all(_holds(c, f) for c in on_domain)]


def _holds(cond: dict[str, Any], value: int) -> bool:
    """Whether a seccomp comparison (config-linux.md: op, value, valueTwo) holds for ``value``.

    Raises:
        ValueError: an operator the runtime-spec does not have.
    """
    op, v, v2 = cond.get("op"), int(cond.get("value", 0)), int(cond.get("valueTwo", 0))
    tests = {"SCMP_CMP_EQ": value == v, "SCMP_CMP_NE": value != v, "SCMP_CMP_LT": value < v, "SCMP_CMP_LE": value <= v,
             "SCMP_CMP_GT": value > v, "SCMP_CMP_GE": value >= v, "SCMP_CMP_MASKED_EQ": (value & v) == v2}
    if op not in tests:
        raise ValueError(f"seccomp operator {op!r}")
    return tests[op]


def _overlaps(allowed: list[dict[str, Any]], refused: list[dict[str, Any]]) -> bool:
    """Whether a call could meet both conditions (``allowed``: one family's EQ first, as
    :func:`_without_vsock` makes them): false only when the family is not the refused rule's
    or a comparison of one is the exact opposite of the other's on the same argument."""
    family = allowed[0]["value"]
    if not all(_holds(c, family) for c in refused if c.get("index") == 0):
        return False
    for a in allowed[1:]:
        for r in refused:
            if a.get("index") == r.get("index") and a.get("value") == r.get("value") and {a.get("op"), r.get("op")} == {
                    "SCMP_CMP_EQ", "SCMP_CMP_NE"}:
                return False
    return True
