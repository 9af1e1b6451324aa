"""Reload a running run's policy: ``gatewrap reload RUN``, and SIGHUP to a run's own gatewrap.

The run's ``--policy`` file is read again and, if it is valid, its rules, default, mode,
``public_ranges`` and ``[approvals]`` limits decide the requests that come next (the
command-line rules, ``--allow``/``--deny``/``--allow-private``, stay first, as at the start).
What the run's start guarantees is fixed for its life and never reloaded: the sandbox
(``[sandbox]`` paths and env, the protected paths, the jail). A file that cannot be read or
does not parse leaves the policy in force as it was. Either way one ``policy_reload`` record
(schema/audit.schema.json) says what happened, with the digests of the old and new text; the
reload happens only once that record is written (nothing changes unrecorded).
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable, TextIO

from .errors import GatewrapError
from .policy import build_policy, read_policy_again
from .sandbox import registry

#: The audit record's event.
EVENT = "policy_reload"


class ReloadFailed(GatewrapError):
    """The file could not be read or is invalid: the policy in force is unchanged (exit 1)."""

    exit_code = 1


def digest(text: str | None) -> str:
    """``sha256:`` and the hex SHA-256 of ``text`` (UTF-8); of "" for a run without a file."""
    return "sha256:" + hashlib.sha256((text or "").encode()).hexdigest()


def reload_policy(plan: Any, err: TextIO, rotate: Callable[[], None] | None = None) -> dict[str, Any]:
    """Read ``plan``'s policy file again (a :class:`gatewrap.runner.Plan` of a running run)
    and put it in force for new requests; write the ``policy_reload`` record and one line
    on ``err``. Returns the record. ``rotate`` (the run's
    :meth:`gatewrap.runner.Sandbox.resolve_secrets_again`) then reads the run's secrets
    again; one that no longer resolves keeps its old value, said on ``err``. A secret the
    new file adds gets no value in this run (its inject answers 503: fail closed).

    Raises:
        ReloadFailed: the run has no policy file, or it cannot be read or is invalid (the
            record says failed; the policy in force is unchanged).
        GatewrapError: (125) the record cannot be written: nothing was changed.
    """
    opts = plan.opts
    rec: dict[str, Any] = {"run": plan.run_id, "event": EVENT, "old_digest": digest(plan.policy_text)}
    if opts.policy_file is None:
        why = f"run {plan.run_id} has no --policy file to read again; its rules are its command line's"
        _write(plan, {**rec, "result": "failed", "error": why})
        print(f"gatewrap: {why}", file=err, flush=True)
        raise ReloadFailed(why)
    rec["policy_file"] = opts.policy_file
    try:
        text = read_policy_again(opts.policy_file, plan.policy_where)
        rec["new_digest"] = digest(text)
        new = build_policy(opts.policy_file, opts.allow, opts.deny, text=text, allow_private=opts.allow_private)
    except GatewrapError as e:
        why = str(e).removeprefix("invalid policy: ")
        _write(plan, {**rec, "result": "failed", "error": why})
        print(f"gatewrap: run {plan.run_id}: policy not reloaded, the one in force stays: {why}", file=err, flush=True)
        raise ReloadFailed(f"{why}; the policy in force is unchanged") from None
    notes = _unchanged(plan, new)
    _write(plan, {**rec, "result": "reloaded", **({"note": "; ".join(notes)} if notes else {})})
    plan.policy.replace_with(new)
    plan.policy_text = text
    _keep_for_take_back(plan.run_id, text)
    print(f"gatewrap: run {plan.run_id}: policy reloaded from {opts.policy_file} ({rec['new_digest'][:19]}…)"
          + "".join(f"; {n}" for n in notes), file=err, flush=True)
    if rotate is not None:
        try:
            rotate()
        except GatewrapError as e:
            print(f"gatewrap: run {plan.run_id}: secrets not read again, the old values stay: {e}", file=err, flush=True)
    return {**rec, "result": "reloaded"}


def on_sighup(plan: Any, err: TextIO, rotate: Callable[[], None] | None = None) -> None:
    """SIGHUP to a run's own gatewrap: reload its policy and read its secrets again
    (:func:`reload_policy`). A failure is said on ``err`` and recorded, and the run goes on
    with the policy it had."""
    try:
        reload_policy(plan, err, rotate)
    except GatewrapError as e:
        if not isinstance(e, ReloadFailed):
            print(f"gatewrap: run {plan.run_id}: policy not reloaded: {e}", file=err, flush=True)


def _unchanged(plan: Any, new: Any) -> list[str]:
    """What the new file asks that a reload does not do, in words."""
    notes = []
    if new.sandbox() != plan.policy.sandbox():
        notes.append("its [sandbox] table changed: the sandbox is fixed at the start, the change takes effect at the next run")
    if plan.breakpoints is None and (new.default == "ask" or any(r["action"] == "ask" for r in new.describe())):
        notes.append("its ask rules are denied: this run has no approvals store (start it with --state, or with an ask rule)")
    return notes


def _write(plan: Any, record: dict[str, Any]) -> None:
    try:
        plan.audit.write(record)
    except OSError as e:
        raise GatewrapError(f"cannot write the {EVENT} record ({e.strerror}): the policy was not reloaded") from e


def _keep_for_take_back(run_id: str, text: str) -> None:
    """A daemon's run: what a restarted daemon takes back is the reloaded policy."""
    saved = registry.saved(run_id)
    if saved is not None:
        registry.save(run_id, {**saved, "policy_text": text})


def reload_run(run_id: str, timeout: float) -> dict[str, Any]:
    """``gatewrap reload RUN``: have run ``run_id`` (or the one live run whose id starts with
    it: :func:`gatewrap.live_runs.resolve`) read its policy file again, and return its
    ``policy_reload`` record (its ``run``: the whole id). A daemon's run (``--shared``): asked over the daemon's socket
    (``{"op": "reload", "run": ID}``, :mod:`gatewrap.shared.protocol`). A run of its own:
    SIGHUP to its gatewrap process (through a pidfd taken while the run's lock is held, as
    ``gatewrap stop``), then its next ``policy_reload`` record, waited for up to ``timeout``
    seconds.

    Raises:
        NoSuchRun: no live run ``run_id``, or more than one starts with it (exit 1).
        ReloadFailed: the file could not be read or is invalid (exit 1; the old policy stays).
        GatewrapError: (125) no answer within ``timeout``, or the daemon cannot be reached.
    """
    import os
    import signal
    import time

    from .live_runs import NoSuchRun, _own_records, resolve

    run_id = resolve(run_id)
    info = registry.info(run_id)
    if info is None or not registry.owned(run_id) or not isinstance(info.get("pid"), int):
        raise NoSuchRun(f"no live run {run_id} (gatewrap ps lists them)")
    saved = registry.saved(run_id)
    if saved is not None and isinstance(saved.get("socket"), str):
        return _through_daemon(run_id, saved["socket"])
    foreign = registry.unproven(run_id, info)
    if foreign is not None:
        raise GatewrapError(f"run {run_id} is not this gatewrap's to reload: {foreign}")
    before = sum(1 for _ in _own_records(run_id, info, events=(EVENT,)))
    try:
        pidfd = os.pidfd_open(info["pid"])
    except ProcessLookupError:
        raise NoSuchRun(f"no live run {run_id}: it has just ended") from None
    try:
        if not registry.owned(run_id):
            raise NoSuchRun(f"no live run {run_id}: it has just ended")
        signal.pidfd_send_signal(pidfd, signal.SIGHUP)
    finally:
        os.close(pidfd)
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = list(_own_records(run_id, info, events=(EVENT,)))
        if len(got) > before:
            return _outcome(got[-1])
        time.sleep(0.05)
    raise GatewrapError(f"run {run_id} wrote no {EVENT} record within {timeout:g} s of SIGHUP; "
                        f"see `gatewrap audit --run {run_id}`")


def _through_daemon(run_id: str, socket_path: str) -> dict[str, Any]:
    from .shared import protocol
    from .shared.client import connect

    sock = connect(socket_path, start=False)
    try:  # a _socket.socket, which is no context manager
        protocol.send(sock, {"op": "reload", "run": run_id})
        got = protocol.Reader(sock).message() or {}
    finally:
        sock.close()
    if "record" in got and isinstance(got["record"], dict):
        return _outcome(got["record"])
    raise GatewrapError(str(got.get("error", "the daemon did not answer")), exit_code=int(got.get("exit_code", 125)))


def _outcome(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` if it says reloaded; else :class:`ReloadFailed` with its error."""
    if record.get("result") != "reloaded":
        why = str(record.get("error", "the policy could not be read"))
        raise ReloadFailed(why if "policy_file" not in record else f"{why}; the policy in force is unchanged")
    return record
