"""The daemon's side of `gpumemctl snapshot`: refilling allocations from a snapshot
(`RefillVerbs`, the start of a restore) and recording what clients report of their snapshots
(`SnapshotRecords`). The two share nothing but the subject.

The client reads the snapshot with its own rights and writes the memory through an fd, as
`gpumemctl write` does; the daemon decides what it may fill and when the result is served.
`begin_refill` (op `refill`): an allocation that is `lost` gets new memory; a missing name is
created (transient until the restore completes); an existing allocation with memory is
refilled only when asked (`force`). Each needs write permission. The allocation is then
`restoring`: nobody else may open, read or attach it (the mount answers EAGAIN), its row says
`lost`, and the keeper does not hold it. So a daemon crash, or a client that dies or closes
without saying it finished, leaves it `lost` (a created one is removed): a half-restored
allocation is never served as whole. How a refill ends is daemon/core/refills.py's.
"""
from __future__ import annotations

import logging
import os
import time

from gpumemctl.protocol import Busy, Exists, GpumemError, InvalidState, NotFound, UsageError

from ..backends.packed import PackedBackend
from ..backends.slabs import Slot, placement, region
from ..core import usermeta
from ..core.creation import Creation, NewAllocation, Request
from ..core.custody import Custody, require_extents_mapped
from ..core.describe import describe
from ..core.earlyparity import EarlyParity
from ..core.holders import Holders
from ..core.integrity import Integrity, ParityJob
from ..core.journal import Journal
from ..core.namespace import Namespace
from ..core.nodes import MOVING, Allocation
from ..core.parity import BLOCK
from ..core.permissions import Credentials, R, W, administrative_uid, require
from ..core.refills import Refill, Refills
from ..core.sessions import Session
from ..core.sizing import Sizing
from ..registry import Registry
from .plan import ParityWork, Plan

log = logging.getLogger("gpumemd")


class RefillVerbs:
    def __init__(self, registry: Registry, journal: Journal, namespace: Namespace,
                 backend: PackedBackend, custody: Custody, integrity: Integrity, holders: Holders,
                 creation: Creation, refills: Refills, meta_bounds: usermeta.Bounds,
                 sizing: Sizing):
        self.sizing = sizing
        self.registry = registry
        self.journal = journal
        self.ns = namespace
        self.backend = backend
        self.custody = custody
        self.integrity = integrity
        self.holders = holders
        self.creation = creation
        self.refills = refills
        self.meta_bounds = meta_bounds

    def begin_refill(self, path: str, cred: Credentials, session: Session, *, size: int,
                     mode: int, ecc: str | None, durable: bool, device: str | None,
                     force: bool, unsealed: bool, metadata: dict | None = None,
                     extents: bool = False):
        """Returns (holder, fds, info) of a `write` handle on an allocation now `restoring`.
        `metadata`: the snapshot's user metadata, which becomes the allocation's (all of
        it, replacing what an existing one had) as the restore begins; None: keep it.

        The checks first, then the memory a lost allocation gets; then one change (a
        missing name's allocation, `restoring`, the metadata, the holder) whose failure
        gives back all of it; once that committed, the keeper's copy of an allocation
        refilled over is withdrawn."""
        if not isinstance(size, int) or size < 0:
            raise UsageError(f"invalid size {size!r}: expected bytes, 0 or more")
        entries = usermeta.entries(metadata) if metadata is not None else None
        request = Request(size, False, mode, device, ecc, session=session, metadata=metadata)
        new: NewAllocation | None = None
        try:
            found = self.ns.lookup_allocation(path, cred)
        except NotFound:
            new, entries = self._check_new(path, cred, request), None
        else:
            self._require_refillable(found, cred, size, force, durable)
            if not self.sizing.shares_slab_with(found, cred.uid):
                self.sizing.own_memory(found)     # never another owner's slab's fd
            if entries is not None:
                self.meta_bounds.check(found.path, found.uid, found.metadata_bytes,
                                       usermeta.size_of(entries))
        kept = new is None and found.kept
        was = self._give_memory(found, device) if new is None and found.state == "lost" \
            else None
        fds: list[int] = []
        try:
            with self.journal.change(durable=new is None and found.durable):
                alloc = found if new is None else self._create(new, path, cred, request)
                if was is not None:                 # new memory: where it is, a slot too
                    self.registry.nodes.update(alloc.id, device=alloc.device,
                                              capacity=alloc.capacity,
                                              **placement(alloc.buffer))
                self._enter_restoring(alloc, cred, entries)
                require_extents_mapped(alloc, extents, "restore into")
                fds = self.backend.export_all(alloc.buffer, True)
                holder = self.holders.add(alloc, session, "write")
                self.refills.add(holder.id, Refill(alloc, new is not None, durable, unsealed))
        except BaseException:
            for fd in fds:
                os.close(fd)
            if was is not None:             # lost again, as it was: without memory
                self.custody.free(found)
                found.device, found.capacity = was
            raise
        if kept:
            # Its old contents are given up: from now a crash must find it lost, not adopt
            # the keeper's copy while it is half overwritten (the client has no fd yet).
            self.custody.withdraw_quietly(alloc.id)
        self.integrity.changed_all(alloc)
        self.journal.node_changed(alloc)
        info = describe(alloc)
        if (where := region(alloc.buffer)) is not None:   # a slot: the client maps its place
            info["region"] = where  # type: ignore[typeddict-unknown-key]
        return holder, fds, info

    def report_written(self, session: Session, holder_id: int, ranges: object) -> Plan[dict]:
        """Op `refill_written`: the client of a refill handle says the bytes of `ranges`
        are written and final. The parity of every block they touch whose bytes have all
        been reported (by them and earlier reports) is encoded now, from the bytes as they
        are, on a worker thread, while the client goes on writing, so that the close
        encodes only the rest (its `written`). Answered once that is done: `encoded`,
        every byte range whose parity is encoded so far. A byte written after its last
        report, and not named by the close's `written`, keeps parity that does not match
        it, in this allocation only: the client's own word, as a close's `written` is
        (docs/protocol.md, "Snapshots"). Nothing is encoded early without rs
        parity, or for a slot (its parity is its slab's, encoded whole at the close)."""
        holder = self.holders.find(session, holder_id, ("write",), "refill handle")
        refill = self.refills.of(holder.id)
        if refill is None:
            raise UsageError(f"handle {holder_id} is not a refill handle: only a refill's "
                             "written bytes are reported before its close")
        alloc = refill.alloc
        early = refill.early = refill.early or EarlyParity(alloc.size or 0)
        runs = early.report(early.check(ranges))
        if not _encodes_early(alloc):
            return {"encoded": []}
        for first, stop in runs:
            job = ParityJob(alloc, self.integrity.parity, first * BLOCK, stop * BLOCK,
                            False, (alloc.dirty_from, alloc.dirty_to))
            yield ParityWork(job)
            if self.refills.of(holder_id) is not refill or alloc.parity is None:
                raise NotFound(f"'{alloc.path}': its refill ended while its parity was "
                               "encoded")
            if not job.done:    # small, or it failed on a worker: here, errors and all
                job.run()
            early.mark(first, stop)
            log.debug("'%s': parity of blocks %d-%d encoded ahead of its close", alloc.path,
                      first, stop - 1)
        return {"encoded": early.encoded_bytes()}

    def _check_new(self, path: str, cred: Credentials, request: Request) -> NewAllocation:
        """A missing name: where its allocation goes (Creation.check)."""
        new = self.creation.check(path, cred, request)
        if not isinstance(new, NewAllocation):
            raise Exists(f"'{new.path}' already exists")
        return new

    def _create(self, new: NewAllocation, path: str, cred: Credentials,
                request: Request) -> Allocation:
        """Inside begin_refill's change: a transient allocation for a missing name, as
        `create` makes it; the change's rollback frees its memory."""
        alloc = self.creation.make(new, path, cred, request)
        self.journal.on_rollback(lambda: self.custody.free(alloc))
        return alloc

    def _require_refillable(self, alloc: Allocation, cred: Credentials, size: int,
                            force: bool, durable: bool) -> None:
        require(alloc, cred, W, "restore over")
        if alloc.state == "restoring":
            raise Busy(f"'{alloc.path}' is being restored by another client")
        if alloc.state in MOVING:
            raise InvalidState(f"'{alloc.path}' is {alloc.state}: wake it first (`gpumemctl "
                               f"wake {alloc.path}`), then restore over it",
                               details={"errno": "EAGAIN"})
        if alloc.state != "lost" and not force:
            raise Exists(f"'{alloc.path}' exists (state {alloc.state}): restore it under "
                         "another name (--as PREFIX), or over it (--force)")
        if (alloc.size or 0) != size:
            raise UsageError(f"'{alloc.path}' has size {alloc.size} and the snapshot's copy "
                             f"{size}: remove it first, or restore with --as PREFIX")
        others = [h for h in alloc.holders.values() if h.kind != "lease"]
        if others:
            raise Busy(f"'{alloc.path}' is in use: " + ", ".join(
                f"{h.kind} by pid {h.pid}" for h in others))
        self.refills.require_durable_allowed(alloc, cred, durable)   # what its end does

    def _give_memory(self, alloc: Allocation, device: str | None) -> tuple[str | None,
                                                                           int | None]:
        """New, zeroed memory and parity for a lost allocation (not deposited yet), on the
        device asked for, else its old one, else (gone) the first. Its new device and
        capacity are set in memory (the parity is sized by them); returned: the old ones,
        which the caller puts back, with the memory freed, if its change fails."""
        backend = self.backend
        try:
            dev = backend.device(device if device is not None else alloc.device)
        except NotFound:
            if device is not None:
                raise
            dev = backend.device(None)
        capacity = backend.capacity_for(dev, max(alloc.size or 0, 1))
        was = alloc.device, alloc.capacity
        alloc.buffer = self.custody.allocate(dev, alloc.size, capacity, alloc.ecc,
                                             label=alloc.path, uid=alloc.uid)
        self.custody.bind(alloc)
        alloc.device, alloc.capacity = dev.uuid, capacity
        try:
            self.integrity.protect_new(alloc)
        except BaseException:
            self.custody.free(alloc)
            alloc.device, alloc.capacity = was
            raise
        return was

    def _enter_restoring(self, alloc: Allocation, cred: Credentials,
                         metadata: dict[bytes, bytes] | None = None) -> None:
        """Inside begin_refill's change."""
        self.journal.keep(alloc, "state")
        alloc.state = "restoring"
        self.registry.nodes.update(alloc.id, state="lost")
        self.journal.event("restore", alloc, cred, action="begin")
        if metadata is not None and metadata != alloc.metadata:
            self.ns.metadata.replace(alloc, metadata)
            self.journal.event("meta", alloc, cred, action="replace", keys=len(metadata))

    def queue_restores(self) -> list[Allocation]:
        """restore_on_start: mark every lost allocation as about to be restored."""
        queued = [a for a in self.ns.allocations() if a.state == "lost"]
        for alloc in queued:
            alloc.restore_queued = True
        return queued

    @staticmethod
    def unqueue_restores(queued: list[Allocation]) -> None:
        for alloc in queued:
            alloc.restore_queued = False


def _encodes_early(alloc: Allocation) -> bool:
    """Whether a refill's reports encode parity before its close: rs parity of its own
    (a slot's blocks are its slab's, encoded whole), and memory."""
    return alloc.ecc == "rs" and alloc.parity is not None and alloc.buffer is not None \
        and not isinstance(alloc.buffer, Slot)


REPORT_ACTIONS = ("create", "restore", "verify")
REPORT_RESULTS = ("ok", "damaged", "failed", "partial")
MAX_REPORTED_PATHS = 100_000


class SnapshotRecords:
    """What clients report of their snapshots (op `snapshot_report`): each report is an
    event; a successful create stamps each allocation it names (that the caller may read)
    with the snapshot and its time (`info`, `ls -l`, the monitor); and the administrator's
    newest report of each action is what `status` and `gpumemctl metrics` show, since a
    report is the client's word and only the administrator's speaks for the host."""

    def __init__(self, registry: Registry, journal: Journal, namespace: Namespace):
        self.registry = registry
        self.journal = journal
        self.ns = namespace
        self.last_snapshots: dict[str, dict] = {}  # the administrator's newest reports

    def load(self) -> None:
        """At start-up: the administrator's newest reports of earlier runs."""
        self.last_snapshots = self.registry.event_log.last_snapshot_reports(administrative_uid)

    def record_snapshot(self, cred: Credentials, report: dict, paths: list[str],
                        administrator: bool) -> dict:
        action, result = report["action"], report["result"]
        if action not in REPORT_ACTIONS or result not in REPORT_RESULTS:
            raise UsageError(f"invalid snapshot report: action {action!r} (expected one of "
                             f"{', '.join(REPORT_ACTIONS)}), result {result!r} (expected one "
                             f"of {', '.join(REPORT_RESULTS)})")
        if len(paths) > MAX_REPORTED_PATHS:
            raise UsageError(f"a snapshot report names {len(paths)} allocations: at most "
                             f"{MAX_REPORTED_PATHS}")
        now = time.time_ns()
        stamped = 0
        with self.journal.change(durable=False):
            if action == "create" and result == "ok":
                stamped = self._stamp(paths, cred, report["location"], now)
            self.journal.event("snapshot", None, cred, **report)
        if administrator:
            self.last_snapshots[action] = {**report, "time_ns": now, "uid": cred.uid}
        return {"recorded": True, "stamped": stamped}

    def _stamp(self, paths: list[str], cred: Credentials, location: str, now: int) -> int:
        stamped = 0
        for path in paths:
            try:
                alloc = self.ns.lookup_allocation(path, cred)
                require(alloc, cred, R)
            except GpumemError:
                continue               # gone since, or not the caller's to vouch for
            self.journal.keep(alloc, "snapshot", "snapshot_ns")
            alloc.snapshot, alloc.snapshot_ns = location, now
            self.registry.nodes.update(alloc.id, snapshot=location, snapshot_ns=now)
            stamped += 1
        return stamped
