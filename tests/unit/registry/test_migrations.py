"""Each migration, from a registry of the previous version as that version's gpumemd made it
(schemas/vN.sql, with rows in every table): one step reaches the next version's schema, the
whole chain reaches the schema of a new registry, and no row is lost or changes its stored
form. More on the schema in tests/unit/test_registry_schema.py (from schema 1, and through the
manager)."""
from __future__ import annotations

import sqlite3

import pytest

from daemon.registry import SCHEMA_VERSION, Registry, RegistryUnusable
from daemon.registry.migrations import MIGRATIONS

from .oldschemas import (
    LATIN,
    RESERVED_ID,
    assert_rows_kept,
    needs_drop_column,
    old_versions,
    schema_of,
    sequence,
    table_rows,
    write_registry,
)

OLD = list(range(1, SCHEMA_VERSION))
# Versions before 5 carry two unused columns that only SQLite 3.35 can drop.
VERSIONS = [pytest.param(v, marks=needs_drop_column) if v < 5 else v for v in OLD]


def test_every_older_version_has_its_frozen_schema_and_a_migration():
    """A new schema version needs a migration from the one before, and the one before must be
    frozen here (schemas/vN.sql: what that version's create_tables() made), or its
    migration is never tested from a registry that version really wrote."""
    assert sorted(MIGRATIONS) == OLD
    assert old_versions() == OLD


def migrate_one_step(path: str, version: int) -> None:
    """MIGRATIONS[version] alone, as the registry runs it (foreign keys off, one
    transaction, the version set inside it)."""
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("PRAGMA foreign_keys=OFF")
        db.execute("BEGIN IMMEDIATE")
        MIGRATIONS[version](db)
        db.execute(f"PRAGMA user_version={version + 1}")
        db.execute("COMMIT")
    finally:
        db.close()


def fresh_schema(tmp_path) -> dict:
    path = str(tmp_path / "fresh.sqlite")
    Registry(path).close()
    return schema_of(path)


@pytest.mark.parametrize("version", VERSIONS)
def test_one_migration_reaches_the_next_versions_schema(tmp_path, version):
    """MIGRATIONS[N] on a registry gpumemd N made gives what gpumemd N+1 made, rows kept.
    The one difference: the 7 -> 8 rebuild of `nodes` makes today's table, with the columns
    of versions after 8 (add_snapshot_columns then finds them there)."""
    path = str(tmp_path / "old.sqlite")
    written = write_registry(path, version)
    migrate_one_step(path, version)
    if version + 1 < SCHEMA_VERSION:
        nxt = str(tmp_path / "next.sqlite")
        write_registry(nxt, version + 1)
        expected = schema_of(nxt)
    else:
        expected = fresh_schema(tmp_path)
    if version == 7:
        expected["nodes"] = fresh_schema(tmp_path)["nodes"]
    assert schema_of(path) == expected
    assert_rows_kept(written, path)
    assert sequence(path) == RESERVED_ID


@pytest.mark.parametrize("version", VERSIONS)
def test_a_registry_of_each_older_version_opens_at_the_current_schema(tmp_path, version):
    """What a start does: every migration from N on, then the registry works as a new one."""
    path = str(tmp_path / "old.sqlite")
    written = write_registry(path, version)
    reg = Registry(path)
    try:
        assert not reg.created and reg.version() == SCHEMA_VERSION
        assert reg.identity.instance == "00112233"
        assert reg.identity.next_node_id() == RESERVED_ID + 1     # ids handed out stay handed out
        names = {n["id"]: n["name"] for n in reg.nodes.load()}
        assert names[2] == "weights"
        if version >= 7:
            assert names[4] == LATIN.decode(errors="surrogateescape")   # a BLOB
        assert reg.damaged.load() == ({2: {5}} if version >= 2 else {})
        latin = LATIN.decode(errors="surrogateescape")
        events = [(e["kind"], e["path"]) for e in reg.event_log.query()]
        assert events == [("create", "weights")] + \
            ([("mkdir", "d/" + latin)] if version >= 7 else [])
        assert reg.integrity_errors() == []
        assert reg.db.execute("PRAGMA foreign_key_check").fetchall() == []
        assert reg.db.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert schema_of(path) == fresh_schema(tmp_path)
        assert_rows_kept(written, path)
        alloc = next(r for r in table_rows(path)["nodes"] if r["id"] == 2)
        if version < 4:                           # 3 -> 4: no access recorded before
            assert alloc["accessed_ns"] == alloc["modified_ns"] == 20
        if version < 2:
            assert alloc["unsealed"] == 0
        if version < 10:
            assert alloc["snapshot"] is None and alloc["snapshot_ns"] is None
        with reg.transaction(durable=False):      # and takes what the newest schema allows
            reg.nodes.insert(parent=1, name="l", kind="symlink", uid=0, gid=0, mode=0o777,
                            created_ns=0, modified_ns=0, changed_ns=0, target="weights")
            reg.metadata.set(2, b"k", b"v")
        assert reg.identity.next_node_id() == RESERVED_ID + 2
    finally:
        reg.close()


def test_a_failed_migration_leaves_the_last_version_reached_whole(tmp_path, monkeypatch):
    """Each migration is a transaction of its own: one that fails midway leaves the registry
    at the version before it, none of its changes made, and the next start goes on from
    there."""
    path = str(tmp_path / "old.sqlite")
    written = write_registry(path, 8)
    real = MIGRATIONS[9]

    def fails_midway(db):
        real(db)                                        # the columns are added ...
        raise sqlite3.OperationalError("disk I/O error")    # ... and the step fails

    monkeypatch.setitem(MIGRATIONS, 9, fails_midway)
    with pytest.raises(sqlite3.OperationalError, match="disk I/O"):
        Registry(path)
    after = schema_of(path)
    assert after["user_version"] == 9                    # 8 -> 9 committed ...
    assert "links" in after                              # (what it added is there)
    assert "snapshot" not in [c[0] for c in after["nodes"]["columns"]]   # ... 9 -> 10 not
    assert_rows_kept(written, path)
    monkeypatch.setitem(MIGRATIONS, 9, real)
    reg = Registry(path)
    try:
        assert reg.version() == SCHEMA_VERSION
    finally:
        reg.close()
    assert schema_of(path) == fresh_schema(tmp_path)


def test_a_newer_registry_is_refused_and_left_as_it_is(tmp_path):
    path = str(tmp_path / "r.sqlite")
    Registry(path).close()
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    db.close()
    before = schema_of(path)
    with pytest.raises(RegistryUnusable, match="newer than this gpumemd") as refused:
        Registry(path)
    assert refused.value.corrupt is False
    assert schema_of(path) == before


@pytest.mark.parametrize("version", [7, 13])
def test_directories_get_a_durable_default_of_false(tmp_path, version):
    """13 -> 14 (issue 27): a directory's `durable` column is its durable default. Older
    directories had none (NULL): each, the root included, says 0 after the migration, and
    the allocations keep theirs."""
    path = str(tmp_path / "old.sqlite")
    write_registry(path, version)
    Registry(path).close()
    rows = {r["id"]: (r["kind"], r["durable"]) for r in table_rows(path)["nodes"]}
    assert rows[1] == ("dir", 0) and rows[3] == ("dir", 0) and rows[4] == ("dir", 0)
    assert rows[2] == ("alloc", 1)
