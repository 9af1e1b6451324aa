"""How ``gatewrap ps`` shows run ids: a container's run id (``gw-`` and 64 characters) cut to
what ``docker ps`` shows of it, or as much more as tells it from the other live runs."""

from __future__ import annotations

import pytest

from gatewrap.run_ids import short_ids

A = "9a109c573f51" + "a" * 52
B = "9a109c573f51" + "b" * 52

CASES = [
    ("a gatewrap run's id is shown whole", ["gw-0123456789"], ["gw-0123456789"]),
    ("a container's run: gw- and the 12 characters docker ps shows", ["gw-" + A], ["gw-9a109c573f51"]),
    ("two containers sharing those 12: one more each, as tells them apart", ["gw-" + A, "gw-" + B],
     ["gw-9a109c573f51a", "gw-9a109c573f51b"]),
    ("a run whose id starts another's is shown whole, the other one character further",
     ["gw-0123456789", "gw-0123456789abcdef"], ["gw-0123456789", "gw-0123456789ab"]),
    ("a short container id (ctr's own names) is shown whole", ["gw-web"], ["gw-web"]),
]


@pytest.mark.parametrize("ids, shown", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_ps_shows_the_shortest_start_of_at_least_12_characters_no_other_run_shares(ids, shown):
    got = short_ids(ids)
    assert [got[i] for i in ids] == shown
    for i in ids:  # a start of its own run only: what gatewrap stop resolves
        assert [j for j in ids if j.startswith(got[i])] == [i] or got[i] == i
