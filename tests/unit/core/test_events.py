"""What an event may carry (daemon/core/events.py) on its own: the schema per kind, the size
bounds, who may see an event, and each user's share of the log's lines."""
from __future__ import annotations

import json

from daemon.core.events import (
    DETAIL_LIMIT,
    LIST_LIMIT,
    STRING_LIMIT,
    LineBudget,
    bound_detail,
    cut,
    visible_to,
)


def test_only_the_schemas_keys_and_types_are_kept():
    detail = bound_detail("resize", {"size": 5, "capacity": "big", "color": "red",
                                     "old_size": None})
    assert detail == {"size": 5, "old_size": None, "dropped_keys": 2}
    assert bound_detail("durable", {}) == {}
    assert bound_detail("seal", {"reason": True}) == {"dropped_keys": 1}   # a bool, not str
    assert bound_detail("resize", {"size": 1 << 64}) == {"dropped_keys": 1}  # out of range


def test_a_client_reports_numbers_only():
    assert bound_detail("write", {"offset": 0, "bytes": 9, "note": "hi"}) == \
        {"offset": 0, "bytes": 9, "dropped_keys": 1}


def test_long_strings_are_cut_with_a_marker():
    detail = bound_detail("seal", {"reason": "x" * (STRING_LIMIT + 100)})
    assert len(detail["reason"]) <= STRING_LIMIT
    assert detail["reason"].endswith("more characters]")
    assert cut("short") == "short"


def test_long_lists_are_summarised():
    blocks = list(range(LIST_LIMIT + 4))
    assert bound_detail("damage", {"blocks": blocks})["blocks"] == \
        {"count": LIST_LIMIT + 4, "first": 0, "last": LIST_LIMIT + 3}
    ranges = [[i * 10, i * 10 + 4] for i in range(LIST_LIMIT + 1)]
    summary = bound_detail("write", {"ranges": ranges})["ranges"]
    assert summary["bytes"] == 4 * (LIST_LIMIT + 1) and summary["last"] == ranges[-1]
    assert bound_detail("write", {"ranges": [[5, 1]]}) == {"dropped_keys": 1}  # not a range
    assert bound_detail("damage", {"blocks": [1, 2]}) == {"blocks": [1, 2]}


def test_the_whole_detail_fits_its_limit():
    many = {f"k{i}": "\U0001f600" * 1000 for i in range(20)}     # an unknown kind
    detail = bound_detail("no-such-kind", many)
    assert len(json.dumps(detail, sort_keys=True)) <= DETAIL_LIMIT
    snapshot = bound_detail("snapshot", {k: "é" * 1000 for k in ("snapshot", "location",
                                                                 "result", "io")})
    assert len(json.dumps(snapshot, sort_keys=True)) <= DETAIL_LIMIT
    assert set(snapshot) == {"snapshot", "location", "result", "io"}


def test_an_unknown_kind_keeps_short_scalar_keys():
    assert bound_detail("new-kind", {"a": 1, "b": [1], "c": None, "k" * 65: 1}) == \
        {"a": 1, "c": None, "dropped_keys": 2}


def test_who_sees_an_event():
    mine = {"uid": 1000, "node": 5}
    daemons = {"uid": None, "node": None}
    anothers_report = {"uid": 1001, "node": None}
    anothers_node = {"uid": 1001, "node": 5}
    assert visible_to(mine, 1000, administrator=False)
    assert visible_to(daemons, 1000, administrator=False)
    assert not visible_to(anothers_report, 1000, administrator=False)
    assert visible_to(anothers_report, 1000, administrator=True)
    assert not visible_to(anothers_node, 1000, administrator=True)


def test_each_user_writes_a_burst_of_lines_then_a_rate():
    budget = LineBudget(lambda uid: uid == 0)
    now = 100.0
    assert all(budget.take(1000, now) for _ in range(LineBudget.LINES_BURST))
    assert not budget.take(1000, now)
    assert not budget.take(1000, now)
    assert budget.take(1001, now)               # another user has a bucket of its own
    assert budget.take(0, now) and budget.take(None, now)   # never limited
    assert budget.take(1000, now + 1.5 / LineBudget.LINES_PER_SECOND)   # a line later
    assert budget.left_out(1000) == 2
    assert budget.left_out(1000) == 0           # told once
