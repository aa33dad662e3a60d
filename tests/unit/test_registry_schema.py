"""The registry's schema: a new registry is made at the current version by create_tables(), an
old one is brought there by the migrations, and the two must end up alike (tables, columns
with their types, NOT NULL and defaults, keys, indexes), with the old one's rows kept.

CHECK constraints are not compared: a migration cannot change one without rebuilding its
table, and the one difference (an old registry's `state` CHECK still allows 'recovering', a
state nothing enters) is deliberate (daemon/registry/migrations.py, drop_unused_columns).
Each migration from the schema its own version made: tests/unit/registry/test_migrations.py."""
from __future__ import annotations

import sqlite3

import pytest

from daemon.registry import ROOT_ID, SCHEMA_VERSION, Registry
from daemon.verbs.plan import run_sync
from tests.sizes import MiB

from .registry.oldschemas import needs_drop_column, schema_of
from .world import ROOT as ROOT_CRED
from .world import clean

# The schema of version 1, frozen as gpumemd first wrote it (create_tables() of schema 1).
V1_SCHEMA = """
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE nodes (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    parent      INTEGER REFERENCES nodes(id),
    name        TEXT NOT NULL,
    kind        TEXT NOT NULL CHECK (kind IN ('dir', 'alloc')),
    uid         INTEGER NOT NULL,
    gid         INTEGER NOT NULL,
    mode        INTEGER NOT NULL,
    created_ns  INTEGER NOT NULL,
    modified_ns INTEGER NOT NULL,
    changed_ns  INTEGER NOT NULL,
    size        INTEGER,
    capacity    INTEGER,
    device      TEXT,
    durable     INTEGER,
    state       TEXT CHECK (state IN ('pending', 'ready', 'degraded', 'lost',
                                      'recovering')),
    ecc         TEXT CHECK (ecc IN ('rs', 'none')),
    parity_gen  INTEGER,
    checksum    TEXT,
    UNIQUE (parent, name)
);
CREATE TABLE holders (
    id        INTEGER PRIMARY KEY,
    node      INTEGER NOT NULL,
    session   INTEGER NOT NULL,
    kind      TEXT NOT NULL,
    pid       INTEGER NOT NULL,
    uid       INTEGER NOT NULL,
    since_ns  INTEGER NOT NULL
);
CREATE TABLE events (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    time_ns  INTEGER NOT NULL,
    kind     TEXT NOT NULL,
    node     INTEGER,
    path     TEXT,
    uid      INTEGER,
    pid      INTEGER,
    detail   TEXT NOT NULL
);
CREATE INDEX events_node ON events (node);
"""


def write_v1_registry(path: str) -> None:
    """A registry as schema 1 left it: the root, a durable allocation and an event."""
    db = sqlite3.connect(path)
    db.executescript(V1_SCHEMA)
    db.execute("INSERT INTO nodes (id, parent, name, kind, uid, gid, mode, created_ns,"
               " modified_ns, changed_ns) VALUES (?, NULL, '', 'dir', 0, 0, ?, 1, 2, 3)",
               (ROOT_ID, 0o1777))
    db.execute("INSERT INTO nodes (parent, name, kind, uid, gid, mode, created_ns, modified_ns,"
               " changed_ns, size, capacity, device, durable, state, ecc, parity_gen)"
               " VALUES (?, 'weights', 'alloc', 1000, 1000, ?, 10, 20, 30, 5000, 2097152,"
               " 'HOST-0', 1, 'ready', 'rs', 0)", (ROOT_ID, 0o600))
    db.execute("INSERT INTO meta VALUES ('created_ns', '1'), ('instance', '00112233')")
    db.execute("INSERT INTO events (time_ns, kind, node, path, uid, pid, detail)"
               " VALUES (40, 'create', 2, 'weights', 1000, 77, '{}')")
    db.execute("PRAGMA user_version=1")
    db.commit()
    db.close()


@needs_drop_column
def test_a_migrated_v1_registry_has_the_schema_of_a_fresh_one(tmp_path):
    old, new = str(tmp_path / "old.sqlite"), str(tmp_path / "new.sqlite")
    write_v1_registry(old)
    Registry(old).close()
    Registry(new).close()
    migrated, fresh = schema_of(old), schema_of(new)
    assert migrated["user_version"] == SCHEMA_VERSION
    assert migrated == fresh


@needs_drop_column
def test_migration_keeps_the_rows_and_drops_the_unused_columns(tmp_path):
    path = str(tmp_path / "old.sqlite")
    write_v1_registry(path)
    reg = Registry(path)
    try:
        assert not reg.created
        alloc = {r["name"]: r for r in reg.nodes.load()}["weights"]
        assert (alloc["size"], alloc["capacity"], alloc["state"], alloc["ecc"]) == \
            (5000, 2097152, "ready", "rs")
        assert alloc["unsealed"] == 0 and alloc["verified_ns"] is None
        assert alloc["accessed_ns"] == alloc["modified_ns"] == 20
        assert "parity_gen" not in alloc.keys() and "checksum" not in alloc.keys()
        assert reg.identity.instance == "00112233"
        assert [e["kind"] for e in reg.event_log.query()] == ["create"]
    finally:
        reg.close()


def test_a_fresh_registry_is_made_at_the_current_version(tmp_path):
    reg = Registry(str(tmp_path / "r.sqlite"))
    try:
        assert reg.created and reg.version() == SCHEMA_VERSION
        columns = [r[1] for r in reg.db.execute("PRAGMA table_info('nodes')")]
        assert "parity_gen" not in columns and "checksum" not in columns
        with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
            with reg.transaction(durable=False):
                reg.nodes.insert(parent=ROOT_ID, name="x", kind="alloc", uid=0, gid=0,
                                mode=0o600, created_ns=0, modified_ns=0, changed_ns=0,
                                state="recovering")
    finally:
        reg.close()


@needs_drop_column
def test_a_durable_allocation_outlives_the_upgrade_to_schema_5(world):
    """A daemon of schema 4 stops; this one starts on its registry: the allocation is there
    with its bytes, and `info` no longer shows the removed keys."""
    m = world.m
    run_sync(m.names.create("kept", ROOT_CRED, size=MiB, durable=True))
    m.backend.write(m.queries.lookup("kept", ROOT_CRED).buffer, 0, b"survives")
    world.crash()                                   # to a fresh manager on the same files ...
    old = world.m
    old.keeper.close()
    old.registry.close()
    db = sqlite3.connect(old.registry.path)         # ... whose registry goes back to schema 4
    db.execute("ALTER TABLE nodes ADD COLUMN parity_gen INTEGER")
    db.execute("ALTER TABLE nodes ADD COLUMN checksum TEXT")
    db.execute("UPDATE nodes SET parity_gen = 0 WHERE kind = 'alloc'")
    db.execute("PRAGMA user_version=4")
    db.commit()
    db.close()
    world.m = m = world._new()                      # the upgraded daemon starts
    assert m.registry.version() == SCHEMA_VERSION
    info = m.queries.info("kept", ROOT_CRED)
    assert (info["state"], info["size"], info["durable"]) == ("ready", MiB, True)
    assert "parity_generation" not in info and "checksum" not in info
    assert m.backend.read(m.queries.lookup("kept", ROOT_CRED).buffer, 0, 8) == b"survives"
    clean(m)


def test_the_rebuild_to_schema_8_keeps_ids_damage_and_the_id_mark(tmp_path):
    """Schema 8 (issue 15) rebuilds `nodes` to widen its `kind` CHECK: every row keeps its
    id, the `damage` rows that reference a node survive (foreign keys are off while the
    table is dropped, so ON DELETE CASCADE does not fire), ids reserved past every row stay
    reserved, and the new kinds are accepted."""
    path = str(tmp_path / "old.sqlite")
    write_v1_registry(path)
    Registry(path).close()                        # to the current version ...
    db = sqlite3.connect(path)                    # ... and back to 7's nodes table
    db.execute("PRAGMA foreign_keys=OFF")
    db.execute("PRAGMA legacy_alter_table=ON")      # `damage` keeps naming `nodes`
    db.execute("INSERT INTO damage VALUES (2, 5, 99)")
    db.execute("UPDATE sqlite_sequence SET seq = 500 WHERE name = 'nodes'")
    db.execute("ALTER TABLE nodes RENAME TO v8_nodes")
    db.execute(V1_SCHEMA[V1_SCHEMA.index("CREATE TABLE nodes"):V1_SCHEMA.index(
        "CREATE TABLE holders")].replace("parity_gen  INTEGER,\n    checksum    TEXT,\n", "")
        .replace("    UNIQUE", "    unsealed INTEGER NOT NULL DEFAULT 0, verified_ns INTEGER,"
                 " accessed_ns INTEGER,\n    UNIQUE"))
    db.execute("INSERT INTO nodes SELECT id, parent, name, kind, uid, gid, mode, created_ns,"
               " modified_ns, changed_ns, size, capacity, device, durable, state, ecc,"
               " unsealed, verified_ns, accessed_ns FROM v8_nodes")
    db.execute("DROP TABLE v8_nodes")
    db.execute("UPDATE sqlite_sequence SET seq = 500 WHERE name = 'nodes'")
    db.execute("PRAGMA user_version=7")
    db.commit()
    assert db.execute("SELECT count(*) FROM damage").fetchone()[0] == 1
    db.close()
    reg = Registry(path)
    try:
        assert reg.version() == SCHEMA_VERSION
        assert [r["id"] for r in reg.nodes.load()] == [ROOT_ID, 2]
        assert reg.damaged.load() == {2: {5}}
        assert reg.identity.next_node_id() == 501
        with reg.transaction(durable=False):
            reg.nodes.insert(id=501, parent=ROOT_ID, name="l", kind="symlink", uid=0, gid=0,
                            mode=0o777, created_ns=0, modified_ns=0, changed_ns=0,
                            target="weights")
            reg.nodes.insert(id=502, parent=ROOT_ID, name="p", kind="fifo", uid=0, gid=0,
                            mode=0o600, created_ns=0, modified_ns=0, changed_ns=0, rdev=0)
        assert reg.integrity_errors() == []
    finally:
        reg.close()
    fresh = str(tmp_path / "fresh.sqlite")
    Registry(fresh).close()
    assert schema_of(path) == schema_of(fresh)
