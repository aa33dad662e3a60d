"""Registries of older schema versions, as gpumemd made them: the schema of each version N
(schemas/vN.sql, frozen from that version's code) with rows a daemon of that version could
have written, and the schema of a registry in a form that can be compared."""
from __future__ import annotations

import os
import sqlite3

import pytest

from daemon.registry import ROOT_ID

HERE = os.path.dirname(os.path.abspath(__file__))

needs_drop_column = pytest.mark.skipif(
    sqlite3.sqlite_version_info < (3, 35, 0),
    reason=f"SQLite {sqlite3.sqlite_version} cannot drop columns: schema 5 keeps two unused")

LATIN = b"caf\xe9"          # a name that is not UTF-8: a BLOB from schema 7 on

# Rows of every column any version had; each version's registry gets the columns it has.
ROWS: dict[str, list[dict]] = {
    "meta": [dict(key="created_ns", value="1"), dict(key="instance", value="00112233")],
    "nodes": [
        dict(id=ROOT_ID, parent=None, name="", kind="dir", uid=0, gid=0, mode=0o1777,
             created_ns=1, modified_ns=2, changed_ns=3),
        dict(id=2, parent=ROOT_ID, name="weights", kind="alloc", uid=1000, gid=1000,
             mode=0o600, created_ns=10, modified_ns=20, changed_ns=30, size=5000,
             capacity=2097152, device="HOST-0", durable=1, state="ready", ecc="rs",
             parity_gen=0, unsealed=2, verified_ns=40, accessed_ns=25, snapshot="dir:/s",
             snapshot_ns=50),
        dict(id=3, parent=ROOT_ID, name="d", kind="dir", uid=1000, gid=1000, mode=0o755,
             created_ns=4, modified_ns=5, changed_ns=6),
    ],
    "holders": [dict(id=7, node=2, session=1, kind="lease", pid=77, uid=1000, since_ns=5)],
    "events": [dict(id=1, time_ns=40, kind="create", node=2, path="weights", uid=1000, pid=77,
                    detail='{"size": 5000}')],
    "damage": [dict(node=2, block=5, found_ns=99)],
    "links": [dict(parent=3, name="alias", node=2)],
}
# From schema 7 on, names and paths that are not UTF-8 are BLOBs.
BLOB_ROWS: dict[str, list[dict]] = {
    "nodes": [dict(id=4, parent=3, name=LATIN, kind="dir", uid=1000, gid=1000, mode=0o755,
                   created_ns=7, modified_ns=8, changed_ns=9)],
    "events": [dict(id=2, time_ns=41, kind="mkdir", node=4, path=b"d/" + LATIN, uid=1000,
                    pid=77, detail="{}")],
}
RESERVED_ID = 500           # node ids handed out past every row (keeper keys): kept


def old_schema(version: int) -> str:
    with open(os.path.join(HERE, "schemas", f"v{version}.sql")) as f:
        return f.read()


def old_versions() -> list[int]:
    return sorted(int(n[1:-4]) for n in os.listdir(os.path.join(HERE, "schemas"))
                  if n.startswith("v") and n.endswith(".sql"))


def columns(db: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in db.execute(f"PRAGMA table_info('{table}')")]


def rows_of(version: int) -> dict[str, list[dict]]:
    """The rows a registry of `version` holds (write_registry), by table."""
    out = {table: list(rows) for table, rows in ROWS.items()}
    if version >= 7:
        for table, rows in BLOB_ROWS.items():
            out[table] += rows
    return out


def write_registry(path: str, version: int) -> dict[str, list[dict]]:
    """A registry of schema `version` with rows in every table it has; returns them, each
    with only the columns that version had."""
    db = sqlite3.connect(path)
    try:
        db.executescript(old_schema(version))
        written: dict[str, list[dict]] = {}
        for table, rows in rows_of(version).items():
            have = columns(db, table)
            if not have:
                continue                    # no such table in this version
            written[table] = []
            for row in rows:
                kept = {k: v for k, v in row.items() if k in have}
                db.execute(f"INSERT INTO {table} ({', '.join(kept)}) VALUES"
                           f" ({', '.join('?' for _ in kept)})", tuple(kept.values()))
                written[table].append(kept)
        db.execute("UPDATE sqlite_sequence SET seq = ? WHERE name = 'nodes'", (RESERVED_ID,))
        db.execute(f"PRAGMA user_version={version}")
        db.commit()
    finally:
        db.close()
    return written


def table_rows(path: str) -> dict[str, list[dict]]:
    """Every row of every table, as stored (a BLOB name stays bytes)."""
    db = sqlite3.connect(path)
    db.row_factory = sqlite3.Row
    try:
        tables = [r[0] for r in db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")]
        return {t: [dict(r) for r in db.execute(f"SELECT * FROM {t}")] for t in tables}
    finally:
        db.close()


def assert_rows_kept(written: dict[str, list[dict]], path: str) -> None:
    """Each written row is still there with every value it had (bar the two columns schema 5
    dropped), in the same stored form (typeof: TEXT stays TEXT, a BLOB stays a BLOB)."""
    now = table_rows(path)
    for table, rows in written.items():
        assert len(now[table]) == len(rows), table
        for row in rows:
            want = {k: v for k, v in row.items() if k not in ("parity_gen", "checksum")}
            assert any(want.items() <= have.items() and
                       all(type(have[k]) is type(v) for k, v in want.items())
                       for have in now[table]), (table, row, now[table])


def sequence(path: str) -> int:
    db = sqlite3.connect(path)
    try:
        return db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'nodes'").fetchone()[0]
    finally:
        db.close()


def schema_of(path: str) -> dict:
    """The schema as SQLite reports it, in a form that does not depend on the order in which
    tables and indexes were made or on the text of their CREATE statements."""
    db = sqlite3.connect(path)
    try:
        tables = [r[0] for r in db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        out = {"user_version": db.execute("PRAGMA user_version").fetchone()[0]}
        for table in tables:
            out[table] = table_shape(db, table)
        return out
    finally:
        db.close()


def table_shape(db: sqlite3.Connection, table: str) -> dict:
    sql = db.execute("SELECT sql FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
    indexes = {}
    for _, name, unique, origin, partial in db.execute(f"PRAGMA index_list('{table}')"):
        cols = [r[2] for r in db.execute(f"PRAGMA index_info('{name}')")]
        indexes[name] = (unique, origin, partial, cols)
    return {
        # (name, type, NOT NULL, default, position in the primary key), in column order
        "columns": [tuple(r[1:]) for r in db.execute(f"PRAGMA table_info('{table}')")],
        "foreign_keys": sorted(tuple(r[2:]) for r in
                               db.execute(f"PRAGMA foreign_key_list('{table}')")),
        "indexes": indexes,
        "autoincrement": sql is not None and "AUTOINCREMENT" in sql.upper(),
    }
