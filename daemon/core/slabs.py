"""Slab keeping: the registry rows and the keeper's deposits of the slabs that small
allocations live in (daemon/backends/slabs.py has the slabs themselves, docs/storage.md the
design).

Every slab is deposited in the keeper when it is made, under SLAB_KEY_BASE + its id (its
data; its parity too where that is a buffer of its own, as before schema 13: a span of a
parity arena is kept with its arena, and the slab's row says where), whatever its
allocations' durability: so a durable allocation in a slab is
made, moved and removed by registry commits alone, with no keeper call of its own. At a
restart the transient allocations' rows are dropped as always, and their slots are free.

Orders (a kill -9 anywhere is safe):
- new slab: memory, deposit, commit its row. A crash before the commit leaves a deposit the
  registry does not list: the next start frees it.
- an allocation takes a slot: its row (slab, slot) is committed with the allocation's change;
  a crash before leaves the slot free.
- an empty slab goes: commit the row's deletion, withdraw, free.
"""
from __future__ import annotations

import contextlib
import logging
import os
import time

from gpumemctl.protocol import GpumemError, InternalError

from ..backends.arenas import ParitySpan, span_bytes
from ..backends.packed import PackedBackend
from ..backends.slabs import Slab, Slot
from ..ecc.layout import parity_bytes
from ..keeper.link import KeeperGone
from ..registry import Registry
from .arenas import ARENA_KEY_BASE, Arenas, drop_unheld_and_residue
from .journal import Journal

log = logging.getLogger("gpumemd")

SLAB_KEY_BASE = 1 << 48          # keeper keys of slabs: past every node id
IDLE_SECONDS = 0.25              # an emptied slab is freed after this long unused (sweep)


def is_slab_key(key: int) -> bool:
    return SLAB_KEY_BASE <= key < ARENA_KEY_BASE


class Slabs:
    def __init__(self, registry: Registry, journal: Journal, backend: PackedBackend, keeper):
        self.registry = registry
        self.journal = journal
        self.backend = backend
        self.keeper = keeper
        self.require_fds = lambda uid, ecc: None       # gpumemd's fd budget (Custody sets it)
        self.arenas: Arenas | None = None    # daemon/core/arenas.py's (Custody sets it)

    # ---- a slot for a new small allocation ------------------------------------------------
    def place(self, uid: int, device: str, ecc: str, capacity: int) -> Slot:
        """A free slot of class `capacity` in one of `uid`'s slabs on `device`, making a new
        slab when none has room."""
        slot = self.backend.pool.find_slot(uid, device, ecc, capacity)
        if slot is None:
            self.sweep(IDLE_SECONDS)
            slot = self._new_slab(uid, device, ecc, capacity).take()
        if not slot.clean:      # an earlier tenant's bytes: a new object reads zeros
            self.backend.zero(slot, 0, slot.capacity)
        return slot

    def _new_slab(self, uid: int, device: str, ecc: str, slot: int) -> Slab:
        nbytes = self.backend.pool.next_slab_bytes(uid, device, ecc, slot)
        self.require_fds(uid, ecc)          # its data's and parity's, as an allocation's
        with self.journal.change(durable=True):
            slab_id = self.registry.slabs.insert(uid, device, ecc, slot, nbytes)
            slab = self.backend.pool.make_slab(slab_id, uid, device, ecc, slot, nbytes)
            if isinstance(slab.parity, ParitySpan):
                self.registry.arenas.slab_parity(slab_id, slab.parity.arena.id,
                                                 slab.parity.offset)
            try:
                self._deposit(slab)
            except BaseException:
                self.backend.pool.drop_slab(slab)
                raise
            self.journal.on_rollback(lambda: self._forget(slab))
        log.debug("slab %d made: uid %d, %d slots of %d bytes", slab.id, uid,
                  nbytes // slot, slot)
        return slab

    def close(self) -> None:
        """A clean stop: the daemon lets go of every slab's memory (its own descriptors);
        the keeper keeps holding them, and the registry their rows."""
        pool = self.backend.pool
        for slab in list(pool.slabs.values()):
            slab.used.clear()
            pool.drop_slab(slab)

    def keys(self) -> set[int]:
        """The keeper keys of the slabs held now."""
        return {SLAB_KEY_BASE + slab_id for slab_id in self.backend.pool.slabs}

    def redeposit_all(self) -> int:
        """After a keeper restart (or stall): every slab deposited again."""
        for slab in list(self.backend.pool.slabs.values()):
            self._deposit(slab)
        return len(self.backend.pool.slabs)

    def _deposit(self, slab: Slab) -> None:
        fds = self.backend.raw.keeper_fds(slab.data)
        if slab.parity is not None and not isinstance(slab.parity, ParitySpan):
            fds += self.backend.raw.keeper_fds(slab.parity)
        try:
            self.keeper.deposit(SLAB_KEY_BASE + slab.id, fds, {
                "slab": slab.id, "capacity": slab.capacity, "device": slab.device,
                "registry": self.registry.identity.instance})
        finally:
            for fd in fds:
                os.close(fd)

    def _forget(self, slab: Slab) -> None:
        """A slab whose row was rolled back (or deleted): withdrawn and freed. One with a
        slot still used (by an allocation whose own change is being taken back) takes no
        new allocation and is freed when that slot is given back."""
        with contextlib.suppress(KeeperGone):
            self.keeper.withdraw(SLAB_KEY_BASE + slab.id)
        self.backend.pool.retire_slab(slab)

    def sweep(self, min_idle: float = 0.0) -> int:
        """Free the slabs no allocation uses, those empty for `min_idle` seconds at least
        (gpumemd sweeps every 0.2 s with IDLE_SECONDS: a slab emptied and filled again at
        once, a create and remove churning, keeps its memory meanwhile). Removing everything
        gives every byte back within half a second. Returns how many went."""
        now = time.monotonic()
        return self._drop_empty([s for s in list(self.backend.pool.slabs.values())
                                 if not s.used and
                                 (s.emptied_at is None or now - s.emptied_at >= min_idle)])

    def release(self, slabs: list[Slab]) -> int:
        """Free now those of `slabs` that are still held and empty (the slabs a compaction
        pass emptied: daemon/core/compaction.py), as the sweep would."""
        pool = self.backend.pool
        return self._drop_empty([s for s in slabs if not s.used and pool.slabs.get(s.id) is s])

    def _drop_empty(self, gone: list[Slab]) -> int:
        """Commit the rows' deletion, then withdraw and free (the order of a slab's going)."""
        if not gone:
            return 0
        try:
            with self.journal.change(durable=True):
                for slab in gone:
                    self.registry.slabs.delete(slab.id)
        except GpumemError as exc:   # housekeeping: the slabs stay, the next sweep retries
            log.warning("could not free %d empty slabs now: %s", len(gone), exc)
            return 0
        for slab in gone:
            self._forget(slab)
        return len(gone)

    # ---- a restart: the keeper's slabs against the registry's rows -------------------------
    def adopt_all(self, kept: dict[int, list[int]]) -> dict[int, str]:
        """Take the slabs out of `kept` (the keeper's holdings by key) and adopt those the
        registry lists; free the others. Returns, for each listed slab not adopted, why."""
        held = {key - SLAB_KEY_BASE: kept.pop(key) for key in list(kept) if is_slab_key(key)}
        missing: dict[int, str] = {}
        for row in self.registry.slabs.load():
            fds = held.pop(row["id"], None)
            if fds is None:
                missing[row["id"]] = "the keeper holds no memory for its slab"
                continue
            try:
                self._adopt(row, fds)
            except Exception as exc:  # noqa: BLE001 - its allocations are lost, said below
                missing[row["id"]] = f"its slab could not be re-adopted: {exc}"
        # their allocations are lost (placements cleared): the rows go
        drop_unheld_and_residue(self.journal, self.keeper, self.registry.slabs.delete,
                                missing, held, SLAB_KEY_BASE, "slab")
        return missing

    def _adopt(self, row: dict, fds: list[int]) -> None:
        raw = self.backend.raw
        data = raw.adopt(fds[:1], row["capacity"], row["device"])
        parity = None
        if row["ecc"] == "rs" and row.get("parity_arena") is not None:
            for fd in fds[1:]:
                os.close(fd)
            parity = self._adopt_span(row, data)
        elif row["ecc"] == "rs":
            if len(fds) < 2:
                raw.free(data)
                raise InternalError("its parity was not kept")
            parity = raw.adopt(fds[1:2], self.backend.pool.slab_parity_bytes(row["capacity"],
                                                                         "rs"), row["device"])
            parity.blocks = row["capacity"] // (128 * 1024)
        else:
            for fd in fds[1:]:
                os.close(fd)
        slab = Slab(row["id"], row["uid"], row["device"], row["ecc"], row["slot"], data,
                    parity)
        self.backend.pool.add_slab(slab)

    def _adopt_span(self, row: dict, data):
        """A slab's parity span, claimed from its arena; one that cannot be (the arena is
        gone, the bytes claimed twice) is a new span, encoded from the slab's data."""
        blocks = row["capacity"] // (128 * 1024)
        nbytes = parity_bytes(row["capacity"])
        where = (row["parity_arena"], row["parity_offset"], span_bytes(nbytes))
        span = self.arenas.claim(where, nbytes, blocks) if self.arenas is not None else None
        if span is not None:
            return span
        if self.arenas is None:
            raise InternalError("its parity is in a parity arena, and arenas are off")
        log.warning("slab %d: its parity span is not held; rebuilding it from the data",
                    row["id"])
        span = self.arenas.take(row["device"], parity_bytes(row["capacity"]), blocks)
        self.backend.raw.ecc("encode", data, span.arena.data, 0, blocks, blocks, span.offset)
        with self.journal.change(durable=True):
            self.registry.arenas.slab_parity(row["id"], span.arena.id, span.offset)
        return span

    def slot_at(self, slab_id: int, offset: int, capacity: int, tenant: object) -> Slot:
        """The slot a registry row names, taken (at a restart) by `tenant` (the allocation:
        Custody.bind's link). InternalError when the row does not fit the slab: another
        class, out of bounds, or taken. (A chown moves an allocation out of its slab
        first, so a row's slab is its owner's: docs/storage.md, "The export rule".)"""
        slab = self.backend.pool.slabs.get(slab_id)
        if slab is None:
            raise InternalError(f"slab {slab_id} is not held")
        if slab.slot != capacity or not slab.fits(offset) or offset in slab.used:
            raise InternalError(f"slot {offset} of slab {slab_id} (class {slab.slot}) does "
                                f"not fit an allocation of capacity {capacity}")
        return slab.take_adopted(offset, tenant)

    def settle(self) -> None:
        """After a restart's slot_at calls: every other slot of the slabs is free."""
        for slab in self.backend.pool.slabs.values():
            slab.settle()

    def summary(self) -> dict:
        """Slabs, their bytes and what their used slots hold (status)."""
        slabs = list(self.backend.pool.slabs.values())
        return {"slabs": len(slabs), "bytes": sum(s.capacity for s in slabs),
                "used_bytes": sum(len(s.used) * s.slot for s in slabs),
                "objects": sum(len(s.used) for s in slabs)}
