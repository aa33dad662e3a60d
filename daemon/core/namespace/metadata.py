"""User metadata on the nodes (issue 17): each node's keys and values, in memory and in the
registry's `metadata` rows, and each uid's running total of them (nodes.NodeTable), kept in
step inside the caller's change. What a key and a value may be, and the bounds on them, are
daemon/core/usermeta.py's, checked by the verbs before they call here.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..nodes import Node

if TYPE_CHECKING:
    from .tree import Namespace


class Metadata:
    def __init__(self, ns: Namespace):
        self.ns = ns

    def load(self) -> None:
        """Each node's user metadata, and each uid's total of it (NodeTable). A row of a
        node the tree lacks cannot be (ON DELETE CASCADE); `check` would name one."""
        nodes = self.ns.nodes
        for node_id, key, value in self.ns.registry.metadata.load():
            node = nodes.get(node_id)
            if node is None:
                continue
            node.metadata[key] = value
            node.metadata_bytes += len(key) + len(value)
            nodes.metadata_changed(node, len(key) + len(value))

    def set(self, node: Node, key: bytes, value: bytes | None) -> None:
        """One key of the node's metadata set to `value`, or removed (None): in memory, in
        its row and in the owner's total, inside the caller's change (undone with it). The
        node's change time moves, as setxattr(2)'s does."""
        old = node.metadata.get(key)
        if value is None:
            if old is None:
                return
            self.ns.registry.metadata.delete(node.id, key)
            del node.metadata[key]
        else:
            self.ns.registry.metadata.set(node.id, key, value)
            node.metadata[key] = value

        def undo() -> None:
            if old is None:
                node.metadata.pop(key, None)
            else:
                node.metadata[key] = old
        self.ns.journal.on_rollback(undo)
        size = len(key) + len(value) if value is not None else 0
        self._grew(node, size - (len(key) + len(old) if old is not None else 0))

    def replace(self, node: Node, entries: dict[bytes, bytes]) -> None:
        """All of the node's metadata becomes `entries` (inside the caller's change): what
        a create or a restore from a snapshot brings."""
        if not entries and not node.metadata:
            return
        registry = self.ns.registry
        self.ns.journal.keep(node, "metadata")
        registry.metadata.delete(node.id)
        for key in sorted(entries):
            registry.metadata.set(node.id, key, entries[key])
        old, node.metadata = node.metadata_bytes, dict(entries)
        self._grew(node, sum(len(k) + len(v) for k, v in entries.items()) - old)

    def used(self, uid: int) -> int:
        """The bytes of metadata the nodes `uid` owns hold (metadata_user_max_bytes)."""
        return self.ns.nodes.metadata.get(uid, 0)

    def _grew(self, node: Node, delta: int) -> None:
        """The node's metadata took `delta` more bytes: its count, its owner's total while
        it is in the tree, and its change time."""
        ns = self.ns
        now = time.time_ns()
        ns.journal.keep(node, "metadata_bytes", "changed_ns")
        node.metadata_bytes += delta
        node.changed_ns = now
        ns.registry.nodes.update(node.id, changed_ns=now)
        if delta and ns.nodes.get(node.id) is node:
            ns.nodes.metadata_changed(node, delta)
            ns.journal.on_rollback(lambda: ns.nodes.metadata_changed(node, -delta))
        ns.watchers.attrs_changed(node)                # st_ctime
