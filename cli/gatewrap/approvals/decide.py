"""A human's decisions, through the store: approve (optionally with a grant), reject, edit,
revoke. Each names the version and digest the human saw; the store refuses a stale one
(``StaleDecision``), and that refusal becomes :class:`Refused` (exit 1) with the why.
"""

from __future__ import annotations

import re
import urllib.parse
from typing import Any

from ..errors import GatewrapError
from .render import when

#: ``approve --for``: N and a unit (s, m, h, d).
_DURATION = re.compile(r"([0-9]+)([smhd])")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}
#: ``approve --grant``: ``METHOD host/path-prefix`` (path optional: ``/``).
_GRANT = re.compile(r"([A-Z]+)\s+([^/\s]+)(/\S*)?")


class Refused(GatewrapError):
    """A decision the store refused (stale, expired, run ended, not found): exit 1.

    ``why`` is the store's (``decided``, ``edited``, ``expired``, ``run ended``, ``digest``,
    ``not found``), or, for a decision refused before it reached the store, ``"invalid"``
    (a malformed or too wide grant) or ``"forbidden"`` (a grant the rule forbids).
    """

    def __init__(self, message: str, why: str) -> None:
        super().__init__(message, exit_code=1)
        self.why = why


def seconds(text: str) -> int:
    """``30m`` -> 1800. Raises ValueError naming the value for anything but N + s|m|h|d."""
    m = _DURATION.fullmatch(text.strip())
    if not m or int(m.group(1)) == 0:
        raise ValueError(f"{text!r} is not a duration: give N and a unit, e.g. 90s, 30m, 2h, 1d")
    return int(m.group(1)) * _UNIT[m.group(2)]


class GrantForbidden(ValueError):
    """The approval's rule forbids grants (``grants = false`` in the policy)."""


def parse_grant(spec: str, duration: str, approval: dict[str, Any]) -> dict[str, Any]:
    """``'POST mail.test/v3/'`` + ``'30m'`` -> the store's grant dict
    ``{"method", "host", "path_prefix", "seconds"}``. The one check of a grant a human asks
    for, by ``approve --grant ... --for ...`` and by the review page's grant form alike (the
    store checks again: gate_core approvals ``check_grant``).

    Raises:
        GrantForbidden: the approval's rule has ``grants = false`` (or the approval does not
            say: fail closed).
        ValueError: malformed, or wider than the request's host (a grant never is).
    """
    if not approval.get("grants_allowed"):
        raise GrantForbidden(f"rule {approval.get('rule')} forbids grants (grants = false): approve this request "
                             "alone, without a grant")
    m = _GRANT.fullmatch(spec.strip())
    if not m:
        raise ValueError(f"grant {spec!r}: give 'METHOD host/path-prefix', e.g. 'POST mail.test/v3/'")
    method, host, prefix = m.group(1), m.group(2).lower(), m.group(3) or "/"
    own = authority(approval["url"])
    if host != own:
        raise ValueError(f"grant {spec!r}: a grant covers the request's own host only ({own})")
    if method != approval["method"] and approval["method"] == "CONNECT":
        raise ValueError(f"grant {spec!r}: this approval is a tunnel (CONNECT); a grant on it is 'CONNECT {own}'")
    return {"method": method, "host": host, "path_prefix": prefix, "seconds": seconds(duration)}


def suggested_grant(approval: dict[str, Any]) -> str:
    """The narrowest grant spec that covers ``approval``'s own request, as
    :func:`parse_grant` takes it: ``'POST mail.test/v3/mail/send'`` (the path without its
    query), ``'CONNECT host:port'`` for a tunnel. What the review page's form starts with."""
    own = authority(approval["url"])
    if approval["method"] == "CONNECT" or "://" not in approval["url"]:
        return f"{approval['method']} {own}"
    path = urllib.parse.urlsplit(approval["url"]).path or "/"
    return f"{approval['method']} {own}{path}"


def authority(url: str) -> str:
    """The authority of an approval's canonical URL (``host``, or ``host:port`` off the
    scheme's default port), as grants name it (gate_core approvals ``Grant.host``);
    ``CONNECT`` approvals hold ``host:port`` itself."""
    if "://" not in url:
        return url.lower()
    return urllib.parse.urlsplit(url).netloc.lower()


def fence_dead_run(store: Any, approval: dict[str, Any]) -> None:
    """End the approval's run in the store if its gatewrap died without ending it (SIGKILL,
    a crash, a power cut): a run of this host (``runs.host`` = /proc/sys/kernel/hostname)
    that the store calls active but whose run lock no process holds
    (:func:`gatewrap.sandbox.registry.alive`). A decision on it is then refused as
    ``run ended`` instead of being recorded as a yes that no gate will ever send. Runs of
    other hosts (a shared PostgreSQL store) are theirs to fence. Store errors propagate
    (OSError, ValueError)."""
    from ..sandbox import registry

    run_id = approval.get("run_id")
    if not run_id or approval.get("status") != "pending":
        return
    try:
        with open("/proc/sys/kernel/hostname", encoding="ascii") as f:
            here = f.read().strip()
    except OSError:
        return
    for r in store.runs(active=True):
        if r["run_id"] == run_id and r["host"] == here and not registry.alive(run_id):
            store.end_run(run_id)


def current(store: Any, approval_id: str) -> dict[str, Any]:
    """The approval, or :class:`Refused` ``not found`` naming how to list them."""
    a = store.get(approval_id)
    if a is None:
        raise Refused(f"no approval {approval_id} in the store {store.url} (gatewrap approvals list)", "not found")
    return a


def decide(store: Any, approval_id: str, verdict: str, *, by: str, version: int | None = None,
           digest: str | None = None, reason: str | None = None,
           grant: tuple[str, str] | None = None) -> dict[str, Any]:
    """Approve or reject (``verdict`` "approve" | "reject"); returns the approval after it.

    ``version``/``digest``: what the human saw; None takes them from a fresh read (the CLI
    after ``show``). ``grant``: ``(spec, duration)`` for :func:`parse_grant`.

    Raises:
        Refused: stale, expired, run ended, not found, or a grant invalid or forbidden.
    """
    from .. import _gate_core as core

    a = current(store, approval_id)
    fence_dead_run(store, a)
    seen_version = a["version"] if version is None else version
    seen_digest = a["digest"] if digest is None else digest
    g = None
    if grant is not None:
        try:
            g = parse_grant(grant[0], grant[1], a)
        except GrantForbidden as e:
            raise Refused(f"refused: {e}", "forbidden") from None
        except ValueError as e:
            raise Refused(f"refused: {e}", "invalid") from None
    try:
        return store.decide(approval_id, version=seen_version, digest=seen_digest, verdict=verdict, by=by,
                            reason=reason, grant=g)
    except core.StaleDecision as e:
        raise stale(store, approval_id, e) from None
    except ValueError as e:
        raise Refused(f"refused: {e}", "invalid") from None


def edit(store: Any, approval_id: str, *, by: str, version: int, digest: str,
         headers: list[tuple[str, str]], body: bytes) -> dict[str, Any]:
    """Replace the request's editable headers and body; returns the approval after it (a new
    version and digest, ``edited`` set; the human must still approve it).

    Raises:
        Refused: stale (someone decided or edited first), or the store refused the edit
            (a header that is not editable, a body too big).
    """
    from .. import _gate_core as core

    fence_dead_run(store, current(store, approval_id))
    try:
        return store.edit(approval_id, version=version, digest=digest, by=by, headers=headers, body=body)
    except core.StaleDecision as e:
        raise stale(store, approval_id, e) from None
    except ValueError as e:
        raise Refused(f"edit refused: {e}", "invalid") from None


def revoke(store: Any, grant_id: str, *, by: str) -> dict[str, Any]:
    """Revoke a grant; returns it. Raises :class:`Refused` if there is none by that id."""
    try:
        return store.revoke_grant(grant_id, by=by)
    except (KeyError, ValueError) as e:
        raise Refused(f"cannot revoke {grant_id}: {e} (gatewrap approvals grants)", "not found") from None


def stale(store: Any, approval_id: str, e: Any) -> Refused:
    """The :class:`Refused` for a ``StaleDecision``: the store's why and its sentence for the
    human (``detail``: who answered first, what to look at again)."""
    why = getattr(e, "why", "stale")
    detail = getattr(e, "detail", "") or str(e)
    hint = {"not found": " (gatewrap approvals list)"}.get(why, "")
    return Refused(f"refused as stale ({why}): {detail}{hint}", why)
