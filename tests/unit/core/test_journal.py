"""The journal (daemon/core/journal.py) on its own: one change is one registry transaction
with an undo log; a change that fails leaves the registry and every in-memory step as they
were; events are rows written inside the change and published only after its commit."""
from __future__ import annotations

import sqlite3

import pytest

from daemon.core.journal import Journal
from daemon.core.nodes import Directory
from gpumemctl.protocol import InternalError, NoMemory
from tests.registryfaults import FULL

from .parts import ALICE, events, failing, row


class Thing:
    """Something in memory that a change edits (a node, in the daemon)."""

    def __init__(self):
        self.size, self.name = 1, "a"


def insert_dir(registry, name: str) -> int:
    return registry.nodes.insert(parent=1, name=name, kind="dir", uid=0, gid=0, mode=0o755,
                                 created_ns=1, modified_ns=1, changed_ns=1)


def test_a_change_commits_its_rows_and_events(registry, journal):
    with journal.change(durable=True):
        node_id = insert_dir(registry, "d")
        journal.event("mkdir", None, ALICE, mode="0755")
    assert row(registry, node_id)["name"] == "d"
    [event] = events(registry, "mkdir")
    assert (event["uid"], event["pid"], event["node"]) == (1000, ALICE.pid, None)
    assert '"mode": "0755"' in event["detail"]
    assert journal.last_event_id() == event["id"]
    assert not journal.in_change


def test_an_error_inside_a_change_takes_back_rows_events_and_memory(registry, journal):
    thing, undone = Thing(), []
    with pytest.raises(ValueError, match="boom"):
        with journal.change(durable=False):
            node_id = insert_dir(registry, "d")
            journal.keep(thing, "size", "name")
            thing.size, thing.name = 99, "changed"
            journal.on_rollback(lambda: undone.append("first"))
            journal.on_rollback(lambda: undone.append("second"))
            journal.event("mkdir", None, ALICE, mode="0755")
            raise ValueError("boom")            # the caller's own error goes on up as it is
    assert row(registry, node_id) is None
    assert events(registry) == []
    assert (thing.size, thing.name) == (1, "a")
    assert undone == ["second", "first"]        # newest first
    assert not journal.in_change


def test_a_full_disk_is_no_memory_and_changes_nothing(registry, journal):
    thing = Thing()
    with pytest.raises(NoMemory) as exc:
        with journal.change(durable=True):
            journal.keep(thing, "size")
            thing.size = 2
            insert_dir(registry, "d")
            raise sqlite3.OperationalError(FULL)
    assert exc.value.details["errno"] == "ENOSPC"
    assert "nothing was changed" in str(exc.value)
    assert thing.size == 1
    assert registry.db.execute("SELECT count(*) FROM nodes").fetchone()[0] == 1   # the root


def test_any_other_registry_error_is_an_internal_error(registry, journal):
    insert_dir_ok = insert_dir(registry, "d")
    with pytest.raises(InternalError) as exc, journal.change(durable=False):
        insert_dir(registry, "d")              # UNIQUE (parent, name)
    assert exc.value.details["errno"] == "EIO"
    assert row(registry, insert_dir_ok)["name"] == "d"


@pytest.mark.parametrize("fail_at, failed", [(1, "BEGIN"), (2, "INSERT"), (3, "INSERT"),
                                             (4, "COMMIT")])
def test_a_statement_or_the_commit_failing_rolls_the_whole_change_back(registry, journal,
                                                                       fail_at, failed):
    thing = Thing()

    def change():
        with journal.change(durable=True):
            journal.keep(thing, "size")
            thing.size = 5
            insert_dir(registry, "a")
            insert_dir(registry, "b")
    with failing(registry, fail_at) as conn, pytest.raises(NoMemory):
        change()
    assert conn.failed is not None and conn.failed.startswith(failed)
    assert thing.size == 1
    assert {r[0] for r in registry.db.execute("SELECT name FROM nodes")} == {""}
    assert not journal.in_change and not registry.db.in_transaction
    change()                                   # the next change works
    assert {r[0] for r in registry.db.execute("SELECT name FROM nodes")} == {"", "a", "b"}
    assert thing.size == 5


def test_a_nested_change_joins_the_outer_one(registry, journal):
    undone = []
    with pytest.raises(RuntimeError):
        with journal.change(durable=False):
            with journal.change(durable=True):
                inner = insert_dir(registry, "inner")
                journal.on_rollback(lambda: undone.append("inner"))
            assert journal.in_change
            raise RuntimeError("the outer part fails")
    assert row(registry, inner) is None
    assert undone == ["inner"]


def test_undo_steps_outside_a_change_are_ignored(journal):
    thing = Thing()
    journal.on_rollback(lambda: setattr(thing, "size", 7))
    journal.keep(thing, "size")
    with journal.change(durable=False):
        pass
    assert thing.size == 1


def test_a_failing_undo_step_does_not_stop_the_others(registry, journal, caplog):
    undone = []

    def broken():
        raise OSError("cannot undo")
    with pytest.raises(KeyError):
        with journal.change(durable=False):
            journal.on_rollback(lambda: undone.append("older"))
            journal.on_rollback(broken)
            journal.on_rollback(lambda: undone.append("newer"))
            raise KeyError("x")
    assert undone == ["newer", "older"]
    [record] = [r for r in caplog.records if "rolling back" in r.getMessage()]
    record.expected = True                      # the one error this test makes


def test_events_are_published_after_the_commit_and_never_for_a_rollback(registry, journal):
    published, redrawn = [], []
    node = Directory(id=1, name="", parent=None, uid=0, gid=0, mode=0o755, created_ns=1,
                     modified_ns=1, changed_ns=1)
    with journal.observing(published.append, redrawn.append):
        with journal.change(durable=False):
            journal.event("mkdir", node, ALICE, mode="0700")
            assert published == [] and redrawn == []      # not before the commit
        assert [e["kind"] for e in published] == ["mkdir"]
        assert published[0]["detail"] == {"mode": "0700"}
        assert redrawn == [node]
        with pytest.raises(ValueError), journal.change(durable=False):
            journal.event("mkdir", node, ALICE, mode="0711")
            raise ValueError
        assert len(published) == 1 and len(events(registry)) == 1
        journal.node_changed(node)             # outside a change: at once
        assert redrawn == [node, node]
    journal.note("scrub", action="start")      # no longer observing
    assert len(published) == 1
    assert [e["kind"] for e in events(registry)] == ["mkdir", "scrub"]


def test_an_event_detail_is_bounded_by_its_schema(registry, journal):
    with journal.change(durable=False):
        journal.event("write", None, ALICE, offset=0, bytes=10, comment="not in the schema")
    [event] = events(registry, "write")
    assert '"dropped_keys": 1' in event["detail"] and "comment" not in event["detail"]


def test_events_pages_the_log(registry, journal):
    for i in range(5):
        journal.note("scrub", action=f"a{i}")
    page, complete = journal.events(since=0, limit=2)
    assert [e["detail"]["action"] for e in page] == ["a3", "a4"] and complete
    first = journal.events(since=0, limit=100)[0][0]["id"]
    later, _ = journal.events(since=first, limit=100)
    assert [e["detail"]["action"] for e in later] == ["a1", "a2", "a3", "a4"]


def test_a_journal_on_a_reopened_registry_reads_its_events(tmp_path):
    from daemon.registry import Registry
    path = str(tmp_path / "again.sqlite")
    first = Registry(path)
    Journal(first).note("scrub", action="start")
    first.close()
    again = Registry(path)
    try:
        page, _ = Journal(again).events(since=0, limit=10)
        assert [e["kind"] for e in page] == ["scrub"]
    finally:
        again.close()
