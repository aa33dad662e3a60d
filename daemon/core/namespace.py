"""The namespace: the tree of directories and allocations, and the POSIX rules over it.

It owns the in-memory tree (`nodes` by id, `root`) and keeps it in step with the registry's
rows inside the caller's transaction (daemon/journal.py): every change registers its undo,
so a failed statement or commit leaves the tree as it was. The rules are POSIX's: search
permission on every directory passed, write+search to add or remove an entry, sticky
directories, setgid inheritance, chmod/chown/utimensat. Walks are iterative (nodes.walk):
a chain may be thousands deep. Hard links are daemon/hardlinks.py's, a base class.

It knows nothing of memory, the keeper or parity: a verb that removes an allocation asks
the namespace to forget the name and then lets go of the memory itself
(daemon/lifecycle.py).
Watchers (daemon/fs.py) are told of every change the kernel may have cached.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import time
from collections.abc import Callable

from gpumemctl.protocol import (
    Exists,
    InternalError,
    NoMemory,
    NotFound,
    PermissionDenied,
    UsageError,
    check_component,
    split_path,
)
from gpumemctl.protocol.replies import Node as NodeInfo

from ..registry import ROOT_ID, Registry, loaded_name, stored_name
from .describe import describe
from .hardlinks import HardLinks
from .journal import Journal
from .links import Resolver
from .nodes import (
    SPECIAL_KINDS,
    SPECIAL_TYPES,
    Aliases,
    Allocation,
    Directory,
    Node,
    NodeTable,
    Special,
    Symlink,
    entry_path,
    walk,
    walk_entries,
)
from .orphans import RECOVERY_DIR
from .permissions import (
    DAEMON,
    Credentials,
    R,
    W,
    X,
    administrative_uid,
    may_remove_from,
    require,
)

RESERVED_AT_ROOT = (".metadata",)   # the mount's read-only metadata view (daemon/fs.py)
RELATIME_NS = 24 * 3600 * 10**9   # relatime: an access time older than this moves on a read
NOW = "now"                       # setattr(mtime_ns=NOW): utimensat's UTIME_NOW
# The registry's `unsealed` column (registry.add_damage_table): read here to build nodes.
SEALED, UNSEALED, WRITING = 0, 1, 2


def _kind(cls, fields: dict) -> str:
    """The registry's `kind` of a new node of class `cls` (nodes.kind_of, before the node
    exists)."""
    if cls is Special:
        return SPECIAL_KINDS[fields["ftype"]]
    return {Directory: "dir", Symlink: "symlink", Allocation: "alloc"}[cls]


def check_mode(mode: int) -> int:
    if not isinstance(mode, int) or isinstance(mode, bool) or not 0 <= mode <= 0o7777:
        raise UsageError(f"invalid mode {mode!r}: expected octal permission bits 0000-7777")
    return mode


class Namespace(HardLinks):
    def __init__(self, registry: Registry, journal: Journal):
        self.registry = registry
        self.journal = journal
        self.nodes = NodeTable()
        self.max_names_per_uid: int | None = None      # config max_names_per_uid
        self.root: Directory = None  # type: ignore[assignment]  # set by load()
        # Told of changes the kernel may have cached (daemon/fs.py invalidates its dentries
        # and attributes): watcher.entry_changed(parent_id, name), attrs_changed(node_id),
        # data_changed(node_id).
        self.watchers: list = []
        # Data generations: node id -> the value of _data_clock at its last data change made
        # other than through the mount's own writes (data_changed). One clock for all, so a
        # generation is never given twice, even to an allocation whose entry was dropped.
        self.generations: dict[int, int] = {}
        self._data_clock = 0
        self._next_id = 0           # the next id to give (load(); reserve_ids)
        # Paths through symbolic links, for the socket API (daemon/links.py); its mount
        # point is set by the composition root (daemon/main.py).
        self.resolver = Resolver(lambda: self.root)

    def load(self) -> None:
        self._next_id = self.registry.identity.next_node_id()
        rows = self.registry.nodes.load()
        for row in rows:
            self.nodes[row["id"]] = self._node_from_row(row)
        for row in rows:
            node = self.nodes[row["id"]]
            if row["parent"] is None:
                if isinstance(node, Directory):
                    self.root = node
                continue
            parent = self.nodes[row["parent"]]
            if not isinstance(parent, Directory):
                raise InternalError(f"registry row {node.id} has an allocation as its parent")
            node.parent = parent
            parent.add_child(node)
        if self.root is None or self.root.id != ROOT_ID:
            raise InternalError("registry has no root directory")
        self._load_hard_links()
        self._load_metadata()

    def _load_metadata(self) -> None:
        """Each node's user metadata, and each uid's total of it (NodeTable). A row of a
        node the tree lacks cannot be (ON DELETE CASCADE); `check` would name one."""
        for node_id, key, value in self.registry.metadata.load():
            node = self.nodes.get(node_id)
            if node is None:
                continue
            node.metadata[key] = value
            node.metadata_bytes += len(key) + len(value)
            self.nodes.metadata_changed(node, len(key) + len(value))

    @staticmethod
    def _node_from_row(row) -> Node:
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

    def lookup(self, path: str, cred: Credentials, *, allow_root: bool = False,
               follow: bool = True) -> Node:
        """Resolve a path, requiring search (x) permission on every directory passed.
        Symbolic links are followed (daemon/links.py), the last component's only with
        `follow` (as stat(2) does; lstat(2) is follow=False)."""
        parts = split_path(path, allow_root=allow_root)
        node, missing = self.resolver.resolve(parts, cred, follow_last=follow)
        if missing:
            found = len(parts) - len(missing) + 1
            raise NotFound(f"no such allocation or directory: '{'/'.join(parts[:found])}'")
        return node

    def lookup_entry(self, path: str, cred: Credentials) -> tuple[Directory, str, Node]:
        """(directory, name, node) of the entry `path` names, its last component not
        followed: what rm and link(2) act on. A hard-linked node has several entries; the
        path says which."""
        parts = split_path(path)
        parent = self.lookup("/".join(parts[:-1]), cred, allow_root=True)
        if not isinstance(parent, Directory):
            raise NotFound(f"'{parent.path}' is not a directory",
                           details={"errno": "ENOTDIR"})
        require(parent, cred, X)
        node = parent.children.get(parts[-1])
        if node is None:
            raise NotFound(f"no such allocation or directory: '{'/'.join(parts)}'")
        return parent, parts[-1], node

    def lookup_allocation(self, path: str, cred: Credentials) -> Allocation:
        node = self.lookup(path, cred)
        if not isinstance(node, Allocation):
            raise UsageError(f"'{node.path}' is a {describe(node)['type']}, not an allocation")
        return node

    def listdir(self, path: str, cred: Credentials, *, recursive: bool = False
                ) -> list[NodeInfo]:
        # The last component is not followed: `ls LINK` shows the link, as `ls -l` does.
        node = self.lookup(path, cred, allow_root=True, follow=False)
        if not isinstance(node, Directory):
            parts = split_path(path)      # a hard link is listed under the name asked for
            return [describe(node, path="/".join(parts), name=parts[-1])]
        require(node, cred, R | X, "list")
        out: list[NodeInfo] = []
        self._list_into(node, cred, recursive, out)
        return out

    def _list_into(self, directory: Directory, cred, recursive: bool, out: list) -> None:
        """The entries below `directory`, pre-order, each under its own name (a hard-linked
        file once per name); with `recursive`, into every directory the caller may list
        (walk_entries: no recursion, a chain may be thousands deep)."""
        def enter(d: Directory) -> bool:
            return d is directory or (recursive and self.allowed(d, cred, R | X))
        out.extend(describe(node, path=path, name=name)
                   for path, name, node in walk_entries(directory, enter))

    @staticmethod
    def allowed(node, cred, want) -> bool:
        try:
            require(node, cred, want)
            return True
        except PermissionDenied:
            return False

    def allocations(self) -> list[Allocation]:
        return [n for n in self.nodes.values() if isinstance(n, Allocation)]

    def parent_for_new(self, parts: list[str], cred: Credentials, parents: bool):
        """Find the directory that will hold parts[-1]; with `parents`, list the missing
        directories to create (as names under the last existing one). Links on the way
        are followed (a link to a directory is a way into it)."""
        node, missing = self.resolver.resolve(parts[:-1], cred, follow_last=True)
        if missing and not parents:
            found = len(parts) - 1 - len(missing) + 1
            raise NotFound(f"no such directory: '{'/'.join(parts[:found])}'")
        if not isinstance(node, Directory):
            raise NotFound(f"'{'/'.join(parts[:-1])}' is not a directory",
                           details={"errno": "ENOTDIR"})
        return node, missing

    def insert_dirs(self, parent: Directory, names: list[str], cred: Credentials,
                    mode: int, ids: list[int] | None = None) -> Directory:
        """Create a chain of directories (inside the caller's transaction); `ids`: ids
        reserved for them (reserve_ids)."""
        for i, name in enumerate(names):
            require(parent, cred, W | X, "create entries in")
            parent = self.insert_node(Directory, parent, name, cred, mode,
                                      node_id=ids[i] if ids else None)
            self.journal.event("mkdir", parent, cred, mode=f"{mode:04o}")
        return parent

    def insert_node(self, cls, parent: Directory, name: str, cred: Credentials, mode: int,
                    node_id: int | None = None, **alloc_fields):
        """A new node and its row. `node_id`: one reserved before (reserve_id), for an
        allocation whose memory went to the keeper under it before this commit."""
        self.check_not_reserved(parent, name)
        self._require_room_for_a_name(cred.uid)
        now = time.time_ns()
        gid = parent.gid if parent.mode & 0o2000 else cred.gid   # setgid directories
        if cls is Directory and parent.mode & 0o2000:
            mode |= 0o2000
        row = dict(parent=parent.id, name=name, kind=_kind(cls, alloc_fields), uid=cred.uid,
                   gid=gid, mode=mode, created_ns=now, modified_ns=now, changed_ns=now,
                   accessed_ns=now)
        db_fields = {k: v for k, v in alloc_fields.items()
                     if k not in ("buffer", "parity", "leased", "ftype")}
        if "target" in db_fields:
            db_fields["target"] = stored_name(db_fields["target"])
        row["id"] = node_id if node_id is not None else self.reserve_ids(1)[0]
        node_id = self.registry.nodes.insert(**row, **db_fields)
        node = cls(id=node_id, name=name, parent=parent, uid=cred.uid, gid=gid, mode=mode,
                   created_ns=now, modified_ns=now, changed_ns=now, **alloc_fields)
        self._link(parent, node, now)
        return node

    def _require_room_for_a_name(self, uid: int) -> None:
        """max_names_per_uid: every name is a registry row and a node in memory, so one
        user's are bounded (docs/security.md); root and the daemon's uid are not."""
        limit = self.max_names_per_uid
        if limit is None or administrative_uid(uid):
            return
        owned = self.nodes.owned.get(uid, 0)
        if owned >= limit:
            raise NoMemory(f"uid {uid} has {owned} names (allocations, directories, links and "
                           f"special files), the "
                           f"most one user may have (max_names_per_uid {limit}); remove some "
                           "first", details={"errno": "EDQUOT", "uid": uid, "limit": limit})

    def reserve_ids(self, count: int) -> list[int]:
        """Ids no node has or will be given, in order: a key to deposit under before the
        row that takes it is inserted (Custody.send off the event loop, then insert_node),
        and the ids of the directories made with it, so that parents keep smaller ids.
        Taken in memory: every insert names its id (AUTOINCREMENT's sequence follows), and
        one reserved but never inserted is a gap, as a rolled-back insert's is."""
        first = self._next_id
        self._next_id += count
        return list(range(first, first + count))

    def reserve_ids_up_to(self, up_to: int) -> None:
        """Make every future id larger than `up_to` (ids are keeper keys: start-up keeps
        new ids from aliasing what the keeper holds)."""
        self.registry.identity.reserve_node_ids(up_to)
        self._next_id = max(self._next_id, up_to + 1)

    def check_not_reserved(self, parent: Directory, name: str) -> None:
        if parent is self.root and name in RESERVED_AT_ROOT:
            raise UsageError(f"'{name}' is reserved at the top level (the mount shows "
                             "allocation details there)", details={"errno": "EPERM"})

    def _link(self, parent: Directory, node: Node, now: int) -> None:
        self.journal.keep(parent, "modified_ns", "changed_ns")
        self.nodes[node.id] = node
        parent.add_child(node)

        def unlink() -> None:
            if parent.children.get(node.name) is node:
                parent.remove_child(node.name)
            self.nodes.pop(node.id, None)
        self.journal.on_rollback(unlink)
        parent.modified_ns = parent.changed_ns = now
        self.registry.nodes.update(parent.id, modified_ns=now, changed_ns=now)
        self.journal.node_changed(parent)

    def _unlink(self, node: Node) -> None:
        """Take the node and every name of it out of the tree (its rows are the caller's)."""
        now = time.time_ns()
        if self.nodes.get(node.id) is node:
            self.journal.on_rollback(lambda: self.nodes.__setitem__(node.id, node))
        for parent, name in node.names:
            if parent.children.get(name) is node:
                self._remove_entry(parent, name, now)
        if node.aliases:
            self._count_names(node, -len(node.aliases))
            self.journal.keep(node, "aliases")
            node.aliases = Aliases()
        self.nodes.pop(node.id, None)

    def _remove_entry(self, parent: Directory, name: str, now: int) -> None:
        """`name` leaves `parent` (the tree, and the parent's times in its row)."""
        self._keep_entries((parent, name))
        self.journal.keep(parent, "modified_ns", "changed_ns")
        parent.remove_child(name)
        parent.modified_ns = parent.changed_ns = now
        self.registry.nodes.update(parent.id, modified_ns=now, changed_ns=now)
        self.entry_changed(parent, name)
        self.journal.node_changed(parent)

    def _keep_entries(self, *entries: tuple[Directory, str]) -> None:
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
        self.journal.on_rollback(restore)

    # ---- user metadata (daemon/usermeta.py has the rules and bounds) ---------------------
    def set_metadata(self, node: Node, key: bytes, value: bytes | None) -> None:
        """One key of the node's metadata set to `value`, or removed (None): in memory, in
        its row and in the owner's total, inside the caller's change (undone with it). The
        node's change time moves, as setxattr(2)'s does."""
        old = node.metadata.get(key)
        if value is None:
            if old is None:
                return
            self.registry.metadata.delete(node.id, key)
            del node.metadata[key]
        else:
            self.registry.metadata.set(node.id, key, value)
            node.metadata[key] = value

        def undo() -> None:
            if old is None:
                node.metadata.pop(key, None)
            else:
                node.metadata[key] = old
        self.journal.on_rollback(undo)
        size = len(key) + len(value) if value is not None else 0
        self._metadata_grew(node, size - (len(key) + len(old) if old is not None else 0))

    def replace_metadata(self, node: Node, entries: dict[bytes, bytes]) -> None:
        """All of the node's metadata becomes `entries` (inside the caller's change): what
        a create or a restore from a snapshot brings."""
        if not entries and not node.metadata:
            return
        self.journal.keep(node, "metadata")
        self.registry.metadata.delete(node.id)
        for key in sorted(entries):
            self.registry.metadata.set(node.id, key, entries[key])
        old, node.metadata = node.metadata_bytes, dict(entries)
        self._metadata_grew(node, sum(len(k) + len(v) for k, v in entries.items()) - old)

    def _metadata_grew(self, node: Node, delta: int) -> None:
        now = time.time_ns()
        self.journal.keep(node, "metadata_bytes", "changed_ns")
        node.metadata_bytes += delta
        node.changed_ns = now
        self.registry.nodes.update(node.id, changed_ns=now)
        if delta and self.nodes.get(node.id) is node:
            self.nodes.metadata_changed(node, delta)
            self.journal.on_rollback(lambda: self.nodes.metadata_changed(node, -delta))
        self.attrs_changed(node)                # st_ctime

    def metadata_used(self, uid: int) -> int:
        """The bytes of metadata the nodes `uid` owns hold (metadata_user_max_bytes)."""
        return self.nodes.metadata.get(uid, 0)

    def entry_changed(self, parent: Directory, name: str) -> None:
        for watcher in self.watchers:
            watcher.entry_changed(parent.id, name)

    def attrs_changed(self, node: Node) -> None:
        for watcher in self.watchers:
            watcher.attrs_changed(node.id)

    def data_changed(self, node: Node) -> None:
        """An allocation's bytes or size changed by another path than the mount's own writes
        (a socket writer's close, a detach or seal, a resize, a repair): its data generation
        moves on, and the watchers drop what the kernel caches of its contents."""
        self._data_clock += 1
        self.generations[node.id] = self._data_clock
        for watcher in self.watchers:
            watcher.data_changed(node.id)

    def data_generation(self, node: Node) -> int:
        return self.generations.get(node.id, 0)

    def forget(self, node: Node) -> None:
        """Remove a node's row and its place in the tree (memory is the caller's concern)."""
        self.generations.pop(node.id, None)
        self.registry.nodes.delete(node.id)      # its hard links' rows with it
        self._unlink(node)

    def removal_order(self, parent: Directory, name: str, node: Node, cred: Credentials
                      ) -> list[tuple[Directory, str, Node]]:
        """The entries to remove for `rm -r` of `name` in `parent`: (directory, name,
        node), children before parents, each checked for permission before anything
        changes. A hard-linked file is in it once per name inside the tree."""
        order: list[tuple[Directory, str, Node]] = []
        # (directory, name, node, its children queued)
        stack: list[tuple[Directory, str, Node, bool]] = [(parent, name, node, False)]
        while stack:                  # post-order with a stack: a chain may be thousands deep
            d, n_name, n, queued = stack.pop()
            if isinstance(n, Directory) and not queued:
                require(n, cred, R | W | X, "remove entries from")
                stack.append((d, n_name, n, True))
                stack.extend((n, child_name, child, False) for child_name, child
                             in reversed(list(n.children.items())))
                continue
            require(d, cred, W | X, "remove entries from")
            if not may_remove_from(d, n, cred):
                raise PermissionDenied(
                    f"permission denied: '{d.path or '/'}' is sticky; only the owner "
                    f"of '{entry_path(d, n_name)}' (uid {n.uid}) may remove it")
            order.append((d, n_name, n))
        return order

    def node(self, node_id: int) -> Node:
        node = self.nodes.get(node_id)
        if node is None:
            raise NotFound(f"no node with id {node_id}")
        return node

    def directory(self, node_id: int) -> Directory:
        node = self.node(node_id)
        if not isinstance(node, Directory):
            raise UsageError(f"'{node.path}' is an allocation, not a directory",
                             details={"errno": "ENOTDIR"})
        return node

    def lookup_child(self, parent_id: int, name: str, cred: Credentials) -> Node:
        check_component(name)
        parent = self.directory(parent_id)
        require(parent, cred, X)
        child = parent.children.get(name)
        if child is None:
            where = f"{parent.path}/{name}" if parent.path else name
            raise NotFound(f"no such allocation or directory: '{where}'")
        return child

    def parent_for_entry(self, parent_id: int, name: str, cred: Credentials,
                          mode: int) -> Directory:
        """Checks shared by every new entry made by parent id: mode, name, permission on
        the parent, and that the name is free."""
        check_mode(mode)
        check_component(name)
        parent = self.directory(parent_id)
        require(parent, cred, W | X, "create entries in")
        if name in parent.children:
            raise Exists(f"'{parent.children[name].path}' already exists")
        return parent

    def move(self, src_parent_id: int, src_name: str, dst_parent_id: int, dst_name: str,
             cred: Credentials, *, replace: bool = True) -> tuple[Node, Node | None]:
        """POSIX rename(2). The id (and so the keeper key) stays; parent and name change in
        one registry transaction. Returns the node and the entry it replaced, whose memory
        is the caller's (NameVerbs.rename)."""
        check_component(src_name)
        check_component(dst_name)
        src_dir, dst_dir = self.directory(src_parent_id), self.directory(dst_parent_id)
        self.check_not_reserved(dst_dir, dst_name)
        node = self.lookup_child(src_parent_id, src_name, cred)
        self.require_removable(src_dir, node, cred, "rename entries in")
        require(dst_dir, cred, W | X, "rename entries in")
        target = dst_dir.children.get(dst_name)
        if target is node:
            return node, None
        if isinstance(node, Directory):
            self._check_dir_move(node, src_dir, dst_dir, cred)
        if target is not None:
            self._check_replace(node, target, dst_dir, cred, replace)
        old_path = entry_path(src_dir, src_name)
        new_path = entry_path(dst_dir, dst_name)
        freed = None
        with self.journal.change(durable=self.has_durable(node) or self.has_durable(target)):
            if target is not None:
                if self.drop_name(dst_dir, dst_name, target):
                    freed = target
                self.journal.event("remove", target, cred, replaced_by=old_path,
                                   **({} if freed else {"name": new_path,
                                                        "links_left": target.nlink}))
            now = time.time_ns()
            self.journal.keep(node, "parent", "name", "changed_ns")
            self._keep_entries((src_dir, src_name), (dst_dir, dst_name))
            self._move_name(node, (src_dir, src_name), (dst_dir, dst_name))
            self.registry.nodes.update(node.id, changed_ns=now)
            for directory in {src_dir, dst_dir}:
                self.journal.keep(directory, "modified_ns", "changed_ns")
            src_dir.remove_child(src_name)
            self.entry_changed(src_dir, src_name)
            if target is None:
                self.entry_changed(dst_dir, dst_name)   # a cached negative entry, if any
            node.changed_ns = now
            for directory in {src_dir, dst_dir}:
                directory.modified_ns = directory.changed_ns = now
                self.registry.nodes.update(directory.id, modified_ns=now, changed_ns=now)
                self.journal.node_changed(directory)
            dst_dir.add_child(node, dst_name)
            self.journal.event("rename", node, cred, **{"from": old_path, "to": new_path})
        return node, freed

    def exchange(self, src_parent_id: int, src_name: str, dst_parent_id: int,
                 dst_name: str, cred: Credentials) -> tuple[Node, Node]:
        """renameat2(RENAME_EXCHANGE): two existing entries trade places in one
        transaction. Each is checked as a rename of it would be (write on both directories,
        sticky directories, a directory's '..' and its own subtree); ids stay."""
        check_component(src_name)
        check_component(dst_name)
        src_dir, dst_dir = self.directory(src_parent_id), self.directory(dst_parent_id)
        a = self.lookup_child(src_parent_id, src_name, cred)
        b = self.lookup_child(dst_parent_id, dst_name, cred)
        if a is b:
            return a, b
        for node, here, there in ((a, src_dir, dst_dir), (b, dst_dir, src_dir)):
            self.require_removable(here, node, cred, "rename entries in")
            if isinstance(node, Directory):
                self._check_dir_move(node, here, there, cred)
        with self.journal.change(durable=self.has_durable(a) or self.has_durable(b)):
            now = time.time_ns()
            at_a, at_b = (src_dir, src_name), (dst_dir, dst_name)
            paths = (entry_path(*at_a), entry_path(*at_b))
            for node in (a, b):
                self.journal.keep(node, "parent", "name", "changed_ns")
            for directory in {src_dir, dst_dir}:
                self.journal.keep(directory, "modified_ns", "changed_ns")
            self._keep_entries(at_a, at_b)
            # UNIQUE (parent, name): `a` steps out of the tree (a NULL parent, or its hard
            # link's row out of `links`) while `b` takes its name, then takes `b`'s.
            a_first = a.parent is src_dir and a.name == src_name
            if a_first:
                self.registry.nodes.update(a.id, parent=None)
            else:
                self.registry.links.delete(src_dir.id, src_name)
                self._alias_removed(a, at_a)
            self._move_name(b, at_b, at_a)
            if a_first:
                self.registry.nodes.update(a.id, parent=dst_dir.id, name=dst_name)
                a.parent, a.name = dst_dir, dst_name
            else:
                self.registry.links.insert(dst_dir.id, dst_name, a.id)
                self._alias_added(a, at_b)
            for node in (a, b):
                self.registry.nodes.update(node.id, changed_ns=now)
                node.changed_ns = now
            src_dir.remove_child(src_name)
            dst_dir.remove_child(dst_name)
            dst_dir.add_child(a, dst_name)
            src_dir.add_child(b, src_name)
            self.entry_changed(src_dir, src_name)
            self.entry_changed(dst_dir, dst_name)
            for directory in {src_dir, dst_dir}:
                directory.modified_ns = directory.changed_ns = now
                self.registry.nodes.update(directory.id, modified_ns=now, changed_ns=now)
                self.journal.node_changed(directory)
            for node, old, new in ((a, paths[0], paths[1]), (b, paths[1], paths[0])):
                self.journal.event("rename", node, cred, exchange=True,
                                   **{"from": old, "to": new})
        return a, b

    def _check_dir_move(self, node: Directory, src_dir: Directory, dst_dir: Directory,
                        cred: Credentials) -> None:
        """No move into its own subtree; a move to another parent rewrites its '..', which
        needs write permission on the directory itself (as Linux requires)."""
        walk: Node | None = dst_dir
        while walk is not None:
            if walk is node:
                raise UsageError(f"cannot move '{node.path}' into itself "
                                 f"('{dst_dir.path}')")
            walk = walk.parent
        if src_dir is not dst_dir:
            require(node, cred, W, "move")

    def _check_replace(self, node: Node, target: Node, dst_dir: Directory, cred: Credentials,
                       replace: bool) -> None:
        if not replace:
            raise Exists(f"'{target.path}' already exists")
        if not may_remove_from(dst_dir, target, cred):
            raise self._sticky_denied(dst_dir, target)
        if isinstance(node, Directory) and not isinstance(target, Directory):
            raise UsageError(f"cannot replace allocation '{target.path}' with a directory",
                             details={"errno": "ENOTDIR"})
        if not isinstance(node, Directory) and isinstance(target, Directory):
            raise UsageError(f"cannot replace directory '{target.path}' with an allocation",
                             details={"errno": "EISDIR"})
        if isinstance(target, Directory) and target.children:
            raise Exists(f"directory '{target.path}' is not empty",
                         details={"errno": "ENOTEMPTY"})

    @staticmethod
    def has_durable(node: Node | None) -> bool:
        """Whether a change to this node's row must be fsynced: it holds a durable
        allocation (a directory, anywhere below it)."""
        if node is None:
            return False
        return any(isinstance(n, Allocation) and n.durable for n in walk(node))

    def require_removable(self, parent: Directory | None, node: Node, cred: Credentials,
                          what: str = "remove entries from") -> None:
        if parent is None:
            raise PermissionDenied("permission denied: the root cannot be removed or moved",
                                   details={"errno": "EBUSY"})
        require(parent, cred, W | X, what)
        if not may_remove_from(parent, node, cred):
            raise self._sticky_denied(parent, node)

    @staticmethod
    def _sticky_denied(parent: Directory, node: Node) -> PermissionDenied:
        return PermissionDenied(
            f"permission denied: '{parent.path or '/'}' is sticky; only the owner of "
            f"'{node.path}' (uid {node.uid}) may remove or replace it")

    def setattr(self, node_id: int, cred: Credentials, *, mode: int | None = None,
                uid: int | None = None, gid: int | None = None,
                mtime_ns: int | str | None = None, atime_ns: int | str | None = None,
                authorised: bool = False, charge: Callable[[int, int], None]) -> Node:
        """chmod / chown / utimens. chmod: owner or root. chown: only root changes the
        owner; the owner may change the group to one it belongs to; a change of ownership
        clears an allocation's setuid/setgid bits. Times: an explicit time needs owner or
        root, NOW (the string 'now') needs write permission, as utimensat(2) says; atime_ns
        sets the access time (note_access moves it on reads).
        `authorised`: the kernel has applied these rules already (the mount runs with
        default_permissions, and only it knows whether a time was UTIME_NOW). `charge`:
        the quota check for a new owner (Quotas.check)."""
        node, actor = self.node(node_id), cred
        if authorised:
            cred = dataclasses.replace(cred, uid=0)    # passes every check below
        changes: dict = {}
        if mode is not None:
            self._require_owner_eperm(node, cred, "change the mode of")
            changes["mode"] = check_mode(mode)
        if uid is not None and uid != node.uid:
            if not cred.is_root:
                raise PermissionDenied(f"permission denied: only root may change the owner "
                                       f"of '{node.path}'", details={"errno": "EPERM"})
            changes["uid"] = uid
            if isinstance(node, Allocation) and node.buffer is not None:
                charge(uid, node.capacity or 0)      # the new owner pays for it (quotas)
        if gid is not None and gid != node.gid:
            if not (cred.is_root or (cred.uid == node.uid and cred.in_group(gid))):
                raise PermissionDenied(f"permission denied: uid {cred.uid} may not give "
                                       f"'{node.path}' to group {gid}",
                                       details={"errno": "EPERM"})
            changes["gid"] = gid
        if ("uid" in changes or "gid" in changes) and not isinstance(node, Directory):
            changes["mode"] = changes.get("mode", node.mode) & ~0o6000
        for value in (mtime_ns, atime_ns):
            if value == NOW:
                if not (cred.uid == node.uid or self.allowed(node, cred, W)):
                    require(node, cred, W)
            elif value is not None:
                self._require_owner_eperm(node, cred, "set the times of")
        now = time.time_ns()
        if mtime_ns is not None:
            changes["modified_ns"] = now if mtime_ns == NOW else int(mtime_ns)
        if atime_ns is not None:
            changes["accessed_ns"] = now if atime_ns == NOW else int(atime_ns)
        changes["changed_ns"] = now
        with self.journal.change(durable=self.has_durable(node),
                          batch=isinstance(node, Allocation) and not node.durable):
            self.registry.nodes.update(node.id, **changes)
            self.journal.keep(node, *changes)
            if "uid" in changes and self.nodes.get(node.id) is node:
                old_uid, new_uid = node.uid, changes["uid"]
                self.nodes.reowned(node, old_uid, new_uid)
                self.journal.on_rollback(lambda: self.nodes.reowned(node, new_uid, old_uid))
            for key, value in changes.items():
                setattr(node, key, value)
            self.journal.event("setattr", node, actor, **{k: (f"{v:04o}" if k == "mode" else v)
                                                   for k, v in changes.items()})
        self.attrs_changed(node)
        return node

    @staticmethod
    def _require_owner_eperm(node: Node, cred: Credentials, what: str) -> None:
        if not (cred.is_root or cred.uid == node.uid):
            raise PermissionDenied(f"permission denied: only the owner (uid {node.uid}) or "
                                   f"root may {what} '{node.path or '/'}'",
                                   details={"errno": "EPERM"})

    def note_access(self, node: Node) -> None:
        """A read or a listing on the mount: move the access time by Linux's relatime rule
        (only when it is not after the modification or change time, or is a day old), so
        the registry is written once per change or per day, not at every read."""
        now = time.time_ns()
        accessed = node.accessed_ns or 0
        if accessed > max(node.modified_ns, node.changed_ns) and \
                now - accessed < RELATIME_NS:
            return
        node.accessed_ns = now
        if self.nodes.get(node.id) is node:        # an unlinked file has no row left
            # Never fsynced: an access time lost to a power cut harms nobody.
            with self.journal.change(durable=False,
                              batch=isinstance(node, Allocation) and not node.durable):
                self.registry.nodes.update(node.id, accessed_ns=now)

    def may_search_to(self, node: Node, cred: Credentials) -> bool:
        """Whether `cred` has search (x) permission on every directory above `node`: where
        it could look the node up (a removed node is judged by the directories it was in)."""
        directory = node.parent
        while directory is not None:
            try:
                require(directory, cred, X)
            except PermissionDenied:
                return False
            directory = directory.parent
        return True

    def node_or_none(self, node_id: int) -> Node | None:
        """The live node with this id (inode), or None."""
        return self.nodes.get(node_id)

    def all_nodes(self) -> list[Node]:
        return list(self.nodes.values())

    def node_count(self) -> int:
        return len(self.nodes)

    def add_watcher(self, watcher) -> None:
        """A watcher of what the kernel may cache (daemon/fs.py): told entry_changed(
        parent_id, name), attrs_changed(node_id) and data_changed(node_id), and settled
        after each request."""
        self.watchers.append(watcher)

    def remove_watcher(self, watcher) -> None:
        with contextlib.suppress(ValueError):
            self.watchers.remove(watcher)

    async def settle_watchers(self) -> None:
        """Let every watcher pass its pending invalidations on (the mount learns of a
        socket-side change before the socket client hears the answer)."""
        for watcher in list(self.watchers):
            await watcher.settle()

    def recovery_dir(self) -> Directory:
        """A new /lost+found/<UTC time> for re-registered orphans. /lost+found is reused
        only if it is the daemon user's and closed to others (anyone may create entries at
        the root), else a free name beside it is taken."""
        top = self._private_dir(self.root, RECOVERY_DIR, reuse=True)
        stamp = time.strftime("%Y-%m-%dT%H-%M-%SZ", time.gmtime())
        return self._private_dir(top, stamp, reuse=False)

    def _private_dir(self, parent: Directory, base: str, reuse: bool) -> Directory:
        for n in itertools.count(1):
            name = base if n == 1 else f"{base}-{n}"
            node = parent.children.get(name)
            if node is None:
                made = self.insert_node(Directory, parent, name, DAEMON, 0o700)
                self.journal.event("mkdir", made, None, mode="0700")
                return made
            if reuse and isinstance(node, Directory) and node.uid == DAEMON.uid \
                    and not node.mode & 0o077:
                return node
        raise AssertionError("unreachable")

    def totals(self, sessions: int) -> dict:
        """The counts `status` shows; `sessions`: the open client sessions (Holders)."""
        allocs = self.allocations()
        by_state: dict[str, int] = {}
        for a in allocs:
            by_state[a.state] = by_state.get(a.state, 0) + 1
        return {
            "allocations": len(allocs),
            "directories": sum(1 for n in self.nodes.values() if isinstance(n, Directory)) - 1,
            "durable": sum(1 for a in allocs if a.durable),
            "size": sum(a.size or 0 for a in allocs),
            "capacity": sum(a.capacity or 0 for a in allocs if a.buffer is not None),
            "by_state": by_state,
            "sessions": sessions,
            "holders": sum(len(a.holders) for a in allocs),
        }

    def bytes_held_per_device(self) -> dict[str, int]:
        """Device UUID -> the bytes our allocations (memory and parity) hold on it."""
        ours: dict[str, int] = {}
        for alloc in self.allocations():
            if alloc.buffer is not None and alloc.device is not None:
                parity = alloc.parity.capacity if alloc.parity is not None else 0
                ours[alloc.device] = ours.get(alloc.device, 0) + (alloc.capacity or 0) + parity
        return ours

    def ecc_targets(self, paths: list[str], cred: Credentials, everything: bool
                    ) -> list[Allocation]:
        """The allocations a verify covers: the named ones (a directory: everything under
        it), or with `everything`, all that the caller may read."""
        nodes: list[Node]
        if everything:
            nodes = [self.root]
        else:
            if not paths:
                raise UsageError("name one or more allocations, or use --all")
            nodes = [self.lookup(p, cred, allow_root=True) for p in paths]
            for node in nodes:
                if isinstance(node, Directory):       # what `ls DIR` needs
                    require(node, cred, R | X, "list")
        out: list[Allocation] = []
        seen: set[int] = set()
        for node in nodes:
            for a in self.listable_allocations(node, cred):
                if a.id not in seen and self.allowed(a, cred, R):
                    seen.add(a.id)
                    out.append(a)
        return out

    def listable_allocations(self, top: Node, cred: Credentials):
        """The allocations under `top` that `ls -R` would show `cred`: it enters only the
        directories it may list (read and search), so that a name inside a private
        directory never reaches an answer (docs/security.md)."""
        def enter(d: Directory) -> bool:
            return self.allowed(d, cred, R | X)
        return (n for n in walk(top, enter) if isinstance(n, Allocation))
