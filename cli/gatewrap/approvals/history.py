"""What the review page shows of the run behind an approval, from the audit log (root's,
written by gatewrap and the gate, never by the agent): who started the run and with what
command (its ``run_start`` record), and its last records before it asked.
"""

from __future__ import annotations

import collections
import io
import pwd
from dataclasses import dataclass, field
from typing import Any

from .. import audit_reader
from ..errors import GatewrapError

#: Records of the run the page shows before the approval was asked.
LAST_RECORDS = 20


@dataclass
class RunHistory:
    """``start``: the run's ``run_start`` record (None if the log does not hold it);
    ``before``: up to :data:`LAST_RECORDS` of its records before the approval's
    ``approval_asked`` (or its last ones, if that is not in the log), oldest first;
    ``problem``: why the log could not be read (None when it could)."""

    start: dict[str, Any] | None = None
    before: list[dict[str, Any]] = field(default_factory=list)
    problem: str | None = None

    def command(self) -> list[str] | None:
        """The agent's command line (``argv`` of ``run_start``), or None."""
        argv = (self.start or {}).get("argv")
        return [str(a) for a in argv] if isinstance(argv, list) else None

    def user(self) -> str | None:
        """The user the agent runs as: the login name of ``run_start``'s ``uid``
        (getpwuid(3)), else ``uid N``; None when the log does not say."""
        uid = (self.start or {}).get("uid")
        if not isinstance(uid, int):
            return None
        try:
            return pwd.getpwuid(uid).pw_name
        except KeyError:
            return f"uid {uid}"


def run_history(audit_log: str, run_id: str, approval_id: str, last: int = LAST_RECORDS) -> RunHistory:
    """The :class:`RunHistory` of ``run_id`` in ``audit_log`` (its rotated segments too),
    up to the ``approval_asked`` record of ``approval_id``. Never raises: a missing or
    unreadable log is said in ``problem``. Reads the whole log (a page view of a human, not
    a hot path)."""
    out = RunHistory()
    window: collections.deque[dict[str, Any]] = collections.deque(maxlen=last)
    try:
        for rec in audit_reader.records(audit_log, err=io.StringIO(), filters=audit_reader.Filters(run=run_id)):
            if rec.get("event") == "run_start" and out.start is None:
                out.start = rec
            if rec.get("event") == "approval_asked" and rec.get("approval") == approval_id:
                break
            window.append(rec)
    except FileNotFoundError:
        out.problem = f"the audit log {audit_log} does not exist (serve --log PATH names the run's)"
    except (GatewrapError, OSError) as e:
        out.problem = f"the audit log {audit_log} cannot be read: {e}"
    out.before = list(window)
    return out
