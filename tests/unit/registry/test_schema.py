"""A new registry on its own (no manager, no daemon): made at the current schema at once, with
its root and identity, on a connection configured as the durability rules need."""
from __future__ import annotations

import sqlite3

import pytest

from daemon.registry import ROOT_ID, SCHEMA_VERSION, WAL_LIMIT, Registry, RegistryUnusable
from daemon.registry.schema import create_tables

TABLES = {"meta", "nodes", "holders", "events", "links", "damage", "metadata", "slabs",
          "parity_arenas", "parity_spans"}
NODE = dict(parent=ROOT_ID, kind="alloc", uid=0, gid=0, mode=0o600, created_ns=0,
            modified_ns=0, changed_ns=0, state="ready")


@pytest.fixture
def reg(tmp_path):
    r = Registry(str(tmp_path / "r.sqlite"))
    yield r
    r.close()


def tables(db) -> set[str]:
    return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'"
                                     " AND name NOT LIKE 'sqlite_%'")}


def test_a_new_registry_has_every_table_the_root_and_an_identity(tmp_path):
    path = str(tmp_path / "r.sqlite")
    reg = Registry(path)
    try:
        assert reg.created and reg.version() == SCHEMA_VERSION
        assert tables(reg.db) == TABLES
        [root] = reg.nodes.load()
        assert (root["id"], root["parent"], root["name"], root["kind"], root["mode"]) == \
            (ROOT_ID, None, "", "dir", 0o1777)
        assert int(reg.identity.get("created_ns")) == root["created_ns"]
        instance = reg.identity.instance
        assert len(instance) == 16 and int(instance, 16) >= 0
    finally:
        reg.close()
    again = Registry(path)                      # an existing one is opened, not made
    try:
        assert not again.created and again.identity.instance == instance
        assert len(again.nodes.load()) == 1
    finally:
        again.close()


def test_create_tables_makes_the_schema_on_a_bare_connection(tmp_path, reg):
    """create_tables() alone is the schema (what a migration must reach): the registry adds
    rows, not tables."""
    db = sqlite3.connect(str(tmp_path / "bare.sqlite"))
    create_tables(db)
    assert tables(db) == TABLES
    for table in TABLES:
        assert db.execute(f"PRAGMA table_info('{table}')").fetchall() == \
            [tuple(r) for r in reg.db.execute(f"PRAGMA table_info('{table}')")]
    db.close()


def test_the_connection_is_configured_for_the_durability_rules(reg):
    pragma = lambda name: reg.db.execute(f"PRAGMA {name}").fetchone()[0]    # noqa: E731
    assert pragma("journal_mode") == "wal"
    assert pragma("synchronous") == 1                 # NORMAL: durable commits fsync the WAL
    assert pragma("wal_autocheckpoint") == 0          # checkpoints run off the request path
    assert pragma("journal_size_limit") == WAL_LIMIT
    assert pragma("foreign_keys") == 1
    assert pragma("busy_timeout") > 0


def test_a_removed_node_takes_its_rows_in_every_table_with_it(reg):
    with reg.transaction(durable=False):
        node = reg.nodes.insert(name="a", **NODE)
        reg.links.insert(ROOT_ID, "b", node)
        reg.metadata.set(node, b"k", b"v")
        reg.damaged.replace(node, {1, 2}, 5)
        reg.holders.add(1, node, 1, "lease", 2, 0, 3)
    with reg.transaction(durable=False):
        reg.nodes.delete(node)
    for table, column in (("links", "node"), ("metadata", "node"), ("damage", "node"),
                          ("holders", "node"), ("nodes", "id")):
        assert reg.db.execute(f"SELECT count(*) FROM {table} WHERE {column} = ?",
                              (node,)).fetchone()[0] == 0, table


def test_the_schema_checks_what_it_states(reg):
    """CHECK and NOT NULL constraints hold: a kind, state or ecc outside the lists, or a
    node without its owner, is refused."""
    for bad in (dict(kind="file"), dict(state="recovering"), dict(ecc="raid")):
        with pytest.raises(sqlite3.IntegrityError), reg.transaction(durable=False):
            reg.nodes.insert(name="x", **{**NODE, **bad})
    with pytest.raises(sqlite3.IntegrityError), reg.transaction(durable=False):
        reg.nodes.insert(name="x", **{k: v for k, v in NODE.items() if k != "uid"})
    assert len(reg.nodes.load()) == 1


def test_a_file_that_is_not_a_registry_is_unusable_and_corrupt(tmp_path):
    path = tmp_path / "r.sqlite"
    path.write_bytes(b"not a database, " * 512)
    with pytest.raises(RegistryUnusable, match="is unreadable") as refused:
        Registry(str(path))
    assert refused.value.corrupt is True
    assert path.read_bytes() == b"not a database, " * 512      # left for the operator
