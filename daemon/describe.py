"""How nodes are shown to clients: the JSON objects of `ls --json` and `info --json`.

These dicts are the public API for scripts (docs/protocol.md lists their fields).
"""
from __future__ import annotations

import datetime
import functools
import os

from .ecc.layout import BLOCK
from .nodes import Allocation, Directory, Node, Special, Symlink
from .usermeta import shown

# How each special file type is named in `type` (the registry's kind is shorter).
SPECIAL_TYPE_NAMES = {"fifo": "fifo", "chr": "char-device", "blk": "block-device",
                      "sock": "socket"}


@functools.lru_cache(maxsize=1 << 16)   # a listing formats the same times again and again
def iso(ns: int) -> str:
    dt = datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def damaged_ranges(alloc: Allocation) -> list[list[int]]:
    """Bytes ECC could not repair, as [start, end) ranges (neighbouring blocks merged)."""
    out: list[list[int]] = []
    for b in sorted(alloc.damaged):
        if out and out[-1][1] == b * BLOCK:
            out[-1][1] += BLOCK
        else:
            out.append([b * BLOCK, (b + 1) * BLOCK])
    return out


def describe(node: Node, *, holders: bool = False, path: str | None = None,
             name: str | None = None, metadata: bool | None = None) -> dict:
    """`path`, `name`: the entry the node was reached by, where it has several (hard
    links); its first name otherwise. `holders` (info): the holders, and every name.
    `metadata` (info): True adds the user metadata, {key: value}; False adds null in its
    place (the caller may not read the node, so neither its metadata); None leaves it out
    (listings)."""
    common = {
        "id": node.id, "path": node.path if path is None else path,
        "name": node.name if name is None else name, "uid": node.uid,
        "gid": node.gid, "mode": f"{node.mode:04o}", "created": iso(node.created_ns),
        "modified": iso(node.modified_ns), "changed": iso(node.changed_ns),
        "links": node.nlink,
    }
    if holders and not isinstance(node, Directory):
        common["names"] = node.paths
    if metadata is not None:
        common["metadata"] = shown(node.metadata) if metadata else None
    if isinstance(node, Directory):
        return {"type": "directory", **common, "entries": len(node.children)}
    if isinstance(node, Symlink):       # `mode` is always 0777, as Linux shows a link's
        return {"type": "symlink", **common, "target": node.target}
    if isinstance(node, Special):
        out = {"type": SPECIAL_TYPE_NAMES[node.kind], **common}
        if node.kind in ("chr", "blk"):
            out.update(rdev=node.rdev, major=os.major(node.rdev), minor=os.minor(node.rdev))
        return out
    if not isinstance(node, Allocation):    # a new kind of node must say how it is shown
        raise TypeError(f"describe() knows no {type(node).__name__}")
    info = {
        "type": "allocation", **common, "size": node.size, "capacity": node.capacity,
        "device": node.device, "durable": node.durable, "state": node.state,
        "ecc": node.ecc, "refcount": node.refcount, "leased": node.leased,
        "unsealed": node.unsealed,
        "damaged": damaged_ranges(node),
        "verified": iso(node.verified_ns) if node.verified_ns else None,
        "snapshot": node.snapshot,
        "snapshot_time": iso(node.snapshot_ns) if node.snapshot_ns else None,
    }
    if holders:
        info["holders"] = [h.to_dict() for h in node.holders.values()]
    return info
