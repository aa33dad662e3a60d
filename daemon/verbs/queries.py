"""The read-only queries of the tree: lookups, nodes, listings and `info`, for the server,
the mount, check and the scrubber. Each delegates to the layer that knows; nothing here
changes anything."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.describe import describe
from ..core.listing import list_page, listdir
from ..core.namespace import Namespace
from ..core.namespace.rules import may_search_to
from ..core.nodes import WRITER_KINDS, Allocation, Directory, Node
from ..core.permissions import Credentials, R, allowed

if TYPE_CHECKING:
    from gpumemctl.protocol.replies import Node as NodeInfo


class Queries:
    def __init__(self, namespace: Namespace):
        self.ns = namespace

    @property
    def root(self) -> Directory:
        return self.ns.root

    def lookup(self, path: str, cred: Credentials, *, allow_root: bool = False) -> Node:
        return self.ns.lookup(path, cred, allow_root=allow_root)

    def lookup_allocation(self, path: str, cred: Credentials) -> Allocation:
        return self.ns.lookup_allocation(path, cred)

    def lookup_child(self, parent_id: int, name: str, cred: Credentials) -> Node:
        return self.ns.lookup_child(parent_id, name, cred)

    def info(self, path: str, cred: Credentials) -> NodeInfo:
        """The node with its holders, the names the caller may search to, and user
        metadata (the metadata only for a caller who may read the node: null otherwise, as
        meta_list would refuse it)."""
        node = self.ns.lookup(path, cred, allow_root=True)
        return describe(node, holders=True, metadata=allowed(node, cred, R),
                        cred=cred)

    def listdir(self, path: str, cred: Credentials, *, recursive: bool = False
                ) -> list[NodeInfo]:
        return listdir(self.ns, path, cred, recursive=recursive)

    def list_page(self, path: str, cred: Credentials, *, recursive: bool, after: str | None,
                  limit: int | None) -> tuple[list[NodeInfo], str | None]:
        """One page of listdir's entries after the cursor `after`, and the next page's
        cursor (None: the last page). daemon/core/listing.py."""
        return list_page(self.ns, path, cred, recursive=recursive, after=after, limit=limit)

    def node(self, node_id: int) -> Node:
        return self.ns.node(node_id)

    def node_or_none(self, node_id: int) -> Node | None:
        """The live node with this id (inode), or None."""
        return self.ns.node_or_none(node_id)

    def all_nodes(self) -> list[Node]:
        return self.ns.all_nodes()

    def node_count(self) -> int:
        return self.ns.node_count()

    def allocations(self) -> list[Allocation]:
        return self.ns.allocations()

    def may_search_to(self, node: Node, cred: Credentials) -> bool:
        return may_search_to(node, cred)

    def cache_generation(self, alloc: Allocation) -> int | None:
        """What a cache of the allocation's bytes (the mount's page cache) may be kept
        for: its data generation, which moves at every change made other than through the
        mount (ns.watchers.data_changed); None while a socket client holds it for writing
        (open rw, attach rw), whose writes land in the memory unannounced."""
        if alloc.holders_of(*WRITER_KINDS):
            return None
        return self.ns.watchers.data_generation(alloc)
