"""The `damage` table: the blocks of an allocation that ECC found beyond repair
(docs/ecc.md)."""
from __future__ import annotations

from .schema import Part


class Damage(Part):
    def load(self) -> dict[int, set[int]]:
        """Each damaged node's id: its damaged blocks."""
        out: dict[int, set[int]] = {}
        for row in self._db.execute("SELECT node, block FROM damage"):
            out.setdefault(row[0], set()).add(row[1])
        return out

    def replace(self, node_id: int, blocks: set[int], now_ns: int) -> None:
        """Replace the node's damaged blocks with `blocks`."""
        self._db.execute("DELETE FROM damage WHERE node = ?", (node_id,))
        self._db.executemany("INSERT INTO damage VALUES (?, ?, ?)",
                             [(node_id, b, now_ns) for b in sorted(blocks)])
