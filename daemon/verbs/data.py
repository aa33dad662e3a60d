"""The verbs of an allocation's bytes and size: resize (truncate, `user.gpu.size`), the
mount's writes and reads, the socket's read by copy, and fsync. The order of a resize's steps
is daemon/core/sizing.py's."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from gpumemctl.protocol import NoMemory, NotFound, UsageError

from ..backends import Backend
from ..core.custody import Custody
from ..core.describe import describe
from ..core.integrity import Integrity
from ..core.journal import Journal
from ..core.namespace import NOW, Namespace
from ..core.nodes import Allocation
from ..core.permissions import DAEMON, Credentials, R, W, require
from ..core.quotas import Quotas
from ..core.sessions import Session
from ..core.sizing import Sizing
from .plan import ParityWork, Plan

if TYPE_CHECKING:
    from gpumemctl.protocol.replies import Node as NodeInfo

# A write past the capacity grows it by this factor (capped at GROWTH_CAP bytes a step), so
# a file written sequentially is copied O(log n) times, not once per granule; the spare is
# trimmed when its last mount writer closes (HandleVerbs.release_mount).
GROWTH_FACTOR = 2
GROWTH_CAP = 1 << 30


class DataVerbs:
    def __init__(self, journal: Journal, namespace: Namespace, backend: Backend,
                 custody: Custody, integrity: Integrity, quotas: Quotas, sizing: Sizing):
        self.journal = journal
        self.ns = namespace
        self.backend = backend
        self.custody = custody
        self.integrity = integrity
        self.quotas = quotas
        self.sizing = sizing

    # ---- size -----------------------------------------------------------------------------
    def resize(self, alloc: Allocation, cred: Credentials, size: int, *,
               session: Session | None = None, authorised: bool = False) -> Allocation:
        """Set the size (truncate, or `user.gpu.size`; Sizing.resize has the rules). Needs
        write permission (unless `authorised`: the kernel checked it), and no read, write
        or attach holder outside `session` (Busy): those hold fds to the memory."""
        if not authorised:
            require(alloc, cred, W)
        before = alloc.size, alloc.capacity
        self.sizing.resize(alloc, cred, size, session)
        if (alloc.size, alloc.capacity) != before:
            self.ns.watchers.data_changed(alloc)  # a cache of its pages must follow the new size
        return alloc

    def resize_path(self, path: str, cred: Credentials, size: int,
                    session: Session | None = None) -> NodeInfo:
        """Op `resize` (`gpumemctl resize`): as truncate(2) through the mount. Bytes past
        the old size read as zeros; a shrink drops what lies past the new size."""
        alloc = self.resize(self.ns.lookup_allocation(path, cred), cred, size, session=session)
        return describe(alloc, cred=cred)

    def truncate_on_open(self, alloc: Allocation, cred: Credentials,
                         session: Session) -> None:
        """open(2) with O_TRUNC: truncate(2) to 0 (the kernel checked write permission).
        POSIX moves mtime and ctime even when it was empty."""
        before = alloc.modified_ns
        self.resize(alloc, cred, 0, session=session, authorised=True)
        if alloc.modified_ns == before:            # it was empty: nothing changed
            self.ns.attributes.setattr(alloc.id, cred, charge=self.quotas.check, mtime_ns=NOW,
                                       authorised=True)

    # ---- bytes ----------------------------------------------------------------------------
    def write_at(self, alloc: Allocation, offset: int, data, cred: Credentials | None = None,
                 *, session: Session | None = None, pinned_at: int | None = None) -> int:
        """Write `data` at `offset`. `cred` None: the caller (a handle opened for writing)
        has been authorised. A write past the size grows the allocation (past the capacity
        with room to spare, GROWTH_FACTOR; NoMemory/ENOSPC when the device is full). Size
        and times change in memory only: flush_times() commits them at release/fsync, as a
        filesystem does; a reallocation is committed at once. `pinned_at`: the host address
        of `data`, page-locked by pin_source (the mount's receive buffer), copied from there.

        The parity's WRITING mark (Integrity.writes_begin, a change that may fail) comes
        first: a write it refuses has changed nothing, the size included."""
        if cred is not None:
            require(alloc, cred, W)
        if not isinstance(offset, int) or offset < 0:
            raise UsageError(f"invalid offset {offset!r}")
        if not len(data):
            return 0            # as write(2): a write of nothing never extends the file
        end = offset + len(data)
        if alloc.state != "pending":
            self.custody.require_memory(alloc)   # lost, or being restored: refused here
        self.integrity.writes_begin(alloc)
        if end > alloc.size:
            self._grow_for_write(alloc, offset, end, session)
        self.custody.require_memory(alloc)
        self.integrity.writes_begin(alloc)      # memory a pending allocation just got
        if pinned_at is None:
            self.backend.write(alloc.buffer, offset, data)
        else:
            self.backend.write_pinned(alloc.buffer, offset, data, pinned_at)
        alloc.modified_ns = alloc.changed_ns = time.time_ns()
        self.integrity.note_written(alloc, offset, end)
        self.sizing.note_unflushed(alloc)
        return len(data)

    def pin_source(self, addr: int, size: int) -> Callable[[], None] | None:
        """Page-lock host memory that writes will come from (write_at's `pinned_at`), for
        copies to every device (Backend.host_register); returns what undoes it, or None
        where the backend copies by DMA from nothing (the host backend)."""
        devices = self.backend.devices()
        if not devices or not self.backend.registers_host_memory:
            return None
        return self.backend.host_register(addr, size, devices[0].uuid)

    def pins_sources(self) -> bool:
        """Whether pin_source would page-lock anything (the cuda backend's DMA)."""
        return self.backend.registers_host_memory

    def _grow_for_write(self, alloc: Allocation, offset: int, end: int,
                        session: Session | None) -> None:
        capacity = alloc.capacity or 0
        if alloc.state == "ready" and end <= capacity:
            if offset > alloc.size:
                # The gap reads as zeros, and its blocks are encoded with the write: past
                # the old size they may hold bytes (a shrink within the capacity keeps them)
                # whose parity a verify would call damage, and a repair put back.
                self.backend.zero(alloc.buffer, alloc.size, offset)
                self.integrity.note_written(alloc, alloc.size, offset)
            alloc.size = end
            self.ns.watchers.attrs_changed(alloc)
            self.journal.node_changed(alloc)
            return
        spare = None
        if alloc.state == "ready":
            spare = capacity + min(capacity * (GROWTH_FACTOR - 1), GROWTH_CAP)
        # `written`: the write marks the bytes for the sync's encode, which then covers a
        # slot taken here too (Sizing._slot_parity_later): one encode, not two.
        try:
            self.sizing.resize(alloc, DAEMON, end, session, capacity=spare, written=True)
        except NoMemory:
            if spare is None:
                raise
            self.sizing.resize(alloc, DAEMON, end, session, written=True)  # exact fit

    def read_at(self, alloc: Allocation, offset: int, length: int) -> bytes:
        """Up to `length` bytes at `offset`, clipped to the size (b"" at or past the end).
        Permission is the caller's (checked at open)."""
        return bytes(self.view_at(alloc, offset, length))

    def view_at(self, alloc: Allocation, offset: int, length: int) -> memoryview:
        """As read_at, as a view valid until the next verb (Backend.view): the mount's read
        path, which hands it straight to the kernel."""
        if not isinstance(offset, int) or offset < 0 or not isinstance(length, int) or \
                length < 0:
            raise UsageError(f"invalid read range: offset {offset!r}, length {length!r}")
        end = min(offset + length, alloc.size or 0)
        if end <= offset:
            return memoryview(b"")
        if not alloc.asleep:          # an asleep one is read from its host tier
            self.custody.require_memory(alloc)
        if alloc.damaged:
            self.integrity.require_undamaged(alloc, offset, end)
        if alloc.asleep:
            return alloc.tier.view[offset:end]
        return self.backend.view(alloc.buffer, offset, end - offset)

    def copy_out(self, path: str, cred: Credentials, offset: int, length: int,
                 expect_id: int | None = None) -> bytes:
        """The `read` request: up to `length` bytes at `offset` by copy (clipped to the size),
        for a caller with read permission; no fd, no holder (as the mount reads).
        `expect_id`: the allocation a reader of many pieces began with (a snapshot's copy
        of an asleep one): a name given to another meanwhile is refused, not read."""
        alloc = self.ns.lookup_allocation(path, cred)
        if expect_id is not None and alloc.id != expect_id:
            raise NotFound(f"'{path}' names another allocation than the one being read "
                           f"(id {alloc.id}, not {expect_id}): it was renamed or replaced")
        require(alloc, cred, R)
        if not alloc.asleep:          # an asleep one is read from its host tier
            self.custody.require_memory(alloc)
        if offset < 0 or length < 0:
            raise UsageError(f"invalid read range: offset {offset}, length {length}: "
                             "expected offsets and lengths of 0 or more")
        length = max(0, min(offset + length, alloc.size or 0) - offset)
        if alloc.damaged and length:
            self.integrity.require_undamaged(alloc, offset, length)
        return self.read_at(alloc, offset, length)

    # ---- committing what writes changed -------------------------------------------------------
    def flush_times(self, alloc: Allocation) -> None:
        """Commit the size and modified time that write_at() changed in memory."""
        self.sizing.flush_times(alloc)

    def settle(self, alloc: Allocation) -> None:
        """The parity a mount close left pending for `alloc` and its block's neighbours,
        settled now (Sizing.pending): before a removal, which would otherwise zero and
        encode the slot of each pending file on its own."""
        self.sizing.pending.settle_near(alloc)

    def sync(self, alloc: Allocation) -> Plan[None]:
        """fsync(2): size and times committed, then the parity of the range written through
        the daemon since the last sync brought up to date, encoded off the loop; the last
        step commits what changed meanwhile and the parity's end (the WRITING mark, healed
        blocks) in one change."""
        self.sizing.flush_times(alloc)
        # Its block's pending neighbours with it, in one encode (Sizing.pending): none is
        # left for a later encode of the block to cover damage found after the fsync.
        self.sizing.pending.settle_near(alloc, synced=True)
        job = self.integrity.job_written(alloc)
        yield ParityWork(job)
        self.sizing.flush_written(alloc, job)
