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
