"""The event log's bounds on a registry of its own: rows, bytes, each user's share of the
bytes, and the answers' own byte budget (docs/durability.md, "Bounds")."""
from __future__ import annotations

import os

import pytest

from daemon.registry import EVENT_SHARE_PER_UID, Registry
from daemon.registry.eventlog import EVENT_PRUNE_TO

LIMIT = 20_000                # max_event_bytes of these registries
USER, OTHER = 40001, 40002    # neither root nor the daemon's own uid (these tests' euid)
SHARE = int(LIMIT * EVENT_SHARE_PER_UID)


@pytest.fixture
def reg(tmp_path):
    r = Registry(str(tmp_path / "r.sqlite"), max_event_bytes=LIMIT)
    yield r
    r.close()


def add(reg: Registry, uid: int | None, path: str = "p", size: int = 100,
        node: int | None = 1) -> int:
    with reg.transaction(durable=False):
        return reg.event_log.add("write", node, path, uid, 1, {"x": "y" * size}, 0)


def held(reg: Registry, uid: int | None) -> int:
    where, args = ("uid IS NULL", ()) if uid is None else ("uid = ?", (uid,))
    return reg.db.execute("SELECT COALESCE(SUM(length(CAST(detail AS BLOB)) +"
                          " COALESCE(length(CAST(path AS BLOB)), 0)), 0) FROM events"
                          f" WHERE {where}", args).fetchone()[0]


def test_one_user_is_held_to_its_share_and_the_others_keep_theirs(reg):
    early = [add(reg, OTHER) for _ in range(10)]
    daemon_wide = add(reg, None, node=None)
    for _ in range(200):                                  # 4 times the share, and more
        newest = add(reg, USER)
        assert held(reg, USER) <= SHARE
    assert held(reg, USER) >= int(SHARE * EVENT_PRUNE_TO) - 200      # pruned to 75%, not 0
    ids = [e["id"] for e in reg.event_log.query(limit=10_000)]
    assert set(early) <= set(ids) and daemon_wide in ids and newest in ids
    assert reg.event_log.size_bytes() == held(reg, USER) + held(reg, OTHER) + held(reg, None)


@pytest.mark.parametrize("uid", [None, 0, os.geteuid()])
def test_root_the_daemon_and_daemon_wide_events_have_no_share(reg, uid):
    """Past a user's share but within the log's bound: those events all stay."""
    for _ in range(2 * SHARE // 120):
        add(reg, uid)
    assert SHARE < held(reg, uid) <= LIMIT


def test_the_log_is_held_to_its_bytes_oldest_first_and_the_newest_stays(reg):
    first = add(reg, 0)
    for _ in range(400):
        newest = add(reg, 0)
        assert reg.event_log.size_bytes() <= LIMIT
    ids = [e["id"] for e in reg.event_log.query(limit=10_000)]
    assert first not in ids and ids[-1] == newest
    assert ids == list(range(ids[0], newest + 1))           # only the oldest went
    huge = add(reg, 0, size=2 * LIMIT)                      # larger than the whole bound
    assert [e["id"] for e in reg.event_log.query(limit=10_000)] == [huge]


def test_the_log_is_held_to_its_rows(tmp_path):
    reg = Registry(str(tmp_path / "r.sqlite"), max_events=100)
    try:
        for _ in range(1000):
            newest = add(reg, 0, size=1)
            assert reg.db.execute("SELECT COUNT(*) FROM events").fetchone()[0] <= 2 * 100
        ids = [e["id"] for e in reg.event_log.query(limit=10_000)]
        assert ids[-1] == newest and len(ids) <= 100 + 1
        assert ids == list(range(ids[0], newest + 1))
    finally:
        reg.close()


def test_the_count_survives_a_reopen(tmp_path):
    """The byte count starts from the table (a start after a crash): pruning goes on."""
    path = str(tmp_path / "r.sqlite")
    reg = Registry(path, max_event_bytes=LIMIT)
    for _ in range(100):
        add(reg, 0)
    before = held(reg, 0)
    reg.close()
    reg = Registry(path, max_event_bytes=LIMIT)
    try:
        assert reg.event_log.size_bytes() == before
        for _ in range(200):
            add(reg, 0)
        assert reg.event_log.size_bytes() == held(reg, 0) <= LIMIT
    finally:
        reg.close()


def test_a_page_fits_its_byte_budget_newest_first(reg):
    ids = [add(reg, USER, size=100) for _ in range(10)]
    one = len('{"x": ""}') + 100 + len("p")
    page, complete = reg.event_log.page(max_bytes=3 * one)
    assert [e["id"] for e in page] == ids[-3:] and not complete
    page, complete = reg.event_log.page(max_bytes=1)           # the newest always comes
    assert [e["id"] for e in page] == ids[-1:] and not complete
    page, complete = reg.event_log.page(max_bytes=100 * one)
    assert [e["id"] for e in page] == ids and complete


def test_what_a_user_may_see_of_the_log(reg):
    mine = add(reg, USER)
    add(reg, OTHER)                                         # another user's: never
    daemon_wide = add(reg, None, node=None)                 # the daemon's own: always
    others_wide = add(reg, OTHER, node=None)                # another's daemon-wide: admins
    assert [e["id"] for e in reg.event_log.query(uid=USER)] == [mine, daemon_wide]
    page, _ = reg.event_log.page(uid=USER, administrator=True)
    assert [e["id"] for e in page] == [mine, daemon_wide, others_wide]
