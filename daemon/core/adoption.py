"""Adoption: what the keeper holds reconciled with what the registry lists. At start-up,
durable memory is taken back from the keeper (or marked `lost`), transient rows are dropped
and the keeper's unlisted entries (orphans) are freed, re-registered or refused as told;
after the keeper restarted or stalled, it is made to hold exactly the durable allocations
again.

The orders are custody's (daemon/core/custody.py, docs/durability.md "Crash ordering"):
this unit reads what a crash at any step of them leaves behind, and hands memory to the
keeper only through Custody.deposit.
"""
from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable

from gpumemctl.protocol import InternalError, InvalidState

from ..backends.arenas import ParitySpan
from ..backends.packed import PackedBackend
from ..backends.slabs import Slab
from ..ecc.layout import BLOCK, parity_bytes
from ..registry import Registry
from .arenas import ARENA_KEY_BASE, is_arena_key
from .custody import Custody
from .journal import Journal
from .namespace import Namespace
from .nodes import WRITER_KINDS, Allocation, Directory
from .orphans import POLICIES, OrphansHeld, capacity_of, classify, entry_name, held
from .parity import Parity
from .permissions import DAEMON, Credentials
from .slabs import SLAB_KEY_BASE, is_slab_key
from .sleep import Sleep

# Allocations in slabs adopted at a start past which the `adopt` events are one per slab.
ADOPT_EVENTS_PER_OBJECT = 10_000

log = logging.getLogger("gpumemd")


class Adoption:
    """The keeper's holdings and the registry's rows made to agree (see the module
    docstring); built once, beside custody, and used by ServiceVerbs."""

    def __init__(self, registry: Registry, journal: Journal, backend: PackedBackend, keeper,
                 namespace: Namespace, parity: Parity, custody: Custody, sleep: Sleep):
        self.registry = registry
        self.journal = journal
        self.backend = backend
        self.keeper = keeper
        self.ns = namespace
        self.parity = parity
        self.custody = custody      # deposits and frees, in its crash-safe order
        self.arenas = custody.arenas
        self.sleep = sleep          # asleep allocations' host tiers (daemon/core/sleep.py)
        self.metas: dict[int, dict] = {}   # the keeper's deposit metas, during a start

    # ---- start-up: what the keeper holds against what the registry lists -------------------
    def reconcile_at_start(self, orphans: str,
                           settle: Callable[[list[Allocation], dict[int, set[int]],
                                             Callable[[Allocation], None]], int]) -> dict:
        """Re-adopt durable memory from the keeper, drop what is stale (the namespace is
        loaded). Keeper entries the registry does not list are crash residue and are freed,
        unless daemon/core/orphans.py finds them foreign (the registry is new, another one, or
        older than the keeper's contents). Then `orphans` decides: 'refuse' raises
        OrphansHeld having changed nothing; 'adopt' re-registers every unlisted entry under
        /lost+found/<time>; 'free' frees them all. `settle`: Integrity.settle, which gives
        the adopted allocations their parity. Returns the summary the `start` event logs."""
        self.keeper.ensure_running()
        kept = self.keeper.fetch_all()
        metas = self.keeper.entries()
        self.metas = metas or {}
        strays = self.take_strays(kept, metas, orphans)
        self.arenas.adopt_all(kept)      # the arena keys leave `kept`, before the slabs
        slabs_lost = self.custody.slabs.adopt_all(kept)     # the slab keys leave `kept`
        summary = {"adopted": 0, "lost": 0, "orphans_freed": 0, "orphans_adopted": 0,
                   "transients_dropped": 0}
        damage = self.registry.damaged.load()
        recovered: dict[int, list[int]] = {}
        with self.journal.change(durable=True):
            interrupted = [r for r in self.registry.holders.load()
                           if r["kind"] in WRITER_KINDS]
            self.registry.holders.clear()
            node_keys = [abs(k) for k in [*kept, *strays]
                         if not is_slab_key(k) and not is_arena_key(k)]
            if node_keys:           # no new id may alias a key the keeper holds
                self.ns.ids.reserve_up_to(max(node_keys))
            dropped = self._adopt_listed(kept, summary, slabs_lost)
            self.custody.slabs.settle()
            summary["shared_blocks_encoded"] = self._encode_blocks_left_by(dropped)
            self.arenas.settle({a.id for a in self.ns.allocations()
                                if isinstance(a.parity, ParitySpan)})
            for key, fds in kept.items():
                self.free_orphan(key, fds)
                summary["orphans_freed"] += 1
            if orphans == "adopt":
                recovered = self.adopt_orphans(strays, metas, summary)
            else:
                for key, fds in strays.items():
                    self.free_orphan(key, fds, "freed as told (--free-orphans)")
                    summary["orphans_freed"] += 1
            summary["parity_rebuilt_blocks"] = settle(self.ns.allocations(), damage,
                                                      self.custody.deposit)
            self._note_interrupted_writers(interrupted)
            self.journal.event("start", None, None, backend=self.backend.name, **summary)
        for key in recovered:       # committed under new ids: the old keys may go now
            self.custody.withdraw_quietly(key)
        self.adopt_identity(metas)
        self.metas = {}
        return summary

    def _note_interrupted_writers(self, rows) -> None:
        """A writer (a socket `open rw`, an `attach rw`) still held its allocation when the
        daemon stopped: its writes landed in memory the keeper kept, but its `close` never
        came. Record what can be known: the allocation was modified (now), and a `write`
        event in the writer's name with `range_unknown`."""
        seen: set[int] = set()
        for row in rows:
            alloc = self.ns.node_or_none(row["node"])
            if not isinstance(alloc, Allocation) or alloc.buffer is None or alloc.id in seen:
                continue
            seen.add(alloc.id)
            now = time.time_ns()
            self.journal.keep(alloc, "modified_ns", "changed_ns")
            alloc.modified_ns = alloc.changed_ns = now
            self.registry.nodes.update(alloc.id, modified_ns=now, changed_ns=now)
            writer = Credentials(pid=row["pid"], uid=row["uid"], gid=-1)
            # Numbers and flags only: a `write` detail is what a client reports too, and
            # carries no text (daemon/core/events.py, CLIENT_REPORTED).
            self.journal.event("write", alloc, writer, range_unknown=True)

    def _adopt_listed(self, kept: dict[int, list[int]], summary: dict,
                      slabs_lost: dict[int, str]) -> list[tuple[int, int, int]]:
        """Each listed allocation: a transient one is dropped (it never outlives the
        daemon), a durable one takes back what the keeper kept (its slot, for one kept in a
        slab), or is `lost`. What it takes leaves `kept`. A million slots come back at a
        start: for them, a dict lookup and _adopt_slot, with no statement or event each.
        Returns where the dropped ones lay in slabs: (slab, offset, capacity)."""
        placed = self.registry.slabs.placements()
        in_slabs: list[Allocation] = []
        dropped: list[tuple[int, int, int]] = []
        slots_lost = 0
        residue = self.sleep.drop_residue(
            kept, self.metas, {a.id for a in self.ns.allocations() if a.asleep})
        for key, fds in residue.items():
            self.free_orphan(key, fds, "the host copy of a sleep that did not commit, or "
                             "of a wake that did")
        for alloc in self.ns.allocations():
            if not alloc.durable:
                if (where := placed.get(alloc.id)) is not None:
                    dropped.append((*where, alloc.capacity or 0))
                self.ns.forget(alloc)
                self.journal.event("drop", alloc, None, reason="transient after restart")
                summary["transients_dropped"] += 1
            elif alloc.capacity is None:
                continue  # durable but pending: there is no memory to adopt
            elif alloc.asleep:
                adopted = self.sleep.adopt(alloc, kept, self.metas, self._adopt_parity)
                if not adopted:
                    self._mark_lost(alloc, "the keeper holds no host copy of it asleep")
                summary["adopted" if adopted else "lost"] += 1
            elif alloc.state != "lost" and (where := placed.get(alloc.id)) is not None:
                if self._adopt_slot(alloc, *where, slabs_lost):   # a lost one has no slot
                    in_slabs.append(alloc)
                else:
                    slots_lost += 1
            elif alloc.id in kept or -alloc.id in kept:
                adopted = self._adopt(alloc, kept.pop(alloc.id, None),
                                      kept.pop(-alloc.id, None))
                summary["adopted" if adopted else "lost"] += 1
            elif alloc.state != "lost":
                self._mark_lost(alloc, "the keeper holds no memory for it")
                summary["lost"] += 1
        summary["adopted"] += len(in_slabs)
        summary["lost"] += slots_lost
        self._note_slots_adopted(in_slabs)
        return dropped

    def _encode_blocks_left_by(self, dropped: list[tuple[int, int, int]]) -> int:
        """The slab blocks that a dropped transient allocation shared with a durable one,
        encoded from what they hold now. The transient one may have been written when the
        daemon died, its parity stale by design (a writer's fd, a close not yet come, an
        encode cut short), and that parity is its durable neighbours' too: left so, their
        verify would find damage that is not (beyond repair past 4 changed rows a
        codeword, reading as EIO). Encoding takes the block as it is: damage to the durable
        neighbour's bytes made while the daemon was down is no longer told apart in these
        blocks (docs/durability.md). Returns the blocks encoded."""
        blocks: set[tuple[Slab, int]] = set()
        for slab_id, offset, capacity in dropped:
            slab = self.backend.pool.slabs.get(slab_id)
            if slab is None or slab.parity is None or slab.slot >= BLOCK:
                continue            # a slot of a block or more shares no block
            for block in range(offset // BLOCK, -(-(offset + capacity) // BLOCK)):
                if any(o in slab.used for o in range(block * BLOCK, (block + 1) * BLOCK,
                                                     slab.slot)):
                    blocks.add((slab, block))
        for slab, block in blocks:
            self.backend.ecc("encode", slab.data, slab.parity, block, 1, slab.blocks)
        if blocks:
            log.warning("encoded %d slab blocks that transient allocations dropped at this "
                        "start shared with durable ones", len(blocks))
        return len(blocks)

    def take_strays(self, kept: dict[int, list[int]], metas: dict[int, dict] | None,
                     orphans: str) -> dict[int, list[int]]:
        """Take out of `kept` the entries that the `orphans` policy handles
        (reconcile_at_start). Refusing, close every fetched fd (the keeper keeps its own)
        and raise."""
        if orphans not in POLICIES:
            raise ValueError(f"unknown orphans policy {orphans!r}")
        listed = {a.id for a in self.ns.allocations()}
        nodes = {k: v for k, v in kept.items() if not is_slab_key(k) and not is_arena_key(k)}
        foreign, why = classify(nodes, metas, listed, self.registry.identity.instance,
                                self.registry.created, self.registry.identity.last_node_id())
        reasons = [why]
        # Slabs and parity arenas the same way, each in its own id space (its table's
        # AUTOINCREMENT).
        rows = {SLAB_KEY_BASE + i for i in self.registry.slabs.ids()} | \
            {ARENA_KEY_BASE + i for i in self.registry.arenas.ids()}
        for base, member, table in ((SLAB_KEY_BASE, is_slab_key, self.registry.slabs),
                                    (ARENA_KEY_BASE, is_arena_key, self.registry.arenas)):
            space_foreign, space_why = classify(
                {k - base: v for k, v in kept.items() if member(k)},
                {k - base: m for k, m in metas.items() if member(k)}
                if metas is not None else None,
                {k - base for k in rows if member(k)}, self.registry.identity.instance,
                self.registry.created, table.last_id())
            foreign |= {base + i for i in space_foreign}
            reasons.append(space_why)
        why = "; ".join(dict.fromkeys(w for w in reasons if w))
        # Parity arenas alone are no one's data: refused with the allocations they protect,
        # and never counted as allocations.
        if any(not is_arena_key(k) for k in foreign) and orphans == "refuse":
            count, nbytes = held(kept, metas, {k for k in foreign if not is_arena_key(k)})
            for fds in kept.values():
                for fd in fds:
                    os.close(fd)
            raise OrphansHeld(count, nbytes, self.registry.path, why)
        if orphans != "refuse":
            # (an arena the registry does not list holds parity only: Arenas.adopt_all
            # frees it; it is no one's data to re-register)
            foreign |= {k for k in kept if not is_arena_key(k) and
                        (k not in rows if is_slab_key(k) else abs(k) not in listed)}
            foreign -= {k for k in foreign if is_arena_key(k)}
        if foreign:
            log.warning("the keeper holds %d entr%s that registry %s does not list (%s); "
                        "%s them as told", len(foreign), "y" if len(foreign) == 1 else "ies",
                        self.registry.path, why or "unlisted",
                        "re-registering" if orphans == "adopt" else "freeing")
        return {k: kept.pop(k) for k in foreign}

    def adopt_identity(self, metas: dict[int, dict] | None) -> None:
        """Deposits made before the registry's identity went into their meta get it now, so
        that the next start can tell them from another registry's (daemon/core/orphans.py)."""
        if metas is None:
            return
        for alloc in self.ns.allocations():
            meta = metas.get(alloc.id)
            if meta is not None and "registry" not in meta and alloc.buffer is not None \
                    and alloc.durable:
                with contextlib.suppress(InternalError):
                    self.custody.deposit(alloc)

    def _adopt(self, alloc: Allocation, fds: list[int] | None,
               staged: list[int] | None = None) -> bool:
        """Re-adopt kept memory. `staged` is what a resize deposited under -id before its
        commit (Custody.reallocate): of the two copies, the one with the registry's
        capacity is the committed one; it ends up under the id, and the other is freed."""
        copies = [(k, f) for k, f in ((alloc.id, fds), (-alloc.id, staged)) if f is not None]
        error: Exception | None = None
        for i, (key, kept_fds) in enumerate(copies):
            layout = layout_of(self.metas.get(key))
            data_fds, parity_fds = kept_fds[:len(layout or [0])], kept_fds[len(layout or [0]):]
            try:
                alloc.buffer = self.backend.adopt(data_fds, alloc.capacity or 0,
                                                  alloc.device or "", layout)
            except Exception as exc:  # noqa: BLE001 - this copy is not the committed one
                error = exc
                for fd in parity_fds:
                    os.close(fd)
                self.custody.withdraw_quietly(key)
                continue
            self._adopt_parity(alloc, parity_fds)
            for other_key, other_fds in copies[i + 1:]:
                self.free_orphan(other_key, other_fds)
            if key != alloc.id:     # the resize committed: its copy becomes the kept one
                self.custody.deposit(alloc)
                self.custody.withdraw_quietly(key)
            if alloc.state in ("lost", "pending"):
                alloc.state = "ready"
                self.registry.nodes.update(alloc.id, state="ready")
            self.journal.event("adopt", alloc, None, capacity=alloc.capacity)
            return True
        self._mark_lost(alloc, f"re-adoption failed: {error}")
        return False

    def _adopt_slot(self, alloc: Allocation, slab_id: int, offset: int,
                    slabs_lost: dict[int, str]) -> bool:
        """Take back a slot in a kept slab: no keeper call, its parity is the slab's. A
        copy the keeper still holds under the id (a move into the slot that committed
        before its withdraw) stays in `kept`, freed as crash residue."""
        try:
            slot = self.custody.slabs.slot_at(slab_id, offset, alloc.capacity or 0, alloc)
        except InternalError as exc:
            self._mark_lost(alloc, slabs_lost.get(slab_id) or str(exc))
            return False
        alloc.buffer = slot        # its tenant already (Custody.bind's link, made by slot_at)
        if alloc.ecc == "rs":
            alloc.parity = self.backend.pool.slot_parity(slot)
        if alloc.state in ("lost", "pending"):
            alloc.state = "ready"
            self.registry.nodes.update(alloc.id, state="ready")
        return True

    def _note_slots_adopted(self, allocs: list[Allocation]) -> None:
        """One `adopt` event per allocation taken back in a slab, as for the others; past
        ADOPT_EVENTS_PER_OBJECT of them, one per slab ({slab, objects}), so that a restart
        with a million small objects does not push the event log's history out (it keeps
        100,000 events)."""
        if len(allocs) <= ADOPT_EVENTS_PER_OBJECT:
            for alloc in allocs:
                self.journal.event("adopt", alloc, None, capacity=alloc.capacity)
            return
        # A slab's used slots are, until its settle(), the ones just taken back: counted
        # per slab, not by a walk of a million allocations.
        per_slab = {slab.id: len(slab.used) for slab in self.backend.pool.slabs.values()}
        for slab_id, count in sorted(per_slab.items()):
            if count:
                self.journal.event("adopt", None, None, slab=slab_id, objects=count)

    def _adopt_parity(self, alloc: Allocation, fds: list[int]) -> None:
        """Take back the parity the keeper kept (a buffer of its own), or the span of a
        parity arena the registry names; a missing or wrong-sized one is rebuilt from the
        data by Integrity.settle."""
        if alloc.ecc != "rs":
            for fd in fds:
                os.close(fd)
            return
        if not fds:
            self._claim_span(alloc)
            return
        try:
            alloc.parity = self.backend.adopt(fds, self.parity.own_size_for(alloc),
                                              alloc.device or "")
            alloc.parity.blocks = (alloc.capacity or 0) // BLOCK
        except Exception as exc:  # noqa: BLE001 - rebuilt from the data instead
            log.warning("kept parity of '%s' unusable (%s); rebuilding it", alloc.path, exc)

    def _claim_span(self, alloc: Allocation) -> None:
        where = self.arenas.span_of(alloc.id)
        if where is None:
            return
        capacity = alloc.capacity or 0
        alloc.parity = self.arenas.claim(where, parity_bytes(capacity), capacity // BLOCK)
        if alloc.parity is None:
            log.warning("the parity span of '%s' (arena %d, offset %d, %d bytes) is not "
                        "held, not the size its capacity needs, or claimed twice; "
                        "rebuilding it from the data", alloc.path, *where)

    def _mark_lost(self, alloc: Allocation, reason: str) -> None:
        alloc.state, alloc.awake_state = "lost", None
        alloc.buffer = None
        self.registry.nodes.update(alloc.id, state="lost", slab=None, slot=None, asleep=0)
        self.journal.event("lost", alloc, None, reason=reason)
        log.warning("allocation '%s' (id %d) is lost: %s", alloc.path, alloc.id, reason)

    def free_orphan(self, key: int, fds: list[int], reason: str = "crash residue") -> None:
        """Free what the keeper held under a key the registry does not list. Normally the
        residue of a crash (docs/durability.md, "Crash ordering"), yet memory is going, so
        it is a warning."""
        for fd in fds:
            os.close(fd)
        self.custody.withdraw_quietly(key)
        self.journal.event("orphan", None, None, key=key,
                    reason=f"the keeper held memory the registry does not list; {reason}")
        log.warning("freed the memory the keeper held under key %d, which the registry does "
                    "not list (%s)", key, reason)

    def adopt_orphans(self, strays: dict[int, list[int]], metas: dict[int, dict] | None,
                       summary: dict) -> dict[int, list[int]]:
        """--adopt-orphans: re-register each stray entry as a durable allocation in a new
        /lost+found/<UTC time>, owned by the daemon's user (root) with mode 0700, so that
        only root sees them until it hands them on (chown, mv). Returns the entries
        re-registered; their old keys are withdrawn once this commits (reconcile_at_start).
        One that cannot be (its device is gone, its size unknown) is freed and counted
        so."""
        if not strays:
            return {}
        directory = self.ns.lost_found.recovery_dir()
        summary["recovery_dir"] = directory.path
        recovered = {}
        for key in sorted(strays, key=lambda k: (abs(k), k < 0)):
            if self._adopt_orphan(directory, key, strays[key], (metas or {}).get(key)):
                recovered[key] = strays[key]
                summary["orphans_adopted"] += 1
            else:
                summary["orphans_freed"] += 1
        return recovered

    def _adopt_orphan(self, directory: Directory, key: int, fds: list[int],
                      meta: dict | None) -> bool:
        """One entry: its size is the capacity its deposit recorded (the size asked for is
        not kept), its ECC as its deposit said (orphan_ecc). The kept parity is dropped
        and rebuilt from the data (Integrity.settle): what it last covered is not known."""
        capacity = capacity_of(fds, meta)
        try:
            dev = self.backend.device((meta or {}).get("device"))
            if capacity <= 0:
                raise InvalidState("its size is not known")
        except Exception as exc:  # noqa: BLE001 - freed instead, and said so
            self.free_orphan(key, fds, f"cannot be re-registered: {exc}")
            return False
        layout = layout_of(meta)
        data = len(layout or [0])
        for fd in fds[data:]:
            os.close(fd)
        try:
            buf = self.backend.adopt(fds[:data], capacity, dev.uuid, layout)
        except Exception as exc:  # noqa: BLE001 - the backend closed the fd
            self.free_orphan(key, [], f"cannot be re-registered: {exc}")
            return False
        alloc = self.ns.insert_node(
            Allocation, directory, entry_name(key), DAEMON, 0o600, size=capacity,
            capacity=capacity, device=dev.uuid, durable=True, state="ready",
            ecc=orphan_ecc(fds[data - 1:], meta), buffer=buf)
        self.custody.deposit(alloc)
        self.journal.event("adopt", alloc, None, capacity=capacity, key=key, recovered=True)
        log.warning("re-registered the memory the keeper held under key %d as '%s'", key,
                    alloc.path)
        return True

    def reconcile_keeper(self) -> tuple[int, int]:
        """After the keeper stalled and answers again: the requests it never answered may or
        may not have been applied, and withdrawals refused meanwhile were skipped. Make it
        hold exactly the durable allocations: withdraw every other key, then hand it every
        durable allocation again. Returns (withdrawn, redeposited)."""
        durable = {a.id for a in self.ns.allocations() if a.kept}
        durable |= {-a.id for a in self.ns.allocations() if a.asleep and a.durable}
        durable |= self.custody.slabs.keys() | self.arenas.keys()
        extra = [key for key in self.keeper.keys() if key not in durable]
        for key in extra:
            self.keeper.withdraw(key)
        return len(extra), self.redeposit_all(action="resumed")

    def redeposit_all(self, action: str = "restarted") -> int:
        """After a keeper restart (or stall): hand it every slab and every durable
        allocation of memory of its own again (a count of the allocations)."""
        self.arenas.redeposit_all()
        self.custody.slabs.redeposit_all()
        count = 0
        for alloc in self.ns.allocations():
            if alloc.kept:
                self.custody.deposit(alloc)      # nothing for a slot: its slab went above
                count += 1
            elif alloc.asleep and alloc.durable:
                self.sleep.redeposit(alloc)      # its host tier
                count += 1
        with self.journal.change(durable=False):
            self.journal.event("keeper", None, None, action=action, redeposited=count)
        return count


def layout_of(meta: dict | None) -> list[int] | None:
    """The extents' sizes a deposit's meta records (memory of several extents: one fd
    each, before any parity fd), else None: one data fd."""
    layout = (meta or {}).get("extents")
    if isinstance(layout, list) and len(layout) > 1 and \
            all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in layout):
        return layout
    return None


def orphan_ecc(fds: list[int], meta: dict | None) -> str:
    """An orphan's ECC: what its deposit's meta says (a parity span is not among its fds),
    else `rs` when a parity fd came with it (the systemd fd store keeps no meta)."""
    ecc = (meta or {}).get("ecc")
    return ecc if ecc in ("rs", "none") else ("rs" if len(fds) > 1 else "none")
