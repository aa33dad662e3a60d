"""Compaction of slabs (issue 26, docs/storage.md): objects of sparse slabs moved into fuller
ones of the same kind, the emptied slabs freed; what never moves (held, being written); and
crash safety by the order of the steps: a daemon killed between any two of them (stage,
commit, give back, free) restarts with every object readable, its parity right, `check`
clean; and every registry statement of a pass failing in turn leaves the same."""
from __future__ import annotations

import os
import sqlite3

import pytest

from daemon.core.compaction import Compaction
from daemon.verbs.plan import run_sync
from gpumemctl.protocol import GpumemError
from tests.registryfaults import FailingConnection

from .world import ROOT, World, clean

KiB = 1 << 10
SIZE = 16 * KiB
PER_SLAB = (8 << 20) // SIZE        # host slabs are 8 MiB


def fragment(world: World, slabs: int = 3, keep_every: int = 4, durable: bool = True,
             uid_cred=ROOT) -> dict[str, bytes]:
    """`slabs` full slabs of 16 KiB objects, then all but every `keep_every`-th removed:
    every slab partly used. Returns the names left and their bytes."""
    m = world.m
    names = [f"o{i:05d}" for i in range(slabs * PER_SLAB)]
    with m.verbs.many.group():
        for name in names:
            assert m.verbs.many.create(name, uid_cred, size=SIZE, durable=durable)
    kept = {}
    for i, name in enumerate(names):
        if i % keep_every:
            m.names.remove(name, uid_cred)
            continue
        data = os.urandom(SIZE)
        alloc = m.queries.lookup_allocation(name, uid_cred)
        m.backend.write(alloc.buffer, 0, data)
        m.integrity.parity.encode_slot(alloc.buffer)
        kept[name] = data
    m.custody.slabs.sweep()
    assert len(m.backend.pool.slabs) == slabs
    return kept


def intact(m, kept: dict[str, bytes]) -> None:
    """Every object reads its bytes, its blocks verify clean, and `check` is clean."""
    clean(m)
    for name, data in kept.items():
        alloc = m.queries.lookup_allocation(name, ROOT)
        assert m.backend.read(alloc.buffer, 0, SIZE) == data, name
        report = run_sync(m.checks.verify(alloc, repair=False))
        assert report["clean"] == report["blocks"] >= 1, (name, report)


def compactor(m) -> Compaction:
    return m.core.compactor


def test_a_pass_empties_the_sparse_slabs_and_every_byte_stays(tmp_path):
    # Parity of its own per slab (given back with it); with parity arenas the freed
    # slabs' spans go back to their arena: tests/unit/test_parity_arenas.py.
    world = World(tmp_path, slabs=True, arenas=False)
    kept = fragment(world)
    m = world.m
    before = m.backend.devices()[0].free
    use = m.backend.pool.use_per_device()
    [dev] = use.values()
    assert dev["fragmentation"] == 0.75 and dev["slack_bytes"] == 3 * (6 << 20)
    dry = run_sync(m.verbs.compaction.compact(ROOT, dry_run=True))
    assert dry["moved_count"] == 2 * PER_SLAB // 4 and len(dry["slabs_freed"]) == 2
    assert len(m.backend.pool.slabs) == 3 and m.backend.devices()[0].free == before
    done = run_sync(m.verbs.compaction.compact(ROOT))
    assert done["moved_count"] == dry["moved_count"]
    assert [f["slab"] for f in done["slabs_freed"]] == [f["slab"] for f in dry["slabs_freed"]]
    assert len(m.backend.pool.slabs) == 1
    assert m.backend.devices()[0].free - before == done["freed_bytes"] > 16 << 20
    [dev] = m.backend.pool.use_per_device().values()
    assert dev["objects"] == len(kept) and dev["fragmentation"] == 0.25
    intact(m, kept)
    world.crash()
    intact(world.m, kept)
    world.close()


def test_held_and_written_objects_stay_and_keep_their_slabs(tmp_path):
    """An object open for reading keeps its slot (its slab is not emptied); one being
    written (its parity unsettled) likewise; the others' slabs are emptied."""
    world = World(tmp_path, slabs=True)
    kept = fragment(world, slabs=4)
    m = world.m
    by_slab: dict[int, list[str]] = {}
    for name in kept:
        slot = m.queries.lookup_allocation(name, ROOT).buffer
        by_slab.setdefault(slot.slab.id, []).append(name)
    first, second = sorted(by_slab)[:2]
    held = by_slab[first][0]
    session = m.handles.open_session(ROOT)
    holder, (fd,), _ = m.handles.open(held, ROOT, session, "r", regions=True)
    os.close(fd)
    written = m.queries.lookup_allocation(by_slab[second][0], ROOT)
    written.dirty_from, written.dirty_to = 0, 4096       # written since its last sync
    where = {n: m.queries.lookup_allocation(n, ROOT).buffer for n in (held, written.path)}
    done = run_sync(m.verbs.compaction.compact(ROOT))
    assert done["moved_count"] > 0
    assert {f["slab"] for f in done["slabs_freed"]}.isdisjoint({first, second})
    for name, slot in where.items():
        assert m.queries.lookup_allocation(name, ROOT).buffer is slot
    moved = {e["path"] for e in done["moved"]}
    assert held not in moved and written.path not in moved
    written.dirty_from, written.dirty_to = 1 << 63, 0
    run_sync(m.handles.close(session, holder.id))
    intact(m, kept)
    world.close()


@pytest.mark.parametrize("crash_after", ["stage", "commit", "finish"])
def test_a_kill_between_the_steps_leaves_the_old_or_the_new_placement(tmp_path, crash_after):
    """The steps of a move by hand, the daemon killed after `crash_after`: after the
    restart each object is in the slot the registry names (the old before the commit, the
    new after it), with its bytes and parity; and a pass then completes the work."""
    world = World(tmp_path, slabs=True)
    kept = fragment(world, slabs=2)
    m = world.m
    core = compactor(m)
    [(source, targets)] = core.plan()
    moves = []
    for slot in list(source.used.values())[:20]:
        move = core.stage(slot.tenant, targets)
        assert move is not None
        moves.append(move)
    old = {mv.alloc.path: (mv.old.slab.id, mv.old.offset) for mv in moves}
    new = {mv.alloc.path: (mv.new.slab.id, mv.new.offset) for mv in moves}
    if crash_after in ("commit", "finish"):
        core.commit(moves)
    if crash_after == "finish":
        core.finish(moves)
    world.crash()
    m = world.m
    intact(m, kept)
    want = old if crash_after == "stage" else new
    for name, (slab, offset) in want.items():
        slot = m.queries.lookup_allocation(name, ROOT).buffer
        assert (slot.slab.id, slot.offset) == (slab, offset)
    run_sync(m.verbs.compaction.compact(ROOT))
    assert len(m.backend.pool.slabs) == 1
    intact(m, kept)
    world.crash()
    intact(world.m, kept)
    world.close()


def test_transient_objects_move_too(tmp_path):
    world = World(tmp_path, slabs=True)
    kept = fragment(world, slabs=2, durable=False)
    done = run_sync(world.m.verbs.compaction.compact(ROOT))
    assert done["moved_count"] == PER_SLAB // 4 and len(world.m.backend.pool.slabs) == 1
    intact(world.m, kept)
    world.close()


def test_kinds_never_mix(tmp_path):
    """Two owners' sparse slabs: each owner's objects stay in that owner's slabs."""
    from daemon.core.permissions import Credentials
    world = World(tmp_path, slabs=True)
    m = world.m
    m.names.mkdir("u", ROOT, mode=0o1777)
    alice = Credentials(pid=1, uid=1000, gid=1000)
    for cred in (ROOT, alice):
        with m.verbs.many.group():
            for i in range(PER_SLAB + 8):
                assert m.verbs.many.create(f"u/{cred.uid}-{i:04d}", cred, size=SIZE)
        for i in range(8, PER_SLAB):
            m.names.remove(f"u/{cred.uid}-{i:04d}", cred)
    m.custody.slabs.sweep()
    assert len(m.backend.pool.slabs) == 4
    done = run_sync(m.verbs.compaction.compact(ROOT))
    assert done["moved_count"] == 16 and len(m.backend.pool.slabs) == 2
    for alloc in m.queries.allocations():
        assert alloc.buffer.slab.uid == alloc.uid
    clean(m)
    world.close()


def _pass_statements(tmp_path) -> int:
    world = World(tmp_path / "dry", slabs=True)
    fragment(world, slabs=2, keep_every=16)
    m = world.m
    probe = FailingConnection(m.registry.db, None)
    m.registry.db = probe
    try:
        run_sync(m.verbs.compaction.compact(ROOT))
    finally:
        m.registry.db = probe._db
    world.close()
    return probe.count


def test_every_statement_of_a_pass_failing_in_turn_leaves_everything_readable(tmp_path):
    """A full state disk at each registry statement of a pass (the slice's commit of the
    new placements, the freeing of the emptied slab): the objects are where the registry
    says, with their bytes and parity, `check` is clean, after a restart too, and the next
    pass finishes the work."""
    (tmp_path / "dry").mkdir()
    total = _pass_statements(tmp_path)
    assert total >= 3
    for fail_at in range(1, total + 1):
        where = tmp_path / f"fail{fail_at}"
        where.mkdir()
        world = World(where, slabs=True)
        kept = fragment(world, slabs=2, keep_every=16)
        m = world.m
        m.registry.db = FailingConnection(m.registry.db, fail_at)
        try:
            run_sync(m.verbs.compaction.compact(ROOT))
        except (GpumemError, sqlite3.Error):
            pass           # a slice's commit failed (the slab's freeing only logs)
        finally:
            m.registry.db = m.registry.db._db
        intact(m, kept)
        run_sync(m.verbs.compaction.compact(ROOT))
        m.custody.slabs.sweep()
        assert len(m.backend.pool.slabs) == 1, fail_at
        intact(m, kept)
        world.crash()
        intact(world.m, kept)
        world.close()


def test_housekeeping_asks_again_only_when_something_changed(tmp_path):
    """`due`: past the slack thresholds; after a pass that freed nothing (every slab holds
    an object held open), not again until the slabs' use changes."""
    world = World(tmp_path, slabs=True)
    kept = fragment(world, slabs=2)
    m = world.m
    verbs = m.verbs.compaction
    verbs.min_slack = 1 << 20
    assert verbs.due()
    session = m.handles.open_session(ROOT)
    held = {}
    for name in kept:
        slab = m.queries.lookup_allocation(name, ROOT).buffer.slab.id
        if slab not in held:
            held[slab], (fd,), _ = m.handles.open(name, ROOT, session, "r", regions=True)
            os.close(fd)
    assert len(held) == 2
    done = run_sync(verbs.auto())
    assert done == {"moved": 0, "slabs_freed": 0, "freed_bytes": 0}
    assert not verbs.due()                         # futile, and nothing changed since
    for holder in held.values():
        run_sync(m.handles.close(session, holder.id))
    m.names.remove(next(iter(kept)), ROOT)        # the slabs' use changes
    assert verbs.due()
    done = run_sync(verbs.auto())
    assert done["moved"] > 0 and done["slabs_freed"] == 1
    assert not verbs.due()         # one slab half used: nothing to empty it into
    verbs.min_slack = 0
    assert not verbs.due()
    world.close()
