"""Parity arenas kept: their registry rows, the keeper's deposits, and where each kept
allocation's parity span is (daemon/backends/arenas.py has the arenas in memory,
docs/storage.md "Parity arenas" the design).

Every arena is deposited in the keeper when it is made, under ARENA_KEY_BASE + its id, so a
span in it needs no keeper call of its own. Where a span is must survive a crash for the
allocations a restart takes back (durable ones): a slab's span is in its row, written with
it; a durable allocation's in `parity_spans`, written whenever the keeper is handed its
memory (Custody.handover: new memory, new parity) in the change that records it, and by the
namespace with a new durable allocation's row.

Orders (a kill -9 anywhere is safe):
- new arena: commit its row, memory, deposit (a crash before the deposit leaves a row the
  keeper holds nothing for: dropped at start; after the deposit and before the commit, a
  deposit the registry does not list: freed at start).
- a span given back goes back to its arena only once the change that stopped using it has
  committed (Arenas.release): before, the committed rows may still name it, and a span
  reused under a committed row would be another allocation's parity after a crash.
- an empty arena goes: commit the row's deletion, withdraw, free.
At a restart each durable allocation claims its span; one that cannot (its arena is gone,
another row claimed the bytes, the row is missing) has its parity rebuilt from the data, and
says so in the log.
"""
from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable

from gpumemctl.protocol import GpumemError

from ..backends.arenas import SPAN_MAX_BYTES, ArenaPool, ParityArena, ParitySpan, span_bytes
from ..backends.packed import PackedBackend
from ..keeper.link import KeeperGone
from ..registry import Registry
from .journal import Journal
from .nodes import Allocation

log = logging.getLogger("gpumemd")

ARENA_KEY_BASE = 1 << 50         # keeper keys of parity arenas: past every slab key
IDLE_SECONDS = 0.25              # an emptied arena is freed after this long unused (sweep)


def is_arena_key(key: int) -> bool:
    return key >= ARENA_KEY_BASE


def drop_unheld_and_residue(journal: Journal, keeper, delete: Callable[[int], None],
                            missing: Iterable[int], held: dict[int, list[int]], base: int,
                            noun: str) -> None:
    """A start's end of adopting slabs or arenas (ids under keeper keys base + id): the
    rows of those `missing` (listed, not adopted) go in one change; what the keeper
    holds and no row lists (`held`: crash residue) is withdrawn and freed, loudly."""
    missing = list(missing)
    if missing:
        with journal.change(durable=True):
            for row_id in missing:
                delete(row_id)
    for row_id, fds in held.items():
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(KeeperGone):
            keeper.withdraw(base + row_id)
        log.warning("freed %s %d that the keeper held and the registry does not list "
                    "(crash residue)", noun, row_id)


class Arenas:
    def __init__(self, registry: Registry, journal: Journal, backend: PackedBackend, keeper,
                 enabled: bool = True):
        self.registry = registry
        self.journal = journal
        self.backend = backend
        self.keeper = keeper
        self.enabled = enabled          # `parity_arenas = false`: parity of its own (as before)
        self._spans: dict[int, tuple[int, int, int]] = {}   # the span rows read at a start
        self.owed: dict[int, Allocation] = {}   # allocations whose span row is owed (note)
        journal.owed_steps.append(self.write_owed)

    @property
    def pool(self) -> ArenaPool:
        return self.backend.arenas

    # ---- spans ------------------------------------------------------------------------------
    def fits(self, parity_nbytes: int) -> bool:
        """Whether parity of `parity_nbytes` goes into a span (else a buffer of its own)."""
        return self.enabled and span_bytes(parity_nbytes) <= SPAN_MAX_BYTES

    def take(self, device: str, parity_nbytes: int, blocks: int) -> ParitySpan:
        """A span for parity of `parity_nbytes` laid out for `blocks` blocks, in one of the
        device's arenas (a new arena when none has room)."""
        nbytes = span_bytes(parity_nbytes)
        span = self.pool.find(device, nbytes)
        if span is None:
            span = self._new_arena(device, nbytes).take(nbytes)
            assert span is not None          # a new arena holds at least `nbytes`
        span.blocks = blocks
        return span

    def release(self, span: ParitySpan) -> None:
        """Give a span back once the open change commits (now, outside one): see the module
        docstring."""
        self.journal.on_commit(lambda: self.backend.free(span))

    def note(self, alloc: Allocation, in_tree: bool = True) -> None:
        """Record where a kept allocation's parity is (`parity_spans`): in the open change,
        else with the next one (owed). Nothing for a new allocation not yet in the tree
        (`in_tree` False: its row's insert records it: Tree.insert_node), nor when the row
        says so already.

        Outside a change this is a deposit before the change that records it (a durable
        mark, a pending file's first memory: that change writes the row), or one after the
        change that gave the allocation its new memory (a resize's parity is made after its
        commit): the row then goes with the next change, or housekeeping's (retry_owed). A
        crash before that finds a row whose bytes do not match the capacity, or none: that
        allocation's parity is rebuilt from its data, as for a missing span."""
        span = alloc.parity if isinstance(alloc.parity, ParitySpan) else None
        if not in_tree or self.registry.arenas.span_row(alloc.id) == \
                (span.where if span else None):
            self.owed.pop(alloc.id, None)
        elif self.journal.in_change:
            self._write(alloc, span)
        else:
            self.owed[alloc.id] = alloc

    def _write(self, alloc: Allocation, span: ParitySpan | None) -> None:
        if span is None:
            self.registry.arenas.drop_span(alloc.id)
        else:
            self.registry.arenas.put_span(alloc.id, span.where)
        if self.owed.pop(alloc.id, None) is not None:      # a rollback owes it again
            self.journal.on_rollback(lambda: self._owe(alloc))

    def _owe(self, alloc: Allocation) -> None:
        self.owed.setdefault(alloc.id, alloc)

    def write_owed(self) -> None:
        """The first step of every change (Journal.owed_steps): the rows owed."""
        for alloc in list(self.owed.values()):
            if alloc.kept and not alloc.unlinked:
                self.note(alloc)
            else:
                self.owed.pop(alloc.id, None)

    def retry_owed(self) -> int:
        """Housekeeping: owed rows are written now, by a change of their own."""
        if self.owed:
            try:
                with self.journal.change(durable=True):
                    pass                             # write_owed runs first
            except GpumemError as exc:
                log.warning("could not record where the parity of %d allocations is (%s); "
                            "retrying", len(self.owed), exc)
        return len(self.owed)

    # ---- arenas -----------------------------------------------------------------------------
    def _new_arena(self, device: str, nbytes: int) -> ParityArena:
        size = self.pool.next_arena_bytes(device, nbytes)
        with self.journal.change(durable=True):
            arena_id = self.registry.arenas.insert(device, size)
            arena = self.pool.make(arena_id, device, size)
            try:
                self._deposit(arena)
            except BaseException:
                self.pool.drop(arena)
                raise
            self.journal.on_rollback(lambda: self._forget(arena))
        log.debug("parity arena %d made: %d bytes on %s", arena.id, size, device)
        return arena

    def _deposit(self, arena: ParityArena) -> None:
        fds = self.backend.raw.keeper_fds(arena.data)
        try:
            self.keeper.deposit(ARENA_KEY_BASE + arena.id, fds, {
                "arena": arena.id, "capacity": arena.capacity, "device": arena.device,
                "registry": self.registry.identity.instance})
        finally:
            for fd in fds:
                os.close(fd)

    def _forget(self, arena: ParityArena) -> None:
        """An arena whose row was rolled back or deleted: withdrawn, freed (once empty)."""
        with contextlib.suppress(KeeperGone):
            self.keeper.withdraw(ARENA_KEY_BASE + arena.id)
        arena.retired = True
        self.pool.arenas.pop(arena.id, None)
        if not arena.used:
            self.backend.raw.free(arena.data)

    def keys(self) -> set[int]:
        return {ARENA_KEY_BASE + arena_id for arena_id in self.pool.arenas}

    def redeposit_all(self) -> int:
        for arena in list(self.pool.arenas.values()):
            self._deposit(arena)
        return len(self.pool.arenas)

    def close(self) -> None:
        """A clean stop: the daemon lets go of the arenas (the keeper keeps them)."""
        for arena in list(self.pool.arenas.values()):
            arena.used.clear()
            self.pool.drop(arena)

    def sweep(self, min_idle: float = 0.0) -> int:
        """Free the arenas no span uses, those empty for `min_idle` seconds at least (the
        housekeeping service, as for slabs). Returns how many went."""
        now = time.monotonic()
        gone = [a for a in list(self.pool.arenas.values()) if not a.used and
                (a.emptied_at is None or now - a.emptied_at >= min_idle)]
        if not gone:
            return 0
        try:
            with self.journal.change(durable=True):
                for arena in gone:
                    self.registry.arenas.delete(arena.id)
        except GpumemError as exc:      # housekeeping: the next sweep retries
            log.warning("could not free %d empty parity arenas now: %s", len(gone), exc)
            return 0
        for arena in gone:
            self._forget(arena)
        return len(gone)

    # ---- a restart ------------------------------------------------------------------------
    def adopt_all(self, kept: dict[int, list[int]]) -> set[int]:
        """Take the arenas out of `kept` (the keeper's holdings by key) and adopt those the
        registry lists; free the others. Returns the ids of listed arenas not adopted (their
        rows go: the spans in them are rebuilt)."""
        held = {key - ARENA_KEY_BASE: kept.pop(key) for key in list(kept) if is_arena_key(key)}
        missing: set[int] = set()
        for row in self.registry.arenas.load():
            fds = held.pop(row["id"], None)
            try:
                if fds is None:
                    raise KeyError("the keeper holds no memory for it")
                data = self.backend.raw.adopt(fds[:1], row["capacity"], row["device"])
                for fd in fds[1:]:
                    os.close(fd)
            except Exception as exc:  # noqa: BLE001 - its spans are rebuilt, said here
                log.warning("parity arena %d is not held (%s): the parity in it is rebuilt "
                            "from the data", row["id"], exc)
                missing.add(row["id"])
                continue
            self.pool.add(ParityArena(row["id"], row["device"], data))
        drop_unheld_and_residue(self.journal, self.keeper, self.registry.arenas.delete,
                                missing, held, ARENA_KEY_BASE, "parity arena")
        self._spans = self.registry.arenas.spans()
        return missing

    def claim(self, where: tuple[int | None, int | None, int | None], parity_nbytes: int,
              blocks: int) -> ParitySpan | None:
        """The span a row names (arena id, offset, bytes), taken; None when it cannot be:
        no such arena held, not the bytes that parity of `parity_nbytes` needs (a row
        older than its allocation's capacity), out of bounds, or another row has them."""
        arena_id, offset, nbytes = where
        arena = self.pool.arenas.get(arena_id) if arena_id is not None else None
        if arena is None or offset is None or nbytes != span_bytes(parity_nbytes):
            return None
        span = arena.claim(offset, nbytes)
        if span is not None:
            span.blocks = blocks
        return span

    def span_of(self, node_id: int) -> tuple[int, int, int] | None:
        """Where a start's span rows say the node's parity is."""
        return self._spans.get(node_id)

    def settle(self, keep: set[int]) -> None:
        """After a restart's claims: span rows of nodes not in `keep` (the kept allocations
        whose parity is a span) are stale and go; arenas no span uses may be swept."""
        stale = set(self._spans) - keep
        if stale:
            with self.journal.change(durable=True):
                for node_id in stale:
                    self.registry.arenas.drop_span(node_id)
        self._spans = {}
        self.registry.arenas.rows = None        # read again when first asked
        now = time.monotonic()
        for arena in self.pool.arenas.values():
            if not arena.used:
                arena.emptied_at = now

    def summary(self) -> dict:
        arenas = list(self.pool.arenas.values())
        return {"arenas": len(arenas), "bytes": sum(a.capacity for a in arenas),
                "used_bytes": sum(a.used_bytes for a in arenas)}
