"""Creates of a batch sharing one registry commit (daemon/verbs/many.py), with each of the
group's registry statements failing in turn as a full disk makes them fail: an item whose
own statement fails is undone alone and the others stand; a failing commit undoes every
item of the group. Either way `check` is clean, and what the group did not keep is not in
memory, the tree, the registry or the slabs."""
from __future__ import annotations

from daemon.verbs.plan import run_sync
from gpumemctl.protocol import GpumemError
from tests.registryfaults import FailingConnection
from tests.sizes import MiB

from .test_journal_faults import seen
from .world import ROOT, World, clean

KiB = 1 << 10

ITEMS = (("g/packed-durable", 16 * KiB, True), ("g/packed", 8 * KiB, False),
         ("g/own", 4 * MiB, False))


def group(m) -> dict[str, str]:
    """The three creates as one group: each item's outcome ('ok' or the error's name)."""
    outcome = {}
    with m.verbs.many.group():
        for path, size, durable in ITEMS:
            try:
                assert m.verbs.many.create(path, ROOT, size=size, durable=durable) is not None
                outcome[path] = "ok"
            except (GpumemError, Exception) as exc:  # noqa: BLE001 - the item's outcome
                outcome[path] = type(exc).__name__
    return outcome


def fresh(path):
    path.mkdir()
    return path


def statements(tmp_path) -> int:
    world = World(fresh(tmp_path / "dry"), slabs=True)
    world.m.names.mkdir("g", ROOT)
    probe = FailingConnection(world.m.registry.db, None)
    world.m.registry.db = probe
    try:
        assert set(group(world.m).values()) == {"ok"}
    finally:
        world.m.registry.db = probe._db
    clean(world.m)
    world.close()
    return probe.count


def test_a_group_without_failures_commits_once(tmp_path):
    world = World(tmp_path, slabs=True)
    world.m.names.mkdir("g", ROOT)
    probe = FailingConnection(world.m.registry.db, None)
    world.m.registry.db = probe
    try:
        group(world.m)
    finally:
        world.m.registry.db = probe._db
    assert [s for s in probe.statements if s.startswith("COMMIT")] == ["COMMIT"]
    world.close()


def test_each_statement_of_a_group_failing_in_turn(tmp_path):
    total = statements(tmp_path)
    assert total > 3
    for fail_at in range(1, total + 1):         # one fresh world per injected failure
        one_failure(tmp_path / f"fail{fail_at}", fail_at)


def one_failure(path, fail_at: int) -> None:
    world = World(fresh(path), slabs=True)
    m = world.m
    m.names.mkdir("g", ROOT)
    before = seen(m)
    m.registry.db = FailingConnection(m.registry.db, fail_at)
    try:
        try:
            outcome = group(m)
        except GpumemError:            # the commit failed: the whole group is undone
            outcome = {path: "undone" for path, _, _ in ITEMS}
        failed = m.registry.db.failed
    finally:
        m.registry.db = m.registry.db._db
    m.custody.slabs.sweep()
    assert failed is not None
    listed = {e["path"] for e in m.queries.listdir("g", ROOT)}
    kept = {path for path, result in outcome.items() if result == "ok"}
    assert listed == kept, (failed, outcome)
    if not kept:                     # nothing stands: everything is as before
        after = seen(m)
        assert {k: after[k] for k in ("entries", "free", "kept")} == \
            {k: before[k] for k in ("entries", "free", "kept")}, failed
    else:                            # one item failed alone
        assert sum(r != "ok" for r in outcome.values()) == 1, (failed, outcome)
    clean(m)
    run_sync(m.names.create("after", ROOT, size=MiB, durable=True))     # service goes on
    clean(m)
    world.close()
