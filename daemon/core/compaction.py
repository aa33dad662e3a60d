"""Compaction: the objects of a slab kind's least used slabs moved into free slots of its
fuller ones, so that the slabs emptied give their memory back (docs/storage.md,
"Compaction and fragmentation").

A slab kind is (owner uid, device, ECC mode, size class): an object only ever moves to a
slab of its own kind, so never to another owner's slab (a slab holds one owner's bytes:
docs/security.md) nor to another device.

One move, in crash-safe order (a kill -9 anywhere leaves the old placement or the new one,
each with the object's bytes and their parity):
1. under the object's parity lock, its blocks are verified where it is: a move never
   re-encodes damage into fresh parity (a damaged object stays where it is, for verify and
   scrub to see);
2. its slot's bytes are copied into a free slot of a fuller slab, and that slot's blocks
   encoded (stage);
3. the new placement (nodes.slab, nodes.slot) is committed, with fsync when the object is
   durable (commit). Slabs are the keeper's from their making, so there is no keeper call;
4. the old slot is given back, dirty: zeroed when it is taken again (Slabs.place). A slab
   left empty is freed (release, or the next sweep).
Before 3 the registry names the old slot, whose bytes and parity were not touched; the new
slot is free after a restart (dirty). From 3 on it names the new slot, whose bytes and
parity were written before the commit; the old one is free after a restart.

What never moves: an object with a holder of any kind (open handle, attachment, lease, a
file open on the mount, a dma-buf export: those have memory of their own anyway), one
being written or unsealed (its parity is stale by design), one whose parity a worker is
encoding (its parity lock is taken without waiting), one with damage or not ready, and one
that shares a block with a neighbour in one of those states (a verify there would judge
the neighbour's new bytes). A destination slot is taken only in a block whose neighbours
are settled, so that encoding it never blesses a neighbour's damage.

The work is cut into slices (SLICE_OBJECTS objects or SLICE_SECONDS, whichever comes
first), each committed as one change; `steps` yields between slices so that its caller lets
the event loop run (daemon/verbs/compaction.py).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Generator
from typing import Any

from ..backends.packed import PackedBackend, own_parity_bytes
from ..backends.slabs import Slab, Slot, SlotParity, placement
from ..ecc.layout import BLOCK
from ..registry import Registry
from .custody import Custody
from .journal import Journal
from .nodes import Allocation
from .parity import neighbours_unsettled, unsettled

log = logging.getLogger("gpumemd")

SLICE_OBJECTS = 64         # objects moved in one slice (one commit) at most
SLICE_SECONDS = 0.005      # and about this long: the event loop runs between slices
REPORT_LIMIT = 1000        # moves and skips an answer lists at most (the counts are whole)


@dataclasses.dataclass(eq=False)
class Move:
    """One object on its way: `old` its slot now, `new` the slot its bytes were copied to."""
    alloc: Allocation
    old: Slot
    new: Slot


@dataclasses.dataclass
class Pass:
    """What one pass did (or, dry, would do)."""
    dry_run: bool
    moved: list[tuple[Allocation, dict, dict]] = dataclasses.field(default_factory=list)
    moved_count: int = 0
    moved_bytes: int = 0
    skipped: list[tuple[Allocation, str]] = dataclasses.field(default_factory=list)
    skipped_count: int = 0
    emptied: list[Slab] = dataclasses.field(default_factory=list)
    freed: list[dict] = dataclasses.field(default_factory=list)

    def note_move(self, alloc: Allocation, old: dict, new: dict, nbytes: int) -> None:
        self.moved_count += 1
        self.moved_bytes += nbytes
        if len(self.moved) < REPORT_LIMIT:
            self.moved.append((alloc, old, new))

    def note_skip(self, alloc: Allocation, reason: str) -> None:
        self.skipped_count += 1
        if len(self.skipped) < REPORT_LIMIT:
            self.skipped.append((alloc, reason))


def slab_bytes(slab: Slab) -> int:
    """What freeing `slab` gives back to the device: its data, and its parity where that
    is a buffer of its own (a span goes back to its parity arena)."""
    return slab.capacity + own_parity_bytes(slab)


class Compaction:
    def __init__(self, registry: Registry, journal: Journal, backend: PackedBackend,
                 custody: Custody):
        self.registry = registry
        self.journal = journal
        self.backend = backend
        self.custody = custody
        self.parity = custody.parity
        self.slabs = custody.slabs

    # ---- what may move, and where ---------------------------------------------------------
    @staticmethod
    def unmovable(alloc: Any) -> str | None:
        """Why the allocation in a slot may not move now; None: it may."""
        if not isinstance(alloc, Allocation) or not isinstance(alloc.buffer, Slot):
            return "not an allocation in a slot"
        if alloc.holders or alloc.unlinked:
            return "held (open, attached, leased or open on the mount)"
        if alloc.state != "ready" or alloc.damaged:
            return f"{alloc.state}, with damage" if alloc.damaged else alloc.state
        if unsettled(alloc) or alloc.let_go is not None or alloc.untracked:
            return "being written or unsealed: its parity is not settled"
        if neighbours_unsettled(alloc):
            return "a neighbour in its block is being written"
        return None

    @staticmethod
    def block_settled(slab: Slab, offset: int) -> bool:
        """Whether the used slots in the block(s) that a slot at `offset` lies in are all
        settled allocations (so that encoding the block judges nobody's new bytes)."""
        if slab.slot >= BLOCK:
            return True
        start = offset // BLOCK * BLOCK
        for off in range(start, start + BLOCK, slab.slot):
            slot = slab.used.get(off)
            if slot is None:
                continue
            tenant = slot.tenant
            if not isinstance(tenant, Allocation) or tenant.state != "ready" or \
                    tenant.damaged or unsettled(tenant):
                return False
        return True

    def kinds(self) -> dict[tuple, list[Slab]]:
        """The slabs in memory by kind, those that hold something only."""
        out: dict[tuple, list[Slab]] = {}
        for slab in self.backend.pool.slabs.values():
            if slab.used and not slab.retired:
                out.setdefault(slab.key, []).append(slab)
        return out

    def plan(self, done: Pass | None = None) -> list[tuple[Slab, list[Slab]]]:
        """The slabs to empty, least used first, each with the slabs of its kind its objects
        may go to. A slab is on the list only when every object in it may move now and the
        other slabs of its kind (those not emptied themselves) have free slots for all of
        them: a move that frees nothing is not made. `done`: where to note the object that
        kept a slab from being emptied (one per slab)."""
        drains: list[tuple[Slab, list[Slab]]] = []
        for same in self.kinds().values():
            if len(same) < 2:
                continue
            same.sort(key=lambda s: (len(s.used), s.capacity, s.id))
            emptied: list[Slab] = []
            room = sum(len(s.free_slots) for s in same)
            for slab in same:
                others = room - len(slab.free_slots)
                if len(slab.used) > others:
                    continue
                blocker = next(((s.tenant, why) for s in slab.used.values()
                                if (why := self.unmovable(s.tenant)) is not None), None)
                if blocker is not None:
                    if done is not None and isinstance(blocker[0], Allocation):
                        done.note_skip(blocker[0], blocker[1])
                    continue
                emptied.append(slab)
                room = others - len(slab.used)
            kept = [s for s in same if s not in emptied]
            drains += [(slab, kept) for slab in emptied]
        return drains

    # ---- one move's steps, in their crash-safe order ----------------------------------------
    def stage(self, alloc: Allocation, targets: list[Slab]) -> Move | None:
        """Steps 1 and 2: verify where it is, copy into a free slot of the first target with
        one in a settled block, encode there. None when no such slot is free. The caller
        holds the allocation's parity lock until the move is committed or given up."""
        old = alloc.buffer
        ecc = old.slab.parity is not None
        if ecc:
            count = max(1, old.capacity // BLOCK)
            if self.parity.check(alloc, 0, count, repair=False)["damaged"]:
                return None
        for slab in targets:
            if slab.retired or self.backend.pool.slabs.get(slab.id) is not slab:
                continue
            offset = next((o for o in reversed(slab.free_slots)
                           if self.block_settled(slab, o)), None)
            if offset is None:
                continue
            new = slab.take(offset)
            new.tenant = alloc      # (its block is settled for the slice's next moves too)
            move = Move(alloc, old, new)
            try:
                self.backend.copy(old, new, old.capacity)
                if ecc:
                    self.parity.encode_slot(new)
            except BaseException:
                self._unstage(move)
                raise
            new.clean = False
            return move
        return None

    def commit(self, moves: list[Move]) -> None:
        """Step 3: the new placements, in one change (fsynced if any object is durable). If
        it fails, every allocation is back in its old slot (the journal's undo log); the
        caller gives the new slots back (abandon)."""
        with self.journal.change(durable=any(m.alloc.durable for m in moves)):
            for move in moves:
                alloc = move.alloc
                self.journal.keep(alloc, "buffer", "parity")
                alloc.buffer = move.new
                if alloc.parity is not None:
                    alloc.parity = SlotParity(move.new.slab, move.new.offset)
                self.registry.nodes.update(alloc.id, **placement(move.new))

    @staticmethod
    def _unstage(move: Move) -> None:
        move.new.slab.give_back(move.new)
        move.new.tenant = None

    def abandon(self, moves: list[Move]) -> None:
        """Staged moves that will not be committed: their new slots are free again."""
        for move in moves:
            self._unstage(move)

    def finish(self, moves: list[Move]) -> None:
        """Step 4: the old slots given back (dirty: zeroed when taken again)."""
        for move in moves:
            self.backend.free(move.old)

    # ---- a pass ---------------------------------------------------------------------------
    def steps(self, dry_run: bool = False) -> Generator[int, None, Pass]:
        """A pass over every slab kind: a generator that yields (the objects moved so far)
        after each slice, and returns what it did. Between slices anything may have
        changed: each object is checked again when its turn comes, and a slab one of whose
        objects may no longer move is left (the objects moved out of it meanwhile are in
        fuller slabs: no harm)."""
        done = Pass(dry_run)
        drains = self.plan(done)
        if dry_run:
            return self._dry(drains, done)
        for slab, targets in drains:
            pending = list(slab.used.values())
            while pending:
                pending, gave_up = self._slice(pending, targets, done)
                if gave_up:
                    break
                if pending:
                    yield done.moved_count
            if not slab.used:
                done.emptied.append(slab)
            yield done.moved_count
        done.freed = [self._freed(s) for s in done.emptied]
        self.slabs.release(done.emptied)
        return done

    def _slice(self, pending: list[Slot], targets: list[Slab],
               done: Pass) -> tuple[list[Slot], bool]:
        """Move up to SLICE_OBJECTS of `pending` (or for SLICE_SECONDS) into `targets`, and
        commit them. Returns what is left, and whether the slab was given up."""
        moves: list[Move] = []
        deadline = time.monotonic() + SLICE_SECONDS
        gave_up = False
        with contextlib.ExitStack() as locks:
            while pending and len(moves) < SLICE_OBJECTS and \
                    (not moves or time.monotonic() < deadline):
                slot = pending.pop()
                alloc = slot.tenant
                if slot.slab.used.get(slot.offset) is not slot or \
                        not isinstance(alloc, Allocation) or alloc.buffer is not slot:
                    continue                    # gone meanwhile (removed, resized)
                reason = self.unmovable(alloc)
                move = None
                if reason is None and alloc.parity_lock.acquire(blocking=False):
                    locks.callback(alloc.parity_lock.release)
                    move = self._stage_quietly(alloc, targets, moves)
                    reason = "no free slot in a settled block of a fuller slab, or its " \
                             "blocks do not verify"
                elif reason is None:
                    reason = "its parity is being encoded"
                if move is None:
                    done.note_skip(alloc, reason)
                    gave_up = True
                    break
                moves.append(move)
            if moves:
                self._commit_slice(moves, done)
        return pending, gave_up

    def _commit_slice(self, moves: list[Move], done: Pass) -> None:
        try:
            self.commit(moves)
        except BaseException:
            # Rolled back (the journal put each allocation's buffer back): the new slots are
            # free again. Had the commit happened, the old slots go as after a success.
            self.abandon([m for m in moves if m.alloc.buffer is m.old])
            self.finish([m for m in moves if m.alloc.buffer is m.new])
            raise
        for move in moves:
            done.note_move(move.alloc, {"slab": move.old.slab.id, "slot": move.old.offset},
                           placement(move.new), move.old.capacity)
        self.finish(moves)

    def _stage_quietly(self, alloc: Allocation, targets: list[Slab],
                       moves: list[Move]) -> Move | None:
        """stage() into the targets, fullest first; the slice's staged moves abandoned if
        it fails."""
        ranked = sorted(targets, key=lambda s: (-len(s.used), s.id))
        try:
            return self.stage(alloc, ranked)
        except BaseException:
            self.abandon(moves)
            raise

    def _dry(self, drains: list[tuple[Slab, list[Slab]]], done: Pass) -> Pass:
        room = {s.id: len(s.free_slots) for _, targets in drains for s in targets}
        for slab, targets in drains:
            for slot in list(slab.used.values()):
                to = next((t for t in targets if room.get(t.id, 0) > 0), None)
                if to is None:
                    break
                room[to.id] -= 1
                assert isinstance(slot.tenant, Allocation)      # plan() checked it
                done.note_move(slot.tenant, {"slab": slab.id, "slot": slot.offset},
                               {"slab": to.id, "slot": None}, slab.slot)
            done.emptied.append(slab)
        done.freed = [self._freed(s) for s in done.emptied]
        return done

    @staticmethod
    def _freed(slab: Slab) -> dict:
        return {"slab": slab.id, "uid": slab.uid, "device": slab.device, "ecc": slab.ecc,
                "class": slab.slot, "bytes": slab.capacity,
                "parity_bytes": own_parity_bytes(slab)}

    # ---- when housekeeping runs a pass ------------------------------------------------------
    def slack(self) -> dict[str, tuple[int, int]]:
        """Device UUID -> (bytes, slack bytes) of the slabs that compaction could act on:
        those holding something, of kinds with several such slabs."""
        out: dict[str, tuple[int, int]] = {}
        for same in self.kinds().values():
            if len(same) < 2:
                continue
            for slab in same:
                total, slack = out.get(slab.device, (0, 0))
                out[slab.device] = (total + slab.capacity,
                                    slack + len(slab.free_slots) * slab.slot)
        return out
