-- Schema version 14: a new registry as gpumemd made it at that version (daemon/registry/schema.py
-- of commit 19672cc), read back from sqlite_master, its comments dropped. Frozen:
-- never edit; tests/unit/registry/test_migrations.py migrates it to the current schema.
CREATE TABLE meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE nodes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    parent INTEGER REFERENCES nodes(id),
    name TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('dir', 'alloc', 'symlink', 'fifo', 'chr', 'blk', 'sock')),
    uid INTEGER NOT NULL,
    gid INTEGER NOT NULL,
    mode INTEGER NOT NULL,
    created_ns INTEGER NOT NULL,
    modified_ns INTEGER NOT NULL,
    changed_ns INTEGER NOT NULL,
    size INTEGER,
    capacity INTEGER,
    device TEXT,
    durable INTEGER,
    state TEXT CHECK (state IN ('pending', 'ready', 'degraded', 'lost')),
    ecc TEXT CHECK (ecc IN ('rs', 'none')),
    unsealed INTEGER NOT NULL DEFAULT 0,
    verified_ns INTEGER,
    accessed_ns INTEGER,
    target TEXT,
    rdev INTEGER,
    snapshot TEXT,
    snapshot_ns INTEGER,
    slab INTEGER,
    slot INTEGER,
    UNIQUE (parent, name)
);
CREATE TABLE holders (
    id INTEGER PRIMARY KEY,
    node INTEGER NOT NULL,
    session INTEGER NOT NULL,
    kind TEXT NOT NULL,
    pid INTEGER NOT NULL,
    uid INTEGER NOT NULL,
    since_ns INTEGER NOT NULL
);
CREATE TABLE events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time_ns INTEGER NOT NULL,
    kind TEXT NOT NULL,
    node INTEGER,
    path TEXT,
    uid INTEGER,
    pid INTEGER,
    detail TEXT NOT NULL
);
CREATE INDEX events_node ON events (node);
CREATE INDEX events_uid ON events (uid, id);
CREATE TABLE links (
    parent INTEGER NOT NULL REFERENCES nodes(id),
    name TEXT NOT NULL,
    node INTEGER NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
    PRIMARY KEY (parent, name)
);
CREATE INDEX links_node ON links (node);
CREATE TABLE damage (
    node INTEGER NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
    block INTEGER NOT NULL,
    found_ns INTEGER NOT NULL,
    PRIMARY KEY (node, block)
);
CREATE TABLE metadata (
    node INTEGER NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
    key BLOB NOT NULL,
    value BLOB NOT NULL,
    PRIMARY KEY (node, key)
) WITHOUT ROWID;
CREATE TABLE slabs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    uid INTEGER NOT NULL,
    device TEXT NOT NULL,
    ecc TEXT NOT NULL CHECK (ecc IN ('rs', 'none')),
    slot INTEGER NOT NULL,
    capacity INTEGER NOT NULL,
    created_ns INTEGER NOT NULL,
    parity_arena INTEGER,
    parity_offset INTEGER
);
CREATE TABLE parity_arenas (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    device TEXT NOT NULL,
    capacity INTEGER NOT NULL,
    created_ns INTEGER NOT NULL
);
CREATE TABLE parity_spans (
    node INTEGER PRIMARY KEY,
    arena INTEGER NOT NULL,
    offset INTEGER NOT NULL,
    bytes INTEGER NOT NULL
);
