"""Registry rows as the namespace's nodes: the node a loaded row makes, the `kind` column of
a new node, and the values of the `unsealed` column (integrity writes them, load reads them).
"""
from __future__ import annotations

from ...registry import loaded_name
from ..nodes import SPECIAL_KINDS, SPECIAL_TYPES, Allocation, Directory, Node, Special, Symlink

# The registry's `unsealed` column (registry.add_damage_table): read here to build nodes.
SEALED, UNSEALED, WRITING = 0, 1, 2


def kind_of_new(cls: type[Node], fields: dict) -> str:
    """The registry's `kind` of a new node of class `cls` (nodes.kind_of, before the node
    exists)."""
    if cls is Special:
        return SPECIAL_KINDS[fields["ftype"]]
    return {Directory: "dir", Symlink: "symlink", Allocation: "alloc"}[cls]


def node_from_row(row) -> Node:
    """The node a registry row describes, outside the tree (load() links it in)."""
    common = dict(id=row["id"], name=row["name"], parent=None, uid=row["uid"],
                  gid=row["gid"], mode=row["mode"], created_ns=row["created_ns"],
                  modified_ns=row["modified_ns"], changed_ns=row["changed_ns"],
                  accessed_ns=row["accessed_ns"])
    if row["kind"] == "dir":
        return Directory(**common)
    if row["kind"] == "symlink":
        return Symlink(**common, target=loaded_name(row["target"]))
    if row["kind"] in SPECIAL_TYPES:
        return Special(**common, ftype=SPECIAL_TYPES[row["kind"]], rdev=row["rdev"] or 0)
    return Allocation(**common, size=row["size"] or 0, capacity=row["capacity"],
                      device=row["device"], durable=bool(row["durable"]),
                      unsealed=row["unsealed"] == UNSEALED,
                      writing=row["unsealed"] == WRITING,
                      state=row["state"], ecc=row["ecc"], verified_ns=row["verified_ns"],
                      snapshot=row["snapshot"], snapshot_ns=row["snapshot_ns"])
