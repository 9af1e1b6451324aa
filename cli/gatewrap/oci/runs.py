"""The daemon's side of ``gatewrap-oci`` (:mod:`gatewrap.shared.daemon` routes the ops here):
a container's run, set up on ``create`` and torn down on ``delete``.

A container's run is a shared-mode run (:class:`gatewrap.runner.Sandbox`, as ``gatewrap run``
gets) whose agent runc starts: the daemon makes the run's cgroup leaf, configures the hooks
for it, makes the netns with the gate listening in it, stages the shims and writes
``run_start``; the answer tells ``gatewrap-oci`` what to write in the bundle's
``config.json`` (:func:`gatewrap.oci.bundle.confine`). No client connection stays open: the
run lives in the daemon (``Daemon.runs``) until ``container_delete``, or until its container
is dead and its engine has not deleted it (:class:`Exits`: an engine killed, ``runc kill``
without a delete). If the daemon dies, the container keeps its hooks and has no egress
(no listener in its netns) until a daemon of the same socket starts again and takes the run
back (:func:`take_back_all`: its gate anew in the netns, ``run_resumed``); a container that
died meanwhile, or whose run cannot be taken back, is removed as a dead run (fail closed).

Ops (one JSON line each way, :mod:`gatewrap.shared.protocol`):

- ``{"op": "container_create", "container": ID, "policy": PATH | null, "allow": [HOST],
  "policy_source": "annotations" | "runtime flags", "argv": [the container's command], "uid": N,
  "bounds": {"pids": N | null, "memory": BYTES | null}, "audit_log": PATH | null, "resolvers": [IP],
  "public_ranges": [CIDR], "unix_sockets": [PATH] (what the gatewrap.unix_sockets annotation names)}`` ->
  ``{"run": RUN_ID, "netns": PATH, "cgroups_path": PATH, "env": {NAME: VALUE},
  "mounts": [[HOST PATH, CONTAINER PATH]]}`` or ``{"error", "exit_code"}``.
- ``{"op": "container_delete", "container": ID, "deleted": bool (whether runc's delete succeeded;
  absent: true)}`` -> ``{"run": RUN_ID, "ended": bool}``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import stat
import threading
import time
from typing import Any

from .. import runner, shims
from ..entry import DEFAULT_MEMORY, DEFAULT_PIDS
from ..errors import GatewrapError
from ..policy import build_policy, policy_where, read_policy_text
from ..run_types import RunOptions
from ..sandbox import cgroup, limits, registry, user
from ..sizes import parse_count, parse_memory
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


def checked_policy_file(path: str, named_by: str = f"annotation {bundle.POLICY_ANNOTATION}") -> str:
    """``path`` (the ``gatewrap.policy`` annotation) if it is an absolute path to a regular
    file that root owns and only root may write, of at most :data:`MAX_POLICY_BYTES`, reached
    through no kernel file system (:func:`_kernel_fs_on_the_way`); the container's creator
    names it, the daemon (root) reads it. ``named_by``: what named it, for the errors (the
    annotation, or gatewrap-oci's ``--gatewrap-policy``).

    Raises:
        GatewrapError: it is not.
    """
    if not os.path.isabs(path):
        raise GatewrapError(f"{named_by}={path!r}: give an absolute path on the host")
    kernel = _kernel_fs_on_the_way(path)
    if kernel is not None:
        raise GatewrapError(f"{named_by}: {path} goes through {kernel}, a kernel file system "
                            "(/proc's links reach any process's files, a container's own among them): name the "
                            "policy file where it lies on disk")
    try:
        st = os.stat(path)
    except OSError as e:
        # Not strerror's "No such file or directory": podman reads that in a runtime's error as
        # its command missing (exit 127, "OCI runtime attempted to invoke a command that was not found").
        why = "does not exist" if e.errno == errno.ENOENT else f"cannot be read ({e.strerror.lower()})"
        raise GatewrapError(f"{named_by}: the policy file {path} {why}") from None
    if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        raise GatewrapError(f"{named_by}: {path} must be a regular file owned by root "
                            "and writable by root alone (chown root: and chmod go-w it)")
    if st.st_size > MAX_POLICY_BYTES:
        raise GatewrapError(f"{named_by}: {path} has {st.st_size} bytes, more than a policy's "
                            f"{MAX_POLICY_BYTES}: name a policy file")
    return path


#: The largest policy file a container's annotation may name, in bytes: the daemon reads it
#: whole, and any root-owned file passes the owner check (a node's audit log has gigabytes).
MAX_POLICY_BYTES = 1 << 20


#: statfs(2)'s f_type of the kernel's own file systems (linux/magic.h): proc (whose
#: /proc/PID/root, cwd and fd/N links lead into any process's mount namespace), sysfs,
#: debugfs, tracefs, securityfs, configfs, cgroup2 and bpffs; a read there may block
#: (/proc/kmsg), consume (the kernel log) or be endless (/proc/kcore).
KERNEL_FS = {0x9FA0: "procfs", 0x62656572: "sysfs", 0x64626720: "debugfs", 0x74726163: "tracefs",
             0x73636673: "securityfs", 0x62656570: "configfs", 0x63677270: "cgroup2", 0xCAFE4A11: "bpffs"}


def _fs_type(path: str) -> int:
    """statfs(2)'s ``f_type`` of the file system ``path`` (links followed) lies on.

    Raises:
        OSError: statfs failed.
    """
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(256)  # struct statfs: f_type is its first field, a long
    if libc.statfs(os.fsencode(path), buf) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), path)
    return ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF


def _kernel_fs_on_the_way(path: str) -> str | None:
    """The first folder on the way to absolute ``path`` (its symbolic links followed one by
    one, as the kernel's lookup does) that lies on a kernel file system (:data:`KERNEL_FS`),
    as ``PATH (TYPE)``; None when there is none. A folder that cannot be looked at ends the
    walk (the open then fails on its own)."""
    parts = path.split("/")
    here, hops = "/", 0
    while parts:
        part = parts.pop(0)
        if part in ("", "."):
            continue
        try:
            kind = KERNEL_FS.get(_fs_type(here))
        except OSError:
            return None
        if kind is not None:
            return f"{here} ({kind})"
        if part == "..":
            here = os.path.dirname(here)
            continue
        step = os.path.join(here, part)
        try:
            st = os.lstat(step)
        except OSError:
            return None
        if stat.S_ISLNK(st.st_mode):
            hops += 1
            if hops > 40:  # ELOOP, path_resolution(7)
                return None
            target = os.readlink(step)
            parts = target.split("/") + parts
            if target.startswith("/"):
                here = "/"
            continue
        here = step
    try:
        kind = KERNEL_FS.get(_fs_type(here))
    except OSError:
        return None
    return None if kind is None else f"{here} ({kind})"


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


def bounds_of(engine: Any) -> limits.Limits:
    """The container run's bounds: what the engine set (``bounds``: :func:`bundle.engine_bounds`),
    else ``gatewrap run``'s defaults (:mod:`gatewrap.entry`: tasks, memory). The daemon
    writes them on the run's cgroups before runc joins them; runc then writes only what the
    engine set (runc's fs manager skips an unset bound), the same values: nothing the engine
    set is loosened, and a container without bounds gets a run's."""
    got = engine if isinstance(engine, dict) else {}

    def given(key: str) -> int | None:
        value = got.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    return limits.Limits(pids=given("pids") or parse_count(DEFAULT_PIDS),
                         memory=given("memory") or parse_memory(DEFAULT_MEMORY))


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
        flag = msg.get("policy_source") == "runtime flags"
        policy_file = checked_policy_file(str(policy_file), "--gatewrap-policy" if flag else
                                          f"annotation {bundle.POLICY_ANNOTATION}")
    allow = [str(h) for h in msg.get("allow") or []]
    opts = RunOptions(argv=[str(a) for a in msg.get("argv") or []] or ["(container)"], allow=allow,
                      policy_file=policy_file, jail="none", cwd="/", environ={},
                      audit_log=msg.get("audit_log") or runner.DEFAULT_AUDIT_LOG, audit_log_flag="--gatewrap-audit-log",
                      nameservers=[str(r) for r in msg.get("resolvers") or []] or None,
                      public_ranges=[str(r) for r in msg.get("public_ranges") or []],
                      limits=bounds_of(msg.get("bounds")))
    err = daemon.container_terminal()
    logs = contextlib.ExitStack()
    logs.callback(err.close)
    try:
        audit_logs = logs.enter_context(daemon.audit_logs())
        planned = _plan(opts, run_id, int(msg.get("uid") or 0), err, audit_logs)
        sockets = [str(p) for p in msg.get("unix_sockets") or []]
        planned.container = {"id": msg["container"], "policy": _policy_said(policy_file, allow, str(msg.get("policy_source"))),
                             **({"unix_sockets": sockets} if sockets else {})}
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
    daemon.add_container(run_id, ContainerRun(box, logs), client_pid)
    daemon.say(f"container {msg['container']}: run {run_id} set up")
    return answer


def take_back_all(daemon: Any, parent: str) -> list[str]:
    """A starting daemon's: take back the runs of the live containers a dead daemon of its
    socket served (:meth:`runner.Sandbox.take_back`, as a ``gatewrap run``'s waiter gets:
    the gate's listeners made anew in the run's netns, the ring buffer read again, a
    ``run_resumed`` record) and watch them (:class:`Exits`). A run that cannot be taken back
    is left to the daemon's collection of stale runs, which kills and removes it. Returns
    what to say in the daemon's log, one line each."""
    from ..shared.daemon import options
    from ..sandbox import gc

    said = []
    for run_id in gc.stale_runs(parent):
        saved = registry.saved(run_id)
        if (saved is None or not saved.get("container") or saved.get("socket") != daemon.socket_path
                or not cgroup.populated(os.path.join(parent, run_id))):
            continue
        err = daemon.container_terminal()
        logs = contextlib.ExitStack()
        logs.callback(err.close)
        try:
            audit_logs = logs.enter_context(daemon.audit_logs())
            planned = runner.plan_taken_back(run_id, options(saved.get("opts")), err,
                                             policy_text=saved.get("policy_text"), audit_logs=audit_logs,
                                             policy_where=saved.get("policy_where"))
            planned.container = {"id": saved["container"]}  # its gate's refusals name the container's settings
            box = runner.Sandbox(planned, err, hooks=daemon.hooks, owner_pid=saved.get("owner_pid"), shared_runtime=True,
                                 notice_fd=err.fileno(), reader=daemon.reader,
                                 socket=daemon.socket_path).take_back(saved)
        except Exception as e:  # a protocol error in what was saved too: that run is collected, the others go on
            logs.close()
            said.append(f"could not take container run {run_id} back ({e}): removing it")
            continue
        daemon.add_container(run_id, ContainerRun(box, logs), None)
        said.append(f"took container run {run_id} back (its container lives on)")
    return said


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
    and tear its sandbox down; a container the daemon has no run of is answered ended False.
    A delete that runc refused (``deleted`` false) ends only a dead container's run (its
    cgroup empty): the id may be another engine's container (runc's --root), or the delete
    of a live one lacked --force; the run of a container whose processes live on is kept
    (its teardown would kill them)."""
    run_id = run_id_of(msg.get("container"))  # type: ignore[arg-type]
    if msg.get("deleted") is False:
        run = daemon.containers.get(run_id)
        if run is not None and cgroup.populated(run.box.leaf):
            return {"run": run_id, "ended": False}
    return {"run": run_id, "ended": end(daemon, run_id, "the container was deleted (gatewrap-oci delete)")}


def end(daemon: Any, run_id: str, reason: str) -> bool:
    """End container run ``run_id`` in ``daemon`` (``run_end`` with ``reason``) and tear its
    sandbox down; False if the daemon has no such run (ended already)."""
    run = daemon.take_container(run_id)
    if run is None:
        return False
    try:
        with daemon._ending:
            run.box.finish(None, reason=reason)
            run.box.__exit__(None, None, None)
        run.box.wait_released()
    finally:
        run.logs.close()
    daemon.say(f"run {run_id} ended: {reason}")
    return True


#: How long a container's run outlives its container's last process (its cgroup empty) for
#: its engine's ``delete`` to end it, in seconds; then the daemon ends it (:class:`Exits`).
#: podman 4.3's cleanup deleted 70-160 ms after its container's last output here (3 runs, with and
#: without --rm, 2026-12-05); ``ctr run`` without --rm deletes only at ``ctr task rm``.
EXIT_GRACE = 5.0
#: The reason of the run_end the daemon writes then.
EXITED = (f"the container's processes have all exited and its engine did not delete it within {EXIT_GRACE:g} s "
          "(an engine killed, or runc kill without delete): ended by the gatewrap daemon")


class Exits:
    """Ends the runs of dead containers their engine never deletes: once a run's cgroup is
    empty (``cgroup.events`` ``populated 0``, which wakes poll(2) with POLLPRI:
    cgroup-v2.rst) and the ``gatewrap-oci create`` that made it has exited (before, runc has
    not put the container in yet: its pidfd, readable once it has, pidfd_open(2)), the run
    waits :data:`EXIT_GRACE` seconds for its engine's ``delete`` and is then ended with
    :data:`EXITED`. A container with a process left is never ended here. One thread for
    every container run, started with the first."""

    def __init__(self, daemon: Any) -> None:
        self._daemon = daemon
        self._lock = threading.Lock()
        #: run id -> [cgroup.events fd, creator's pidfd or -1 (gone), when it was first seen empty or None]
        self._watched: dict[str, list[Any]] = {}
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._started = False

    def watch(self, run_id: str, leaf: str, creator: int | None) -> None:
        """Watch run ``run_id`` whose cgroup is ``leaf``; ``creator``: the pid of the
        ``gatewrap-oci`` that made it, None when it is gone (a run taken back).

        Raises:
            OSError: the cgroup is gone.
        """
        events = os.open(os.path.join(leaf, "cgroup.events"), os.O_RDONLY | os.O_CLOEXEC)
        pidfd = -1
        if creator is not None:
            with contextlib.suppress(ProcessLookupError):
                pidfd = os.pidfd_open(creator)
        with self._lock:
            self._watched[run_id] = [events, pidfd, None]
            if not self._started:
                threading.Thread(target=self._loop, daemon=True, name="gatewrap-container-exits").start()
                self._started = True
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_w, b"x")

    def _loop(self) -> None:
        while True:
            try:
                self._round()
            except Exception as e:  # a fault here must not end the watch of the other runs
                self._daemon.say(f"watching the container runs: {e!r}")
                time.sleep(1)

    def _round(self) -> None:
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        now = time.monotonic()
        wait = None
        with self._lock:
            for run_id in [r for r in self._watched if r not in self._daemon.containers]:  # deleted
                self._forget(run_id)
            for events, pidfd, since in self._watched.values():
                poller.register(events, select.POLLPRI)
                if pidfd >= 0:
                    poller.register(pidfd, select.POLLIN)
                if since is not None:
                    left = max(0.0, since + EXIT_GRACE - now)
                    wait = left if wait is None else min(wait, left)
        poller.poll(None if wait is None else wait * 1000 + 10)
        with contextlib.suppress(BlockingIOError):
            os.read(self._wake_r, 4096)
        due = []
        with self._lock:
            now = time.monotonic()
            for run_id, entry in self._watched.items():
                events, pidfd, since = entry
                if pidfd >= 0 and select.select([pidfd], [], [], 0)[0]:
                    os.close(pidfd)
                    entry[1] = pidfd = -1
                populated = _populated(events)  # read at every wake-up: a poll for POLLPRI stays ready until it is
                if pidfd >= 0 or populated:
                    entry[2] = None
                elif since is None:
                    entry[2] = now
                elif now - since >= EXIT_GRACE:
                    due.append(run_id)
            for run_id in due:
                self._forget(run_id)
        for run_id in due:
            end(self._daemon, run_id, EXITED)

    def _forget(self, run_id: str) -> None:
        """Stop watching ``run_id`` (the lock is held)."""
        events, pidfd, _ = self._watched.pop(run_id)
        os.close(events)
        if pidfd >= 0:
            os.close(pidfd)



def _populated(events: int) -> bool:
    """``populated`` of an open ``cgroup.events``; False once its cgroup is removed (ENODEV)."""
    try:
        return cgroup.populated_fd(events)
    except OSError:
        return False
