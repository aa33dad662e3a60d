"""The `slabs` table (issue 26): each slab's owner, device, ECC, size class and bytes, and
where each small allocation's slot is (the nodes' `slab` and `slot` columns)."""
from __future__ import annotations

import time

from .schema import Part, inserted_id


class Slabs(Part):
    def insert(self, uid: int, device: str, ecc: str, slot: int, capacity: int) -> int:
        cur = self._db.execute(
            "INSERT INTO slabs (uid, device, ecc, slot, capacity, created_ns)"
            " VALUES (?, ?, ?, ?, ?, ?)", (uid, device, ecc, slot, capacity, time.time_ns()))
        return inserted_id(cur)

    def delete(self, slab_id: int) -> None:
        self._db.execute("DELETE FROM slabs WHERE id = ?", (slab_id,))

    def load(self) -> list[dict]:
        return [dict(r) for r in self._db.execute("SELECT * FROM slabs ORDER BY id")]

    def ids(self) -> set[int]:
        return {r[0] for r in self._db.execute("SELECT id FROM slabs")}

    def last_id(self) -> int:
        """The largest slab id ever committed (AUTOINCREMENT's high-water mark)."""
        found = self._db.execute(
            "SELECT seq FROM sqlite_sequence WHERE name = 'slabs'").fetchone()
        return found[0] if found else 0

    def placements(self) -> dict[int, tuple[int, int]]:
        """node id -> (slab id, slot offset) of every allocation kept in a slab."""
        rows = self._db.execute("SELECT id, slab, slot FROM nodes WHERE slab IS NOT NULL")
        return {r[0]: (r[1], r[2]) for r in rows}
