"""Node ids: the next one to give, and ids reserved ahead of the rows that take them. Ids are
keeper keys: a durable create deposits its memory under its id before its row exists, and
start-up keeps new ids above every key the keeper holds.
"""
from __future__ import annotations

from ...registry import Registry


class NodeIds:
    def __init__(self, registry: Registry):
        self.registry = registry
        self._next_id = 0           # the next id to give (load(); reserve)

    def load(self) -> None:
        self._next_id = self.registry.identity.next_node_id()

    def reserve(self, count: int) -> list[int]:
        """Ids no node has or will be given, in order: a key to deposit under before the
        row that takes it is inserted (Custody.send off the event loop, then insert_node),
        and the ids of the directories made with it, so that parents keep smaller ids.
        Taken in memory: every insert names its id (AUTOINCREMENT's sequence follows), and
        one reserved but never inserted is a gap, as a rolled-back insert's is."""
        first = self._next_id
        self._next_id += count
        return list(range(first, first + count))

    def reserve_up_to(self, up_to: int) -> None:
        """Make every future id larger than `up_to` (ids are keeper keys: start-up keeps
        new ids from aliasing what the keeper holds)."""
        self.registry.identity.reserve_node_ids(up_to)
        self._next_id = max(self._next_id, up_to + 1)
