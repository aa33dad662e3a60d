"""Lifecycle: the steps of an allocation's life that several verb groups take, each in its
crash-safe order over custody, integrity, holders and the journal: its memory let go once its
last name and its last holder are gone, a holder released, its durability changed.

The verbs (daemon/verbs/) check who may ask and shape the answer; the order of the steps is
here, once (docs/durability.md, "Crash ordering").
"""
from __future__ import annotations

import time

from gpumemctl.protocol import InvalidState

from ..registry import Registry
from .custody import Custody, Deposit
from .holders import IO_KINDS, MOUNT_KINDS, Holders
from .integrity import Integrity
from .journal import Journal
from .namespace import Namespace
from .nodes import MOVING, Allocation, Holder
from .permissions import Credentials, require_owner


class Lifecycle:
    def __init__(self, registry: Registry, journal: Journal, namespace: Namespace,
                 custody: Custody, integrity: Integrity, holders: Holders):
        self.registry = registry
        self.journal = journal
        self.ns = namespace
        self.custody = custody
        self.integrity = integrity
        self.holders = holders

    # ---- the end of an allocation's memory --------------------------------------------------
    def release_memory(self, alloc: Allocation) -> None:
        """After the row is gone (rm, unlink, rename over it): let go of the keeper's copy,
        then free (or wait for the last holder, if forced)."""
        alloc.unlinked = True
        if alloc.durable:
            self.custody.withdraw_quietly(-alloc.id if alloc.asleep else alloc.id)
        if not alloc.holders_of(*IO_KINDS, *MOUNT_KINDS):
            self.holders.drop_all(alloc)
            self.custody.free(alloc)

    def remove_holder(self, holder: Holder) -> None:
        """Drop a holder, and release a leased allocation it was the last of, in one
        change; free the memory if that was the last thing keeping it. A file open on the
        mount has no row: its release writes nothing, and so cannot fail, unless it is the
        last holder of a leased allocation."""
        alloc = holder.alloc
        if holder.kind in MOUNT_KINDS and not (alloc.leased and len(alloc.holders) == 1):
            released = self.drop_holders([holder])
        else:
            with self.journal.change(durable=False, batch=True):
                released = self.drop_holders([holder])
        self.free_released(released)

    def drop_holders(self, holders: list[Holder]) -> list[Allocation]:
        """Within the caller's change: drop the holders, and a leased allocation whose last
        holder went leaves the tree; all of it taken back if the change fails. Returns the
        allocations nothing keeps any more: the caller frees their memory once the change
        committed (free_released), never before."""
        released: list[Allocation] = []
        for holder in holders:
            self.holders.drop(holder)
            alloc = holder.alloc
            if alloc.holders or any(a is alloc for a in released):
                continue
            if alloc.unlinked:
                released.append(alloc)
            elif alloc.leased and not alloc.durable:
                with self.journal.change(durable=False):
                    self.ns.forget(alloc)
                    self.journal.event("release", alloc, None, **holder.origin.detail(),
                                       reason="last holder of a leased allocation is gone")
                    self.journal.keep(alloc, "unlinked")
                    alloc.unlinked = True
                released.append(alloc)
        return released

    def free_released(self, allocs: list[Allocation]) -> None:
        """After the change of drop_holders committed: their memory goes."""
        for alloc in allocs:
            self.custody.free(alloc)

    # ---- durability ---------------------------------------------------------------------------
    @staticmethod
    def require_durability_change(alloc: Allocation, cred: Credentials) -> None:
        require_owner(alloc, cred, "change the durability of")
        if alloc.state == "lost":
            raise InvalidState(f"'{alloc.path}' is lost: its memory is gone; remove it")
        if alloc.unlinked:
            raise InvalidState(f"'{alloc.path}' has been removed; it cannot change "
                               "durability")
        if alloc.state in MOVING:
            raise InvalidState(f"'{alloc.path}' is {alloc.state}: wake it first (`gpumemctl wake "
                               f"{alloc.path}`), then change its durability",
                               details={"errno": "EAGAIN"})

    def set_durable(self, alloc: Allocation, cred: Credentials, durable: bool, *,
                    deposited: Deposit | None = None) -> None:
        """Durable: deposit, then commit. Transient: commit, then withdraw. `deposited`: the
        deposit a plan made meanwhile, off the loop (made again if the memory changed)."""
        self.require_durability_change(alloc, cred)
        if alloc.durable == durable:
            return
        if durable:
            # A transient neighbour's pending parity in this slot's block (Sizing.pending)
            # is settled first: a durable allocation must never share a block whose parity
            # a crash would leave stale without a WRITING mark.
            self.integrity.settle_pending(alloc)
        with self.journal.change(durable=True):
            self.journal.keep(alloc, "durable", "changed_ns")
            alloc.durable = durable
            alloc.changed_ns = time.time_ns()
            self.registry.nodes.update(alloc.id, durable=int(durable),
                                      changed_ns=alloc.changed_ns)
            if durable and alloc.buffer is not None:
                if deposited is not None and deposited.taken_from(alloc):
                    self.journal.on_rollback(lambda: self.custody.withdraw_quietly(alloc.id))
                else:
                    self.custody.deposit(alloc)
            self.journal.event("durable" if durable else "transient", alloc, cred)
        if durable:
            alloc.leased = False       # the durable pin replaces any lease
            if alloc.dirty_to > alloc.dirty_from:
                self.integrity.writes_begin(alloc)  # unsynced writes now matter at a crash
            for holder in alloc.holders_of("lease"):
                self.remove_holder(holder)
        elif alloc.buffer is not None:
            self.custody.withdraw_quietly(alloc.id)
