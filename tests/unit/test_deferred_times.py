"""A time set between the steps of a verb's plan, around its work off the event loop, stays
(issue 24, item 18; daemon/verbs/plan.py). The first step runs on the loop, the parity work
on a worker thread, the last step on the loop again; any request may come between them, such as
tar's utimensat right after close(2). Before, the mount's last step gave back spare
capacity with a commit that stamped the modification time, and a socket writer's close and
a seal stamped "now": each undid the utimensat. Here every plan runs its steps in order
with a setattr between them, as the event loop would interleave them."""
from __future__ import annotations

import os

from daemon.registry import ROOT_ID
from daemon.verbs.plan import run_sync
from tests.sizes import MiB

from .world import ROOT, clean, last_step

SET_NS = 1577836800 * 10**9             # 2020-01-01


def _utime(m, alloc) -> None:
    m.names.setattr(alloc.id, ROOT, mtime_ns=SET_NS, atime_ns=SET_NS, authorised=True)


def _stored(m, alloc) -> int:
    row = m.registry.db.execute("SELECT modified_ns FROM nodes WHERE id = ?",
                                (alloc.id,)).fetchone()
    return row[0]


def test_the_mounts_last_close_keeps_a_time_set_after_it(world):
    m = world.m
    s = m.handles.open_session(ROOT)
    f = m.names.create_pending(ROOT_ID, "f", ROOT, 0o644)
    h = m.handles.open_mount(f, ROOT, s, True)
    for i in range(5):                       # 5 MiB: capacity grows past it, trimmed at close
        m.data.write_at(f, i * MiB, b"x" * MiB, session=s)
    plan = m.handles.release_mount(h)
    job = next(plan).job                     # step one (fs.release)
    _utime(m, f)                             # tar: utimensat right after close
    job.run()                                # the worker thread
    last_step(plan)
    assert f.capacity < 8 * MiB              # the spare went back
    assert f.modified_ns == _stored(m, f) == SET_NS
    clean(m)


def test_fsync_keeps_a_time_set_while_its_parity_is_encoded(world):
    m = world.m
    s = m.handles.open_session(ROOT)
    f = m.names.create_pending(ROOT_ID, "f", ROOT, 0o644)
    h = m.handles.open_mount(f, ROOT, s, True)
    m.data.write_at(f, 0, b"x" * (5 * MiB), session=s)
    plan = m.data.sync(f)
    job = next(plan).job                     # fs.fsync's step one
    _utime(m, f)
    job.run()
    last_step(plan)
    assert f.modified_ns == _stored(m, f) == SET_NS
    run_sync(m.handles.release_mount(h))
    clean(m)


def test_a_socket_writers_close_stamps_when_it_closed_not_after(world):
    m = world.m
    run_sync(m.names.create("a", ROOT, size=5 * MiB))
    s = m.handles.open_session(ROOT)
    holder, (fd,), _ = m.handles.open("a", ROOT, s, "rw")
    os.close(fd)
    alloc = holder.alloc
    plan = m.handles.close(s, holder.id, written={"offset": 0, "bytes": 10})
    job = next(plan).job                      # server close's step one
    _utime(m, alloc)                          # another client's utimensat on the mount
    job.run()
    last_step(plan)
    assert alloc.modified_ns == _stored(m, alloc) == SET_NS
    # Without anything between the steps, the close moves the time, to its own moment.
    holder, (fd,), _ = m.handles.open("a", ROOT, s, "rw")
    os.close(fd)
    plan = m.handles.close(s, holder.id, written={"offset": 0, "bytes": 10})
    next(plan).job.run()
    last_step(plan)
    assert alloc.modified_ns > SET_NS and alloc.changed_ns >= alloc.modified_ns
    clean(m)


def test_a_seal_keeps_a_time_set_while_its_parity_is_encoded(world):
    m = world.m
    run_sync(m.names.create("a", ROOT, size=5 * MiB))
    s = m.handles.open_session(ROOT)
    holder, (fd,), _ = m.handles.attach("a", ROOT, s, "rw")
    os.close(fd)
    plan = m.handles.seal("a", ROOT, s)
    job = next(plan).job
    _utime(m, holder.alloc)
    job.run()
    last_step(plan)
    assert holder.alloc.modified_ns == SET_NS and not holder.alloc.unsealed
    run_sync(m.handles.detach(s, holder.id))
    clean(m)
