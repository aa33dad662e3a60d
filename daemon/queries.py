"""The façade's queries: what the server, the mount, check and the scrubber may ask of the
core without changing it, by delegation to the layer that knows (daemon/manager.py has the
verbs). Kept apart so that the manager holds the verbs and their order of steps only."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .backends import Backend
from .check import Checker
from .custody import Custody
from .describe import describe
from .holders import Holders
from .integrity import Integrity
from .journal import Journal
from .listing import list_page
from .namespace import Namespace
from .nodes import WRITER_KINDS, Allocation, Node
from .permissions import Credentials, R
from .quotas import Quotas
from .registry import Registry
from .sessions import Session


class Queries:
    # Set by AllocationManager.__init__ (the composition of the layers).
    registry: Registry
    backend: Backend
    keeper: Any          # ProcessKeeper or SystemdFdStore (daemon/keeper_link.py)
    journal: Journal
    ns: Namespace
    integrity: Integrity
    custody: Custody
    holders: Holders
    quotas: Quotas

    damaged_ranges = staticmethod(Integrity.damaged_ranges)
    protected_bytes = staticmethod(Integrity.protected_bytes)

    @property
    def chunk_blocks(self) -> int:
        """The blocks of one piece of ECC work (verify_steps yields after each)."""
        return self.integrity.chunk_blocks


    def ecc_targets(self, paths: list[str], cred: Credentials, everything: bool
                    ) -> list[Allocation]:
        return self.ns.ecc_targets(paths, cred, everything)

    def verify_steps(self, alloc: Allocation, repair: bool, first_block: int = 0):
        """Integrity.verify_steps: a generator that yields after each piece. A repair
        rewrites bytes, so a cache of the old ones (the mount's pages) is dropped."""
        total = yield from self.integrity.verify_steps(alloc, repair, first_block)
        if total.get("corrected") and not alloc.unlinked:
            self.ns.data_changed(alloc)
        return total

    def cache_generation(self, alloc: Allocation) -> int | None:
        """What a cache of the allocation's bytes (the mount's page cache) may be kept
        for: its data generation, which moves at every change made other than through the
        mount (Namespace.data_changed); None while a socket client holds it for writing
        (open rw, attach rw), whose writes land in the memory unannounced."""
        if alloc.holders_of(*WRITER_KINDS):
            return None
        return self.ns.data_generation(alloc)

    # ---- the keeper ---------------------------------------------------------------------
    def reconcile_keeper(self) -> tuple[int, int]:
        return self.custody.reconcile_keeper()

    def redeposit_all(self, action: str = "restarted") -> int:
        return self.custody.redeposit_all(action)

    def deposit(self, alloc: Allocation) -> None:
        """Hand `alloc`'s memory (and parity) to the keeper again (check's repair)."""
        self.custody.deposit(alloc)

    def keeper_info(self) -> dict:
        return self.keeper.info()

    # ---- queries (the server, the mount, check, the scrubber) ----------------------------
    def lookup(self, path: str, cred: Credentials, *, allow_root: bool = False) -> Node:
        return self.ns.lookup(path, cred, allow_root=allow_root)

    def lookup_allocation(self, path: str, cred: Credentials) -> Allocation:
        return self.ns.lookup_allocation(path, cred)

    def lookup_child(self, parent_id: int, name: str, cred: Credentials) -> Node:
        return self.ns.lookup_child(parent_id, name, cred)

    def info(self, path: str, cred: Credentials) -> dict:
        """The node with its holders, the names the caller may search to, and user
        metadata (the metadata only for a caller who may read the node: null otherwise, as
        meta_list would refuse it)."""
        node = self.ns.lookup(path, cred, allow_root=True)
        return describe(node, holders=True, metadata=self.ns.allowed(node, cred, R),
                        cred=cred)

    def listdir(self, path: str, cred: Credentials, *, recursive: bool = False) -> list[dict]:
        return self.ns.listdir(path, cred, recursive=recursive)

    def list_page(self, path: str, cred: Credentials, *, recursive: bool, after: str | None,
                  limit: int | None) -> tuple[list[dict], str | None]:
        """One page of listdir's entries after the cursor `after`, and the next page's
        cursor (None: the last page). daemon/listing.py."""
        return list_page(self.ns, path, cred, recursive=recursive, after=after, limit=limit)

    def node(self, node_id: int) -> Node:
        return self.ns.node(node_id)

    def node_or_none(self, node_id: int) -> Node | None:
        """The live node with this id (inode), or None."""
        return self.ns.node_or_none(node_id)

    def all_nodes(self) -> list[Node]:
        return self.ns.all_nodes()

    def node_count(self) -> int:
        return self.ns.node_count()

    def allocations(self) -> list[Allocation]:
        return self.ns.allocations()

    def may_search_to(self, node: Node, cred: Credentials) -> bool:
        return self.ns.may_search_to(node, cred)

    @property
    def sessions(self) -> dict[int, Session]:
        return self.holders.sessions

    def totals(self) -> dict:
        return self.ns.totals(sessions=len(self.holders.sessions))

    def bytes_held_per_device(self) -> dict[str, int]:
        return self.ns.bytes_held_per_device()

    @property
    def backend_name(self) -> str:
        return self.backend.name

    def devices(self) -> list:
        """The backend's devices (daemon/backends DeviceInfo), as it sees them now."""
        return self.backend.devices()

    def quota_report(self, uid: int | None = None) -> list[dict]:
        """Each per-uid limit with its use (only `uid`'s, when given)."""
        return self.quotas.report(uid)

    def add_watcher(self, watcher) -> None:
        self.ns.add_watcher(watcher)

    def remove_watcher(self, watcher) -> None:
        self.ns.remove_watcher(watcher)

    async def settle_watchers(self) -> None:
        await self.ns.settle_watchers()

    # ---- the event log, observers, metadata and check -----------------------------------
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

    def meta(self, key: str) -> str | None:
        """A value save_meta stored (the scrubber's state), or None."""
        return self.registry.meta(key)

    def save_meta(self, key: str, value: str) -> None:
        with self.journal.change(durable=False):
            self.registry.set_meta(key, value)

    def check(self, repair: bool = False, *,
              integrity_errors: list[str] | None = None) -> dict:
        """`gpumemctl check` (daemon/check.py). `integrity_errors`: SQLite's integrity
        check, made beforehand off the event loop (registry_integrity_errors)."""
        return Checker(self, self.registry, self.keeper).run(
            repair=repair, integrity_errors=integrity_errors)

    def registry_integrity_errors(self) -> list[str]:
        """SQLite's integrity check on a read-only connection of its own: safe on a worker
        thread while the loop goes on changing the registry."""
        return self.registry.integrity_errors_readonly()
