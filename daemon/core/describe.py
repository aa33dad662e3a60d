"""How nodes are shown to clients: the JSON objects of `ls --json` and `info --json`, and
which of a hard-linked node's names a caller may see.

These dicts are the public API for scripts (docs/protocol.md lists their fields).
"""
from __future__ import annotations

import datetime
import functools
import itertools
import os
from collections.abc import Iterable, Iterator

from gpumemctl.protocol.replies import Allocation as AllocationInfo
from gpumemctl.protocol.replies import Node as NodeInfo
from gpumemctl.protocol.replies import NodeCommon, SpecialType
from gpumemctl.protocol.replies import Special as SpecialInfo

from ..ecc.layout import BLOCK
from .nodes import Allocation, Directory, Node, Special, Symlink
from .permissions import Credentials, X, allowed
from .usermeta import shown

# How each special file type is named in `type` (the registry's kind is shorter).
SPECIAL_TYPE_NAMES: dict[str, SpecialType] = {"fifo": "fifo", "chr": "char-device",
                                              "blk": "block-device", "sock": "socket"}


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


def visible_names(node: Node, cred: Credentials | None) -> Iterator[tuple[Directory, str]]:
    """The node's names, its first first, that `cred` may search to: search permission on
    each directory from the root down to the one holding the name, the rule of lookup, `ls`
    and `verify --all`, so that a name inside a directory closed to the caller never reaches
    it (issue 24). Root (and cred None: the daemon's own use) sees all. Each directory is
    judged once however many names it holds."""
    first = [(node.parent, node.name)] if node.parent is not None else []
    every = itertools.chain(first, node.aliases)
    if cred is None or cred.is_root:
        yield from every
        return
    judged: dict[int, bool] = {}
    for directory, name in every:
        if _searchable(directory, cred, judged):
            yield directory, name


def _searchable(directory: Directory, cred: Credentials, judged: dict[int, bool]) -> bool:
    """Whether `cred` may search `directory` and every directory above it; `judged` keeps
    the answer of each directory met (by id)."""
    unjudged: list[Directory] = []
    above: Directory | None = directory
    while above is not None and above.id not in judged:
        unjudged.append(above)
        above = above.parent
    ok = judged[above.id] if above is not None else True
    for d in reversed(unjudged):              # from the top down
        ok = ok and allowed(d, cred, X)
        judged[d.id] = ok
    return ok


def _paths(entries: Iterable[tuple[Directory, str]]) -> list[str]:
    """entry_path of each, each directory's path made once (a file's names are often many
    in one directory)."""
    dir_paths: dict[int, str] = {}
    out = []
    for directory, name in entries:
        under = dir_paths.get(directory.id)
        if under is None:
            under = dir_paths[directory.id] = directory.path
        out.append(f"{under}/{name}" if under else name)
    return out


def shown_path(node: Node, cred: Credentials | None) -> str:
    """The name to show `cred` for `node` where no entry was named: its first name `cred`
    may search to (a hard-linked file's first name may lie in a directory closed to it)."""
    if not node.aliases or cred is None or cred.is_root:
        return node.path
    entry = next(visible_names(node, cred), None)
    return node.path if entry is None else _paths([entry])[0]


def describe(node: Node, *, holders: bool = False, path: str | None = None,
             name: str | None = None, metadata: bool | None = None,
             names: bool | None = None, cred: Credentials | None = None) -> NodeInfo:
    """`path`, `name`: the entry the node was reached by, where it has several (hard
    links); otherwise its first name `cred` may search to (visible_names). `holders`
    (info): the holders, and every name `cred` may search to (`names` False: not them, as
    `ln` answers, which would cost as much as the file has names). `metadata` (info): True
    adds the user metadata, {key: value}; False adds null in its place (the caller may not
    read the node, so neither its metadata); None leaves it out (listings)."""
    if path is None and node.aliases and cred is not None and not cred.is_root:
        entry = next(visible_names(node, cred), None)
        if entry is not None:
            path, name = _paths([entry])[0], entry[1]
    common: NodeCommon = {
        "id": node.id, "path": node.path if path is None else path,
        "name": node.name if name is None else name, "uid": node.uid,
        "gid": node.gid, "mode": f"{node.mode:04o}", "created": iso(node.created_ns),
        "modified": iso(node.modified_ns), "changed": iso(node.changed_ns),
        "links": node.nlink,
    }
    if (holders if names is None else names) and not isinstance(node, Directory):
        common["names"] = _paths(visible_names(node, cred))
    if metadata is not None:
        common["metadata"] = shown(node.metadata) if metadata else None
    if isinstance(node, Directory):
        return {"type": "directory", **common, "entries": len(node.children),
                "durable": node.durable}
    if isinstance(node, Symlink):       # `mode` is always 0777, as Linux shows a link's
        return {"type": "symlink", **common, "target": node.target}
    if isinstance(node, Special):
        out: SpecialInfo = {"type": SPECIAL_TYPE_NAMES[node.kind], **common}
        if node.kind in ("chr", "blk"):
            out.update(rdev=node.rdev, major=os.major(node.rdev),  # type: ignore[call-arg]
                       minor=os.minor(node.rdev))
        return out
    if not isinstance(node, Allocation):    # a new kind of node must say how it is shown
        raise TypeError(f"describe() knows no {type(node).__name__}")
    info: AllocationInfo = {
        "type": "allocation", **common, "size": node.size, "capacity": node.capacity,
        "device": node.device, "durable": node.durable, "state": node.state,
        "ecc": node.ecc, "refcount": node.refcount, "leased": node.leased,
        "unsealed": node.unsealed,
        "damaged": damaged_ranges(node),
        "verified": iso(node.verified_ns) if node.verified_ns else None,
        "snapshot": node.snapshot,
        "snapshot_time": iso(node.snapshot_ns) if node.snapshot_ns else None,
    }
    if node.buffer is not None and (layout := node.buffer.layout) is not None:
        info["extents"] = layout        # memory of several extents (docs/storage.md)
    if holders:
        info["holders"] = [h.to_dict()  # type: ignore[misc]  # nodes.Holder.to_dict: a dict
                           for h in node.holders.values()]
    return info
