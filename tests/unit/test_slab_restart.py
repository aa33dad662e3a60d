"""A restart with many objects in slabs (issue 26): each object's slot is taken back with no
codec run (its parity is its slab's, kept with it), and past ADOPT_EVENTS_PER_OBJECT the
`adopt` events are one per slab, so that a restart does not push the event log's history
out."""
from __future__ import annotations

import collections

from daemon.core import adoption
from daemon.verbs.plan import run_sync

from .world import ROOT, World, clean

KiB = 1 << 10


def make(world: World, n: int, size: int = 64 * KiB) -> None:
    m = world.m
    with m.verbs.many.group():
        for i in range(n):
            assert m.verbs.many.create(f"kv/{i:05d}", ROOT, size=size, durable=True)
    run_sync(m.names.create("own", ROOT, size=4 << 20, durable=True))   # memory of its own


def adopt_events(m) -> list[dict]:
    events, _ = m.reports.events(since=0, limit=100_000, administrator=True)
    return [e for e in events if e["kind"] == "adopt"]


def test_slots_come_back_without_a_codec_run_and_with_an_event_each(tmp_path):
    world = World(tmp_path, slabs=True)
    make(world, 40)
    world.crash()
    assert world.summary["adopted"] == 41 and world.summary["parity_rebuilt_blocks"] == 0
    kinds = collections.Counter(e["node"] is not None for e in adopt_events(world.m))
    assert kinds == {True: 41}                     # one per allocation, as before slabs
    report = run_sync(world.m.checks.verify(world.m.queries.lookup_allocation(
        "kv/00007", ROOT), repair=False))
    assert report["blocks"] == 1 and report["clean"] == 1
    clean(world.m)
    world.close()


def test_past_the_threshold_the_adopt_events_are_one_per_slab(tmp_path, monkeypatch):
    monkeypatch.setattr(adoption, "ADOPT_EVENTS_PER_OBJECT", 10)
    world = World(tmp_path, slabs=True)
    make(world, 300)                               # 300 x 64 KiB: three 8 MiB slabs
    slabs = len(world.m.backend.pool.slabs)
    world.crash()
    assert world.summary["adopted"] == 301
    events = adopt_events(world.m)
    per_slab = [e for e in events if e["node"] is None]
    assert len(per_slab) == slabs >= 2
    assert sum(e["detail"]["objects"] for e in per_slab) == 300
    assert {e["detail"]["slab"] for e in per_slab} == set(world.m.backend.pool.slabs)
    assert [e["path"] for e in events if e["node"] is not None] == ["own"]
    assert [e["path"] for e in world.m.queries.listdir("kv", ROOT)][:2] == \
        ["kv/00000", "kv/00001"]
    clean(world.m)
    world.close()
