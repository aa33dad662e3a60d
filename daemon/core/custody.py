"""Custody: who holds the memory, in what order. The backend allocates and frees; the
keeper holds the fds of durable allocations across daemon crashes (daemon/keeper/link.py).
What a crash leaves behind is read at the next start by daemon/core/adoption.py.

The orders that make a kill -9 anywhere safe (docs/durability.md, "Crash ordering"):
- create durable: allocate, deposit the fds in the keeper, commit the registry row. A crash
  before the commit leaves fds in the keeper under an id the registry does not know: the
  next start frees them as orphans.
- remove durable: commit the deletion, withdraw from the keeper, free. A crash after the
  commit again leaves an orphan for the next start to free.
- resize durable (a new buffer): stage the new fds under -id, commit, deposit under id,
  withdraw -id (reallocate); start-up adopts whichever copy has the committed capacity.
- registry says durable but the keeper has nothing (reboot, GPU reset, keeper killed while
  the daemon was down): the allocation is `lost`, and stays listed until removed.
Transient allocations never outlive the daemon; their rows are dropped at the next start
(Adoption.reconcile_at_start).

Commits are the caller's: the verbs that need one here take it as a callable.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Callable

from gpumemctl.protocol import Busy, InternalError, InvalidState, NoMemory, format_size

from ..backends.arenas import ParitySpan
from ..backends.packed import PackedBackend
from ..backends.slabs import Slot, SlotParity
from ..keeper.link import FdStoreFull, KeeperGone, KeeperStalled
from ..registry import Registry
from .arenas import Arenas
from .fdbudget import FdBudget, fds_for
from .journal import Journal
from .namespace import Namespace
from .nodes import Allocation
from .parity import Parity, unsettled
from .slabs import Slabs

log = logging.getLogger("gpumemd")


@dataclasses.dataclass
class Deposit:
    """fds on their way to the keeper under `key`; `what` names the change for errors."""
    key: int
    what: str
    fds: list[int]
    meta: dict
    source: tuple[object, object] | None = None     # the (buffer, parity) of the fds

    def taken_from(self, alloc: Allocation) -> bool:
        """Whether the fds are still `alloc`'s memory (the objects: ids are reused)."""
        return self.source is not None and self.source[0] is alloc.buffer and \
            self.source[1] is alloc.parity


@dataclasses.dataclass
class Prepared:
    """A durable allocation's memory made before its row (prepare): the allocation, outside
    the tree, under a reserved id, and the ids reserved for its missing parent directories
    (so that parents keep smaller ids than their children)."""
    alloc: Allocation
    dir_ids: list[int]


class Custody:
    def __init__(self, registry: Registry, journal: Journal, backend: PackedBackend, keeper,
                 namespace: Namespace, parity: Parity, slabs: Slabs | None = None,
                 arenas: Arenas | None = None):
        self.slabs = slabs if slabs is not None else Slabs(registry, journal, backend, keeper)
        self.slabs.require_fds = self.require_fds
        # Parity in spans of shared arenas: an allocation's (Parity) and a new slab's. None:
        # every parity region a buffer of its own (the composition root turns them on).
        self.arenas = arenas if arenas is not None else \
            Arenas(registry, journal, backend, keeper, enabled=False)
        parity.arenas = self.slabs.arenas = self.arenas
        backend.pool.parity_span = self._slab_parity
        self.registry = registry
        self.journal = journal
        self.backend = backend
        self.keeper = keeper
        self.ns = namespace
        self.parity = parity
        self.fds: FdBudget | None = None      # gpumemd's descriptor budget (main.py sets it)

    def _slab_parity(self, device: str, nbytes: int, blocks: int) -> ParitySpan | None:
        """A new slab's parity: a span where arenas are on and it fits."""
        return self.arenas.take(device, nbytes, blocks) if self.arenas.fits(nbytes) else None

    def require_fds(self, uid: int | None, ecc: str) -> None:
        """NoMemory unless the descriptors a new allocation of `uid` will hold fit gpumemd's
        budget (daemon/core/fdbudget.py); uid None: only the total (root's doing, a restore)."""
        if self.fds is not None:
            self.fds.require(uid, fds_for(ecc))

    def allocate(self, dev, size: int, capacity: int, ecc: str, label: str,
                 uid: int | None = None):
        """Memory for a new allocation of `size`, once the device has room for its capacity
        and its parity (NoMemory/ENOSPC otherwise), and gpumemd descriptors for both. With
        the owner `uid`, a capacity that packs is a slot in one of its slabs."""
        if uid is not None and self.backend.packs(capacity, dev):
            return self.slabs.place(uid, dev.uuid, ecc, capacity)
        self.require_fds(None, ecc)
        self.backend.check_free(dev, capacity + self.parity.extra_for(ecc, dev, capacity),
                                requested=size)
        return self.backend.allocate(capacity, dev.uuid, label=label)

    @staticmethod
    def bind(alloc: Allocation) -> None:
        """A slot knows its allocation (the neighbour checks of verify: parity.py)."""
        if isinstance(alloc.buffer, Slot):
            alloc.buffer.tenant = alloc

    def deposit(self, alloc: Allocation) -> None:
        """Hand the keeper the allocation's fds: [data] or [data, parity]; a rollback of
        the transaction around it takes them back. A slot's memory is its slab's, which
        the keeper holds already: nothing to send."""
        deposit = self.handover(alloc)
        if deposit is None:
            return
        self.send(deposit)
        self.journal.on_rollback(lambda: self.withdraw_quietly(alloc.id))

    def handover(self, alloc: Allocation) -> Deposit | None:
        """What depositing `alloc` sends, its fds taken now (on the event loop): send() may
        then run on a worker thread while the loop goes on. None for a slot (its slab is
        kept already). A parity span is its arena's, kept already: the registry records
        where it is (Arenas.note)."""
        if isinstance(alloc.buffer, Slot):
            return None
        # where its parity is, recorded with the change that hands the keeper its memory
        self.arenas.note(alloc, in_tree=self.ns.node_or_none(alloc.id) is alloc)
        fds = self.backend.keeper_fds(alloc.buffer)
        if alloc.parity is not None and not isinstance(alloc.parity, (SlotParity, ParitySpan)):
            fds += self.backend.keeper_fds(alloc.parity)
        meta = {"capacity": alloc.capacity, "device": alloc.device,
                "registry": self.registry.identity.instance}
        if isinstance(alloc.parity, ParitySpan):    # no parity fd to tell its ECC by
            meta["ecc"] = alloc.ecc                 # (--adopt-orphans: orphan_ecc)
        if alloc.buffer.layout is not None:         # which fds are its extents
            meta["extents"] = alloc.buffer.layout
        return Deposit(alloc.id, f"make '{alloc.path or alloc.name}' durable", fds, meta,
                       (alloc.buffer, alloc.parity))

    def prepare(self, ids: list[int], cred, mode: int, size: int, dev, capacity: int,
                ecc: str, label: str) -> Prepared:
        """Memory and parity for a durable allocation to be created under ids[-1] once the
        keeper holds it (Creation.prepare); ids[:-1] for its parents. Named
        by `label`, the path asked for, while it is outside the tree (handover's errors)."""
        *dir_ids, node_id = ids
        alloc = Allocation(id=node_id, name=label, parent=None, uid=cred.uid, gid=cred.gid,
                           mode=mode, created_ns=0, modified_ns=0, changed_ns=0, size=size,
                           capacity=capacity, device=dev.uuid, durable=True, state="ready",
                           ecc=ecc, buffer=self.allocate(dev, size, capacity, ecc, label,
                                                         uid=cred.uid))
        prepared = Prepared(alloc, dir_ids)
        try:
            self.parity.ensure(alloc, fresh=True)
        except BaseException:
            self.abandon(prepared)
            raise
        return prepared

    def abandon(self, prepared: Prepared) -> None:
        """A prepared allocation that will not be created: its memory goes, and its deposit
        if the keeper took it."""
        self.withdraw_quietly(prepared.alloc.id)
        self.free(prepared.alloc)

    def send_begin(self, deposit: Deposit) -> Callable[[], None] | None:
        """send() with the answer awaited on the event loop only briefly (the keeper's
        call_begin): None when done, else what waits for the rest, for a worker thread."""
        try:
            rest = self.keeper.deposit_begin(deposit.key, deposit.fds, deposit.meta)
        except (KeeperGone, FdStoreFull) as exc:
            raise self._refused(deposit, exc) from None
        finally:
            for fd in deposit.fds:      # sent (or failed): the keeper has its own copies
                os.close(fd)
        if rest is None:
            return None

        def wait() -> None:
            try:
                rest()
            except KeeperGone as exc:
                raise self._refused(deposit, exc) from None
        return wait

    @staticmethod
    def _refused(deposit: Deposit, exc: KeeperGone | FdStoreFull) -> Exception:
        if isinstance(exc, KeeperStalled):   # busy, not broken: it works once it answers
            return Busy(f"cannot {deposit.what} now: {exc}")
        if isinstance(exc, FdStoreFull):     # a limit, as a quota is: exit 7 (ENOSPC)
            return NoMemory(f"cannot {deposit.what}: {exc}", details={"errno": "ENOSPC"})
        return InternalError(f"cannot {deposit.what}: {exc}")

    def send(self, deposit: Deposit) -> None:
        """Give the keeper a deposit, closing its fds. Touches nothing but the keeper link,
        so it is safe on a worker thread. A stalled keeper is Busy (it works again once it
        answers), a gone one an internal error."""
        try:
            self.keeper.deposit(deposit.key, deposit.fds, deposit.meta)
        except (KeeperGone, FdStoreFull) as exc:
            raise self._refused(deposit, exc) from None
        finally:
            for fd in deposit.fds:
                os.close(fd)

    def withdraw_quietly(self, key: int) -> None:
        """Take a deposit back that a rolled-back transaction made; a keeper that cannot be
        reached is reconciled later (Adoption.reconcile_keeper, redeposit_all, or the next
        start)."""
        with contextlib.suppress(KeeperGone):
            self.keeper.withdraw(key)

    def free(self, alloc: Allocation) -> None:
        with alloc.parity_lock:           # a worker may be encoding it (ParityJob)
            buf = alloc.buffer
            if buf is not None:
                self.backend.free(buf, self._settle_slot(alloc, buf))
                alloc.buffer = None
            self.parity.free(alloc)
            if alloc.tier is not None:    # asleep: its bytes in host memory (core/sleep.py)
                alloc.tier.release()
                alloc.tier = None

    def _settle_slot(self, alloc: Allocation, buf) -> bool:
        """A slot whose parity may be stale goes back zeroed and encoded: its neighbours'
        blocks then verify again. Returns whether it was (Slab.give_back's `zeroed`)."""
        if not (isinstance(buf, Slot) and buf.slab.parity is not None and unsettled(alloc)):
            return False
        self.backend.zero(buf, 0, buf.capacity)
        self.parity.encode_slot(buf)
        return True

    def free_memory(self, buf) -> None:
        """Free memory no allocation holds any more (a resize's old memory, a failed
        create's new one); a slab it empties goes at a sweep (Slabs.sweep)."""
        self.backend.free(buf)

    def stage(self, key: int, buf, capacity: int, device: str) -> None:
        """Deposit a resize's new memory under the staging key -id (reallocate)."""
        meta = {"capacity": capacity, "device": device,
                "registry": self.registry.identity.instance}
        if buf.layout is not None:
            meta["extents"] = buf.layout
        self.send(Deposit(key, "keep the resized memory", self.backend.keeper_fds(buf), meta))

    def require_could_fit(self, dev, size: int, ecc: str) -> None:
        """NoMemory with errno EFBIG for a size no device could ever hold: its footprint
        exceeds every device's total. A size that fits a device's total but not what is
        free now is check_free's (ENOSPC). `dev`: the device the request names; the
        message is the out-of-memory one (Backend.no_memory) and says why it is final."""
        if any(self._footprint(d, size, ecc) <= d.total for d in self.backend.devices()):
            return
        base = self.backend.no_memory(dev, self._footprint(dev, size, ecc), dev.free,
                                      requested=size)
        raise NoMemory(f"{base.message}; that exceeds the device's total memory: no device "
                       "here could ever hold it", details={**base.details, "errno": "EFBIG"})

    def _footprint(self, dev, size: int, ecc: str) -> int:
        """Bytes an allocation of `size` takes on `dev`: its capacity and its ECC parity."""
        capacity = self.backend.capacity_for(dev, max(size, 1))
        return capacity + self.parity.extra_for(ecc, dev, capacity)

    def allocate_pending(self, alloc: Allocation, dev, size: int,
                          capacity: int, commit: Callable[[], None]) -> None:
        """Same order as create: allocate, deposit (durable), commit. A crash before the
        commit leaves the row pending and the keeper's copy an orphan the next start frees."""
        if not self.backend.packs(capacity, dev):
            self.require_fds(alloc.uid, alloc.ecc)
            self.backend.check_free(dev, capacity + self.parity.extra_for(alloc.ecc, dev,
                                                                      capacity), requested=size)
        alloc.buffer = self.allocate(dev, size, capacity, alloc.ecc, alloc.path,
                                     uid=alloc.uid)
        self.bind(alloc)
        alloc.device, alloc.state = dev.uuid, "ready"
        try:
            self.backend.zero(alloc.buffer, 0, size)
            if alloc.durable and not alloc.unlinked:
                self.deposit(alloc)
            commit()
        except BaseException:
            if alloc.durable:
                with contextlib.suppress(KeeperGone):
                    self.keeper.withdraw(alloc.id)
            self.free(alloc)
            alloc.device, alloc.state = None, "pending"
            raise

    def reallocate(self, alloc: Allocation, dev, size: int,
                   capacity: int, commit: Callable[[], None]) -> None:
        """New memory for a new capacity, min(old, new size) bytes kept. Durable, the keeper
        never holds nothing for a committed allocation: (1) stage the new fds under -id,
        (2) commit, (3) deposit them under id (replacing the old copy), (4) withdraw -id. A
        crash before (2) restarts with the old capacity (the staged copy is freed); after
        it, start-up adopts whichever copy has the committed capacity (Adoption._adopt)."""
        with alloc.parity_lock:           # a worker may be encoding it (ParityJob)
            self._reallocate(alloc, dev, size, capacity, commit)

    def _reallocate(self, alloc: Allocation, dev, size: int,
                    capacity: int, commit: Callable[[], None]) -> None:
        if self._resize_in_place(alloc, dev, size, capacity, commit):
            return
        old, old_size = alloc.buffer, alloc.size
        kept_bytes = min(old_size, size)
        # Large memory on cuda: the new buffer shares the old one's extents (no copy);
        # the keeper learns the new list under -id as for new memory (below).
        # (A keeper without meta, systemd's fd store, could not tell extents apart.)
        new = self.backend.regrow(old, capacity) if self.keeper.keeps_meta else None
        regrown = new is not None       # it holds the old memory's bytes already
        if new is None:
            if not self.backend.packs(capacity, dev):
                self.backend.check_free(dev, capacity, requested=size)
            new = self.allocate(dev, size, capacity, alloc.ecc, alloc.path, uid=alloc.uid)
        kept = alloc.durable and not alloc.unlinked
        # A slot needs no deposit (its slab is kept), and memory of its own is staged
        # under -id; after the commit, what the keeper held of the old memory goes.
        staged = kept and not isinstance(new, Slot)
        try:
            if not regrown:
                self.backend.copy(old, new, kept_bytes)
            if size > kept_bytes:
                self.backend.zero(new, kept_bytes, size)
            if staged:
                self.stage(-alloc.id, new, capacity, dev.uuid)
            alloc.buffer = new
            self.bind(alloc)
            commit()
        except BaseException:
            alloc.buffer = old
            self.bind(alloc)
            if staged:
                with contextlib.suppress(KeeperGone):
                    self.keeper.withdraw(-alloc.id)
            self.free_memory(new)
            raise
        if kept:
            try:
                if staged:
                    self.deposit(alloc)
                    self.keeper.withdraw(-alloc.id)
                elif not isinstance(old, Slot):
                    self.keeper.withdraw(alloc.id)     # now in a slot: the slab is kept
            except (KeeperGone, InternalError) as exc:   # Adoption.redeposit_all repairs
                log.warning("keeper update after resizing '%s' failed: %s", alloc.path, exc)
        self.backend.free(old, self._settle_slot(alloc, old))

    def _resize_in_place(self, alloc: Allocation, dev, size: int,
                         capacity: int, commit: Callable[[], None]) -> bool:
        """Where the backend can (host memfds), change the capacity without a copy. The
        keeper holds the same memory, so only the order against the registry matters: grow
        before the commit, shrink after it; a crash between leaves the memory larger than
        the committed capacity, which adoption trims (HostBackend.adopt)."""
        if not self.backend.resizes_in_place or isinstance(alloc.buffer, Slot) or \
                self.backend.packs(capacity, dev):
            return False
        old_capacity, old_size = alloc.capacity or 0, alloc.size
        if capacity > old_capacity:
            self.backend.check_free(dev, capacity - old_capacity, requested=size)
            self.backend.resize_in_place(alloc.buffer, capacity)
            if size > old_size:            # past old_capacity the memory is new, so zero
                self.backend.zero(alloc.buffer, old_size, min(size, old_capacity))
            try:
                commit()
            except BaseException:
                self.backend.resize_in_place(alloc.buffer, old_capacity)
                raise
        else:
            commit()
            self.backend.resize_in_place(alloc.buffer, capacity)
        return True

    @staticmethod
    def require_memory(alloc: Allocation) -> None:
        if alloc.state in ("sleeping", "waking"):
            raise InvalidState(f"'{alloc.path}' is {alloc.state}: its bytes are being copied "
                               "between device and host memory; try again in a moment",
                               details={"errno": "EAGAIN"})
        if alloc.state == "asleep":
            raise InvalidState(f"'{alloc.path}' is asleep: its bytes wait in host memory and "
                               f"it has no device memory; `gpumemctl wake {alloc.path}` "
                               "brings it back", details={"errno": "EAGAIN", "by_copy": True})
        if alloc.state == "restoring":
            raise InvalidState(f"'{alloc.path}' is being restored from a snapshot; it is "
                               "served once the restore has checked every block",
                               details={"errno": "EAGAIN"})
        if alloc.state == "lost" and alloc.restore_queued:
            raise InvalidState(f"'{alloc.path}' is lost and queued for restore from a "
                               "snapshot (restore_on_start): it is served once restored",
                               details={"errno": "EAGAIN"})
        if alloc.state == "lost":
            raise InvalidState(f"'{alloc.path}' is lost: its memory is gone (a reboot or GPU "
                               "reset); `gpumemctl recover` tells more")
        if alloc.buffer is None:
            raise InvalidState(f"'{alloc.path}' has no memory yet (state {alloc.state})")


def require_extents_mapped(alloc: Allocation, extents: bool, what: str) -> None:
    """Memory made of several extents goes out as one fd each (info's `extents`), which
    only a client that says so (`extents: true`) maps; an older one would map the first
    extent as if it were all (docs/protocol.md, "Extents")."""
    layout = alloc.buffer.layout if alloc.buffer is not None else None
    if layout is not None and not extents:
        raise InvalidState(f"'{alloc.path}' is made of {len(layout)} extents (it grew past "
                           f"{format_size(layout[0])} without a copy), which this client "
                           f"cannot {what}: upgrade gpumemctl on the client side "
                           "(docs/protocol.md, \"Extents\")")
