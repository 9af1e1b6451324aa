"""What a run is asked to do and how it ended: the options of ``gatewrap run``, its result and
the closing summary line. Light on imports: the thin client of the shared mode (see
:mod:`gatewrap.shared`) builds these without loading the sandbox machinery."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from .sandbox.limits import Limits
from .text import counted

DEFAULT_AUDIT_LOG = "/var/log/gatewrap/audit.jsonl"
#: The TLS inspection CA of this host install (``ca.crt``; the key in ``private/``, hidden
#: from every agent).
DEFAULT_CA_DIR = "/var/lib/gatewrap/ca"


@dataclass
class RunOptions:
    """What ``gatewrap run`` was asked to do."""

    argv: list[str]
    allow: list[str] = field(default_factory=list)
    deny: list[str] = field(default_factory=list)
    #: ``--allow-private HOST[:PORT]``: allow rules with ``allow_private = true``.
    allow_private: list[str] = field(default_factory=list)
    policy_file: str | None = None
    user: str | None = None
    audit_log: str = DEFAULT_AUDIT_LOG
    #: The option that names :attr:`audit_log`, as errors say it (gatewrap-oci's:
    #: ``--gatewrap-audit-log``).
    audit_log_flag: str = "--audit-log"
    #: Rotate the audit log past this many bytes (0: never); keep this many segments (None: all).
    audit_max_size: int = 100 << 20
    audit_keep: int | None = None
    nameservers: list[str] | None = None
    port: int = 3128
    cwd: str | None = None
    jail: str = "nsjail"
    ro_binds: list[str] = field(default_factory=list)
    rw_binds: list[str] = field(default_factory=list)
    #: ``--unprotect``: protected paths (:mod:`gatewrap.sandbox.protect`) left writable.
    unprotect: list[str] = field(default_factory=list)
    timeout: float | None = None
    limits: Limits = field(default_factory=Limits)
    public_ranges: list[str] = field(default_factory=list)
    ca_dir: str = DEFAULT_CA_DIR
    upstream_ca: list[str] = field(default_factory=list)
    #: The approvals store (``--state``); None: resolved as ``approvals.state`` says, and
    #: used only when one is named or the policy has a breakpoint.
    state: str | None = None
    #: ``--notify-webhook``: where an approval is announced (else the policy's ``[notify]
    #: webhook``, else the config file's).
    notify_webhook: str | None = None
    #: ``--env``: NAME (the caller's value) or NAME=VALUE, in order; ``--env-file`` paths
    #: (:mod:`gatewrap.sandbox.environment` says what the agent's environment is).
    env_vars: list[str] = field(default_factory=list)
    env_files: list[str] = field(default_factory=list)
    #: The environment gatewrap was started with (the agent's takes a few of it and what is
    #: named: :mod:`gatewrap.sandbox.environment`; SUDO_UID,
    #: GATEWRAP_STATE, GATEWRAP_CONFIG and GATEWRAP_NSJAIL are read from it). None: this
    #: process's own; the shared mode's daemon gets the client's.
    environ: dict[str, str] | None = None

    def env(self) -> dict[str, str]:
        """:attr:`environ`, or this process's environment."""
        return dict(os.environ) if self.environ is None else self.environ


@dataclass
class RunResult:
    """How the run ended: the agent's exit code and the counts of the summary line."""

    run_id: str
    exit_code: int
    allowed: int
    denied: int
    failed: int
    direct_egress: int
    #: Kernel events dropped by a full ring buffer (never delivered).
    lost: int
    audit_log: str
    #: Tunnels the gate TLS-inspected (their requests are counted in allowed/denied/failed).
    inspected: int = 0
    #: Let through by report mode, denied in enforce mode (also counted in ``allowed``).
    would_deny: int = 0
    #: The run's approvals (``ApprovalStore.counts``: asked, approved, rejected, expired,
    #: granted, by_grant), or None when the run had no approvals store.
    approvals: dict[str, int] | None = None
    #: Protected-class paths the run made or replaced, moved aside after it:
    #: [{"path", "moved_to", "change"}] (:func:`gatewrap.sandbox.protect.sweep`).
    protected: list[dict[str, str]] = field(default_factory=list)
    #: Forks refused at the run's pids bound, and processes of the run the OOM killer ended
    #: (:func:`gatewrap.sandbox.limits.hits`).
    pids_refused: int = 0
    oom_kills: int = 0
    #: Requests refused with 503 before any dial: their record could not be written.
    unsent: int = 0
    #: Requests answered 409 while their approval waits (``hold = "return"``): not in denied.
    held: int = 0
    #: Kernel denials delivered but not recorded: the audit log could not take them.
    unrecorded: int = 0
    #: Protected paths the agent tried to change, refused by the kernel: host path -> attempts
    #: (:class:`gatewrap.kernel_denials.KernelDenials`).
    refused: dict[str, int] = field(default_factory=dict)

    def as_record(self) -> dict[str, Any]:
        """The summary with the audit log's field names (as in its ``run_end`` record)."""
        return {"run": self.run_id, "exit_code": self.exit_code, "allowed": self.allowed,
                "denied": self.denied, "failed": self.failed, "direct_egress": self.direct_egress,
                "inspected": self.inspected, "would_deny": self.would_deny,
                "unsent": self.unsent, "held": self.held, "lost_events": self.lost, "unrecorded_events": self.unrecorded,
                "pids_refused": self.pids_refused, "oom_kills": self.oom_kills,
                "audit_log": self.audit_log,
                **({"approvals": self.approvals} if self.approvals is not None else {}),
                **({"protected": self.protected} if self.protected else {}),
                **({"protected_refused": [{"path": k, "count": v} for k, v in self.refused.items()]}
                   if self.refused else {})}


def summary_line(r: RunResult) -> str:
    """The one line printed when a run ends."""
    lost = f", {r.lost} kernel events LOST (ring buffer full)" if r.lost else ""
    if r.unrecorded:
        lost += f", {r.unrecorded} kernel events NOT RECORDED (the audit log could not be written)"
    return (
        f"gatewrap: run {r.run_id} exited {r.exit_code}: {r.allowed} allowed, "
        f"{r.denied} denied by the gate, "
        f"{f'{r.held} held (409, waiting for approval), ' if r.held else ''}{r.direct_egress} direct egress blocked"
        f"{f', {r.failed} upstream failed' if r.failed else ''}"
        f"{f', {r.unsent} NOT SENT (503: the audit log could not record them)' if r.unsent else ''}"
        f"{f', {r.inspected} tunnels TLS-inspected' if r.inspected else ''}"
        f"{f', {r.would_deny} would be denied in enforce mode (report mode)' if r.would_deny else ''}{lost}"
        f"{', ' + counted(r.pids_refused, 'fork') + ' refused at the pids bound (--pids)' if r.pids_refused else ''}"
        f"{', ' + counted(r.oom_kills, 'process', 'processes') + ' killed for memory (OOM; --memory)' if r.oom_kills else ''}"
        f"{_approvals_part(r.approvals)}{_protected_part(r.protected)}{_refused_part(r.refused)}; "
        f"audit log {r.audit_log} ({audit_command(r.run_id, r.audit_log)})"
    )


def audit_command(run_id: str, audit_log: str) -> str:
    """The command that shows a run's records: ``gatewrap audit --run ID``, with ``--log PATH``
    (shell-quoted) when the log is not the default one."""
    import shlex  # not at the top: the shared mode's client imports this module, not this function

    log = "" if os.path.abspath(audit_log) == DEFAULT_AUDIT_LOG else f" --log {shlex.quote(audit_log)}"
    return f"gatewrap audit --run {run_id}{log}"


def _protected_part(moved: list[dict[str, str]]) -> str:
    """The summary's protected paths the run made or replaced (moved aside, never deleted)."""
    if not moved:
        return ""
    names = ", ".join(f"{m['path']!r} -> {os.path.basename(m['moved_to'])!r}" for m in moved[:5])
    more = f" and {len(moved) - 5} more" if len(moved) > 5 else ""
    return (f", {len(moved)} protected path{'s' if len(moved) > 1 else ''} the agent made or replaced, "
            f"moved aside (review before use; tools run them): {names}{more}")


def _refused_part(refused: dict[str, int]) -> str:
    """The summary's protected paths the agent tried to change (refused), each once with its count."""
    if not refused:
        return ""
    names = ", ".join(f"{path!r} ×{n}" for path, n in list(refused.items())[:5])
    more = f" and {len(refused) - 5} more" if len(refused) > 5 else ""
    return (f", refused changes to {len(refused)} protected path{'s' if len(refused) > 1 else ''} "
            f"(attempts): {names}{more}")


def _approvals_part(c: dict[str, int] | None) -> str:
    """The summary's approvals: asked, how they were answered, and the requests grants let through."""
    if not c or not (c.get("asked") or c.get("by_grant")):
        return ""
    answers = [f"{c[k]} {k}" for k in ("approved", "rejected", "expired") if c.get(k)]
    grants = f", {c['granted']} granted for later" if c.get("granted") else ""
    asked = counted(c.get("asked", 0), "approval")
    return (f", {asked} asked ({', '.join(answers) or 'none answered'}{grants}), "
            f"{c.get('by_grant', 0)} answered by grants")
