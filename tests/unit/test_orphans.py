"""Which keeper entries a start may free as crash residue, and which make it refuse
(daemon/core/orphans.py; the daemon-level behaviour: tests/integration/test_startup_safety.py)."""
from __future__ import annotations

import pytest

from daemon.core.orphans import classify, entry_name, held

ME, OTHER = "aaaa", "bbbb"


def mine(capacity: int = 4096) -> dict:
    return {"capacity": capacity, "device": "d", "registry": ME}


@pytest.mark.parametrize("kept, metas, listed, created, last_id, foreign, why", [
    # nothing held: nothing to decide
    ({}, {}, set(), True, 0, set(), ""),
    # listed entries of this registry are simply adopted
    ({5: [], -5: []}, {5: mine(), -5: mine()}, {5}, False, 5, set(), ""),
    # one unlisted key above the last id: the create a crash interrupted (residue)
    ({5: [], 6: []}, {5: mine(), 6: mine()}, {5}, False, 5, set(), ""),
    # unlisted keys at or below the last id: removals a crash interrupted (residue)
    ({3: [], 4: []}, {3: mine(), 4: mine()}, set(), False, 9, set(), ""),
    # a registry made by this start lists nothing the keeper holds
    ({3: [], 4: []}, {3: mine(), 4: mine()}, set(), True, 1, {3, 4}, "it is new"),
    # deposits for another registry, even under ids this one lists
    ({3: [], 4: []}, {3: {"registry": OTHER}, 4: mine()}, {3, 4}, False, 4, {3},
     "they were deposited for another registry"),
    # two or more keys above the last id: the registry is older than the keeper's contents
    ({5: [], 6: [], 7: []}, {k: mine() for k in (5, 6, 7)}, {5}, False, 5, {6, 7},
     "it is older than what the keeper holds"),
    # no meta at all (systemd's fd store): the same rules without identity
    ({5: [], 6: [], 7: []}, None, {5}, False, 5, {6, 7},
     "it is older than what the keeper holds"),
    ({5: [], 6: []}, None, {5}, False, 5, set(), ""),
])
def test_classify(kept, metas, listed, created, last_id, foreign, why):
    assert classify(kept, metas, listed, ME, created, last_id) == (foreign, why)


def test_held_counts_a_staged_copy_once_and_names_entries():
    kept = {7: [], -7: [], 9: []}
    metas = {7: mine(4096), -7: mine(8192), 9: mine(2 << 20)}
    assert held(kept, metas, {7, -7, 9}) == (2, 4096 + (2 << 20))
    assert held(kept, metas, {-7}) == (1, 8192)
    assert (entry_name(7), entry_name(-7)) == ("7", "7.staged")
