"""Parity for allocations with ECC on (`ecc == "rs"`): where it lives, when it is brought up
to date, and verify/repair (docs/ecc.md).

Each protected allocation has a parity region: RS(136,128) parity of every 128 KiB block,
then one checksum per block (daemon/ecc/layout.py). The region is a span of a parity arena
(daemon/backends/arenas.py, kept by the keeper whole: daemon/core/arenas.py), or, for
parity above SPAN_MAX_BYTES, with `parity_arenas = false`, or made before schema 13, a
backend buffer of its own that the keeper holds beside the data (the allocation's fds are
then [data, parity]). A slot's is its slab's. Only the blocks that hold bytes below the size
are protected; bytes past the size are undefined.

The codec runs where the memory is: the backend's `ecc()` (numpy on the host backend, CUDA
kernels on the cuda backend). Work is cut into pieces of at most `chunk_blocks` blocks, so
that a long verify never holds the event loop for long (callers yield between pieces).
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from gpumemctl.protocol import InternalError, round_up

from ..backends.arenas import ParitySpan, span_bytes
from ..backends.slabs import Slot, SlotParity
from ..ecc.layout import (
    BLOCK,
    CHECKSUM_BYTES,
    CLEAN,
    CORRECTED,
    PARITY_BLOCK,
    UNCORRECTABLE,
    blocks,
    parity_bytes,
)
from .nodes import Allocation

if TYPE_CHECKING:
    from .arenas import Arenas

log = logging.getLogger("gpumemd")


def protected_blocks(alloc: Allocation) -> int:
    """Blocks holding bytes below the size."""
    return -(-(alloc.size or 0) // BLOCK)


def capacity_of(alloc: Allocation) -> int:
    """The capacity of an allocation that has memory; a pending one has none, and asking
    for its parity is a bug."""
    if alloc.capacity is None:
        raise InternalError(f"{alloc.path} has no memory yet: no parity to work on")
    return alloc.capacity


def block_range(start: int, end: int) -> range:
    """The blocks that bytes [start, end) touch."""
    return range(start // BLOCK, -(-end // BLOCK)) if end > start else range(0)


class Parity:
    def __init__(self, backend, chunk_blocks: int | None = None):
        self.backend = backend
        # daemon/core/arenas.py's Arenas (Custody sets it); None: every parity region is a
        # buffer of its own
        self.arenas: Arenas | None = None
        # Pieces of about 10 ms: the host's numpy codec does ~100-200 MB/s, a GPU ~1 TB/s.
        self.chunk_blocks = chunk_blocks or (8 if backend.name == "host" else 8192)

    def prebuild(self) -> None:
        """Start compiling (or loading from the cache) the GPU codec's kernels on a thread,
        once start-up has re-adopted the keeper's memory (daemon/ecc/gpuimage.py: without
        the codec's numpy, whose import on the main thread had doubled the adoption phase
        after a kill -9)."""
        if self.backend.name == "cuda":
            _prebuild_codec(self.backend)

    # ---- the parity buffer --------------------------------------------------------------
    def size_for(self, alloc: Allocation) -> int:
        return self.extra_for(alloc.ecc, self.backend.device(alloc.device), capacity_of(alloc))

    def extra_for(self, ecc: str, dev, capacity: int) -> int:
        """Memory the parity of an allocation of `capacity` on `dev` takes (0: no ECC): a
        span's pages in an arena where it fits one, else `extra`."""
        nbytes = parity_bytes(capacity) if ecc == "rs" and not capacity % BLOCK else 0
        if nbytes and self.arenas is not None and self.arenas.fits(nbytes):
            return span_bytes(nbytes)
        return self.extra(ecc, dev, capacity)

    @staticmethod
    def extra(ecc: str, dev, capacity: int) -> int:
        """Memory the parity of an allocation of `capacity` on `dev` takes (0: no ECC) as a
        buffer of its own; a slot's is its share of its slab's parity."""
        if ecc != "rs":
            return 0
        if capacity % BLOCK:
            return capacity // 16
        return round_up(parity_bytes(capacity), dev.granularity)

    def own_size_for(self, alloc: Allocation) -> int:
        """The bytes of a parity buffer of its own for the allocation (the keeper's, at a
        restart: granules, as the backend made it)."""
        dev = self.backend.device(alloc.device)
        return round_up(parity_bytes(capacity_of(alloc)), dev.granularity)

    def fits(self, alloc: Allocation) -> bool:
        """Whether the allocation's parity region is the one its memory needs: its slab's
        for a slot (kept with the slab), else a span or a buffer of its own laid out for
        its capacity (one of its own made before the arenas stays until it must change)."""
        parity, buf = alloc.parity, alloc.buffer
        if isinstance(buf, Slot):
            return isinstance(parity, SlotParity) and parity.slab is buf.slab and \
                parity.offset == buf.offset
        if parity is None or isinstance(parity, SlotParity) or \
                parity.blocks != (alloc.capacity or 0) // BLOCK:
            return False
        if isinstance(parity, ParitySpan):
            return parity.capacity == span_bytes(parity_bytes(capacity_of(alloc)))
        return parity.capacity == self.own_size_for(alloc)

    def wanted(self, alloc: Allocation) -> bool:
        return alloc.ecc == "rs" and alloc.buffer is not None

    def ensure(self, alloc: Allocation, fresh: bool = False, keep_below: int = 0,
               encode: bool = True) -> bool:
        """Give the allocation a parity region of the right size for its capacity, up to
        date with the data. Returns True when a new region was made (the keeper must get
        it).

        - `fresh`: the data was just allocated; on a backend whose new memory reads as
          zeros (host memfds) a zeroed region is already right (the parity and the
          checksum of a zero block are zero), so nothing is encoded.
        - `keep_below`: a byte offset below which the data did not change (a resize): the
          old region's parity and checksums of the whole blocks there are carried over,
          and only the blocks from there on are encoded.
        - `encode` False, for a slot: the slab's parity is taken without encoding the slot's
          blocks (a write follows at once and marks them: Sizing._slot_parity_later)."""
        if not self.wanted(alloc):
            return False
        if isinstance(alloc.buffer, Slot):
            return self._ensure_slot(alloc, alloc.buffer, fresh, encode)
        if self.fits(alloc):
            return False          # (the checksums' place depends on the block count)
        total = blocks(capacity_of(alloc))
        new = self._region(alloc, total)
        old, alloc.parity = alloc.parity, new
        try:
            kept = self._carry_over(old, new, keep_below // BLOCK, total)
            if fresh and isinstance(new, ParitySpan):
                self.backend.zero(new, 0, new.capacity)   # a span may be reused: zeros
            elif not (fresh and self.backend.fresh_memory_is_zero):
                self.encode(alloc, kept * BLOCK, alloc.size or 0)
        except BaseException:
            alloc.parity = old
            self.backend.free(new)
            raise
        if old is not None:
            self._release(old)
        return True

    def _region(self, alloc: Allocation, total: int):
        """New parity memory laid out for `total` blocks: a span of an arena where it fits,
        else a buffer of its own."""
        nbytes = parity_bytes(capacity_of(alloc))
        if self.arenas is not None and self.arenas.fits(nbytes):
            return self.arenas.take(alloc.device or "", nbytes, total)
        new = self.backend.allocate(self.own_size_for(alloc), alloc.device,
                                    label=f"{alloc.path}#parity")
        new.blocks = total      # the layout it was made for (_carry_over)
        return new

    def _release(self, parity) -> None:
        """Parity memory no longer used: a span goes back to its arena once the open change
        commits (daemon/core/arenas.py says why), a buffer of its own now."""
        if isinstance(parity, ParitySpan) and self.arenas is not None:
            self.arenas.release(parity)
        else:
            self.backend.free(parity)

    def _ensure_slot(self, alloc: Allocation, slot: Slot, fresh: bool,
                     encode: bool = True) -> bool:
        """A slot's parity is its slab's. When the allocation has just come to this slot,
        the slot's blocks are encoded whole (bytes past the size included: they are in the
        slab's codewords), unless it is `fresh` in a clean slot (zeros the slab's parity
        already agrees with: a million creates run no codec). Never a new region: the
        keeper holds the slab's already."""
        old = alloc.parity
        if isinstance(old, SlotParity) and old.slab is slot.slab and old.offset == slot.offset:
            return False
        if slot.slab.parity is None:
            raise InternalError(f"{alloc.path} has ECC and its slab has no parity")
        alloc.parity = SlotParity(slot.slab, slot.offset)
        if old is not None:
            self._release(old)
        if encode and not (fresh and slot.clean):
            self.encode_slot(slot)
        slot.clean = False          # from now on its tenant writes
        return False

    def encode_slot(self, slot: Slot) -> None:
        """Encode the slab's blocks that `slot` lies in, whole."""
        parity = SlotParity(slot.slab, slot.offset)
        self.backend.ecc("encode", slot, parity, 0, max(1, slot.capacity // BLOCK), 0)

    def _carry_over(self, old, new, keep: int, total: int) -> int:
        """Copy the parity and checksums of blocks [0, keep) from the old region (laid out
        for `old.blocks` blocks) into the new one. Returns how many were copied."""
        if old is None or keep == 0 or isinstance(old, SlotParity):
            return 0
        old_total = old.blocks
        keep = min(keep, total, old_total)
        self.backend.copy(old, new, keep * PARITY_BLOCK)
        self.backend.copy(old, new, keep * CHECKSUM_BYTES,
                          src_offset=old_total * PARITY_BLOCK, dst_offset=total * PARITY_BLOCK)
        return keep

    def free(self, alloc: Allocation) -> None:
        if alloc.parity is not None:
            self._release(alloc.parity)
            alloc.parity = None

    # ---- the codec, piece by piece ------------------------------------------------------
    def _pieces(self, first: int, stop: int):
        for b in range(first, stop, self.chunk_blocks):
            yield b, min(self.chunk_blocks, stop - b)

    def _run(self, op: str, alloc: Allocation, first: int, count: int):
        # (a slot's blocks are its slab's: the packing layer ignores the count given here)
        return self.backend.ecc(op, alloc.buffer, alloc.parity, first, count,
                                -(-capacity_of(alloc) // BLOCK))

    def encode(self, alloc: Allocation, start: int, end: int) -> int:
        """Bring the parity of the blocks that bytes [start, end) touch up to date.
        Returns the number of blocks encoded."""
        if alloc.parity is None:
            return 0
        span = block_range(start, min(end, protected_blocks(alloc) * BLOCK))
        for first, count in self._pieces(span.start, span.stop):
            self._run("encode", alloc, first, count)
        return len(span)

    def check(self, alloc: Allocation, first: int, count: int, repair: bool) -> dict:
        """Verify (and with `repair`, repair) blocks [first, first+count). Returns counts
        and the blocks left uncorrectable."""
        status = self._run("verify", alloc, first, count)
        damaged = [first + i for i, s in enumerate(status) if s != CLEAN]
        clean, corrected, symbols, uncorrectable = count - len(damaged), 0, 0, []
        if repair:
            # Repair only the damaged blocks, each on its own (they are rare).
            for b in damaged:
                rstatus, fixed = self._run("repair", alloc, b, 1)
                if rstatus[0] == CORRECTED:
                    corrected += 1
                    symbols += int(fixed[0])
                elif rstatus[0] == UNCORRECTABLE:
                    uncorrectable.append(b)
                else:
                    clean += 1
        return {"blocks": count, "clean": clean, "corrected": corrected,
                "uncorrectable": uncorrectable, "symbols": symbols,
                "damaged": [] if repair else damaged}


def _prebuild_codec(backend) -> None:
    """The GPU codec's kernels compiled into the state directory's cache at start-up, on a
    thread (daemon/ecc/gpuimage.py, `prebuild`), not on the event loop at the first rs work."""
    from ..ecc.gpuimage import prebuild
    try:
        raw = getattr(backend, "raw", backend)      # the packing layer's own is not set
        prebuild([d.index for d in backend.devices()], raw.ecc_cache_dir)
    except Exception as exc:  # noqa: BLE001 - only a head start: the first use compiles
        log.debug("ECC kernels not prebuilt: %s", exc)


def neighbours_unsettled(alloc: Allocation) -> bool:
    """Whether a slot below a block shares its block's parity with an allocation whose
    parity is stale by design (written since its sync, unsealed, or held by a writer): then
    a verify of the block would judge, and a repair revert, that neighbour's new bytes."""
    buf = alloc.buffer
    if not isinstance(buf, Slot):
        return False
    for slot in buf.slab.neighbours(buf):
        other = slot.tenant
        if isinstance(other, Allocation) and unsettled(other):
            return True
    return False


def unsettled(alloc: Allocation) -> bool:
    """Whether the allocation's parity may be stale by design: written since its sync,
    unsealed, or held by a writer."""
    return bool(alloc.unsealed or alloc.writing or alloc.dirty_to > alloc.dirty_from
                or alloc.holders_of("write", "attach-w", "mount-w"))


def now_ns() -> int:
    return time.time_ns()
