"""A run as a user names it: its whole id, or a start of it that no other run's id has, as
docker takes a container's short id (``gatewrap stop``, ``gatewrap audit --run``).

Every command that takes a run's id takes a start of it through :func:`named`, each over the
runs it can know: ``gatewrap stop`` and ``reload`` the live ones
(:func:`gatewrap.live_runs.resolve`), ``gatewrap audit``, ``audit stats`` and ``policy suggest``
those of the audit log (:func:`gatewrap.cli_audit.run_in_log`), ``gatewrap approvals list`` and
``grants`` those of the approvals store.

A run's id is ``gw-`` and 10 hex digits (:func:`gatewrap.runner.new_run_id`); a container's
run's is ``gw-`` and the engine's container id (:mod:`gatewrap.oci`: 64 hex digits from
docker and podman, whose ``ps`` shows the first 12; ``gatewrap ps`` shows ``gw-`` and those
12). A start may leave the ``gw-`` out. Tables show a run's id so (:func:`shown`, :func:`short`),
whole with ``--no-trunc``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable

from .oci.argv import RUN_PREFIX

#: The shortest name taken as a start; a shorter one is taken as a whole id.
MIN_PREFIX = 4
#: How many runs the error of a start of several lists.
LISTED = 5
#: How much of a run id tables show at least: ``gw-`` and 12 characters, as ``docker ps`` and
#: ``podman ps`` show 12 of a container's 64 (a run of gatewrap run's, ``gw-`` and 10, whole).
SHORT_ID = len(RUN_PREFIX) + 12
#: The longest run id a docker or podman container's run has: ``gw-`` and 64 characters.
CONTAINER_ID = len(RUN_PREFIX) + 64
#: The ids only a whole id can be: a gatewrap run's, a docker or podman container's run's.
_WHOLE = re.compile(r"gw-(?:[0-9a-f]{10}|[0-9a-f]{64})")


class Ambiguous(ValueError):
    """A start of more than one run's id (the message lists them and says to give more)."""


def start(name: str) -> str | None:
    """What the ids of the runs ``name`` may name start with: ``name``, with ``gw-`` put
    before it when it lacks it; None when it is shorter than :data:`MIN_PREFIX` (a whole id
    only)."""
    if len(name) < MIN_PREFIX:
        return None
    return name if name.startswith(RUN_PREFIX) else RUN_PREFIX + name


def whole(name: str) -> bool:
    """Whether ``name`` has the shape of a whole run id (a gatewrap run's, a docker or podman
    container's run's), which a reader that must search for the runs a start names (``gatewrap
    audit --run``) takes as it is: ``gw-`` and 10 characters are then never the start of a
    container's run."""
    return _WHOLE.fullmatch(name) is not None


def one(name: str, found: Iterable[str], where: str) -> str:
    """The run ``name`` names among ``found``, the ids that start with :func:`start` of it:
    ``name`` itself when it is one of them, else the only one; ``name`` when there is none.
    ``where``: what the runs are, for the error (``live run``, ``run in LOG``).

    Raises:
        Ambiguous: more than one, and ``name`` is none of them.
    """
    ids = sorted(set(found))
    if name in ids or not ids:
        return name
    if len(ids) > 1:
        shown = ", ".join(ids[:LISTED]) + (", ..." if len(ids) > LISTED else "")
        raise Ambiguous(f"{name} starts the id of more than one {where} ({shown}): give more of it")
    return ids[0]


def named(name: str, search: Callable[[str], Iterable[str]], where: str) -> str:
    """The run ``name`` names among the runs a command knows: ``name`` when it is shorter than
    :data:`MIN_PREFIX` (a whole id only), else :func:`one` of what ``search(begins)`` gives,
    ``begins`` being :func:`start` of it. ``search``: the ids of those runs that start with
    its argument (called only here, so a search that reads a log is skipped for a short name);
    ``where``: what the runs are, for the error (``live run``, ``run in LOG``).

    Raises:
        Ambiguous: more than one of them, and ``name`` is none of them (they are listed).
    """
    begins = start(name)
    return name if begins is None else one(name, search(begins), where)


def short(run: str, shared: int = 0) -> str:
    """``run`` as a table shows it: its first :data:`SHORT_ID` characters (the whole id when it
    is no longer), or ``shared`` + 1 when another run's id starts with its first ``shared``
    characters. A table printed as the log is read (``gatewrap audit``) sees no other runs:
    ``shared`` 0, and the start is still what ``--run`` takes (or names the runs it starts)."""
    return run[:max(SHORT_ID, shared + 1)]


def short_ids(ids: list[str]) -> dict[str, str]:
    """Each of ``ids`` as ``gatewrap ps`` shows it: :func:`short` of it, long enough that none
    of the others starts with it, which :func:`gatewrap.live_runs.resolve` takes for it (a
    container's run id is ``gw-`` and its 64-character id)."""
    order = sorted(set(ids))
    out = {}
    for k, run in enumerate(order):
        shared = max((len(os.path.commonprefix([run, order[j]])) for j in (k - 1, k + 1) if 0 <= j < len(order)),
                     default=0)
        out[run] = short(run, shared)
    return out


def shown(ids: list[str], whole_ids: bool) -> dict[str, str]:
    """Each of ``ids`` as a table of them all shows it: whole (``--no-trunc``), else
    :func:`short_ids`."""
    return {r: r for r in ids} if whole_ids else short_ids(ids)
