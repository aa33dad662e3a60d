"""The threads a snapshot's file and object I/O and its checksums run on (the stores'
and blocks.py's), one pool per process."""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

PIECE = 8 << 20            # a write or read is cut into pieces of this size for the I/O pool
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _forget_pool() -> None:
    """In a forked child: the parent's threads are not there, so its pool is unusable."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)


def io_pool() -> ThreadPoolExecutor:
    """Threads for file I/O and checksums: preadv/pwrite and xxhash release the GIL."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=min(16, max(4, os.cpu_count() or 1)),
                                       thread_name_prefix="gpumemctl-snap")
        return _pool
