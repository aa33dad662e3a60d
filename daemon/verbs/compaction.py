"""The verbs of compaction (docs/storage.md, "Compaction and fragmentation"): `compact` (the
administrator's, through the socket: `gpumemctl compact`) and the pass housekeeping runs by
itself when a device's slabs have much slack (daemon/services/housekeeping.py). The moves
and their crash-safe order are the core's (daemon/core/compaction.py); here the pass is a
plan that lets the event loop run between its slices."""
from __future__ import annotations

import os
import time

from ..core.compaction import Compaction, Pass
from ..core.describe import shown_path
from ..core.journal import Journal
from ..core.permissions import Credentials
from .plan import Plan, breathing

# Housekeeping's pass runs when a device's slabs that compaction could act on (those holding
# something, of kinds with several) have more slack than AUTO_SHARE of their bytes and more
# than the configuration's compact_min_slack.
AUTO_SHARE = 0.25
AUTO_BACKOFF_SECONDS = 60.0     # after a pass that freed nothing, while nothing changed


class CompactionVerbs:
    def __init__(self, compaction: Compaction, journal: Journal, *,
                 min_slack: int | None = 64 << 20):
        """`min_slack`: config compact_min_slack (bytes; 0 or None: never by itself)."""
        self.compaction = compaction
        self.journal = journal
        self.min_slack = min_slack
        self.passes = 0                 # passes run (both kinds), for the log and tests
        self._futile: tuple | None = None   # the slabs' use when a pass last freed nothing
        self._futile_at = 0.0

    def compact(self, cred: Credentials, dry_run: bool = False) -> Plan[dict]:
        """One pass over every slab kind (the caller checked who may ask): what moved, the
        slabs emptied and the bytes they gave back. `dry_run`: what would, moving nothing."""
        done = yield from breathing(self.compaction.steps(dry_run))
        self._after(done, asked=True)
        return answer(done, cred)

    def due(self) -> bool:
        """Whether housekeeping should run a pass now: a device's slabs (Compaction.slack)
        have more slack than AUTO_SHARE of their bytes and than min_slack, and the last
        pass that freed nothing was not on the same slabs (or was AUTO_BACKOFF_SECONDS
        ago)."""
        if not self.min_slack:
            return False
        if not any(slack > AUTO_SHARE * total and slack > self.min_slack
                   for total, slack in self.compaction.slack().values()):
            return False
        return self._futile != self._use() or \
            time.monotonic() - self._futile_at >= AUTO_BACKOFF_SECONDS

    def auto(self) -> Plan[dict]:
        """Housekeeping's pass: as `compact`, for the daemon, answering the counts only."""
        done = yield from breathing(self.compaction.steps(False))
        self._after(done, asked=False)
        return {"moved": done.moved_count, "slabs_freed": len(done.emptied),
                "freed_bytes": freed_bytes(done)}

    def _after(self, done: Pass, asked: bool) -> None:
        if done.dry_run:
            return
        self.passes += 1
        if done.moved_count or done.emptied:     # a pass that changed nothing says nothing
            self.journal.note("compact", asked=asked, moved=done.moved_count,
                              moved_bytes=done.moved_bytes, slabs_freed=len(done.emptied),
                              freed_bytes=freed_bytes(done))
        if done.emptied:
            self._futile = None
        else:
            self._futile, self._futile_at = self._use(), time.monotonic()

    def _use(self) -> tuple:
        pool = self.compaction.backend.pool
        return tuple(sorted((s.id, len(s.used)) for s in pool.slabs.values()))


def answer(done: Pass, cred: Credentials) -> dict:
    """The `compact` answer (docs/protocol.md): names as the caller may see them (root and
    the daemon's user see every path; anyone else the ids only)."""
    named = cred.is_root or cred.uid == os.geteuid()

    def who(alloc) -> dict:
        return {"id": alloc.id, "path": shown_path(alloc, cred) if named else None,
                "uid": alloc.uid}
    return {
        "dry_run": done.dry_run,
        "moved": [{**who(a), "from": old, "to": new} for a, old, new in done.moved],
        "moved_count": done.moved_count,
        "moved_bytes": done.moved_bytes,
        "skipped": [{**who(a), "reason": why} for a, why in done.skipped],
        "skipped_count": done.skipped_count,
        "slabs_freed": done.freed,
        "freed_bytes": freed_bytes(done),
    }


def freed_bytes(done: Pass) -> int:
    """What the slabs a pass emptied gave back to the device."""
    return sum(f["bytes"] + f["parity_bytes"] for f in done.freed)

