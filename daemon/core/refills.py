"""Refills: the allocations being filled from a snapshot (`restoring`), by the handle that
fills each, and the two ways a refill ends. A refill begins in daemon/verbs/refill.py (op
`refill`); it ends at the close of its handle (daemon/verbs/handles.py), or when its session
ends, so both groups reach it here.

- `finish` (a `close` with `restored`): the parity is encoded (the close's parity job),
  blocks the client found damaged in the snapshot are recorded (`degraded`, they read as
  EIO: the client zeroed them, and zeros are not the data), the row is committed, and then a
  durable allocation is deposited with the keeper.
- `abort` (a close without `restored`, or the session ended): not restored. A created one is
  removed, any other is `lost` again: a half-restored allocation is never served as whole.
"""
from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

from gpumemctl.protocol import UsageError

from ..registry import Registry
from .custody import Custody
from .describe import describe
from .integrity import Integrity
from .journal import Journal
from .lifecycle import Lifecycle
from .namespace import Namespace
from .nodes import Allocation, Holder
from .parity import BLOCK as ECC_BLOCK
from .permissions import Credentials
from .sessions import Session

if TYPE_CHECKING:
    from gpumemctl.protocol.replies import Node as NodeInfo


@dataclasses.dataclass
class Refill:
    alloc: Allocation
    created: bool           # made by this restore: removed if it does not complete
    durable: bool           # what the snapshot says it was
    unsealed: bool


class Refills:
    def __init__(self, registry: Registry, journal: Journal, namespace: Namespace,
                 custody: Custody, integrity: Integrity, lifecycle: Lifecycle):
        self.registry = registry
        self.journal = journal
        self.ns = namespace
        self.custody = custody
        self.integrity = integrity
        self.lifecycle = lifecycle
        self._by_holder: dict[int, Refill] = {}     # refill handles by holder id

    def add(self, holder_id: int, refill: Refill) -> None:
        self._by_holder[holder_id] = refill

    def of(self, holder_id: int) -> Refill | None:
        return self._by_holder.get(holder_id)

    def finish(self, session: Session, holder: Holder, damaged: list) -> NodeInfo:
        """The client wrote every block and says which it found damaged."""
        refill = self._by_holder.pop(holder.id)
        alloc, cred = refill.alloc, session.cred
        blocks = _ecc_blocks(damaged, alloc.size or 0)
        self.lifecycle.remove_holder(holder)
        now = time.time_ns()
        with self.journal.change(durable=alloc.durable or refill.durable):
            self.journal.keep(alloc, "state", "modified_ns", "changed_ns", "unsealed")
            alloc.state = "ready"
            alloc.modified_ns = alloc.changed_ns = now
            alloc.unsealed = refill.unsealed
            self.registry.nodes.update(alloc.id, state="ready", modified_ns=now,
                                      changed_ns=now, unsealed=1 if refill.unsealed else 0)
            self.journal.event("restore", alloc, cred, action="done",
                               damaged_blocks=len(blocks))
        if blocks:
            self.integrity.set_damage(alloc, blocks, cred,
                                      reason="restored from a snapshot block that failed "
                                             "its checksum")
        if refill.durable and not alloc.durable:
            self.lifecycle.set_durable(alloc, cred, True)
        elif alloc.kept:
            with self.journal.change(durable=True):
                self.custody.deposit(alloc)
        self.ns.watchers.data_changed(alloc)
        return describe(alloc, holders=True)

    def abort(self, session: Session, holder: Holder) -> None:
        """The handle closed without `restored`, or its session ended: not restored."""
        refill = self._by_holder.pop(holder.id)
        self.lifecycle.remove_holder(holder)
        self.undo(refill, session.cred)

    def undo(self, refill: Refill, cred: Credentials) -> None:
        """A refill that will not complete: a created allocation goes, any other is lost."""
        alloc = refill.alloc
        if refill.created:
            if not alloc.unlinked:
                with self.journal.change(durable=False):
                    self.ns.forget(alloc)
                    self.journal.event("restore", alloc, cred, action="abandoned")
                alloc.unlinked = True
            if not alloc.holders:
                self.custody.free(alloc)
            return
        self.custody.free(alloc)
        with self.journal.change(durable=alloc.durable):
            self.journal.keep(alloc, "state")
            alloc.state = "lost"
            self.registry.nodes.update(alloc.id, state="lost")
            self.journal.event("lost", alloc, cred, reason="a restore from a snapshot did "
                               "not complete")
        self.journal.node_changed(alloc)


def _ecc_blocks(ranges: list, size: int) -> set[int]:
    """Byte ranges [[start, end], ...] as the daemon's 128 KiB damage blocks."""
    out: set[int] = set()
    if not isinstance(ranges, list):
        raise UsageError("restored.damaged must be a list of [start, end] byte ranges")
    for r in ranges[:1_000_000]:
        if not (isinstance(r, list) and len(r) == 2 and all(isinstance(v, int) for v in r)
                and 0 <= r[0] < r[1] <= max(size, 1)):
            raise UsageError(f"invalid damaged range {r!r}: expected [start, end] within "
                             f"0..{size}")
        out.update(range(r[0] // ECC_BLOCK, -(-r[1] // ECC_BLOCK)))
    return out
