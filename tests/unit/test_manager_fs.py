"""The verbs of the filesystem (what daemon/fs/ calls), tier (a): a real
registry, the host backend and the in-process keeper (the `world` fixture); `check` runs after
each scenario."""
from __future__ import annotations

import errno
import os

import pytest

from daemon.core.namespace import NOW
from daemon.core.permissions import Credentials
from daemon.fs.errno_map import errno_for
from daemon.registry import ROOT_ID
from daemon.verbs.plan import run_sync
from gpumemctl.protocol import (
    Busy,
    Exists,
    InvalidState,
    NoMemory,
    NotFound,
    PermissionDenied,
    UsageError,
)
from tests.sizes import MiB, with_parity

from .world import ROOT, clean

ALICE = Credentials(pid=os.getpid(), uid=1000, gid=1000)
BOB = Credentials(pid=os.getpid(), uid=1001, gid=1001)
PATTERN = bytes(range(256)) * 4096          # 1 MiB


def pattern(n: int) -> bytes:
    return (PATTERN * (n // len(PATTERN) + 1))[:n]


def touch(m, name, cred=ROOT, parent=ROOT_ID, mode=0o644):
    return m.names.create_pending(parent, name, cred, mode)


def test_lookup_child_and_node(world):
    m = world.m
    run_sync(m.names.create("d/a", ROOT, size=MiB))
    d = m.queries.lookup_child(ROOT_ID, "d", ROOT)
    assert m.queries.node(d.id) is d and m.queries.lookup_child(d.id, "a", ROOT).path == "d/a"
    with pytest.raises(NotFound):
        m.queries.lookup_child(d.id, "b", ROOT)
    with pytest.raises(NotFound):
        m.queries.node(99999)
    for bad in ("", ".", "..", "a/b", "x" * 256):
        with pytest.raises(UsageError):
            m.queries.lookup_child(ROOT_ID, bad, ROOT)
    a = m.queries.lookup_child(d.id, "a", ROOT)
    with pytest.raises(UsageError) as exc:
        m.queries.lookup_child(a.id, "x", ROOT)
    assert errno_for(exc.value) == errno.ENOTDIR
    m.names.setattr(d.id, ROOT, mode=0o700)
    with pytest.raises(PermissionDenied):
        m.queries.lookup_child(d.id, "a", ALICE)
    clean(m)


def test_pending_file_then_resize_allocates(world):
    m = world.m
    f = touch(m, "f")
    info = m.queries.info("f", ROOT)
    assert (info["state"], info["size"], info["capacity"]) == ("pending", 0, None)
    assert m.data.read_at(f, 0, 100) == b"" and m.backend.used == 0
    with pytest.raises(Exists):
        touch(m, "f")
    clean(m)
    m.data.resize(f, ROOT, 0)                   # size 0 stays pending
    assert f.state == "pending"
    m.data.resize(f, ROOT, MiB + 1)
    assert (f.state, f.size, f.capacity) == ("ready", MiB + 1, 2 * MiB)
    assert m.data.read_at(f, 0, 10) == bytes(10)
    assert m.registry.event_log.query()[-1]["kind"] == "resize"
    clean(m)


def test_resize_within_capacity_zeroes_tail(world):
    m = world.m
    f = touch(m, "f")
    m.data.write_at(f, 0, pattern(MiB))
    assert (f.size, f.capacity) == (MiB, 2 * MiB)
    m.data.resize(f, ROOT, 1000)
    assert f.capacity == 2 * MiB and m.data.read_at(f, 0, MiB) == pattern(1000)
    m.data.resize(f, ROOT, MiB)                 # grows again: the old bytes must not come back
    assert m.data.read_at(f, 0, MiB) == pattern(1000) + bytes(MiB - 1000)
    clean(m)


def test_resize_grow_and_shrink_across_capacity(world):
    m = world.m
    f = touch(m, "f")
    m.data.write_at(f, 0, pattern(3 * MiB))
    used = m.backend.used
    m.data.resize(f, ROOT, 9 * MiB + 7)
    assert (f.size, f.capacity) == (9 * MiB + 7, 10 * MiB)
    assert m.backend.used == used - 4 * MiB + 10 * MiB     # the old buffer is freed
    data = m.data.read_at(f, 0, f.size)
    assert data[:3 * MiB] == pattern(3 * MiB) and data[3 * MiB:] == bytes(6 * MiB + 7)
    m.data.resize(f, ROOT, MiB + 5)
    assert f.capacity == 2 * MiB and m.backend.used == used - 2 * MiB
    assert m.data.read_at(f, 0, 4 * MiB) == pattern(MiB + 5)
    m.data.resize(f, ROOT, 0)                   # ready keeps one granule
    assert (f.state, f.size, f.capacity) == ("ready", 0, 2 * MiB)
    assert m.data.read_at(f, 0, 10) == b""
    clean(m)


def test_durable_resize_survives_crash(world):
    m = world.m
    run_sync(m.names.create("keep", ROOT, size=MiB, durable=True))
    f = m.queries.lookup("keep", ROOT)
    m.data.write_at(f, 0, pattern(MiB))
    m.data.resize(f, ROOT, 5 * MiB)
    m.data.write_at(f, 5 * MiB - 4, b"tail")
    assert m.keeper.keys() == [f.id]
    clean(m)
    m = world.crash()
    assert {k: world.summary[k] for k in ("adopted", "lost", "orphans_freed",
                                          "transients_dropped")} == \
        {"adopted": 1, "lost": 0, "orphans_freed": 0, "transients_dropped": 0}
    # The writes were never synced (no close, no fsync): after the crash their blocks'
    # parity is rebuilt from the data, which stays as written.
    assert world.summary["parity_rebuilt_blocks"] > 0
    f = m.queries.lookup("keep", ROOT)
    assert (f.size, f.capacity, f.state) == (5 * MiB, 6 * MiB, "ready")
    data = m.data.read_at(f, 0, f.size)
    assert data[:MiB] == pattern(MiB) and data[-4:] == b"tail"
    clean(m)


def test_durable_grow_in_place_crash_before_commit_is_trimmed_at_adopt(world):
    # The host backend grows the memfd, then commits: a kill -9 between leaves the memfd
    # larger than the committed capacity. Adoption trims it back and loses nothing.
    m = world.m
    run_sync(m.names.create("keep", ROOT, size=MiB, durable=True))
    f = m.queries.lookup("keep", ROOT)
    m.data.write_at(f, 0, pattern(MiB))
    run_sync(m.data.sync(f))
    os.ftruncate(f.buffer.fd, 6 * MiB)          # grown, not committed: then the crash
    m = world.crash()
    f = m.queries.lookup("keep", ROOT)
    assert world.summary["adopted"] == 1 and world.summary["lost"] == 0
    assert (f.size, f.capacity) == (MiB, 2 * MiB)
    assert os.fstat(f.buffer.fd).st_size == 2 * MiB and m.data.read_at(f, 0, MiB) == pattern(MiB)
    clean(m)


def test_host_resize_is_in_place(world):
    m = world.m
    run_sync(m.names.create("keep", ROOT, size=MiB, durable=True))
    f = m.queries.lookup("keep", ROOT)
    m.data.write_at(f, 0, pattern(MiB))
    buf = f.buffer
    m.data.resize(f, ROOT, 9 * MiB)
    assert f.buffer is buf and f.capacity == 10 * MiB and \
        m.backend.used == with_parity(10 * MiB)
    assert m.data.read_at(f, 0, 9 * MiB) == pattern(MiB) + bytes(8 * MiB)
    m.data.resize(f, ROOT, 100)
    assert f.buffer is buf and f.capacity == 2 * MiB and \
        m.backend.used == with_parity(2 * MiB)
    m = world.crash()
    f = m.queries.lookup("keep", ROOT)
    assert (f.size, f.capacity) == (100, 2 * MiB) and m.data.read_at(f, 0, 100) == pattern(100)
    clean(m)


def crash_resize_after(world, step):
    """Resize a durable 1 MiB allocation to 5 MiB, crashing (an exception) at `step`. The
    host backend resizes in place; this is the reallocating path the cuda backend takes."""
    m = world.m
    m.backend.resizes_in_place = False
    run_sync(m.names.create("keep", ROOT, size=MiB, durable=True))
    f = m.queries.lookup("keep", ROOT)
    m.data.write_at(f, 0, pattern(MiB))
    real = getattr(m.keeper, step)

    def die(*args, **kwargs):
        if args[0] == f.id:
            raise KeyboardInterrupt("kill -9")
        return real(*args, **kwargs)

    setattr(m.keeper, step, die)
    with pytest.raises(KeyboardInterrupt):
        m.data.resize(f, ROOT, 5 * MiB)
    return world.crash()


def test_durable_resize_crash_after_commit_adopts_staged_copy(world):
    # The commit is done, the keeper still holds the old copy under the id: the staged one
    # under -id has the committed capacity and wins.
    m = crash_resize_after(world, "deposit")
    f = m.queries.lookup("keep", ROOT)
    assert world.summary["adopted"] == 1 and world.summary["lost"] == 0
    assert f.capacity == 6 * MiB and m.data.read_at(f, 0, MiB) == pattern(MiB)
    assert m.keeper.keys() == [f.id]
    clean(m)


def test_durable_resize_crash_before_commit_keeps_old(world):
    m = world.m
    m.backend.resizes_in_place = False          # the reallocating path (cuda's)
    run_sync(m.names.create("keep", ROOT, size=MiB, durable=True))
    f = m.queries.lookup("keep", ROOT)
    m.data.write_at(f, 0, pattern(MiB))

    def die(*args, **kwargs):
        raise KeyboardInterrupt("kill -9")

    m.sizing._commit_size = die
    with pytest.raises(KeyboardInterrupt):
        m.data.resize(f, ROOT, 5 * MiB)
    assert (f.size, f.capacity) == (MiB, 2 * MiB) and m.keeper.keys() == [f.id]
    # A kill -9 at that point would have left the staged 6 MiB copy in the keeper.
    staged = m.backend.allocate(6 * MiB, f.device, "staged")
    m.custody.stage(-f.id, staged, 6 * MiB, f.device)
    m.backend.free(staged)
    m = world.crash()
    f = m.queries.lookup("keep", ROOT)
    assert world.summary["adopted"] == 1 and world.summary["lost"] == 0
    assert f.capacity == 2 * MiB and m.data.read_at(f, 0, MiB) == pattern(MiB)
    assert m.keeper.keys() == [f.id]
    clean(m)


def test_resize_busy_and_permission_and_no_memory(world):
    m = world.m
    run_sync(m.names.create("x", ROOT, size=MiB, mode=0o644))
    x = m.queries.lookup("x", ROOT)
    s_other, s_own = m.handles.open_session(ROOT), m.handles.open_session(ROOT)
    holder, (fd,), _ = m.handles.open("x", ROOT, s_other, "r")
    with pytest.raises(Busy):
        m.data.resize(x, ROOT, 4 * MiB)
    os.close(fd)
    run_sync(m.handles.close(s_other, holder.id))
    holder, (fd,), _ = m.handles.open("x", ROOT, s_own, "rw")
    os.close(fd)
    m.data.resize(x, ROOT, 4 * MiB, session=s_own)       # the caller's own handle is fine
    with pytest.raises(PermissionDenied):
        m.data.resize(x, ALICE, MiB)
    with pytest.raises(NoMemory) as exc:
        m.data.resize(x, ROOT, 300 * MiB, session=s_own)      # more than the 256 MiB device
    assert str(300 * MiB) in str(exc.value) and errno_for(exc.value) == errno.EFBIG
    assert (x.size, x.capacity) == (4 * MiB, 4 * MiB)
    with pytest.raises(UsageError):
        m.data.resize(x, ROOT, -1, session=s_own)
    run_sync(m.handles.end_session(s_own))
    clean(m)


def test_write_past_size_grows_and_full_device_is_enospc(world):
    m = world.m
    f = touch(m, "f")
    assert m.data.write_at(f, 0, b"") == 0 and f.state == "pending"
    m.data.write_at(f, 10, b"hello")
    assert f.size == 15 and m.data.read_at(f, 0, 100) == bytes(10) + b"hello"
    m.data.write_at(f, 3 * MiB, b"x")                     # grows across capacity
    assert (f.size, f.capacity) == (3 * MiB + 1, 4 * MiB)
    assert m.data.read_at(f, 10, 5) == b"hello" and m.data.read_at(f, 3 * MiB, 10) == b"x"
    with pytest.raises(NoMemory):
        m.data.write_at(f, 300 * MiB, b"y")
    assert f.size == 3 * MiB + 1
    with pytest.raises(PermissionDenied):
        m.data.write_at(f, 0, b"z", ALICE)
    clean(m)


def test_write_times_are_flushed(world):
    m = world.m
    f = touch(m, "f")
    m.data.write_at(f, 0, b"abc")
    m.data.write_at(f, 1, b"x")
    row = {r["id"]: r for r in m.registry.nodes.load()}[f.id]
    assert row["modified_ns"] < f.modified_ns        # not committed per write
    m.data.flush_times(f)
    row = {r["id"]: r for r in m.registry.nodes.load()}[f.id]
    assert row["modified_ns"] == f.modified_ns
    clean(m)


def test_rename_moves_and_replaces_freeing_memory(world):
    m = world.m
    run_sync(m.names.create("d/a", ROOT, size=MiB))
    run_sync(m.names.create("e/b", ROOT, size=3 * MiB))
    d, e = m.queries.lookup("d", ROOT), m.queries.lookup("e", ROOT)
    a = m.queries.lookup("d/a", ROOT)
    m.data.write_at(a, 0, b"from a")
    assert m.backend.used == with_parity(2 * MiB) + with_parity(4 * MiB)
    node = m.names.rename(d.id, "a", e.id, "b", ROOT)
    assert node is a and a.path == "e/b" and m.data.read_at(a, 0, 6) == b"from a"
    assert m.backend.used == with_parity(2 * MiB)    # b's memory was freed
    assert [x["path"] for x in m.queries.listdir("", ROOT, recursive=True)] == ["d", "e", "e/b"]
    event = m.registry.event_log.query()[-1]
    assert event["kind"] == "rename" and event["detail"] == {"from": "d/a", "to": "e/b"}
    with pytest.raises(NotFound):
        m.names.rename(d.id, "a", e.id, "c", ROOT)
    m.names.rename(e.id, "b", e.id, "b", ROOT)             # onto itself: nothing happens
    clean(m)


def test_rename_over_held_file_defers_free(world):
    m = world.m
    run_sync(m.names.create("a", ROOT, size=MiB))
    run_sync(m.names.create("b", ROOT, size=MiB, durable=True))
    s = m.handles.open_session(ROOT)
    _, (fd,), _ = m.handles.open("b", ROOT, s, "r")
    os.close(fd)
    m.names.rename(ROOT_ID, "a", ROOT_ID, "b", ROOT)
    assert m.backend.used == 2 * with_parity(2 * MiB) and m.keeper.keys() == []
    run_sync(m.handles.end_session(s))
    assert m.backend.used == with_parity(2 * MiB)
    clean(m)


def test_rename_directory_rules(world):
    m = world.m
    m.names.mkdir("d/sub", ROOT, parents=True)
    m.names.mkdir("empty", ROOT)
    m.names.mkdir("full", ROOT)
    run_sync(m.names.create("full/x", ROOT, size=MiB))
    run_sync(m.names.create("f", ROOT, size=MiB))
    d, sub = m.queries.lookup("d", ROOT), m.queries.lookup("d/sub", ROOT)
    with pytest.raises(UsageError):
        m.names.rename(ROOT_ID, "d", sub.id, "d2", ROOT)      # into its own subtree
    with pytest.raises(UsageError) as exc:
        m.names.rename(ROOT_ID, "d", ROOT_ID, "f", ROOT)
    assert errno_for(exc.value) == errno.ENOTDIR
    with pytest.raises(UsageError) as exc:
        m.names.rename(ROOT_ID, "f", ROOT_ID, "empty", ROOT)
    assert errno_for(exc.value) == errno.EISDIR
    with pytest.raises(Exists) as exc:
        m.names.rename(ROOT_ID, "d", ROOT_ID, "full", ROOT)
    assert errno_for(exc.value) == errno.ENOTEMPTY
    with pytest.raises(Exists):
        m.names.rename(ROOT_ID, "f", ROOT_ID, "full", ROOT, replace=False)
    m.names.rename(ROOT_ID, "d", ROOT_ID, "empty", ROOT)     # over an empty directory
    assert m.queries.lookup("empty/sub", ROOT) is sub and m.queries.lookup("empty", ROOT) is d
    clean(m)


def test_rename_durable_survives_crash(world):
    m = world.m
    run_sync(m.names.create("old/name", ROOT, size=MiB, durable=True))
    a = m.queries.lookup("old/name", ROOT)
    m.data.write_at(a, 0, b"durable bytes")
    new = m.names.mkdir_child(ROOT_ID, "new", ROOT)
    m.names.rename(a.parent.id, "name", new.id, "renamed", ROOT)
    m.names.rename(ROOT_ID, "new", ROOT_ID, "newer", ROOT)   # moving the directory above it too
    m = world.crash()
    a2 = m.queries.lookup("newer/renamed", ROOT)
    assert a2.id == a.id and m.data.read_at(a2, 0, 13) == b"durable bytes"
    with pytest.raises(NotFound):
        m.queries.lookup("old/name", ROOT)
    clean(m)


def test_rename_permissions_and_sticky(world):
    m = world.m
    alice_dir = m.names.mkdir_child(ROOT_ID, "alice", ALICE, 0o755)
    m.names.create_pending(alice_dir.id, "mine", ALICE, 0o644)
    touch(m, "roots")                                   # in the sticky root, owned by root
    with pytest.raises(PermissionDenied):               # sticky: not hers to move
        m.names.rename(ROOT_ID, "roots", alice_dir.id, "stolen", ALICE)
    m.names.create_pending(ROOT_ID, "hers", ALICE, 0o644)
    with pytest.raises(PermissionDenied):               # sticky: not hers to replace
        m.names.rename(ROOT_ID, "hers", ROOT_ID, "roots", ALICE)
    with pytest.raises(PermissionDenied):               # no write permission on alice/
        m.names.rename(alice_dir.id, "mine", ROOT_ID, "x", BOB)
    m.names.rename(ROOT_ID, "hers", alice_dir.id, "moved", ALICE)
    assert m.queries.lookup("alice/moved", ALICE).uid == 1000
    clean(m)


def test_unlink_and_rmdir_child(world):
    m = world.m
    run_sync(m.names.create("d/a", ROOT, size=MiB, durable=True))
    d = m.queries.lookup("d", ROOT)
    with pytest.raises(Exists) as exc:
        m.names.rmdir_child(ROOT_ID, "d", ROOT)
    assert exc.value.code == 5 and errno_for(exc.value) == errno.ENOTEMPTY
    with pytest.raises(UsageError) as exc:
        m.names.unlink_child(ROOT_ID, "d", ROOT)
    assert errno_for(exc.value) == errno.EISDIR
    with pytest.raises(UsageError) as exc:
        m.names.rmdir_child(d.id, "a", ROOT)
    assert errno_for(exc.value) == errno.ENOTDIR
    s = m.handles.open_session(ROOT)
    _, (fd,), _ = m.handles.open("d/a", ROOT, s, "rw")
    os.close(fd)
    m.names.unlink_child(d.id, "a", ROOT)                     # held: the name goes, memory stays
    assert m.backend.used == with_parity(2 * MiB) and m.keeper.keys() == []
    with pytest.raises(NotFound):
        m.queries.lookup("d/a", ROOT)
    run_sync(m.handles.end_session(s))
    assert m.backend.used == 0
    m.names.rmdir_child(ROOT_ID, "d", ROOT)
    assert m.queries.listdir("", ROOT) == []
    with pytest.raises(NotFound):
        m.names.unlink_child(ROOT_ID, "d", ROOT)
    clean(m)


def test_unlink_permissions(world):
    m = world.m
    touch(m, "roots")
    with pytest.raises(PermissionDenied):
        m.names.unlink_child(ROOT_ID, "roots", ALICE)         # the root directory is sticky
    m.names.mkdir_child(ROOT_ID, "d", ROOT, 0o755)
    with pytest.raises(PermissionDenied):
        m.names.rmdir_child(ROOT_ID, "d", ALICE)
    touch(m, "hers", ALICE)
    m.names.unlink_child(ROOT_ID, "hers", ALICE)
    clean(m)


def test_setattr_mode_owner_group_times(world):
    m = world.m
    f = touch(m, "f", ALICE, mode=0o644)
    m.names.setattr(f.id, ALICE, mode=0o600)
    assert m.queries.info("f", ROOT)["mode"] == "0600"
    with pytest.raises(PermissionDenied) as exc:
        m.names.setattr(f.id, BOB, mode=0o777)
    assert errno_for(exc.value) == errno.EPERM
    with pytest.raises(PermissionDenied):
        m.names.setattr(f.id, ALICE, uid=1001)                # only root gives files away
    with pytest.raises(PermissionDenied):
        m.names.setattr(f.id, ALICE, gid=0)                   # not one of her groups
    member = Credentials(pid=os.getpid(), uid=1000, gid=1000, groups=frozenset({50}))
    m.names.setattr(f.id, ALICE, mode=0o2750)
    m.names.setattr(f.id, member, gid=50)
    assert (f.gid, f.mode) == (50, 0o750)               # setgid cleared by the chown
    m.names.setattr(f.id, ROOT, uid=1001, gid=1001)
    assert (f.uid, f.gid) == (1001, 1001)
    m.names.setattr(f.id, BOB, mtime_ns=1_000_000_000)
    assert m.queries.info("f", ROOT)["modified"].startswith("1970-01-01T00:00:01")
    with pytest.raises(PermissionDenied):
        m.names.setattr(f.id, ALICE, mtime_ns=5)
    with pytest.raises(PermissionDenied):
        m.names.setattr(f.id, ALICE, mtime_ns=NOW)            # 0750 gives her no write
    m.names.setattr(f.id, BOB, mode=0o666)
    m.names.setattr(f.id, ALICE, mtime_ns=NOW, atime_ns=NOW)  # write permission is enough
    assert f.modified_ns > 1_000_000_000
    assert m.registry.event_log.query()[-1]["kind"] == "setattr"
    with pytest.raises(UsageError):
        m.names.setattr(f.id, ROOT, mode=0o17777)
    clean(m)


def test_setattr_durable_survives_crash(world):
    m = world.m
    run_sync(m.names.create("k", ROOT, size=MiB, durable=True))
    k = m.queries.lookup("k", ROOT)
    m.names.setattr(k.id, ROOT, mode=0o640, uid=1000, gid=1000)
    m = world.crash()
    info = m.queries.info("k", ROOT)
    assert (info["mode"], info["uid"], info["gid"], info["state"]) == \
        ("0640", 1000, 1000, "ready")
    clean(m)


def test_pending_durable_then_resize_and_lost_refuses(world):
    m = world.m
    f = touch(m, "f")
    run_sync(m.durability.set_durable("f", ROOT, True))
    assert m.keeper.keys() == []
    m = world.crash()                                   # durable and pending: still there
    f = m.queries.lookup("f", ROOT)
    assert f.state == "pending"
    m.data.write_at(f, 0, b"now real")
    assert m.keeper.keys() == [f.id]
    clean(m)
    m.keeper.withdraw(f.id)
    m = world.crash()
    f = m.queries.lookup("f", ROOT)
    assert f.state == "lost"
    with pytest.raises(InvalidState):
        m.data.resize(f, ROOT, 10)
    with pytest.raises(InvalidState):
        m.data.read_at(f, 0, 1)
    clean(m)


# ---- the mount's write path: growth, holes, deferred size commits, trimming ---------------
def test_sequential_writes_grow_geometrically_and_trim_at_close(world):
    m = world.m
    s = m.handles.open_session(ROOT)
    f = touch(m, "f")
    h = m.handles.open_mount(f, ROOT, s, True)
    capacities = []
    for i in range(20):                                  # 20 MiB in 1 MiB writes
        m.data.write_at(f, i * MiB, pattern(MiB), session=s)
        capacities.append(f.capacity)
    reallocations = len(set(capacities))
    assert reallocations <= 5, capacities                # 2, 4, 8, 16, 32 MiB: not 10 copies
    assert f.capacity == 32 * MiB and f.size == 20 * MiB
    run_sync(m.handles.release_mount(h))
    assert f.capacity == 20 * MiB                        # the spare went back
    assert m.data.read_at(f, 0, 20 * MiB) == pattern(MiB) * 20
    assert m.backend.used == with_parity(20 * MiB)
    clean(m)


def test_write_past_the_end_leaves_a_zeroed_hole(world):
    m = world.m
    f = touch(m, "f")
    m.data.write_at(f, 0, b"\xff" * 100)
    m.data.resize(f, ROOT, 10)                                # garbage past the size stays there
    m.data.write_at(f, 4096, b"end")                          # within the capacity: no realloc
    assert m.data.read_at(f, 0, 4099) == b"\xff" * 10 + bytes(4086) + b"end"
    m.data.write_at(f, 3 * MiB, b"far")                       # past it: reallocated
    assert m.data.read_at(f, 4099, 3 * MiB - 4099 + 3) == bytes(3 * MiB - 4099) + b"far"
    clean(m)


def test_size_growth_commits_at_sync(world):
    m = world.m
    f = touch(m, "f")
    m.data.write_at(f, 0, b"abc")                             # allocates: committed at once
    m.data.write_at(f, 3, b"defg")                            # within the capacity: in memory
    row = {r["id"]: r for r in m.registry.nodes.load()}[f.id]
    assert (row["size"], f.size) == (3, 7)
    assert f.dirty_from == 0 and f.dirty_to == 7
    run_sync(m.data.sync(f))
    row = {r["id"]: r for r in m.registry.nodes.load()}[f.id]
    assert row["size"] == 7 and f.dirty_to <= f.dirty_from
    clean(m)


def test_chmod_does_not_drop_an_uncommitted_size(world):
    m = world.m
    f = touch(m, "f")
    m.data.write_at(f, 0, b"abc")
    m.data.write_at(f, 3, b"def")
    m.names.setattr(f.id, ROOT, mode=0o600)
    run_sync(m.data.sync(f))
    assert {r["id"]: r for r in m.registry.nodes.load()}[f.id]["size"] == 6
    clean(m)


def test_unlinked_file_keeps_memory_while_open_on_the_mount(world):
    m = world.m
    s = m.handles.open_session(ROOT)
    f = touch(m, "f")
    m.data.write_at(f, 0, b"data")
    h = m.handles.open_mount(f, ROOT, s, False)
    m.names.unlink_child(ROOT_ID, "f", ROOT)
    assert f.unlinked and f.buffer is not None and m.data.read_at(f, 0, 4) == b"data"
    run_sync(m.handles.release_mount(h))
    assert f.buffer is None and m.backend.used == 0
    clean(m)


def test_metadata_name_is_reserved_at_the_root(world):
    m = world.m
    for make in (lambda: touch(m, ".metadata"), lambda: m.names.mkdir(".metadata", ROOT),
                 lambda: run_sync(m.names.create(".metadata", ROOT, size=MiB))):
        with pytest.raises(UsageError) as exc:
            make()
        assert "reserved" in str(exc.value) and errno_for(exc.value) == errno.EPERM
    d = m.names.mkdir_child(ROOT_ID, "d", ROOT)
    m.names.mkdir_child(d.id, ".metadata", ROOT)               # only the top level is reserved
    touch(m, "x")
    with pytest.raises(UsageError):
        m.names.rename(ROOT_ID, "x", ROOT_ID, ".metadata", ROOT)
    clean(m)
