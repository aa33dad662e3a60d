"""The durable registry: SQLite in the state directory.

WAL journal, synchronous=NORMAL. A change to durable allocations is made durable before its
commit returns by an fsync of the WAL (what synchronous=FULL does, but chosen per commit:
SQLite refuses to change the level inside a transaction, and group commit keeps one open).
Changes that only concern transient state (transient allocations, holders) commit without
it: in WAL mode that is still atomic and consistent after a crash, it just may lose the
newest such commits, and transient state never outlives the daemon anyway, so the next start
drops it. That keeps a transient create off the fsync path.

All SQL of the daemon lives here; the AllocationManager calls these methods inside
`transaction()`.
"""
from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time

SCHEMA_VERSION = 4
ROOT_ID = 1
GROUP_COMMIT_SECONDS = 0.005


def create_tables(db: sqlite3.Connection) -> None:
    """Schema version 1. Every column's meaning and sentinels are stated here."""
    execute_script(db, """
    CREATE TABLE meta (
        key   TEXT PRIMARY KEY,  -- 'created_ns', 'instance' (a random id of this registry)
        value TEXT NOT NULL
    );
    CREATE TABLE nodes (
        -- Directories and allocations share one table: the namespace is a tree, as in a
        -- filesystem, so a rename moves one row and the id doubles as the inode number.
        id          INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: keeper keys use it
        parent      INTEGER REFERENCES nodes(id),       -- NULL only for the root (id 1)
        name        TEXT NOT NULL,   -- one path component; '' for the root
        kind        TEXT NOT NULL CHECK (kind IN ('dir', 'alloc')),
        uid         INTEGER NOT NULL,  -- owner
        gid         INTEGER NOT NULL,  -- group
        mode        INTEGER NOT NULL,  -- permission bits only (07777), no file type bits
        created_ns  INTEGER NOT NULL,  -- wall clock, ns since the epoch
        modified_ns INTEGER NOT NULL,  -- last change of the data (or of the entries, for dirs)
        changed_ns  INTEGER NOT NULL,  -- last change of the metadata
        -- The columns below are NULL for directories.
        size        INTEGER,  -- bytes the user asked for (0 for a pending file made in the mount)
        capacity    INTEGER,  -- bytes held on the device (size rounded up to the device's
                              -- granularity); NULL while 'pending'
        device      TEXT,     -- UUID of the device holding it (host backend: 'HOST-...')
        durable     INTEGER,  -- 1 durable (survives daemon restarts), 0 transient
        state       TEXT CHECK (state IN ('pending', 'ready', 'degraded', 'lost',
                                          'recovering')),
        ecc         TEXT CHECK (ecc IN ('rs', 'none')),  -- requested protection
        parity_gen  INTEGER,  -- generation of the parity; 0 = parity never computed
        checksum    TEXT,     -- checksum recorded at the last seal; NULL = none recorded
        UNIQUE (parent, name)
    );
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
        path     TEXT,             -- path at the time of the event
        uid      INTEGER,          -- who caused it; NULL for the daemon itself
        pid      INTEGER,
        detail   TEXT NOT NULL     -- JSON object with kind-specific fields
    );
    CREATE INDEX events_node ON events (node);
    """)


def execute_script(db: sqlite3.Connection, script: str) -> None:
    """Run statements one by one: executescript() would COMMIT the caller's transaction."""
    statement = ""
    for line in script.splitlines(keepends=True):
        statement += line
        if sqlite3.complete_statement(statement):
            db.execute(statement)
            statement = ""


def add_damage_table(db: sqlite3.Connection) -> None:
    """Schema version 2: the blocks ECC found beyond repair (issue 5, docs/ecc.md)."""
    execute_script(db, """
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
    -- 1 while a client attached read-write has not sealed: its parity is stale, so verify
    -- and scrub skip it (and must not "repair" the client's writes back), until `seal`.
    -- 2 while a durable allocation has writes whose parity is not yet refreshed (mount or
    -- socket writes before their close/fsync): after a crash its parity is rebuilt from
    -- the data. 0 otherwise.
    ALTER TABLE nodes ADD COLUMN unsealed INTEGER NOT NULL DEFAULT 0;
    """)


def add_verified_column(db: sqlite3.Connection) -> None:
    """Schema version 3: when each allocation was last verified in full (issue 6: the
    monitor's "last verified" column)."""
    execute_script(db, """
    -- Wall clock (ns since the epoch) at which a verify, scrub or recover last finished a
    -- pass over all of the allocation's protected blocks; NULL = never verified (and for
    -- directories and allocations without ECC).
    ALTER TABLE nodes ADD COLUMN verified_ns INTEGER;
    """)


def add_accessed_column(db: sqlite3.Connection) -> None:
    """Schema version 4: access times (issue 12: utimensat's atime was dropped, and st_atime
    showed the modification time)."""
    execute_script(db, """
    -- Wall clock (ns since the epoch) of the last access: utimensat(2) sets it, and a read
    -- or listing on the mount moves it by the relatime rule (docs/mount.md). NULL only in a
    -- row inserted without it (`check` re-inserting a row): read as modified_ns.
    ALTER TABLE nodes ADD COLUMN accessed_ns INTEGER;
    -- Rows from before version 4 never recorded an access: the best guess is the last
    -- modification, which is what st_atime showed until now.
    UPDATE nodes SET accessed_ns = modified_ns;
    """)


# Migrations from version N to N+1: MIGRATIONS[N](db). Version 0 is an empty database.
MIGRATIONS = {0: create_tables, 1: add_damage_table, 2: add_verified_column,
              3: add_accessed_column}

NODE_COLUMNS = ("id", "parent", "name", "kind", "uid", "gid", "mode", "created_ns",
                "modified_ns", "changed_ns", "size", "capacity", "device", "durable",
                "state", "ecc", "parity_gen", "checksum", "unsealed", "verified_ns",
                "accessed_ns")
MAX_EVENTS = 100_000  # the event log is pruned to this many rows


class Registry:
    def __init__(self, path: str):
        self.path = path
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")      # durable commits: _commit()
        # No automatic checkpoints: one would run inside whichever request crossed the
        # threshold (two fsyncs, every ~100 commits) and stall the daemon's event loop.
        # The daemon calls checkpoint() from a worker thread instead (daemon/main.py).
        self.db.execute("PRAGMA wal_autocheckpoint=0")
        self.db.execute("PRAGMA foreign_keys=ON")
        self._in_txn = False
        self._open = False          # a BEGIN is open (a batch, or the change in progress)
        self._batched = False       # transient changes released in it and not committed
        self._want_full = False
        self._want_now = False
        self.group_commit = False   # see transaction(); the daemon turns it on
        self.on_batch = None        # called when a batch starts: schedule flush()
        self.migrate()

    # ---- schema ---------------------------------------------------------------------
    def version(self) -> int:
        return self.db.execute("PRAGMA user_version").fetchone()[0]

    def migrate(self) -> None:
        version = self.version()
        if version > SCHEMA_VERSION:
            raise RuntimeError(f"registry {self.path} has schema version {version}, newer than "
                               f"this gpumemd ({SCHEMA_VERSION}); upgrade gpumemd")
        while version < SCHEMA_VERSION:
            with self.transaction(durable=True):
                MIGRATIONS[version](self.db)
                if version == 0:
                    self._init_root()
                version += 1
                self.db.execute(f"PRAGMA user_version={version}")

    def _init_root(self) -> None:
        now = time.time_ns()
        # The root is like /tmp: anyone may create, only owners may remove (sticky bit).
        self.db.execute(
            "INSERT INTO nodes (id, parent, name, kind, uid, gid, mode, created_ns,"
            " modified_ns, changed_ns) VALUES (?, NULL, '', 'dir', ?, ?, ?, ?, ?, ?)",
            (ROOT_ID, os.geteuid(), os.getegid(), 0o1777, now, now, now))
        self.db.execute("INSERT INTO meta VALUES ('created_ns', ?)", (str(now),))
        self.db.execute("INSERT INTO meta VALUES ('instance', ?)", (os.urandom(8).hex(),))

    # ---- transactions -----------------------------------------------------------------
    # Group commit: with `group_commit` on (the daemon turns it on), a change marked `batch`
    # (it concerns only transient allocations and holders, which no restart keeps) is not
    # committed on its own: it is released as a savepoint inside one open SQLite
    # transaction, and `flush()` (called GROUP_COMMIT_SECONDS later, from the daemon's loop)
    # commits the batch. Any other change commits the batch with itself, so the order of
    # commits is the order of changes. A crash loses at most the last GROUP_COMMIT_SECONDS
    # of batched changes, which the next start would drop anyway (and the events that
    # recorded them). A creat(2) on the mount thus costs no commit of its own. Directories
    # and renames are never batched: they outlive the daemon.
    @contextlib.contextmanager
    def transaction(self, *, durable: bool, batch: bool = False):
        """One atomic change. `durable` adds an fsync at commit (see the module docstring);
        `batch` allows group commit (above).

        Nested use joins the outer transaction; a durable inner part upgrades the commit,
        a part that may not be batched commits the whole.
        """
        if self._in_txn:
            self._want_full |= durable
            self._want_now |= not batch
            yield self.db
            return
        if not self._open:
            self.db.execute("BEGIN IMMEDIATE")
            self._open = True
        self.db.execute("SAVEPOINT change")
        self._in_txn, self._want_full, self._want_now = True, durable, not batch
        try:
            yield self.db
        except BaseException:
            self._in_txn = False
            self.db.execute("ROLLBACK TO change")
            self.db.execute("RELEASE change")
            if not self._batched:
                self._commit("NORMAL")        # nothing else is in it: end it
            raise
        self._in_txn = False
        self.db.execute("RELEASE change")
        if self._want_full:
            self._commit("FULL")
        elif self.group_commit and not self._want_now:
            if not self._batched:
                self._batched = True
                if self.on_batch is not None:
                    self.on_batch()
        else:
            self._commit("NORMAL")

    def flush(self) -> None:
        """Commit the batch of transient changes, if one is open (group commit)."""
        if self._open and not self._in_txn:
            self._commit("NORMAL")

    def _commit(self, level: str) -> None:
        self.db.execute("COMMIT")
        self._open = self._batched = False
        if level == "FULL":
            self._sync_wal()

    def _sync_wal(self) -> None:
        """fsync the WAL: everything committed so far survives a power cut."""
        fd = os.open(self.path + "-wal", os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # ---- nodes ------------------------------------------------------------------------
    def load_nodes(self) -> list[sqlite3.Row]:
        return self.db.execute("SELECT * FROM nodes ORDER BY id").fetchall()

    def insert_node(self, **fields) -> int:
        cols = ", ".join(fields)
        marks = ", ".join("?" for _ in fields)
        cur = self.db.execute(f"INSERT INTO nodes ({cols}) VALUES ({marks})",
                              tuple(fields.values()))
        return cur.lastrowid

    def update_node(self, node_id: int, **fields) -> None:
        sets = ", ".join(f"{k} = ?" for k in fields)
        self.db.execute(f"UPDATE nodes SET {sets} WHERE id = ?", (*fields.values(), node_id))

    def delete_node(self, node_id: int) -> None:
        self.db.execute("DELETE FROM holders WHERE node = ?", (node_id,))
        self.db.execute("DELETE FROM nodes WHERE id = ?", (node_id,))

    # ---- ECC damage --------------------------------------------------------------------
    def damage(self) -> dict[int, set[int]]:
        out: dict[int, set[int]] = {}
        for row in self.db.execute("SELECT node, block FROM damage"):
            out.setdefault(row[0], set()).add(row[1])
        return out

    def set_damage(self, node_id: int, blocks: set[int], now_ns: int) -> None:
        """Replace the node's damaged blocks with `blocks`."""
        self.db.execute("DELETE FROM damage WHERE node = ?", (node_id,))
        self.db.executemany("INSERT INTO damage VALUES (?, ?, ?)",
                            [(node_id, b, now_ns) for b in sorted(blocks)])

    def set_meta(self, key: str, value: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    # ---- holders ----------------------------------------------------------------------
    def add_holder(self, holder_id: int, node_id: int, session: int, kind: str, pid: int,
                   uid: int, since_ns: int) -> None:
        self.db.execute("INSERT INTO holders VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (holder_id, node_id, session, kind, pid, uid, since_ns))

    def remove_holder(self, holder_id: int) -> None:
        self.db.execute("DELETE FROM holders WHERE id = ?", (holder_id,))

    def clear_holders(self) -> None:
        self.db.execute("DELETE FROM holders")

    def load_holders(self) -> list[sqlite3.Row]:
        return self.db.execute("SELECT * FROM holders ORDER BY id").fetchall()

    # ---- events -----------------------------------------------------------------------
    def add_event(self, kind: str, node: int | None, path: str | None, uid: int | None,
                  pid: int | None, detail: dict, time_ns: int) -> int:
        cur = self.db.execute(
            "INSERT INTO events (time_ns, kind, node, path, uid, pid, detail)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (time_ns, kind, node, path, uid, pid, json.dumps(detail, sort_keys=True)))
        if cur.lastrowid % 1000 == 0:
            self.db.execute("DELETE FROM events WHERE id <= ?", (cur.lastrowid - MAX_EVENTS,))
        return cur.lastrowid

    def last_event_id(self) -> int:
        """The id of the newest event (0 when the log is empty)."""
        return self.db.execute("SELECT COALESCE(MAX(id), 0) FROM events").fetchone()[0]

    def events(self, since: int = 0, limit: int = 100, path: str | None = None,
               uid: int | None = None) -> list[dict]:
        """Events after `since`, oldest first; with `uid`, only that user's and the
        daemon-wide ones."""
        where, args = "id > ?", [since]
        if uid is not None:
            where += " AND (uid = ? OR node IS NULL)"
            args.append(uid)
        if path:
            prefix = path + "/"
            where += " AND (path = ? OR substr(path, 1, ?) = ?)"
            args += [path, len(prefix), prefix]
        rows = self.db.execute(
            f"SELECT * FROM (SELECT * FROM events WHERE {where} ORDER BY id DESC LIMIT ?)"
            " ORDER BY id", (*args, limit)).fetchall()
        return [event_row_to_dict(r) for r in rows]

    def checkpoint(self, mode: str = "PASSIVE") -> tuple[int, int, int]:
        """Copy committed WAL frames into the database file, on a connection of its own, so
        it may run in a worker thread while the daemon's connection keeps committing.
        Returns SQLite's (busy, wal frames, frames checkpointed)."""
        if mode not in ("PASSIVE", "FULL", "RESTART", "TRUNCATE"):
            raise ValueError(f"unknown checkpoint mode {mode!r}")
        db = sqlite3.connect(self.path, isolation_level=None)
        try:
            db.execute("PRAGMA synchronous=FULL")
            return tuple(db.execute(f"PRAGMA wal_checkpoint({mode})").fetchone())
        finally:
            db.close()

    def integrity_errors(self) -> list[str]:
        rows = self.db.execute("PRAGMA integrity_check").fetchall()
        return [r[0] for r in rows if r[0] != "ok"]

    def close(self) -> None:
        self.flush()
        self.db.close()


def event_row_to_dict(row) -> dict:
    return {"id": row["id"], "time_ns": row["time_ns"], "kind": row["kind"],
            "node": row["node"], "path": row["path"], "uid": row["uid"], "pid": row["pid"],
            "detail": json.loads(row["detail"])}
