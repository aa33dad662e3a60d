"""Renames: rename(2), which moves one name of a node (replacing what was there, as POSIX
says), and renameat2(RENAME_EXCHANGE), which swaps two. Ids (and so keeper keys) stay; the
parents and names change in one registry transaction, and the watchers hear of every entry
the kernel may have cached.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from gpumemctl.protocol import check_component

from ..nodes import Directory, Node, entry_path
from ..permissions import Credentials, W, X, require
from .rules import check_dir_move, check_replace, has_durable, require_removable

if TYPE_CHECKING:
    from .entries import Entry
    from .tree import Namespace


class Renames:
    def __init__(self, ns: Namespace):
        self.ns = ns

    def move(self, src_parent_id: int, src_name: str, dst_parent_id: int, dst_name: str,
             cred: Credentials, *, replace: bool = True) -> tuple[Node, Node | None]:
        """POSIX rename(2). The id (and so the keeper key) stays; parent and name change in
        one registry transaction. Returns the node and the entry it replaced, whose memory
        is the caller's (NameVerbs.rename)."""
        ns = self.ns
        check_component(src_name)
        check_component(dst_name)
        src_dir, dst_dir = ns.directory(src_parent_id), ns.directory(dst_parent_id)
        ns.check_not_reserved(dst_dir, dst_name)
        node = ns.lookup_child(src_parent_id, src_name, cred)
        require_removable(src_dir, node, cred, "rename entries in")
        require(dst_dir, cred, W | X, "rename entries in")
        target = dst_dir.children.get(dst_name)
        if target is node:
            return node, None
        if isinstance(node, Directory):
            check_dir_move(node, src_dir, dst_dir, cred)
        if target is not None:
            check_replace(node, target, dst_dir, cred, replace)
        src, dst = (src_dir, src_name), (dst_dir, dst_name)
        old_path, new_path = entry_path(*src), entry_path(*dst)
        freed = None
        with ns.journal.change(durable=has_durable(node) or has_durable(target)):
            if target is not None:
                freed = self._replaced(target, dst, old_path, cred)
            self._move_entry(node, src, dst, into_empty=target is None)
            ns.journal.event("rename", node, cred, **{"from": old_path, "to": new_path})
        return node, freed

    def _replaced(self, target: Node, at: Entry, by_path: str, cred: Credentials
                  ) -> Node | None:
        """The entry a rename lands on drops that name: the node itself when it was its
        last (returned: its memory is the caller's), else one name of it."""
        freed = target if self.ns.hardlinks.drop_name(*at, target) else None
        self.ns.journal.event("remove", target, cred, replaced_by=by_path,
                              **({} if freed else {"name": entry_path(*at),
                                                   "links_left": target.nlink}))
        return freed

    def _move_entry(self, node: Node, src: Entry, dst: Entry, *, into_empty: bool) -> None:
        """`node`'s name `src` becomes `dst` (free by now): rows, fields, the directories'
        entries and times. `into_empty`: no entry was there (the kernel may have cached
        its absence)."""
        ns = self.ns
        (src_dir, src_name), (dst_dir, dst_name) = src, dst
        now = time.time_ns()
        ns.journal.keep(node, "parent", "name", "changed_ns")
        ns.entries.keep(src, dst)
        ns.hardlinks.move_name(node, src, dst)
        ns.registry.nodes.update(node.id, changed_ns=now)
        src_dir.remove_child(src_name)
        ns.watchers.entry_changed(src_dir, src_name)
        if into_empty:
            ns.watchers.entry_changed(dst_dir, dst_name)   # a cached negative entry, if any
        node.changed_ns = now
        for directory in {src_dir, dst_dir}:
            ns.entries.touch(directory, now)
        dst_dir.add_child(node, dst_name)

    def exchange(self, src_parent_id: int, src_name: str, dst_parent_id: int,
                 dst_name: str, cred: Credentials) -> tuple[Node, Node]:
        """renameat2(RENAME_EXCHANGE): two existing entries trade places in one
        transaction. Each is checked as a rename of it would be (write on both directories,
        sticky directories, a directory's '..' and its own subtree); ids stay."""
        ns = self.ns
        check_component(src_name)
        check_component(dst_name)
        src_dir, dst_dir = ns.directory(src_parent_id), ns.directory(dst_parent_id)
        a = ns.lookup_child(src_parent_id, src_name, cred)
        b = ns.lookup_child(dst_parent_id, dst_name, cred)
        if a is b:
            return a, b
        for node, here, there in ((a, src_dir, dst_dir), (b, dst_dir, src_dir)):
            require_removable(here, node, cred, "rename entries in")
            if isinstance(node, Directory):
                check_dir_move(node, here, there, cred)
        at_a, at_b = (src_dir, src_name), (dst_dir, dst_name)
        with ns.journal.change(durable=has_durable(a) or has_durable(b)):
            paths = (entry_path(*at_a), entry_path(*at_b))
            self._swap(a, at_a, b, at_b)
            for node, old, new in ((a, paths[0], paths[1]), (b, paths[1], paths[0])):
                ns.journal.event("rename", node, cred, exchange=True,
                                 **{"from": old, "to": new})
        return a, b

    def _swap(self, a: Node, at_a: Entry, b: Node, at_b: Entry) -> None:
        """`a` at `at_a` and `b` at `at_b` trade places: rows, fields, the directories'
        entries and times."""
        ns = self.ns
        (src_dir, src_name), (dst_dir, dst_name) = at_a, at_b
        now = time.time_ns()
        for node in (a, b):
            ns.journal.keep(node, "parent", "name", "changed_ns")
        ns.entries.keep(at_a, at_b)
        ns.hardlinks.exchange_names(a, at_a, b, at_b)
        for node in (a, b):
            ns.registry.nodes.update(node.id, changed_ns=now)
            node.changed_ns = now
        src_dir.remove_child(src_name)
        dst_dir.remove_child(dst_name)
        dst_dir.add_child(a, dst_name)
        src_dir.add_child(b, src_name)
        ns.watchers.entry_changed(src_dir, src_name)
        ns.watchers.entry_changed(dst_dir, dst_name)
        for directory in {src_dir, dst_dir}:
            ns.entries.touch(directory, now)
