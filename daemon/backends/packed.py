"""The packing layer over a backend: small objects in slots of per-owner slabs
(daemon/backends/slabs.py), everything else as the backend makes it (docs/storage.md).

PackedBackend has the Backend interface, so the core addresses a slot as it addresses any
buffer: reads, writes, zeroing, copies and the codec are translated to the slab's memory at
the slot's offset. What only the core can do (a slab's registry row, the keeper's deposit)
stays in the core (daemon/core/slabs.py): here are the slabs in memory and their free slots.
"""
from __future__ import annotations

from collections.abc import Callable

from gpumemctl.protocol import InternalError, InvalidState, round_up

from ..ecc.layout import BLOCK, parity_bytes
from .arenas import ArenaPool, ParitySpan
from .base import Backend, Buffer, DeviceInfo
from .slabs import Slab, Slot, SlotParity, size_class, slot_max

# A slab's size. On a GPU, the first of a (uid, device, ECC, class) is one granule and each
# next one twice the last, up to 128 MiB (one user's one small file costs a granule, a million
# 64 KiB objects about 500 slabs). On the host, 8 MiB each: a memfd's pages are taken as they
# are written, yet the device's free bytes count its whole size.
SLAB_MAX_BYTES = {"host": 8 << 20, "cuda": 128 << 20}
DOUBLING = {"cuda"}


class PackedBackend(Backend):
    def __init__(self, raw: Backend, *, slabs: bool = True, extents: bool = True):
        self.raw = raw
        self.packing = slabs
        self.extents = extents        # resizes by extents where the backend can (regrow)
        self.arenas = ArenaPool(raw)      # parity spans (daemon/backends/arenas.py)
        self.pool = SlabPool(raw, self.arenas)
        # What the backend is, as plain attributes (a test may set them, as on a backend).
        self.name = raw.name
        self.fd_grants_write = raw.fd_grants_write
        self.resizes_in_place = raw.resizes_in_place
        self.fresh_memory_is_zero = raw.fresh_memory_is_zero
        self.registers_host_memory = raw.registers_host_memory
        self.own_buffers = 0          # descriptors of memory of its own alive (_count_own)
        self.own_extra = 0            # of which extents past a buffer's first
        self.own_generation = 0       # changes to that count, for the per-uid cache

    # ---- what the backend is: forwarded ---------------------------------------------------
    def __getattr__(self, name: str):
        if name == "raw":               # not set yet (unpickling, __init__'s start)
            raise AttributeError(name)
        return getattr(self.raw, name)

    def devices(self) -> list[DeviceInfo]:
        return self.raw.devices()

    def close(self) -> None:
        self.raw.close()

    # ---- sizes ------------------------------------------------------------------------------
    def capacity_for(self, dev: DeviceInfo, size: int) -> int:
        """The capacity an object of `size` gets: its slot class when it packs, else whole
        granules (at least one)."""
        cls = size_class(size, dev.granularity) if self.packing else None
        return cls if cls is not None else max(dev.granularity, round_up(size, dev.granularity))

    def packs(self, capacity: int, dev: DeviceInfo) -> bool:
        """Whether memory of `capacity` is a slot (a slab's), not memory of its own."""
        return self.packing and capacity <= slot_max(dev.granularity)

    @staticmethod
    def in_slab(buf) -> bool:
        return isinstance(buf, Slot)

    # ---- the Backend interface, translated for slots ----------------------------------------
    def allocate(self, capacity: int, device: str, label: str) -> Buffer:
        buf = self.raw.allocate(capacity, device, label)
        self._count_own(buf)
        return buf

    def _count_own(self, buf, sign: int = 1) -> None:
        """Memory of its own (not a slab's), a descriptor in gpumemd per extent: the fd
        budget reads the count (FdBudget.require) instead of walking every allocation. A
        regrown buffer counts the extents it shares with the old one until that is freed."""
        self.own_buffers += sign * buf.descriptors
        self.own_extra += sign * (buf.descriptors - 1)
        self.own_generation += 1

    def regrow(self, buf, capacity: int):
        if not self.extents or isinstance(buf, (Slot, SlotParity, ParitySpan)):
            return None
        new = self.raw.regrow(buf, capacity)
        if new is not None:
            self._count_own(new)
        return new

    def free(self, buf, zeroed: bool = False) -> None:
        """`zeroed`: a slot the caller zeroed and encoded (Slab.give_back)."""
        if isinstance(buf, Slot):
            buf.slab.give_back(buf, zeroed)
            buf.tenant = None
            if buf.slab.retired and not buf.slab.used:
                self.pool.drop_slab(buf.slab)
        elif isinstance(buf, ParitySpan):
            self.arenas.release(buf)
        elif not isinstance(buf, SlotParity):
            self._count_own(buf, -1)
            self.raw.free(buf)

    def export(self, buf, writable: bool) -> int:
        if isinstance(buf, ParitySpan):   # an arena holds every owner's parity
            raise InternalError("a parity arena is never exported")
        return self.raw.export(_memory(buf), writable)

    def export_all(self, buf, writable: bool) -> list[int]:
        if isinstance(buf, (Slot, SlotParity, ParitySpan)):
            return [self.export(buf, writable)]
        return self.raw.export_all(buf, writable)

    def keeper_fds(self, buf) -> list[int]:
        if isinstance(buf, (Slot, SlotParity)):
            raise InternalError("a slot is kept with its slab, never on its own")
        if isinstance(buf, ParitySpan):
            raise InternalError("a parity span is kept with its arena, never on its own")
        return self.raw.keeper_fds(buf)

    def adopt(self, fds: list[int], capacity: int, device: str,
              layout: list[int] | None = None) -> Buffer:
        buf = self.raw.adopt(fds, capacity, device, layout)
        self._count_own(buf)
        return buf

    def read(self, buf, offset: int, length: int) -> bytes:
        return self.raw.read(_memory(buf), _base(buf) + offset, length)

    def write(self, buf, offset: int, data) -> None:
        self.raw.write(_memory(buf), _base(buf) + offset, data)

    def write_pinned(self, buf, offset: int, view: memoryview, addr: int) -> None:
        self.raw.write_pinned(_memory(buf), _base(buf) + offset, view, addr)

    def view(self, buf, offset: int, length: int) -> memoryview:
        return self.raw.view(_memory(buf), _base(buf) + offset, length)

    def zero(self, buf, start: int, end: int) -> None:
        base = _base(buf)
        self.raw.zero(_memory(buf), base + start, base + end)

    def copy(self, src, dst, length: int, src_offset: int = 0, dst_offset: int = 0) -> None:
        self.raw.copy(_memory(src), _memory(dst), length, _base(src) + src_offset,
                      _base(dst) + dst_offset)

    def host_register(self, addr: int, size: int, device: str):
        return self.raw.host_register(addr, size, device)

    def to_host(self, buf, length: int, view: memoryview, addr: int) -> None:
        """A slot by the pieces of Backend.to_host (small); memory of its own at the
        backend's own rate."""
        if isinstance(buf, Slot):
            Backend.to_host(self, buf, length, view, addr)
        else:
            self.raw.to_host(buf, length, view, addr)

    def from_host(self, buf, length: int, view: memoryview, addr: int) -> None:
        if isinstance(buf, Slot):
            Backend.from_host(self, buf, length, view, addr)
        else:
            self.raw.from_host(buf, length, view, addr)

    def resize_in_place(self, buf, capacity: int) -> None:
        if isinstance(buf, Slot):
            raise InternalError("a slot cannot be resized in place")
        self.raw.resize_in_place(buf, capacity)

    def ecc(self, op: str, data, parity, first: int, count: int, total: int,
            parity_offset: int = 0):
        """A slot's blocks are its slab's: object block i is slab block offset//BLOCK + i
        (a slot below a block has one block, the one it lies in)."""
        if not isinstance(data, Slot):
            return self.raw.ecc(op, data, _memory(parity), first, count, total, _base(parity))
        slab = data.slab
        if slab.parity is None:
            raise InvalidState("this object's slab has no ECC parity")
        with slab.lock:
            return self.raw.ecc(op, slab.data, _memory(slab.parity),
                                data.offset // BLOCK + first, count, slab.blocks,
                                _base(slab.parity))

    def export_dmabuf(self, buf) -> int:
        if isinstance(buf, Slot):
            raise InternalError("a slot's dma-buf would cover its whole slab")
        return self.raw.export_dmabuf(buf)


def own_parity_bytes(slab: Slab) -> int:
    """The bytes of a slab's parity buffer of its own (0: none, or a span of an arena,
    counted with the arena)."""
    return slab.parity.capacity if slab.parity is not None and \
        not isinstance(slab.parity, ParitySpan) else 0


def _memory(buf):
    if isinstance(buf, Slot):
        return buf.slab.data
    if isinstance(buf, ParitySpan):
        return buf.arena.data
    if isinstance(buf, SlotParity):
        raise InternalError("a slot's parity is its slab's; it is never addressed alone")
    return buf


def _base(buf) -> int:
    return buf.offset if isinstance(buf, (Slot, ParitySpan)) else 0


class SlabPool:
    """The slabs in memory, by id and by kind, and their memory's life."""

    def __init__(self, raw: Backend, arenas: ArenaPool | None = None):
        self.raw = raw
        self.arenas = arenas
        # Where a new slab's parity comes from: (device, parity bytes, blocks) -> a span of a
        # parity arena (daemon/core/arenas.py sets it); None: a buffer of its own.
        self.parity_span: Callable[[str, int, int], ParitySpan | None] | None = None
        self.slabs: dict[int, Slab] = {}
        self._by_key: dict[tuple, list[Slab]] = {}
        self._last: dict[tuple, Slab] = {}    # per kind, the slab find_slot last took from
        self.slab_max = SLAB_MAX_BYTES.get(raw.name, 32 << 20)

    def find_slot(self, uid: int, device: str, ecc: str, capacity: int) -> Slot | None:
        """A free slot of class `capacity` in one of the owner's slabs; None: a new slab is
        needed (the core makes it: daemon/core/slabs.py)."""
        key = (uid, device, ecc, capacity)
        last = self._last.get(key)          # where the last slot came from: most often
        if last is not None and last.free_slots and not last.retired:   # it has more
            return last.take()
        for slab in self._by_key.get(key, ()):
            if slab.free_slots:
                self._last[key] = slab
                return slab.take()
        return None

    def next_slab_bytes(self, uid: int, device: str, ecc: str, capacity: int) -> int:
        dev = self.raw.device(device)
        have = self._by_key.get((uid, device, ecc, capacity), [])
        largest = max((s.capacity for s in have), default=0)
        if self.raw.name not in DOUBLING:
            return self.slab_max
        return min(self.slab_max, max(dev.granularity, 2 * largest))

    def make_slab(self, slab_id: int, uid: int, device: str, ecc: str, slot: int,
                  nbytes: int) -> Slab:
        """A new slab's memory, zeroed, with its parity (zero data has zero parity)."""
        self.raw.check_free(self.raw.device(device), nbytes + self.slab_parity_bytes(nbytes, ecc))
        data = self.raw.allocate(nbytes, device, label=f"slab{slab_id}")
        parity = None
        try:
            if not self.raw.fresh_memory_is_zero:
                self.raw.zero(data, 0, nbytes)
            if ecc == "rs":
                parity = self._new_parity(slab_id, device, nbytes)
        except BaseException:
            self.raw.free(data)
            raise
        return self.add_slab(Slab(slab_id, uid, device, ecc, slot, data, parity))

    def _new_parity(self, slab_id: int, device: str, nbytes: int):
        """Zeroed parity for a new slab of `nbytes` (zero data has zero parity): a span of
        a parity arena where one is given, else a buffer of its own."""
        span = self.parity_span(device, parity_bytes(nbytes), nbytes // BLOCK) \
            if self.parity_span is not None else None
        if span is not None:
            self.raw.zero(span.arena.data, span.offset, span.offset + span.capacity)
            return span
        parity = self.raw.allocate(self.slab_parity_bytes(nbytes, "rs"), device,
                                   label=f"slab{slab_id}#parity")
        if not self.raw.fresh_memory_is_zero:
            self.raw.zero(parity, 0, parity.capacity)
        parity.blocks = nbytes // BLOCK
        return parity

    def slab_parity_bytes(self, nbytes: int, ecc: str) -> int:
        if ecc != "rs":
            return 0
        # The host's memfds are any number of pages; a GPU's memory whole granules.
        unit = 4096 if self.raw.name == "host" else self.raw.devices()[0].granularity
        return round_up(parity_bytes(nbytes), unit)

    def add_slab(self, slab: Slab) -> Slab:
        self.slabs[slab.id] = slab
        self._by_key.setdefault(slab.key, []).append(slab)
        return slab

    def drop_slab(self, slab: Slab) -> None:
        """Free a slab's memory (it holds no slot)."""
        if slab.used:
            raise InternalError(f"slab {slab.id} still holds {len(slab.used)} objects")
        self._unlist(slab)
        self.raw.free(slab.data)
        if isinstance(slab.parity, ParitySpan):
            assert self.arenas is not None
            self.arenas.release(slab.parity)    # its row went first: no row names the span
        elif slab.parity is not None:
            self.raw.free(slab.parity)

    def retire_slab(self, slab: Slab) -> None:
        """No new slot in this slab; its memory goes with its last used slot (now, if none)."""
        slab.retired = True
        self._unlist(slab)
        if not slab.used:
            self.drop_slab(slab)

    def _unlist(self, slab: Slab) -> None:
        self.slabs.pop(slab.id, None)
        if self._last.get(slab.key) is slab:
            del self._last[slab.key]
        same = self._by_key.get(slab.key, [])
        if slab in same:
            same.remove(slab)
        if not same:
            self._by_key.pop(slab.key, None)

    def bytes_per_device(self) -> dict[str, int]:
        """Device UUID -> the bytes the slabs hold there (data and parity)."""
        out: dict[str, int] = {}
        for s in self.slabs.values():
            out[s.device] = out.get(s.device, 0) + s.capacity + own_parity_bytes(s)
        return out

    def use_per_device(self) -> dict[str, dict]:
        """Device UUID -> its slabs: how many, their bytes and their parity's, the bytes of
        their used slots, the objects in them, the slack (bytes - used_bytes) and the
        fragmentation: 1 - used / bytes over the slabs partly used (docs/storage.md)."""
        out: dict[str, dict] = {}
        partly: dict[str, list[int]] = {}
        for s in self.slabs.values():
            use = out.setdefault(s.device, {"count": 0, "bytes": 0, "parity_bytes": 0,
                                            "used_bytes": 0, "objects": 0})
            use["count"] += 1
            use["bytes"] += s.capacity
            use["parity_bytes"] += s.parity.capacity if s.parity is not None else 0
            use["used_bytes"] += len(s.used) * s.slot
            use["objects"] += len(s.used)
            if s.used and s.free_slots:
                part = partly.setdefault(s.device, [0, 0])
                part[0] += s.capacity
                part[1] += len(s.used) * s.slot
        for device, use in out.items():
            total, used = partly.get(device, (0, 0))
            use["slack_bytes"] = use["bytes"] - use["used_bytes"]
            use["fragmentation"] = round(1 - used / total, 4) if total else 0.0
        return out

    def slab_fds(self, uid: int | None = None) -> int:
        """Descriptors the slabs (of `uid`; None: all) hold in gpumemd: data and parity of
        its own; with every uid's, the parity arenas' too."""
        own = sum(1 + (own_parity_bytes(s) > 0) for s in self.slabs.values()
                  if uid is None or s.uid == uid)
        return own + (len(self.arenas.arenas) if uid is None and self.arenas else 0)

    def slot_parity(self, slot: Slot) -> SlotParity | None:
        return SlotParity(slot.slab, slot.offset) if slot.slab.parity is not None else None

