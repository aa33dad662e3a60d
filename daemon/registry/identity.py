"""The `meta` table (the registry's creation time and random identity) and node ids, which
are keeper keys: AUTOINCREMENT's high-water mark in `sqlite_sequence`."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from .schema import Part

if TYPE_CHECKING:
    from .store import Registry


class Identity(Part):
    def __init__(self, registry: Registry):
        super().__init__(registry)
        self._instance: str | None = None       # meta 'instance', once read

    @property
    def instance(self) -> str:
        """This registry's random identity (meta 'instance', made with it). Keeper deposits
        carry it, so that a start can tell a keeper that served another registry."""
        if self._instance is None:
            value = self.get("instance")
            if value is None:             # only a registry edited by hand lacks it
                value = os.urandom(8).hex()
                with self._registry.transaction(durable=True):
                    self.set("instance", value)
            self._instance = value
        return self._instance

    def last_node_id(self) -> int:
        """The largest node id ever committed (AUTOINCREMENT's high-water mark)."""
        row = self._db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'nodes'")
        found = row.fetchone()
        return found[0] if found else 0

    def reserve_node_ids(self, up_to: int) -> None:
        """Make every future node id larger than `up_to`: ids are keeper keys, so an id
        must never alias memory the keeper holds under a key another registry issued."""
        if up_to > self.last_node_id():
            cur = self._db.execute("UPDATE sqlite_sequence SET seq = ? WHERE name = 'nodes'",
                                   (up_to,))
            if cur.rowcount == 0:
                self._db.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('nodes', ?)",
                                 (up_to,))

    def next_node_id(self) -> int:
        """The id AUTOINCREMENT would give the next row."""
        return max(self.last_node_id(), self._db.execute(
            "SELECT coalesce(max(id), 0) FROM nodes").fetchone()[0]) + 1

    def set(self, key: str, value: str) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def get(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None
