"""The daemon's verbs called directly (tier a): a real registry, the host backend and the
in-process keeper (the `world` fixture, tests/unit/world.py); `check` runs after each
scenario."""
from __future__ import annotations

import mmap
import os

import pytest

from daemon.verbs.plan import run_sync
from gpumemctl.protocol import Busy, Exists, InvalidState, NoMemory, NotFound, UsageError
from tests.sizes import MiB, with_parity

from .world import ROOT, clean


def write(m, path, data, offset=0):
    m.backend.write(m.queries.lookup(path, ROOT).buffer, offset, data)


def read(m, path, n, offset=0):
    return m.backend.read(m.queries.lookup(path, ROOT).buffer, offset, n)


def test_create_lists_and_rounds_capacity(world):
    m = world.m
    info = run_sync(m.names.create("models/llama", ROOT, size=3 * MiB + 1, durable=True))
    assert (info["size"], info["capacity"], info["state"]) == (3 * MiB + 1, 4 * MiB, "ready")
    assert [e["path"] for e in m.queries.listdir("", ROOT, recursive=True)] == \
        ["models", "models/llama"]
    assert m.keeper.keys() == [info["id"]]
    clean(m)


def test_create_existing_and_exist_ok(world):
    m = world.m
    run_sync(m.names.create("a", ROOT, size=MiB))
    with pytest.raises(Exists):
        run_sync(m.names.create("a", ROOT, size=MiB))
    assert run_sync(m.names.create("a", ROOT, size=MiB, exist_ok=True))["size"] == MiB
    with pytest.raises(Exists, match="size"):
        run_sync(m.names.create("a", ROOT, size=2 * MiB, exist_ok=True))
    # exist_ok with --durable never leaves it transient
    assert run_sync(m.names.create("a", ROOT, size=MiB, exist_ok=True,
                                   durable=True))["durable"] is True
    clean(m)


def test_out_of_memory_names_device_free_and_request(world):
    m = world.m
    run_sync(m.names.create("big", ROOT, size=200 * MiB))
    with pytest.raises(NoMemory) as exc:
        run_sync(m.names.create("more", ROOT, size=100 * MiB))
    text = str(exc.value)
    free = 256 * MiB - with_parity(200 * MiB)
    assert "device 0" in text and str(free) in text and str(100 * MiB) in text
    with pytest.raises(NotFound):
        m.queries.lookup("more", ROOT)
    clean(m)


def test_durable_survives_crash_transient_does_not(world):
    m = world.m
    run_sync(m.names.create("keep", ROOT, size=MiB, durable=True))
    run_sync(m.names.create("tmp", ROOT, size=MiB))
    write(m, "keep", b"precious")
    m = world.crash()
    assert world.summary["adopted"] == 1 and world.summary["transients_dropped"] == 1
    assert read(m, "keep", 8) == b"precious"
    with pytest.raises(NotFound):
        m.queries.lookup("tmp", ROOT)
    clean(m)


def test_keeper_orphan_freed_and_missing_memory_is_lost(world):
    m = world.m
    run_sync(m.names.create("gone", ROOT, size=MiB, durable=True))
    gone_id = m.queries.lookup("gone", ROOT).id
    orphan = os.memfd_create("orphan")
    os.ftruncate(orphan, MiB)
    m.keeper.deposit(9999, [orphan], {})
    os.close(orphan)
    m.keeper.withdraw(gone_id)       # as if the keeper had lost it (e.g. a reboot)
    m = world.crash()
    assert world.summary["orphans_freed"] == 1 and world.summary["lost"] == 1
    assert m.keeper.keys() == []
    assert m.queries.info("gone", ROOT)["state"] == "lost"
    with pytest.raises(InvalidState, match="lost"):
        m.handles.open("gone", ROOT, m.handles.open_session(ROOT), "r")
    m.names.remove("gone", ROOT)           # a lost allocation can still be removed
    clean(m)


def test_busy_remove_and_force(world):
    m = world.m
    run_sync(m.names.create("x", ROOT, size=MiB, durable=True))
    session = m.handles.open_session(ROOT)
    holder, (fd,), _ = m.handles.open("x", ROOT, session, "rw")
    with pytest.raises(Busy, match="--force"):
        m.names.remove("x", ROOT)
    used_before = m.backend.used
    m.names.remove("x", ROOT, force=True)
    with pytest.raises(NotFound):
        m.queries.lookup("x", ROOT)
    # The holder still has the memory until it lets go.
    view = mmap.mmap(fd, MiB)
    view[:4] = b"live"
    view.close()
    os.close(fd)
    assert m.backend.used == used_before
    run_sync(m.handles.close(session, holder.id))
    assert m.backend.used == used_before - with_parity(2 * MiB)   # 2 MiB granularity
    assert m.keeper.keys() == []
    clean(m)


def test_one_writer_or_many_readers(world):
    m = world.m
    run_sync(m.names.create("x", ROOT, size=MiB))
    s1, s2 = m.handles.open_session(ROOT), m.handles.open_session(ROOT)
    _, (fd1,), _ = m.handles.open("x", ROOT, s1, "r")
    _, (fd2,), _ = m.handles.open("x", ROOT, s2, "r")
    with pytest.raises(Busy):
        m.handles.open("x", ROOT, s2, "rw")
    run_sync(m.handles.end_session(s1))
    run_sync(m.handles.end_session(s2))
    _, (fd3,), _ = m.handles.open("x", ROOT, s1, "rw")
    with pytest.raises(Busy):
        m.handles.open("x", ROOT, s2, "r")
    run_sync(m.handles.end_session(s1))           # a writer's crash releases its lock
    m.handles.open("x", ROOT, s2, "r")
    for fd in (fd1, fd2, fd3):
        os.close(fd)
    assert m.queries.info("x", ROOT)["refcount"] == 1
    clean(m)


def test_lease_freed_with_session_and_durable_drops_lease(world):
    m = world.m
    s = m.handles.open_session(ROOT)
    run_sync(m.names.create("leased", ROOT, size=MiB, session=s, lease=True))
    run_sync(m.names.create("pinned", ROOT, size=MiB, session=s, lease=True))
    run_sync(m.durability.set_durable("pinned", ROOT, True))
    assert m.queries.info("leased", ROOT)["refcount"] == 1
    run_sync(m.handles.end_session(s))
    with pytest.raises(NotFound):
        m.queries.lookup("leased", ROOT)
    assert m.queries.info("pinned", ROOT)["durable"] is True
    assert m.backend.used == with_parity(2 * MiB)   # pinned's 2 MiB capacity only
    clean(m)


def test_remove_directory_needs_recursive(world):
    m = world.m
    run_sync(m.names.create("d/e/f", ROOT, size=MiB, durable=True))
    with pytest.raises(UsageError, match="-r"):
        m.names.remove("d", ROOT)
    assert m.names.remove("d", ROOT, recursive=True) == ["d/e/f", "d/e", "d"]
    assert m.queries.listdir("", ROOT) == [] and m.keeper.keys() == []
    clean(m)


def test_check_finds_and_repairs_hand_made_damage(world):
    m = world.m
    run_sync(m.names.create("a", ROOT, size=MiB, durable=True))
    run_sync(m.names.create("b", ROOT, size=MiB))
    a_id, b_id = m.queries.lookup("a", ROOT).id, m.queries.lookup("b", ROOT).id
    db = m.registry.db
    db.execute("UPDATE nodes SET size = 5 WHERE id = ?", (a_id,))
    db.execute("DELETE FROM nodes WHERE id = ?", (b_id,))
    db.execute("INSERT INTO nodes (parent, name, kind, uid, gid, mode, created_ns, modified_ns,"
               " changed_ns) VALUES (1, 'ghost', 'dir', 0, 0, 493, 0, 0, 0)")
    m.keeper.withdraw(a_id)
    report = m.checks.check()
    found = sorted(p["check"] for p in report["problems"])
    assert found == ["keeper", "registry_rows", "registry_rows", "registry_rows"], report
    assert all(not p["repaired"] for p in report["problems"])
    report = m.checks.check(repair=True)
    assert all(p["repaired"] for p in report["problems"])
    clean(m)
    # The repair was real: the durable allocation survives a crash again.
    write(m, "a", b"AAAA")
    m = world.crash()
    assert read(m, "a", 4) == b"AAAA"
    assert [e["path"] for e in m.queries.listdir("", ROOT)] == ["a"]


def test_bad_arguments(world):
    m = world.m
    for kwargs in ({"size": 0}, {"size": -5}, {"size": MiB, "mode": 0o17777},
                   {"size": MiB, "ecc": "crc"}):
        with pytest.raises(UsageError):
            run_sync(m.names.create("x", ROOT, **kwargs))
    with pytest.raises(NotFound, match="device"):
        run_sync(m.names.create("x", ROOT, size=MiB, device="7"))
    assert m.queries.listdir("", ROOT) == []
    clean(m)
