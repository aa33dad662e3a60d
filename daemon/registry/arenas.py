"""The `parity_arenas` and `parity_spans` tables (issue 26): each parity arena's device and
bytes, and where each durable allocation's parity span is; a slab's span is in its own row
(the slabs' `parity_arena` and `parity_offset` columns)."""
from __future__ import annotations

import time

from .schema import Part, inserted_id

Span = tuple[int, int, int]      # (arena id, offset, bytes)


class ParityArenas(Part):
    """`rows`: the span rows as last written, read once (a rollback may leave it off from
    the table: then a write is repeated or skipped where it need not be, and check says so)."""
    rows: dict[int, Span] | None = None

    def insert(self, device: str, capacity: int) -> int:
        cur = self._db.execute(
            "INSERT INTO parity_arenas (device, capacity, created_ns) VALUES (?, ?, ?)",
            (device, capacity, time.time_ns()))
        return inserted_id(cur)

    def delete(self, arena_id: int) -> None:
        self._db.execute("DELETE FROM parity_arenas WHERE id = ?", (arena_id,))

    def load(self) -> list[dict]:
        return [dict(r) for r in self._db.execute("SELECT * FROM parity_arenas ORDER BY id")]

    def ids(self) -> set[int]:
        return {r[0] for r in self._db.execute("SELECT id FROM parity_arenas")}

    def last_id(self) -> int:
        """The largest arena id ever committed (AUTOINCREMENT's high-water mark)."""
        found = self._db.execute(
            "SELECT seq FROM sqlite_sequence WHERE name = 'parity_arenas'").fetchone()
        return found[0] if found else 0

    # ---- spans --------------------------------------------------------------------------
    def spans(self) -> dict[int, Span]:
        """node id -> (arena id, offset, bytes) of every span row."""
        rows = self._db.execute("SELECT node, arena, offset, bytes FROM parity_spans")
        return {r[0]: (r[1], r[2], r[3]) for r in rows}

    def span_row(self, node_id: int) -> Span | None:
        if self.rows is None:
            self.rows = self.spans()
        return self.rows.get(node_id)

    def put_span(self, node_id: int, span: Span) -> None:
        self.span_row(node_id)
        self._db.execute("INSERT OR REPLACE INTO parity_spans (node, arena, offset, bytes) "
                         "VALUES (?, ?, ?, ?)", (node_id, *span))
        assert self.rows is not None
        self.rows[node_id] = span

    def drop_span(self, node_id: int) -> None:
        self._db.execute("DELETE FROM parity_spans WHERE node = ?", (node_id,))
        if self.rows is not None:
            self.rows.pop(node_id, None)

    def slab_parity(self, slab_id: int, arena_id: int | None, offset: int | None) -> None:
        self._db.execute("UPDATE slabs SET parity_arena = ?, parity_offset = ? WHERE id = ?",
                         (arena_id, offset, slab_id))
