"""Per-user quotas: a limit on the capacity a uid's allocations hold (docs/config.md).

Whose limit: the uid's own entry in [quotas]; else `default_quota`, which applies to every
uid but root and the daemon's own (the administrator) — set it on a shared server, so that
no one user can take all the device memory (docs/security.md). A quota for uid 0 in [quotas]
applies to root like to anyone (leave uid 0 out of [quotas] to exempt it).

What counts: the capacity (the size rounded up to the device granularity, the memory a
GPU actually holds) of every allocation the uid owns that has memory now, and of the ones
it removed while something still held them open (`rm --force`, an unlinked file still
open): that memory stays taken until the last holder lets go, so it stays the owner's.
Not counted: ECC parity (6.25% more for `ecc = "rs"`: the daemon's overhead, not the
user's choice of size), pending allocations (no memory yet), lost ones (their memory is
gone). What is checked: every step that takes more capacity for an owner: create, a resize
(truncate, `user.gpu.size`), a write through the mount that grows a file, and a chown by
root that hands an allocation to a uid with a quota.

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
    """The limits, and the check the verbs make before taking capacity."""

    def __init__(self, allocations: Callable[[], list[Allocation]],
                 limits: dict[int, int] | None = None, *,
                 kept: Callable[[], list[Allocation]] = list,
                 default: int | None = None, exempt: Callable[[int], bool] = lambda u: False):
        """`allocations`: every named allocation now (Namespace.allocations); `kept`: those
        removed but still held open; `default`: config default_quota, for every uid without
        a [quotas] entry for which `exempt` is false (root and the daemon's uid)."""
        self.allocations, self.kept = allocations, kept
        self.limits: dict[int, int] = dict(limits or {})
        self.default, self.exempt = default, exempt

    def limit_of(self, uid: int) -> int | None:
        if uid in self.limits:
            return self.limits[uid]
        return None if self.default is None or self.exempt(uid) else self.default

    def used(self, uid: int) -> int:
        # A walk over the allocations, made only for uids that have a quota and only when
        # capacity grows (never per write within the capacity).
        return sum(a.capacity or 0 for a in self._holding()
                   if a.uid == uid and a.buffer is not None)

    def _holding(self) -> list[Allocation]:
        return self.allocations() + self.kept()

    def check(self, uid: int, more: int) -> None:
        """Raise QuotaExceeded if `uid` taking `more` bytes of capacity passes its limit."""
        limit = self.limit_of(uid)
        if limit is None or more <= 0:
            return
        used = self.used(uid)
        if used + more > limit:
            raise QuotaExceeded(uid, limit, used, more)

    def report(self, uid: int | None = None) -> list[dict]:
        """For `status`: each limit with its use (only `uid`'s, when given). Under a
        default_quota, the uids it applies to that hold memory now are listed too."""
        if uid is not None:
            uids = {uid}
        else:
            uids = set(self.limits)
            if self.default is not None:
                uids |= {a.uid for a in self._holding()
                         if a.buffer is not None and not self.exempt(a.uid)}
        return [{"uid": u, "quota": limit, "used": self.used(u)}
                for u in sorted(uids) if (limit := self.limit_of(u)) is not None]
