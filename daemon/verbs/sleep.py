"""The verbs of sleep and wake (issue 28): `gpumemctl sleep/wake`, Client.sleep/wake, and
op `remap`, by which an attachment that kept its address while its allocation slept maps the
new memory there. The order of the steps is daemon/core/sleep.py's; here: who may ask, what
may hold the allocation meanwhile, and the answers.

Who holds it decides: nothing may have the memory mapped or open when it goes but the
caller's own process's attachments that say they let go of their mapping (`parked`): the
daemon cannot take a mapping away from a process, and freeing memory another process still
maps would not free it (the driver keeps it until that process unmaps). A lease is no
mapping and stays.
"""
from __future__ import annotations

import os
import time

from gpumemctl.protocol import Busy, InvalidState, NotFound, PermissionDenied, UsageError

from ..backends.packed import PackedBackend
from ..backends.slabs import region
from ..core.custody import Custody, require_extents_mapped
from ..core.describe import describe
from ..core.holders import ATTACH_KINDS, Holders
from ..core.namespace import Namespace
from ..core.nodes import Allocation, Holder
from ..core.permissions import Credentials, W, require
from ..core.sessions import Session
from ..core.sizing import Sizing
from ..core.sleep import Sleep
from .plan import Offload, Plan

SLEEPABLE = ("ready", "degraded")
MAX_PARKED = 1024


class SleepVerbs:
    def __init__(self, namespace: Namespace, backend: PackedBackend, custody: Custody,
                 holders: Holders, sizing: Sizing, sleep: Sleep):
        self.ns = namespace
        self.backend = backend
        self.custody = custody
        self.holders = holders
        self.sizing = sizing
        self.core = sleep

    def sleep(self, path: str, cred: Credentials, session: Session,
              parked: list[int] | None = None) -> Plan[dict]:
        """Op `sleep`: the bytes to the host tier (copied on a worker thread), the device
        memory given back. Needs write permission (it takes the memory away from every
        reader too)."""
        alloc = self.ns.lookup_allocation(path, cred)
        require(alloc, cred, W, "put to sleep")
        if alloc.state == "asleep":
            return self._answer(alloc, cred, 0, 0.0, already=True)
        self._require_sleepable(alloc)
        holders = self._parked(alloc, session, parked or [])
        self._require_no_others(alloc, holders)
        if holders and self.backend.name == "cuda" and self.backend.in_slab(alloc.buffer):
            raise InvalidState(
                f"'{alloc.path}' is packed in a slab with other small allocations: an "
                "attachment cannot keep its address across a sleep of it; detach it first "
                "(docs/engines.md, \"Sleep and wake\")")
        self.sizing.pending.settle_near(alloc)     # its slot's parity settled first
        began = time.monotonic()
        move = self.core.begin_sleep(alloc, holders)
        try:
            yield Offload(lambda: self.core.copy_out(move))
            moved = self.core.finish_sleep(move, cred)
        except BaseException:
            self.core.abandon_sleep(move)
            raise
        return {**self._answer(alloc, cred, moved, time.monotonic() - began),
                "phases": move.phases}

    def wake(self, path: str, cred: Credentials) -> Plan[dict]:
        """Op `wake`: new device memory with the bytes back (copied and checked on a worker
        thread)."""
        alloc = self.ns.lookup_allocation(path, cred)
        require(alloc, cred, W, "wake")
        if alloc.state in ("sleeping", "waking"):
            raise InvalidState(f"'{alloc.path}' is {alloc.state} already; try again in a "
                               "moment", details={"errno": "EAGAIN"})
        if not alloc.asleep:
            return self._answer(alloc, cred, 0, 0.0, already=True)
        began = time.monotonic()
        move = self.core.begin_wake(alloc)
        move.timed("allocate", began)
        try:
            yield Offload(lambda: self.core.copy_in(move))
            found = self.core.finish_wake(move, cred)
        except BaseException:
            self.core.abandon_wake(move)
            raise
        answer = self._answer(alloc, cred, alloc.size or 0, time.monotonic() - began)
        answer["verify"] = found
        answer["phases"] = move.phases
        return answer

    def remap(self, session: Session, holder_id: int, cred: Credentials, *,
              regions: bool = False, extents: bool = False):
        """Op `remap`: fds of an attachment's allocation's memory now (awake), for the
        attachment of this session to map where it kept its address. Returns (holder, fds,
        info) as `attach` does."""
        holder = self.holders.find(session, holder_id, ATTACH_KINDS.values(), "attachment")
        alloc = holder.alloc
        self.custody.require_memory(alloc)          # asleep: EAGAIN, wake it first
        if not (regions and self.sizing.shares_slab_with(alloc, cred.uid)):
            self.sizing.own_memory(alloc)           # another's slab never
        require_extents_mapped(alloc, extents, "map")
        fds = self.backend.export_all(alloc.buffer, holder.kind == "attach-w")
        try:
            info = describe(alloc, holders=True, metadata=True, cred=cred)
            if (where := region(alloc.buffer)) is not None:
                info["region"] = where  # type: ignore[typeddict-unknown-key]
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        holder.parked = False
        return holder, fds, info

    # ---- checks ---------------------------------------------------------------------------
    @staticmethod
    def _require_sleepable(alloc: Allocation) -> None:
        if alloc.unlinked:
            raise InvalidState(f"'{alloc.path}' has been removed")
        if alloc.state not in SLEEPABLE or alloc.buffer is None:
            busy = alloc.state in ("restoring", "sleeping", "waking")
            raise InvalidState(f"'{alloc.path}' is {alloc.state}: only an allocation that "
                               "holds its memory (ready or degraded) can sleep",
                               details={"errno": "EAGAIN" if busy else "EINVAL"})

    @staticmethod
    def _parked(alloc: Allocation, session: Session, ids: list) -> list[Holder]:
        """The attachments the caller says let go of their mapping: each must be an
        attachment of this allocation held by the caller's own process (same pid and uid:
        another process cannot speak for a mapping it cannot see)."""
        if not isinstance(ids, list) or len(ids) > MAX_PARKED or \
                not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise UsageError(f"invalid parked {ids!r}: expected a list of at most "
                             f"{MAX_PARKED} attachment handles (integers)")
        me = session.cred
        out: list[Holder] = []
        for holder_id in dict.fromkeys(ids):
            holder = alloc.holders.get(holder_id)
            if holder is None or holder.kind not in ATTACH_KINDS.values():
                raise NotFound(f"no attachment {holder_id} of '{alloc.path}'")
            if holder.pid != me.pid or holder.uid != me.uid:
                raise PermissionDenied(
                    f"attachment {holder_id} of '{alloc.path}' belongs to pid {holder.pid}: "
                    "only its own process can say it let go of its mapping",
                    details={"errno": "EPERM"})
            out.append(holder)
        return out

    @staticmethod
    def _require_no_others(alloc: Allocation, parked: list[Holder]) -> None:
        others = [h for h in alloc.holders.values()
                  if h.kind != "lease" and h not in parked and not h.parked]
        if others:
            raise Busy(f"'{alloc.path}' is in use (" + ", ".join(
                f"{h.kind} by pid {h.pid}" for h in others[:4]) + "): it can sleep once "
                "they let go; an attachment's own process sleeps it with Client.sleep, "
                "which parks the mapping (docs/engines.md, \"Sleep and wake\")")

    @staticmethod
    def _answer(alloc: Allocation, cred: Credentials, moved: int, seconds: float, *,
                already: bool = False) -> dict:
        return {"info": describe(alloc, cred=cred), "bytes": moved,
                "seconds": round(seconds, 6), "already": already}
