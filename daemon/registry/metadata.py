"""The `metadata` table: user metadata, small key-value pairs on a node (daemon/core/usermeta.py
has the rules and the bounds)."""
from __future__ import annotations

from .schema import Part


class UserMetadata(Part):
    def load(self) -> list[tuple[int, bytes, bytes]]:
        """(node id, key, value) of every row, by node and key."""
        rows = self._db.execute("SELECT node, key, value FROM metadata ORDER BY node, key")
        return [(node, bytes(key), bytes(value)) for node, key, value in rows]

    def set(self, node_id: int, key: bytes, value: bytes) -> None:
        self._db.execute("INSERT OR REPLACE INTO metadata (node, key, value) VALUES (?, ?, ?)",
                         (node_id, key, value))

    def delete(self, node_id: int, key: bytes | None = None) -> None:
        """One key of the node's metadata, or (None) all of it."""
        if key is None:
            self._db.execute("DELETE FROM metadata WHERE node = ?", (node_id,))
        else:
            self._db.execute("DELETE FROM metadata WHERE node = ? AND key = ?", (node_id, key))
