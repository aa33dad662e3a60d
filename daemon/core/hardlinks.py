"""Hard links: a node's further names (issue 15), a part of the namespace layer (Namespace
inherits it: one layer, in two files).

A node's first name is its registry row's (parent, name); each further one is a row of the
`links` table and an entry of `node.aliases` (daemon/nodes.Aliases), in the order they were
made. Every step here is O(1) in the node's number of names, rollbacks included (issue 24:
a link to a file with 20,000 names took 35 ms when each step copied the list of names).
Every change registers its undo with the journal, as the rest of the namespace does.
"""
from __future__ import annotations

import time
from collections.abc import Callable

from gpumemctl.protocol import (
    Exists,
    InternalError,
    NotFound,
    PermissionDenied,
    UsageError,
    check_component,
)

from ..registry import Registry
from .journal import Journal
from .nodes import Allocation, Directory, Node, NodeTable, entry_path
from .permissions import Credentials, R, W, X, administrative_uid, allowed, require

MAX_LINKS = 65000                 # st_nlink of one file at most (EMLINK), as ext4's


class HardLinks:
    # Set by Namespace.__init__, and the Namespace methods used here.
    registry: Registry
    journal: Journal
    nodes: NodeTable
    check_not_reserved: Callable[[Directory, str], None]
    _require_room_for_a_name: Callable[[int], None]
    _keep_entries: Callable[..., None]
    _remove_entry: Callable[[Directory, str, int], None]
    forget: Callable[[Node], None]
    entry_changed: Callable[[Directory, str], None]
    attrs_changed: Callable[[Node], None]

    def _load_hard_links(self) -> None:
        for row in self.registry.links.load():
            linked, parent = self.nodes.get(row["node"]), self.nodes.get(row["parent"])
            if linked is None or not isinstance(parent, Directory) or \
                    isinstance(linked, Directory) or row["name"] in parent.children:
                raise InternalError(f"registry's hard link '{row['name']}' in node "
                                    f"{row['parent']} to node {row['node']} is not valid")
            linked.aliases.add((parent, row["name"]))
            parent.add_child(linked, row["name"])
            self.nodes.names_changed(linked, 1)

    # ---- the in-memory steps, each with its undo -------------------------------------------
    def _alias_added(self, node: Node, entry: tuple[Directory, str]) -> None:
        aliases = node.aliases
        aliases.add(entry)
        self.journal.on_rollback(lambda: aliases.discard(entry))

    def _alias_removed(self, node: Node, entry: tuple[Directory, str]) -> None:
        aliases = node.aliases
        place = aliases.remove(entry)
        self.journal.on_rollback(lambda: aliases.restore(entry, place))

    def _count_names(self, node: Node, delta: int) -> None:
        """Hard links made (+) or gone (-): the owner's names (max_names_per_uid)."""
        self.nodes.names_changed(node, delta)
        self.journal.on_rollback(lambda: self.nodes.names_changed(node, -delta))

    # ---- link(2), unlink(2) of one name, rename of one name -------------------------------
    def add_name(self, node: Node, parent: Directory, name: str, cred: Credentials) -> None:
        """link(2): `name` in `parent` becomes one more name of `node` (inside the caller's
        change). The node keeps its id, memory, durability and ECC: they are the
        allocation's, not a name's."""
        check_component(name)
        if isinstance(node, Directory):
            raise PermissionDenied(f"'{node.path or '/'}' is a directory: a directory "
                                   "cannot have a second name (hard link)",
                                   details={"errno": "EPERM"})
        if self.nodes.get(node.id) is not node:
            raise NotFound(f"'{node.path}' was removed", details={"errno": "ENOENT"})
        self.check_not_reserved(parent, name)
        require(parent, cred, W | X, "create entries in")
        if name in parent.children:
            raise Exists(f"'{entry_path(parent, name)}' already exists")
        self._require_may_link(node, cred)
        if node.nlink >= MAX_LINKS:
            raise UsageError(f"'{node.path}' has {node.nlink} names, the most one file may "
                             f"have ({MAX_LINKS})", details={"errno": "EMLINK"})
        self._require_room_for_a_name(node.uid)
        now = time.time_ns()
        self.registry.links.insert(parent.id, name, node.id)
        self.registry.nodes.update(node.id, changed_ns=now)
        self.journal.keep(node, "changed_ns")
        self._alias_added(node, (parent, name))
        node.changed_ns = now
        self._count_names(node, 1)
        self._keep_entries((parent, name))
        self.journal.keep(parent, "modified_ns", "changed_ns")
        parent.add_child(node, name)
        parent.modified_ns = parent.changed_ns = now
        self.registry.nodes.update(parent.id, modified_ns=now, changed_ns=now)
        self.journal.node_changed(parent)
        self.entry_changed(parent, name)       # a cached negative entry, if any
        self.attrs_changed(node)               # st_nlink and st_ctime

    @staticmethod
    def _require_may_link(node: Node, cred: Credentials) -> None:
        """Linux's protected_hardlinks (on by default in Debian): only the owner, root, or
        a user who may read and write the file may give it a new name, so no user can pin
        another's file in a directory of their own."""
        if cred.is_root or cred.uid == node.uid or administrative_uid(cred.uid):
            return
        # Linux's "safe source": a regular file, not set-id, that the caller may read and
        # write. Links, FIFOs and device nodes: the owner only.
        if not (isinstance(node, Allocation) and not node.mode & 0o6000 and
                allowed(node, cred, R | W)):
            raise PermissionDenied(f"permission denied: only the owner of '{node.path}' "
                                   f"(uid {node.uid}), or a user who may read and write it, "
                                   "may link it", details={"errno": "EPERM"})

    def drop_name(self, parent: Directory, name: str, node: Node) -> bool:
        """unlink(2) of one of the node's names (inside the caller's change). True when it
        was the last: the node is forgotten (its memory is the caller's); False when other
        names keep it."""
        if not node.aliases:
            self.forget(node)
            return True
        now = time.time_ns()
        self.journal.keep(node, "parent", "name", "changed_ns")
        if node.parent is parent and node.name == name:
            # Its row's name goes: the next name moves into the row.
            parent_next, name_next = node.aliases.first()
            self._alias_removed(node, (parent_next, name_next))
            self.registry.links.delete(parent_next.id, name_next)
            self.registry.nodes.update(node.id, parent=parent_next.id, name=name_next,
                                      changed_ns=now)
            node.parent, node.name = parent_next, name_next
        else:
            self.registry.links.delete(parent.id, name)
            self.registry.nodes.update(node.id, changed_ns=now)
            self._alias_removed(node, (parent, name))
        node.changed_ns = now
        self._count_names(node, -1)
        self._remove_entry(parent, name, now)
        self.attrs_changed(node)
        return False

    def _move_name(self, node: Node, old: tuple[Directory, str],
                   new: tuple[Directory, str]) -> None:
        """One name of `node` goes from `old` to `new`: its row (or its `links` row, which
        goes last, as the registry's new row does) and the node's fields; the directories'
        children are the caller's. The caller has kept the node's parent and name."""
        (old_dir, old_name), (new_dir, new_name) = old, new
        if node.parent is old_dir and node.name == old_name:
            self.registry.nodes.update(node.id, parent=new_dir.id, name=new_name)
            node.parent, node.name = new_dir, new_name
            return
        self.registry.links.delete(old_dir.id, old_name)
        self.registry.links.insert(new_dir.id, new_name, node.id)
        self._alias_removed(node, old)
        self._alias_added(node, new)
