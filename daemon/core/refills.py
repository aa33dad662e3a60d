"""Refills: the allocations being filled from a snapshot (`restoring`), by the handle that
fills each, and the two ways a refill ends. A refill begins in daemon/verbs/refill.py (op
`refill`); it ends at the close of its handle (daemon/verbs/handles.py), or when its session
ends, so both groups reach it here.

- `finish` (a `close` with `restored`): the parity is encoded (the close's parity job),
  blocks the client found damaged in the snapshot are recorded (`degraded`, they read as
  EIO: the client zeroed them, and zeros are not the data), and a durable allocation is
  deposited with the keeper.
- `abort` (a close without `restored`, or the session ended): not restored. A created one is
  removed, any other is `lost` again: a half-restored allocation is never served as whole.

Either way in one change, with the handle's holder: what may fail is checked first, and a
failure of the registry leaves the refill as it was, to be ended again. Memory goes only
once the change committed.
"""
from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

from gpumemctl.protocol import UsageError

from ..registry import Registry
from .custody import Custody
from .describe import describe
from .earlyparity import EarlyParity
from .integrity import Integrity
from .journal import Journal
from .lifecycle import Lifecycle
from .namespace import Namespace
from .nodes import Allocation, Holder
from .parity import BLOCK as ECC_BLOCK
from .permissions import Credentials, require_owner
from .sessions import Session

if TYPE_CHECKING:
    from gpumemctl.protocol.replies import Node as NodeInfo


@dataclasses.dataclass
class Refill:
    alloc: Allocation
    created: bool           # made by this restore: removed if it does not complete
    durable: bool           # what the snapshot says it was
    unsealed: bool
    # The bytes its client reported final while writing, and the parity encoded from them
    # (op `refill_written`, daemon/core/earlyparity.py); None until the first report.
    early: EarlyParity | None = None


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
        """A refill handle; inside a change, its rollback forgets it again."""
        self._by_holder[holder_id] = refill

        def forget() -> None:
            self._by_holder.pop(holder_id, None)
        self.journal.on_rollback(forget)

    def of(self, holder_id: int) -> Refill | None:
        return self._by_holder.get(holder_id)

    @staticmethod
    def require_durable_allowed(alloc: Allocation, cred: Credentials, durable: bool) -> None:
        """A refill of a durable copy makes the allocation durable at its end, which only
        its owner may (as `durable` asks)."""
        if durable and not alloc.durable and not alloc.unlinked:
            require_owner(alloc, cred, "change the durability of")

    def finish(self, session: Session, holder: Holder, damaged: list,
               modified_ns: object = None) -> NodeInfo:
        """The client wrote every block and says which it found damaged. Checked first
        (the ranges, who may make it durable, the time): refused, the refill stays, to be
        finished or abandoned. Then one change: the holder goes, the allocation is ready
        (or degraded), durable as the snapshot says, deposited with the keeper.
        `modified_ns`: the modification time the snapshot recorded (issue 27), kept where
        the caller is the owner or root (as utimensat's rule for an explicit time), else
        the time now."""
        refill = self._by_holder[holder.id]
        alloc, cred = refill.alloc, session.cred
        blocks = _ecc_blocks(damaged, alloc.size or 0)
        self.require_durable_allowed(alloc, cred, refill.durable)
        kept_time = _modified_ns(modified_ns)
        reason = "restored from a snapshot block that failed its checksum"
        now = time.time_ns()
        modified = kept_time if kept_time is not None and cred.uid in (0, alloc.uid) else now
        with self.journal.change(durable=alloc.durable or refill.durable):
            self.journal.keep(alloc, "state", "modified_ns", "changed_ns", "unsealed")
            alloc.state = "ready"
            alloc.modified_ns, alloc.changed_ns = modified, now
            alloc.unsealed = refill.unsealed
            self.registry.nodes.update(alloc.id, state="ready", modified_ns=modified,
                                      changed_ns=now, unsealed=1 if refill.unsealed else 0)
            self.journal.event("restore", alloc, cred, action="done",
                               damaged_blocks=len(blocks))
            damage_recorded = bool(blocks) and \
                self.integrity.record_damage(alloc, blocks, cred, reason)
            if refill.durable and not alloc.durable and not alloc.unlinked:
                self._make_durable(alloc, cred)
            released = self._drop_holder(holder)
            if alloc.kept:
                self.custody.deposit(alloc)     # its rollback withdraws it
        if damage_recorded:
            self.integrity.log_damage(alloc, reason)
        self.lifecycle.free_released(released)
        self.ns.watchers.data_changed(alloc)
        return describe(alloc, holders=True)

    def _make_durable(self, alloc: Allocation, cred: Credentials) -> None:
        """Inside finish's change: durable as the snapshot says (Lifecycle.set_durable's
        row and event; the deposit is finish's). The durable pin replaces any lease."""
        self.journal.keep(alloc, "durable", "changed_ns", "leased")
        alloc.durable, alloc.leased = True, False
        self.registry.nodes.update(alloc.id, durable=1, changed_ns=alloc.changed_ns)
        self.journal.event("durable", alloc, cred)
        self.lifecycle.drop_holders(alloc.holders_of("lease"))     # none is released

    def abort(self, session: Session, holder: Holder) -> None:
        """The handle closed without `restored`, or its session ended: not restored. One
        change (the holder, and the allocation removed or lost); a failure leaves the
        refill to be abandoned again. Its memory goes once that committed."""
        refill = self._by_holder[holder.id]
        alloc, cred = refill.alloc, session.cred
        with self.journal.change(durable=alloc.durable):
            if refill.created and not alloc.unlinked:
                self.ns.forget(alloc)
                self.journal.event("restore", alloc, cred, action="abandoned")
                self.journal.keep(alloc, "unlinked")
                alloc.unlinked = True
            elif not refill.created:
                self.journal.keep(alloc, "state")
                alloc.state = "lost"
                self.registry.nodes.update(alloc.id, state="lost", slab=None, slot=None)
                self.journal.event("lost", alloc, cred, reason="a restore from a snapshot "
                                   "did not complete")
            released = self._drop_holder(holder)
        self.lifecycle.free_released(released)    # a created one, with its last holder
        if not refill.created:
            self.custody.free(alloc)              # lost: its memory is gone
        self.journal.node_changed(alloc)

    def _drop_holder(self, holder: Holder) -> list[Allocation]:
        """Inside finish's or abort's change: the refill and its holder go (the change's
        rollback puts both back), as Lifecycle.drop_holders drops one. Returns what it
        released, whose memory goes once the change committed (free_released)."""
        holder_id, refill = holder.id, self._by_holder.pop(holder.id)
        self.journal.on_rollback(lambda: self._by_holder.__setitem__(holder_id, refill))
        return self.lifecycle.drop_holders([holder])


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


def _modified_ns(value: object) -> int | None:
    """A restore's `modified_ns`: None, or nanoseconds since 1970 that fit the registry."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**63:
        raise UsageError(f"invalid modified_ns {value!r}: expected nanoseconds since 1970, "
                         "a whole number from 0 to 2**63-1")
    return value
