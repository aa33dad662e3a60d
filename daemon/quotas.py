"""Per-user quotas: a limit on the capacity a uid's allocations hold (docs/config.md).

What counts: the capacity (the size rounded up to the device granularity, the memory a
GPU actually holds) of every allocation the uid owns that has memory now. Not counted:
ECC parity (6.25% more for `ecc = "rs"`: the daemon's overhead, not the user's choice of
size), pending allocations (no memory yet), lost ones (their memory is gone), and
allocations removed while still open (their name and owner are gone; the memory goes with
the last close). What is checked: every step that takes more capacity for an owner: create,
a resize (truncate, `user.gpu.size`), a write through the mount that grows a file, and a
chown by root that hands an allocation to a uid with a quota. Root is not exempt: a quota
for uid 0 applies to root like to anyone (leave uid 0 out of [quotas] to exempt it).

Over the limit is `QuotaExceeded`, a NoMemory (exit code 7, "no memory" on the wire, so
clients need nothing new) with errno EDQUOT for the mount.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from gpumemctl.protocol import NoMemory

if TYPE_CHECKING:
    from .nodes import Allocation


def human(n: int) -> str:
    """16 GiB, 15.5 GiB, 512 MiB, 4096 B: exact enough for a message."""
    for shift, unit in ((40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")):
        if n >= 1 << shift:
            text = f"{n / (1 << shift):.2f}".rstrip("0").rstrip(".")
            return f"{text} {unit}"
    return f"{n} B"


class QuotaExceeded(NoMemory):
    def __init__(self, uid: int, limit: int, used: int, requested: int):
        super().__init__(
            f"quota exceeded for uid {uid}: {human(limit)} quota, {human(used)} used, "
            f"{human(requested)} requested",
            details={"errno": "EDQUOT", "uid": uid, "quota": limit, "used": used,
                     "requested": requested})


class Quotas:
    """The limits, and the check the AllocationManager makes before taking capacity."""

    def __init__(self, allocations: Callable[[], list[Allocation]],
                 limits: dict[int, int] | None = None):
        """`allocations`: every allocation now (Namespace.allocations)."""
        self.allocations = allocations
        self.limits: dict[int, int] = dict(limits or {})

    def used(self, uid: int) -> int:
        # A walk over the allocations, made only for uids that have a quota and only when
        # capacity grows (never per write within the capacity).
        return sum(a.capacity or 0 for a in self.allocations()
                   if a.uid == uid and a.buffer is not None)

    def check(self, uid: int, more: int) -> None:
        """Raise QuotaExceeded if `uid` taking `more` bytes of capacity passes its limit."""
        limit = self.limits.get(uid)
        if limit is None or more <= 0:
            return
        used = self.used(uid)
        if used + more > limit:
            raise QuotaExceeded(uid, limit, used, more)

    def report(self, uid: int | None = None) -> list[dict]:
        """For `status`: each limit with its use (only `uid`'s, when given)."""
        return [{"uid": u, "quota": limit, "used": self.used(u)}
                for u, limit in sorted(self.limits.items()) if uid is None or u == uid]
