"""What the unit tier calls the daemon's verbs with (tier a): a real registry in a temp dir, the
host backend and the in-process keeper double (tests/unit/keeper_double.py), so no keeper
process is started, composed as daemon/main.py composes them (daemon/compose.py);
`clean()` runs the consistency check after a scenario."""
from __future__ import annotations

import dataclasses
import os

from daemon.backends.arenas import is_span
from daemon.backends.host import HostBackend
from daemon.compose import Config, build, start
from daemon.core.permissions import Credentials
from daemon.registry import Registry
from daemon.verbs.plan import KeeperWork, ParityWork
from tests.sizes import MiB

from .keeper_double import InProcessKeeper, KeptFds

ROOT = Credentials(pid=os.getpid(), uid=0, gid=0)


class Parts:
    """One daemon's parts: the verb groups (`m.names`, `m.handles`, `m.queries`, ...: the
    Verbs, also as `m.verbs`) and the layers under them (`m.backend`, `m.keeper`, `m.ns`,
    `m.registry`, ...: the Core, also as `m.core`), as build() composed them."""

    def __init__(self, registry: Registry, backend: HostBackend, keeper: InProcessKeeper,
                 slabs: bool = False, arenas: bool | None = None):
        # Slabs and parity arenas off by default: the unit tier's scenarios were written for
        # memory and parity of its own per allocation (a granule each, a keeper deposit
        # each); World(slabs=True) packs, and parity goes into arenas unless arenas=False.
        self.core, self.verbs = build(registry, backend, keeper, Config(
            slabs=slabs, parity_arenas=slabs if arenas is None else arenas))
        for part in (self.core, self.verbs):
            for field in dataclasses.fields(part):
                setattr(self, field.name, getattr(part, field.name))


class World:
    """A daemon's parts and everything under them; `crash()` builds fresh ones on the same
    state, as a daemon killed and started again does (the keeper's holdings live on)."""

    def __init__(self, tmp_path, limit=256 * MiB, slabs: bool = False,
                 arenas: bool | None = None):
        self.dir = str(tmp_path)
        self.limit = limit
        self.slabs, self.arenas = slabs, arenas
        self.kept = KeptFds()            # the keeper "process": outlives every daemon
        self.parts: list[Parts] = []
        self.m = self._new()

    def _new(self) -> Parts:
        m = Parts(Registry(os.path.join(self.dir, "registry.sqlite")),
                  HostBackend(limit=self.limit), InProcessKeeper(self.kept), self.slabs,
                  self.arenas)
        self.summary = start(m.verbs)
        self.parts.append(m)
        return m

    def crash(self) -> Parts:
        """Drop the daemon without shutdown (its memfds close as a killed daemon's would)."""
        old = self.m
        for a in old.queries.allocations():
            if a.buffer is not None:
                old.backend.free(a.buffer)
        for slab in list(old.backend.pool.slabs.values()):     # a slab's memfds close too
            old.backend.raw.free(slab.data)
            if slab.parity is not None and not is_span(slab.parity):
                old.backend.raw.free(slab.parity)
        for arena in list(old.backend.arenas.arenas.values()):  # and a parity arena's
            old.backend.raw.free(arena.data)
        old.keeper.close()
        old.registry.close()
        self.m = self._new()
        return self.m

    def close(self):
        self.kept.stop()                 # the keeper exits, closing every fd it held
        for a in self.m.queries.allocations():
            self.m.custody.free(a)       # the last daemon's memory (memfds) goes with it
        for slab in list(self.m.backend.pool.slabs.values()):
            self.m.backend.pool.drop_slab(slab)
        self.m.custody.arenas.close()
        for m in self.parts:
            m.registry.close()


def clean(m):
    """`check` finds nothing wrong (registry, tree, backend and keeper agree)."""
    report = m.checks.check()
    assert report["clean"], report["problems"]


def with_workers(plan):
    """Run a plan (daemon/verbs/plan.py) as the runner does under trio, on this thread: each
    ParityWork's job run at its request, whatever its size, as a worker thread runs a large
    one; each KeeperWork's rest waited for, its error thrown in. Returns the answer."""
    sent, thrown = None, None
    while True:
        try:
            request = plan.send(sent) if thrown is None else plan.throw(thrown)
        except StopIteration as done:
            return done.value
        sent, thrown = None, None
        try:
            if isinstance(request, ParityWork) and request.job is not None:
                request.job.run()
            elif isinstance(request, KeeperWork) and request.rest is not None:
                sent = request.rest()
        except BaseException as exc:  # noqa: BLE001 - thrown in, as the runner does
            thrown = exc


def last_step(plan):
    """The rest of a plan whose first step a test took with next(): its answer."""
    try:
        plan.send(None)
    except StopIteration as done:
        return done.value
    raise AssertionError("the plan asked for more work")
