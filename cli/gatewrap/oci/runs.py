"""The daemon's side of ``gatewrap-oci`` (:mod:`gatewrap.shared.daemon` routes the ops here):
a container's run, set up on ``create`` and torn down on ``delete``.

A container's run is a shared-mode run (:class:`gatewrap.runner.Sandbox`, as ``gatewrap run``
gets) whose agent runc starts: the daemon makes the run's cgroup leaf, configures the hooks
for it, makes the netns with the gate listening in it, stages the shims and writes
``run_start``; the answer tells ``gatewrap-oci`` what to write in the bundle's
``config.json`` (:func:`gatewrap.oci.bundle.confine`). No client connection stays open: the
run lives in the daemon (``Daemon.runs``) until ``container_delete``. If the daemon dies,
the container keeps its hooks and has no egress, and the next daemon's start (or ``gatewrap
gc``) removes the run: its cgroup is killed, which ends the container.

Ops (one JSON line each way, :mod:`gatewrap.shared.protocol`):

- ``{"op": "container_create", "container": ID, "policy": PATH | null, "allow": [HOST],
  "policy_source": "annotations" | "runtime flags", "argv": [the container's command], "uid": N, "audit_log": PATH | null, "resolvers": [IP], "public_ranges": [CIDR]}`` ->
  ``{"run": RUN_ID, "netns": PATH, "cgroups_path": PATH, "env": {NAME: VALUE},
  "mounts": [[HOST PATH, CONTAINER PATH]]}`` or ``{"error", "exit_code"}``.
- ``{"op": "container_delete", "container": ID}`` -> ``{"run": RUN_ID, "ended": bool}``.
"""

from __future__ import annotations

import contextlib
import os
import stat
from typing import Any

from .. import runner, shims
from ..errors import GatewrapError
from ..policy import build_policy, policy_where, read_policy_text
from ..run_types import RunOptions
from ..sandbox import cgroup, registry, user
from . import bundle
from .argv import CONTAINER_ID, RUN_PREFIX



def run_id_of(container: str) -> str:
    """The run id of container ``container`` (``gw-`` and the engine's id).

    Raises:
        GatewrapError: an id runc would refuse too.
    """
    if not isinstance(container, str) or not CONTAINER_ID.match(container):
        raise GatewrapError(f"container id {container!r} is not one runc accepts")
    return RUN_PREFIX + container


def checked_policy_file(path: str) -> str:
    """``path`` (the ``gatewrap.policy`` annotation) if it is an absolute path to a regular
    file that root owns and only root may write; the container's creator names it, the
    daemon (root) reads it.

    Raises:
        GatewrapError: it is not.
    """
    if not os.path.isabs(path):
        raise GatewrapError(f"annotation {bundle.POLICY_ANNOTATION}={path!r}: give an absolute path on the host")
    try:
        st = os.stat(path)
    except OSError as e:
        raise GatewrapError(f"annotation {bundle.POLICY_ANNOTATION}: {path}: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        raise GatewrapError(f"annotation {bundle.POLICY_ANNOTATION}: {path} must be a regular file owned by root "
                            "and writable by root alone (chown root: and chmod go-w it)")
    return path


def _policy_said(policy_file: str | None, allow: list[str], source: str) -> str:
    """Where the run's policy comes from, for ``run_start``'s ``container.policy``;
    ``source``: ``annotations`` or ``runtime flags`` (gatewrap-oci's --gatewrap-policy/-allow)."""
    if policy_file is None and not allow:
        return ("default (deny everything): the container has no gatewrap.policy nor gatewrap.allow annotation, "
                "and its runtime no --gatewrap-policy nor --gatewrap-allow")
    if source == "annotations":
        names = (bundle.POLICY_ANNOTATION, bundle.ALLOW_ANNOTATION)
    else:
        source, names = "runtime flags", ("--gatewrap-policy", "--gatewrap-allow")
    parts = ([f"{names[0]}={policy_file}"] if policy_file else []) + ([f"{names[1]}={','.join(allow)}"] if allow else [])
    return f"{source} " + " ".join(parts)


def _target(uid: int) -> user.Target:
    """The container process's user as the run records it (a uid the host may not know)."""
    with contextlib.suppress(GatewrapError):
        return user.resolve(str(uid), {})
    return user.Target(uid, uid, (), str(uid), "/")


class ContainerRun:
    """A live container's run in the daemon: its sandbox and what it holds until ``delete``."""

    def __init__(self, box: runner.Sandbox, logs: contextlib.ExitStack) -> None:
        self.box = box
        self.logs = logs


def create(daemon: Any, msg: dict[str, Any], client_pid: int) -> dict[str, Any]:
    """``container_create``: set the container's run up in ``daemon``; the answer as the
    module says. Nothing is left behind when it fails."""
    run_id = run_id_of(msg.get("container"))  # type: ignore[arg-type]
    policy_file = msg.get("policy")
    if policy_file is not None:
        policy_file = checked_policy_file(str(policy_file))
    allow = [str(h) for h in msg.get("allow") or []]
    opts = RunOptions(argv=[str(a) for a in msg.get("argv") or []] or ["(container)"], allow=allow,
                      policy_file=policy_file, jail="none", cwd="/", environ={},
                      audit_log=msg.get("audit_log") or runner.DEFAULT_AUDIT_LOG,
                      nameservers=[str(r) for r in msg.get("resolvers") or []] or None,
                      public_ranges=[str(r) for r in msg.get("public_ranges") or []])
    err = daemon.container_terminal()
    logs = contextlib.ExitStack()
    logs.callback(err.close)
    try:
        audit_logs = logs.enter_context(daemon.audit_logs())
        planned = _plan(opts, run_id, int(msg.get("uid") or 0), err, audit_logs)
        planned.container = {"id": msg["container"], "policy": _policy_said(policy_file, allow, str(msg.get("policy_source")))}
        box = runner.Sandbox(planned, err, hooks=daemon._current_hooks(), owner_pid=client_pid, shared_runtime=True,
                             notice_fd=err.fileno(), reader=daemon.reader, socket=daemon.socket_path)
        box.__enter__()
    except BaseException:
        logs.close()
        raise
    try:
        answer = _answer(box, run_id)
    except BaseException:
        box.__exit__(None, None, None)
        logs.close()
        raise
    daemon.add_container(run_id, ContainerRun(box, logs))
    daemon.say(f"container {msg['container']}: run {run_id} set up")
    return answer


def _plan(opts: RunOptions, run_id: str, uid: int, err: Any, audit_logs: Any) -> runner.Plan:
    """:func:`runner.plan` for a container: the policy, audit log and approvals; no command,
    view or environment to check (the engine made them)."""
    text = None if opts.policy_file is None else read_policy_text(opts.policy_file)
    where = None if opts.policy_file is None else policy_where(opts.policy_file)
    policy = build_policy(opts.policy_file, opts.allow, [], text=text)
    env = shims.agent_env({}, runner.GATE_IP4, opts.port)
    audit = audit_logs(opts)
    breakpoints = runner._approvals(opts, policy, run_id, audit, err)
    return runner.Plan(opts, run_id, policy, _target(uid), env, [], "/", list(opts.argv), [], [], audit, breakpoints,
                       text, policy_where=where)


def _answer(box: runner.Sandbox, run_id: str) -> dict[str, Any]:
    """What ``gatewrap-oci`` writes into the bundle: the netns, the cgroup path relative to
    the hierarchies' roots, the shims' variables and the staged files to bind."""
    spec = box.spawn_spec()
    staged = (registry.saved(run_id) or {}).get("staged")
    if not staged:
        raise GatewrapError(f"run {run_id}: its staged shims are not where the registry says")
    env = {k: v for k, v in spec["env"].items() if k != "PWD"}
    mounts = [(staged, staged), (os.path.join(staged, "resolv.conf"), "/etc/resolv.conf"),
              (os.path.join(staged, "hosts"), "/etc/hosts")]
    root = cgroup.cgroup2_mount() or "/sys/fs/cgroup"
    return {"run": run_id, "netns": spec["netns_path"], "cgroups_path": "/" + os.path.relpath(box.leaf, root),
            "env": env, "mounts": [list(m) for m in mounts]}


def delete(daemon: Any, msg: dict[str, Any]) -> dict[str, Any]:
    """``container_delete``: end the container's run (``run_end``, its reason the delete)
    and tear its sandbox down; a container the daemon has no run of is answered ended False."""
    run_id = run_id_of(msg.get("container"))  # type: ignore[arg-type]
    run = daemon.take_container(run_id)
    if run is None:
        return {"run": run_id, "ended": False}
    try:
        with daemon._ending:
            run.box.finish(None, reason="the container was deleted (gatewrap-oci delete)")
            run.box.__exit__(None, None, None)
        run.box.wait_released()
    finally:
        run.logs.close()
    daemon.say(f"container {msg['container']}: run {run_id} ended")
    return {"run": run_id, "ended": True}
