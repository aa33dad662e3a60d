"""What the unit tier calls the AllocationManager with (tier a): a real registry in a temp dir,
the host backend and the in-process keeper double (tests/unit/keeper_double.py), so no keeper
process is started; `clean()` runs the consistency check after a scenario."""
from __future__ import annotations

import os

from daemon.backends.host import HostBackend
from daemon.manager import AllocationManager
from daemon.permissions import Credentials
from daemon.registry import Registry
from tests.sizes import MiB

from .keeper_double import InProcessKeeper, KeptFds

ROOT = Credentials(pid=os.getpid(), uid=0, gid=0)


class World:
    """A manager and everything under it; `crash()` builds a fresh one on the same state, as a
    daemon killed and started again does (the keeper's holdings live on)."""

    def __init__(self, tmp_path, limit=256 * MiB):
        self.dir = str(tmp_path)
        self.limit = limit
        self.kept = KeptFds()            # the keeper "process": outlives every manager
        self.managers: list[AllocationManager] = []
        self.m = self._new()

    def _new(self) -> AllocationManager:
        m = AllocationManager(Registry(os.path.join(self.dir, "registry.sqlite")),
                              HostBackend(limit=self.limit), InProcessKeeper(self.kept))
        self.summary = m.start()
        self.managers.append(m)
        return m

    def crash(self) -> AllocationManager:
        """Drop the manager without shutdown (its memfds close as a killed daemon's would)."""
        old = self.m
        for a in old.allocations():
            if a.buffer is not None:
                old.backend.free(a.buffer)
        old.keeper.close()
        old.registry.close()
        self.m = self._new()
        return self.m

    def close(self):
        self.kept.stop()                 # the keeper exits, closing every fd it held
        for m in self.managers:
            m.registry.close()


def clean(m):
    """`check` finds nothing wrong (registry, tree, backend and keeper agree)."""
    report = m.check()
    assert report["clean"], report["problems"]
