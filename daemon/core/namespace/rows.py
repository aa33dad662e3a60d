"""Registry rows as the namespace's nodes: the nodes loaded rows make, the `kind` column of
a new node, and the values of the `unsealed` column (integrity writes them, load reads them).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from gpumemctl.protocol import InternalError

from ...registry import loaded_name
from ..nodes import SPECIAL_KINDS, SPECIAL_TYPES, Allocation, Directory, Node, Special, Symlink

# The registry's `unsealed` column (registry.add_damage_table): read here to build nodes.
SEALED, UNSEALED, WRITING = 0, 1, 2

# The columns a node is made of (Nodes.load), in the order nodes_from_rows unpacks them.
COLUMNS = ("id", "parent", "name", "kind", "uid", "gid", "mode", "created_ns", "modified_ns",
           "changed_ns", "accessed_ns", "size", "capacity", "device", "durable", "unsealed",
           "state", "ecc", "verified_ns", "snapshot", "snapshot_ns", "target", "rdev",
           "asleep")
_PARENT, _KIND, _DURABLE = COLUMNS.index("parent"), COLUMNS.index("kind"), \
    COLUMNS.index("durable")


def kind_of_new(cls: type[Node], fields: dict) -> str:
    """The registry's `kind` of a new node of class `cls` (nodes.kind_of, before the node
    exists)."""
    if cls is Special:
        return SPECIAL_KINDS[fields["ftype"]]
    return {Directory: "dir", Symlink: "symlink", Allocation: "alloc"}[cls]


def nodes_from_rows(rows: Iterable[tuple]) -> Iterator[tuple[Node, int | None]]:
    """(the node, its parent's id) of each row of COLUMNS, outside the tree (load() links
    it in). Made straight from the row's tuple, with no dict of it: a start loads a million
    rows, and every step here is paid a million times."""
    for row in rows:
        if row[_KIND] == "alloc":
            yield _allocation(row), row[_PARENT]
            continue
        (node_id, parent, name, kind, uid, gid, mode, created, modified, changed, accessed,
         *_, target, rdev, _) = row
        common = dict(id=node_id, name=name, parent=None, uid=uid, gid=gid, mode=mode,
                      created_ns=created, modified_ns=modified, changed_ns=changed,
                      accessed_ns=accessed)
        yield _metadata_node(kind, common, target, rdev, row[_DURABLE]), parent


def _blank(cls: type) -> tuple[dict, tuple[tuple[str, Callable[[], Any]], ...]]:
    """Every field of dataclass `cls` with its default (None for one without, or made per
    instance), and the fields made per instance (their default_factory)."""
    blank: dict[str, Any] = {}
    made = []
    for field in dataclasses.fields(cls):
        blank[field.name] = None if field.default is dataclasses.MISSING else field.default
        if field.default_factory is not dataclasses.MISSING:
            made.append((field.name, field.default_factory))
    return blank, tuple(made)


_ALLOCATION_BLANK, _ALLOCATION_MADE = _blank(Allocation)


def _allocation(row: tuple) -> Allocation:
    """The Allocation of a row of COLUMNS, as Allocation(...) makes it: every field at its
    default but the row's, __post_init__ run. Not through the generated __init__: it sets
    40-odd attributes one by one, and past 30 CPython converts the instance's shared-key
    dict (a copy per node); nor through a dict of keywords. Here the instance gets one
    dict of every field, filled in place: a third less time for a million nodes
    (tests/unit/test_restart_at_scale.py checks that both agree)."""
    (node_id, _, name, _, uid, gid, mode, created, modified, changed, accessed, size,
     capacity, device, durable, unsealed, state, ecc, verified, snapshot, snapshot_ns,
     _, _, asleep) = row
    f = _ALLOCATION_BLANK.copy()
    f["id"], f["name"], f["uid"], f["gid"], f["mode"] = node_id, name, uid, gid, mode
    f["created_ns"], f["modified_ns"], f["changed_ns"] = created, modified, changed
    f["accessed_ns"], f["size"], f["capacity"] = accessed, size or 0, capacity
    f["device"], f["durable"], f["state"], f["ecc"] = device, bool(durable), state, ecc
    f["unsealed"], f["writing"] = unsealed == UNSEALED, unsealed == WRITING
    f["verified_ns"], f["snapshot"], f["snapshot_ns"] = verified, snapshot, snapshot_ns
    if asleep:                   # its bytes in host memory: the row's state is the one it
        f["state"], f["awake_state"] = "asleep", state     # wakes into (daemon/core/sleep.py)
    for field, factory in _ALLOCATION_MADE:
        f[field] = factory()
    alloc = object.__new__(Allocation)
    alloc.__dict__ = f
    alloc.__post_init__()
    return alloc


def _metadata_node(kind: str, common: dict, target, rdev, durable) -> Node:
    """A node of a row that is not an allocation's; `durable`: a directory's default."""
    if kind == "dir":
        return Directory(**common, durable=bool(durable))
    if kind == "symlink":
        return Symlink(**common, target=loaded_name(target))
    if kind in SPECIAL_TYPES:
        return Special(**common, ftype=SPECIAL_TYPES[kind], rdev=rdev or 0)
    raise InternalError(f"registry row {common['id']} has an unknown kind {kind!r}")
