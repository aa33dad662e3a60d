"""Parity arenas (issue 26): the parity of allocations and slabs is a span of a few shared
arenas per device, not a granule each. What a user observes: the memory an ECC allocation
takes, the parity surviving a kill -9 (damage made before the crash is still found after
it, which a parity rebuilt from the data would have hidden), growth, removal giving the
memory back, `check`, and registries of the layout before (parity of its own) working on.
"""
from __future__ import annotations

import sqlite3

from daemon.backends.arenas import ParitySpan, span_bytes
from daemon.ecc.layout import parity_bytes
from daemon.verbs.plan import run_sync

from .world import ROOT, World, clean

MiB = 1 << 20
KiB = 1 << 10


def create(m, path: str, size: int, durable: bool = True, fill: bytes | None = None):
    run_sync(m.names.create(path, ROOT, size=size, durable=durable))
    alloc = m.queries.lookup_allocation(path, ROOT)
    if fill is not None:
        m.data.write_at(alloc, 0, fill * (size // len(fill)), ROOT)
        run_sync(m.data.sync(alloc))
    return alloc


def verify(m, path: str, repair: bool = False) -> dict:
    return run_sync(m.checks.verify(m.queries.lookup_allocation(path, ROOT), repair=repair))


def free_bytes(m) -> int:
    return m.backend.devices()[0].free


def damage(m, path: str) -> None:
    """Bytes changed under the parity: what a bit flip in device memory does."""
    alloc = m.queries.lookup_allocation(path, ROOT)
    m.backend.write(alloc.buffer, 5000, b"\xff" * 3)


def test_a_2_mib_allocation_takes_its_parity_not_a_granule_of_it(tmp_path):
    world = World(tmp_path, slabs=True)
    m = world.m
    before = free_bytes(m)
    allocs = [create(m, f"kv/{i}", 2 * MiB, fill=bytes([i + 1])) for i in range(8)]
    assert all(isinstance(a.parity, ParitySpan) for a in allocs)
    span = span_bytes(parity_bytes(2 * MiB))             # 132 KiB
    assert span == 132 * KiB
    arenas = m.backend.arenas.arenas
    used = before - free_bytes(m)
    assert used == 8 * 2 * MiB + sum(a.capacity for a in arenas.values())
    assert sum(a.used_bytes for a in arenas.values()) == 8 * span
    assert used <= 8 * 2 * MiB * 1.07 + 2 * MiB           # before: 2x (a granule of parity)
    assert all(verify(m, f"kv/{i}")["clean"] == 16 for i in range(8))
    clean(m)
    world.close()


def test_the_same_without_arenas_takes_a_granule_of_parity(tmp_path):
    world = World(tmp_path, slabs=True, arenas=False)
    m = world.m
    before = free_bytes(m)
    create(m, "kv/0", 2 * MiB, fill=b"a")
    assert before - free_bytes(m) == 4 * MiB and not isinstance(
        m.queries.lookup_allocation("kv/0", ROOT).parity, ParitySpan)
    world.close()


def test_the_parity_survives_a_kill_and_still_finds_damage_made_before_it(tmp_path):
    world = World(tmp_path, slabs=True)
    m = world.m
    create(m, "big", 4 * MiB, fill=b"B")
    create(m, "small", 64 * KiB, fill=b"s")                 # a slot: its slab's span
    damage(m, "big")
    damage(m, "small")
    m = world.crash()
    assert world.summary["parity_rebuilt_blocks"] == 0      # claimed, not rebuilt
    assert isinstance(m.queries.lookup_allocation("big", ROOT).parity, ParitySpan)
    for path in ("big", "small"):
        found = verify(m, path)
        assert found["damaged"] == [0], (path, found)
        fixed = verify(m, path, repair=True)
        assert fixed["corrected"] == 1
        assert verify(m, path)["clean"] == found["blocks"]
    alloc = m.queries.lookup_allocation("big", ROOT)
    assert m.data.read_at(alloc, 0, 4 * MiB) == b"B" * (4 * MiB)
    clean(m)
    world.close()


def test_a_grown_allocation_gets_a_new_span_and_keeps_it_across_a_kill(tmp_path):
    world = World(tmp_path, slabs=True)
    m = world.m
    alloc = create(m, "g", 2 * MiB, fill=b"g")
    first = alloc.parity.where
    m.data.resize(alloc, ROOT, 6 * MiB)
    assert alloc.parity.where != first and alloc.parity.capacity == \
        span_bytes(parity_bytes(6 * MiB))
    m.data.write_at(alloc, 5 * MiB, b"h" * MiB, ROOT)
    run_sync(m.data.sync(alloc))
    m.service.sweep_slabs()                  # a row owed by the resize is written by now
    clean(m)
    m = world.crash()
    assert world.summary["parity_rebuilt_blocks"] == 0
    assert verify(m, "g")["clean"] == 48
    alloc = m.queries.lookup_allocation("g", ROOT)
    assert m.data.read_at(alloc, 0, 2 * MiB) == b"g" * (2 * MiB)
    assert m.data.read_at(alloc, 5 * MiB, MiB) == b"h" * MiB
    clean(m)
    world.close()


def test_a_span_row_that_does_not_fit_is_rebuilt_from_the_data(tmp_path):
    """A row whose bytes are not what the capacity needs (a crash between a resize and the
    row of its new parity) is never trusted: that parity is rebuilt, and says so."""
    world = World(tmp_path, slabs=True)
    m = world.m
    create(m, "r", 2 * MiB, fill=b"r")
    alloc_id = m.queries.lookup_allocation("r", ROOT).id
    path = m.registry.path
    m = world.crash()
    m.registry.close()
    db = sqlite3.connect(path)
    db.execute("UPDATE parity_spans SET bytes = 4096 WHERE node = ?", (alloc_id,))
    db.commit()
    db.close()
    world.m = m
    m = world.crash()
    assert world.summary["parity_rebuilt_blocks"] == 16
    assert verify(m, "r")["clean"] == 16
    clean(m)
    world.close()


def test_removing_everything_gives_the_arenas_back(tmp_path):
    world = World(tmp_path, slabs=True)
    m = world.m
    before = free_bytes(m)
    for i in range(6):
        create(m, f"x/{i}", 2 * MiB, fill=b"x")
    create(m, "x/small", 8 * KiB, fill=b"s")
    assert m.backend.arenas.arenas
    m.names.remove("x", ROOT, recursive=True)
    m.custody.slabs.sweep()
    m.custody.arenas.sweep()
    assert not m.backend.arenas.arenas and free_bytes(m) == before
    assert m.registry.arenas.load() == [] and m.registry.arenas.spans() == {}
    assert not {k for k in m.keeper.keys() if k >= 1 << 50}
    clean(m)
    world.close()


def test_check_finds_a_span_row_that_names_other_bytes_and_repairs_it(tmp_path):
    world = World(tmp_path, slabs=True)
    m = world.m
    alloc = create(m, "c", 2 * MiB, fill=b"c")
    with m.registry.transaction(durable=True):
        m.registry.arenas.put_span(alloc.id, (alloc.parity.arena.id, 0, 4096))
    report = m.checks.check()
    assert [p["check"] for p in report["problems"]] == ["parity_arenas"]
    assert m.checks.check(repair=True)["problems"][0]["repaired"]
    assert m.registry.arenas.spans()[alloc.id] == alloc.parity.where
    clean(m)
    world.close()


def test_allocations_of_the_layout_before_keep_their_parity_and_new_ones_use_spans(tmp_path):
    """A registry and keeper of parity of its own per allocation (before schema 13, or
    parity_arenas = false), started with arenas on: its allocations keep their parity
    buffers, still find damage made before the restart, and new allocations get spans."""
    world = World(tmp_path, slabs=True, arenas=False)
    m = world.m
    create(m, "old", 4 * MiB, fill=b"o")
    damage(m, "old")
    world.arenas = True
    m = world.crash()
    assert world.summary["parity_rebuilt_blocks"] == 0
    old = m.queries.lookup_allocation("old", ROOT)
    assert not isinstance(old.parity, ParitySpan)
    assert verify(m, "old")["damaged"] == [0]
    assert verify(m, "old", repair=True)["corrected"] == 1
    new = create(m, "new", 2 * MiB, fill=b"n")
    assert isinstance(new.parity, ParitySpan)
    m = world.crash()
    assert world.summary["parity_rebuilt_blocks"] == 0
    assert verify(m, "old")["clean"] == 32 and verify(m, "new")["clean"] == 16
    clean(m)
    world.close()


def test_a_compaction_gives_the_freed_slabs_spans_back_to_their_arena(tmp_path):
    world = World(tmp_path, slabs=True)
    m = world.m
    per_slab = (8 * MiB) // (64 * KiB)
    for i in range(3 * per_slab):
        create(m, f"k/{i:04d}", 64 * KiB, durable=False)
    for i in range(3 * per_slab):
        if i % 4:
            m.names.remove(f"k/{i:04d}", ROOT)
    spans_before = sum(len(a.used) for a in m.backend.arenas.arenas.values())
    done = run_sync(m.verbs.compaction.compact(ROOT))
    freed = done["slabs_freed"]
    assert freed and all(f["parity_bytes"] == 0 for f in freed)       # spans, not buffers
    assert done["freed_bytes"] == sum(f["bytes"] for f in freed)
    assert sum(len(a.used) for a in m.backend.arenas.arenas.values()) == \
        spans_before - len(freed)
    clean(m)
    world.close()


def test_a_transient_neighbour_written_at_a_crash_leaves_a_durable_object_verifiable(tmp_path):
    """A transient object and a durable one of the same owner share a slab block (its
    parity). The transient one is written through its descriptor (parity stale by design,
    as a socket writer leaves it until its close) and the daemon is killed: the transient
    one is dropped at the start, and its block's parity must not make the durable one's
    verify find damage (8 changed rows a codeword: beyond repair, it would read as EIO)."""
    world = World(tmp_path, slabs=True)
    m = world.m
    durable = create(m, "d", 8 * KiB, fill=b"D")
    transient = create(m, "t", 8 * KiB, durable=False)
    assert transient.buffer.slab is durable.buffer.slab
    assert transient.buffer.offset // (128 * KiB) == durable.buffer.offset // (128 * KiB)
    m.backend.write(transient.buffer, 0, b"T" * (8 * KiB))    # as through its fd
    m = world.crash()
    assert world.summary["transients_dropped"] == 1
    assert world.summary["shared_blocks_encoded"] == 1
    found = verify(m, "d")
    assert found["damaged"] == [] and found["clean"] == 1, found
    alloc = m.queries.lookup_allocation("d", ROOT)
    assert m.data.read_at(alloc, 0, 8 * KiB) == b"D" * (8 * KiB)
    clean(m)
    world.close()


def test_a_compaction_pass_that_moved_something_is_an_event_and_a_futile_one_is_not(tmp_path):
    world = World(tmp_path, slabs=True)
    m = world.m
    per_slab = (8 * MiB) // (64 * KiB)
    for i in range(2 * per_slab):
        create(m, f"e/{i:04d}", 64 * KiB, durable=False)
    for i in range(2 * per_slab):
        if i % 4:
            m.names.remove(f"e/{i:04d}", ROOT)
    done = run_sync(m.verbs.compaction.compact(ROOT))
    run_sync(m.verbs.compaction.compact(ROOT))             # nothing left to move
    events, _ = m.reports.events(since=0, limit=1000, administrator=True)
    [event] = [e for e in events if e["kind"] == "compact"]
    assert event["node"] is None and event["detail"] == {
        "asked": True, "moved": done["moved_count"], "moved_bytes": done["moved_bytes"],
        "slabs_freed": len(done["slabs_freed"]), "freed_bytes": done["freed_bytes"]}
    assert done["moved_count"] > 0
    world.close()
