"""The tree's in-memory steps, each with its undo: a new node linked in under its first name,
a node taken out with all its names, one entry removed, a directory's times moved, the
entries a change is about to touch kept, the names a node's owner holds counted.

Every step runs inside the caller's change (daemon/core/journal.py) and registers how to
take itself back, so that a failed statement or commit leaves the tree as it was. The
other parts of the namespace change directory entries only through these.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..nodes import Aliases, Directory, Node

if TYPE_CHECKING:
    from .tree import Namespace

Entry = tuple[Directory, str]     # (directory, name): one entry, one name of a node


class Entries:
    def __init__(self, ns: Namespace):
        self.ns = ns

    def add(self, parent: Directory, node: Node, now: int) -> None:
        """A new node (its row inserted) enters the tree under its first name."""
        ns = self.ns
        ns.nodes[node.id] = node
        parent.add_child(node)

        def unlink() -> None:
            if parent.children.get(node.name) is node:
                parent.remove_child(node.name)
            ns.nodes.pop(node.id, None)
        ns.journal.on_rollback(unlink)
        self.touch(parent, now)

    def remove_node(self, node: Node) -> None:
        """Take the node and every name of it out of the tree (its rows are the caller's)."""
        ns = self.ns
        now = time.time_ns()
        if ns.nodes.get(node.id) is node:
            ns.journal.on_rollback(lambda: ns.nodes.__setitem__(node.id, node))
        for parent, name in node.names:
            if parent.children.get(name) is node:
                self.remove(parent, name, now)
        if node.aliases:
            self.count_names(node, -len(node.aliases))
            ns.journal.keep(node, "aliases")
            node.aliases = Aliases()
        ns.nodes.pop(node.id, None)

    def remove(self, parent: Directory, name: str, now: int) -> None:
        """`name` leaves `parent` (the tree, and the parent's times in its row)."""
        self.keep((parent, name))
        parent.remove_child(name)
        self.touch(parent, now)
        self.ns.watchers.entry_changed(parent, name)

    def keep(self, *entries: Entry) -> None:
        """Before changing these directory entries inside a change(): put back on rollback
        what each held (nothing, or a node), with the directories' subdirs counts."""
        saved = [(d, n, d.children.get(n)) for d, n in dict.fromkeys(
            (d, n) for d, n in entries)]

        def restore() -> None:
            for directory, name, _ in saved:
                if name in directory.children:
                    directory.remove_child(name)
            for directory, name, old in saved:
                if old is not None:
                    directory.add_child(old, name)
        self.ns.journal.on_rollback(restore)

    def touch(self, directory: Directory, now: int) -> None:
        """Its entries changed: the directory's modification and change times move, in
        memory and in its row, and a monitor showing it redraws."""
        journal = self.ns.journal
        journal.keep(directory, "modified_ns", "changed_ns")
        directory.modified_ns = directory.changed_ns = now
        self.ns.registry.nodes.update(directory.id, modified_ns=now, changed_ns=now)
        journal.node_changed(directory)

    def count_names(self, node: Node, delta: int) -> None:
        """Hard links made (+) or gone (-): the owner's names (max_names_per_uid)."""
        nodes = self.ns.nodes
        nodes.names_changed(node, delta)
        self.ns.journal.on_rollback(lambda: nodes.names_changed(node, -delta))
