"""The `holders` table: who holds an allocation now (emptied at every start)."""
from __future__ import annotations

import sqlite3

from .schema import Part


class Holders(Part):
    def add(self, holder_id: int, node_id: int, session: int, kind: str, pid: int,
            uid: int, since_ns: int) -> None:
        self._db.execute("INSERT INTO holders VALUES (?, ?, ?, ?, ?, ?, ?)",
                         (holder_id, node_id, session, kind, pid, uid, since_ns))

    def remove(self, holder_id: int) -> None:
        self._db.execute("DELETE FROM holders WHERE id = ?", (holder_id,))

    def clear(self) -> None:
        self._db.execute("DELETE FROM holders")

    def load(self) -> list[sqlite3.Row]:
        return self._db.execute("SELECT * FROM holders ORDER BY id").fetchall()
