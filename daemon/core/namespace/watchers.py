"""The watchers of the namespace: who is told of every change the kernel may have cached
(the mount, daemon/fs/, invalidates its dentries, attributes and pages), and each
allocation's data generation, for which a cache of its bytes may be kept.
"""
from __future__ import annotations

import contextlib

from ..nodes import Directory, Node


class Watchers:
    def __init__(self) -> None:
        self._watchers: list = []       # the mount's, while it is mounted
        # Data generations: node id -> the value of _data_clock at its last data change made
        # other than through the mount's own writes (data_changed). One clock for all, so a
        # generation is never given twice, even to an allocation whose entry was dropped.
        self._generations: dict[int, int] = {}
        self._data_clock = 0

    def add(self, watcher) -> None:
        """A watcher of what the kernel may cache (daemon/fs/): told entry_changed(
        parent_id, name), attrs_changed(node_id) and data_changed(node_id), and settled
        after each request."""
        self._watchers.append(watcher)

    def remove(self, watcher) -> None:
        with contextlib.suppress(ValueError):
            self._watchers.remove(watcher)

    async def settle(self) -> None:
        """Let every watcher pass its pending invalidations on (the mount learns of a
        socket-side change before the socket client hears the answer)."""
        for watcher in list(self._watchers):
            await watcher.settle()

    def entry_changed(self, parent: Directory, name: str) -> None:
        for watcher in self._watchers:
            watcher.entry_changed(parent.id, name)

    def attrs_changed(self, node: Node) -> None:
        for watcher in self._watchers:
            watcher.attrs_changed(node.id)

    def data_changed(self, node: Node) -> None:
        """An allocation's bytes or size changed by another path than the mount's own writes
        (a socket writer's close, a detach or seal, a resize, a repair): its data generation
        moves on, and the watchers drop what the kernel caches of its contents."""
        self._data_clock += 1
        self._generations[node.id] = self._data_clock
        for watcher in self._watchers:
            watcher.data_changed(node.id)

    def data_generation(self, node: Node) -> int:
        return self._generations.get(node.id, 0)

    def forget(self, node: Node) -> None:
        """The node left the tree: its generation goes with it (the clock never goes back,
        so a cache of it is never taken for another's)."""
        self._generations.pop(node.id, None)
