"""Sizing: an allocation's size and capacity, changed in crash-safe order (custody has the
keeper order of a reallocation), and what writes change in memory until it is committed: the
size and times (flush_times), and the parity of small files the mount closed (PendingParity).
The verbs that resize (truncate, `user.gpu.size`, a write past the end, the mount's last
close giving back spare capacity) all come here.
"""
from __future__ import annotations

import collections
import time

from gpumemctl.protocol import InvalidState, UsageError, round_up

from ..backends.packed import PackedBackend
from ..backends.slabs import Slab, Slot, SlotParity, placement
from ..ecc.layout import BLOCK
from ..registry import Registry
from .custody import Custody
from .holders import IO_KINDS, Holders
from .integrity import Integrity, ParityJob
from .journal import Journal
from .namespace import Namespace
from .nodes import Allocation
from .parity import block_range, protected_blocks
from .permissions import DAEMON, Credentials
from .quotas import Quotas
from .sessions import Session


class Sizing:
    def __init__(self, registry: Registry, journal: Journal, namespace: Namespace,
                 backend: PackedBackend, custody: Custody, integrity: Integrity, holders: Holders,
                 quotas: Quotas):
        self.registry = registry
        self.journal = journal
        self.ns = namespace
        self.backend = backend
        self.custody = custody
        self.integrity = integrity
        self.holders = holders
        self.quotas = quotas
        self._dirty: set[int] = set()        # ids whose size/times await flush_times()
        self.pending = PendingParity(journal, integrity)
        integrity.settle_pending = self.pending.settle_near    # before a verify judges

    # ---- size and capacity ----------------------------------------------------------------
    def resize(self, alloc: Allocation, cred: Credentials, size: int,
               session: Session | None, *, capacity: int | None = None,
               written: bool = False) -> None:
        """Set the size; no read, write or attach holder outside `session` may hold it
        (Busy): those hold fds to the memory.

        - pending: allocate round_up(size); size 0 leaves it pending.
        - same capacity: only the size changes.
        - new capacity (at least one granule: a ready allocation keeps memory at size 0):
          new memory, min(old, new size) bytes kept (Custody.reallocate has the keeper order).
        `capacity`: what to allocate if the memory must change (default: the size rounded up
        to the granularity). Bytes past the size are undefined (an attached client may write
        anywhere in the capacity): whatever a grow exposes is zeroed, so it reads as zeros.
        `written`: the caller writes up to the new size at once (a write past the end), so
        a slot the allocation comes to is encoded with that write, not now as well
        (_slot_parity_later)."""
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise UsageError(f"invalid size {size!r}: must be a whole number of bytes >= 0")
        if alloc.state not in ("pending", "ready"):
            raise InvalidState(f"'{alloc.path}' is {alloc.state}: it cannot be resized")
        self.holders.require_no_others(alloc, session, "resized")
        if size == alloc.size or (alloc.state == "pending" and size == 0):
            return
        dev = self.backend.device(alloc.device)
        fit = self.backend.capacity_for(dev, size)
        if capacity is not None and capacity > fit:
            # Growth with room to spare (writes past the end): memory of its own, whole
            # granules, while it grows; its last close packs it into a slot again if it is
            # small then (trim), one copy instead of one per size class passed through.
            capacity = max(dev.granularity, round_up(capacity, dev.granularity))
        else:
            capacity = fit
        held = alloc.capacity or 0 if alloc.buffer is not None else 0
        if size > alloc.size:
            self.custody.require_could_fit(dev, size, alloc.ecc)
        self.quotas.check(alloc.uid, capacity - held)
        old_size, fresh = alloc.size, alloc.state == "pending"
        # The memory a write gives a transient file the mount created empty is no event of
        # its own, as a write that grows a file within its capacity is none: a `tar -xf`
        # or `cp` logs one `create` per file, not a `resize` beside it (issue 26).
        event = not (fresh and written and not alloc.durable)

        def commit() -> None:    # looked up at call time: tests stand a crash in for it
            self._commit_size(alloc, cred, size, capacity, old_size, event=event)
        # One hold of the parity lock from the new memory to the parity sized for it: a
        # ParityJob on a worker thread must never see the new buffer and capacity with the
        # old parity region (its checksums sit where the old block count puts them).
        with alloc.parity_lock:
            if fresh:
                self.custody.allocate_pending(alloc, dev, size, capacity, commit)
            elif capacity == alloc.capacity:          # keep the memory: no copy at all
                if size > alloc.size:
                    self.backend.zero(alloc.buffer, alloc.size, size)
                commit()
            else:
                self.custody.reallocate(alloc, dev, size, capacity, commit)
            if not (written and self._slot_parity_later(alloc)):
                self._protect_resized(alloc, old_size, fresh)

    def trim(self, alloc: Allocation) -> None:
        """Give back capacity a write left spare (one device copy), unless a socket client
        holds an fd to this memory."""
        if alloc.state != "ready" or alloc.holders_of(*IO_KINDS):
            return
        dev = self.backend.device(alloc.device)
        fit = self.backend.capacity_for(dev, alloc.size)
        if (alloc.capacity or 0) > fit:
            with alloc.parity_lock:               # as in resize: memory and parity together
                self.custody.reallocate(alloc, dev, alloc.size, fit,
                                        lambda: self._commit_capacity(alloc, fit))
                self._protect_resized(alloc, alloc.size, fresh=False)

    def own_memory(self, alloc: Allocation) -> None:
        """Move a small allocation out of its slab into memory of its own (whole granules),
        before an fd of it goes to a client: a slab's fd would give the whole slab
        (docs/security.md, "Slabs"). One device copy of at most half a granule."""
        if not isinstance(alloc.buffer, Slot):
            return
        self.holders.require_no_others(alloc, None, "moved out of its slab")
        dev = self.backend.device(alloc.device)
        capacity = max(dev.granularity, round_up(alloc.size, dev.granularity))
        with alloc.parity_lock:
            self.custody.reallocate(alloc, dev, alloc.size, capacity,
                                    lambda: self._commit_capacity(alloc, capacity))
            self._protect_resized(alloc, alloc.size, fresh=False)

    @staticmethod
    def shares_slab_with(alloc: Allocation, uid: int) -> bool:
        """Whether `uid` may be given the descriptor of the slab `alloc` is in, mapping the
        allocation at its offset (docs/storage.md, "The export rule"): the slab's owner,
        owning the allocation; or root, who may read every user's memory anyway (a
        restore of users' allocations by root fills them where they are)."""
        buf = alloc.buffer
        return isinstance(buf, Slot) and (uid == 0 or buf.slab.uid == uid == alloc.uid)

    def _protect_resized(self, alloc: Allocation, old_size: int, fresh: bool) -> None:
        if self.integrity.protect_resized(alloc, old_size, fresh) and alloc.durable \
                and not alloc.unlinked:
            self.custody.deposit(alloc)          # new parity memory: the keeper follows

    def _slot_parity_later(self, alloc: Allocation) -> bool:
        """A write follows at once: the slot the allocation just came to takes its slab's
        parity without an encode (about 0.3 ms for its 128 KiB block on a CPU), and its
        bytes are marked written instead, so that the sync that encodes the write encodes
        them with it. Until then the allocation is unsettled (its dirty range), so no verify
        judges its block. Not for a durable allocation without the WRITING mark (one that
        was pending): a crash before the write marks it would leave parity the next start
        trusts."""
        buf = alloc.buffer
        if alloc.ecc != "rs" or not isinstance(buf, Slot) or buf.slab.parity is None or \
                alloc.unsealed or (alloc.durable and not alloc.writing) or \
                self.integrity.parity.fits(alloc):
            return False
        self.integrity.parity.ensure(alloc, encode=False)      # the slab's, not encoded
        self.integrity.note_written(alloc, 0, alloc.size)
        return True

    def _commit_size(self, alloc: Allocation, cred: Credentials, size: int, capacity: int,
                     old_size: int, *, event: bool = True) -> None:
        """Record size and capacity (memory and registry together, or neither); `event`:
        with a `resize` event (without one, monitors are still told)."""
        now = time.time_ns()
        with self.journal.change(durable=alloc.durable, batch=not alloc.durable):
            self.journal.keep(alloc, "size", "capacity", "modified_ns", "changed_ns")
            alloc.size, alloc.capacity = size, capacity
            alloc.modified_ns = alloc.changed_ns = now
            self.registry.nodes.update(alloc.id, size=size, capacity=capacity,
                                      device=alloc.device, state=alloc.state,
                                      modified_ns=now, changed_ns=now,
                                      **placement(alloc.buffer))
            if event:
                self.journal.event("resize", alloc, cred, size=size, capacity=capacity,
                                   old_size=old_size)
            else:
                self.journal.node_changed(alloc)
        self._dirty.discard(alloc.id)
        self.integrity.changed_all(alloc)      # a resize moves or zeroes bytes
        self.ns.watchers.attrs_changed(alloc)

    def _commit_capacity(self, alloc: Allocation, capacity: int) -> None:
        """Record a trimmed capacity. The bytes and the size are what they were, so no time
        moves: this runs after a close's parity work, and a time set meanwhile (tar's and
        `rsync -a`'s utimensat right after close) must stay (issue 24)."""
        with self.journal.change(durable=alloc.durable, batch=not alloc.durable):
            self.journal.keep(alloc, "capacity")
            alloc.capacity = capacity
            self.registry.nodes.update(alloc.id, capacity=capacity, device=alloc.device,
                                      state=alloc.state, **placement(alloc.buffer))
            self.journal.event("resize", alloc, DAEMON, size=alloc.size, capacity=capacity,
                               old_size=alloc.size)
        self.integrity.changed_all(alloc)      # new memory: what tracked changes say goes
        self.ns.watchers.attrs_changed(alloc)

    # ---- size and times changed in memory by writes -------------------------------------------
    def note_unflushed(self, alloc: Allocation) -> None:
        """A write changed the size or times in memory only: flush_times() commits them at
        release/fsync, as a filesystem does."""
        self._dirty.add(alloc.id)

    def flush_times(self, alloc: Allocation) -> None:
        """Commit the size and modified time that writes changed in memory (within the
        caller's change, if it is in one: they stay unflushed if it fails)."""
        if alloc.id not in self._dirty:
            return
        if alloc.unlinked:
            self._dirty.discard(alloc.id)
            return
        with self.journal.change(durable=alloc.durable, batch=not alloc.durable):
            self.registry.nodes.update(alloc.id, size=alloc.size,
                                      modified_ns=alloc.modified_ns,
                                      changed_ns=alloc.changed_ns)
            self._dirty.discard(alloc.id)
            self.journal.on_rollback(lambda: self._dirty.add(alloc.id))

    def flush_written(self, alloc: Allocation, job: ParityJob | None) -> None:
        """The last step of fsync and of a mount writer's last close: the size and times
        writes changed, and the end of their parity job (Integrity.finish: the WRITING mark
        gone, blocks written whole healed), in one change that is taken back whole if it
        fails. The job runs here first if no worker ran it; with nothing to record, no
        change is opened."""
        if job is not None and not job.done:
            job.run()
        finishing = job is not None and (job.alloc.writing or bool(job.alloc.damaged))
        if alloc.id not in self._dirty and not finishing:
            self.integrity.finish(job)
            return
        with self.journal.change(durable=False, batch=True):
            self.flush_times(alloc)
            if job is not None:
                self.journal.keep(job.alloc, "writing", "dirty_from", "dirty_to",
                                  "damaged", "state")
            self.integrity.finish(job)


class PendingParity:
    """The parity of small files that the mount closed, encoded by a later pass (issue 26).

    32 slots of 4 KiB share one 128 KiB block of their slab's parity, so a close that
    encoded its block would encode each block once per file of a `tar -xf`. The close of a
    file in a slot leaves its dirty range instead (`accepts`), and a pass encodes each block
    once for all the files written in it, then settles them in one change: the dirty range
    cleared, a durable one's WRITING mark gone, as the close would have done (Integrity.
    finish). The pass runs every few tenths of a second (the mount's, daemon/fs/mount.py),
    before a verify or scrub judges a block (settle_near) and at a clean stop; an fsync
    encodes its own file at once (DataVerbs.sync).

    While pending, an allocation is unsettled (its dirty range: parity.unsettled), so a
    verify skips it and its neighbours, compaction leaves them, and its removal gives the
    slot back zeroed and encoded (Custody.free). A kill -9 meanwhile: a durable one carries
    the WRITING mark (its block is rebuilt at the start); a transient one is dropped. A
    transient file whose block holds a durable neighbour is encoded at its close as before:
    after a kill -9 the neighbour's block would otherwise not agree with its parity."""

    def __init__(self, journal: Journal, integrity: Integrity):
        self.journal = journal
        self.integrity = integrity
        self._allocs: dict[int, Allocation] = {}    # by id, in the order of their closes

    def __len__(self) -> int:
        return len(self._allocs)

    def accepts(self, alloc: Allocation) -> bool:
        """Whether the parity of what was written to `alloc` may wait for the pass."""
        buf = alloc.buffer
        if not (isinstance(buf, Slot) and isinstance(alloc.parity, SlotParity) and
                alloc.state == "ready" and alloc.dirty_to > alloc.dirty_from and
                not alloc.unsealed and not alloc.unlinked):
            return False
        if alloc.durable:
            return alloc.writing
        for slot in buf.slab.neighbours(buf):      # every close on the mount: a plain loop
            tenant = slot.tenant
            if isinstance(tenant, Allocation) and tenant.durable:
                return False
        return True

    def add(self, alloc: Allocation) -> None:
        self._allocs[alloc.id] = alloc

    def settle_near(self, alloc: Allocation, synced: bool = False) -> None:
        """Settle now `alloc` and the pending allocations that share its blocks: before a
        verify judges them (rather than skipping them as unsettled), a removal, a socket
        writer's open. `synced`: an fsync of `alloc`, which is settled with them (one
        encode of the block), open for writing as it is; a later encode of the block for
        them would also encode over any damage found in it after the fsync."""
        if not self._allocs:
            return
        group = self._take_group(alloc)
        if group and synced and alloc not in group:
            group.append(alloc)
        if group:
            self._settle(group, alloc if synced else None)

    def steps(self):
        """The pass, in pieces of at most the codec's piece of blocks (about 2.5 ms on a
        CPU): a generator that yields what is left after each piece."""
        todo = collections.deque(self._allocs.values())   # not those put back (_settle)
        while todo:
            batch: list[Allocation] = []
            blocks: set[object] = set()
            while todo and len(blocks) < self.integrity.chunk_blocks:
                alloc = todo.popleft()
                if self._allocs.get(alloc.id) is alloc:
                    blocks |= _slab_blocks(alloc) or {alloc.id}
                    batch += self._take_group(alloc)
            self._settle(batch)
            yield len(self._allocs)

    def settle_all(self) -> None:
        for _ in self.steps():
            pass

    def _take_group(self, alloc: Allocation) -> list[Allocation]:
        """`alloc` and its pending block neighbours, out of the pending set."""
        group = [alloc]
        if isinstance(alloc.buffer, Slot):
            group += [s.tenant for s in alloc.buffer.slab.neighbours(alloc.buffer)
                      if isinstance(s.tenant, Allocation)]
        return [a for a in group if self._allocs.pop(a.id, None) is not None]

    def _settle(self, batch: list[Allocation], synced: Allocation | None = None) -> None:
        """Encode each block of `batch` once, then finish them all in one change. One that
        a mount writer holds again stays pending (its close comes), unless it is `synced`;
        one gone, or settled meanwhile (an fsync), leaves. A failed change (a full state
        disk) leaves them all pending, for the next pass."""
        jobs: list[ParityJob] = []
        encoded: set[tuple[Slab, int]] = set()
        waiting: list[Allocation] = []
        for alloc in batch:
            if alloc is not synced and alloc.holders_of("mount-w"):
                waiting.append(alloc)
                continue
            job = self.integrity.job_written(alloc) if alloc.buffer is not None else None
            if job is None:
                continue
            blocks = _slab_blocks(alloc)
            if blocks and blocks <= encoded:
                job.done = True         # its block was encoded above, after its last write
            else:
                job.run()
                encoded |= blocks
            jobs.append(job)
        for alloc in waiting:
            self.add(alloc)
        try:
            with self.journal.change(durable=False, batch=True):
                for job in jobs:
                    self.journal.keep(job.alloc, "writing", "dirty_from", "dirty_to",
                                      "damaged", "state")
                    self.integrity.finish(job)
        except BaseException:
            for job in jobs:
                if job.alloc is not synced:
                    self.add(job.alloc)
            raise


def _slab_blocks(alloc: Allocation) -> set[tuple[Slab, int]]:
    """The slab blocks (slab, index) whose parity covers what `alloc` has written since
    its sync; empty for memory of its own (its blocks are its alone)."""
    buf = alloc.buffer
    if not isinstance(buf, Slot):
        return set()
    end = min(alloc.dirty_to, protected_blocks(alloc) * BLOCK)
    first = buf.offset // BLOCK
    return {(buf.slab, first + b) for b in block_range(alloc.dirty_from, end)}
