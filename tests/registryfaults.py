"""A registry connection whose n-th writing statement fails as a full disk makes SQLite fail:
the fault of the journal tests, layer by layer (tests/unit/core/) and verb by verb
(tests/unit/test_journal_faults.py)."""
from __future__ import annotations

import sqlite3

FULL = "database or disk is full"     # SQLite's own words for SQLITE_FULL


class FailingConnection:
    """The registry's SQLite connection, failing its `fail_at`-th writing statement (not
    SAVEPOINT, ROLLBACK, RELEASE, PRAGMA or SELECT) with SQLite's full-disk error; a failing
    COMMIT rolls back first, as SQLite does. Used layer by layer (tests/unit/core/) and verb by
    verb (tests/unit/test_journal_faults.py)."""

    NEVER_FAILS = ("SAVEPOINT", "ROLLBACK", "RELEASE", "PRAGMA", "SELECT")

    def __init__(self, db: sqlite3.Connection, fail_at: int | None):
        self._db, self.fail_at, self.count = db, fail_at, 0
        self.statements: list[str] = []
        self.failed: str | None = None       # the statement made to fail

    def _tick(self, sql: str) -> None:
        words = sql.lstrip().upper()
        if words.startswith(self.NEVER_FAILS):
            return
        self.count += 1
        self.statements.append(" ".join(sql.split())[:60])
        if self.count == self.fail_at:
            self.failed = self.statements[-1]
            if words.startswith("COMMIT"):
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
