"""Migrations of older registries: each brings a registry of version N to N+1
(MIGRATIONS[N]), one transaction each, at start (upgrade()); the columns' meanings are in
create_tables() (schema.py). A new registry never runs them: create_tables() makes the
current schema at once. A change to the schema goes into create_tables() and into a new
migration here (tests/unit/registry/test_migrations.py holds every older version's schema as
that gpumemd made it, and checks each step from it)."""
from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

from .schema import (
    LINKS_SQL,
    METADATA_SQL,
    NODES_SQL,
    PARITY_SQL,
    SCHEMA_VERSION,
    create_tables,
    execute_script,
    init_root,
)

if TYPE_CHECKING:
    from .store import Registry


def add_damage_table(db: sqlite3.Connection) -> None:
    """Version 1 to 2: the blocks ECC found beyond repair (issue 5, docs/ecc.md), and the
    `unsealed` column (meanings: create_tables())."""
    execute_script(db, """
    CREATE TABLE damage (
        node     INTEGER NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
        block    INTEGER NOT NULL,
        found_ns INTEGER NOT NULL,
        PRIMARY KEY (node, block)
    );
    ALTER TABLE nodes ADD COLUMN unsealed INTEGER NOT NULL DEFAULT 0;
    """)


def add_verified_column(db: sqlite3.Connection) -> None:
    """Version 2 to 3: when each allocation was last verified in full (issue 6: the
    monitor's "last verified" column)."""
    db.execute("ALTER TABLE nodes ADD COLUMN verified_ns INTEGER")


def add_accessed_column(db: sqlite3.Connection) -> None:
    """Version 3 to 4: access times (issue 12: utimensat's atime was dropped, and st_atime
    showed the modification time)."""
    db.execute("ALTER TABLE nodes ADD COLUMN accessed_ns INTEGER")
    # Rows from before version 4 never recorded an access: the best guess is the last
    # modification, which is what st_atime showed until now.
    db.execute("UPDATE nodes SET accessed_ns = modified_ns")


def drop_unused_columns(db: sqlite3.Connection) -> None:
    """Version 4 to 5 (issue 13): `parity_gen` (always 0) and `checksum` (always NULL) were
    never given a meaning. SQLite before 3.35 cannot drop a column: there they stay, unused
    since schema 5, and nothing reads or writes them.

    The `state` CHECK of an older registry still allows 'recovering', a state nothing ever
    entered: changing a CHECK means rebuilding `nodes`, which `damage` references with ON
    DELETE CASCADE; allowing one value more costs nothing."""
    if sqlite3.sqlite_version_info >= (3, 35, 0):
        db.execute("ALTER TABLE nodes DROP COLUMN parity_gen")
        db.execute("ALTER TABLE nodes DROP COLUMN checksum")


def add_events_uid_index(db: sqlite3.Connection) -> None:
    """5 -> 6: each user's events by age, for the per-user share of the log."""
    db.execute("CREATE INDEX IF NOT EXISTS events_uid ON events (uid, id)")


def allow_blob_names(db: sqlite3.Connection) -> None:
    """6 -> 7: names and event paths that are not UTF-8 are stored as BLOBs (the module
    docstring). Nothing to convert: every name stored so far is UTF-8 TEXT, which is still
    its form. The new version is what counts: a gpumemd of schema 6 would read such a BLOB
    as bytes where it expects a name, so it must refuse this registry (Registry.migrate)."""
    del db


def add_links_and_special_files(db: sqlite3.Connection) -> None:
    """7 -> 8 (issue 15): symlinks and special files, and their `target` and `rdev`.
    The `kind` CHECK must allow them, and SQLite cannot alter a CHECK: `nodes` is rebuilt
    the documented way (https://sqlite.org/lang_altertable.html, "other kinds of table
    schema changes"): foreign keys off (upgrade() turns them off around every migration),
    a new table of the current schema, the rows copied with their ids, the old table
    dropped, the new one renamed, and foreign_key_check before the commit. The rebuild also
    drops what older registries still carry: parity_gen and checksum where SQLite was too
    old to drop them, and the 'recovering' state in the `state` CHECK."""
    seq = db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'nodes'").fetchone()
    execute_script(db, NODES_SQL.replace("CREATE TABLE nodes (", "CREATE TABLE new_nodes ("))
    columns = ", ".join(r[1] for r in db.execute("PRAGMA table_info('nodes')")
                        if r[1] not in ("parity_gen", "checksum"))
    db.execute(f"INSERT INTO new_nodes ({columns}) SELECT {columns} FROM nodes")
    db.execute("DROP TABLE nodes")
    db.execute("ALTER TABLE new_nodes RENAME TO nodes")
    # AUTOINCREMENT's high-water mark may be past every row (ids reserved for keeper keys):
    # it is the old table's, not the copy's.
    db.execute("DELETE FROM sqlite_sequence WHERE name IN ('nodes', 'new_nodes')")
    if seq is not None:
        db.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('nodes', ?)", (seq[0],))
    problems = db.execute("PRAGMA foreign_key_check").fetchall()
    if problems:
        raise sqlite3.IntegrityError(f"foreign keys broken by the rebuild: {problems[:3]}")


def add_hard_links(db: sqlite3.Connection) -> None:
    """8 -> 9 (issue 15): the `links` table of hard links' further names."""
    execute_script(db, LINKS_SQL)


def add_snapshot_columns(db: sqlite3.Connection) -> None:
    """9 -> 10 (issue 16): each allocation's newest snapshot and its time. A registry older
    than 8 has them already: the 7 -> 8 rebuild makes `nodes` of the current schema."""
    have = {r[1] for r in db.execute("PRAGMA table_info('nodes')")}
    for column, kind in (("snapshot", "TEXT"), ("snapshot_ns", "INTEGER")):
        if column not in have:
            db.execute(f"ALTER TABLE nodes ADD COLUMN {column} {kind}")


def add_user_metadata(db: sqlite3.Connection) -> None:
    """10 -> 11 (issue 17): the `metadata` table of user metadata."""
    execute_script(db, METADATA_SQL)


# The slabs table as schema 12 made it (add_parity_arenas adds the parity columns).
SLABS_V12_SQL = """
    CREATE TABLE IF NOT EXISTS slabs (
        id         INTEGER PRIMARY KEY AUTOINCREMENT,
        uid        INTEGER NOT NULL,
        device     TEXT NOT NULL,
        ecc        TEXT NOT NULL CHECK (ecc IN ('rs', 'none')),
        slot       INTEGER NOT NULL,
        capacity   INTEGER NOT NULL,
        created_ns INTEGER NOT NULL
    );
"""


def add_slabs(db: sqlite3.Connection) -> None:
    """11 -> 12 (issue 26): the `slabs` table, and each node's `slab` and `slot`. Nothing
    already stored moves: every allocation keeps memory of its own (both columns NULL)."""
    have = {r[1] for r in db.execute("PRAGMA table_info('nodes')")}
    for column in ("slab", "slot"):
        if column not in have:
            db.execute(f"ALTER TABLE nodes ADD COLUMN {column} INTEGER")
    execute_script(db, SLABS_V12_SQL)


def add_parity_arenas(db: sqlite3.Connection) -> None:
    """12 -> 13 (issue 26): the `parity_arenas` and `parity_spans` tables, and each slab's
    `parity_arena` and `parity_offset`. Nothing already stored moves: parity kept with its
    allocation or slab stays there (the columns NULL, no span rows)."""
    have = {r[1] for r in db.execute("PRAGMA table_info('slabs')")}
    for column in ("parity_arena", "parity_offset"):
        if column not in have:
            db.execute(f"ALTER TABLE slabs ADD COLUMN {column} INTEGER")
    execute_script(db, PARITY_SQL)


def add_durable_defaults(db: sqlite3.Connection) -> None:
    """13 -> 14 (issue 27): a directory's `durable` column is the durable default of what is
    made in it (create_tables()). No directory had one: NULL becomes 0, so that every
    directory's row says what the tree holds (`check` compares them)."""
    db.execute("UPDATE nodes SET durable = 0 WHERE kind = 'dir' AND durable IS NULL")


def add_asleep_column(db: sqlite3.Connection) -> None:
    """14 -> 15 (issue 28): the `asleep` column (create_tables()); nothing was asleep. A
    registry rebuilt by the 7 -> 8 migration has today's `nodes`, with it already."""
    if "asleep" not in {r[1] for r in db.execute("PRAGMA table_info('nodes')")}:
        db.execute("ALTER TABLE nodes ADD COLUMN asleep INTEGER NOT NULL DEFAULT 0")


MIGRATIONS = {1: add_damage_table, 2: add_verified_column, 3: add_accessed_column,
              4: drop_unused_columns, 5: add_events_uid_index, 6: allow_blob_names,
              7: add_links_and_special_files, 8: add_hard_links,
              9: add_snapshot_columns, 10: add_user_metadata, 11: add_slabs,
              12: add_parity_arenas, 13: add_durable_defaults, 14: add_asleep_column}


def upgrade(registry: Registry, version: int) -> None:
    """Bring the registry from `version` to SCHEMA_VERSION: an empty database (version 0,
    made just now) gets the current schema at once, an older one each migration in turn,
    each in a durable transaction of its own, so that a failure leaves the last version
    reached whole."""
    db = registry.db
    if version == 0:
        with registry.transaction(durable=True):
            create_tables(db)
            init_root(db)
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        return
    # Foreign keys off while migrating (a pragma that is a no-op inside a transaction):
    # a rebuilt table's DROP would otherwise cascade to the rows that reference it.
    db.execute("PRAGMA foreign_keys=OFF")
    try:
        while version < SCHEMA_VERSION:
            with registry.transaction(durable=True):
                MIGRATIONS[version](db)
                version += 1
                db.execute(f"PRAGMA user_version={version}")
    finally:
        db.execute("PRAGMA foreign_keys=ON")
