"""A directory's durable default (issue 27): set by the `durable` verb on a directory (the
socket's op, the mount's user.gpu.durable), kept in the registry, and inherited by what is
made in it: every way a file is created (create, create_many, a refill of a missing name, the
mount's create) and every way a directory is (mkdir, a create's missing parents, the mount's
mkdir). Unit tier: the verbs over a real registry, the host backend and the keeper double
(tests/unit/world.py); the kill -9 of a real daemon is tests/integration/test_durable_dirs.py
and tests/mount/test_durable_dirs.py."""
from __future__ import annotations

import os
import sqlite3

import pytest

from daemon.core.permissions import Credentials
from daemon.verbs.plan import run_sync
from gpumemctl.protocol import PermissionDenied
from tests.sizes import MiB

from .world import ROOT, World, clean, with_workers

KiB = 1 << 10
ALICE = Credentials(pid=os.getpid(), uid=1000, gid=1000)


@pytest.fixture
def packed(tmp_path):
    """Slabs on: small allocations are slots of a kept slab (no deposit of their own)."""
    w = World(tmp_path, slabs=True)
    yield w
    w.close()


def durable_dir(m, path: str = "d", cred: Credentials = ROOT, mode: int = 0o777) -> None:
    m.names.mkdir(path, cred, mode=mode, exist_ok=True)
    info = run_sync(m.durability.set_durable(path, cred, True))
    assert info["type"] == "directory" and info["durable"] is True


def node(m, path: str):
    return m.queries.lookup(path, ROOT)


def test_the_durable_op_on_a_directory_sets_and_clears_its_default(world):
    m = world.m
    m.names.mkdir("d", ROOT)
    assert m.queries.info("d", ROOT)["durable"] is False
    durable_dir(m)
    assert m.queries.info("d", ROOT)["durable"] is True
    assert [e["kind"] for e in m.reports.events(since=0, limit=100)[0]
            if e["path"] == "d"][-1:] == ["durable"]
    info = run_sync(m.durability.set_durable("d", ROOT, False))
    assert info["durable"] is False and node(m, "d").durable is False
    clean(m)


def test_existing_files_keep_their_durability_new_ones_inherit(world):
    m = world.m
    m.names.mkdir("d", ROOT, mode=0o777)
    with_workers(m.names.create("d/old", ROOT, size=4 * MiB))
    durable_dir(m)
    assert node(m, "d/old").durable is False                     # not changed
    info = with_workers(m.names.create("d/new", ROOT, size=4 * MiB))   # asked transient
    assert info["durable"] is True and node(m, "d/new").kept
    assert node(m, "d/new").id in world.kept.copies()               # the keeper holds it
    info = with_workers(m.names.create("d/a/b/deep", ROOT, size=4 * MiB))  # parents made
    assert info["durable"] is True
    assert node(m, "d/a").durable and node(m, "d/a/b").durable    # they inherit
    m.names.mkdir("d/sub", ROOT)
    assert node(m, "d/sub").durable is True
    info = with_workers(m.names.create("d/sub/f", ROOT, size=4 * MiB))
    assert info["durable"] is True
    clean(m)


def test_a_leased_create_stays_transient(world):
    m = world.m
    durable_dir(m)
    session = m.handles.open_session(ROOT)
    info = with_workers(m.names.create("d/scratch", ROOT, size=MiB, lease=True,
                                       session=session))
    assert info["durable"] is False and info["leased"] is True


def test_the_mount_creates_and_mkdirs_inherit(world):
    m = world.m
    durable_dir(m)
    d = node(m, "d")
    pending = m.names.create_pending(d.id, "touched", ROOT)
    assert pending.durable and pending.state == "pending"
    sub = m.names.mkdir_child(d.id, "sub", ROOT)
    assert sub.durable
    m.data.resize(pending, ROOT, 3 * MiB)          # its first memory: deposited
    assert pending.kept and pending.id in world.kept.copies()
    clean(m)


def test_create_many_inherits(packed):
    m = packed.m
    durable_dir(m)
    with m.verbs.many.group():
        small = m.verbs.many.create("d/small", ROOT, size=16 * KiB)
        # Memory of its own, durable by the directory: more than a part may do (a keeper
        # deposit of its own), so the group leaves it to the caller, as for one asked
        # durable (daemon/server/batch.py runs NameVerbs.create for it after the group).
        assert m.verbs.many.create("d/big", ROOT, size=4 * MiB) is None
    big = run_sync(m.names.create("d/big", ROOT, size=4 * MiB))
    assert small is not None and small["durable"] is True
    assert big is not None and big["durable"] is True
    assert node(m, "d/big").id in packed.kept.copies()
    clean(m)
    m = packed.crash()
    assert node(m, "d/small").state == node(m, "d/big").state == "ready"


def test_a_refill_of_a_missing_name_is_durable_and_kept_only_once_restored(world):
    m = world.m
    durable_dir(m)
    session = m.handles.open_session(ROOT)
    holder, (fd,), _ = m.refill.begin_refill(
        "d/restored", ROOT, session, size=2 * MiB, mode=0o644, ecc=None, durable=False,
        device=None, force=False, unsealed=False)
    os.write(fd, b"r" * 100)
    os.close(fd)
    alloc = node(m, "d/restored")
    assert alloc.durable and alloc.state == "restoring"
    assert alloc.id not in world.kept.copies()        # not adopted half filled after a crash
    with_workers(m.handles.close(session, holder.id, restored={"damaged": []}))
    assert alloc.state == "ready" and alloc.id in world.kept.copies()
    m = world.crash()
    assert node(m, "d/restored").state == "ready"


def test_the_default_and_its_files_survive_a_restart_unmarked_ones_do_not(world):
    m = world.m
    durable_dir(m)
    m.names.mkdir("plain", ROOT, mode=0o777)
    with_workers(m.names.create("d/x/f", ROOT, size=4 * MiB))
    with_workers(m.names.create("plain/f", ROOT, size=4 * MiB))
    m = world.crash()
    assert node(m, "d").durable and node(m, "d/x").durable
    assert node(m, "d/x/f").state == "ready"
    assert node(m, "plain").children == {}                   # dropped, as before
    clean(m)


def test_only_the_owner_or_root_sets_the_default(world):
    m = world.m
    m.names.mkdir("d", ROOT, mode=0o777)                     # Alice may write in it
    with pytest.raises(PermissionDenied) as refused:
        run_sync(m.durability.set_durable("d", ALICE, True))
    assert refused.value.details["errno"] == "EPERM"
    durable_dir(m)
    with pytest.raises(PermissionDenied):
        run_sync(m.durability.set_durable("d", ALICE, False))
    assert node(m, "d").durable
    m.names.mkdir("d/alice", ALICE)                          # hers: inherits, she may clear
    assert node(m, "d/alice").durable
    run_sync(m.durability.set_durable("d/alice", ALICE, False))
    info = with_workers(m.names.create("d/by-alice", ALICE, size=MiB))
    assert info["durable"] is True and info["uid"] == ALICE.uid     # charged to her
    clean(m)


def test_a_rename_or_hard_link_into_the_directory_changes_no_durability(world):
    m = world.m
    durable_dir(m)
    with_workers(m.names.create("t", ROOT, size=MiB))
    m.names.rename_path("t", "d/t", ROOT)
    assert node(m, "d/t").durable is False
    with_workers(m.names.create("u", ROOT, size=MiB))
    m.names.link("u", "d/u", ROOT)
    assert node(m, "d/u").durable is False


def test_the_registry_keeps_the_default_in_the_durable_column(world):
    m = world.m
    durable_dir(m)
    m.names.mkdir("plain", ROOT)
    path = os.path.join(world.dir, "registry.sqlite")
    db = sqlite3.connect(path)
    try:
        rows = dict(db.execute("SELECT name, durable FROM nodes WHERE kind = 'dir'"))
    finally:
        db.close()
    assert rows == {"": 0, "d": 1, "plain": 0}


def test_check_compares_a_directorys_default_with_its_row(world):
    m = world.m
    durable_dir(m)
    m.registry.db.execute("UPDATE nodes SET durable = 0 WHERE name = 'd'")
    report = m.checks.check()
    assert [p["message"] for p in report["problems"]] == \
        ["'d' (id 2): registry differs in durable"]
    m.checks.check(repair=True)
    clean(m)
