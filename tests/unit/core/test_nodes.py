"""The in-memory tree's objects (daemon/core/nodes.py) on their own: paths, link counts, the
order of a node's names, walks that need no recursion, and the per-uid counts of NodeTable."""
from __future__ import annotations

import stat

import pytest

from daemon.core.nodes import (
    Aliases,
    Allocation,
    Directory,
    Holder,
    NodeTable,
    Special,
    Symlink,
    kind_of,
    walk,
    walk_entries,
)
from daemon.core.sessions import Session

from .parts import ROOT

_ids = iter(range(1, 1 << 30))


def new(cls, name: str, parent: Directory | None, uid: int = 0, **fields):
    node = cls(id=next(_ids), name=name, parent=parent, uid=uid, gid=uid, mode=0o755,
               created_ns=1, modified_ns=2, changed_ns=3, **fields)
    if parent is not None:
        parent.add_child(node)
    return node


def link(node, parent: Directory, name: str) -> None:
    node.aliases.add((parent, name))
    parent.add_child(node, name)


@pytest.fixture
def root():
    return new(Directory, "", None)


def test_paths_and_types(root):
    d = new(Directory, "d", root)
    a = new(Allocation, "a", d)
    s = new(Symlink, "s", d, target="a")
    f = new(Special, "f", d, ftype=stat.S_IFCHR, rdev=7)
    assert (root.path, d.path, a.path) == ("", "d", "d/a")
    assert [kind_of(n) for n in (d, a, s, f)] == ["dir", "alloc", "symlink", "chr"]
    assert stat.S_ISDIR(d.st_mode) and stat.S_ISREG(a.st_mode) and stat.S_ISCHR(f.st_mode)
    assert s.st_mode == stat.S_IFLNK | 0o777
    assert a.accessed_ns == a.modified_ns      # made: the modification time


def test_link_counts(root):
    d = new(Directory, "d", root)
    new(Directory, "sub", d)
    new(Directory, "sub2", d)
    a = new(Allocation, "a", d)
    assert d.nlink == 4 and d.subdirs == 2
    d.remove_child("sub")
    assert d.nlink == 3
    assert a.nlink == 1
    link(a, root, "again")
    assert a.nlink == 2
    assert a.names == [(d, "a"), (root, "again")]
    a.unlinked = True
    assert a.nlink == 0


def test_aliases_keep_their_order_and_a_removal_taken_back_returns_to_its_place(root):
    names = Aliases()
    for n in "abcd":
        names.add((root, n))
    place = names.remove((root, "b"))
    assert [n for _, n in names] == ["a", "c", "d"]
    names.restore((root, "b"), place)
    assert [n for _, n in names] == ["a", "b", "c", "d"]
    assert names.first() == (root, "a") and (root, "c") in names and len(names) == 4
    names.discard((root, "zz"))                 # absent: nothing happens
    assert len(names) == 4


def test_an_allocation_is_kept_only_durable_with_memory_and_not_restoring(root):
    a = new(Allocation, "a", root, durable=True, state="ready")
    assert not a.kept                           # no memory
    a.buffer = object()
    assert a.kept and a.stored_state == "ready"
    a.state = "restoring"
    assert not a.kept and a.stored_state == "lost"


def test_refcount_is_holders_and_the_durable_pin(root):
    a = new(Allocation, "a", root, durable=True)
    session = Session(cred=ROOT)
    for i, kind in enumerate(("read", "read", "lease"), 1):
        a.holders[i] = Holder(id=i, kind=kind, session=session, alloc=a, pid=1, uid=0,
                              since_ns=0)
    assert a.refcount == 4
    assert [h.id for h in a.holders_of("read")] == [1, 2]
    assert a.holders[3].to_dict() == {"id": 3, "kind": "lease", "pid": 1, "uid": 0,
                                      "session": session.id, "since_ns": 0,
                                      "cgroup": None, "container": None, "parked": False}


def test_walks_go_deeper_than_the_recursion_limit(root):
    node = root
    for _ in range(5000):
        node = new(Directory, "d", node)
    assert sum(1 for _ in walk(root)) == 5001
    assert node.path.count("/") == 4999


def test_walks_are_pre_order_by_name_and_enter_only_what_they_may(root):
    b = new(Directory, "b", root)
    a = new(Directory, "a", root)
    x = new(Allocation, "x", b)
    new(Allocation, "y", a)
    link(x, a, "z")
    # walk gives the node at each of its entries (its first name's path each time) ...
    assert [n.path for n in walk(root)] == ["", "a", "a/y", "b/x", "b", "b/x"]
    # ... walk_entries each entry under its own path
    assert [p for p, _, _ in walk_entries(root)] == ["a", "a/y", "a/z", "b", "b/x"]
    closed = [p for p, _, _ in walk_entries(root, lambda d: d is not a)]
    assert closed == ["a", "b", "b/x"]


def test_the_node_table_counts_names_and_metadata_per_uid(root):
    table = NodeTable()
    a = new(Allocation, "a", root, uid=1000)
    a.metadata_bytes = 10
    table[a.id] = a
    table[root.id] = root
    assert table.owned == {1000: 1, 0: 1} and table.metadata == {1000: 10}
    table.names_changed(a, 2)                   # two hard links
    table.metadata_changed(a, 5)
    assert table.owned[1000] == 3 and table.metadata[1000] == 15
    a.aliases.add((root, "l1"))
    a.aliases.add((root, "l2"))
    a.metadata_bytes = 15
    table.reowned(a, 1000, 1001)                # chown: every name and byte goes along
    assert table.owned == {1001: 3, 0: 1} and table.metadata == {1001: 15}
    a.uid = 1001
    table.names_changed(a, -2)
    assert table.pop(a.id) is a
    assert table.owned == {0: 1} and table.metadata == {}
    assert table.get(a.id) is None and len(table) == 1
