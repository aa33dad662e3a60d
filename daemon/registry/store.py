"""The Registry: the SQLite connection, its transactions and group commit, checkpoints and
integrity checks; the tables' SQL is in the parts it composes (registry.nodes, .links,
.metadata, .damaged, .identity, .holders, .event_log).

WAL journal, synchronous=NORMAL. A change to durable allocations is made durable before its
commit returns by an fsync of the WAL (what synchronous=FULL does, but chosen per commit:
SQLite refuses to change the level inside a transaction, and group commit keeps one open).
Changes that only concern transient state (transient allocations, holders) commit without
it: in WAL mode that is still atomic and consistent after a crash, it just may lose the
newest such commits, and transient state never outlives the daemon anyway, so the next start
drops it. That keeps a transient create off the fsync path.

Bounds (docs/durability.md, "Bounds"): the WAL is folded into the database and truncated
when it passes WAL_LIMIT and when the daemon has been idle for IDLE_SECONDS (checkpoint_due;
daemon/main.py runs the checkpoints on a worker thread); the event log's bounds are in
eventlog.py.

A registry that SQLite cannot read (not a database, a damaged page) raises RegistryUnusable
with `corrupt` set, as does one from a newer gpumemd (without it); gpumemd turns either into
one line (daemon/main.py).
"""
from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Callable
from urllib.parse import quote

from . import migrations
from .arenas import ParityArenas
from .damage import Damage
from .eventlog import MAX_EVENT_BYTES, MAX_EVENTS, EventLog
from .holders import Holders
from .identity import Identity
from .metadata import UserMetadata
from .nodes import Links, Nodes
from .schema import SCHEMA_VERSION
from .slabs import Slabs

GROUP_COMMIT_SECONDS = 0.005
WAL_LIMIT = 64 << 20          # bytes: a WAL past this is checkpointed and truncated
IDLE_SECONDS = 1.0            # no change for this long: the WAL is truncated
PASSIVE_SECONDS = 1.0         # changed since: a checkpoint that never blocks writers
BUSY_TIMEOUT_MS = 5000        # how long a statement waits for another connection's lock
CHECKPOINT_BUSY_MS = 1000     # ... and a checkpoint for the daemon's transaction to end
# SQLite's primary result codes (the low byte of sqlite3.Error.sqlite_errorcode) that mean
# the file's content is damaged, as opposed to a file that cannot be opened at all.
CORRUPT_CODES = (11, 26)      # SQLITE_CORRUPT, SQLITE_NOTADB


class RegistryUnusable(RuntimeError):
    """The registry cannot be used. `corrupt`: SQLite cannot read it (it is not a database,
    or a page is damaged), as opposed to one written by a newer gpumemd."""

    def __init__(self, message: str, *, corrupt: bool):
        super().__init__(message)
        self.corrupt = corrupt


class DeferredSync:
    """A durable commit's fsync that its caller runs later (Registry.deferring_sync)."""

    def __init__(self, registry: Registry):
        self.registry = registry
        self.owed = False

    def sync(self) -> None:
        """fsync the WAL if a commit owes it (safe on a worker thread: one fd of its own)."""
        if self.owed:
            self.registry.sync_wal()
            self.owed = False


class Registry:
    """One registry file, open: its connection and transactions, and its table sections
    (parts) on them."""

    def __init__(self, path: str, *, max_events: int = MAX_EVENTS,
                 max_event_bytes: int = MAX_EVENT_BYTES):
        self.path = path
        self._in_txn = False
        self._open = False          # a BEGIN is open (a batch, or the change in progress)
        self._batched = False       # transient changes released in it and not committed
        self._want_full = False
        self._want_now = False
        self._deferred: list[DeferredSync] = []    # deferring_sync() blocks open now
        self.group_commit = False   # see transaction(); enable_group_commit() turns it on
        self.on_batch: Callable[[], None] | None = None   # a batch starts: schedule flush()
        self.batch_lost = False     # a failed commit took answered batched changes with it
        self.created = False        # this open made the registry (there was none)
        self.last_change = time.monotonic()     # of the last transaction: idle detection
        self._checkpointed = self.last_change   # of the last checkpoint that finished
        # The table sections, each on this connection (self.db, as it is at each call).
        self.nodes = Nodes(self)
        self.links = Links(self)
        self.metadata = UserMetadata(self)
        self.damaged = Damage(self)
        self.identity = Identity(self)
        self.holders = Holders(self)
        self.slabs = Slabs(self)
        self.arenas = ParityArenas(self)
        self.event_log = EventLog(self, max_events, max_event_bytes)
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
        """Bring the registry to SCHEMA_VERSION (migrations.py); refuse a newer one."""
        version = self.version()
        if version > SCHEMA_VERSION:
            raise RegistryUnusable(f"registry {self.path} has schema version {version}, newer "
                                   f"than this gpumemd ({SCHEMA_VERSION}); upgrade gpumemd",
                                   corrupt=False)
        self.created = version == 0     # version 0: an empty database, made just now
        migrations.upgrade(self, version)

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
            self.event_log.forget_counts()    # events it added or pruned are undone: recount
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

    @contextlib.contextmanager
    def savepoint(self):
        """Inside a transaction(): a part whose statements an error takes back alone, the
        rest of the transaction going on (a batch's items sharing one commit)."""
        if not self._in_txn:
            raise RuntimeError("a savepoint needs an open transaction")
        self.db.execute("SAVEPOINT part")
        try:
            yield self.db
        except BaseException:
            self.event_log.forget_counts()
            self.db.execute("ROLLBACK TO part")
            self.db.execute("RELEASE part")
            raise
        self.db.execute("RELEASE part")

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
            self.event_log.forget_counts()
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
            if self._deferred:
                self._deferred[-1].owed = True
            else:
                self.sync_wal()

    @contextlib.contextmanager
    def deferring_sync(self):
        """Within: a durable commit does not fsync the WAL itself; it marks the yielded
        DeferredSync `owed`, and the caller runs its sync() (on a worker thread: the event
        loop goes on meanwhile) before it tells anyone the change is durable (a batch's
        creates: daemon/server/batch.py)."""
        deferred = DeferredSync(self)
        self._deferred.append(deferred)
        try:
            yield deferred
        finally:
            self._deferred.remove(deferred)

    def sync_wal(self) -> None:
        """fsync the WAL: everything committed so far survives a power cut."""
        fd = os.open(self.path + "-wal", os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

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
