"""Integrity: parity freshness, verify and repair, and the damage record (docs/ecc.md).

What it keeps true: an allocation's parity covers its data except where that is known and
recorded. Writes through the daemon mark a dirty range (re-encoded at sync); a socket client
writing through its own fd re-encodes all at its close; an attached writer leaves the
allocation `unsealed` until it seals; a durable allocation with writes in flight carries
the WRITING mark in the registry, so a crash rebuilds parity from the data rather than
"repairing" the writes away. Blocks found damaged are recorded (state `degraded`) and read
as EIO until repaired or overwritten whole.

It changes no tree and no keeper: where new parity memory must reach the keeper, it says so
and the caller deposits (daemon/core/custody.py).
"""
from __future__ import annotations

import dataclasses
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

from gpumemctl.protocol import InvalidState, Uncorrectable, UsageError
from gpumemctl.protocol.defaults import SNAPSHOT_BLOCK

from ..backends import Backend
from ..ecc.layout import BLOCK
from ..registry import Registry
from .describe import damaged_ranges
from .journal import Journal
from .namespace import SEALED, UNSEALED, WRITING
from .nodes import Allocation
from .parity import Parity, block_range, neighbours_unsettled, protected_blocks
from .permissions import Credentials

log = logging.getLogger("gpumemd")

MAX_TRACKED_BLOCKS = 1 << 20   # past this many changed blocks, "everything" is as good
DIRTY_NONE = (1 << 63, 0)   # (dirty_from, dirty_to) of an allocation with no unsynced write


def declared_span(written: dict | None) -> tuple[int, int] | None:
    """The one range [start, end) that covers a close's `written` report ({offset, bytes}
    or {ranges: [[start, end], ...]}); (0, 0) for an empty list; None when there is no
    report or it cannot be read (then anything may have been written)."""
    if not isinstance(written, dict) or not written:
        return None
    ranges = written.get("ranges")
    if ranges is None:
        offset, count = written.get("offset"), written.get("bytes")
        ranges = [[offset, offset + count]] if isinstance(offset, int) and \
            isinstance(count, int) and _natural(offset) and _natural(count) else None
    if not isinstance(ranges, list):
        return None
    if not all(isinstance(r, (list, tuple)) and len(r) == 2 and _natural(r[0]) and
               _natural(r[1]) and r[0] <= r[1] for r in ranges):
        return None
    if not ranges:
        return (0, 0)
    return (min(r[0] for r in ranges), max(r[1] for r in ranges))


def _natural(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _runs(blocks: list[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for b in blocks:
        if out and out[-1][1] == b:
            out[-1][1] = b + 1
        else:
            out.append([b, b + 1])
    return out


@dataclasses.dataclass(eq=False)
class ParityJob:
    """Encoding for a worker thread: the parity of bytes [start, end) of `alloc`, under its
    parity lock. Data written meanwhile is caught by the dirty range, which stays marked
    (Integrity.finish) until a later sync; the loop takes the same lock before it frees or
    replaces the memory, so the worker never reads memory that is gone."""
    alloc: Allocation
    parity: Parity
    start: int
    end: int
    heal: bool                    # a damaged block written whole is healed (finish)
    dirty: tuple[int, int]        # the dirty range when the job was made
    done: bool = False

    def run(self) -> None:
        with self.alloc.parity_lock:
            if self.alloc.buffer is not None and self.alloc.parity is not None:
                self.parity.encode(self.alloc, self.start, self.end)
        self.done = True


class Integrity:
    def __init__(self, registry: Registry, journal: Journal, backend: Backend):
        self.registry = registry
        self.journal = journal
        self.backend = backend
        self.parity = Parity(backend)
        # Settles the parity a mount file's close left to a later pass (Sizing.pending).
        self.settle_pending: Callable[[Allocation], None] = lambda alloc: None

    def writes_begin(self, alloc: Allocation) -> None:
        """Before the first write since the last sync to a protected durable allocation:
        record, with fsync, that its parity is about to go stale. A crash before the sync
        then rebuilds the parity from the data (_settle_parity), and only then: a crash
        never "repairs" pending writes away, nor blesses corruption elsewhere."""
        if alloc.writing or alloc.unsealed or alloc.parity is None or not alloc.durable \
                or alloc.unlinked:
            return
        with self.journal.change(durable=True):
            self.registry.nodes.update(alloc.id, unsealed=WRITING)
        alloc.writing = True

    def writes_synced(self, alloc: Allocation) -> None:
        if not alloc.writing:
            return
        alloc.writing = False
        if not alloc.unlinked:
            with self.journal.change(durable=False):
                self.registry.nodes.update(alloc.id, unsealed=SEALED)

    def settle(self, allocations: list[Allocation], damage: dict[int, set[int]],
               deposit: Callable[[Allocation], None]) -> int:
        """After adoption: give each protected allocation its parity and its damage list.
        Kept parity is used as it is, except where writes were in flight at a crash (the
        WRITING mark): there the data is what the writers left, so the parity is rebuilt
        from it rather than the data "repaired" back (docs/ecc.md, "After a crash").
        `deposit` hands a durable allocation's new parity to the keeper (Custody.deposit)."""
        rebuilt = 0
        for alloc in allocations:
            alloc.damaged = damage.get(alloc.id, set())
            if not self.parity.wanted(alloc):
                continue
            if not self.parity.fits(alloc):
                self.parity.free(alloc)
                self.parity.ensure(alloc)
                if alloc.durable:
                    deposit(alloc)
                rebuilt += protected_blocks(alloc)
            elif alloc.writing and not alloc.unsealed:
                # Writes were in flight when the daemon died: the data is what the writers
                # left; bring the parity to it rather than "repair" the data back.
                rebuilt += self.parity.encode(alloc, 0, alloc.size or 0)
                self.writes_synced(alloc)
                self.journal.event("parity", alloc, None, action="rebuilt",
                            reason="writes were in flight at an unclean stop")
        if rebuilt:
            log.info("parity rebuilt for %d blocks", rebuilt)
        return rebuilt

    @staticmethod
    def require_undamaged(alloc: Allocation, start: int, end: int) -> None:
        hit = sorted(b for b in block_range(start, end) if b in alloc.damaged)
        if hit:
            raise Uncorrectable(
                f"'{alloc.path}': bytes {hit[0] * BLOCK}-{(hit[-1] + 1) * BLOCK - 1} are "
                "damaged beyond repair, or found damaged and not repaired yet; `gpumemctl "
                "recover` retries the repair",
                details={"blocks": hit})

    def verify_steps(self, alloc: Allocation, repair: bool, first_block: int = 0):
        """Verify (and repair) an allocation piece by piece: a generator that yields after
        each piece (the caller lets the event loop run), and returns the totals. Between
        pieces the allocation may have been written, resized or removed: each piece
        re-reads its state. Blocks written since their last sync (their parity is stale
        by design), unsealed allocations and those a socket client has open for writing are
        skipped, not judged."""
        total: dict[str, Any] = {"path": alloc.path, "id": alloc.id, "ecc": alloc.ecc, "blocks": 0,
                 "clean": 0, "corrected": 0, "uncorrectable": 0, "skipped": 0,
                 "symbols": 0, "bytes": 0, "damaged": [], "uncorrectable_blocks": [],
                 "checked": []}
        if alloc.ecc != "rs" or alloc.state not in ("ready", "degraded"):
            total["skipped_reason"] = "no ECC" if alloc.ecc != "rs" else alloc.state
            return total
        self.settle_pending(alloc)        # judged, rather than skipped as unsettled
        block = first_block
        reached_end = False
        while True:
            if alloc.unlinked or alloc.parity is None:
                break
            stop = protected_blocks(alloc)
            if block >= stop:
                reached_end = True
                break
            count = min(self.parity.chunk_blocks, stop - block)
            if alloc.unsealed or alloc.holders_of("write") or neighbours_unsettled(alloc):
                # A socket client writing through its own fd: its bytes are newer than the
                # parity until its close, and a "repair" would revert them (a write of up to
                # 4 KiB per block is within what the code corrects). Skipped, not judged.
                total["skipped"] += stop - block
                break
            if not alloc.parity_lock.acquire(blocking=False):
                # Its parity is being encoded on a worker thread (ParityJob): neither old
                # nor new yet. Skipped, not judged.
                total["skipped"] += stop - block
                break
            try:
                self._verify_piece(alloc, block, count, repair, total)
            finally:
                alloc.parity_lock.release()
            block += count
            yield block
        if not alloc.unlinked:
            # Record what this pass found, repaired or not (docs/ecc.md, "Damage"): the
            # recorded blocks it checked are replaced by what it left damaged, that is
            # uncorrectable or, without --repair, found and not yet repaired.
            checked = total.pop("checked")
            healed = {b for b in alloc.damaged if any(a <= b < z for a, z in checked)}
            bad = set(total["uncorrectable_blocks"]) | set(total["damaged"])
            self._record_pass(alloc, (alloc.damaged - healed) | bad, reached_end,
                              reason="verify" if repair else "verify without --repair",
                              judged=repair)
        total.pop("checked", None)
        total["damaged_ranges"] = self.damaged_ranges(alloc)
        return total

    def _record_pass(self, alloc: Allocation, damaged: set[int], reached_end: bool,
                     reason: str, judged: bool) -> None:
        """What a pass found, in one change: the damage it left (set_damage) and, when it
        reached the allocation's last protected block, when it did (the TUI's and `info`'s
        "verified"; blocks skipped as unsynced still count: their parity is rebuilt at the
        next sync, not judged). A failure records neither: never "verified" without its
        damage."""
        if not reached_end:
            self.set_damage(alloc, damaged, None, reason=reason, judged=judged)
            return
        now = time.time_ns()
        with self.journal.change(durable=alloc.durable, batch=not alloc.durable):
            self.journal.keep(alloc, "verified_ns")
            alloc.verified_ns = now
            self.registry.nodes.update(alloc.id, verified_ns=now)
            changed = self.record_damage(alloc, damaged, None, reason)
        if changed:
            self.log_damage(alloc, reason, judged)

    def _verify_piece(self, alloc: Allocation, first: int, count: int, repair: bool,
                      total: dict) -> None:
        dirty = block_range(alloc.dirty_from, alloc.dirty_to)
        lo, hi = first, first + count
        pieces = [(lo, hi)]
        if dirty and dirty.start < hi and dirty.stop > lo:       # skip the unsynced blocks
            pieces = [(lo, max(lo, dirty.start)), (min(hi, dirty.stop), hi)]
            total["skipped"] += min(hi, dirty.stop) - max(lo, dirty.start)
        for a, b in pieces:
            if b <= a:
                continue
            found = self.parity.check(alloc, a, b - a, repair)
            if found["corrected"]:
                self.changed_all(alloc)        # repaired bytes are written bytes
            total["blocks"] += b - a
            total["bytes"] += min((b - a) * BLOCK, max(0, (alloc.size or 0) - a * BLOCK))
            total["clean"] += found["clean"]
            total["corrected"] += found["corrected"]
            total["symbols"] += found["symbols"]
            total["uncorrectable"] += len(found["uncorrectable"])
            total["uncorrectable_blocks"] += found["uncorrectable"]
            total["damaged"] += found["damaged"]          # found without --repair
            total["checked"].append((a, b))

    def set_damage(self, alloc: Allocation, damaged: set[int], cred: Credentials | None,
                    reason: str, judged: bool = True) -> None:
        """Record the damaged blocks: beyond repair, or (not `judged`) found by a verify
        without --repair and not yet repaired. Either way they read as EIO and the
        allocation is degraded while there are any. In a change of its own (or the
        caller's, which it joins), logged once that committed."""
        if damaged == alloc.damaged and (alloc.state == "degraded") == bool(damaged):
            return
        with self.journal.change(durable=alloc.durable):
            changed = self.record_damage(alloc, damaged, cred, reason)
        if changed:
            self.log_damage(alloc, reason, judged)

    def record_damage(self, alloc: Allocation, damaged: set[int], cred: Credentials | None,
                      reason: str) -> bool:
        """set_damage's rows, state and event, inside the caller's change (its rollback
        takes the in-memory part back); False if nothing changes. The caller logs it
        (log_damage) once the change committed."""
        if damaged == alloc.damaged and (alloc.state == "degraded") == bool(damaged):
            return False
        before = sorted(alloc.damaged)
        state = "degraded" if damaged else "ready"
        with self.journal.change(durable=alloc.durable):
            self.registry.damaged.replace(alloc.id, damaged, time.time_ns())
            self.registry.nodes.update(alloc.id, state=state)
            self.journal.keep(alloc, "damaged", "state")
            alloc.damaged, alloc.state = set(damaged), state
            if damaged:
                self.journal.event("damage", alloc, cred, reason=reason, blocks=sorted(damaged),
                            ranges=self.damaged_ranges(alloc))
            else:
                self.journal.event("healed", alloc, cred, reason=reason, blocks=before)
        return True

    def log_damage(self, alloc: Allocation, reason: str, judged: bool = True) -> None:
        """The log's line for damage recorded (record_damage), once it committed."""
        if not alloc.damaged:
            return
        if judged:
            log.error("'%s' has %d block(s) damaged beyond repair (%s): %s", alloc.path,
                      len(alloc.damaged), reason, self.damaged_ranges(alloc))
        else:
            log.warning("'%s' has %d damaged block(s) not repaired (%s): %s; `gpumemctl "
                        "verify --repair` or `recover` repairs what ECC can", alloc.path,
                        len(alloc.damaged), reason, self.damaged_ranges(alloc))

    damaged_ranges = staticmethod(damaged_ranges)

    @staticmethod
    def protected_bytes(alloc: Allocation) -> int:
        """The bytes of `alloc` that ECC protects now: its size when it has rs parity and
        memory, else none (what a verify of it goes through)."""
        if alloc.ecc != "rs" or alloc.state not in ("ready", "degraded"):
            return 0
        return alloc.size or 0

    def protect_resized(self, alloc: Allocation, old_size: int, fresh: bool) -> bool:
        """After a resize: parity sized for the new capacity (a new region is encoded
        whole), or, with the same capacity, the blocks between the two sizes re-encoded.
        True when the parity is new memory: a durable allocation's keeper copy must follow."""
        with alloc.parity_lock:
            if self.parity.ensure(alloc, fresh=fresh,
                                  keep_below=min(old_size or 0, alloc.size)):
                return True
            if alloc.parity is not None and not alloc.unsealed:
                self.parity.encode(alloc, min(old_size, alloc.size),
                                   max(old_size, alloc.size))
        return False

    @property
    def chunk_blocks(self) -> int:
        """The blocks of one piece of ECC work (verify_steps yields after each)."""
        return self.parity.chunk_blocks

    def corrupt(self, alloc: Allocation, cred: Credentials, offset: int, length: int,
                pattern: bytes, parity: bool) -> dict:
        """Fault injection (Checks.corrupt has checked who asks): overwrite
        bytes of the data, or of the parity region, without updating the parity."""
        target = alloc.parity if parity else alloc.buffer
        if target is None:
            raise InvalidState(f"'{alloc.path}' has no parity (ecc {alloc.ecc})")
        limit = target.capacity
        if offset < 0 or length < 1 or offset + length > limit or not pattern:
            region = "parity region" if parity else "data"
            raise UsageError(f"invalid range {offset}+{length}: the {region} of "
                             f"'{alloc.path}' has {limit} bytes; the pattern must not be empty")
        data = (pattern * (length // len(pattern) + 1))[:length]
        self.backend.write(target, offset, data)
        with self.journal.change(durable=False):
            self.journal.event("corrupt", alloc, cred, offset=offset, length=length,
                        parity=parity)
        return {"path": alloc.path, "offset": offset, "length": length, "parity": parity}

    # ---- the parity's life with the memory ----------------------------------------------
    def protect_new(self, alloc: Allocation) -> None:
        """Parity for a new allocation (zeroed memory: its parity is computed, not read)."""
        self.parity.ensure(alloc, fresh=True)

    def release(self, alloc: Allocation) -> None:
        self.parity.free(alloc)

    # ---- parity work, on a worker thread or here -----------------------------------------
    def job_written(self, alloc: Allocation) -> ParityJob | None:
        """At fsync(2) or the close of a mount file that wrote: the parity of the range
        written through the daemon since the last sync (None: nothing to do)."""
        if alloc.dirty_to <= alloc.dirty_from:
            return None
        return self._job(alloc, alloc.dirty_from, alloc.dirty_to, heal=True)

    def job_all(self, alloc: Allocation, written: dict | None = None) -> ParityJob | None:
        """At the close of a socket handle that wrote: the client wrote through its own fd,
        where the daemon cannot see. With a `written` report ({offset, bytes} or {ranges}),
        the span it declares is encoded (a 4 KiB write into 1 GiB encodes one block, not
        the 1 GiB); without one, or one that cannot be read, all of it. The report is the
        client's word about its own writes only: bytes it wrote and did not declare keep
        stale parity, which a scrub then reports in this allocation and no other's."""
        span = declared_span(written)
        start, end = span if span is not None else (0, alloc.size or 0)
        if end <= start:
            return None
        return self._job(alloc, start, min(end, alloc.size or 0), heal=False)

    def _job(self, alloc: Allocation, start: int, end: int, heal: bool) -> ParityJob | None:
        if alloc.unsealed:                 # seal encodes it all
            alloc.dirty_from, alloc.dirty_to = DIRTY_NONE
            return None
        if alloc.unlinked or alloc.parity is None:
            return None
        return ParityJob(alloc, self.parity, start, end, heal,
                         (alloc.dirty_from, alloc.dirty_to))

    def finish(self, job: ParityJob | None) -> None:
        """After a job (run here if no worker ran it): the range written is clean again
        unless written meanwhile, a damaged block that a write replaced whole is healed,
        and with nothing left unsynced the crash mark goes (writes_synced)."""
        if job is None:
            return
        alloc = job.alloc
        if not job.done:
            job.run()
        if (alloc.dirty_from, alloc.dirty_to) == job.dirty:   # not written meanwhile
            alloc.dirty_from, alloc.dirty_to = DIRTY_NONE
        if alloc.unlinked or alloc.parity is None:
            return
        if alloc.dirty_to <= alloc.dirty_from:
            self.writes_synced(alloc)
        healed = {b for b in block_range(job.start, job.end)
                  if b * BLOCK >= job.start and (b + 1) * BLOCK <= job.end} & alloc.damaged
        if job.heal and healed:
            self.set_damage(alloc, alloc.damaged - healed, None, reason="overwritten")

    def note_written(self, alloc: Allocation, start: int, end: int) -> None:
        """A write through the daemon (write_at): the range whose parity is now stale."""
        alloc.dirty_from = min(alloc.dirty_from, start)
        alloc.dirty_to = max(alloc.dirty_to, end)
        self.changed(alloc, start, end)

    # ---- what changed since a snapshot (incremental snapshots, op `changes`) -------------
    # Every path that writes an allocation's memory reports here: writes through the daemon
    # (note_written), a socket writer's close (its `written` ranges, or everything), an
    # attached writer, a resize, a repair, a refill. What cannot be seen (a dma-buf's
    # writer, a write through the fd of a read handle on the cuda backend, which CUDA
    # cannot refuse) is the same blind spot the parity has (docs/snapshots.md).
    @staticmethod
    def changed(alloc: Allocation, start: int, end: int) -> None:
        if alloc.changed is None or end <= start:
            return
        alloc.changed.update(range(start // SNAPSHOT_BLOCK, -(-end // SNAPSHOT_BLOCK)))
        if len(alloc.changed) > MAX_TRACKED_BLOCKS:
            alloc.changed = None

    @staticmethod
    def changed_all(alloc: Allocation) -> None:
        alloc.changed = None

    def note_close_written(self, alloc: Allocation, written: dict | None) -> None:
        """A socket write handle closed, reporting `written` ({offset, bytes} or {ranges}):
        those blocks changed; without a report, all of it may have."""
        if not written:
            self.changed_all(alloc)
            return
        ranges = written.get("ranges")
        if ranges is None:
            offset, count = written.get("offset", 0), written.get("bytes", 0)
            ranges = [[offset, offset + count]] if isinstance(offset, int) and \
                isinstance(count, int) else None
        if not isinstance(ranges, list):
            self.changed_all(alloc)          # a report we cannot read: assume anything
            return
        for r in ranges:
            if not (isinstance(r, (list, tuple)) and len(r) == 2 and
                    all(isinstance(v, int) and v >= 0 for v in r)):
                self.changed_all(alloc)      # a report we cannot read: assume anything
                return
            self.changed(alloc, r[0], r[1])

    @staticmethod
    def take_changes(alloc: Allocation, reset: bool) -> dict:
        """The blocks changed since `token` was handed out (None: not known), as ranges of
        block indices; with `reset`, tracking starts afresh under a new token."""
        blocks = None
        if alloc.changed is not None and alloc.changes_token is not None \
                and not alloc.untracked:
            blocks = _runs(sorted(alloc.changed))
        out = {"token": alloc.changes_token, "blocks": blocks, "block_size": SNAPSHOT_BLOCK}
        if reset:
            alloc.changes_token = secrets.token_hex(8)
            alloc.changed = set()
        out["next"] = alloc.changes_token
        return out

    def job_seal(self, alloc: Allocation) -> ParityJob | None:
        """An attached writer's data is final (seal, detach): all of it is encoded."""
        if not alloc.unsealed or alloc.unlinked or alloc.parity is None or alloc.buffer is None:
            return None      # (asleep: its parity was encoded as it went to sleep)
        return ParityJob(alloc, self.parity, 0, alloc.size or 0, False,
                         (alloc.dirty_from, alloc.dirty_to))

    def encode_sealed(self, alloc: Allocation, job: ParityJob | None) -> None:
        """Before a seal commits: the parity of all the data, unless `job` (job_seal's, run
        on a worker thread meanwhile) did it."""
        if (job is None or not job.done) and alloc.buffer is not None:     # (see job_seal)
            with alloc.parity_lock:
                self.parity.encode(alloc, 0, alloc.size or 0)

    def unseal(self, alloc: Allocation) -> None:
        """An attached writer came: the parity cannot follow writes it does not see."""
        if alloc.unsealed:
            return
        alloc.unsealed = True
        with self.journal.change(durable=alloc.durable):
            self.registry.nodes.update(alloc.id, unsealed=UNSEALED)
        self.journal.node_changed(alloc)
