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

Bounds (docs/durability.md, "Bounds"): the WAL is folded into the database and truncated
when it passes WAL_LIMIT and when the daemon has been idle for IDLE_SECONDS (checkpoint_due;
daemon/main.py runs the checkpoints on a worker thread); the event log keeps at most
`max_events` rows (MAX_EVENTS) and `max_event_bytes` bytes of detail and path text
(MAX_EVENT_BYTES), the oldest going first.

Names and paths (nodes.name, events.path) are bytes on Linux and may be anything but NUL
and `/` (gpumemctl/protocol/names.py), while SQLite TEXT is UTF-8, which a name decoded with
surrogateescape is not. So a name is stored as TEXT when it is valid UTF-8 (every name an
older gpumemd stored) and as a BLOB of its bytes when it is not: each name has exactly one
stored form, so UNIQUE (parent, name) still means what it says (stored_name, loaded_name).

A registry that SQLite cannot read (not a database, a damaged page) raises RegistryUnusable
with `corrupt` set, as does one from a newer gpumemd (without it); gpumemd turns either into
one line (daemon/main.py).
"""
from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
from collections.abc import Callable
from urllib.parse import quote

from gpumemctl.protocol import name_bytes, name_from_bytes

SCHEMA_VERSION = 11
ROOT_ID = 1
GROUP_COMMIT_SECONDS = 0.005
WAL_LIMIT = 64 << 20          # bytes: a WAL past this is checkpointed and truncated
IDLE_SECONDS = 1.0            # no change for this long: the WAL is truncated
PASSIVE_SECONDS = 1.0         # changed since: a checkpoint that never blocks writers
BUSY_TIMEOUT_MS = 5000        # how long a statement waits for another connection's lock
CHECKPOINT_BUSY_MS = 1000     # ... and a checkpoint for the daemon's transaction to end
MAX_EVENTS = 100_000          # the event log is pruned to this many rows ...
MAX_EVENT_BYTES = 64 << 20    # ... and to this many bytes of detail and path text
EVENT_PRUNE_TO = 0.75         # pruning by bytes keeps this share of max_event_bytes
# What one user's events may take of max_event_bytes (root's, the daemon's own uid's and the
# daemon-wide ones excepted): past it, that user's oldest go, not everyone's, so that no one
# user can push the others' history out of the log (docs/security.md).
EVENT_SHARE_PER_UID = 0.25
# SQLite's primary result codes (the low byte of sqlite3.Error.sqlite_errorcode) that mean
# the file's content is damaged, as opposed to a file that cannot be opened at all.
CORRUPT_CODES = (11, 26)      # SQLITE_CORRUPT, SQLITE_NOTADB
# The bytes an event takes in the log: what max_event_bytes counts.
EVENT_BYTES_SQL = ("length(CAST(detail AS BLOB)) + COALESCE(length(CAST(path AS BLOB)), 0)")


class RegistryUnusable(RuntimeError):
    """The registry cannot be used. `corrupt`: SQLite cannot read it (it is not a database,
    or a page is damaged), as opposed to one written by a newer gpumemd."""

    def __init__(self, message: str, *, corrupt: bool):
        super().__init__(message)
        self.corrupt = corrupt


# The nodes table: create_tables() makes it, and add_links_and_special_files() rebuilds an
# older one to it.
_NODES_SQL = """
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
        -- The columns below, up to `unsealed`, are NULL for every kind but 'alloc'.
        size        INTEGER,  -- bytes the user asked for (0 for a pending file made in the mount)
        capacity    INTEGER,  -- bytes held on the device (size rounded up to the device's
                              -- granularity); NULL while 'pending'
        device      TEXT,     -- UUID of the device holding it (host backend: 'HOST-...')
        durable     INTEGER,  -- 1 durable (survives daemon restarts), 0 transient
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
        UNIQUE (parent, name)
    );
"""


# Hard links (issue 15): create_tables() makes it, add_hard_links() adds it to an older one.
_LINKS_SQL = """
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


# User metadata (issue 17): create_tables() makes it, add_user_metadata() adds it to an older
# registry.
_METADATA_SQL = """
    CREATE TABLE IF NOT EXISTS metadata (
        -- Small key-value pairs a user keeps on an allocation or a directory (`gpumemctl
        -- meta`, `user.KEY` attributes on the mount; daemon/usermeta.py has the rules and
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
    schema through MIGRATIONS (tests/unit/test_registry_schema.py compares the two); a
    change to the schema goes here and into a new migration."""
    execute_script(db, """
    CREATE TABLE meta (
        key   TEXT PRIMARY KEY,  -- 'created_ns', 'instance' (a random id of this registry)
        value TEXT NOT NULL
    );
    """ + _NODES_SQL + """
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
    """ + _LINKS_SQL + """
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
    """ + _METADATA_SQL)


def execute_script(db: sqlite3.Connection, script: str) -> None:
    """Run statements one by one: executescript() would COMMIT the caller's transaction."""
    statement = ""
    for line in script.splitlines(keepends=True):
        statement += line
        if sqlite3.complete_statement(statement):
            db.execute(statement)
            statement = ""


# ---- migrations of older registries ------------------------------------------------------
# Each brings a registry of version N to N+1 (MIGRATIONS[N]); the columns' meanings are in
# create_tables(). A new registry never runs them: create_tables() makes the current schema
# at once.
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
    as bytes where it expects a name, so it must refuse this registry (migrate())."""
    del db


def add_links_and_special_files(db: sqlite3.Connection) -> None:
    """7 -> 8 (issue 15): symlinks and special files, and their `target` and `rdev`.
    The `kind` CHECK must allow them, and SQLite cannot alter a CHECK: `nodes` is rebuilt
    the documented way (https://sqlite.org/lang_altertable.html, "other kinds of table
    schema changes"): foreign keys off (migrate() turns them off around every migration),
    a new table of the current schema, the rows copied with their ids, the old table
    dropped, the new one renamed, and foreign_key_check before the commit. The rebuild also
    drops what older registries still carry: parity_gen and checksum where SQLite was too
    old to drop them, and the 'recovering' state in the `state` CHECK."""
    seq = db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'nodes'").fetchone()
    execute_script(db, _NODES_SQL.replace("CREATE TABLE nodes (", "CREATE TABLE new_nodes ("))
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
    execute_script(db, _LINKS_SQL)


def add_snapshot_columns(db: sqlite3.Connection) -> None:
    """9 -> 10 (issue 16): each allocation's newest snapshot and its time. A registry older
    than 8 has them already: the 7 -> 8 rebuild makes `nodes` of the current schema."""
    have = {r[1] for r in db.execute("PRAGMA table_info('nodes')")}
    for column, kind in (("snapshot", "TEXT"), ("snapshot_ns", "INTEGER")):
        if column not in have:
            db.execute(f"ALTER TABLE nodes ADD COLUMN {column} {kind}")


def add_user_metadata(db: sqlite3.Connection) -> None:
    """10 -> 11 (issue 17): the `metadata` table of user metadata."""
    execute_script(db, _METADATA_SQL)


MIGRATIONS = {1: add_damage_table, 2: add_verified_column, 3: add_accessed_column,
              4: drop_unused_columns, 5: add_events_uid_index, 6: allow_blob_names,
              7: add_links_and_special_files, 8: add_hard_links,
              9: add_snapshot_columns, 10: add_user_metadata}


def stored_name(name: str) -> str | bytes:
    """A name or path as the registry stores it: TEXT when its bytes are UTF-8, else a BLOB
    of its bytes (a str holding surrogateescape's lone surrogates cannot be SQLite TEXT)."""
    raw = name_bytes(name)
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return raw


def loaded_name(value: str | bytes) -> str:
    """What stored_name() stored, as the daemon spells names (surrogateescape)."""
    return name_from_bytes(value) if isinstance(value, bytes) else value


class Registry:
    def __init__(self, path: str, *, max_events: int = MAX_EVENTS,
                 max_event_bytes: int = MAX_EVENT_BYTES):
        self.path = path
        self.max_events = max_events
        self.max_event_bytes = max_event_bytes
        # Pruning by rows runs every this many events (a DELETE per event would cost).
        self._prune_every = max(1, min(1000, max_events // 100))
        self._in_txn = False
        self._open = False          # a BEGIN is open (a batch, or the change in progress)
        self._batched = False       # transient changes released in it and not committed
        self._want_full = False
        self._want_now = False
        self.group_commit = False   # see transaction(); enable_group_commit() turns it on
        self.on_batch: Callable[[], None] | None = None   # a batch starts: schedule flush()
        self.batch_lost = False     # a failed commit took answered batched changes with it
        self.created = False        # this open made the registry (there was none)
        self._instance: str | None = None       # meta 'instance', once read
        self._event_bytes: int | None = None    # what max_event_bytes counts; None: recount
        self._uid_event_bytes: dict[int, int] = {}   # the same per user, counted when first asked
        self.last_change = time.monotonic()     # of the last transaction: idle detection
        self._checkpointed = self.last_change   # of the last checkpoint that finished
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:
            self._configure()
            self.migrate()
            self._require_intact()
        except sqlite3.DatabaseError as exc:
            self.db.close()
            if (getattr(exc, "sqlite_errorcode", None) or 0) & 0xff in CORRUPT_CODES:
                raise RegistryUnusable(f"registry {path} is unreadable ({exc})",
                                       corrupt=True) from None
            raise

    def _configure(self) -> None:
        self.db.row_factory = sqlite3.Row
        self.db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")   # a checkpoint's lock
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")      # durable commits: _commit()
        # No automatic checkpoints: one would run inside whichever request crossed the
        # threshold (two fsyncs, every ~100 commits) and stall the daemon's event loop.
        # The daemon calls checkpoint() from a worker thread instead (daemon/main.py).
        self.db.execute("PRAGMA wal_autocheckpoint=0")
        # When the WAL restarts from its beginning (after a complete checkpoint), SQLite
        # truncates a longer file to this size instead of keeping its high-water mark.
        self.db.execute(f"PRAGMA journal_size_limit={WAL_LIMIT}")
        self.db.execute("PRAGMA foreign_keys=ON")

    def _require_intact(self) -> None:
        """A damaged page found now is one line at start, not an error in some request
        later. quick_check reads every page: about 0.1 s for a 50 MiB registry."""
        problems = [row[0] for row in self.db.execute("PRAGMA quick_check(5)")]
        if problems != ["ok"]:
            raise RegistryUnusable(f"registry {self.path} is damaged ({problems[0]})",
                                   corrupt=True)

    # ---- schema ---------------------------------------------------------------------
    def version(self) -> int:
        return self.db.execute("PRAGMA user_version").fetchone()[0]

    def migrate(self) -> None:
        version = self.version()
        if version > SCHEMA_VERSION:
            raise RegistryUnusable(f"registry {self.path} has schema version {version}, newer "
                                   f"than this gpumemd ({SCHEMA_VERSION}); upgrade gpumemd",
                                   corrupt=False)
        self.created = version == 0     # version 0: an empty database, made just now
        if self.created:
            with self.transaction(durable=True):
                create_tables(self.db)
                self._init_root()
                self.db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            return
        # Foreign keys off while migrating (a pragma that is a no-op inside a transaction):
        # a rebuilt table's DROP would otherwise cascade to the rows that reference it.
        self.db.execute("PRAGMA foreign_keys=OFF")
        try:
            while version < SCHEMA_VERSION:
                with self.transaction(durable=True):
                    MIGRATIONS[version](self.db)
                    version += 1
                    self.db.execute(f"PRAGMA user_version={version}")
        finally:
            self.db.execute("PRAGMA foreign_keys=ON")

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
    def enable_group_commit(self, on_batch: Callable[[], None] | None = None) -> None:
        """Batch the changes marked `batch` (below); `on_batch` is told when a batch starts,
        so that its owner schedules flush() (daemon/main.GroupCommit)."""
        self.group_commit, self.on_batch = True, on_batch

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
        self.last_change = time.monotonic()
        self.db.execute("SAVEPOINT change")
        self._in_txn, self._want_full, self._want_now = True, durable, not batch
        try:
            yield self.db
        except BaseException:
            self._in_txn = False
            self._event_bytes = None          # events it added or pruned are undone: recount
            self._uid_event_bytes.clear()
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

    @property
    def in_transaction(self) -> bool:
        """Whether a transaction() block is open (the journal's undo log is live)."""
        return self._in_txn

    def flush(self) -> None:
        """Commit the batch of transient changes, if one is open (group commit)."""
        if self._open and not self._in_txn:
            self._commit("NORMAL")

    def _commit(self, level: str) -> None:
        try:
            self.db.execute("COMMIT")
        except sqlite3.Error:
            self._event_bytes = None
            self._uid_event_bytes.clear()
            if not self.db.in_transaction:
                # SQLite rolled the transaction back itself (a full disk does that at
                # COMMIT): there is nothing left to commit, and the next change begins anew.
                # Batched changes were answered already: they are lost from the registry
                # (not from memory) until it is rewritten (main.GroupCommit).
                if self._batched:
                    self.batch_lost = True
                    if self.on_batch is not None:
                        self.on_batch()
                self._open = self._batched = False
            raise
        self._open = self._batched = False
        self.last_change = time.monotonic()
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
    def load_nodes(self) -> list[dict]:
        rows = self.db.execute("SELECT * FROM nodes ORDER BY id").fetchall()
        return [{**row, "name": loaded_name(row["name"])} for row in map(dict, rows)]

    def insert_node(self, **fields) -> int:
        if "name" in fields:
            fields["name"] = stored_name(fields["name"])
        cols = ", ".join(fields)
        marks = ", ".join("?" for _ in fields)
        cur = self.db.execute(f"INSERT INTO nodes ({cols}) VALUES ({marks})",
                              tuple(fields.values()))
        return inserted_id(cur)

    def update_node(self, node_id: int, **fields) -> None:
        if "name" in fields:
            fields["name"] = stored_name(fields["name"])
        sets = ", ".join(f"{k} = ?" for k in fields)
        self.db.execute(f"UPDATE nodes SET {sets} WHERE id = ?", (*fields.values(), node_id))

    def delete_node(self, node_id: int) -> None:
        self.db.execute("DELETE FROM holders WHERE node = ?", (node_id,))
        self.db.execute("DELETE FROM links WHERE node = ?", (node_id,))
        self.db.execute("DELETE FROM nodes WHERE id = ?", (node_id,))

    # ---- hard links: a node's names beyond the one in its row -------------------------
    def load_links(self) -> list[dict]:
        rows = self.db.execute("SELECT parent, name, node FROM links ORDER BY rowid")
        return [{**row, "name": loaded_name(row["name"])} for row in map(dict, rows)]

    def insert_link(self, parent_id: int, name: str, node_id: int) -> None:
        self.db.execute("INSERT INTO links (parent, name, node) VALUES (?, ?, ?)",
                        (parent_id, stored_name(name), node_id))

    def delete_link(self, parent_id: int, name: str) -> None:
        self.db.execute("DELETE FROM links WHERE parent = ? AND name = ?",
                        (parent_id, stored_name(name)))

    # ---- user metadata (daemon/usermeta.py) -------------------------------------------
    def load_metadata(self) -> list[tuple[int, bytes, bytes]]:
        """(node id, key, value) of every row, by node and key."""
        rows = self.db.execute("SELECT node, key, value FROM metadata ORDER BY node, key")
        return [(node, bytes(key), bytes(value)) for node, key, value in rows]

    def set_metadata(self, node_id: int, key: bytes, value: bytes) -> None:
        self.db.execute("INSERT OR REPLACE INTO metadata (node, key, value) VALUES (?, ?, ?)",
                        (node_id, key, value))

    def delete_metadata(self, node_id: int, key: bytes | None = None) -> None:
        """One key of the node's metadata, or (None) all of it."""
        if key is None:
            self.db.execute("DELETE FROM metadata WHERE node = ?", (node_id,))
        else:
            self.db.execute("DELETE FROM metadata WHERE node = ? AND key = ?", (node_id, key))

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

    # ---- identity and ids -------------------------------------------------------------
    @property
    def instance(self) -> str:
        """This registry's random identity (meta 'instance', made with it). Keeper deposits
        carry it, so that a start can tell a keeper that served another registry."""
        if self._instance is None:
            value = self.meta("instance")
            if value is None:             # only a registry edited by hand lacks it
                value = os.urandom(8).hex()
                with self.transaction(durable=True):
                    self.set_meta("instance", value)
            self._instance = value
        return self._instance

    def last_node_id(self) -> int:
        """The largest node id ever committed (AUTOINCREMENT's high-water mark)."""
        row = self.db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'nodes'")
        found = row.fetchone()
        return found[0] if found else 0

    def reserve_node_ids(self, up_to: int) -> None:
        """Make every future node id larger than `up_to`: ids are keeper keys, so an id
        must never alias memory the keeper holds under a key another registry issued."""
        if up_to > self.last_node_id():
            cur = self.db.execute("UPDATE sqlite_sequence SET seq = ? WHERE name = 'nodes'",
                                  (up_to,))
            if cur.rowcount == 0:
                self.db.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('nodes', ?)",
                                (up_to,))

    def next_node_id(self) -> int:
        """The id AUTOINCREMENT would give the next row."""
        return max(self.last_node_id(), self.db.execute(
            "SELECT coalesce(max(id), 0) FROM nodes").fetchone()[0]) + 1

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
        """Append an event (its detail bounded by the caller: daemon/events.py) and prune
        the oldest past MAX_EVENTS rows or max_event_bytes bytes."""
        # ensure_ascii (the default) writes a lone surrogate as "\udcff": details that
        # quote a name that is not UTF-8 stay valid TEXT and load back the same.
        text = json.dumps(detail, sort_keys=True)
        cur = self.db.execute(
            "INSERT INTO events (time_ns, kind, node, path, uid, pid, detail)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (time_ns, kind, node, None if path is None else stored_name(path), uid, pid, text))
        newest = inserted_id(cur)
        added = len(text) + (len(name_bytes(path)) if path else 0)   # as EVENT_BYTES_SQL
        if self._event_bytes is not None:
            self._event_bytes += added
        if newest % self._prune_every == 0:
            self._delete_events_through(newest - self.max_events)
        if self._event_bytes is None or self._event_bytes > self.max_event_bytes:
            self._prune_event_bytes(newest)
        if uid is not None and uid != 0 and uid != os.geteuid():
            self._prune_user_share(uid, newest, added)
        return newest

    def _prune_user_share(self, uid: int, newest: int, added: int) -> None:
        """Past its share (EVENT_SHARE_PER_UID of max_event_bytes): delete `uid`'s oldest
        events (never `newest`) down to EVENT_PRUNE_TO of the share."""
        share = int(self.max_event_bytes * EVENT_SHARE_PER_UID)
        held = self._uid_event_bytes.get(uid)
        if held is None:
            held = self.db.execute(f"SELECT COALESCE(SUM({EVENT_BYTES_SQL}), 0) FROM events"
                                   " WHERE uid = ?", (uid,)).fetchone()[0]
        else:
            held += added
        excess = held - int(share * EVENT_PRUNE_TO)
        if held > share and excess > 0:
            cut, freed = self._oldest_to_free("uid = ? AND id < ?", (uid, newest), excess)
            if cut is not None:
                self.db.execute("DELETE FROM events WHERE uid = ? AND id <= ?", (uid, cut))
                held -= freed
                if self._event_bytes is not None:
                    self._event_bytes -= freed
        self._uid_event_bytes[uid] = held

    def _delete_events_through(self, last_id: int) -> None:
        self._uid_event_bytes.clear()       # recounted per user when next needed
        if self._event_bytes is not None:
            freed = self.db.execute(f"SELECT COALESCE(SUM({EVENT_BYTES_SQL}), 0) FROM events"
                                    " WHERE id <= ?", (last_id,)).fetchone()[0]
            self._event_bytes -= freed
        self.db.execute("DELETE FROM events WHERE id <= ?", (last_id,))

    def event_log_bytes(self) -> int:
        """Bytes of detail and path text in the event log (what max_event_bytes bounds)."""
        if self._event_bytes is None:
            self._event_bytes = self.db.execute(
                f"SELECT COALESCE(SUM({EVENT_BYTES_SQL}), 0) FROM events").fetchone()[0]
        return self._event_bytes

    def _prune_event_bytes(self, newest: int) -> None:
        """Past max_event_bytes: delete the oldest events (never `newest`, the one being
        added) down to EVENT_PRUNE_TO of it, so that pruning is rare, not every event."""
        total = self.event_log_bytes()
        excess = total - int(self.max_event_bytes * EVENT_PRUNE_TO)
        if total <= self.max_event_bytes or excess <= 0:
            return
        cut, _ = self._oldest_to_free("id < ?", (newest,), excess)
        if cut is not None:
            self._delete_events_through(cut)

    def _oldest_to_free(self, where: str, args: tuple, excess: int) -> tuple[int | None, int]:
        """The id through which the oldest events matching `where` add up to `excess` bytes
        (or all of them), and the bytes they hold; (None, 0) when none match."""
        freed, cut = 0, None
        cur = self.db.execute(f"SELECT id, {EVENT_BYTES_SQL} FROM events WHERE {where}"
                              " ORDER BY id", args)
        for row_id, size in cur:
            freed, cut = freed + size, row_id
            if freed >= excess:
                break
        cur.close()
        return cut, freed

    def last_snapshot_reports(self, counts: Callable[[int], bool]) -> dict[str, dict]:
        """The newest `snapshot` event of each action by a uid that `counts` (the
        administrator's: status and metrics show them across restarts)."""
        out: dict[str, dict] = {}
        rows = self.db.execute("SELECT uid, time_ns, detail FROM events WHERE kind = "
                               "'snapshot' ORDER BY id DESC LIMIT 1000")
        for uid, time_ns, detail in rows:
            if uid is None or not counts(uid):
                continue
            try:
                report = json.loads(detail)
            except ValueError:
                continue
            out.setdefault(report.get("action", "?"), {**report, "time_ns": time_ns,
                                                       "uid": uid})
        return out

    def last_event_id(self) -> int:
        """The id of the newest event (0 when the log is empty)."""
        return self.db.execute("SELECT COALESCE(MAX(id), 0) FROM events").fetchone()[0]

    def events(self, since: int = 0, limit: int = 100, path: str | None = None,
               uid: int | None = None) -> list[dict]:
        """Events after `since`, oldest first, the newest `limit` of them; with `uid`, only
        that user's and the daemon-wide ones; with `path`, those at or under it."""
        return self.events_page(since, limit, path, uid)[0]

    def events_page(self, since: int = 0, limit: int = 100, path: str | None = None,
                    uid: int | None = None, max_bytes: int | None = None,
                    administrator: bool = False) -> tuple[list[dict], bool]:
        """events(), and with `max_bytes` only the newest that fit in that many bytes of
        detail and path text (the newest one always), so that one answer stays bounded
        however large the log (docs/protocol.md, "Limits"). Also says whether the page is
        complete: False when older events were left out for want of bytes. With `uid`, what
        daemon/events.visible_to shows that user (`administrator`: a member of admin_group)."""
        where = "id > ?"
        args: list[int | bytes] = [since]
        if uid is not None:
            where += " AND (uid = ? OR (node IS NULL AND (uid IS NULL OR ?)))"
            args += [uid, int(administrator)]
        if path:
            # Compared as bytes: a path is TEXT or a BLOB (stored_name), and SQLite never
            # finds a TEXT equal to a BLOB; CAST gives a TEXT's UTF-8 bytes.
            whole, prefix = name_bytes(path), name_bytes(path + "/")
            where += (" AND (CAST(path AS BLOB) = ?"
                      " OR substr(CAST(path AS BLOB), 1, ?) = ?)")
            args += [whole, len(prefix), prefix]
        cur = self.db.execute(
            f"SELECT *, {EVENT_BYTES_SQL} AS bytes FROM events WHERE {where}"
            " ORDER BY id DESC LIMIT ?", (*args, limit))
        rows: list[sqlite3.Row] = []
        total, complete = 0, True
        for row in cur:                  # newest first, read only as far as the budget goes
            total += row["bytes"]
            if max_bytes is not None and rows and total > max_bytes:
                complete = False
                break
            rows.append(row)
        cur.close()
        return [event_row_to_dict(r) for r in reversed(rows)], complete

    # ---- checkpoints ------------------------------------------------------------------
    def wal_bytes(self) -> int:
        try:
            return os.stat(self.path + "-wal").st_size
        except FileNotFoundError:
            return 0

    def checkpoint_due(self, now: float) -> str | None:
        """The checkpoint to run now, if any (daemon/main.py polls this):
        - TRUNCATE when the WAL has passed WAL_LIMIT, or when nothing changed for
          IDLE_SECONDS and the WAL is not empty: it goes back to zero bytes;
        - PASSIVE when something changed since the last checkpoint, at most every
          PASSIVE_SECONDS: it copies what it can without blocking writers, so that the
          TRUNCATE that follows has little left to copy while it blocks them."""
        wal = self.wal_bytes()
        if wal > WAL_LIMIT:
            return "TRUNCATE"
        if wal and now - self.last_change >= IDLE_SECONDS and not self._open:
            return "TRUNCATE"
        if self.last_change > self._checkpointed and \
                now - self._checkpointed >= PASSIVE_SECONDS:
            return "PASSIVE"
        return None

    def checkpoint(self, mode: str = "PASSIVE") -> tuple[int, int, int]:
        """Copy committed WAL frames into the database file, on a connection of its own, so
        it may run in a worker thread while the daemon's connection keeps committing.
        TRUNCATE also empties the WAL file: it first copies what it can as PASSIVE, then
        waits up to CHECKPOINT_BUSY_MS for the daemon's open transaction (a group commit
        batch) to end, and blocks the daemon's writers (their busy timeout waits) only
        while it copies the rest. Returns SQLite's (busy, wal frames, frames checkpointed):
        busy 1 means it could not finish (retried at the next checkpoint_due)."""
        if mode not in ("PASSIVE", "FULL", "RESTART", "TRUNCATE"):
            raise ValueError(f"unknown checkpoint mode {mode!r}")
        started = time.monotonic()
        db = sqlite3.connect(self.path, isolation_level=None)
        try:
            db.execute("PRAGMA synchronous=FULL")
            db.execute(f"PRAGMA busy_timeout={CHECKPOINT_BUSY_MS}")
            db.execute(f"PRAGMA journal_size_limit={WAL_LIMIT}")
            if mode != "PASSIVE":
                db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            result = tuple(db.execute(f"PRAGMA wal_checkpoint({mode})").fetchone())
        finally:
            db.close()
        if result[0] == 0:
            self._checkpointed = started
        return result

    def integrity_errors(self) -> list[str]:
        rows = self.db.execute("PRAGMA integrity_check").fetchall()
        return [r[0] for r in rows if r[0] != "ok"]

    def integrity_errors_readonly(self) -> list[str]:
        """integrity_errors() on a read-only connection of its own, so that it may run in a
        worker thread (it reads every page: most of a second for a large registry) while
        the daemon's connection keeps committing: in WAL mode a reader sees the last
        commit before it began and blocks no writer."""
        db = sqlite3.connect(f"file:{quote(self.path)}?mode=ro", uri=True,
                             isolation_level=None)
        try:
            db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            rows = db.execute("PRAGMA integrity_check").fetchall()
        finally:
            db.close()
        return [r[0] for r in rows if r[0] != "ok"]

    def close(self) -> None:
        self.flush()
        self.db.close()


def inserted_id(cur: sqlite3.Cursor) -> int:
    """The rowid an INSERT just made (sqlite3 types lastrowid as optional: it is None only
    for statements that insert nothing)."""
    if cur.lastrowid is None:
        raise RuntimeError("an INSERT made no row")
    return cur.lastrowid


def event_row_to_dict(row) -> dict:
    return {"id": row["id"], "time_ns": row["time_ns"], "kind": row["kind"],
            "node": row["node"],
            "path": None if row["path"] is None else loaded_name(row["path"]),
            "uid": row["uid"], "pid": row["pid"],
            "detail": json.loads(row["detail"])}
