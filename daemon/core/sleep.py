"""Sleep and wake (issue 28, docs/engines.md "Sleep and wake"): an allocation's bytes moved
to host memory and its device memory given back, then new device memory with the same bytes.

An asleep allocation has no buffer; its bytes are a HostTier (daemon/backends/tier.py) and
its row says `asleep` 1 with the state it wakes into. Memory of its own keeps its parity on
the device while it sleeps (parity is small; the data is what goes), encoded before the copy
out, and wake checks every block against it, repairing what the code can: bytes damaged in
host memory come back repaired or recorded as damage, never silently. A small allocation in
a slab gives its slot back (a slot's parity is its slab's): a CRC-32 of its bytes stands in
for the parity, checked at wake.

Crash order for a durable allocation (docs/durability.md, "Crash ordering"), the keeper's
copy of the tier under -id (a resize's staging key: a resize of an asleep allocation is
refused, so the two never meet), with `asleep` in its meta:
- sleep: copy out, deposit the tier under -id, commit `asleep` 1, withdraw the device copy
  under id, free the device memory. A crash before the commit leaves the tier as residue
  (freed at start: drop_residue); after it, the device copy is the residue.
- wake: new memory, copy in, check, deposit it under id, commit `asleep` 0, withdraw -id,
  close the tier. Before the commit the new memory is the residue; after it, the tier.
A transient allocation deposits nothing, and like any transient one is dropped at a start.
"""
from __future__ import annotations

import dataclasses
import os
import time
import zlib
from typing import Any

from gpumemctl.protocol import InvalidState, NotFound

from ..backends.arenas import ParitySpan
from ..backends.packed import PackedBackend
from ..backends.slabs import SlotParity, placement
from ..backends.tier import HostTier, Spares
from ..registry import Registry
from .custody import Custody, Deposit
from .integrity import Integrity
from .journal import Journal
from .nodes import Allocation, Holder
from .parity import BLOCK, protected_blocks, unsettled
from .permissions import Credentials

TIER_META = "asleep"          # the key of a tier deposit's meta that says what it is


def is_tier(meta: dict | None) -> bool:
    return bool(meta) and bool(meta.get(TIER_META))    # type: ignore[union-attr]


@dataclasses.dataclass(eq=False)
class Move:
    """A sleep or a wake under way: its first step (on the event loop) made it, its copy
    (on a worker thread: Sleep.copy_out, copy_in) fills it, its last step commits it."""
    alloc: Allocation
    parked: list[Holder] = dataclasses.field(default_factory=list)
    tier: HostTier | None = None        # a sleep's, once copied
    buf: Any = None                     # a wake's new memory
    found: dict | None = None           # a wake's check
    # Seconds per step of the copy (the answer's `phases`): where a sleep's time goes.
    phases: dict[str, float] = dataclasses.field(default_factory=dict)

    def timed(self, phase: str, began: float) -> float:
        now = time.monotonic()
        self.phases[phase] = round(self.phases.get(phase, 0.0) + now - began, 6)
        return now


class Sleep:
    def __init__(self, registry: Registry, journal: Journal, backend: PackedBackend,
                 custody: Custody, integrity: Integrity):
        self.registry = registry
        self.journal = journal
        self.backend = backend
        self.custody = custody
        self.integrity = integrity
        self.spares = Spares()      # tiers wakes let go of, for the next sleeps

    # ---- sleep ------------------------------------------------------------------------------
    def begin_sleep(self, alloc: Allocation, parked: list[Holder]) -> Move:
        """On the loop, once the caller checked who may and what holds it: `sleeping` (in
        memory only) refuses whatever would write or map it while the bytes are copied."""
        alloc.awake_state, alloc.state = alloc.state, "sleeping"
        self.journal.node_changed(alloc)
        return Move(alloc, parked)

    def copy_out(self, move: Move) -> None:
        """On a worker thread: parity brought up to date, then the bytes into a new host
        tier, under the parity lock (no parity job, no free, in between)."""
        alloc = move.alloc
        with alloc.parity_lock:
            if alloc.buffer is None:
                return                              # removed meanwhile: finish_sleep says so
            t = time.monotonic()
            crc = self._settle_parity(alloc)
            t = move.timed("parity", t)
            tier = self.spares.take(alloc.size or 0) or \
                HostTier.create(alloc.size or 0, alloc.path)
            t = move.timed("host_memory", t)
            try:
                tier.register(self.backend.host_register, alloc.device or "")
                t = move.timed("pin", t)
                self.backend.to_host(alloc.buffer, tier.size, tier.view, tier.addr)
                t = move.timed("copy", t)
                tier.crc = crc if crc is None else zlib.crc32(tier.view)
                move.timed("check", t)
            except BaseException:
                tier.release()
                raise
            move.tier = tier

    def finish_sleep(self, move: Move, cred: Credentials) -> int:
        """On the loop: the commit (module docstring), then the device memory goes.
        Returns the bytes moved."""
        alloc, tier = move.alloc, move.tier
        if alloc.unlinked or alloc.buffer is None or tier is None:
            raise NotFound(f"'{alloc.path}' was removed while it went to sleep")
        self._commit_sleep(alloc, cred, tier, move.parked)
        move.tier = None                            # the allocation's now
        self._free_device_memory(alloc)
        return tier.size

    def abandon_sleep(self, move: Move) -> None:
        """A sleep that did not commit: awake as it was, the host copy gone."""
        alloc = move.alloc
        if alloc.state == "sleeping":
            alloc.state, alloc.awake_state = alloc.awake_state or "ready", None
            self.journal.node_changed(alloc)
        if move.tier is not None:
            self.spares.give(move.tier)
            move.tier = None

    def _settle_parity(self, alloc: Allocation) -> int | None:
        """Parity the wake can check against: memory of its own whose parity may be stale by
        design (written since its sync, or by a writer that maps it: unsettled) encodes
        every block now; settled parity is current already. A slot: 0, which says "checked
        by CRC" (its parity goes with the slot)."""
        if self.backend.in_slab(alloc.buffer):
            return 0
        if alloc.parity is not None and unsettled(alloc):
            self.integrity.parity.encode(alloc, 0, protected_blocks(alloc) * BLOCK)
        return None

    def _commit_sleep(self, alloc: Allocation, cred: Credentials, tier: HostTier,
                      parked: list[Holder]) -> None:
        deposited = alloc.durable
        if deposited:
            self.custody.send(self.tier_deposit(alloc, tier))
        try:
            with self.journal.change(durable=alloc.durable):
                self.journal.keep(alloc, "state")
                alloc.state = "asleep"
                self.registry.nodes.update(alloc.id, asleep=1, slab=None, slot=None)
                self.journal.event("sleep", alloc, cred, bytes=tier.size,
                                   parked=len(parked))
        except BaseException:
            if deposited:
                self.custody.withdraw_quietly(-alloc.id)
            raise
        for holder in parked:
            holder.parked = True
        alloc.tier = tier
        if deposited and not self.backend.in_slab(alloc.buffer):
            self.custody.withdraw_quietly(alloc.id)

    def _free_device_memory(self, alloc: Allocation) -> None:
        """After the commit: a slot goes with its parity (its slab's); memory of its own
        goes, its parity stays for the wake to check against."""
        if self.backend.in_slab(alloc.buffer):
            self._free_slot(alloc)
        else:
            with alloc.parity_lock:
                buf, alloc.buffer = alloc.buffer, None
                if buf is not None:
                    self.backend.free(buf)
        self.journal.node_changed(alloc)

    def _free_slot(self, alloc: Allocation) -> None:
        """A slot and its parity go (Custody.free), the host tier stays: Custody.free would
        close it too, as a removal must."""
        tier, alloc.tier = alloc.tier, None
        try:
            self.custody.free(alloc)
        finally:
            alloc.tier = tier

    def tier_deposit(self, alloc: Allocation, tier: HostTier) -> Deposit:
        """What the keeper holds of an asleep durable allocation: the tier's fd, and its
        parity's where that is a buffer of its own (a span is its arena's, kept already)."""
        fds = [tier.keeper_fd()]
        if alloc.parity is not None and not isinstance(alloc.parity, (SlotParity, ParitySpan)):
            fds += self.backend.keeper_fds(alloc.parity)
        meta = {TIER_META: True, "size": tier.size, "capacity": alloc.capacity,
                "device": alloc.device, "crc": tier.crc,
                "registry": self.registry.identity.instance}
        if isinstance(alloc.parity, ParitySpan):
            meta["ecc"] = alloc.ecc
        return Deposit(-alloc.id, f"put '{alloc.path}' to sleep", fds, meta)

    # ---- wake -------------------------------------------------------------------------------
    def begin_wake(self, alloc: Allocation) -> Move:
        """On the loop: new device memory (NoMemory if the device has no room now), and
        `waking`: reads still come from the host tier, nothing maps or writes it."""
        move = Move(alloc, buf=self._new_memory(alloc, alloc.tier.crc is not None))
        alloc.state = "waking"
        self.journal.node_changed(alloc)
        return move

    def copy_in(self, move: Move) -> None:
        """On a worker thread: the bytes back, zeros past the size, and the check."""
        alloc, tier = move.alloc, move.alloc.tier
        with alloc.parity_lock:
            if alloc.unlinked or tier is None:
                return                               # removed meanwhile
            t = time.monotonic()
            tier.register(self.backend.host_register, alloc.device or "")
            t = move.timed("pin", t)
            self.backend.from_host(move.buf, tier.size, tier.view, tier.addr)
            if not self.backend.fresh_memory_is_zero:
                self.backend.zero(move.buf, tier.size, move.buf.capacity)
            t = move.timed("copy", t)
            alloc.buffer = move.buf
            self.custody.bind(alloc)
            move.found = self._check(alloc, tier, tier.crc is not None)
            move.timed("check", t)

    def finish_wake(self, move: Move, cred: Credentials) -> dict:
        """On the loop: the commit (module docstring), then the host copy goes. Returns what
        the check found."""
        alloc, found = move.alloc, move.found
        if alloc.unlinked or found is None:
            raise NotFound(f"'{alloc.path}' was removed while it woke")
        self._commit_wake(alloc, cred, found)
        move.buf = None                              # the allocation's now
        tier, alloc.tier = alloc.tier, None
        if alloc.durable:
            self.custody.withdraw_quietly(-alloc.id)
        self.spares.give(tier)          # for the next sleep, or freed off the loop
        self.journal.node_changed(alloc)
        return found

    def abandon_wake(self, move: Move) -> None:
        """A wake that did not commit: asleep as it was, the new memory gone."""
        alloc = move.alloc
        with alloc.parity_lock:
            if move.buf is not None and alloc.buffer is move.buf:
                if self.backend.in_slab(move.buf):
                    self._free_slot(alloc)           # the slot, and the parity made for it
                else:
                    self.custody.free_memory(move.buf)
                alloc.buffer = None
            elif move.buf is not None and not alloc.unlinked:
                self.custody.free_memory(move.buf)
            move.buf = None
        if alloc.state == "waking":
            alloc.state = "asleep"
            self.journal.node_changed(alloc)

    def _new_memory(self, alloc: Allocation, packed: bool):
        """On its device (the first one if that is gone). A packed one may be packed again
        (the owner's slab); memory of its own gets memory of its own, one extent of its
        capacity, which a parked attachment maps at the address it kept."""
        try:
            dev = self.backend.device(alloc.device)
        except NotFound:
            if alloc.parity is not None and not packed:
                raise InvalidState(f"'{alloc.path}' slept on device {alloc.device}, which "
                                   "is gone; its parity stayed there") from None
            dev = self.backend.device(None)
        capacity = alloc.capacity or self.backend.capacity_for(dev, max(alloc.size or 0, 1))
        buf = self.custody.allocate(dev, alloc.size or 0, capacity, alloc.ecc, alloc.path,
                                    uid=alloc.uid if packed else None)
        alloc.device = dev.uuid
        return buf

    def _check(self, alloc: Allocation, tier: HostTier, packed: bool) -> dict:
        """Every block against its parity, repaired where the code can; a packed one by its
        CRC, then given fresh parity in its new slot."""
        size = alloc.size or 0
        out = {"blocks": 0, "clean": 0, "corrected": 0, "uncorrectable": 0}
        if packed:
            if zlib.crc32(self.backend.read(alloc.buffer, 0, size)) != tier.crc:
                raise InvalidState(f"'{alloc.path}': its bytes in host memory fail their "
                                   "CRC; it stays asleep (`gpumemctl recover` or restore "
                                   "it from a snapshot)")
            self.integrity.protect_new(alloc)
            self.integrity.parity.encode(alloc, 0, size)
            return out
        if alloc.parity is None:
            return out
        parity = self.integrity.parity
        blocks = protected_blocks(alloc)
        bad: list[int] = []
        for first in range(0, blocks, parity.chunk_blocks):
            found = parity.check(alloc, first, min(parity.chunk_blocks, blocks - first),
                                 repair=True)
            for key in ("blocks", "clean", "corrected"):
                out[key] += found[key]
            bad += found["uncorrectable"]
        out["uncorrectable"] = len(bad)
        out["uncorrectable_blocks"] = bad      # type: ignore[assignment]
        return out

    def _commit_wake(self, alloc: Allocation, cred: Credentials, found: dict) -> None:
        bad = set(found.pop("uncorrectable_blocks", []))
        with self.journal.change(durable=alloc.durable):
            self.journal.keep(alloc, "state", "awake_state", "device")
            alloc.state, alloc.awake_state = alloc.awake_state or "ready", None
            self.registry.nodes.update(alloc.id, asleep=0, state=alloc.stored_state,
                                      device=alloc.device, **placement(alloc.buffer))
            self.journal.event("wake", alloc, cred, bytes=alloc.size or 0,
                               corrected=found["corrected"], uncorrectable=len(bad))
            damaged = bool(bad) and self.integrity.record_damage(
                alloc, alloc.damaged | bad, cred, "found by the check at wake")
            if alloc.durable:
                self.custody.deposit(alloc)        # its rollback withdraws it
        if damaged:
            self.integrity.log_damage(alloc, "found by the check at wake")

    # ---- start-up and the keeper ------------------------------------------------------------
    def adopt(self, alloc: Allocation, kept: dict[int, list[int]], metas: dict[int, dict],
              adopt_parity) -> bool:
        """At start: an asleep durable allocation takes back its tier (and its parity, by
        `adopt_parity`: Adoption._adopt_parity); a device copy under its id is the residue
        of a sleep that committed (the caller frees what is left in `kept`). False: the
        keeper holds no tier for it."""
        fds, meta = kept.pop(-alloc.id, None), metas.get(-alloc.id) or {}
        if not fds or not is_tier(meta):
            if fds:
                kept[-alloc.id] = fds        # not a tier: residue, freed by the caller
            return False
        try:
            alloc.tier = HostTier(fds[0], int(meta["size"]), meta.get("crc"))
        except (OSError, ValueError, KeyError, TypeError):
            for fd in fds:
                os.close(fd)
            return False
        if os.fstat(fds[0]).st_size < alloc.tier.size or alloc.tier.size != (alloc.size or 0):
            alloc.tier.close()
            alloc.tier = None
            for fd in fds[1:]:
                os.close(fd)
            return False
        adopt_parity(alloc, fds[1:])
        self.journal.event("adopt", alloc, None, capacity=alloc.capacity, asleep=True)
        return True

    @staticmethod
    def drop_residue(kept: dict[int, list[int]], metas: dict[int, dict],
                     asleep: set[int]) -> dict[int, list[int]]:
        """At start: tiers the keeper holds for allocations that are not asleep (a sleep
        that did not commit, a wake that did), out of `kept`, for the caller to free."""
        return {key: kept.pop(key) for key in list(kept)
                if key < 0 and -key not in asleep and is_tier(metas.get(key))}

    def redeposit(self, alloc: Allocation) -> None:
        """After a keeper restart: it gets the tier again."""
        if alloc.durable and alloc.tier is not None:
            self.custody.send(self.tier_deposit(alloc, alloc.tier))
