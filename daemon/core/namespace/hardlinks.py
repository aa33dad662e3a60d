"""Hard links: a node's further names (issue 15), and the steps that add, drop, move or swap
one name of a node, whatever its number of names.

A node's first name is its registry row's (parent, name); each further one is a row of the
`links` table and an entry of `node.aliases` (daemon/core/nodes.Aliases), in the order they
were made. Every step here is O(1) in the node's number of names, rollbacks included (issue
24: a link to a file with 20,000 names took 35 ms when each step copied the list of names).
Every change registers its undo with the journal, as the rest of the namespace does.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from gpumemctl.protocol import (
    Exists,
    InternalError,
    NotFound,
    PermissionDenied,
    UsageError,
    check_component,
)

from ..nodes import Allocation, Directory, Node, entry_path
from ..permissions import Credentials, R, W, X, administrative_uid, allowed, require

if TYPE_CHECKING:
    from .entries import Entry
    from .tree import Namespace

MAX_LINKS = 65000                 # st_nlink of one file at most (EMLINK), as ext4's


class HardLinks:
    def __init__(self, ns: Namespace):
        self.ns = ns

    def load(self) -> None:
        """The registry's `links` rows into the loaded tree (after every node is in it)."""
        nodes = self.ns.nodes
        for row in self.ns.registry.links.load():
            linked, parent = nodes.get(row["node"]), nodes.get(row["parent"])
            if linked is None or not isinstance(parent, Directory) or \
                    isinstance(linked, Directory) or row["name"] in parent.children:
                raise InternalError(f"registry's hard link '{row['name']}' in node "
                                    f"{row['parent']} to node {row['node']} is not valid")
            linked.aliases.add((parent, row["name"]))
            parent.add_child(linked, row["name"])
            nodes.names_changed(linked, 1)

    # ---- link(2), unlink(2) of one name ------------------------------------------------------
    def add_name(self, node: Node, parent: Directory, name: str, cred: Credentials) -> None:
        """link(2): `name` in `parent` becomes one more name of `node` (inside the caller's
        change). The node keeps its id, memory, durability and ECC: they are the
        allocation's, not a name's."""
        self._check_new_name(node, parent, name, cred)
        ns = self.ns
        now = time.time_ns()
        ns.registry.links.insert(parent.id, name, node.id)
        ns.registry.nodes.update(node.id, changed_ns=now)
        ns.journal.keep(node, "changed_ns")
        self._alias_added(node, (parent, name))
        node.changed_ns = now
        ns.entries.count_names(node, 1)
        ns.entries.keep((parent, name))
        parent.add_child(node, name)
        ns.entries.touch(parent, now)
        ns.watchers.entry_changed(parent, name)     # a cached negative entry, if any
        ns.watchers.attrs_changed(node)             # st_nlink and st_ctime

    def _check_new_name(self, node: Node, parent: Directory, name: str,
                        cred: Credentials) -> None:
        """What link(2) checks before anything changes: the name, the kind of node, that
        it is still in the tree, permission, a free entry, and the limits."""
        check_component(name)
        if isinstance(node, Directory):
            raise PermissionDenied(f"'{node.path or '/'}' is a directory: a directory "
                                   "cannot have a second name (hard link)",
                                   details={"errno": "EPERM"})
        if self.ns.nodes.get(node.id) is not node:
            raise NotFound(f"'{node.path}' was removed", details={"errno": "ENOENT"})
        self.ns.check_not_reserved(parent, name)
        require(parent, cred, W | X, "create entries in")
        if name in parent.children:
            raise Exists(f"'{entry_path(parent, name)}' already exists")
        _require_may_link(node, cred)
        if node.nlink >= MAX_LINKS:
            raise UsageError(f"'{node.path}' has {node.nlink} names, the most one file may "
                             f"have ({MAX_LINKS})", details={"errno": "EMLINK"})
        self.ns.require_room_for_a_name(node.uid)

    def drop_name(self, parent: Directory, name: str, node: Node) -> bool:
        """unlink(2) of one of the node's names (inside the caller's change). True when it
        was the last: the node is forgotten (its memory is the caller's); False when other
        names keep it."""
        if not node.aliases:
            self.ns.forget(node)
            return True
        ns = self.ns
        now = time.time_ns()
        ns.journal.keep(node, "parent", "name", "changed_ns")
        if node.parent is parent and node.name == name:
            # Its row's name goes: the next name moves into the row.
            parent_next, name_next = node.aliases.first()
            self._alias_removed(node, (parent_next, name_next))
            ns.registry.links.delete(parent_next.id, name_next)
            ns.registry.nodes.update(node.id, parent=parent_next.id, name=name_next,
                                     changed_ns=now)
            node.parent, node.name = parent_next, name_next
        else:
            ns.registry.links.delete(parent.id, name)
            ns.registry.nodes.update(node.id, changed_ns=now)
            self._alias_removed(node, (parent, name))
        node.changed_ns = now
        ns.entries.count_names(node, -1)
        ns.entries.remove(parent, name, now)
        ns.watchers.attrs_changed(node)
        return False

    # ---- rename of one name, and two names swapped --------------------------------------------
    def move_name(self, node: Node, old: Entry, new: Entry) -> None:
        """One name of `node` goes from `old` to `new`: its row (or its `links` row, which
        goes last, as the registry's new row does) and the node's fields; the directories'
        children are the caller's. The caller has kept the node's parent and name."""
        (old_dir, old_name), (new_dir, new_name) = old, new
        if node.parent is old_dir and node.name == old_name:
            self.ns.registry.nodes.update(node.id, parent=new_dir.id, name=new_name)
            node.parent, node.name = new_dir, new_name
            return
        self.ns.registry.links.delete(old_dir.id, old_name)
        self.ns.registry.links.insert(new_dir.id, new_name, node.id)
        self._alias_removed(node, old)
        self._alias_added(node, new)

    def exchange_names(self, a: Node, at_a: Entry, b: Node, at_b: Entry) -> None:
        """`a`'s name `at_a` and `b`'s name `at_b` trade places (renameat2's exchange): the
        rows and the nodes' fields; the directories' children are the caller's, who has
        kept both nodes' parent and name. UNIQUE (parent, name): `a` steps out of the tree
        (a NULL parent, or its hard link's row out of `links`) while `b` takes its name,
        then takes `b`'s."""
        registry = self.ns.registry
        (src_dir, src_name), (dst_dir, dst_name) = at_a, at_b
        a_first = a.parent is src_dir and a.name == src_name
        if a_first:
            registry.nodes.update(a.id, parent=None)
        else:
            registry.links.delete(src_dir.id, src_name)
            self._alias_removed(a, at_a)
        self.move_name(b, at_b, at_a)
        if a_first:
            registry.nodes.update(a.id, parent=dst_dir.id, name=dst_name)
            a.parent, a.name = dst_dir, dst_name
        else:
            registry.links.insert(dst_dir.id, dst_name, a.id)
            self._alias_added(a, at_b)

    # ---- the aliases, each step with its undo -------------------------------------------------
    def _alias_added(self, node: Node, entry: Entry) -> None:
        aliases = node.aliases
        aliases.add(entry)
        self.ns.journal.on_rollback(lambda: aliases.discard(entry))

    def _alias_removed(self, node: Node, entry: Entry) -> None:
        aliases = node.aliases
        place = aliases.remove(entry)
        self.ns.journal.on_rollback(lambda: aliases.restore(entry, place))


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
