"""The registry's schema: every table, with the meaning of every column, made in one go by
create_tables() for a new registry at SCHEMA_VERSION (daemon/registry/migrations.py brings an
older registry to the same schema).

Names and paths (nodes.name, links.name, nodes.target, events.path) are TEXT when UTF-8 and
else a BLOB of their bytes: daemon/registry/names.py."""
from __future__ import annotations

import os
import sqlite3
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .store import Registry

SCHEMA_VERSION = 15
ROOT_ID = 1


# The nodes table: create_tables() makes it, and add_links_and_special_files() rebuilds an
# older one to it.
NODES_SQL = """
    CREATE TABLE nodes (
        -- Every kind of node shares one table: the namespace is a tree, as in a
        -- filesystem, so a rename moves one row and the id doubles as the inode number.
        id          INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: keeper keys use it
        parent      INTEGER REFERENCES nodes(id),       -- NULL only for the root (id 1)
        -- One path component, '' for the root: TEXT when its bytes are UTF-8, else a
        -- BLOB of them (stored_name()).
        name        TEXT NOT NULL,
        -- 'symlink' and the special files ('fifo', 'chr', 'blk', 'sock') are metadata
        -- only, as directories are (issue 15).
        kind        TEXT NOT NULL CHECK (kind IN ('dir', 'alloc', 'symlink', 'fifo', 'chr',
                                                  'blk', 'sock')),
        uid         INTEGER NOT NULL,  -- owner
        gid         INTEGER NOT NULL,  -- group
        mode        INTEGER NOT NULL,  -- permission bits only (07777), no file type bits
        created_ns  INTEGER NOT NULL,  -- wall clock, ns since the epoch
        modified_ns INTEGER NOT NULL,  -- last change of the data (or of the entries, for dirs)
        changed_ns  INTEGER NOT NULL,  -- last change of the metadata
        -- The columns below, up to `unsealed`, are NULL for every kind but 'alloc' (and
        -- `durable`, which a 'dir' has too).
        size        INTEGER,  -- bytes the user asked for (0 for a pending file made in the mount)
        capacity    INTEGER,  -- bytes held on the device (size rounded up to the device's
                              -- granularity); NULL while 'pending'
        device      TEXT,     -- UUID of the device holding it (host backend: 'HOST-...')
        -- 'alloc': 1 durable (survives daemon restarts), 0 transient. 'dir' (schema 14,
        -- issue 27): the default of what is made in it, 1 when its new files and new
        -- subdirectories are durable (a subdirectory inherits it), 0 not; NULL for every
        -- other kind.
        durable     INTEGER,
        state       TEXT CHECK (state IN ('pending', 'ready', 'degraded', 'lost')),
        ecc         TEXT CHECK (ecc IN ('rs', 'none')),  -- requested protection
        -- 1 while a client attached read-write has not sealed: its parity is stale, so verify
        -- and scrub skip it (and must not "repair" the client's writes back), until `seal`.
        -- 2 while a durable allocation has writes whose parity is not yet refreshed (mount or
        -- socket writes before their close/fsync): after a crash its parity is rebuilt from
        -- the data. 0 otherwise (and for directories).
        unsealed    INTEGER NOT NULL DEFAULT 0,
        -- Wall clock (ns) at which a verify, scrub or recover last finished a pass over all of
        -- the allocation's protected blocks; NULL = never verified (and for directories and
        -- allocations without ECC).
        verified_ns INTEGER,
        -- Wall clock (ns) of the last access: utimensat(2) sets it, and a read or listing on
        -- the mount moves it by the relatime rule (docs/mount.md). NULL only in a row
        -- inserted without it (`check` re-inserting a row): read as modified_ns.
        accessed_ns INTEGER,
        -- A symlink's target, as the link was made (any bytes but NUL, 1-4095 of them):
        -- TEXT when UTF-8, else a BLOB, as `name`. NULL for every other kind.
        target      TEXT,
        -- The device number of a 'chr' or 'blk' node (st_rdev); NULL for other kinds.
        rdev        INTEGER,
        -- The newest snapshot known to hold this allocation (`gpumemctl snapshot create`
        -- reports it: its location and name) and when it was taken (wall clock, ns);
        -- NULL: none reported. For allocations only.
        snapshot    TEXT,
        snapshot_ns INTEGER,
        -- Where a small allocation's bytes are (issue 26, docs/storage.md): the slab
        -- (slabs.id) and the byte offset of its slot in it; both NULL for an allocation
        -- with memory of its own (and for every other kind).
        slab        INTEGER,
        slot        INTEGER,
        -- 1 while the allocation is asleep (schema 15, issue 28, docs/engines.md "Sleep and
        -- wake"): its bytes are in host memory (the keeper holds that copy under -id for a
        -- durable one), its device memory is freed, `state` keeps the state it wakes into
        -- ('ready' or 'degraded'), and `slab`/`slot` are NULL. 0 otherwise.
        asleep      INTEGER NOT NULL DEFAULT 0,
        UNIQUE (parent, name)
    );
"""


# Hard links (issue 15): create_tables() makes it, add_hard_links() adds it to an older one.
LINKS_SQL = """
    CREATE TABLE IF NOT EXISTS links (
        -- The names of a node beyond its first: its row in `nodes` holds one name (parent,
        -- name), each row here one more (link(2)), so st_nlink is 1 + its rows here. When
        -- the name in `nodes` goes while others remain, one of these moves into it. A name
        -- is unique in its directory over both tables (the daemon checks; SQLite cannot).
        -- Never a directory's (directories have one name, as on every Linux filesystem).
        parent INTEGER NOT NULL REFERENCES nodes(id),
        name   TEXT NOT NULL,     -- one path component, stored as nodes.name
        node   INTEGER NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
        PRIMARY KEY (parent, name)
    );
    CREATE INDEX IF NOT EXISTS links_node ON links (node);
"""


# Slabs (issue 26): create_tables() makes it, add_slabs() adds it to an older registry.
SLABS_SQL = """
    CREATE TABLE IF NOT EXISTS slabs (
        -- One backend allocation cut into equal slots of one size class, holding small
        -- allocations of one owner, on one device, of one ECC mode (docs/storage.md). The
        -- keeper holds it under key SLAB_KEY_BASE + id: its data, then its parity when that
        -- has a buffer of its own (a slab made before schema 13).
        id         INTEGER PRIMARY KEY AUTOINCREMENT,
        uid        INTEGER NOT NULL,   -- the owner of every allocation in it
        device     TEXT NOT NULL,      -- device UUID
        ecc        TEXT NOT NULL CHECK (ecc IN ('rs', 'none')),
        slot       INTEGER NOT NULL,   -- the size class: bytes per slot, a power of two
        capacity   INTEGER NOT NULL,   -- bytes of the slab
        created_ns INTEGER NOT NULL,
        -- Where its parity is (schema 13): a span of parity_arenas row `parity_arena` from
        -- byte `parity_offset`; both NULL without ECC, or for parity kept with the slab.
        parity_arena  INTEGER,
        parity_offset INTEGER
    );
"""


# Parity arenas (issue 26): create_tables() makes them, add_parity_arenas() adds them to an
# older registry.
PARITY_SQL = """
    CREATE TABLE IF NOT EXISTS parity_arenas (
        -- One backend allocation holding the ECC parity of many allocations and slabs
        -- (daemon/backends/arenas.py). The keeper holds it under ARENA_KEY_BASE + id.
        id         INTEGER PRIMARY KEY AUTOINCREMENT,
        device     TEXT NOT NULL,      -- device UUID
        capacity   INTEGER NOT NULL,   -- bytes
        created_ns INTEGER NOT NULL
    );
    CREATE TABLE IF NOT EXISTS parity_spans (
        -- Where a durable allocation's parity is, written each time the keeper is handed
        -- its memory (daemon/core/arenas.py). No foreign key: a new durable allocation's
        -- span is recorded before its row. Rows of nodes that are not kept allocations
        -- with memory of their own are stale and are dropped at start.
        node   INTEGER PRIMARY KEY,    -- nodes.id
        arena  INTEGER NOT NULL,       -- parity_arenas.id
        offset INTEGER NOT NULL,       -- bytes into the arena
        bytes  INTEGER NOT NULL        -- of the span: a start takes it only when the
                                       -- allocation's capacity needs exactly these
    );
"""


# User metadata (issue 17): create_tables() makes it, add_user_metadata() adds it to an older
# registry.
METADATA_SQL = """
    CREATE TABLE IF NOT EXISTS metadata (
        -- Small key-value pairs a user keeps on an allocation or a directory (`gpumemctl
        -- meta`, `user.KEY` attributes on the mount; daemon/core/usermeta.py has the rules and
        -- the bounds). They belong to the node, so every name of a hard-linked one shares
        -- them, and they go with the node's row.
        node  INTEGER NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,  -- nodes.id
        key   BLOB NOT NULL,    -- 1-250 bytes, no NUL, not starting 'gpu.'
        value BLOB NOT NULL,    -- any bytes, none included
        PRIMARY KEY (node, key)
    ) WITHOUT ROWID;
"""


def create_tables(db: sqlite3.Connection) -> None:
    """The current schema (version SCHEMA_VERSION), made in one go for a new registry.
    Every column's meaning and sentinels are stated here. An older registry reaches the same
    schema through MIGRATIONS (migrations.py; tests/unit/registry/test_migrations.py compares
    the two); a
    change to the schema goes here and into a new migration."""
    execute_script(db, """
    CREATE TABLE meta (
        key   TEXT PRIMARY KEY,  -- 'created_ns', 'instance' (a random id of this registry)
        value TEXT NOT NULL
    );
    """ + NODES_SQL + """
    CREATE TABLE holders (
        -- Who holds an allocation now. Sessions die with the daemon, so the daemon empties
        -- this table at start; while it runs, it lets `check` and a post-mortem see holders.
        id        INTEGER PRIMARY KEY,  -- holder id, unique within one daemon run
        node      INTEGER NOT NULL,     -- nodes.id
        session   INTEGER NOT NULL,     -- connection id within the daemon run
        kind      TEXT NOT NULL,        -- 'lease', 'read', 'write', 'attach-r', 'attach-w'
        pid       INTEGER NOT NULL,     -- peer pid (SO_PEERCRED)
        uid       INTEGER NOT NULL,     -- peer uid
        since_ns  INTEGER NOT NULL
    );
    CREATE TABLE events (
        id       INTEGER PRIMARY KEY AUTOINCREMENT,  -- monotonic; `events --since ID`
        time_ns  INTEGER NOT NULL,
        kind     TEXT NOT NULL,    -- 'create', 'remove', 'durable', 'lost', 'adopt', ...
        node     INTEGER,          -- nodes.id, NULL for daemon-wide events
        path     TEXT,             -- path at the time of the event (as nodes.name: TEXT
                                   -- when UTF-8, else a BLOB)
        uid      INTEGER,          -- who caused it; NULL for the daemon itself
        pid      INTEGER,
        detail   TEXT NOT NULL     -- JSON object with kind-specific fields
    );
    CREATE INDEX events_node ON events (node);
    CREATE INDEX events_uid ON events (uid, id);
    """ + LINKS_SQL + """
    CREATE TABLE damage (
        -- One row per 128 KiB block of an allocation that failed to verify and could not
        -- be repaired: its bytes read as EIO until `gpumemctl recover` repairs it or a
        -- write replaces the whole block. The allocation's state is 'degraded' while it
        -- has rows here.
        node     INTEGER NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
        block    INTEGER NOT NULL,      -- block index: bytes [block*131072, +131072)
        found_ns INTEGER NOT NULL,      -- when a verify or scrub found it
        PRIMARY KEY (node, block)
    );
    """ + METADATA_SQL + SLABS_SQL + PARITY_SQL)


def execute_script(db: sqlite3.Connection, script: str) -> None:
    """Run statements one by one: executescript() would COMMIT the caller's transaction."""
    statement = ""
    for line in script.splitlines(keepends=True):
        statement += line
        if sqlite3.complete_statement(statement):
            db.execute(statement)
            statement = ""


def init_root(db: sqlite3.Connection) -> None:
    """The rows a new registry starts with: the root directory, and `meta`'s creation time
    and random identity."""
    now = time.time_ns()
    # The root is like /tmp: anyone may create, only owners may remove (sticky bit).
    db.execute(
        "INSERT INTO nodes (id, parent, name, kind, uid, gid, mode, created_ns,"
        " modified_ns, changed_ns, durable) VALUES (?, NULL, '', 'dir', ?, ?, ?, ?, ?, ?, 0)",
        (ROOT_ID, os.geteuid(), os.getegid(), 0o1777, now, now, now))
    db.execute("INSERT INTO meta VALUES ('created_ns', ?)", (str(now),))
    db.execute("INSERT INTO meta VALUES ('instance', ?)", (os.urandom(8).hex(),))


def inserted_id(cur: sqlite3.Cursor) -> int:
    """The rowid an INSERT just made (sqlite3 types lastrowid as optional: it is None only
    for statements that insert nothing)."""
    if cur.lastrowid is None:
        raise RuntimeError("an INSERT made no row")
    return cur.lastrowid


class Part:
    """A table section of the registry (registry.nodes, registry.event_log, ...): its SQL,
    run on the registry's connection as it is at each call (a test may wrap it) and inside
    the registry's transaction()."""

    def __init__(self, registry: Registry):
        self._registry = registry

    @property
    def _db(self) -> sqlite3.Connection:
        return self._registry.db
