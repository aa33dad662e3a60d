"""A restart of many objects packed in slabs (issue 26: a million of them within 10 s): the
start builds nodes straight from the registry's rows and takes slots back without a statement
or an event each. What a user sees must not change: every object comes back with its state,
size, owner, times and bytes; one written when the daemon died gets its parity rebuilt; a
transient one is dropped; `check` finds nothing wrong."""
from __future__ import annotations

import dataclasses

from daemon.core import adoption
from daemon.core.namespace.rows import COLUMNS, nodes_from_rows
from daemon.core.nodes import Allocation
from daemon.verbs.plan import run_sync

from .world import ROOT, World, clean

KiB = 1 << 10
N = 600


def seen(m, path: str) -> dict:
    """What a user sees of an allocation: its attributes, and the bytes it holds."""
    a = m.queries.lookup_allocation(path, ROOT)
    return {"state": a.state, "size": a.size, "capacity": a.capacity, "uid": a.uid,
            "mode": a.mode, "durable": a.durable, "ecc": a.ecc, "times":
            (a.created_ns, a.modified_ns, a.changed_ns, a.accessed_ns),
            "bytes": m.data.read_at(a, 0, a.size)}


def make(world: World) -> list[str]:
    m = world.m
    paths = [f"kv/{i:04d}" for i in range(N)]
    with m.verbs.many.group():
        for i, path in enumerate(paths):
            assert m.verbs.many.create(path, ROOT, size=(4 + i % 3 * 8) * KiB, durable=True)
    for i in range(0, N, 7):       # bytes in some of them, synced
        alloc = m.queries.lookup_allocation(paths[i], ROOT)
        m.data.write_at(alloc, 0, bytes([i % 251 + 1]) * alloc.size)
        run_sync(m.data.sync(alloc))
    return paths


def test_a_restart_of_many_slots_keeps_what_each_object_shows(tmp_path, monkeypatch):
    monkeypatch.setattr(adoption, "ADOPT_EVENTS_PER_OBJECT", 100)
    world = World(tmp_path, slabs=True)
    paths = make(world)
    m = world.m
    run_sync(m.names.create("gone", ROOT, size=4 * KiB, durable=False))    # transient
    before = {p: seen(m, p) for p in paths}
    world.crash()
    m = world.m
    assert world.summary["adopted"] == N and world.summary["lost"] == 0
    assert world.summary["transients_dropped"] == 1
    assert world.summary["parity_rebuilt_blocks"] == 0
    assert {p: seen(m, p) for p in paths} == before
    assert [e["path"] for e in m.queries.listdir("kv", ROOT)] == paths
    clean(m)
    world.close()


def test_an_object_written_at_the_crash_gets_its_parity_rebuilt(tmp_path):
    world = World(tmp_path, slabs=True)
    paths = make(world)
    m = world.m
    alloc = m.queries.lookup_allocation(paths[3], ROOT)
    m.data.write_at(alloc, 0, b"w" * 1000)          # the WRITING mark; no sync before the crash
    world.crash()
    m = world.m
    assert world.summary["parity_rebuilt_blocks"] >= 1
    alloc = m.queries.lookup_allocation(paths[3], ROOT)
    assert not alloc.writing and m.data.read_at(alloc, 0, 1000) == b"w" * 1000
    report = run_sync(m.checks.verify(alloc, repair=False))
    assert report["clean"] == report["blocks"] >= 1
    clean(m)
    world.close()


def test_a_loaded_allocation_is_what_its_constructor_makes(tmp_path):
    """Load makes allocations without their generated __init__ (for speed): every field
    must be what Allocation(...) gives, defaults and per-node containers included."""
    world = World(tmp_path, slabs=True)
    run_sync(world.m.names.create("a", ROOT, size=4 * KiB, durable=True))
    rows = world.m.registry.nodes.load(COLUMNS)
    [(loaded, parent)] = [(n, p) for n, p in nodes_from_rows(rows) if n.name == "a"]
    made = Allocation(**{f.name: getattr(loaded, f.name) for f in dataclasses.fields(Allocation)
                         if f.default_factory is dataclasses.MISSING})
    assert parent == world.m.ns.root.id
    assert list(vars(loaded)) == list(vars(made))
    for field in dataclasses.fields(Allocation):
        value, expected = getattr(loaded, field.name), getattr(made, field.name)
        if field.default_factory is dataclasses.MISSING:
            assert value == expected, field.name
        else:                       # a container of its own, as the constructor makes
            assert type(value) is type(expected), field.name
    other = next(n for n, _ in nodes_from_rows(rows) if n.name == "a")
    assert other.holders is not loaded.holders and other.damaged is not loaded.damaged
    assert other.parity_lock is not loaded.parity_lock and other.aliases is not loaded.aliases
    world.close()
