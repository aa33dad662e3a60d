"""The registry's transactions on their own: rollback, durable commits, nesting, group commit
and what a failed COMMIT leaves (a full state disk: SQLite rolls the transaction back itself),
and the checkpoints that keep the WAL bounded. More in tests/unit/test_registry.py."""
from __future__ import annotations

import os
import sqlite3

import pytest

from daemon.registry import ROOT_ID, Registry
from daemon.registry.store import IDLE_SECONDS, PASSIVE_SECONDS

FIELDS = dict(parent=ROOT_ID, kind="alloc", uid=0, gid=0, mode=0o600, created_ns=0,
              modified_ns=0, changed_ns=0, state="ready")
FULL = "database or disk is full"


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "r.sqlite")


@pytest.fixture
def reg(path):
    r = Registry(path)
    yield r
    if isinstance(r.db, FailingCommit):
        r.db = r.db.real
    r.close()


def committed(path: str) -> list[str]:
    """The names another connection (or the next start) sees."""
    db = sqlite3.connect(path)
    try:
        return [r[0] for r in db.execute("SELECT name FROM nodes WHERE id > 1 ORDER BY id")]
    finally:
        db.close()


class FailingCommit:
    """The registry's connection, its next COMMIT failing. `rolled_back`: as SQLite does on a
    full disk (the transaction is gone); else the transaction stays open (SQLITE_BUSY)."""

    def __init__(self, real: sqlite3.Connection, rolled_back: bool = True):
        self.real, self.rolled_back, self.armed = real, rolled_back, True

    def execute(self, sql: str, *args):
        if sql == "COMMIT" and self.armed:
            self.armed = False
            if self.rolled_back:
                self.real.execute("ROLLBACK")
            raise sqlite3.OperationalError(FULL)
        return self.real.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self.real, name)


def test_a_failing_change_leaves_nothing_and_the_registry_usable(reg, path):
    with pytest.raises(RuntimeError), reg.transaction(durable=False):
        reg.nodes.insert(name="a", **FIELDS)
        reg.event_log.add("create", 2, "a", 0, 1, {}, 0)
        raise RuntimeError("a step of the change failed")
    assert not reg.in_transaction and not reg.db.in_transaction
    assert committed(path) == [] and reg.event_log.query() == []
    with reg.transaction(durable=False):
        reg.nodes.insert(name="b", **FIELDS)
    assert committed(path) == ["b"]


def test_a_failing_nested_part_takes_the_whole_change_back(reg, path):
    """A nested transaction() joins the outer one: there is one change, whole or not at all."""
    with pytest.raises(RuntimeError), reg.transaction(durable=False):
        reg.nodes.insert(name="outer", **FIELDS)
        with reg.transaction(durable=True):
            assert reg.in_transaction
            reg.nodes.insert(name="inner", **FIELDS)
            raise RuntimeError("boom")
    assert committed(path) == [] and len(reg.nodes.load()) == 1


def test_only_durable_changes_fsync_the_wal(reg, monkeypatch):
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    with reg.transaction(durable=False):
        reg.nodes.insert(name="a", **FIELDS)
    assert synced == []
    with reg.transaction(durable=True):
        reg.nodes.insert(name="b", **FIELDS)
    assert len(synced) == 1
    with reg.transaction(durable=False, batch=True):    # a durable part makes it durable
        reg.nodes.insert(name="c", **FIELDS)
        with reg.transaction(durable=True):
            reg.nodes.insert(name="d", **FIELDS)
    assert len(synced) == 2


def test_an_unbatched_change_commits_at_once_even_with_group_commit_on(reg, path):
    batches: list[int] = []
    reg.enable_group_commit(lambda: batches.append(1))
    with reg.transaction(durable=False):
        reg.nodes.insert(name="dir-like", **FIELDS)
    assert committed(path) == ["dir-like"] and batches == []
    reg.flush()                                        # nothing open: nothing to do
    assert not reg.db.in_transaction


def test_a_batch_lost_to_a_failed_commit_is_reported_to_its_owner(reg, path):
    """A full disk at the batch's COMMIT: SQLite rolls it back, its changes (answered already)
    are not in the file; `batch_lost` says so and the owner is told (it rewrites the registry
    from memory), and the next change begins a new transaction."""
    told: list[int] = []
    reg.enable_group_commit(lambda: told.append(1))
    with reg.transaction(durable=False, batch=True):
        reg.nodes.insert(name="t1", **FIELDS)
    with reg.transaction(durable=False, batch=True):
        reg.nodes.insert(name="t2", **FIELDS)
    assert told == [1] and not reg.batch_lost
    reg.db = FailingCommit(reg.db)                    # type: ignore[assignment]
    with pytest.raises(sqlite3.OperationalError, match=FULL):
        reg.flush()
    assert reg.batch_lost and told == [1, 1]
    assert committed(path) == [] and not reg.db.in_transaction
    with reg.transaction(durable=False):              # the next change works
        reg.nodes.insert(name="n1", **FIELDS)
    assert committed(path) == ["n1"]


def test_a_failed_commit_of_a_change_of_its_own_is_not_a_lost_batch(reg, path):
    """The change that failed was never answered: it raises, and nothing batched was lost."""
    reg.enable_group_commit(lambda: None)
    reg.db = FailingCommit(reg.db)                    # type: ignore[assignment]
    with pytest.raises(sqlite3.OperationalError, match=FULL):
        with reg.transaction(durable=True):
            reg.nodes.insert(name="d1", **FIELDS)
    assert not reg.batch_lost and committed(path) == []
    with reg.transaction(durable=False, batch=True):
        reg.nodes.insert(name="t1", **FIELDS)
    reg.flush()
    assert committed(path) == ["t1"]


def test_a_commit_that_leaves_the_transaction_open_is_retried(reg, path):
    """A COMMIT that fails without a rollback (the transaction is still open): nothing is
    lost, and the next flush commits the batch."""
    reg.enable_group_commit(lambda: None)
    with reg.transaction(durable=False, batch=True):
        reg.nodes.insert(name="t1", **FIELDS)
    reg.db = FailingCommit(reg.db, rolled_back=False)  # type: ignore[assignment]
    with pytest.raises(sqlite3.OperationalError):
        reg.flush()
    assert not reg.batch_lost and reg.db.in_transaction
    reg.flush()
    assert committed(path) == ["t1"]


def test_rollback_and_failed_commits_recount_the_event_log(reg):
    """The event log's byte count (what its bound prunes by) is kept in memory: a change
    taken back, or a batch a failed commit lost, must not leave it counting events that are
    not in the table."""
    def table_bytes() -> int:
        return reg.db.execute("SELECT COALESCE(SUM(length(CAST(detail AS BLOB)) +"
                              " COALESCE(length(CAST(path AS BLOB)), 0)), 0)"
                              " FROM events").fetchone()[0]

    with reg.transaction(durable=False):
        reg.event_log.add("mkdir", None, "kept", 0, 1, {"n": 1}, 0)
    assert reg.event_log.size_bytes() == table_bytes() > 0
    with pytest.raises(RuntimeError), reg.transaction(durable=False):
        reg.event_log.add("mkdir", None, "gone", 0, 1, {"n": "x" * 500}, 0)
        raise RuntimeError
    assert reg.event_log.size_bytes() == table_bytes()
    reg.enable_group_commit(lambda: None)
    with reg.transaction(durable=False, batch=True):
        reg.event_log.add("create", None, "lost", 0, 1, {"n": "y" * 500}, 0)
    reg.db = FailingCommit(reg.db)                    # type: ignore[assignment]
    with pytest.raises(sqlite3.OperationalError):
        reg.flush()
    assert reg.event_log.size_bytes() == table_bytes()


def test_checkpoint_due_follows_changes_idleness_and_an_open_batch(reg):
    """PASSIVE once something changed (at most every PASSIVE_SECONDS), TRUNCATE once idle with
    a WAL left; never a TRUNCATE while a batch is open (it would wait on it)."""
    reg.enable_group_commit(lambda: None)
    opened = reg.last_change                  # (no checkpoint yet: the open counts as one)
    with reg.transaction(durable=False):
        reg.nodes.insert(name="a", **FIELDS)
    assert reg.checkpoint_due(reg.last_change) is None     # too soon after the last one
    assert reg.checkpoint_due(opened + PASSIVE_SECONDS) == "PASSIVE"   # changed, not idle
    with reg.transaction(durable=False, batch=True):      # a batch open ...
        reg.nodes.insert(name="b", **FIELDS)
    assert reg.checkpoint_due(reg.last_change + IDLE_SECONDS) != "TRUNCATE"
    reg.flush()                                           # ... and committed: idle
    assert reg.checkpoint_due(reg.last_change + IDLE_SECONDS) == "TRUNCATE"
    busy, frames, done = reg.checkpoint("TRUNCATE")
    assert busy == 0 and frames == done and reg.wal_bytes() == 0
    assert reg.checkpoint_due(reg.last_change + IDLE_SECONDS) is None
    with pytest.raises(ValueError):
        reg.checkpoint("NOW")


def test_the_integrity_check_on_its_own_connection_runs_beside_an_open_batch(reg):
    reg.enable_group_commit(lambda: None)
    with reg.transaction(durable=False, batch=True):
        reg.nodes.insert(name="a", **FIELDS)
    assert reg.db.in_transaction
    assert reg.integrity_errors_readonly() == [] and reg.integrity_errors() == []
