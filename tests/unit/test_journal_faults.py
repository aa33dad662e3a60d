"""Fault injection into the registry (issue 13): for every mutating verb, each registry
statement and the COMMIT fail in turn, as they do on a full state disk. Afterwards the verb
has either happened whole or changed nothing: the tree, the registry, the backend's memory and
the keeper agree (`check` is clean), what a user sees is what it was before, and the next
change works (service goes on once space returns)."""
from __future__ import annotations

import itertools
import sqlite3

import pytest

from daemon.verbs.plan import run_sync
from gpumemctl.protocol import GpumemError
from tests.sizes import MiB

from .world import ROOT, World, clean, with_workers

FULL = "database or disk is full"
# Statements that undo or scope a transaction are never made to fail: SQLite itself runs a
# rollback when a statement fails for a full disk, and so must the registry.
NEVER_FAILS = ("SAVEPOINT", "ROLLBACK", "RELEASE", "PRAGMA", "SELECT")


class FailingConnection:
    """The registry's SQLite connection, failing its `fail_at`-th writing statement with
    SQLite's own error for a full disk. A failing COMMIT rolls the transaction back first,
    as SQLite does when a commit meets a full disk."""

    def __init__(self, db: sqlite3.Connection, fail_at: int | None):
        self._db, self.fail_at, self.count = db, fail_at, 0

    def _tick(self, sql: str) -> None:
        if sql.lstrip().upper().startswith(NEVER_FAILS):
            return
        self.count += 1
        if self.count == self.fail_at:
            if sql.lstrip().upper().startswith("COMMIT"):
                self._db.execute("ROLLBACK")
            raise sqlite3.OperationalError(FULL)

    def execute(self, sql, *args):
        self._tick(sql)
        return self._db.execute(sql, *args)

    def executemany(self, sql, *args):
        self._tick(sql)
        return self._db.executemany(sql, *args)

    def __getattr__(self, name):
        return getattr(self._db, name)


def seen(m) -> dict:
    """What a user can observe: every entry with its attributes, the memory held, and what
    the keeper holds."""
    entries = {e["path"]: {k: e.get(k) for k in ("type", "size", "capacity", "durable",
                                                   "mode", "uid", "gid", "state")}
               for e in m.queries.listdir("", ROOT, recursive=True)}
    free = [d.free for d in m.backend.devices()]
    metadata = {path: m.queries.info(path, ROOT)["metadata"] for path in entries}
    return {"entries": entries, "free": free, "kept": sorted(m.keeper.keys()),
            "metadata": metadata, "metadata_used": dict(m.ns.nodes.metadata)}


# ---- the verbs: (setup, action), each on a fresh world ---------------------------------------
def _setup(m):
    m.names.mkdir("d", ROOT)
    m.names.mkdir("empty", ROOT)
    run_sync(m.names.create("d/trans", ROOT, size=2 * MiB))
    run_sync(m.names.create("d/keep", ROOT, size=2 * MiB, durable=True,
                            metadata={"k": "v", "i": "x" * 9}))
    m.metadata.meta_set("d", "dk", "dv", ROOT)


def _id(m, path: str) -> int:
    return m.queries.lookup(path, ROOT).id


def _open_read(m):
    m.handles.open("d/keep", ROOT, m.handles.open_session(ROOT), "r")


def _create_deposit_off_loop(m, path="d/new"):
    """The socket server's durable create (NameVerbs.create's plan): prepare on the loop, the
    deposit (on a worker thread there), then the create with what was prepared."""
    with_workers(m.names.create(path, ROOT, size=4 * MiB, durable=True, mode=0o600))


def _durable_deposit_off_loop(m):
    """The socket server's `durable` (DurabilityVerbs.set_durable's plan), step by step."""
    with_workers(m.durability.set_durable("d/trans", ROOT, True))


def _close_written_off_loop(m):
    """The socket server's close of a handle that wrote: the parity job first (a worker
    thread there), then the close that finishes it."""
    session = m.handles.open_session(ROOT)
    holder, fd, _info = m.handles.open("d/keep", ROOT, session, "rw")
    import os
    os.close(fd)
    with_workers(m.handles.close(session, holder.id, written={"bytes": 10}))


def _seal_off_loop(m):
    """An attached writer seals (the socket server's steps): the job, then the seal."""
    import os
    session = m.handles.open_session(ROOT)
    holder, fd, _info = m.handles.attach("d/keep", ROOT, session, "rw")
    os.close(fd)
    with_workers(m.handles.seal("d/keep", ROOT, session))
    run_sync(m.handles.detach(session, holder.id))


VERBS = {
    "mkdir": lambda m: m.names.mkdir("d/sub", ROOT),
    "mkdir -p": lambda m: m.names.mkdir("a/b/c", ROOT, parents=True),
    "create transient": lambda m: run_sync(m.names.create("d/new", ROOT, size=4 * MiB)),
    "create durable": lambda m: run_sync(m.names.create("d/new", ROOT, size=4 * MiB, durable=True)),
    "create with parents": lambda m: run_sync(m.names.create("x/y/new", ROOT, size=MiB,
                                                             durable=True)),
    "rm transient": lambda m: m.names.remove("d/trans", ROOT),
    "rm durable": lambda m: m.names.remove("d/keep", ROOT),
    "rm -r": lambda m: m.names.remove("d", ROOT, recursive=True),
    "durable": lambda m: run_sync(m.durability.set_durable("d/trans", ROOT, True)),
    "transient": lambda m: run_sync(m.durability.set_durable("d/keep", ROOT, False)),
    "resize up": lambda m: m.data.resize(m.queries.lookup("d/keep", ROOT), ROOT, 6 * MiB),
    "resize down": lambda m: m.data.resize(m.queries.lookup("d/keep", ROOT), ROOT, MiB),
    "rename": lambda m: m.names.rename(m.queries.lookup("d", ROOT).id, "keep", m.ns.root.id,
                                       "moved", ROOT),
    "rename over": lambda m: m.names.rename(m.queries.lookup("d", ROOT).id, "trans",
                                      m.queries.lookup("d", ROOT).id, "keep", ROOT),
    "chmod": lambda m: m.names.setattr(m.queries.lookup("d/keep", ROOT).id, ROOT, mode=0o640),
    "chown": lambda m: m.names.setattr(_id(m, "d/trans"), ROOT, uid=1000, gid=1000),
    "utimes": lambda m: m.names.setattr(_id(m, "d/keep"), ROOT, mtime_ns=10**18, atime_ns=10**18),
    "resize transient": lambda m: m.data.resize(m.queries.lookup("d/trans", ROOT), ROOT, 6 * MiB),
    # user metadata (issue 17)
    "meta set": lambda m: m.metadata.meta_set("d/keep", "new", "value", ROOT),
    "meta set over": lambda m: m.metadata.meta_set("d/keep", "k", "other", ROOT),
    "meta rm": lambda m: m.metadata.meta_rm("d/keep", "k", ROOT),
    "meta set on a directory": lambda m: m.metadata.meta_set("d", "dk", "other", ROOT),
    "meta set transient": lambda m: m.metadata.meta_set("d/trans", "k", "v", ROOT),
    "create with metadata": lambda m: run_sync(m.names.create("d/new", ROOT, size=MiB, durable=True,
                                               metadata={"a": "b", "c": "d"})),
    "chown with metadata": lambda m: m.names.setattr(_id(m, "d/keep"), ROOT, uid=1000),
    # the mount's verbs, by node id
    "mkdir in the mount": lambda m: m.names.mkdir_child(_id(m, "d"), "sub", ROOT),
    "create in the mount": lambda m: m.names.create_pending(_id(m, "d"), "pending", ROOT),
    "unlink in the mount": lambda m: m.names.unlink_child(_id(m, "d"), "keep", ROOT),
    "rmdir in the mount": lambda m: m.names.rmdir_child(m.ns.root.id, "empty", ROOT),
    "open": _open_read,
    # the plans as the socket server runs them, work off the event loop (verbs/plan.py)
    "create durable, deposit off the loop": _create_deposit_off_loop,
    "create with parents, deposit off the loop": lambda m: _create_deposit_off_loop(
        m, "x/y/new"),
    "durable, deposit off the loop": _durable_deposit_off_loop,
    "close of a writer, parity off the loop": _close_written_off_loop,
    "seal, parity off the loop": _seal_off_loop,
}


def statements_of(world, action) -> int:
    """How many writing statements (and commits) the action runs when nothing fails."""
    m = world.m
    probe = FailingConnection(m.registry.db, None)
    m.registry.db = probe
    try:
        action(m)
    finally:
        m.registry.db = probe._db
    return probe.count


@pytest.mark.parametrize("verb", VERBS)
def test_every_statement_failing_in_turn_leaves_everything_consistent(tmp_path, verb):
    action = VERBS[verb]
    dry = World(_fresh_dir(tmp_path, "dry"))
    _setup(dry.m)
    total = statements_of(dry, action)
    dry.close()
    assert total > 0, f"{verb} ran no registry statement"
    failures = []
    for fail_at in range(1, total + 1):      # one fresh world per injected failure
        world = World(_fresh_dir(tmp_path, f"fail{fail_at}"))
        try:
            failures += _one_failure(world, verb, action, fail_at)
        finally:
            world.close()
    assert not failures, "\n".join(failures)


def _fresh_dir(tmp_path, name: str):
    path = tmp_path / name
    path.mkdir()
    return path


def _one_failure(world, verb: str, action, fail_at: int) -> list[str]:
    m = world.m
    _setup(m)
    before = seen(m)
    m.registry.db = FailingConnection(m.registry.db, fail_at)
    try:
        action(m)
    except (GpumemError, sqlite3.Error):
        pass
    else:
        return [f"{verb}, statement {fail_at} failing: the verb reported success"]
    finally:
        m.registry.db = m.registry.db._db
    where = f"{verb}, statement {fail_at} failing"
    problems = []
    after = seen(m)
    if after != before:
        changed = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
        problems.append(f"{where}: what a user sees changed: {changed}")
    try:
        clean(m)
    except AssertionError as exc:
        problems.append(f"{where}: check is not clean: {exc}")
    try:
        name = next(n for n in (f"after{i}" for i in itertools.count())
                    if n not in after["entries"])
        run_sync(m.names.create(name, ROOT, size=MiB, durable=True))     # service goes on
        clean(m)
    except Exception as exc:  # noqa: BLE001 - any failure here is the finding
        problems.append(f"{where}: the next change failed: {exc!r}")
    return problems
