"""What the tree reports of itself: the counts `status` shows, the bytes our allocations hold
on each device, and the allocations a verify covers (only those the caller may list and
read). Nothing here changes the tree.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from gpumemctl.protocol import UsageError

from ...backends.arenas import is_span
from ...backends.slabs import Slot
from ..nodes import Allocation, Directory, Node, walk
from ..permissions import Credentials, R, X, allowed, require

if TYPE_CHECKING:
    from .tree import Namespace


class TreeReports:
    def __init__(self, ns: Namespace):
        self.ns = ns

    def totals(self, sessions: int) -> dict:
        """The counts `status` shows; `sessions`: the open client sessions (Holders)."""
        allocs = self.ns.allocations()
        by_state: dict[str, int] = {}
        for a in allocs:
            by_state[a.state] = by_state.get(a.state, 0) + 1
        return {
            "allocations": len(allocs),
            "directories": sum(1 for n in self.ns.nodes.values()
                               if isinstance(n, Directory)) - 1,
            "durable": sum(1 for a in allocs if a.durable),
            "size": sum(a.size or 0 for a in allocs),
            "capacity": sum(a.capacity or 0 for a in allocs if a.buffer is not None),
            "by_state": by_state,
            # host memory the asleep ones' bytes wait in (daemon/core/sleep.py)
            "asleep_bytes": sum(a.tier.size for a in allocs if a.tier is not None),
            "sessions": sessions,
            "holders": sum(len(a.holders) for a in allocs),
        }

    def bytes_held_per_device(self) -> dict[str, int]:
        """Device UUID -> the bytes our allocations of memory of their own (memory and
        parity of its own) hold on it; the slabs' and the parity arenas' are the packing
        layer's (PackedBackend.pool, .arenas)."""
        ours: dict[str, int] = {}
        for alloc in self.ns.allocations():
            own = alloc.buffer is not None and not isinstance(alloc.buffer, Slot)
            if alloc.device is None or not (own or alloc.asleep):
                continue                 # (asleep: its parity stays on the device)
            parity = alloc.parity.capacity if alloc.parity is not None and \
                not is_span(alloc.parity) else 0          # a span: its arena's
            ours[alloc.device] = ours.get(alloc.device, 0) + \
                (alloc.capacity or 0 if own else 0) + parity
        return ours

    def ecc_targets(self, paths: list[str], cred: Credentials, everything: bool
                    ) -> list[Allocation]:
        """The allocations a verify covers: the named ones (a directory: everything under
        it), or with `everything`, all that the caller may read."""
        out: list[Allocation] = []
        seen: set[int] = set()
        for top in self._tops(paths, cred, everything):
            for a in _listable_allocations(top, cred):
                if a.id not in seen and allowed(a, cred, R):
                    seen.add(a.id)
                    out.append(a)
        return out

    def _tops(self, paths: list[str], cred: Credentials, everything: bool) -> list[Node]:
        """Where a verify starts: the root, or each node named (a directory the caller may
        list, as `ls DIR` needs)."""
        if everything:
            return [self.ns.root]
        if not paths:
            raise UsageError("name one or more allocations, or use --all")
        nodes = [self.ns.lookup(p, cred, allow_root=True) for p in paths]
        for node in nodes:
            if isinstance(node, Directory):
                require(node, cred, R | X, "list")
        return nodes


def _listable_allocations(top: Node, cred: Credentials) -> Iterator[Allocation]:
    """The allocations under `top` that `ls -R` would show `cred`: it enters only the
    directories it may list (read and search), so that a name inside a private
    directory never reaches an answer (docs/security.md)."""
    def enter(d: Directory) -> bool:
        return allowed(d, cred, R | X)
    return (n for n in walk(top, enter) if isinstance(n, Allocation))
