"""The registry on its own: schema, versions, transactions, event log."""
from __future__ import annotations

import os
import sqlite3

import pytest

from daemon.registry import SCHEMA_VERSION, Registry


def test_fresh_registry_has_root_wal_and_version(tmp_path):
    reg = Registry(str(tmp_path / "r.sqlite"))
    assert reg.version() == SCHEMA_VERSION
    assert reg.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    rows = reg.nodes.load()
    assert [(r["id"], r["kind"], r["mode"]) for r in rows] == [(1, "dir", 0o1777)]
    reg.close()


def test_rollback_leaves_nothing(tmp_path):
    reg = Registry(str(tmp_path / "r.sqlite"))
    with pytest.raises(RuntimeError):
        with reg.transaction(durable=True):
            reg.nodes.insert(parent=1, name="x", kind="alloc", uid=0, gid=0, mode=0o600,
                            created_ns=0, modified_ns=0, changed_ns=0, state="ready")
            raise RuntimeError("boom")
    assert len(reg.nodes.load()) == 1
    reg.close()


def test_ids_are_never_reused(tmp_path):
    """Keeper keys are node ids: a removed id must not come back for a new allocation."""
    reg = Registry(str(tmp_path / "r.sqlite"))
    fields = dict(parent=1, kind="alloc", uid=0, gid=0, mode=0o600, created_ns=0,
                  modified_ns=0, changed_ns=0, state="ready")
    with reg.transaction(durable=False, batch=True):
        first = reg.nodes.insert(name="a", **fields)
        reg.nodes.delete(first)
    with reg.transaction(durable=False, batch=True):
        assert reg.nodes.insert(name="b", **fields) > first
    reg.close()


def test_newer_schema_is_refused(tmp_path):
    path = str(tmp_path / "r.sqlite")
    Registry(path).close()
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(RuntimeError, match="newer"):
        Registry(path)


def test_events_filter_by_path_prefix(tmp_path):
    reg = Registry(str(tmp_path / "r.sqlite"))
    with reg.transaction(durable=False, batch=True):
        for path in ("a", "a/b", "ab", "c"):
            reg.event_log.add("create", None, path, 0, os.getpid(), {"n": path}, 1)
    assert [e["path"] for e in reg.event_log.query(path="a")] == ["a", "a/b"]
    assert [e["path"] for e in reg.event_log.query(since=2, limit=1)] == ["c"]
    reg.close()


def test_checkpoint_folds_the_wal_from_another_connection(tmp_path):
    """Automatic checkpoints are off (they would stall a request); checkpoint() does the work
    and the data is in the database file afterwards."""
    path = str(tmp_path / "r.sqlite")
    reg = Registry(path)
    fields = dict(parent=1, kind="alloc", uid=0, gid=0, mode=0o600, created_ns=0,
                  modified_ns=0, changed_ns=0, state="ready")
    for i in range(300):
        with reg.transaction(durable=False, batch=True):
            reg.nodes.insert(name=f"n{i}", **fields)
    wal = tmp_path / "r.sqlite-wal"
    assert wal.stat().st_size > 0
    busy, frames, done = reg.checkpoint("TRUNCATE")
    assert busy == 0 and frames == done
    assert wal.stat().st_size == 0
    reg.close()
    assert len(Registry(path).nodes.load()) == 301


FIELDS = dict(parent=1, kind="alloc", uid=0, gid=0, mode=0o600, created_ns=0, modified_ns=0,
              changed_ns=0, state="ready")


def committed_names(path: str) -> list[str]:
    """What another process (or the next start after a crash) would see."""
    db = sqlite3.connect(path)
    try:
        return [r[0] for r in db.execute("SELECT name FROM nodes WHERE id > 1 ORDER BY id")]
    finally:
        db.close()


def test_group_commit_batches_transient_changes(tmp_path):
    path = str(tmp_path / "r.sqlite")
    reg = Registry(path)
    reg.group_commit = True
    batches = []
    reg.on_batch = lambda: batches.append(1)
    with reg.transaction(durable=False, batch=True):
        reg.nodes.insert(name="t1", **FIELDS)
    with reg.transaction(durable=False, batch=True):
        reg.nodes.insert(name="t2", **FIELDS)
    assert batches == [1]                              # one flush scheduled for both
    assert committed_names(path) == []                 # a crash now loses them (transient)
    assert [r["name"] for r in reg.nodes.load()][1:] == ["t1", "t2"]   # this connection sees
    with pytest.raises(RuntimeError):                  # a failed change leaves the batch
        with reg.transaction(durable=False, batch=True):
            reg.nodes.insert(name="bad", **FIELDS)
            raise RuntimeError("boom")
    reg.flush()
    assert committed_names(path) == ["t1", "t2"]
    with reg.transaction(durable=False, batch=True):
        reg.nodes.insert(name="t3", **FIELDS)
    with reg.transaction(durable=False):               # not batched (a directory, say):
        reg.nodes.insert(name="n1", **FIELDS)           # commits the batch with itself
    assert committed_names(path) == ["t1", "t2", "t3", "n1"]
    with reg.transaction(durable=False, batch=True):
        reg.nodes.insert(name="t3b", **FIELDS)
    with reg.transaction(durable=True):                # and so does a durable change
        reg.nodes.insert(name="d1", **FIELDS)
    assert committed_names(path) == ["t1", "t2", "t3", "n1", "t3b", "d1"]
    with reg.transaction(durable=False, batch=True):
        reg.nodes.insert(name="t4", **FIELDS)
    reg.close()                                        # a clean stop commits the batch
    assert committed_names(path) == ["t1", "t2", "t3", "n1", "t3b", "d1", "t4"]


def test_nested_durable_part_makes_the_commit_durable(tmp_path):
    path = str(tmp_path / "r.sqlite")
    reg = Registry(path)
    reg.group_commit = True
    with reg.transaction(durable=False, batch=True):
        reg.nodes.insert(name="outer", **FIELDS)
        with reg.transaction(durable=True):
            reg.nodes.insert(name="inner", **FIELDS)
    assert committed_names(path) == ["outer", "inner"]
    reg.close()
