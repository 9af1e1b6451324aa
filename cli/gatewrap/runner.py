"""The life of one run, top to bottom: prepare -> start gate -> spawn -> watch -> tear down.

Every step that creates something registers its undo before the next step starts, so
Ctrl-C, SIGTERM or a crash of any step still releases the netns, the cgroup (killing
every process in it) and the run's BPF configuration.
"""

from __future__ import annotations

import _thread
import contextlib
import dataclasses
import ipaddress
import os
import shutil
import signal
import sys
import threading
from dataclasses import dataclass
from typing import Any, TextIO

from . import agent_process, attribution, reload, shims
from .agent_process import (AGENT_OOM_SCORE_ADJ, FORWARDED, become_subreaper, protect_from_oom, raise_fd_limit, spawn,
                            wait_forwarding_signals)
from .bpf import loader
from .errors import EXIT_CANNOT_EXEC, EXIT_GATEWRAP, EXIT_NOT_FOUND, GatewrapError, require_root
from .kernel_denials import KernelDenials
from . import secrets as secret_sources
from .policy import build_policy, policy_where, read_policy_text, sandbox_binds, sandbox_unprotect
from .run_types import DEFAULT_AUDIT_LOG, DEFAULT_CA_DIR, RunOptions, RunResult, audit_command, summary_line

__all__ = ["DEFAULT_AUDIT_LOG", "RunOptions", "RunResult", "Sandbox", "plan", "run", "spawn", "summary_line"]
from .sandbox import cgroup, environment, gc, jail, limits, netns, protect, registry, user, view
from .sandbox.mounts import mount_table

#: The audit log's checkpoint signing key (gate_core audit/note.rs DEFAULT_KEY).
DEFAULT_AUDIT_KEY = "/var/lib/gatewrap/audit/signing-key"
GATE_IP4 = "127.0.0.1"
GATE_IP6 = "::1"
#: The gate's DNS stub in the sandbox (UDP and TCP); it answers REFUSED and records each query.
DNS_PORT = 53
def new_run_id() -> str:
    """A fresh run id, ``gw-`` and 10 hex digits."""
    return "gw-" + os.urandom(5).hex()  # what secrets.token_hex does (getrandom(2))


def _resolve_command(argv: list[str], env: dict[str, str], target: user.Target, cwd: str) -> list[str]:
    """``argv`` with its program looked up on the agent's PATH, so a missing or
    non-executable command is reported (127/126) before the jail starts. A relative path
    (``./agent.sh``, ``bin/tool``) is the agent's working directory ``cwd``'s, where the
    jail's execve(2) will look for it (nsjail changes to ``--cwd`` first), not gatewrap's own
    working directory; it is returned as given.

    Raises:
        GatewrapError: not found (127) or not executable by the agent's user (126).
    """
    prog = argv[0]
    found = shutil.which(prog, path=env.get("PATH", os.defpath)) if "/" not in prog else os.path.join(cwd, prog)
    if found is None or not os.path.exists(found):
        raise GatewrapError(f"command not found: {prog}", exit_code=EXIT_NOT_FOUND)
    if os.path.isdir(found) or not os.access(found, os.X_OK):
        raise GatewrapError(f"permission denied: {prog} is not an executable file", exit_code=EXIT_CANNOT_EXEC)
    if not user.can_execute(found, target):
        raise GatewrapError(
            f"permission denied: {found} cannot be executed by {target.name}, the agent's user (a folder on "
            "its path is closed to it, e.g. a tool installed under /root); use a system-wide path such as "
            "/usr/bin/python3, or --user", exit_code=EXIT_CANNOT_EXEC)
    return [prog if "/" in prog else found, *argv[1:]]


def _as_found(prog: str, found: str) -> str:
    """``prog`` as the user typed it, with the host path it was found at when they differ."""
    return found if prog == found else f"{prog} ({found} on the host)"


def _tree_hint(program: str) -> str:
    """The folder to name for ``program``: a virtualenv's root for ``VENV/bin/python3`` (its
    ``pyvenv.cfg`` marks it, venv(5)), else the program's own folder."""
    folder = os.path.dirname(program)
    parent = os.path.dirname(folder)
    return parent if os.path.exists(os.path.join(parent, "pyvenv.cfg")) else folder


def _public_range_warnings(ranges: list[str]) -> list[str]:
    """Warn about --public-range values that open the host's own loopback or private networks
    to every allowed name (the gate dials from the host)."""
    out = []
    for text in ranges:
        try:
            net = ipaddress.ip_network(text, strict=False)
        except ValueError:
            continue
        if net.overlaps(ipaddress.ip_network("127.0.0.0/8")) or net.overlaps(ipaddress.ip_network("::1/128")):
            out.append(f"gatewrap: warning: --public-range {text} lets allowed names reach this host's own loopback services")
        elif net.is_private and not any(net.subnet_of(d) for d in _DOC_NETS if d.version == net.version):
            out.append(f"gatewrap: warning: --public-range {text} lets allowed names reach private networks the host can reach")
    return out


_DOC_NETS = [ipaddress.ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32")]


def _kernel_fs_mounts(mounts_file: str = "/proc/self/mounts") -> list[str]:
    """Every mount point of cgroupfs (v1 and v2) and bpffs in gatewrap's mount namespace, read
    from ``/proc/self/mounts`` (proc(5); octal escapes such as ``\\040`` decoded). Each one
    is a way to the cgroup root (``CLONE_INTO_CGROUP``, ``cgroup.procs``) or to the pins,
    including copies under another path (a bind of /sys into a chroot shows the same ones)."""
    return [point for point, fstype in mount_table(mounts_file) if fstype in ("cgroup", "cgroup2", "bpf")]


def _outermost(paths: list[str]) -> list[str]:
    """``paths`` without those inside another of them (an outer cover already hides them)."""
    out: list[str] = []
    for p in sorted(set(paths), key=len):
        if not any(p == q or p.startswith(q.rstrip("/") + "/") for q in out):
            out.append(p)
    return out


def _hidden_paths(ca_dir: str) -> list[str]:
    """Host paths the agent must not see, each covered by an empty tmpfs: every cgroupfs and
    bpffs mount (the agent joined its cgroup before; an fd of the cgroup root would let a
    root agent leave it with ``clone3(CLONE_INTO_CGROUP)``, a pin's fd detach the hooks),
    gatewrap's runtime state, and the TLS inspection CA's key directory, the run's and the
    host install's default one (a root agent without the jail could read the root-owned
    key otherwise, whichever ``--ca-dir`` the run uses), and the audit signing key's."""
    keys = {os.path.realpath(os.path.join(d, "private")) for d in (ca_dir, DEFAULT_CA_DIR)}
    keys.add(os.path.dirname(DEFAULT_AUDIT_KEY))
    paths = (loader.BPFFS, *_kernel_fs_mounts(), "/run/gatewrap", *sorted(keys))
    return _outermost([p for p in paths if os.path.isdir(p)])


def _readonly_paths(audit_log: str, jail_mode: str, writable: list[str], audit_log_flag: str = "--audit-log") -> list[str]:
    """Host paths the agent sees read-only: the audit log's directory (so that it cannot be
    swapped for one holding a FIFO or another file) and, without the jail, /proc/sys (a root
    agent owns the sysctls, e.g. kernel.core_pattern). The jail mounts a /proc of its own,
    read-only, and a covered /proc/sys would make that mount fail (the kernel refuses a new
    proc in a user namespace when the existing one is partly hidden: mount_too_revealing).

    Raises:
        GatewrapError: one of ``writable`` (the working directory, ``--bind`` paths) lies in
            the audit log's directory, which would turn read-only under the agent (the
            message names ``audit_log_flag``, the option that chose the log).
    """
    audit_dir = os.path.dirname(os.path.abspath(audit_log))
    for path in writable:
        path = os.path.abspath(path)
        if path == audit_dir or path.startswith(audit_dir.rstrip("/") + "/"):
            where = ("is the agent's writable folder too" if path == audit_dir
                     else f"holds the agent's writable {path}")
            raise GatewrapError(f"the audit log's folder {audit_dir} is read-only for the agent, and it {where}: "
                                f"put the audit log elsewhere ({audit_log_flag})")
    paths = [audit_dir, *(["/proc/sys"] if jail_mode == "none" else [])]
    return [p for p in paths if os.path.exists(p)]


def run(opts: RunOptions, stderr: TextIO | None = None) -> RunResult:
    """Run ``opts.argv`` in a fresh sandbox whose only egress is the gate.

    Returns when the agent has exited and the sandbox is gone. The phases: :func:`plan`
    (everything checked, nothing set up), :class:`Sandbox` (set up; each step's undo
    registered before the next), the spawn, the wait, :meth:`Sandbox.finish` (tear down in
    the order the run's end needs, then ``run_end``). The shared mode's daemon runs the same
    phases, with the spawn and the wait in the client (:mod:`gatewrap.shared`).

    Raises:
        NeedRoot: not root.
        GatewrapError: (exit 125) the sandbox, hooks or gate could not be set up;
            (126/127) the command could not be executed / was not found.
    """
    require_root()
    err = stderr or sys.stderr
    planned = plan(opts, err)
    # Block the signals we wait for before any thread exists, so every thread
    # (bcc's, the gate's) inherits the mask and they reach sigtimedwait.
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, set(FORWARDED) | {signal.SIGCHLD})
    try:
        become_subreaper()
        raise_fd_limit()
        protect_from_oom()
        with Sandbox(planned, err) as box:
            box.start_socket_scan()  # beside the spawn
            try:
                pid = spawn(box.spawn_spec())
            except GatewrapError as e:
                box.finish(e.exit_code, reason=f"{AGENT_NOT_STARTED}: {e}")
                raise
            exit_code = wait_forwarding_signals(pid, opts.timeout, box.leaf, err,
                                                on_hup=lambda: reload.on_sighup(planned, err, box.resolve_secrets_again))
            return box.finish(exit_code, reap=pid)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)


@dataclass
class Plan:
    """A run checked and ready to set up (:func:`plan`): nothing of the sandbox exists yet,
    but the audit log and the approvals store are open."""

    opts: RunOptions
    run_id: str
    policy: Any
    target: user.Target
    #: The agent's environment (the shims' variables added by :class:`Sandbox`).
    env: dict[str, str]
    #: The names of the variables passed because they were named (--env, --env-file, the
    #: policy's [sandbox] env): run_start lists them, never their values.
    env_names: list[str]
    cwd: str
    #: The command, its program looked up on the agent's PATH.
    argv: list[str]
    ro_binds: list[str]
    rw_binds: list[str]
    audit: Any
    breakpoints: "_Breakpoints | None"
    #: The policy file's text the run started with (None: no file), kept with a daemon's run.
    policy_text: str | None = None
    #: The writable paths whose protected paths are kept read-only and swept after the run
    #: (:func:`protect.writable_roots`), the paths left writable (``--unprotect``, ``[sandbox]
    #: unprotect``), and what the scan at the start found (:func:`protect.scan`).
    protect_roots: list[str] = dataclasses.field(default_factory=list)
    unprotect: list[str] = dataclasses.field(default_factory=list)
    protected: protect.Protected = dataclasses.field(default_factory=protect.Protected)
    #: The scan that makes :attr:`protected` (:func:`plan` starts it; :class:`Sandbox` joins it).
    protecting: "_OnThread | None" = None
    #: The secrets the gate injects, resolved (:mod:`gatewrap.secrets`; values never shown).
    secrets: list[secret_sources.Resolved] = dataclasses.field(default_factory=list)
    #: Where the policy file lay at the start (:func:`gatewrap.policy.policy_where`): a reload
    #: reads it again only from there. None: no file.
    policy_where: dict[str, Any] | None = None
    #: A container's run (:mod:`gatewrap.oci`): ``run_start``'s ``container`` (its id, and
    #: where its policy came from). None: a ``gatewrap run``.
    container: dict[str, Any] | None = None

    @property
    def gate_url(self) -> str:
        return f"http://{GATE_IP4}:{self.opts.port}"

    @property
    def allow_hint(self) -> str:
        """Whose settings the refusals name to allow a host (``Gate(allow_hint=...)``,
        :data:`gatewrap.shims.ALLOW_HOST`): ``"run"`` (gatewrap run's flags) or ``"container"``."""
        return "run" if self.container is None else "container"


def open_audit_log(opts: RunOptions) -> Any:
    """The run's audit log writer (``gatewrap._gate_core.AuditLog``), as the options say.

    Raises:
        GatewrapError: it cannot be opened (the message says what to do).
    """
    from . import _gate_core as core

    flag = opts.audit_log_flag
    try:
        return core.AuditLog(opts.audit_log, max_size=opts.audit_max_size, keep=opts.audit_keep)
    except (OSError, ValueError) as e:
        # the extension's messages name gatewrap run's flag (--audit-log) where they say what to do
        said = str(e.strerror if isinstance(e, OSError) else e)
        told = said.replace("--audit-log", flag)
        raise GatewrapError(told if flag in told else f"{told}; choose another with {flag}") from e


def plan(opts: RunOptions, err: TextIO, audit_logs: Any = open_audit_log) -> Plan:
    """Check what the run is asked to do (policy, user, command, paths, view), and open its
    audit log and approvals store; nothing of the sandbox is made yet. ``audit_logs``: how the
    audit log is opened (the daemon's shares one writer per log among its runs).

    Raises:
        GatewrapError: as :func:`run` says, before anything was set up.
    """

    environ = opts.env()
    where = None if opts.policy_file is None else policy_where(opts.policy_file)
    policy_text = None if opts.policy_file is None else read_policy_text(opts.policy_file)
    policy = build_policy(opts.policy_file, opts.allow, opts.deny, text=policy_text, allow_private=opts.allow_private)
    target = user.resolve(opts.user, environ)
    if opts.jail == "nsjail":
        jail.refuse_root(target.uid)
    run_id = new_run_id()
    # What the agent runs, where and with what: checked before anything is set up.
    entries = environment.named(policy.sandbox()["env"], opts.policy_file, opts.env_files, opts.env_vars, environ)
    base, env_names, notes = environment.build(environ, target, entries)
    for note in notes:
        print(note, file=err)
    cwd = opts.cwd or os.getcwd()
    resolved = secret_sources.resolve(policy, environ)  # before anything is set up: 125 on a bad source
    env = secret_sources.agent_env(shims.agent_env(base, GATE_IP4, opts.port), resolved)
    env["PWD"] = cwd
    argv = _resolve_command(opts.argv, env, target, cwd)
    file_ro, file_rw = sandbox_binds(policy, opts.policy_file)
    ro_binds, rw_binds = [*opts.ro_binds, *file_ro], [*opts.rw_binds, *file_rw]
    for path in (*ro_binds, *rw_binds):
        if not user.can_enter(path if os.path.isdir(path) else os.path.dirname(path), target):
            raise GatewrapError(f"the agent's user {target.name} cannot reach {path} (a folder on the "
                                "way is closed to it), so it cannot be shown in the jail")
    if not user.can_enter(cwd, target):
        raise GatewrapError(f"the agent's user {target.name} cannot enter its working directory {cwd} "
                            "(a folder on the way is closed to it); choose another with --workdir")
    program = os.path.join(cwd, argv[0])  # where the jail's execve looks (a relative one: in cwd)
    bound = view.build(cwd, target.home, target, ro_binds, rw_binds) if opts.jail == "nsjail" else []
    if opts.jail == "nsjail" and not view.shows(bound, program):
        # Name the folder the jail lacks: the program's, or (a shown link to a file outside
        # the view) its target's.
        missing = os.path.realpath(program) if view.shows(bound, os.path.dirname(program)) else program
        raise GatewrapError(
            f"command not found in the jail: {_as_found(opts.argv[0], program)} is outside the "
            "agent's file system view (/usr, /etc, the working directory and the paths named with "
            f"--ro-bind/--bind); show it with --ro-bind {_tree_hint(missing)}, or use a program "
            "under /usr (e.g. /usr/bin/python3)", exit_code=EXIT_NOT_FOUND)
    roots = protect.writable_roots(cwd, rw_binds)
    unprotect = [*opts.unprotect, *sandbox_unprotect(policy)]
    # The walk through the writable paths (~20-40 ms for 15,000 entries here) goes on beside
    # the sandbox's first steps (the hooks, the cgroup); Sandbox joins it before the netns.
    own = [f for f in (opts.policy_file, *opts.env_files) if f is not None]  # gatewrap reads them next run too
    protecting = _OnThread(_scan_protected, roots, unprotect, target.home, opts.jail, own)
    audit = audit_logs(opts)
    breakpoints = _approvals(opts, policy, run_id, audit, err)
    return Plan(opts, run_id, policy, target, env, env_names, cwd, argv, ro_binds, rw_binds, audit, breakpoints,
                policy_text, roots, unprotect, protecting=protecting, secrets=resolved, policy_where=where)


def _scan_protected(roots: list[str], unprotect: list[str], home: str, jail_mode: str,
                    own: list[str] = ()) -> protect.Protected:
    """:func:`protect.scan`, and in the jail a refusal of a path nsjail cannot name.

    Raises:
        GatewrapError: as :func:`protect.scan` and :func:`view.protected_mounts` say.
    """
    found = protect.scan(roots, unprotect, home=home, own=own)
    if jail_mode == "nsjail":
        view.protected_mounts(found.readonly)
    return found


def protect_notices(found: protect.Protected) -> list[str]:
    """What to say on stderr about the run's protected paths: those left writable on request,
    and a walk that stopped at its bound."""
    out = []
    if found.unprotected:
        shown = ", ".join(repr(u) for u in found.unprotected[:6]) + (" ..." if len(found.unprotected) > 6 else "")
        out.append(f"gatewrap: warning: left writable (--unprotect, [sandbox] unprotect): {shown}; what the agent "
                   "writes there runs later, outside the sandbox, when git, direnv or an editor opens it")
    if found.truncated:
        out.append(f"gatewrap: note: looked for repositories and editor folders in the first {protect.SCAN_LIMIT} "
                   "entries of the writable paths only: one deeper is not protected; bind a smaller folder")
    return out


def plan_taken_back(run_id: str, opts: RunOptions, err: TextIO, policy_text: str | None = None,
                    audit_logs: Any = open_audit_log, policy_where: dict[str, Any] | None = None) -> Plan:
    """The plan of a run a restarted daemon takes back (:meth:`Sandbox.take_back`): its
    policy built again from the same options and ``policy_text``, the policy file's text the
    run started with (never the file as it is now: the agent may have rewritten it), its
    audit log and approvals store opened again; its command, environment and view are the
    running agent's already.

    Raises:
        GatewrapError: the policy's text was not kept, the audit log cannot be opened now.
    """
    if opts.policy_file is not None and policy_text is None:
        raise GatewrapError(f"run {run_id}'s policy was not kept with it (a daemon of another version saved it)")
    policy = build_policy(opts.policy_file, opts.allow, opts.deny, text=policy_text, allow_private=opts.allow_private)
    target = user.resolve(opts.user, opts.env())
    audit = audit_logs(opts)
    breakpoints = _approvals(opts, policy, run_id, audit, err)
    return Plan(opts, run_id, policy, target, {}, [], opts.cwd or "/", list(opts.argv), [], [], audit, breakpoints,
                policy_text, policy_where=policy_where)


class Sandbox:
    """One run's sandbox, set up by ``with Sandbox(plan, err) as box`` and torn down on leaving
    it (however it is left: every step registers its undo before the next starts).

    Args:
        planned: the run (:func:`plan`).
        err: where the run's notices go (the user's terminal).
        hooks: the loaded hooks to use (the daemon's); None: load or reuse them, and first
            remove stale sandboxes (a run of its own).
        owner_pid: the process ``gatewrap stop`` signals for this run (registry); None: this one.
        shared_runtime: the gate runs on the process's one runtime (the daemon) instead of
            one of its own.
        notice_fd: the fd the gate's live notices go to (None: this process's stderr).
        reader: the :class:`~gatewrap.kernel_denials.SharedReader` that polls the run's ring
            buffer (the daemon's); None: a thread of the run's own.
        socket: the daemon's socket path (a daemon's run).
        summary: how the client wants the closing summary, ``text`` or ``json`` (kept with a
            daemon's run, for a restarted daemon that takes it back).
    """

    def __init__(self, planned: Plan, err: TextIO, hooks: loader.Hooks | None = None,
                 owner_pid: int | None = None, shared_runtime: bool = False,
                 notice_fd: int | None = None, reader: Any = None, socket: str | None = None,
                 summary: str = "text") -> None:
        self.plan = planned
        self.err = err
        self._hooks = hooks
        self._owner_pid = owner_pid
        self._shared_runtime = shared_runtime
        self._notice_fd = notice_fd
        self._reader = reader
        #: The daemon's socket (kept with the run, so only the daemon of that socket takes it back).
        self.socket = socket
        self.summary = summary
        self._undo = contextlib.ExitStack()
        self._releasing: list[_OnThread] = []  # the release started at the run's end, if it got there
        self._spec: dict[str, Any] = {}
        #: The run's netns, held from its creation until :meth:`let_go_of_netns` or the end.
        self._netns: netns.Netns | None = None
        self.leaf = ""
        #: How the run's limits are enforced (limits.apply); a run taken back keeps its cgroups.
        self._bounds = limits.Bounds()
        #: The look for unix sockets in the view (a thread; see :meth:`start_socket_scan`),
        #: None before it starts, and without the jail; what it looks through (see _agent).
        self._socket_scan: _OnThread | None = None
        self._socket_view: tuple[list[Any], str] | None = None
        #: The staged files' folder, removed on leaving the ``with`` (see :meth:`_remove_staged`).
        self._staged_later: list[str] = []
        #: A taken-back run's counts from before the take-back (its records in the audit log).
        self._earlier = dict.fromkeys(("allowed", "denied", "failed", "direct_egress"), 0)
        #: The run's run_end is written (by :meth:`finish` or :meth:`_close_unended`).
        self._ended = False
        #: Leaving the ``with`` does not wait for the release :meth:`finish` started (the
        #: run's ring buffer leaving the hooks' map of maps waits an RCU grace period, ~12 ms):
        #: :meth:`wait_released` does. The daemon's runs: their clients need not wait for it.
        self.release_later = False

    def _release_configured(self, configuring: "_OnThread | None", run_hooks: Any = None) -> None:
        """The undo of the run's hook configuration (:func:`_release_configured`), left to
        :meth:`wait_released` when :attr:`release_later` is set and :meth:`finish` started it."""
        if self.release_later and self._releasing:
            return
        _release_configured(configuring, self._releasing, run_hooks)

    def wait_released(self) -> None:
        """Wait for the release of the run's hook configuration that :meth:`finish` started
        (raising its error; nothing to wait for when the run did not get there), and remove
        the staged files left for later (:meth:`_remove_staged`)."""
        try:
            for releasing in self._releasing:
                releasing.result()
        finally:
            for staged in self._staged_later:
                shutil.rmtree(staged, True)
            self._staged_later = []

    def _remove_staged(self, staged: str) -> None:
        """Undo of the staged files (the shims, the CA bundle): removed at once, or, with
        :attr:`release_later`, by :meth:`wait_released`, after the daemon's client has been let
        go: nothing reads them once the run's cgroup is empty, and their removal (a dozen
        system calls, 0.4-4 ms on the loaded 2-core test machine) is no part of the run's
        end. A daemon dying in between leaves the folder (a few KiB on /run's tmpfs)."""
        if self.release_later:
            self._staged_later.append(staged)
        else:
            shutil.rmtree(staged, True)

    def start_socket_scan(self) -> None:
        """Start the look for unix sockets in the view (:func:`view.socket_notice`, up to
        100,000 entries of the shown folders: tens of ms for a source tree) on a thread; its
        note follows when it is done, and :meth:`finish` waits for it, so it always comes
        before the summary. Called once the agent's spawn is under way (a run of its own) or
        handed to the client (the daemon): the walk holds the interpreter's lock between its
        system calls, so started earlier it delays the set-up's last steps and the reply.
        Nothing to do without the jail, or once started."""
        if self._socket_view is not None and self._socket_scan is None:
            self._socket_scan = _OnThread(_tell_sockets, *self._socket_view, self.err)

    def __enter__(self) -> "Sandbox":
        try:
            self._set_up()
        except BaseException:
            self._undo.__exit__(*sys.exc_info())
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self._undo.__exit__(*exc)

    def _close_unended(self, _type: Any, exc: BaseException | None, _tb: Any) -> None:
        """Undo step of a run whose ``run_start`` is written: left before :meth:`finish` wrote
        its ``run_end`` (a failure after ``run_start``: in its set-up, its spawn, a daemon's
        hand-over), the run still gets one, whose reason is the failure, and gatewrap's exit
        code (125, or the error's own) when there was one."""
        if self._ended:
            return
        denials = getattr(self, "_denials", None)
        end: dict[str, Any] = {"run": self.plan.run_id, "event": "run_end"}
        if exc is not None:
            end["exit_code"] = exc.exit_code if isinstance(exc, GatewrapError) else EXIT_GATEWRAP
        end.update(direct_egress=0 if denials is None else denials.count, lost_events=0,
                   reason=f"gatewrap failed after run_start: {exc}" if exc is not None
                   else "the sandbox was torn down before the agent's end was known")
        self._ended = True
        _write_run_end(self.plan.audit, end, self.err)

    def _set_up(self) -> None:
        p, opts, err, undo = self.plan, self.plan.opts, self.err, self._undo
        run_id = p.run_id
        lock_fd = registry.claim(run_id, opts.audit_log, pid=self._owner_pid)
        undo.callback(registry.release, run_id, lock_fd)
        parent = cgroup.parent_dir()
        hooks = self._hooks
        if hooks is None:
            hooks = loader.load_or_reuse(parent)
            undo.callback(hooks.close)
            collected = gc.collect(parent, salvager(hooks, "a starting gatewrap run"))
            for line in gc.said_of(collected):
                print(f"gatewrap: {line}", file=err)
        leaf, cgroup_id = cgroup.create_leaf(parent, run_id)
        self.leaf = leaf
        undo.callback(limits.remove, run_id)  # the cgroup v1 leaves, once the v2 leaf is empty
        undo.callback(cgroup.kill_and_remove, leaf)
        self._bounds = limits.apply(leaf, run_id, opts.limits)
        for note in self._bounds.notes:
            print(note, file=err)
        # Installing the run's ring buffer in the map of maps waits out an RCU grace period
        # (~10 ms, bpf(2) MAP_UPDATE_ELEM on a map of maps): done on a thread while the netns
        # and the gate start; joined before the kernel-denial reader starts, so before any spawn.
        configuring = _OnThread(hooks.configure, cgroup_id, GATE_IP4, GATE_IP6, [opts.port, DNS_PORT], [DNS_PORT])
        undo.callback(self._release_configured, configuring)
        if p.protecting is not None:
            # Before the gate starts: a daemon's set-up that fails after it keeps the client's
            # stderr open (its notice fd), and the client's reader then waits for its end.
            p.protected = p.protecting.result()
        ns = netns.create()
        self._netns = ns
        undo.callback(ns.close)
        ca_cert = self._start_gate(ns.path)
        self._run_hooks = configuring.result()
        self._start_denials()
        for warning in _public_range_warnings(opts.public_ranges):
            print(warning, file=err)
        loader.verify_attached(parent, hooks)
        staged, mounts, replaced, notes = shims.stage_run(run_id, opts.jail == "nsjail", ca_cert, p.env)
        undo.callback(self._remove_staged, staged)
        for note in notes:
            print(note, file=err)
        self._announce(replaced)
        unrecorded = hooks.attempts_unrecorded
        if unrecorded is not None and p.protect_roots:
            print(f"gatewrap: note: attempts to change protected paths are refused but not recorded ({unrecorded})",
                  file=err)
        try:
            p.audit.write({"run": run_id, "event": "run_start", "argv": opts.argv, "uid": p.target.uid,
                           "cgroup_id": cgroup_id, "gate": p.gate_url, "limits": self._bounds.record,
                           **({"env": p.env_names} if p.env_names else {}),
                           **({"container": p.container} if p.container else {}),
                           **({"attempts_unrecorded": unrecorded} if unrecorded is not None else {})})
        except OSError as e:
            raise GatewrapError(f"{e.strerror}: a run starts only once its run_start record is written; "
                                f"free space there, or choose another {opts.audit_log_flag}") from e
        undo.push(self._close_unended)
        self._spec = self._agent(ns, staged, mounts)
        if self._shared_runtime:  # a daemon's run: what a restarted daemon needs to take it back
            # The client's environment, but a variable holding a secret's value (from_env): the
            # value is never written (issue 20); a run taken back gets no secrets anyway.
            kept = dataclasses.replace(opts, environ={k: v for k, v in opts.env().items()
                                                      if not any(r.value in v for r in p.secrets)})
            registry.save(run_id, {"opts": dataclasses.asdict(kept), "policy_text": p.policy_text,
                                   "policy_where": p.policy_where,
                                   "cgroup_id": cgroup_id, "netns_ino": ns.ino, "staged": staged,
                                   "owner_pid": self._owner_pid, "owner_starttime": registry.process_started(self._owner_pid),
                                   "socket": self.socket, "summary": self.summary,
                                   **({"container": p.container["id"]} if p.container else {}),
                                   "protect": {"roots": p.protect_roots, "unprotect": p.unprotect,
                                               "watched": [[path, *ident] for path, ident in p.protected.watched.items()
                                                           if ident is not None]}})

    def take_back(self, saved: dict[str, Any]) -> "Sandbox":
        """Set up again, in this process, what a dead daemon served of a run whose agent still
        runs: its gate in its netns (listeners made anew) and the reader of its ring buffer
        (the kernel kept both the buffer and the hooks' configuration). ``saved``: what
        :func:`registry.save` kept. The caller leaves the sandbox as after ``with``.

        Raises:
            GatewrapError: the sandbox is gone or is another (cgroup id), or its gate cannot start.
        """
        try:
            self._take_back(saved)
        except BaseException:
            self._undo.close()
            raise
        return self

    def _take_back(self, saved: dict[str, Any]) -> None:
        p, opts, undo = self.plan, self.plan.opts, self._undo
        run_id = p.run_id
        assert self._hooks is not None, "a daemon's hooks"
        before = registry.info(run_id)  # the dead daemon's lock file: where the run's records start
        lock_fd = registry.claim(run_id, opts.audit_log, pid=self._owner_pid, since=before)
        undo.callback(registry.release, run_id, lock_fd)
        leaf = os.path.join(cgroup.parent_dir(), run_id)
        try:
            same = os.stat(leaf).st_ino == saved.get("cgroup_id")
        except OSError:
            same = False
        if not same or not cgroup.populated(leaf):
            raise GatewrapError(f"run {run_id} has no sandbox left to take back")
        self.leaf = leaf
        undo.callback(limits.remove, run_id)
        undo.callback(cgroup.kill_and_remove, leaf)
        kept = saved.get("protect") or {}  # what the start's scan found: the sweep at the end compares with it
        p.protect_roots, p.unprotect = list(kept.get("roots", [])), list(kept.get("unprotect", []))
        p.protected = protect.Protected(watched={w[0]: (w[1], w[2]) for w in kept.get("watched", [])})
        run_hooks = self._hooks.orphan(saved["cgroup_id"])
        if run_hooks is None:
            raise GatewrapError(f"run {run_id}'s ring buffer is gone from the hooks' maps")
        self._run_hooks = run_hooks
        undo.callback(self._release_configured, None, run_hooks)
        if saved.get("staged"):
            undo.callback(shutil.rmtree, saved["staged"], True)
        ns = netns.of_cgroup(leaf, saved.get("netns_ino", -1))
        if ns is None:
            raise GatewrapError(f"run {run_id} has no process left in its network namespace")
        undo.callback(ns.close)
        # What the dead daemon's gate and reader counted, from the run's records so far (its run_end
        # and summary count the whole run), read before the new gate and reader start: a record
        # either of them wrote while this read went on (the agent retrying the gate, the denials
        # the ring buffer kept through the gap) would be counted here and again by them.
        from .live_runs import counts_so_far

        c, last = counts_so_far(run_id, before or {})
        self._earlier = {"allowed": c.allowed, "denied": c.denied, "failed": c.failed, "direct_egress": c.direct_egress}
        resumed = {"run": run_id, "event": "run_resumed", **({"since": last} if isinstance(last, str) else {}),
                   "reason": "its gatewrap daemon died and a restarted one took the run back: until now the "
                             "kernel refused every connection to the gate (no listener; not recorded) and the "
                             "hooks kept refusing direct egress"}
        try:
            p.audit.write(resumed)
        except OSError as e:
            raise GatewrapError(f"{e.strerror}: a run is taken back only once its run_resumed record is written") from e
        undo.push(self._close_unended)
        # From here on, records are the new gate's and reader's: after run_resumed in the log.
        self._start_gate(ns.path)
        ns.close()  # the gate's sockets and the agent's processes hold it (see netns_fd)
        self._start_denials()
        registry.save(run_id, {**saved, "owner_pid": self._owner_pid})

    def _start_gate(self, ns_path: str) -> str | None:
        """Start the run's gate in its netns (listeners made there); returns the TLS
        inspection CA's certificate when the policy inspects (made on first use)."""
        from . import _gate_core as core

        p, opts, err = self.plan, self.plan.opts, self.err
        inspecting = any(r.get("inspect") for r in p.policy.describe())
        ca_cert = None
        if inspecting:
            try:
                ca_cert = core.ensure_ca(opts.ca_dir)
            except core.GateError as e:
                raise GatewrapError(f"{e} (--ca-dir DIR to use another)") from e
        breakpoints = p.breakpoints
        if breakpoints is not None:
            self._undo.callback(_end_run, breakpoints.store, p.run_id, err)
        shared = {} if not self._shared_runtime else {"shared_runtime": True, "notice_fd": self._notice_fd}
        if p.secrets:
            shared["secrets"] = secret_sources.for_gate(p.secrets)
        try:
            gate = core.Gate(run_id=p.run_id, netns_path=ns_path, policy=p.policy, audit=p.audit,
                             listen_port=opts.port, nameservers=opts.nameservers,
                             public_ranges=opts.public_ranges, notices=True, dns_stub=True,
                             ca_dir=opts.ca_dir if inspecting else None,
                             upstream_ca=opts.upstream_ca or None, run_cgroup=self.leaf, **shared,
                             allow_hint=p.allow_hint,
                             **({} if breakpoints is None else
                                {"state": breakpoints.url, "on_asked": breakpoints.notifier,
                                 "answer_prefix": breakpoints.hint[0], "answer_suffix": breakpoints.hint[1]}))
        except core.GateError as e:
            raise GatewrapError(f"the gate could not start: {e}") from e
        except ValueError as e:
            raise GatewrapError(f"--public-range: {str(e).removeprefix('public_ranges: ')}") from e
        self._gate = gate
        self._undo.callback(gate.stop)
        return ca_cert

    def _start_denials(self) -> None:
        """Start recording the run's kernel denials (on the daemon's reader, if shared)."""
        p, opts = self.plan, self.plan.opts
        denials = KernelDenials(self._run_hooks, p.audit, p.run_id, p.gate_url, self.err,
                                run_cgroup=attribution.cgroup_path(self.leaf, cgroup.cgroup2_mount() or "/"),
                                audit_command=audit_command(p.run_id, opts.audit_log), reader=self._reader,
                                protected=_protected_names(p), workdir=p.cwd)
        denials.start()
        self._denials = denials
        self._undo.callback(denials.stop)

    def _announce(self, replaced: list[str]) -> None:
        """Say what gatewrap changed for the agent, and as whom it runs."""
        p, err = self.plan, self.err
        if replaced:
            print(f"gatewrap: replaced your {', '.join(replaced)} so the agent uses the gate", file=err)
        if p.target.uid == 0:
            print("gatewrap: warning: the agent runs as root, unjailed (no capabilities, but it owns the "
                  "host's root files); prefer sudo from a user, or --user", file=err)
        elif p.opts.user is None and "SUDO_UID" not in p.opts.env() and os.getuid() == 0:
            print(f"gatewrap: the agent runs as {p.target.name} (gatewrap was started by root, not "
                  "through sudo; --user USER to choose)", file=err)
        for line in protect_notices(p.protected):
            print(line, file=err)

    def _agent(self, ns: netns.Netns, staged: str, mounts: list[Any]) -> dict[str, Any]:
        """The arguments of ``spawn_agent`` for this run: the command wrapped in the jail,
        the environment with the shims, the paths to hide and to show read-only."""
        p, opts, err = self.plan, self.plan.opts, self.err
        env, target, cwd, argv = dict(p.env), p.target, p.cwd, p.argv
        if opts.jail == "nsjail":
            shims.add_python_shim(env, shims.PYTHON_SHIM_IN_JAIL, p.gate_url, p.run_id)
            shims.add_node_shim(env, shims.NODE_SHIM_IN_JAIL)
        else:  # the staged copies: the package may be closed to the agent (a 0700 home)
            shims.add_python_shim(env, os.path.join(staged, "python"), p.gate_url, p.run_id)
            shims.add_node_shim(env, os.path.join(staged, "node"))
        env["GATEWRAP_AUDIT"] = audit_command(p.run_id, opts.audit_log)
        env["GATEWRAP_ALLOW"] = shims.ALLOW_HOST[p.allow_hint]
        if not user.can_write(cwd, target):
            print(f"gatewrap: note: the agent's user {target.name} cannot write its working directory "
                  f"{cwd}; choose one with --workdir, or chown it", file=err)
        if opts.jail == "nsjail":
            fs_view = view.build(cwd, target.home, target, p.ro_binds, p.rw_binds, extra=mounts,
                                 protected=p.protected.readonly)
            for note in view.notes(cwd, target.home):
                print(note, file=err)
            self._socket_view = (fs_view, target.home)  # looked through by start_socket_scan
            argv = jail.wrap(argv, target, cwd, fs_view, nsjail=jail.nsjail_path(opts.env()),
                             tmpfs_budget=opts.limits.tmpfs)
        else:
            print(jail.WITHOUT_JAIL, file=err)
        hide = _hidden_paths(opts.ca_dir)
        readonly = _readonly_paths(opts.audit_log, opts.jail, [cwd, *opts.rw_binds], opts.audit_log_flag)
        if opts.jail == "none":  # the jail shows them read-only itself (view.build)
            readonly += p.protected.readonly
        if target.uid == 0 and opts.jail == "none":
            # A root agent could open the log (0640 root's) read-only and hold its flock(2),
            # and every gate writing to it (all of a daemon's, on its one runtime) would wait:
            # its folder is hidden from it, not only read-only.
            audit_dir = os.path.dirname(os.path.abspath(opts.audit_log))
            hide = _outermost([*hide, audit_dir])
            readonly = [p for p in readonly if p != audit_dir]
        return {"argv": argv, "env": env, "cwd": cwd, "netns_path": ns.path, "netns_ino": ns.ino, "cgroup_dir": self.leaf,
                "uid": target.uid, "gid": target.gid, "groups": list(target.groups),
                "hide": hide, "readonly": readonly, "jail": opts.jail, "join_cgroups": self._bounds.join,
                "nproc": self._bounds.nproc, "oom_score_adj": AGENT_OOM_SCORE_ADJ}

    def _sweep_protected(self) -> list[dict[str, str]]:
        return _sweep_protected_of(self.plan, self.err)

    def resolve_secrets_again(self) -> None:
        """Rotation of the run's secrets (issue 20): each source read again
        (:func:`gatewrap.secrets.resolve_again`, the run's environment), placeholders
        kept, and the gate's values replaced; requests from now on carry the new ones. For the
        reload (SIGHUP) or a TTL; nothing when the run injects nothing.

        Raises:
            GatewrapError: a source no longer resolves; the gate keeps the old values.
        """
        p, gate = self.plan, getattr(self, "_gate", None)
        if not p.secrets or gate is None:
            return
        fresh = secret_sources.resolve_again(p.policy, p.opts.env(), p.secrets)
        gate.set_secrets(secret_sources.for_gate(fresh))
        p.secrets = fresh

    def leave(self) -> None:
        """A stopping daemon's part in a run that goes on (a restarted daemon takes it back):
        its gate stops serving and records the DNS queries it held over the stub's record
        rate (they would go with the process); the run stays open in the approvals store and
        nothing else is torn down. Idempotent, and harmless before or after :meth:`finish`."""
        gate = getattr(self, "_gate", None)
        if gate is not None:
            gate.stop(end_run=False)

    def spawn_spec(self) -> dict[str, Any]:
        """The keyword arguments of ``gatewrap._gate_core.spawn_agent`` (JSON-able: str,
        int, lists and a dict of str)."""
        return self._spec

    def netns_fd(self) -> int:
        """The descriptor by which this process holds the run's netns (the spawn spec's
        ``netns_path`` names it), -1 once :meth:`let_go_of_netns`."""
        return -1 if self._netns is None else self._netns.fd

    def let_go_of_netns(self) -> None:
        """Close this process's descriptor of the run's netns, once the process that spawns
        the agent has one of its own (the daemon sent it to its client with the spawn). The
        gate's sockets hold the namespace meanwhile (a socket holds a reference to the netns it
        was made in: net/core/sock.c, sk_alloc), and the agent's processes once it runs; a
        restarted daemon finds it through them (:func:`netns.of_cgroup`). A daemon serving
        thousands of idle runs so holds no descriptor of their namespaces (issue 23, target 4).
        Idempotent."""
        if self._netns is not None:
            self._netns.close()

    def finish(self, exit_code: int | None, reap: int | None = None, reason: str | None = None) -> RunResult:
        """The run's end once the agent has exited with ``exit_code``: kill what is left of
        the tree, collect its last kernel denials, stop the gate, count, write ``run_end``
        (the rest of the teardown is left to leaving the ``with``). ``reap``: the agent's pid,
        when it is this process's child (reaped here after the kill). ``exit_code`` None: the
        agent's end is unknown (the shared mode's client went away); ``run_end`` then has no
        exit_code but ``reason``, and the result says 125. ``reason`` with an exit code: why
        the run ended so (the agent could not be started: 126, 127)."""
        p, run_id = self.plan, self.plan.run_id
        if self._socket_scan is not None:
            self._socket_scan.result()
        cgroup.kill(self.leaf)
        if reap is not None:
            agent_process.reap(reap)
        hit = limits.hits(self.leaf, run_id)  # the tree is dead: the counts are final
        self._denials.stop()
        lost = self._run_hooks.lost()
        # Removed only now: hooks.sweep (gc, a daemon's start) drops the map entries of every
        # cgroup that is gone, the folded denials just counted and the lost counter among them.
        cgroup.kill_and_remove(self.leaf)
        protected = self._sweep_protected()
        # Removing the run's ring buffer from the map of maps waits an RCU grace period
        # (~10 ms): on a thread, beside the gate's stop, the run_end record and the removal
        # of the staged files and the netns; joined by the undo registered with the install.
        self._releasing.append(_OnThread(self._run_hooks.release))
        self._gate.stop()
        counts = self._gate.counts()
        asked = None
        if p.breakpoints is not None:
            _end_run(p.breakpoints.store, run_id, self.err)
            asked = _approval_counts(p.breakpoints.store, run_id, self.err)
        e = self._earlier
        result = RunResult(run_id, EXIT_GATEWRAP if exit_code is None else exit_code, counts.get("allowed", 0) + e["allowed"],
                           counts.get("denied", 0) + e["denied"], counts.get("failed", 0) + e["failed"],
                           self._denials.count + e["direct_egress"], lost, p.opts.audit_log,
                           inspected=counts.get("inspected", 0), would_deny=counts.get("would_deny", 0),
                           approvals=asked, protected=protected,
                           unsent=counts.get("unsent", 0), held=counts.get("held", 0), unrecorded=self._denials.unrecorded,
                           refused=dict(self._denials.refused), **hit)
        end = result.as_record()
        del end["audit_log"]
        end.pop("protected", None)  # each has a protected_path record of its own
        end.pop("protected_refused", None)  # so has each refused attempt
        end.pop("approvals", None)  # the gate's approval_* records hold them; run_end's schema does not
        if exit_code is None:
            del end["exit_code"]
            end["reason"] = reason or "the agent's end is unknown"
        elif reason is not None:
            end["reason"] = reason
        self._ended = True
        _write_run_end(p.audit, {"run": run_id, "event": "run_end", **end}, self.err)
        return result


def _sweep_protected_of(p: Plan, err: TextIO) -> list[dict[str, str]]:
    """After the run (its cgroup empty): move aside every protected-class path it made or
    replaced (:func:`protect.sweep`), one ``protected_path`` audit record each; a path that
    could not be moved is said on ``err`` and recorded with its reason. Returns the moved ones
    as the summary shows them."""
    if not p.protect_roots:
        return []
    moved, failed, truncated = protect.sweep(p.protected, p.protect_roots, p.run_id, p.unprotect, p.target.home)
    out = []
    for m in moved:
        out.append({"path": m.path, "moved_to": m.moved_to, "change": m.change})
        _write_protected(p, {"path": m.path, "change": m.change, "moved_to": m.moved_to}, err)
    for path, why in failed:
        print(f"gatewrap: warning: the run made or replaced {path!r}, which tools run, and it could not be moved "
              f"aside ({why}): review it before git, direnv or an editor opens it", file=err, flush=True)
        _write_protected(p, {"path": path, "change": "unknown", "error": why}, err)
    if truncated:
        roots = ", ".join(repr(r) for r in p.protect_roots)
        print(f"gatewrap: warning: the run left more than {protect.SCAN_LIMIT} entries in {roots}; only the first "
              "were looked at for a repository or editor folder it made: review any deeper before git, direnv or "
              "an editor opens it", file=err, flush=True)
        _write_protected(p, {"path": p.protect_roots[0], "change": "unknown",
                             "error": f"not looked at past the first {protect.SCAN_LIMIT} entries"}, err)
    return out


def _protected_names(p: Plan) -> dict[str, str]:
    """The run's protected paths as the agent names them -> their host paths (the jail shows
    some elsewhere: :func:`view.in_jail`), for the report of refused attempts."""
    names: dict[str, str] = {}
    for path in {*p.protected.readonly, *p.protected.watched}:
        names[path] = path
        if p.opts.jail == "nsjail":
            names.setdefault(view.in_jail(path), path)
    return names


def _write_protected(p: Plan, fields: dict[str, str], err: TextIO) -> None:
    try:
        p.audit.write({"run": p.run_id, "event": "protected_path", **fields})
    except OSError as e:
        print(f"gatewrap: the protected_path record of {fields['path']!r} could not be written: {e.strerror}",
              file=err, flush=True)


class _OnThread:
    """``fn(*args)``, started now on a thread of its own (which inherits the signal mask);
    :meth:`result` waits for it and returns its value or raises its exception.

    Started with :func:`_thread.start_new_thread`, which returns at once:
    ``threading.Thread.start`` also waits until the new thread has run (a scheduling round
    trip: median 0.1 ms, p90 3 ms, up to 6 ms on the loaded 2-core test machine), and the
    set-up's critical path (the hooks' configuration, the protected-path walk) need not. Like
    a daemon thread, it does not hold the interpreter's exit: every one is waited for by
    :meth:`result` on the paths that need its work done."""

    def __init__(self, fn: Any, *args: Any) -> None:
        self._value: Any = None
        self._error: BaseException | None = None
        self._done = threading.Event()
        _thread.start_new_thread(self._run, (fn, args))

    def _run(self, fn: Any, args: tuple[Any, ...]) -> None:
        try:
            self._value = fn(*args)
        except BaseException as e:  # raised again in the caller's thread by result()
            self._error = e
        finally:
            self._done.set()

    def result(self) -> Any:
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value


def _tell_sockets(fs_view: list[Any], home: str, err: TextIO) -> None:
    """Print :func:`view.socket_notice`'s line for ``fs_view``, if it has one."""
    note = view.socket_notice(fs_view, home)
    if note:
        print(note, file=err, flush=True)


def _release_configured(configuring: _OnThread | None, started: list[_OnThread], run_hooks: Any = None) -> None:
    """Undo of the run's hook configuration: wait for the release the run's end ``started``
    (raising its error), else wait for the configuration (or take ``run_hooks``, a run taken
    back), then release it (nothing to release if it failed; its error was raised where the
    run needed it)."""
    if started:
        started[0].result()
        return
    if configuring is not None:
        try:
            run_hooks = configuring.result()
        except BaseException:
            return
    run_hooks.release()


@dataclass
class _Breakpoints:
    """A run's approvals: the store's URL (for the gate), the store (for the end of the
    run and its counts) and the ``on_asked`` notifier."""

    url: str
    store: Any
    notifier: Any
    #: What the live line puts around ``approve ID`` (:func:`approvals.state.answer_hint`).
    hint: tuple[str, str] = ("sudo gatewrap approvals", "")


def _approvals(opts: RunOptions, policy: Any, run_id: str, audit: Any, err: TextIO) -> _Breakpoints | None:
    """Open the approvals store for this run if one is named (``--state``, ``$GATEWRAP_STATE``,
    the config file) or the policy has a breakpoint (then the default store); None otherwise:
    the run needs no state and an ``ask`` cannot occur.

    Raises:
        GatewrapError: the store cannot be opened, the config file is invalid, or the webhook
            is not an http(s) URL.
    """
    from .approvals import state

    environ = opts.env()
    config = state.load_config(state.config_path(environ))
    url = state.explicit_url(opts.state, config, environ)
    has_ask = policy.default == "ask" or any(r["action"] == "ask" for r in policy.describe())
    if url is None and not has_ask:
        return None
    from .approvals import notify  # urllib.request, http.client, ssl: ~10-20 ms, only for a run with a store
    url = url or state.DEFAULT_STATE
    store = state.open_store(url)
    notify_cfg = config.get("notify", {})
    webhook = opts.notify_webhook or _policy_webhook(policy) or notify_cfg.get("webhook")
    secret = None
    if webhook:
        try:
            notify.check_webhook_url(webhook)
        except ValueError as e:
            raise GatewrapError(f"{e} (--notify-webhook, [notify] webhook)") from None
        secret = notify.load_secret(notify_cfg.get("secret_file") or notify.DEFAULT_SECRET_FILE)
    # The gate prints the live line itself (notices on); the notifier sends the webhook.
    notifier = notify.Notifier(audit, run_id, webhook=webhook, secret=secret,
                               review_url=notify_cfg.get("review_url") or notify.DEFAULT_REVIEW_URL,
                               stderr=False, err=err)
    return _Breakpoints(url, store, notifier, state.answer_hint(url, environ))


def _policy_webhook(policy: Any) -> str | None:
    """The policy's ``[notify] webhook`` (``Policy.notify()``), if the extension has it."""
    table = policy.notify() if hasattr(policy, "notify") else None
    return (table or {}).get("webhook")


def _end_run(store: Any, run_id: str, err: TextIO) -> None:
    """Mark the run ended in the store (its pending approvals cancelled; a late decision on
    them is refused: the run id is the fence). Idempotent; a failure is said, not raised."""
    try:
        store.end_run(run_id)
    except (OSError, ValueError) as e:
        print(f"gatewrap: could not mark run {run_id} ended in the approvals store: {e}", file=err, flush=True)


def _approval_counts(store: Any, run_id: str, err: TextIO) -> dict[str, int] | None:
    try:
        return dict(store.counts(run_id))
    except (OSError, ValueError) as e:
        print(f"gatewrap: could not count the run's approvals: {e}", file=err, flush=True)
        return None


def _write_run_end(audit: Any, record: dict[str, Any], err: TextIO) -> None:
    """Write the run's ``run_end`` record and a signed checkpoint after it, and fsync; if the
    log cannot take one of them (a full disk), say which in one line on ``err`` and go on:
    the run still ends with the agent's exit code."""
    step = "the run_end record could not be written"
    try:
        audit.write(record)
        step = ("the checkpoint after run_end could not be written (run_end is in the log, unsigned "
                "until the next checkpoint)")
        audit.checkpoint()
        step = "the audit log could not be synced to disk after run_end"
        audit.sync()
    except OSError as e:
        print(f"gatewrap: {step}: {e.strerror}", file=err, flush=True)


#: The start of a run_end's reason when the agent's spawn failed (its exit code 125/126/127).
AGENT_NOT_STARTED = "the agent could not be started"


def collect_stale() -> gc.Collected:
    """``gatewrap gc``: remove every stale sandbox and its BPF map entries, and what killed
    daemons left beside their sockets (:func:`gatewrap.shared.lockfile.sweep`).

    Raises:
        NeedRoot: not root.
    """
    from .shared import lockfile, protocol

    require_root("gc")
    parent = cgroup.parent_dir()
    hooks = loader.load_or_reuse(parent)
    try:
        collected = gc.collect(parent, salvager(hooks))
        hooks.sweep(parent)
        try:
            ours = protocol.socket_path()
        except GatewrapError:  # $GATEWRAP_DAEMON_SOCKET outside the folder: no daemon has it
            ours = None
        collected.dead_daemons = lockfile.sweep(protocol.SOCKET_DIR, ours)
        return collected
    finally:
        hooks.close()


def salvager(hooks: loader.Hooks, by: str = "gatewrap gc") -> Any:
    """gc's salvage step: a dead run's last kernel denials go to its own audit log, then, if
    the run started and has no ``run_end`` there (:func:`live_runs.unended`), a ``run_end``
    whose reason names ``by``, who collected it."""
    from . import _gate_core as core
    from .kernel_denials import salvage
    from .live_runs import unended

    def salvage_one(run_id: str, cgroup_id: int | None) -> None:
        got = registry.info(run_id)
        salvage(hooks, core.AuditLog, run_id, cgroup_id, None if got is None else got.get("audit_log"),
                reason=f"gatewrap died; collected by {by}", close=got is not None and unended(run_id, got))

    return salvage_one


