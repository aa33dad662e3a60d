"""What the kernel caches of the mount, and how it is told that something changed.

Files on the mount go through the kernel's page cache (docs/mount.md, "Consistency"). The
kernel keeps a file's pages while it knows the inode; the daemon drops them in two ways:

- at once, when an allocation's bytes or size change by another path than the mount (a
  socket writer's close, a detach or seal, a resize through the socket, a repair): the
  manager's watchers queue an invalidation of the inode's pages and attributes, which the
  socket server delivers (settle) before it answers the request that made the change;
- at open(2), where the pages may not be kept (`keep_cache` False): when the allocation's
  data generation moved since the kernel's pages were filled, or while a socket client holds
  it for writing (its bytes change under the cache unannounced).

Invalidations are delivered from a worker thread: the kernel may need a lock held by a request
the event loop is about to answer, and dropping a dirty page of a shared mapping makes the
kernel write it back first, a request this loop must answer.
"""
from __future__ import annotations

import errno
import logging

import pyfuse3
import trio

from gpumemctl.protocol import name_bytes

from ..core.nodes import Node

log = logging.getLogger("gpumemd.fs")

# An invalidation: (inode, name) drops a cached entry of directory `inode`; (inode, None) the
# attributes of `inode`; (inode, DATA) its pages and attributes. A real name is never empty.
DATA = b""
Invalidation = tuple[int, bytes | None]


class PageCache:
    """Per inode, the data generation the kernel's pages hold (Queries.cache_generation
    when the file was last opened), so that open(2) keeps them only when
    nothing changed since."""

    def __init__(self) -> None:
        self._filled: dict[int, int] = {}

    def keep(self, inode: int, generation: int | None) -> bool:
        """Whether an open of `inode` may keep the kernel's pages; the kernel drops them
        otherwise, so from now on they hold `generation` (None: they are never kept)."""
        keep = generation is not None and self._filled.get(inode) == generation
        if generation is None:
            self._filled.pop(inode, None)
        else:
            self._filled[inode] = generation
        return keep

    def forget(self, inode: int) -> None:
        """The kernel forgot the inode, and its pages with it."""
        self._filled.pop(inode, None)


def invalidate(batch: list[Invalidation]) -> None:
    """Tell the kernel to forget cached entries, attributes or pages (see Invalidation)."""
    for inode, name in batch:
        try:
            if name is None or name == DATA:
                pyfuse3.invalidate_inode(inode, attr_only=name is None)
            else:
                pyfuse3.invalidate_entry(inode, name)
        except OSError as exc:
            if exc.errno != errno.ENOENT:      # ENOENT: nothing was cached
                log.warning("cannot invalidate inode %d %r: %s", inode, name, exc)


class KernelCache:
    """What the kernel holds of the mount, and what it must hear of: the inodes it knows
    (their lookup counts, and their nodes, so that an open file whose name is gone is still
    found), the data generation of their pages (PageCache), and, as the namespace's watcher,
    the changes other paths make, queued for settle().

    The kernel must hear of a change before the socket client that made it gets its answer
    ("agree at once"), but telling it from the loop could deadlock: the kernel may wait for
    a directory lock held by a request that the loop is to answer. So changes are queued
    here and the socket server awaits settle() before it replies, which delivers them from
    a worker thread while the loop keeps answering the kernel. A change the mount's own
    request makes (own_request) is the kernel's own doing: it is not queued."""

    def __init__(self) -> None:
        self.pages = PageCache()
        self.mounted = False
        self.own_request = False         # a mount's request (or a plan's step) is running
        self._lookups: dict[int, int] = {}      # inode -> the kernel's lookup count
        self._known: dict[int, Node] = {}       # inode -> node, while the kernel has it
        self._stale: list[Invalidation] = []    # delivered by settle()

    # ---- the kernel's lookup counts -------------------------------------------------------
    def remember(self, node: Node) -> None:
        """The kernel was answered `node` by a lookup (or an entry it counts as one)."""
        self._lookups[node.id] = self._lookups.get(node.id, 0) + 1
        self._known[node.id] = node

    def known(self, inode: int) -> Node | None:
        return self._known.get(inode)

    def forget(self, inode: int, count: int) -> None:
        """The kernel dropped `count` lookups of `inode`; at none, the inode and its pages."""
        left = self._lookups.get(inode, 0) - count
        if left > 0:
            self._lookups[inode] = left
        else:
            self._lookups.pop(inode, None)
            self._known.pop(inode, None)
            self.pages.forget(inode)

    # ---- the namespace's watcher: changes made through the socket API ---------------------
    def entry_changed(self, parent_id: int, name: str) -> None:
        if self.mounted and not self.own_request and \
                (parent_id == pyfuse3.ROOT_INODE or parent_id in self._known):
            self._stale.append((parent_id, name_bytes(name)))

    def attrs_changed(self, node_id: int) -> None:
        if self.mounted and not self.own_request and node_id in self._known:
            self._stale.append((node_id, None))

    def data_changed(self, node_id: int) -> None:
        """Bytes or size changed by another path: the kernel's pages of the file go too.
        The mount's own truncates are the kernel's to apply."""
        if self.mounted and not self.own_request and node_id in self._known:
            self._stale.append((node_id, DATA))

    async def settle(self) -> None:
        if self._stale and self.mounted:
            batch, self._stale = self._stale, []
            await trio.to_thread.run_sync(invalidate, batch)
