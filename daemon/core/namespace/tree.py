"""The namespace's tree: the nodes by id and the root, lookups by path (through symbolic
links, daemon/core/links.py) and by id, new nodes and directories, and a node forgotten.

It keeps the in-memory tree in step with the registry's rows inside the caller's transaction
(daemon/core/journal.py): every change registers its undo, so a failed statement or commit
leaves the tree as it was. Lookups check POSIX's search permission on every directory
passed; a new entry needs write and search on its directory, and takes its group from a
setgid one. Walks are iterative (nodes.walk): a chain may be thousands deep.

`Namespace` holds the namespace's parts, which its callers name (the package's __init__
lists them). It knows nothing of memory, the keeper or parity: a verb that removes an
allocation asks the namespace to forget the name and then lets go of the memory itself
(daemon/core/lifecycle.py).
"""
from __future__ import annotations

import time

from gpumemctl.protocol import (
    Exists,
    InternalError,
    NoMemory,
    NotFound,
    UsageError,
    check_component,
    split_path,
)

from ...backends.arenas import is_span
from ...backends.slabs import placement
from ...registry import ROOT_ID, Registry, stored_name
from ..describe import describe
from ..journal import Journal
from ..links import Resolver
from ..nodes import Allocation, Directory, Node, NodeTable
from ..permissions import Credentials, W, X, administrative_uid, require
from .attributes import Attributes
from .entries import Entries
from .hardlinks import HardLinks
from .ids import NodeIds
from .lostfound import LostFound
from .metadata import Metadata
from .renames import Renames
from .reports import TreeReports
from .rows import COLUMNS, kind_of_new, nodes_from_rows
from .rules import check_mode
from .watchers import Watchers

RESERVED_AT_ROOT = (".metadata",)   # the mount's read-only metadata view (daemon/fs/)
# Fields of a new node that are memory or kind, never columns of its row.
NOT_COLUMNS = ("buffer", "parity", "leased", "ftype")


class Namespace:
    def __init__(self, registry: Registry, journal: Journal):
        self.registry = registry
        self.journal = journal
        self.nodes = NodeTable()
        self.root: Directory = None  # type: ignore[assignment]  # set by load()
        self.max_names_per_uid: int | None = None      # config max_names_per_uid
        # Paths through symbolic links, for the socket API (daemon/core/links.py); its
        # mount point is set by the composition root (daemon/compose.py).
        self.resolver = Resolver(lambda: self.root)
        # The parts, each given this namespace (the package's __init__ says what each does).
        self.watchers = Watchers()
        self.entries = Entries(self)
        self.ids = NodeIds(registry)
        self.hardlinks = HardLinks(self)
        self.metadata = Metadata(self)
        self.renames = Renames(self)
        self.attributes = Attributes(self)
        self.reports = TreeReports(self)
        self.lost_found = LostFound(self)

    def load(self) -> None:
        """The tree as the registry has it: every node, then each under its parent, then
        the hard links and the user metadata."""
        self.ids.load()
        loaded = list(nodes_from_rows(self.registry.nodes.load(COLUMNS)))
        for node, _ in loaded:
            self.nodes[node.id] = node
        self._link_all(loaded)
        if self.root is None or self.root.id != ROOT_ID:
            raise InternalError("registry has no root directory")
        self.hardlinks.load()
        self.metadata.load()

    def _link_all(self, loaded: list[tuple[Node, int | None]]) -> None:
        """Each loaded node under its parent (a second pass: a node moved by a rename may
        come before its directory, which can be younger). Per node, a lookup and an
        entry: this runs a million times at a start."""
        by_id = self.nodes.get
        for node, parent_id in loaded:
            parent = by_id(parent_id) if parent_id is not None else None
            if isinstance(parent, Directory):
                node.parent = parent
                parent.add_child(node)
            else:
                self._link_loaded(node, parent_id)     # the root, or a broken row

    def _link_loaded(self, node: Node, parent_id: int | None) -> None:
        if parent_id is None:
            if isinstance(node, Directory):
                self.root = node
            return
        parent = self.nodes[parent_id]
        if not isinstance(parent, Directory):
            raise InternalError(f"registry row {node.id} has an allocation as its parent")
        node.parent = parent
        parent.add_child(node)

    # ---- lookups by path ------------------------------------------------------------------
    def lookup(self, path: str, cred: Credentials, *, allow_root: bool = False,
               follow: bool = True) -> Node:
        """Resolve a path, requiring search (x) permission on every directory passed.
        Symbolic links are followed (daemon/core/links.py), the last component's only with
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

    # ---- lookups by id (the mount's inodes) -------------------------------------------------
    def node(self, node_id: int) -> Node:
        node = self.nodes.get(node_id)
        if node is None:
            raise NotFound(f"no node with id {node_id}")
        return node

    def node_or_none(self, node_id: int) -> Node | None:
        """The live node with this id (inode), or None."""
        return self.nodes.get(node_id)

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

    # ---- the whole tree ---------------------------------------------------------------------
    def all_nodes(self) -> list[Node]:
        return list(self.nodes.values())

    def node_count(self) -> int:
        return len(self.nodes)

    def allocations(self) -> list[Allocation]:
        return [n for n in self.nodes.values() if isinstance(n, Allocation)]

    # ---- new nodes, and a node forgotten ----------------------------------------------------
    def insert_dirs(self, parent: Directory, names: list[str], cred: Credentials,
                    mode: int, ids: list[int] | None = None) -> Directory:
        """Create a chain of directories (inside the caller's transaction); `ids`: ids
        reserved for them (ns.ids.reserve)."""
        for i, name in enumerate(names):
            require(parent, cred, W | X, "create entries in")
            parent = self.insert_node(Directory, parent, name, cred, mode,
                                      node_id=ids[i] if ids else None)
            self.journal.event("mkdir", parent, cred, mode=f"{mode:04o}")
        return parent

    def insert_node(self, cls, parent: Directory, name: str, cred: Credentials, mode: int,
                    node_id: int | None = None, **alloc_fields):
        """A new node and its row. `node_id`: one reserved before (ns.ids.reserve), for an
        allocation whose memory went to the keeper under it before this commit. A new
        directory takes its parent's durable default (issue 27) unless told otherwise."""
        self.check_not_reserved(parent, name)
        if cls is Directory:
            alloc_fields.setdefault("durable", parent.durable)
        self.require_room_for_a_name(cred.uid)
        now = time.time_ns()
        gid = parent.gid if parent.mode & 0o2000 else cred.gid   # setgid directories
        if cls is Directory and parent.mode & 0o2000:
            mode |= 0o2000
        row = dict(parent=parent.id, name=name, kind=kind_of_new(cls, alloc_fields),
                   uid=cred.uid, gid=gid, mode=mode, created_ns=now, modified_ns=now,
                   changed_ns=now, accessed_ns=now)
        columns = {k: v for k, v in alloc_fields.items() if k not in NOT_COLUMNS}
        if alloc_fields.get("buffer") is not None:
            columns.update(placement(alloc_fields["buffer"]))    # a slot's slab and offset
        if "target" in columns:
            columns["target"] = stored_name(columns["target"])
        row["id"] = node_id if node_id is not None else self.ids.reserve(1)[0]
        node_id = self.registry.nodes.insert(**row, **columns)
        if alloc_fields.get("durable") and is_span(alloc_fields.get("parity")):
            span = alloc_fields["parity"]           # where its parity is: a restart's
            self.registry.arenas.put_span(node_id, span.where)
        node = cls(id=node_id, name=name, parent=parent, uid=cred.uid, gid=gid, mode=mode,
                   created_ns=now, modified_ns=now, changed_ns=now, **alloc_fields)
        self.entries.add(parent, node, now)
        return node

    def check_not_reserved(self, parent: Directory, name: str) -> None:
        if parent is self.root and name in RESERVED_AT_ROOT:
            raise UsageError(f"'{name}' is reserved at the top level (the mount shows "
                             "allocation details there)", details={"errno": "EPERM"})

    def require_room_for_a_name(self, uid: int) -> None:
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

    def forget(self, node: Node) -> None:
        """Remove a node's row and its place in the tree (memory is the caller's concern)."""
        self.watchers.forget(node)
        self.registry.nodes.delete(node.id)      # its hard links' rows with it
        self.entries.remove_node(node)
