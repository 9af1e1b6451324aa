"""What ``gatewrap-oci create`` checks and changes in a bundle's ``config.json`` (OCI
runtime-spec 1.0.2, config.md and config-linux.md).

Checked first (:func:`refusals`), so that a container that could undo its sandbox is refused
before anything is set up: capabilities beyond Docker's default set (``--privileged``,
``--cap-add SYS_ADMIN``: with CAP_SYS_ADMIN or CAP_BPF the container's root could detach the
hooks or leave its cgroup), no seccomp profile (``--security-opt seccomp=unconfined``: the
profile is what refuses AF_VSOCK, which no cgroup hook sees), bind mounts of the host's
cgroup or BPF file systems or gatewrap's state, and a systemd-managed cgroup.

Changed (:func:`confine`): the network namespace (the run's, with only ``lo`` and the gate;
``--network host`` gets it too), ``linux.cgroupsPath`` (the run's leaf under ``gatewrap/``,
where the hooks are attached), the environment (the proxy and CA variables, the shims) and
read-only bind mounts of the run's staged shims, resolv.conf and hosts.
"""

from __future__ import annotations

import os
from typing import Any

#: Docker's and Podman's default capabilities (moby oci/caps/defaults.go; containers.conf
#: default_capabilities): a container with these cannot touch BPF, cgroups or namespaces.
DEFAULT_CAPS = frozenset(f"CAP_{c}" for c in (
    "CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "NET_RAW", "SETGID", "SETUID", "SETFCAP",
    "SETPCAP", "NET_BIND_SERVICE", "SYS_CHROOT", "KILL", "AUDIT_WRITE"))
#: Host paths no container may have bound in (nor a folder holding one): the pins, the
#: daemon's socket and runs, gatewrap's state (approvals, CA key, audit signing key).
HIDDEN = ("/sys/fs/bpf", "/sys/fs/cgroup", "/run/gatewrap", "/var/lib/gatewrap", "/proc")
#: Mount types that would give the container the cgroup tree or bpffs anew.
REFUSED_TYPES = {"bpf", "cgroup2"}
#: Annotations (config.md "Annotations") a container names its policy with.
POLICY_ANNOTATION = "gatewrap.policy"
ALLOW_ANNOTATION = "gatewrap.allow"


def refusals(config: dict[str, Any], systemd_cgroup: bool = False) -> list[str]:
    """Why the container must not run in a gatewrap sandbox (empty: it may), one sentence each."""
    out = []
    if systemd_cgroup:
        out.append("--systemd-cgroup: gatewrap places the container's cgroup under its own gatewrap/ parent; "
                   "use the cgroupfs manager (podman --cgroup-manager=cgroupfs; dockerd's "
                   "native.cgroupdriver=cgroupfs)")
    caps = (config.get("process") or {}).get("capabilities") or {}
    extra = sorted({c for kind in caps.values() for c in (kind or [])} - DEFAULT_CAPS)
    if extra:
        out.append(f"capabilities beyond the default set ({', '.join(extra)}; --privileged or --cap-add): "
                   "with them the container's root could detach gatewrap's hooks or leave its cgroup")
    if not (config.get("linux") or {}).get("seccomp"):
        out.append("no seccomp profile (--privileged or seccomp=unconfined): the profile is what refuses "
                   "AF_VSOCK sockets, which no cgroup hook sees")
    for m in config.get("mounts") or []:
        if m.get("type") in REFUSED_TYPES:
            out.append(f"a {m['type']} mount at {m.get('destination')}")
        elif "bind" in (m.get("options") or []) or m.get("type") == "bind":
            src = os.path.normpath(m.get("source") or "/")
            if any(src == h or h.startswith(src.rstrip("/") + "/") or src.startswith(h + "/") for h in HIDDEN):
                out.append(f"a bind mount of the host's {src} (it holds or is in one of {', '.join(HIDDEN)})")
    return out


def policy_of(config: dict[str, Any]) -> tuple[str | None, list[str]]:
    """(the ``gatewrap.policy`` path or None, the hosts of ``gatewrap.allow``)."""
    notes = config.get("annotations") or {}
    allow = [h.strip() for h in notes.get(ALLOW_ANNOTATION, "").split(",") if h.strip()]
    return notes.get(POLICY_ANNOTATION) or None, allow


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
    prepended), and ``mounts`` as (host path, container path) read-only binds replacing any
    mount at the same destination."""
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
    return config
