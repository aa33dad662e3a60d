"""The verbs of bytes written by copy through the socket (`write_many`, issue 26): the bytes
travel in the request, never as an fd, so nothing of the allocation's memory is handed out
and a small allocation stays in its slab (an `open` would move it into memory of its own
first: daemon/core/sizing.py `own_memory`).

One write is the socket's write path without the fd: the permission of `open` with `rw`
(read and write), its lock (one writer or many readers: busy while another handle or
attachment holds it), never past the size; then, as a write and fsync through the mount,
the WRITING mark, the bytes, the parity of what is unsynced (off the loop when large), and
in one change the times and the `write` event. The mount's cached pages of it go at once.
"""
from __future__ import annotations

import time

from gpumemctl.protocol import out_of_range

from ..backends.packed import PackedBackend
from ..core.custody import Custody
from ..core.holders import Holders
from ..core.integrity import Integrity
from ..core.journal import Journal
from ..core.namespace import Namespace
from ..core.permissions import Credentials, R, W, require
from ..core.sizing import Sizing
from .plan import ParityWork, Plan


class CopyVerbs:
    def __init__(self, journal: Journal, namespace: Namespace, backend: PackedBackend,
                 custody: Custody, integrity: Integrity, holders: Holders, sizing: Sizing):
        self.journal = journal
        self.ns = namespace
        self.backend = backend
        self.custody = custody
        self.integrity = integrity
        self.holders = holders
        self.sizing = sizing

    def write(self, path: str, cred: Credentials, offset: int, data: bytes) -> Plan[dict]:
        """`data` at `offset` of the allocation at `path`, wholly within its size (nothing is
        written otherwise). Returns {offset, bytes}."""
        alloc = self.ns.lookup_allocation(path, cred)
        require(alloc, cred, R | W)
        self.custody.require_memory(alloc)     # lost, restoring, pending: refused here
        size, end = alloc.size or 0, offset + len(data)
        if offset < 0 or end > size:
            raise out_of_range(alloc.path, offset, len(data), size, writing=True,
                               done="nothing was written")
        self.holders.require_lockable(alloc, writable=True)
        if not data:
            return {"offset": offset, "bytes": 0}
        self.integrity.writes_begin(alloc)     # a change that may fail: then nothing written
        self.backend.write(alloc.buffer, offset, data)
        alloc.modified_ns = alloc.changed_ns = time.time_ns()
        self.integrity.note_written(alloc, offset, end)
        self.sizing.note_unflushed(alloc)
        self.ns.watchers.data_changed(alloc)   # the mount's cached pages of it are stale
        job = self.integrity.job_written(alloc)
        yield ParityWork(job)
        if job is not None and not job.done:
            job.run()                          # before the change opens, as a close does
        with self.journal.change(durable=False, batch=True):
            self.sizing.flush_written(alloc, job)
            if not alloc.unlinked:
                self.journal.event("write", alloc, cred, offset=offset, bytes=len(data))
        return {"offset": offset, "bytes": len(data)}
