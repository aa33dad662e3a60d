"""The daemon's own verbs: start (load the registry, re-adopt durable memory from the keeper,
drop what is stale), stop, and the keeper's repairs after it died or stalled (daemon/main.py
supervises it)."""
from __future__ import annotations

from typing import Any

from ..core.adoption import Adoption
from ..core.custody import Custody
from ..core.integrity import Integrity
from ..core.journal import Journal
from ..core.namespace import Namespace
from ..core.slabs import IDLE_SECONDS
from ..core.sleep import Sleep
from ..registry import Registry


class ServiceVerbs:
    def __init__(self, registry: Registry, journal: Journal, namespace: Namespace,
                 custody: Custody, adoption: Adoption, integrity: Integrity, keeper: Any,
                 sleep: Sleep):
        """`keeper`: ProcessKeeper or SystemdFdStore (daemon/keeper/link.py)."""
        self.registry = registry
        self.journal = journal
        self.ns = namespace
        self.custody = custody
        self.adoption = adoption
        self.integrity = integrity
        self.keeper = keeper
        self.sleep = sleep

    def start(self, orphans: str = "refuse") -> dict:
        """Load the registry, re-adopt durable memory from the keeper, drop what is stale
        (Adoption.reconcile_at_start says how, and what `orphans` decides)."""
        self.ns.load()
        summary = self.adoption.reconcile_at_start(orphans, self.integrity.settle)
        self.integrity.parity.prebuild()
        return summary

    def shutdown(self) -> None:
        """Clean stop: transient memory goes, durable memory stays with the keeper."""
        with self.journal.change(durable=False):
            for alloc in self.ns.allocations():
                if not alloc.durable:
                    self.ns.forget(alloc)
            self.registry.holders.clear()
            self.journal.event("stop", None, None)
        for alloc in self.ns.allocations():
            self.custody.free(alloc)
        self.custody.slabs.close()
        self.custody.arenas.close()      # after the slabs: their parity is in them
        self.sleep.spares.close()
        self.keeper.close()

    def sweep_slabs(self) -> int:
        """Housekeeping, every 0.2 s: slabs and parity arenas empty for IDLE_SECONDS go
        (daemon/core/slabs.py, daemon/core/arenas.py), and host tiers no sleep took again
        (daemon/backends/tier.py, Spares)."""
        self.custody.arenas.retry_owed()
        self.sleep.spares.sweep()
        return self.custody.slabs.sweep(IDLE_SECONDS) + \
            self.custody.arenas.sweep(IDLE_SECONDS)

    def reconcile_keeper(self) -> tuple[int, int]:
        """After a stall: the keeper holds exactly the durable allocations again."""
        return self.adoption.reconcile_keeper()

    def redeposit_all(self, action: str = "restarted") -> int:
        """After a keeper restart: it gets every durable allocation's fds again."""
        return self.adoption.redeposit_all(action)
