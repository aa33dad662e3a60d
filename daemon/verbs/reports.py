"""What the daemon reports of itself: totals, devices, quotas and the keeper (`status`,
`devices`), the event log and its observers (`events`, `subscribe`, the mount's watchers),
and the small state the scrubber keeps in the registry. Nothing here changes the tree."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..backends.packed import PackedBackend
from ..core.holders import Holders
from ..core.journal import Journal
from ..core.namespace import Namespace
from ..core.nodes import Node
from ..core.quotas import Quotas
from ..registry import Registry


class Reports:
    def __init__(self, registry: Registry, journal: Journal, namespace: Namespace,
                 backend: PackedBackend, keeper: Any, holders: Holders, quotas: Quotas):
        """`keeper`: ProcessKeeper or SystemdFdStore (daemon/keeper/link.py)."""
        self.registry = registry
        self.journal = journal
        self.ns = namespace
        self.backend = backend
        self.keeper = keeper
        self.holders = holders
        self.quotas = quotas

    # ---- status -------------------------------------------------------------------------------
    @property
    def backend_name(self) -> str:
        return self.backend.name

    def devices(self) -> list:
        """The backend's devices (daemon/backends DeviceInfo), as it sees them now."""
        return self.backend.devices()

    def bytes_held_per_device(self) -> dict[str, int]:
        """Memory of their own (the namespace's count), the slabs whole, and the parity
        arenas whole (the spans in them are not counted again)."""
        ours = self.ns.reports.bytes_held_per_device()
        for use in (self.backend.pool.bytes_per_device(), self.backend.arenas.bytes_per_device()):
            for device, nbytes in use.items():
                ours[device] = ours.get(device, 0) + nbytes
        return ours

    def arenas_per_device(self) -> dict[str, dict]:
        """Device UUID -> its parity arenas' use (ArenaPool.use_per_device)."""
        return self.backend.arenas.use_per_device()

    def slabs_per_device(self) -> dict[str, dict]:
        """Device UUID -> its slabs' use (PackedBackend.pool.use_per_device)."""
        return self.backend.pool.use_per_device()

    def totals(self) -> dict:
        return self.ns.reports.totals(sessions=len(self.holders.sessions))

    def held_per_container(self, uid: int | None = None) -> list[dict]:
        """Memory held per container (Holders.held_per_container; `uid`: only its holders)."""
        return self.holders.held_per_container(uid)

    def quota_report(self, uid: int | None = None) -> list[dict]:
        """Each per-uid limit with its use (only `uid`'s, when given)."""
        return self.quotas.report(uid)

    def keeper_info(self) -> dict:
        return self.keeper.info()

    # ---- the event log and its observers ------------------------------------------------------
    def events(self, *, since: int, limit: int, path: str | None = None,
               uid: int | None = None, max_bytes: int | None = None,
               administrator: bool = False) -> tuple[list[dict], bool]:
        """Logged events after `since`, oldest first, at most `limit` and `max_bytes`, and
        whether the page is complete (Journal.events; `uid`, `administrator`: whose view,
        events.visible_to)."""
        return self.journal.events(since=since, limit=limit, path=path, uid=uid,
                                   max_bytes=max_bytes, administrator=administrator)

    def last_event_id(self) -> int:
        return self.journal.last_event_id()

    def observing(self, on_event: Callable[[dict], None],
                  on_change: Callable[[Node], None] | None = None):
        """Committed events and nodes to redraw, while inside (Journal.observing)."""
        return self.journal.observing(on_event, on_change)

    def note(self, kind: str, /, **detail) -> None:
        """Log an event that concerns no node (the scrubber's start and end)."""
        self.journal.note(kind, **detail)

    def add_watcher(self, watcher) -> None:
        """The mount's Operations: told of changes the kernel must hear of."""
        self.ns.watchers.add(watcher)

    def remove_watcher(self, watcher) -> None:
        self.ns.watchers.remove(watcher)

    async def settle_watchers(self) -> None:
        await self.ns.watchers.settle()

    # ---- the scrubber's state ------------------------------------------------------------------
    def meta(self, key: str) -> str | None:
        """A value save_meta stored (the scrubber's state), or None."""
        return self.registry.identity.get(key)

    def save_meta(self, key: str, value: str) -> None:
        with self.journal.change(durable=False):
            self.registry.identity.set(key, value)
