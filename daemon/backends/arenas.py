"""Parity arenas: the ECC parity of many allocations and slabs cut out of a few large
backend allocations per device (docs/storage.md, "Parity arenas").

Before, each protected allocation (and each slab) had a parity buffer of its own, rounded up
to the device's granularity: 2 MiB of parity for the 131 KiB a 2 MiB object needs, and a
keeper descriptor each. Here parity is a span (offset, bytes) of an arena: one backend
allocation, a granule for the first on a device, then a quarter of what the device's arenas
hold, up to ARENA_MAX_BYTES.
Spans are whole SPAN_UNIT pages, placed first-fit in each arena's list of free extents,
which merge again as spans are freed. Parity larger than SPAN_MAX_BYTES (objects above
about 512 MiB) keeps a buffer of its own: the rounding is then a small fraction of it.

Parity is the daemon's alone: no client is ever given an arena's fd (the export rule,
docs/security.md), so one arena serves every owner of a device.

This is the memory side only. The registry rows and the keeper's deposits (an arena is kept
whole under ARENA_KEY_BASE + its id, and each span is a row) are daemon/core/arenas.py's.
"""
from __future__ import annotations

import bisect
import dataclasses
import time
from typing import TypeGuard

from gpumemctl.protocol import InternalError, round_up

from .base import Buffer

SPAN_UNIT = 4096                  # spans are whole pages (a GPU kernel's aligned loads)
ARENA_MAX_BYTES = 256 << 20       # an arena grows by a quarter up to this
SPAN_MAX_BYTES = 32 << 20         # larger parity keeps a buffer of its own


def span_bytes(parity: int) -> int:
    return round_up(parity, SPAN_UNIT)


@dataclasses.dataclass(eq=False)
class ParityArena:
    """One backend allocation of parity spans, and its free extents (offset -> bytes,
    sorted by offset, adjacent ones merged)."""
    id: int
    device: str
    data: Buffer
    free: dict[int, int] = dataclasses.field(default_factory=dict)
    used: dict[int, ParitySpan] = dataclasses.field(default_factory=dict)   # offset -> span
    retired: bool = False
    emptied_at: float | None = None

    def __post_init__(self) -> None:
        if not self.free and not self.used:
            self.free = {0: self.capacity}

    @property
    def capacity(self) -> int:
        return self.data.capacity

    @property
    def used_bytes(self) -> int:
        return sum(s.capacity for s in self.used.values())

    def take(self, nbytes: int) -> ParitySpan | None:
        """The first free extent that holds `nbytes` (whole SPAN_UNITs), or None."""
        for offset in sorted(self.free):
            room = self.free[offset]
            if room >= nbytes:
                del self.free[offset]
                if room > nbytes:
                    self.free[offset + nbytes] = room - nbytes
                return self._use(offset, nbytes)
        return None

    def claim(self, offset: int, nbytes: int) -> ParitySpan | None:
        """The span [offset, offset + nbytes) a registry row names (a restart): None when
        it is not wholly free (out of bounds, or another row claimed part of it)."""
        starts = sorted(self.free)
        i = bisect.bisect_right(starts, offset) - 1
        if i < 0 or offset % SPAN_UNIT or nbytes <= 0:
            return None
        start = starts[i]
        room = self.free[start]
        if offset + nbytes > start + room:
            return None
        del self.free[start]
        if offset > start:
            self.free[start] = offset - start
        if start + room > offset + nbytes:
            self.free[offset + nbytes] = start + room - offset - nbytes
        return self._use(offset, nbytes)

    def _use(self, offset: int, nbytes: int) -> ParitySpan:
        span = ParitySpan(arena=self, offset=offset, capacity=nbytes, device=self.device)
        self.used[offset] = span
        self.emptied_at = None
        return span

    def give_back(self, span: ParitySpan) -> None:
        if self.used.get(span.offset) is not span:
            raise InternalError(f"span {span.offset}+{span.capacity} of parity arena "
                                f"{self.id} is not in use")
        del self.used[span.offset]
        offset, nbytes = span.offset, span.capacity
        after = self.free.pop(offset + nbytes, 0)           # merge with the next extent
        before = max((o for o in self.free if o < offset), default=None)
        if before is not None and before + self.free[before] == offset:
            self.free[before] += nbytes + after              # and with the previous one
        else:
            self.free[offset] = nbytes + after
        if not self.used:
            self.emptied_at = time.monotonic()

    def largest_free(self) -> int:
        return max(self.free.values(), default=0)


@dataclasses.dataclass(eq=False)
class ParitySpan(Buffer):
    """An allocation's (or a slab's) parity: bytes [offset, offset + capacity) of its
    arena's memory, laid out as any parity region (daemon/ecc/layout.py) for `blocks`
    blocks."""
    arena: ParityArena
    offset: int
    capacity: int
    device: str
    blocks: int = 0

    @property
    def where(self) -> tuple[int, int, int]:
        """(arena id, offset, bytes): what the registry records of it."""
        return (self.arena.id, self.offset, self.capacity)


def is_span(parity) -> TypeGuard[ParitySpan]:
    return isinstance(parity, ParitySpan)


class ArenaPool:
    """The parity arenas in memory, by id and by device."""

    def __init__(self, raw):
        self.raw = raw
        self.arenas: dict[int, ParityArena] = {}

    def find(self, device: str, nbytes: int) -> ParitySpan | None:
        """A span of `nbytes` in one of the device's arenas; None: a new arena is needed
        (the core makes it: daemon/core/arenas.py)."""
        for arena in self.arenas.values():
            if arena.device == device and not arena.retired and \
                    arena.largest_free() >= nbytes:
                span = arena.take(nbytes)
                if span is not None:
                    return span
        return None

    def next_arena_bytes(self, device: str, nbytes: int) -> int:
        """The size of the device's next arena: a quarter of what its arenas hold already,
        at least a granule and what `nbytes` needs, at most ARENA_MAX_BYTES. Growing by a
        quarter keeps the last arena's empty part under a fifth of the parity held (by
        doubling, half: 2,000 objects of 2 MiB held 510 MiB of arenas for 258 MiB of
        spans on the H200), in about 25 arenas per GiB of parity."""
        dev = self.raw.device(device)
        held = sum(a.capacity for a in self.arenas.values() if a.device == device)
        want = round_up(max(min(ARENA_MAX_BYTES, held // 4), dev.granularity, nbytes),
                        dev.granularity)
        least = round_up(nbytes, dev.granularity)
        # Near a full device, an arena as small as the span needs: not an out-of-memory
        # error that names a size no request asked for.
        return want if want <= dev.free else least

    def make(self, arena_id: int, device: str, nbytes: int) -> ParityArena:
        """A new arena's memory, zeroed (a span's parity is written before it is used, but
        zeros make a lost span read as what a zero block's parity is)."""
        self.raw.check_free(self.raw.device(device), nbytes)
        data = self.raw.allocate(nbytes, device, label=f"parity-arena{arena_id}")
        try:
            if not self.raw.fresh_memory_is_zero:
                self.raw.zero(data, 0, nbytes)
        except BaseException:
            self.raw.free(data)
            raise
        return self.add(ParityArena(arena_id, device, data))

    def add(self, arena: ParityArena) -> ParityArena:
        self.arenas[arena.id] = arena
        return arena

    def drop(self, arena: ParityArena) -> None:
        """Free an arena's memory (it holds no span)."""
        if arena.used:
            raise InternalError(f"parity arena {arena.id} still holds {len(arena.used)} spans")
        self.arenas.pop(arena.id, None)
        self.raw.free(arena.data)

    def release(self, span: ParitySpan) -> None:
        arena = span.arena
        arena.give_back(span)
        if arena.retired and not arena.used:
            self.drop(arena)

    def bytes_per_device(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for a in self.arenas.values():
            out[a.device] = out.get(a.device, 0) + a.capacity
        return out

    def use_per_device(self) -> dict[str, dict]:
        """Device UUID -> {count, bytes, used_bytes} of its arenas (status, metrics)."""
        out: dict[str, dict] = {}
        for a in self.arenas.values():
            use = out.setdefault(a.device, {"count": 0, "bytes": 0, "used_bytes": 0,
                                            "spans": 0})
            use["count"] += 1
            use["bytes"] += a.capacity
            use["used_bytes"] += a.used_bytes
            use["spans"] += len(a.used)
        return out
