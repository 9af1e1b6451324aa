"""Approvals are bounded (issue 21, item 8): at most ``max_pending`` pending approvals per run
and ``max_pending_store`` in the whole store (the policy's ``[approvals]``; past either a new
request is refused, never held, and an identical retry still joins its approval); and
``gatewrap approvals prune --older-than DURATION`` removes what was decided or expired that long
ago, never what is pending. SQLite and PostgreSQL."""

from __future__ import annotations

import json
import time

import pytest

from gatewrap import _gate_core as core

from .held import cli

RUN, OTHER = "gw-00000000e1", "gw-00000000e2"


def _ask(store, run, n, **kw):
    return store.ask(run, rule="r", method="POST", url=f"https://mail.test/send?n={n}", headers=[], body=b"x", **kw)


def test_a_run_past_its_pending_cap_is_refused_and_a_retry_still_joins(store):
    store.start_run(RUN)
    first, _ = _ask(store, RUN, 1, max_pending=2)
    _ask(store, RUN, 2, max_pending=2)
    with pytest.raises(core.PendingLimit) as e:
        _ask(store, RUN, 3, max_pending=2)
    assert e.value.scope == "run" and "2 approvals pending" in str(e.value) and "max_pending" in str(e.value)
    again, new = _ask(store, RUN, 1, max_pending=2)
    assert (again["id"], new, again["waiters"]) == (first["id"], False, 2), "an identical retry joins"
    store.decide(first["id"], version=1, digest=first["digest"], verdict="reject", by="t", reason="no")
    _ask(store, RUN, 3, max_pending=2)  # room again once one is decided


def test_the_store_s_cap_counts_every_run(store):
    store.start_run(RUN)
    store.start_run(OTHER)
    _ask(store, RUN, 1, max_pending_store=2)
    _ask(store, OTHER, 2, max_pending_store=2)
    with pytest.raises(core.PendingLimit) as e:
        _ask(store, OTHER, 3, max_pending_store=2)
    assert e.value.scope == "store" and "max_pending_store" in str(e.value)


def test_the_default_caps_are_documented_values(store):
    assert (core.DEFAULT_MAX_PENDING, core.DEFAULT_MAX_PENDING_STORE) == (100, 1000)


def _old(store, run, n, verdict):
    a, _ = _ask(store, run, n)
    if verdict:
        return store.decide(a["id"], version=1, digest=a["digest"], verdict=verdict, by="t", reason="r")
    return a


def test_prune_removes_what_was_decided_or_expired_before_and_keeps_what_is_pending(store, store_url):
    store.start_run(RUN)
    rejected = _old(store, RUN, 1, "reject")
    approved = _old(store, RUN, 2, "approve")
    store.end_run(RUN)  # the approved one, never sent, is cancelled with its run
    store.start_run(OTHER)
    expired, _ = store.ask(OTHER, rule="r", method="POST", url="https://mail.test/e", headers=[], body=b"",
                           timeout=0.01)
    pending = _old(store, OTHER, 3, None)
    time.sleep(1.2)  # what came before is more than 1 s old (a bound, not a timing assertion)
    third = "gw-00000000e3"
    store.start_run(third)
    fresh = _old(store, third, 4, "reject")
    r = cli("prune", "--older-than", "1s", "--json", "--state", store_url)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["approvals"], out["runs"]) == (3, 1), out  # the ended run with nothing left goes too
    left = {a["id"] for a in store.list(limit=100)}
    assert left == {pending["id"], fresh["id"]}
    assert not {rejected["id"], approved["id"], expired["id"]} & left
    assert [r["run_id"] for r in store.runs()] == [third, OTHER]
    text = cli("prune", "--older-than", "1d", "--state", store_url)
    assert text.returncode == 0 and "pruned 0 approvals" in text.stdout, text.stdout


@pytest.mark.parametrize("bad", ["", "10", "1w", "-1d", "0s", "1.5h", "9" * 30 + "d"])
def test_prune_refuses_a_malformed_duration_and_removes_nothing(store, store_url, bad):
    store.start_run(RUN)
    _old(store, RUN, 1, "reject")
    r = cli("prune", "--older-than", bad, "--state", store_url)
    assert r.returncode == 125 and "--older-than" in r.stderr and "30m" in r.stderr, r.stderr
    assert len(store.list()) == 1
