"""The `nodes` table (every node of the tree, one row each, its first name in the row) and
the `links` table (a node's further names: hard links)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .names import loaded_name, stored_name
from .schema import Part, inserted_id


class Nodes(Part):
    def load(self, columns: Sequence[str] | None = None) -> list[Any]:
        """Every row, by id, its name as the daemon spells it (loaded_name): a dict of
        every column; with `columns` (names of this table's, never a caller's text), a
        tuple of those, in that order: a start loads a million rows (Namespace.load), and
        a dict each costs more than the query."""
        cur = self._db.execute(f"SELECT {', '.join(columns) if columns else '*'} "
                               "FROM nodes ORDER BY id")
        cur.row_factory = None          # plain tuples: a million rows load in a second less
        names = [c[0] for c in cur.description]
        rows = cur.fetchall()
        if "name" in names:             # a BLOB where the name is not UTF-8: rare
            at = names.index("name")
            rows = [row if type(row[at]) is not bytes else
                    (*row[:at], loaded_name(row[at]), *row[at + 1:]) for row in rows]
        if columns:
            return rows
        return [dict(zip(names, row, strict=True)) for row in rows]

    def insert(self, **fields) -> int:
        if "name" in fields:
            fields["name"] = stored_name(fields["name"])
        cols = ", ".join(fields)
        marks = ", ".join("?" for _ in fields)
        cur = self._db.execute(f"INSERT INTO nodes ({cols}) VALUES ({marks})",
                               tuple(fields.values()))
        return inserted_id(cur)

    def update(self, node_id: int, **fields) -> None:
        if "name" in fields:
            fields["name"] = stored_name(fields["name"])
        sets = ", ".join(f"{k} = ?" for k in fields)
        self._db.execute(f"UPDATE nodes SET {sets} WHERE id = ?", (*fields.values(), node_id))

    def delete(self, node_id: int) -> None:
        """The node's row, with its holders, further names and parity span (its metadata
        and damage go by ON DELETE CASCADE; a span row has no foreign key: it may precede
        its node's row)."""
        self._db.execute("DELETE FROM holders WHERE node = ?", (node_id,))
        self._db.execute("DELETE FROM links WHERE node = ?", (node_id,))
        self._db.execute("DELETE FROM parity_spans WHERE node = ?", (node_id,))
        self._db.execute("DELETE FROM nodes WHERE id = ?", (node_id,))


class Links(Part):
    """Hard links: a node's names beyond the one in its row."""

    def load(self) -> list[dict]:
        rows = self._db.execute("SELECT parent, name, node FROM links ORDER BY rowid")
        return [{**row, "name": loaded_name(row["name"])} for row in map(dict, rows)]

    def insert(self, parent_id: int, name: str, node_id: int) -> None:
        self._db.execute("INSERT INTO links (parent, name, node) VALUES (?, ?, ?)",
                         (parent_id, stored_name(name), node_id))

    def delete(self, parent_id: int, name: str) -> None:
        self._db.execute("DELETE FROM links WHERE parent = ? AND name = ?",
                         (parent_id, stored_name(name)))
