"""How nodes are shown (daemon/core/describe.py) on their own: what a description holds for
each kind of node, and which of a hard-linked node's names a caller may see."""
from __future__ import annotations

import os
import stat

from daemon.core.containers import Origin
from daemon.core.describe import damaged_ranges, describe, iso, shown_path, visible_names
from daemon.core.nodes import Allocation, Directory, Holder, Special, Symlink
from daemon.core.sessions import Session
from daemon.ecc.layout import BLOCK
from tests.sizes import MiB

from .parts import ALICE, BOB, ROOT

_ids = iter(range(1, 1 << 30))


def new(cls, name, parent, mode=0o755, uid=0, **fields):
    node = cls(id=next(_ids), name=name, parent=parent, uid=uid, gid=uid, mode=mode,
               created_ns=10**18, modified_ns=10**18 + 1, changed_ns=10**18 + 2, **fields)
    if parent is not None:
        parent.add_child(node)
    return node


def test_an_allocation_described():
    root = new(Directory, "", None, 0o1777)
    a = new(Allocation, "a", root, 0o640, uid=1000, size=3, capacity=2 * MiB, device="D",
            durable=True, state="degraded", ecc="rs", damaged={0, 1, 5},
            snapshot="store/s1", snapshot_ns=10**18, verified_ns=None)
    a.metadata = {b"k": b"\xff"}
    session = Session(cred=ALICE)
    docker = {"runtime": "docker", "id": "f" * 64, "pod": None}
    a.holders[7] = Holder(id=7, kind="read", session=session, alloc=a, pid=42, uid=1000,
                          since_ns=5, origin=Origin(f"/docker/{'f' * 64}", docker))
    info = describe(a, holders=True, metadata=True)
    assert info["type"] == "allocation" and info["path"] == "a" and info["mode"] == "0640"
    assert (info["size"], info["capacity"], info["device"]) == (3, 2 * MiB, "D")
    assert (info["durable"], info["state"], info["ecc"], info["refcount"]) == \
        (True, "degraded", "rs", 2)
    assert info["damaged"] == [[0, 2 * BLOCK], [5 * BLOCK, 6 * BLOCK]]
    assert info["snapshot"] == "store/s1" and info["snapshot_time"] == iso(10**18)
    assert info["verified"] is None
    assert info["holders"] == [{"id": 7, "kind": "read", "pid": 42, "uid": 1000,
                                "session": session.id, "since_ns": 5,
                                "cgroup": f"/docker/{'f' * 64}", "container": docker,
                                "parked": False}]
    assert info["metadata"] == {"k": "\udcff"} and info["names"] == ["a"]
    assert info["created"] == "2001-09-09T01:46:40.000000Z"
    listed = describe(a)
    assert "metadata" not in listed and "holders" not in listed and "names" not in listed
    assert describe(a, metadata=False)["metadata"] is None     # may not read it


def test_other_kinds_described():
    root = new(Directory, "", None, 0o1777)
    d = new(Directory, "d", root)
    new(Directory, "e", d)
    s = new(Symlink, "s", d, target="../x")
    dev = new(Special, "dev", d, 0o600, ftype=stat.S_IFBLK, rdev=os.makedev(8, 1))
    fifo = new(Special, "p", d, 0o600, ftype=stat.S_IFIFO)
    info = describe(d)
    assert (info["type"], info["entries"], info["links"]) == ("directory", 4, 3)
    assert describe(s)["type"] == "symlink" and describe(s)["target"] == "../x"
    assert describe(dev)["type"] == "block-device"
    assert (describe(dev)["major"], describe(dev)["minor"]) == (8, 1)
    assert describe(fifo)["type"] == "fifo" and "rdev" not in describe(fifo)


def test_a_hard_linked_node_is_shown_under_a_name_the_caller_may_reach():
    root = new(Directory, "", None, 0o1777)
    private = new(Directory, "private", root, 0o700)
    public = new(Directory, "public", root, 0o755)
    a = new(Allocation, "a", private, 0o644)
    a.aliases.add((public, "b"))
    public.add_child(a, "b")
    assert [n for _, n in visible_names(a, BOB)] == ["b"]
    assert [n for _, n in visible_names(a, ROOT)] == ["a", "b"]
    assert [n for _, n in visible_names(a, None)] == ["a", "b"]
    assert shown_path(a, BOB) == "public/b" and shown_path(a, ROOT) == "private/a"
    info = describe(a, holders=True, cred=BOB)
    assert (info["path"], info["name"], info["names"]) == ("public/b", "b", ["public/b"])
    assert describe(a, path="x/y", name="y", cred=BOB)["path"] == "x/y"   # as reached
    assert "names" not in describe(a, holders=True, names=False, cred=BOB)
    a.aliases.remove((public, "b"))
    assert list(visible_names(a, BOB)) == []             # none it may search to
    assert shown_path(a, BOB) == "private/a"             # one name: shown as it is


def test_damaged_ranges_merge_neighbouring_blocks():
    a = Allocation(id=1, name="a", parent=None, uid=0, gid=0, mode=0, created_ns=1,
                   modified_ns=1, changed_ns=1, damaged={3, 2, 9})
    assert damaged_ranges(a) == [[2 * BLOCK, 4 * BLOCK], [9 * BLOCK, 10 * BLOCK]]
