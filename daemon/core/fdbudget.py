"""File descriptors as a budgeted resource (docs/operations.md, "File descriptors").

Each allocation holds descriptors in gpumemd for its whole life: its memory (a memfd, or the
shareable fd of a CUDA allocation) and, with ECC, its parity's: 2 an allocation by default,
and 2 more in the keeper while it is durable. Under a service manager's limit (1024 is
systemd's soft default) a few hundred small allocations used to take every descriptor: then
accept(), the registry and the mount failed with EMFILE, and every user's requests with them.

So gpumemd raises its soft RLIMIT_NOFILE to the hard one at start (raise_open_file_limit;
the keeper it starts inherits it, and raises its own too: daemon/keeper/process.py) and splits the
limit once:
- FDS_KEPT for what is not a connection or an allocation: stdio, the state lock, the
  registry and its WAL, the listening socket, the keeper link, the mount, NVML, the event
  loop, and what a request holds for a moment (a keeper deposit's dups, SQLite's files);
- for connections, FDS_PER_CONNECTION each (its socket, and the fd of an answer in flight):
  max_connections, lowered to fit at most CONNECTIONS_SHARE of the rest (ConnectionLimits
  counts them, daemon/server/transport.py);
- the rest for allocations: `allocations`. Root and the daemon's own uid are bound only by
  it; the other users together leave ADMIN_SHARE of it to those two, and each of them may
  hold at most `per_uid` (config max_fd_share_per_uid: a percentage of `allocations`).

A step that would take descriptors past one of these is refused before anything is made
(`require`): a create, a pending allocation getting memory, a resize that copies into new
memory. The error is NoMemory (exit 7): errno EDQUOT past the user's share, ENOSPC past the
total, with the figures. What each uid holds is counted like a quota's bytes
(daemon/core/quotas.py): by a walk over the allocations, made only when a bound that costs
nothing (two descriptors per name the uid owns) no longer shows it is within.
"""
from __future__ import annotations

import contextlib
import resource
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from gpumemctl.protocol import NoMemory

from ..backends.slabs import Slot

if TYPE_CHECKING:
    from .nodes import Allocation

FDS_KEPT = 128
FDS_PER_CONNECTION = 2
CONNECTIONS_SHARE = 0.5
ADMIN_SHARE = 0.125
FDS_PER_ALLOCATION = 2          # the most one holds: its memory and its parity
PER_UID_CACHE_SECONDS = 1.0     # a uid's descriptors, walked, are reused this long at most


def raise_open_file_limit() -> tuple[int, int]:
    """Raise the soft open-file limit to the hard one; (the soft limit before, after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    before = soft
    if hard != soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    infinite = 1 << 20          # RLIM_INFINITY: what the kernel allows at most (nr_open)
    return (before if before != resource.RLIM_INFINITY else infinite,
            soft if soft != resource.RLIM_INFINITY else infinite)


def fds_of(alloc: Allocation) -> int:
    """Descriptors an allocation holds in gpumemd now: its memory's and its parity's (none
    for a slot: its slab's are counted once, FdBudget.watch's `slabs`)."""
    if isinstance(alloc.buffer, Slot):
        return 0
    memory = 0 if alloc.buffer is None else getattr(alloc.buffer, "descriptors", 1)
    return memory + (alloc.parity is not None)


def fds_for(ecc: str) -> int:
    """Descriptors a new allocation will hold: its memory's, and its parity's with ECC."""
    return 1 if ecc == "none" else 2


class FdBudget:
    def __init__(self, limit: int, max_connections: int, privileged_extra: int,
                 share_per_uid: int = 50):
        """`limit`: the soft open-file limit, raised; `max_connections`: the configured
        cap, of which `connections` is what fits; `privileged_extra`: the connections root
        and the daemon's uid may open past it (ConnectionLimits); `share_per_uid`: config
        max_fd_share_per_uid, percent of `allocations`."""
        self.limit = limit
        rest = max(0, limit - FDS_KEPT)
        fit = int(rest * CONNECTIONS_SHARE) // FDS_PER_CONNECTION - privileged_extra
        self.connections = max(16, min(max_connections, fit))
        self.allocations = max(0, rest - (self.connections + privileged_extra)
                               * FDS_PER_CONNECTION)
        self.for_users = self.allocations - int(self.allocations * ADMIN_SHARE)
        self.share = share_per_uid
        self.per_uid = min(self.allocations * share_per_uid // 100, self.for_users)
        self.exempt: Callable[[int], bool] = lambda uid: False
        self._allocations: Callable[[], list[Allocation]] = list
        self._kept: Callable[[], list[Allocation]] = list
        self._nodes: Callable[[], int] = lambda: 0
        self._names_of: Callable[[int], int] = lambda uid: 0
        # Descriptors of slabs (a uid's, or None: all), which slots share.
        self.slab_fds: Callable[[int | None], int] = lambda uid: 0
        # The buffers of memory of its own alive, and a count of changes to them
        # (PackedBackend.own_buffers, .own_generation): the total without a walk of every
        # allocation, and when a uid's walk (cached) must be made again. None: walk.
        # Third: the extents past a buffer's first (CudaBuffer), which the bounds below,
        # two descriptors a name, do not cover.
        self.own: Callable[[], tuple[int, int, int]] | None = None
        self._per_uid: tuple[tuple[int, int], dict[int, int]] | None = None

    def watch(self, allocations: Callable[[], list[Allocation]],
              kept: Callable[[], list[Allocation]], nodes: Callable[[], int],
              names_of: Callable[[int], int], exempt: Callable[[int], bool]) -> None:
        """What to count, as Quotas does: `allocations()`, the named ones; `kept()`, those
        removed while held open; and for the bounds that cost nothing, `nodes()`, how many
        nodes the tree has, and `names_of(uid)`, how many names a uid owns (each of its
        allocations has one at least). `exempt`: root and the daemon's uid."""
        self._allocations, self._kept, self.exempt = allocations, kept, exempt
        self._nodes, self._names_of = nodes, names_of

    def summary(self) -> str:
        """One line for the start-up log."""
        return (f"{self.connections} connections (+ root's), {self.allocations} descriptors "
                f"for allocations, at most {self.per_uid} per uid (max_fd_share_per_uid "
                f"{self.share})")

    def require(self, uid: int | None, more: int) -> None:
        """NoMemory unless `more` descriptors for an allocation of `uid` (None: root's
        doing, such as a restore) fit: the total, and `uid`'s share when it has one."""
        if more <= 0:
            return
        admin = uid is None or self.exempt(uid)
        limit = self.allocations if admin else self.for_users
        kept = self._kept()
        slabs = self.slab_fds(None)
        extra = self.own()[2] if self.own is not None else 0
        if FDS_PER_ALLOCATION * (self._nodes() + len(kept)) + slabs + extra + more > limit:
            used = (self.own()[0] if self.own is not None else
                    self._used(self._allocations() + kept)) + slabs
            if used + more > limit:
                raise self._total_error(used, more, limit, admin)
        if uid is None or admin:
            return
        slabs = self.slab_fds(uid)
        if FDS_PER_ALLOCATION * (self._names_of(uid) + len(kept)) + slabs + extra + more > \
                self.per_uid:
            if (mine := self._used_by(uid, kept) + slabs) + more > self.per_uid:
                raise self._share_error(uid, mine, more)

    def _used_by(self, uid: int, kept: list[Allocation]) -> int:
        """Descriptors `uid`'s allocations hold: one walk of them all, kept for as long as
        no buffer of memory of its own came or went (slabs are counted apart), and at most
        PER_UID_CACHE_SECONDS (a chown moves descriptors between uids, and no buffer)."""
        generation = None if self.own is None else \
            (self.own()[1], int(time.monotonic() / PER_UID_CACHE_SECONDS))
        cached = self._per_uid
        if generation is not None and cached is not None and cached[0] == generation:
            return cached[1].get(uid, 0)
        per_uid: dict[int, int] = {}
        for a in self._allocations() + kept:
            if n := fds_of(a):
                per_uid[a.uid] = per_uid.get(a.uid, 0) + n
        if generation is not None:
            self._per_uid = (generation, per_uid)
        return per_uid.get(uid, 0)

    @staticmethod
    def _used(allocations: list[Allocation]) -> int:
        return sum(fds_of(a) for a in allocations)

    def _share_error(self, uid: int, used: int, more: int) -> NoMemory:
        return NoMemory(
            f"uid {uid} holds {used} of gpumemd's file descriptors and {more} more would "
            f"pass its share: {self.per_uid} (max_fd_share_per_uid {self.share}% of the "
            f"{self.allocations} gpumemd keeps for allocations under its open-file limit "
            f"{self.limit}; each allocation holds 1, and 1 more with ECC); remove some "
            "allocations first",
            details={"errno": "EDQUOT", "uid": uid, "fds": used, "requested_fds": more,
                     "fd_limit": self.per_uid})

    def _total_error(self, used: int, more: int, limit: int, admin: bool) -> NoMemory:
        whose = "" if admin else f" (less {self.allocations - limit} kept for root)"
        return NoMemory(
            f"gpumemd holds {used} file descriptors for allocations and {more} more would "
            f"pass the {limit} it keeps for them{whose} under its open-file limit "
            f"{self.limit}; remove some allocations, or raise the limit (LimitNOFILE= in "
            "the unit; docs/operations.md, \"File descriptors\")",
            details={"errno": "ENOSPC", "fds": used, "requested_fds": more,
                     "fd_limit": limit})
