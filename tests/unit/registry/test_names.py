"""Names in the registry (daemon/registry/names.py): TEXT when their bytes are UTF-8, a BLOB of
the bytes when not, in every table that keeps one, and read back as the daemon spells them
(surrogateescape). More in tests/security/test_non_utf8_names.py."""
from __future__ import annotations

import sqlite3

import pytest

from daemon.registry import ROOT_ID, Registry, loaded_name, stored_name

LATIN = b"caf\xe9".decode(errors="surrogateescape")     # not UTF-8: "caf\udce9"
NODE = dict(kind="dir", uid=0, gid=0, mode=0o755, created_ns=0, modified_ns=0, changed_ns=0)


@pytest.fixture
def reg(tmp_path):
    r = Registry(str(tmp_path / "r.sqlite"))
    yield r
    r.close()


@pytest.mark.parametrize("name,stored", [
    ("plain", "plain"), ("\xe9t\xe9", "\xe9t\xe9"), ("", ""),
    (LATIN, b"caf\xe9"), ("\udcff", b"\xff"),
])
def test_one_stored_form_per_name_and_back(name, stored):
    assert stored_name(name) == stored and type(stored_name(name)) is type(stored)
    assert loaded_name(stored_name(name)) == name


def typeof(reg: Registry, sql: str, *args) -> list[tuple]:
    return [tuple(r) for r in reg.db.execute(sql, args)]


def test_node_names_are_text_or_blob_on_insert_and_on_rename(reg):
    with reg.transaction(durable=False):
        plain = reg.nodes.insert(parent=ROOT_ID, name="plain", **NODE)
        other = reg.nodes.insert(parent=ROOT_ID, name=LATIN, **NODE)
    assert typeof(reg, "SELECT name, typeof(name) FROM nodes WHERE id > 1 ORDER BY id") == \
        [("plain", "text"), (b"caf\xe9", "blob")]
    with reg.transaction(durable=False):               # renames swap the two forms
        reg.nodes.update(plain, name=LATIN + "2")
        reg.nodes.update(other, name="caf\xe9")
    assert typeof(reg, "SELECT name, typeof(name) FROM nodes WHERE id > 1 ORDER BY id") == \
        [(b"caf\xe92", "blob"), ("caf\xe9", "text")]
    assert [n["name"] for n in reg.nodes.load()] == ["", LATIN + "2", "caf\xe9"]


def test_a_name_is_unique_across_its_forms(reg):
    """The bytes of "é" escaped, or given as UTF-8: the same name, one stored form, so the
    second is refused, as is LATIN twice."""
    with reg.transaction(durable=False):
        reg.nodes.insert(parent=ROOT_ID, name="\xe9", **NODE)
        reg.nodes.insert(parent=ROOT_ID, name=LATIN, **NODE)
    for again in ("\udcc3\udca9", LATIN):
        with pytest.raises(sqlite3.IntegrityError), reg.transaction(durable=False):
            reg.nodes.insert(parent=ROOT_ID, name=again, **NODE)


def test_link_names_are_stored_as_node_names_and_found_again(reg):
    with reg.transaction(durable=False):
        node = reg.nodes.insert(parent=ROOT_ID, name="a", **dict(NODE, kind="alloc"))
        reg.links.insert(ROOT_ID, LATIN, node)
        reg.links.insert(ROOT_ID, "b", node)
    assert typeof(reg, "SELECT name, typeof(name) FROM links ORDER BY rowid") == \
        [(b"caf\xe9", "blob"), ("b", "text")]
    assert [(link["name"], link["node"]) for link in reg.links.load()] == \
        [(LATIN, node), ("b", node)]
    with reg.transaction(durable=False):
        reg.links.delete(ROOT_ID, LATIN)                # found by its stored form
    assert [link["name"] for link in reg.links.load()] == ["b"]


def test_event_paths_are_stored_as_names_and_filtered_as_bytes(reg):
    with reg.transaction(durable=False):
        reg.event_log.add("mkdir", None, LATIN, 0, 1, {"name": LATIN}, 0)
        reg.event_log.add("mkdir", None, LATIN + "/x", 0, 1, {}, 0)
        reg.event_log.add("mkdir", None, "caf\xe9/x", 0, 1, {}, 0)     # another name
    assert typeof(reg, "SELECT typeof(path) FROM events ORDER BY id") == \
        [("blob",), ("blob",), ("text",)]
    found = reg.event_log.query(path=LATIN)
    assert [(e["path"], e["detail"]) for e in found] == \
        [(LATIN, {"name": LATIN}), (LATIN + "/x", {})]
    assert [e["path"] for e in reg.event_log.query(path="caf\xe9")] == ["caf\xe9/x"]
    assert reg.event_log.size_bytes() == sum(
        r[0] for r in reg.db.execute("SELECT length(CAST(detail AS BLOB)) +"
                                     " length(CAST(path AS BLOB)) FROM events"))


def test_user_metadata_is_bytes_in_and_out(reg):
    with reg.transaction(durable=False):
        reg.metadata.set(ROOT_ID, b"k\xff", b"\x00v\xff")
        reg.metadata.set(ROOT_ID, b"a", b"")
    assert reg.metadata.load() == [(ROOT_ID, b"a", b""), (ROOT_ID, b"k\xff", b"\x00v\xff")]
    with reg.transaction(durable=False):
        reg.metadata.delete(ROOT_ID, b"k\xff")
    assert reg.metadata.load() == [(ROOT_ID, b"a", b"")]
    with reg.transaction(durable=False):
        reg.metadata.delete(ROOT_ID)
    assert reg.metadata.load() == []
