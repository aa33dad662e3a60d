"""Fault injection into the registry (issue 13): for every mutating verb, each registry
statement and the COMMIT fail in turn, as they do on a full state disk. Afterwards the verb
has either happened whole or changed nothing: the tree, the registry, the backend's memory and
the keeper agree (`check` is clean), what a user sees is what it was before, and the next
change works (service goes on once space returns)."""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import os
import sqlite3
import stat
from collections.abc import Callable
from typing import Any

import pytest

from daemon.verbs.plan import run_sync
from gpumemctl.protocol import GpumemError
from tests.registryfaults import FailingConnection
from tests.sizes import MiB

from .world import ROOT, World, clean, with_workers


def seen(m) -> dict:
    """What a user can observe: every entry with its attributes, the memory held, and what
    the keeper holds; and, beyond the first five (issue 25), the rest of what the verbs
    keep in memory (names, seals, snapshots, times, holders, the bytes) and every row of the
    registry, events and holders included."""
    entries = {e["path"]: {k: e.get(k) for k in ("type", "size", "capacity", "durable",
                                                   "mode", "uid", "gid", "state")}
               for e in m.queries.listdir("", ROOT, recursive=True)}
    free = [d.free for d in m.backend.devices()]
    metadata = {path: m.queries.info(path, ROOT)["metadata"] for path in entries}
    return {"entries": entries, "free": free, "kept": sorted(m.keeper.keys()),
            "metadata": metadata, "metadata_used": dict(m.ns.nodes.metadata),
            **_seen_more(m)}


USER_SEES = ("entries", "free", "kept", "metadata", "metadata_used")
# Actions of several verbs in one (open then close; attach, seal, detach): a failure in a
# later verb leaves what the earlier ones did, so only what a user sees is compared; each of
# their verbs is also in VERBS on its own (Staged), compared whole.
COMPOUND = ("close of a writer, parity off the loop", "seal, parity off the loop")
# Plans whose first step commits on its own what writes changed in memory (the size and
# times: Sizing.flush_times) before the parity work, and whose last step is one change (the
# parity's end: the WRITING mark, healed blocks; Sizing.flush_written). When that last change
# fails, the registry holds the size and times a user saw already (in memory, where `check`
# compares them); everything else is as before (the WRITING mark, the unsynced range), so an
# fsync or a close again finishes it. Compared whole but for those columns of the rows.
FLUSHED_FIRST = ("fsync", "fsync, parity off the loop", "release of a mount writer",
                 "release of a mount writer, parity off the loop")
FLUSHED = ("size", "modified_ns", "changed_ns")


def _unflushed(m, seen_: dict) -> dict:
    """`seen_` without the nodes' columns that flush_times commits."""
    columns = [d[0] for d in m.registry.db.execute("SELECT * FROM nodes LIMIT 0").description]
    keep = [i for i, column in enumerate(columns) if column not in FLUSHED]
    rows = [tuple(row[i] for i in keep) for row in seen_["registry"]["nodes"]]
    return {**seen_, "registry": {**seen_["registry"], "nodes": rows}}


def _changed(before, after):
    """What differs, for a message: the keys whose values differ (rows of a table that one
    side has and the other lacks)."""
    if isinstance(before, dict) and isinstance(after, dict):
        return {k: _changed(before.get(k), after.get(k)) for k in before.keys() | after.keys()
                if before.get(k) != after.get(k)}
    if isinstance(before, list) and isinstance(after, list) and \
            all(isinstance(r, tuple) for r in before + after):
        return {"gone": [r for r in before if r not in after],
                "new": [r for r in after if r not in before]}
    return before, after


def _seen_more(m) -> dict:
    listed = m.queries.listdir("", ROOT, recursive=True)
    more = {e["path"]: {k: e.get(k) for k in ("id", "links", "unsealed", "snapshot",
                                              "snapshot_time", "damaged", "ecc", "target")}
            for e in listed}
    nodes = sorted(m.queries.all_nodes(), key=lambda n: n.id)
    times = {n.id: (n.modified_ns, n.changed_ns, n.accessed_ns) for n in nodes}
    allocations = [n for n in nodes if hasattr(n, "holders")] + \
        [a for a in m.holders.unlinked_held() if m.queries.node_or_none(a.id) is None]
    # The mount's files are the kernel's: released whatever happens (release_mount).
    holders = {a.id: sorted((h.id, h.kind, h.session.id) for h in a.holders.values()
                            if not h.kind.startswith("mount-")) for a in allocations}
    data = {a.id: hashlib.sha256(m.backend.read(a.buffer, 0, a.size or 0)).hexdigest()
            for a in allocations if a.buffer is not None}
    tables = ("nodes", "links", "metadata", "damage", "holders", "events", "meta")
    registry = {t: [tuple(r) for r in m.registry.db.execute(f"SELECT * FROM {t}")]
                for t in tables}
    return {"attributes": more, "times": times, "holders": holders, "bytes": data,
            "names_owned": dict(m.ns.nodes.owned), "handles_per_uid": dict(m.holders.per_uid),
            "registry": registry}


# ---- the verbs: (setup, action), each on a fresh world ---------------------------------------
def _setup(m):
    m.names.mkdir("d", ROOT)
    m.names.mkdir("empty", ROOT)
    run_sync(m.names.create("d/trans", ROOT, size=2 * MiB))
    run_sync(m.names.create("d/keep", ROOT, size=2 * MiB, durable=True,
                            metadata={"k": "v", "i": "x" * 9}))
    m.metadata.meta_set("d", "dk", "dv", ROOT)


def _id(m, path: str) -> int:
    return m.queries.lookup(path, ROOT).id


def _open_read(m):
    m.handles.open("d/keep", ROOT, m.handles.open_session(ROOT), "r")


def _create_deposit_off_loop(m, path="d/new"):
    """The socket server's durable create (NameVerbs.create's plan): prepare on the loop, the
    deposit (on a worker thread there), then the create with what was prepared."""
    with_workers(m.names.create(path, ROOT, size=4 * MiB, durable=True, mode=0o600))


def _durable_deposit_off_loop(m):
    """The socket server's `durable` (DurabilityVerbs.set_durable's plan), step by step."""
    with_workers(m.durability.set_durable("d/trans", ROOT, True))


def _close_written_off_loop(m):
    """The socket server's close of a handle that wrote: the parity job first (a worker
    thread there), then the close that finishes it."""
    session = m.handles.open_session(ROOT)
    holder, (fd,), _info = m.handles.open("d/keep", ROOT, session, "rw")
    import os
    os.close(fd)
    with_workers(m.handles.close(session, holder.id, written={"bytes": 10}))


def _seal_off_loop(m):
    """An attached writer seals (the socket server's steps): the job, then the seal."""
    import os
    session = m.handles.open_session(ROOT)
    holder, (fd,), _info = m.handles.attach("d/keep", ROOT, session, "rw")
    os.close(fd)
    with_workers(m.handles.seal("d/keep", ROOT, session))
    run_sync(m.handles.detach(session, holder.id))


VERBS = {
    "mkdir": lambda m: m.names.mkdir("d/sub", ROOT),
    "mkdir -p": lambda m: m.names.mkdir("a/b/c", ROOT, parents=True),
    "create transient": lambda m: run_sync(m.names.create("d/new", ROOT, size=4 * MiB)),
    "create durable": lambda m: run_sync(m.names.create("d/new", ROOT, size=4 * MiB, durable=True)),
    "create with parents": lambda m: run_sync(m.names.create("x/y/new", ROOT, size=MiB,
                                                             durable=True)),
    "rm transient": lambda m: m.names.remove("d/trans", ROOT),
    "rm durable": lambda m: m.names.remove("d/keep", ROOT),
    "rm -r": lambda m: m.names.remove("d", ROOT, recursive=True),
    "durable": lambda m: run_sync(m.durability.set_durable("d/trans", ROOT, True)),
    "transient": lambda m: run_sync(m.durability.set_durable("d/keep", ROOT, False)),
    "resize up": lambda m: m.data.resize(m.queries.lookup("d/keep", ROOT), ROOT, 6 * MiB),
    "resize down": lambda m: m.data.resize(m.queries.lookup("d/keep", ROOT), ROOT, MiB),
    "rename": lambda m: m.names.rename(m.queries.lookup("d", ROOT).id, "keep", m.ns.root.id,
                                       "moved", ROOT),
    "rename over": lambda m: m.names.rename(m.queries.lookup("d", ROOT).id, "trans",
                                      m.queries.lookup("d", ROOT).id, "keep", ROOT),
    "chmod": lambda m: m.names.setattr(m.queries.lookup("d/keep", ROOT).id, ROOT, mode=0o640),
    "chown": lambda m: m.names.setattr(_id(m, "d/trans"), ROOT, uid=1000, gid=1000),
    "utimes": lambda m: m.names.setattr(_id(m, "d/keep"), ROOT, mtime_ns=10**18, atime_ns=10**18),
    "resize transient": lambda m: m.data.resize(m.queries.lookup("d/trans", ROOT), ROOT, 6 * MiB),
    # user metadata (issue 17)
    "meta set": lambda m: m.metadata.meta_set("d/keep", "new", "value", ROOT),
    "meta set over": lambda m: m.metadata.meta_set("d/keep", "k", "other", ROOT),
    "meta rm": lambda m: m.metadata.meta_rm("d/keep", "k", ROOT),
    "meta set on a directory": lambda m: m.metadata.meta_set("d", "dk", "other", ROOT),
    "meta set transient": lambda m: m.metadata.meta_set("d/trans", "k", "v", ROOT),
    "create with metadata": lambda m: run_sync(m.names.create("d/new", ROOT, size=MiB, durable=True,
                                               metadata={"a": "b", "c": "d"})),
    "chown with metadata": lambda m: m.names.setattr(_id(m, "d/keep"), ROOT, uid=1000),
    # the mount's verbs, by node id
    "mkdir in the mount": lambda m: m.names.mkdir_child(_id(m, "d"), "sub", ROOT),
    "create in the mount": lambda m: m.names.create_pending(_id(m, "d"), "pending", ROOT),
    "unlink in the mount": lambda m: m.names.unlink_child(_id(m, "d"), "keep", ROOT),
    "rmdir in the mount": lambda m: m.names.rmdir_child(m.ns.root.id, "empty", ROOT),
    "open": _open_read,
    # the plans as the socket server runs them, work off the event loop (verbs/plan.py)
    "create durable, deposit off the loop": _create_deposit_off_loop,
    "create with parents, deposit off the loop": lambda m: _create_deposit_off_loop(
        m, "x/y/new"),
    "durable, deposit off the loop": _durable_deposit_off_loop,
    "close of a writer, parity off the loop": _close_written_off_loop,
    "seal, parity off the loop": _seal_off_loop,
}


# ---- verbs that need more than _setup: what `prepare(world)` makes first (its answer is
# handed to the verb), then the verb itself, `act(m, prepared)`. ---------------------------
@dataclasses.dataclass(frozen=True)
class Staged:
    prepare: Callable[[World], Any]
    act: Callable[[Any, Any], Any]


def _alloc(m, path="d/keep"):
    return m.queries.lookup_allocation(path, ROOT)


def _held(m, path: str, mode: str, how: str = "open"):
    """A session holding `path` (open or attach): (session, holder id)."""
    session = m.handles.open_session(ROOT)
    holder, (fd,), _ = getattr(m.handles, how)(path, ROOT, session, mode)
    os.close(fd)
    return session, holder.id


def _lose_keep(world):
    """d/keep is lost, as after a reboot: the keeper lost it and the daemon started again."""
    world.kept.drop(world.m.queries.lookup("d/keep", ROOT).id)
    world.crash()


def _refill(m, path="d/keep", *, force=False, session=None):
    session = session or m.handles.open_session(ROOT)
    holder, (fd,), _ = m.refill.begin_refill(path, ROOT, session, size=2 * MiB, mode=0o644,
                                            ecc=None, durable=True, device=None, force=force,
                                            unsealed=False)
    os.close(fd)
    return session, holder.id


def _refilling(world):
    _lose_keep(world)
    return _refill(world.m)


def _mount_writer(m, path="d/keep", data=b"w" * 1000):
    """A file open for writing on the mount, written within its size."""
    session = m.handles.open_session(ROOT)
    alloc = _alloc(m, path)
    holder = m.handles.open_mount(alloc, ROOT, session, True)
    m.data.write_at(alloc, 100, data, session=session)
    return holder


def _written(world):
    """d/keep written through the daemon (the mount's writes), within its size."""
    world.m.data.write_at(_alloc(world.m), 100, b"w" * 1000)


SHRUNK = MiB - 64 * 1024


def _shrunk(world):
    """d/keep resized to 960 KiB: its capacity (2 MiB of its own, or a 1 MiB slot) has room
    past its size."""
    world.m.data.resize(_alloc(world.m), ROOT, SHRUNK)


def _linked(world):
    world.m.names.link("d/keep", "hl", ROOT)


def _corrupted(world):
    """Bytes of d/keep changed behind the parity's back (a flipped bit in device memory)."""
    m = world.m
    alloc = _alloc(m)
    first = m.backend.read(alloc.buffer, 1000, 1)
    m.backend.write(alloc.buffer, 1000, bytes([first[0] ^ 0xFF]))


def _whole_session(world):
    """A session holding three things: a writer of d/keep, a reader of d/trans, a lease."""
    m = world.m
    session, _ = _held(m, "d/keep", "rw")
    _, (fd,), _ = m.handles.open("d/trans", ROOT, session, "r")
    os.close(fd)
    run_sync(m.names.create("leased", ROOT, size=MiB, lease=True, session=session))
    return session


REPORT = {"action": "create", "result": "ok", "location": "store/x", "snapshot": "s1",
          "bytes": 4 * MiB}

VERBS.update({
    # names: hard and symbolic links, special files, exchange, access times
    "link": lambda m: m.names.link("d/keep", "d/keep2", ROOT),
    "link transient": lambda m: m.names.link("d/trans", "hl", ROOT),
    "link in the mount": lambda m: m.names.link_child(_id(m, "d/keep"), m.ns.root.id, "hl",
                                                      ROOT),
    "rm one name of a hard link": Staged(_linked, lambda m, _: m.names.remove("hl", ROOT)),
    "rm the first name of a hard link": Staged(
        _linked, lambda m, _: m.names.remove("d/keep", ROOT)),
    "unlink in the mount, one of two names": Staged(
        _linked, lambda m, _: m.names.unlink_child(_id(m, "d"), "keep", ROOT)),
    "rename over a hard link": Staged(
        _linked, lambda m, _: m.names.rename(_id(m, "d"), "trans", m.ns.root.id, "hl", ROOT)),
    "symlink": lambda m: m.names.symlink("d/ln", "keep", ROOT),
    "symlink in the mount": lambda m: m.names.symlink_child(_id(m, "d"), "ln", "keep", ROOT),
    "mknod fifo": lambda m: m.names.mknod_child(_id(m, "d"), "fifo", ROOT, 0o644,
                                                stat.S_IFIFO),
    "mknod char device": lambda m: m.names.mknod_child(_id(m, "d"), "tty", ROOT, 0o600,
                                                       stat.S_IFCHR, os.makedev(4, 1)),
    "exchange": lambda m: m.names.exchange(_id(m, "d"), "keep", _id(m, "d"), "trans", ROOT),
    "exchange a file and a directory": lambda m: m.names.exchange(
        _id(m, "d"), "keep", m.ns.root.id, "empty", ROOT),
    "rename a directory": lambda m: m.names.rename(m.ns.root.id, "d", _id(m, "empty"), "d",
                                                   ROOT),
    "access time": lambda m: m.names.note_access(_alloc(m)),
    # data: writes, fsync, the flush of times, truncate, a pending allocation's memory
    "write": lambda m: m.data.write_at(_alloc(m), 0, b"x" * 100, ROOT),
    "write past the end": Staged(_shrunk, lambda m, _: m.data.write_at(_alloc(m), SHRUNK,
                                                                       b"x" * 100, ROOT)),
    "fsync": Staged(_written, lambda m, _: run_sync(m.data.sync(_alloc(m)))),
    "fsync, parity off the loop": Staged(_written,
                                         lambda m, _: with_workers(m.data.sync(_alloc(m)))),
    "flush of times": Staged(_written, lambda m, _: m.data.flush_times(_alloc(m))),
    "truncate on open": lambda m: m.data.truncate_on_open(_alloc(m), ROOT,
                                                          m.handles.open_session(ROOT)),
    "resize a pending allocation": Staged(
        lambda w: w.m.names.create_pending(_id(w.m, "d"), "p", ROOT),
        lambda m, _: m.data.resize(_alloc(m, "d/p"), ROOT, MiB)),
    # durability by node (the mount's user.gpu.durable)
    "durable by node": lambda m: m.durability.set_durable_node(_alloc(m, "d/trans"), ROOT,
                                                               True),
    "transient by node": lambda m: m.durability.set_durable_node(_alloc(m), ROOT, False),
    # user metadata by node (the mount's user.KEY)
    "meta set by node": lambda m: m.metadata.set_metadata(_alloc(m), b"x", b"y", ROOT),
    "meta rm by node": lambda m: m.metadata.remove_metadata(_alloc(m), b"k", ROOT),
    # handles: open, attach, close, detach, seal, revoke, sessions
    "open rw": lambda m: _held(m, "d/keep", "rw"),
    "attach r": lambda m: _held(m, "d/keep", "r", "attach"),
    "attach rw": lambda m: _held(m, "d/keep", "rw", "attach"),
    "close of a reader": Staged(lambda w: _held(w.m, "d/keep", "r"),
                                lambda m, h: run_sync(m.handles.close(*h))),
    "close of a writer": Staged(lambda w: _held(w.m, "d/keep", "rw"),
                                lambda m, h: run_sync(m.handles.close(*h, written={
                                    "offset": 0, "bytes": 10}))),
    "detach of a reader": Staged(lambda w: _held(w.m, "d/keep", "r", "attach"),
                                 lambda m, h: run_sync(m.handles.detach(*h))),
    "detach of a writer": Staged(lambda w: _held(w.m, "d/keep", "rw", "attach"),
                                 lambda m, h: run_sync(m.handles.detach(*h))),
    "detach of a writer, parity off the loop": Staged(
        lambda w: _held(w.m, "d/keep", "rw", "attach"),
        lambda m, h: with_workers(m.handles.detach(*h))),
    "seal by the attached writer": Staged(
        lambda w: _held(w.m, "d/keep", "rw", "attach"),
        lambda m, h: run_sync(m.handles.seal("d/keep", ROOT, h[0]))),
    "revoke": Staged(lambda w: (_held(w.m, "d/keep", "r"), _held(w.m, "d/keep", "r", "attach")),
                     lambda m, _: m.handles.revoke_readers(_alloc(m), ROOT,
                                                           m.handles.open_session(ROOT))),
    "end session of a writer": Staged(lambda w: _held(w.m, "d/keep", "rw"),
                                      lambda m, h: run_sync(m.handles.end_session(h[0]))),
    "end session of a writer, parity off the loop": Staged(
        lambda w: _held(w.m, "d/keep", "rw"),
        lambda m, h: with_workers(m.handles.end_session(h[0]))),
    "end session of an attached writer": Staged(
        lambda w: _held(w.m, "d/keep", "rw", "attach"),
        lambda m, h: run_sync(m.handles.end_session(h[0]))),
    "end session holding three": Staged(_whole_session,
                                        lambda m, s: run_sync(m.handles.end_session(s))),
    # files open on the mount
    "release of a mount writer": Staged(lambda w: _mount_writer(w.m),
                                        lambda m, h: run_sync(m.handles.release_mount(h))),
    "release of a mount writer, parity off the loop": Staged(
        lambda w: _mount_writer(w.m), lambda m, h: with_workers(m.handles.release_mount(h))),
    "release of a mount writer, spare capacity trimmed": Staged(
        lambda w: _mount_writer(w.m, "d/trans", b"g" * (3 * MiB)),
        lambda m, h: run_sync(m.handles.release_mount(h))),
    # refills from a snapshot (op refill) and how they end
    "refill a lost allocation": Staged(_lose_keep, lambda m, _: _refill(m)),
    "refill over an allocation (--force)": lambda m: _refill(m, force=True),
    "refill a missing name": lambda m: _refill(m, "d/restored"),
    "refill finished by its close": Staged(_refilling, lambda m, h: run_sync(
        m.handles.close(*h, restored={"damaged": []}))),
    "refill abandoned by its close": Staged(_refilling,
                                            lambda m, h: run_sync(m.handles.close(*h))),
    "refill abandoned by its session's end": Staged(
        _refilling, lambda m, h: run_sync(m.handles.end_session(h[0]))),
    # snapshot reports
    "snapshot report of a create": lambda m: m.records.record_snapshot(
        ROOT, REPORT, ["d/keep", "d/trans"], True),
    "snapshot report of a restore": lambda m: m.records.record_snapshot(
        ROOT, {**REPORT, "action": "restore"}, [], True),
    # checks: verify records what it found (and when), and repairs
    "verify": lambda m: run_sync(m.checks.verify(_alloc(m), repair=False)),
    "verify, damage found": Staged(_corrupted, lambda m, _: run_sync(
        m.checks.verify(_alloc(m), repair=False))),
    # reports: the event log's notes and the scrubber's saved state
    "note": lambda m: m.reports.note("scrub", action="start"),
    "scrubber state": lambda m: m.reports.save_meta("scrub_cursor", "7"),
    # service: stop, and the keeper's repairs
    "stop": lambda m: m.service.shutdown(),
    "keeper redeposit": lambda m: m.service.redeposit_all(),
    "keeper reconcile": lambda m: m.service.reconcile_keeper(),
})

# Verbs that cannot be made to fail here, and why:
# - the mount's open (HandleVerbs.open_mount) and `changes` write no registry row;
# - a write past the capacity grows it with room to spare and, refused (NoMemory, the full
#   state disk's included), tries again without: one failing statement is absorbed and the
#   write happens whole ("write past the end" writes within the capacity instead);
# - `debug corrupt` is off unless gpumemd runs with --enable-fault-injection;
# - `check --repair` rewrites rows that are wrong on purpose: "as before" is wrong again;
# - start runs before any verb (its faults: tests/unit/test_manager.py's crash tests).


def _steps(entry) -> Staged:
    if isinstance(entry, Staged):
        return entry
    return Staged(lambda world: None, lambda m, _: entry(m))


def statements_of(world, entry) -> int:
    """How many writing statements (and commits) the action runs when nothing fails."""
    steps = _steps(entry)
    prepared = steps.prepare(world)
    m = world.m
    probe = FailingConnection(m.registry.db, None)
    m.registry.db = probe
    try:
        steps.act(m, prepared)
    finally:
        m.registry.db = probe._db
    return probe.count


@pytest.mark.parametrize("slabs", [False, True], ids=["own-memory", "slabs"])
@pytest.mark.parametrize("verb", list(VERBS))
def test_every_statement_failing_in_turn_leaves_everything_consistent(tmp_path, verb, slabs):
    """Each verb with each of its registry statements failing in turn, for both layouts:
    memory of its own per allocation, and small allocations packed in slabs (issue 26)."""
    action = VERBS[verb]
    dry = _world(_fresh_dir(tmp_path, "dry"), slabs)
    _setup(dry.m)
    total = statements_of(dry, action)
    dry.close()
    assert total > 0, f"{verb} ran no registry statement"
    failures = []
    for fail_at in range(1, total + 1):      # one fresh world per injected failure
        world = _world(_fresh_dir(tmp_path, f"fail{fail_at}"), slabs)
        try:
            failures += _one_failure(world, verb, _steps(action), fail_at)
        finally:
            world.close()
    assert not failures, "\n".join(failures)


def _world(path, slabs: bool) -> World:
    """A world; with slabs, emptied slabs wait for the next sweep (its statements are not
    the verb's: test_a_failed_slab_sweep_leaves_the_slabs_for_the_next_one)."""
    return World(path, slabs=slabs)


def test_a_failed_slab_sweep_leaves_the_slabs_for_the_next_one(tmp_path):
    """The sweep after a remove emptied a slab fails at each of its statements in turn:
    the remove stands, the slab stays held and listed (check clean), and the next sweep
    frees it."""
    dry = World(_fresh_dir(tmp_path, "dry"), slabs=True)
    run_sync(dry.m.names.create("s", ROOT, size=4096, durable=True))
    probe = FailingConnection(dry.m.registry.db, None)
    dry.m.registry.db = probe
    try:
        dry.m.names.remove("s", ROOT)
    finally:
        dry.m.registry.db = probe._db
    total = probe.count
    dry.close()
    for fail_at in range(1, total + 1):
        world = World(_fresh_dir(tmp_path, f"fail{fail_at}"), slabs=True)
        m = world.m
        try:
            run_sync(m.names.create("s", ROOT, size=4096, durable=True))
            m.registry.db = FailingConnection(m.registry.db, fail_at)
            try:
                m.names.remove("s", ROOT)
            except (GpumemError, sqlite3.Error):
                pass
            finally:
                m.registry.db = m.registry.db._db
            clean(m)
            m.custody.slabs.sweep()
            clean(m)
            if not m.queries.allocations():
                assert not m.backend.pool.slabs, f"statement {fail_at}: a slab stayed"
        finally:
            world.close()


def _fresh_dir(tmp_path, name: str):
    path = tmp_path / name
    path.mkdir()
    return path


def _one_failure(world, verb: str, steps: Staged, fail_at: int) -> list[str]:
    _setup(world.m)
    prepared = steps.prepare(world)
    m = world.m
    before = seen(m)
    m.registry.db = FailingConnection(m.registry.db, fail_at)
    try:
        steps.act(m, prepared)
    except (GpumemError, sqlite3.Error):
        pass
    else:
        return [f"{verb}, statement {fail_at} failing: the verb reported success"]
    finally:
        m.registry.db = m.registry.db._db
    # A slab a failed create made stays until the next sweep, which gpumemd runs right after
    # the change (here, with the verb's statements counted alone, it is run now).
    m.custody.slabs.sweep()
    where = f"{verb}, statement {fail_at} failing"
    problems = []
    after = seen(m)
    if verb in COMPOUND:        # compared on what a user sees, as before issue 25
        before, after = ({k: v[k] for k in USER_SEES} for v in (before, after))
    elif verb in FLUSHED_FIRST:
        before, after = _unflushed(m, before), _unflushed(m, after)
    if after != before:
        changed = {k: _changed(before[k], after[k]) for k in before if before[k] != after[k]}
        problems.append(f"{where}: what a user sees changed: {changed}")
    try:
        clean(m)
    except AssertionError as exc:
        problems.append(f"{where}: check is not clean: {exc}")
    try:
        name = next(n for n in (f"after{i}" for i in itertools.count())
                    if n not in after["entries"])
        run_sync(m.names.create(name, ROOT, size=MiB, durable=True))     # service goes on
        clean(m)
    except Exception as exc:  # noqa: BLE001 - any failure here is the finding
        problems.append(f"{where}: the next change failed: {exc!r}")
    return problems


def test_a_session_end_that_fails_leaves_no_holder_behind(tmp_path):
    """A session's end cannot be refused: its client is gone. When its change fails (a full
    state disk) the error is raised and the session is closed, but what it held stays held,
    in memory and in the registry alike (`check` is clean), only until the next attempt:
    here the next open of the allocation, which releases it first."""
    world = World(tmp_path)
    try:
        m = world.m
        _setup(m)
        session, holder_id = _held(m, "d/keep", "rw")
        m.registry.db = FailingConnection(m.registry.db, 2)
        try:
            with pytest.raises(GpumemError):
                run_sync(m.handles.end_session(session))
        finally:
            m.registry.db = m.registry.db._db
        assert session.closed                   # the connection is gone whatever happens
        assert holder_id in _alloc(m).holders   # held, as its row says, until the next try
        clean(m)
        _held(m, "d/keep", "rw")                # so is its lock: a new writer may come
        assert holder_id not in _alloc(m).holders and not m.holders.ending
        clean(m)
    finally:
        world.close()


def test_a_failed_session_end_is_released_by_the_next_attempt(tmp_path):
    """Whatever the failed session held goes at the next attempt that works
    (settle_ended_sessions): one that meets a disk still full leaves it as it is; then any
    session's end releases it whole: a lease's allocation goes, the memory of a file removed
    while it was open is freed."""
    world = World(tmp_path)
    try:
        m = world.m
        _setup(m)
        session = _whole_session(world)      # a writer of d/keep, a reader of d/trans, a lease
        removed = _alloc(m, "d/trans")
        m.names.remove("d/trans", ROOT, force=True)     # its memory stays with the reader
        m.registry.db = FailingConnection(m.registry.db, 3)
        try:
            with pytest.raises(GpumemError):
                run_sync(m.handles.end_session(session))
            m.registry.db.fail_at, m.registry.db.count = 1, 0
            m.handles.settle_ended_sessions()           # the disk is still full: no harm
        finally:
            m.registry.db = m.registry.db._db
        assert len(session.holders) == 3 and m.holders.ending == {session.id: session}
        assert m.queries.lookup("leased", ROOT) is not None
        assert m.holders.unlinked_held() == [removed] and removed.buffer is not None
        clean(m)
        run_sync(m.handles.end_session(m.handles.open_session(ROOT)))   # another client's
        assert not session.holders and not m.holders.ending
        assert m.queries.node_or_none(_id(m, "d/keep")).holders == {}
        with pytest.raises(GpumemError):
            m.queries.lookup("leased", ROOT)
        assert m.holders.unlinked_held() == [] and removed.buffer is None
        assert m.holders.per_uid == {}
        clean(m)
        _held(m, "d/keep", "rw")
    finally:
        world.close()


def _failing_each(tmp_path, prepare, act, check) -> None:
    """`act` with each of its statements failing in turn (a fresh world each time), then
    `check(m, prepared)`."""
    dry = World(_fresh_dir(tmp_path, "dry"))
    _setup(dry.m)
    total = statements_of(dry, Staged(prepare, act))
    dry.close()
    for fail_at in range(1, total + 1):
        world = World(_fresh_dir(tmp_path, f"fail{fail_at}"))
        try:
            _setup(world.m)
            prepared = prepare(world)
            m = world.m
            m.registry.db = FailingConnection(m.registry.db, fail_at)
            try:
                with pytest.raises(GpumemError):
                    act(m, prepared)
            finally:
                m.registry.db = m.registry.db._db
            check(m, prepared)
        finally:
            world.close()


def test_an_attach_that_fails_closes_the_fd_it_exported(tmp_path):
    """The fd is exported before the attach's change: when that fails, it is closed."""
    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    def check(m, before: int) -> None:
        assert fds() == before and not _alloc(m).unsealed

    _failing_each(tmp_path, lambda world: fds(),
                  lambda m, _: m.handles.attach("d/keep", ROOT, m.handles.open_session(ROOT),
                                                "rw"), check)


def test_a_revoke_that_fails_revokes_no_one(tmp_path):
    """Its readers keep their handles: their close is a close, not a revoked one's."""
    def prepare(world):
        return [_held(world.m, "d/keep", "r"), _held(world.m, "d/keep", "r", "attach")]

    def check(m, readers) -> None:
        (s1, h1), (s2, h2) = readers
        assert not s1.revoked and not s2.revoked
        assert run_sync(m.handles.close(s1, h1)) == {}
        assert "revoked" not in run_sync(m.handles.detach(s2, h2))
        clean(m)

    _failing_each(tmp_path, prepare, lambda m, _: m.handles.revoke_readers(
        _alloc(m), ROOT, m.handles.open_session(ROOT)), check)
