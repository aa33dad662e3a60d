"""Slabs: one owner's small objects packed into one backend allocation (docs/storage.md).

A slab is one backend allocation (a memfd on the host backend, one cuMemCreate on cuda) cut
into equal slots of one size class (4 KiB, 8 KiB, ... SLOT_MAX, powers of two, each slot
aligned to its size), holding the objects of one owner uid, on one device, of one ECC mode.
A slot object's bytes are `slab.data[offset:offset + capacity]`; its parity is the slab's:
RS parity per 128 KiB block of the slab (daemon/ecc/layout.py), so a slot below a block
shares its block's parity with its neighbours (their owner's objects, never another's).

Why one owner: a client that maps a slot receives an fd of the whole slab, and can map any
of it; so a slab never holds two owners' bytes (the export rule: docs/security.md).
"""
from __future__ import annotations

import dataclasses
import threading
import time

from ..ecc.layout import BLOCK
from .base import Buffer

SLOT_MIN = 4096          # the smallest size class: a page (clients mmap a slot at its offset)


def slot_max(granularity: int) -> int:
    """The largest size class: half a granule (from there on an object has memory of its
    own, whole granules)."""
    return granularity // 2


def size_class(size: int, granularity: int) -> int | None:
    """The slot size for an object of `size` bytes; None when it is too large for a slot."""
    if size > slot_max(granularity):
        return None
    cls = SLOT_MIN
    while cls < size:
        cls *= 2
    return cls


@dataclasses.dataclass(eq=False)
class Slab:
    """A slab and its free slots. `id` is its registry row id; `data` and `parity` are the
    backend's buffers (parity None without ECC)."""
    id: int
    uid: int
    device: str
    ecc: str
    slot: int                        # the size class: every slot's bytes
    data: Buffer
    parity: Buffer | None
    free_slots: list[int] = dataclasses.field(default_factory=list)   # offsets, a stack
    used: dict[int, Slot] = dataclasses.field(default_factory=dict)     # offset -> slot
    # Free slots whose bytes may not be zeros (an earlier tenant's, or unknown after a
    # restart): one is zeroed and its blocks encoded when it is taken (Slabs.place). Every
    # other free slot reads as zeros and agrees with the slab's parity, so a new object
    # placed there costs no codec run.
    dirty: set[int] = dataclasses.field(default_factory=set)
    retired: bool = False            # its row is gone: freed with its last used slot
    emptied_at: float | None = None  # time.monotonic() its last slot was given back
    # Held around every codec run on the slab: a slot below a block shares the block's
    # parity with its neighbours, whose parity jobs may run on other worker threads.
    lock: threading.RLock = dataclasses.field(default_factory=threading.RLock, repr=False)

    def __post_init__(self) -> None:
        if not self.free_slots and not self.used:
            self.free_slots = list(range(self.capacity - self.slot, -1, -self.slot))

    @property
    def capacity(self) -> int:
        return self.data.capacity

    @property
    def blocks(self) -> int:
        return self.capacity // BLOCK

    @property
    def key(self) -> tuple[int, str, str, int]:
        return (self.uid, self.device, self.ecc, self.slot)

    def take(self, offset: int | None = None) -> Slot:
        """A free slot (the one at `offset`, which must be free: compaction's choice), now
        used; `clean` says whether it reads as zeros."""
        if offset is None:
            offset = self.free_slots.pop()
        else:
            self.free_slots.remove(offset)
        slot = Slot(slab=self, offset=offset, capacity=self.slot, device=self.device,
                    clean=offset not in self.dirty)
        self.dirty.discard(offset)
        self.used[offset] = slot
        self.emptied_at = None
        return slot

    def take_adopted(self, offset: int, tenant: object = None) -> Slot:
        """The slot a registry row names, at a restart, with its `tenant` (the allocation);
        settle() once all are taken."""
        slot = Slot(slab=self, offset=offset, capacity=self.slot, device=self.device,
                    tenant=tenant)
        self.used[offset] = slot
        return slot

    def settle(self) -> None:
        """After a restart's take_adopted calls: the other slots are free, holding whatever
        the transient or removed objects there left (dirty)."""
        self.free_slots = [o for o in range(self.capacity - self.slot, -1, -self.slot)
                           if o not in self.used]
        self.dirty = set(self.free_slots)
        self.emptied_at = None if self.used else time.monotonic()

    def give_back(self, slot: Slot, zeroed: bool = False) -> None:
        """`zeroed`: the caller zeroed the slot and encoded its blocks (it is clean)."""
        if self.used.get(slot.offset) is slot:
            del self.used[slot.offset]
            self.free_slots.append(slot.offset)
            if not zeroed:
                self.dirty.add(slot.offset)
            if not self.used:
                self.emptied_at = time.monotonic()

    def fits(self, offset: int) -> bool:
        """Whether `offset` is a slot's place in this slab (a registry row's check)."""
        return 0 <= offset <= self.capacity - self.slot and offset % self.slot == 0

    def neighbours(self, slot: Slot) -> list[Slot]:
        """The other used slots in the blocks `slot` touches: their parity is shared."""
        if self.slot >= BLOCK:
            return []
        start = slot.offset // BLOCK * BLOCK
        return [s for off in range(start, start + BLOCK, self.slot)
                if (s := self.used.get(off)) is not None and s is not slot]


@dataclasses.dataclass(eq=False)
class Slot(Buffer):
    """An object's memory in a slab: bytes [offset, offset + capacity) of slab.data.
    `tenant` is what holds it (the core's allocation), for the neighbour checks."""
    slab: Slab
    offset: int
    capacity: int
    device: str
    tenant: object = None
    clean: bool = False              # zeros, and the slab's parity agrees (taken fresh)


@dataclasses.dataclass(eq=False)
class SlotParity(Buffer):
    """An object's parity in its slab (the slab's parity region): a marker, never freed or
    exported on its own."""
    slab: Slab
    offset: int = 0                  # the slot's, whose parity this is
    capacity: int = 0
    device: str = ""
    blocks: int = 0


def region(buf) -> dict | None:
    """What an open, attach or refill answer says of a slot's fd (its slab's): where the
    allocation lies in it, {offset, span}; None for memory of its own."""
    if isinstance(buf, Slot):
        return {"offset": buf.offset, "span": buf.slab.capacity}
    return None


def placement(buf) -> dict:
    """The registry's `slab` and `slot` columns for an allocation's memory `buf`."""
    if isinstance(buf, Slot):
        return {"slab": buf.slab.id, "slot": buf.offset}
    return {"slab": None, "slot": None}
