"""Tier (a) for issue 12's POSIX rules, where the mount cannot reach: daemon/fs/'s
Operations called directly with a request context (the create that races a socket-side
create), the relatime day rule, the access-time column's migration, and EFBIG versus ENOSPC
in the verbs."""
from __future__ import annotations

import errno
import os
import sqlite3
import types

import pyfuse3
import pytest
import trio

from daemon.core.namespace import RELATIME_NS
from daemon.core.permissions import DAEMON
from daemon.fs.errno_map import errno_for
from daemon.fs.operations import Operations
from daemon.registry import ROOT_ID, SCHEMA_VERSION, Registry
from daemon.verbs.plan import run_sync
from gpumemctl.protocol import NoMemory
from tests.sizes import MiB

from .world import ROOT, clean

ALICE = types.SimpleNamespace(pid=os.getpid(), uid=1000, gid=1000)
ROOT_CTX = types.SimpleNamespace(pid=os.getpid(), uid=0, gid=0)


def fuse_errno(fn, *args) -> int:
    with pytest.raises(pyfuse3.FUSEError) as exc:
        trio.run(fn, *args)
    return exc.value.errno


@pytest.fixture
def m(world):
    """The verbs on a real registry, the host backend (256 MiB) and the in-process keeper."""
    return world.m


@pytest.fixture
def ops(m):
    operations = Operations(m.verbs, m.handles.open_session(DAEMON, client="mount"))
    yield operations
    for fh in list(operations.handles):
        trio.run(operations.release, fh)


# ---- create of a name that exists by the time the request arrives ----------------------------
def test_create_of_an_existing_name_opens_it_and_o_trunc_empties_it(m, ops):
    """The kernel sends CREATE when its lookup found nothing; a socket client may have made
    the name since. Without O_EXCL that is an open of the existing file."""
    run_sync(m.names.create("raced", ROOT, size=MiB, mode=0o644))
    alloc = m.queries.lookup("raced", ROOT)
    m.data.write_at(alloc, 0, b"made through the socket")
    info, attrs = trio.run(ops.create, ROOT_ID, b"raced", 0o644, os.O_RDWR, ROOT_CTX)
    assert attrs.st_ino == alloc.id and attrs.st_size == MiB
    assert bytes(trio.run(ops.read, info.fh, 0, 23)) == b"made through the socket"
    info, attrs = trio.run(ops.create, ROOT_ID, b"raced", 0o644,
                           os.O_WRONLY | os.O_TRUNC, ROOT_CTX)
    assert attrs.st_size == 0 and alloc.size == 0
    assert fuse_errno(ops.create, ROOT_ID, b"raced", 0o644,
                      os.O_WRONLY | os.O_CREAT | os.O_EXCL, ROOT_CTX) == errno.EEXIST


def test_create_of_an_existing_name_checks_the_permission_the_kernel_skipped(m, ops):
    run_sync(m.names.create("private", ROOT, size=MiB, mode=0o600))
    run_sync(m.names.create("readable", ROOT, size=MiB, mode=0o644))
    m.names.mkdir("dir", ROOT)
    assert fuse_errno(ops.create, ROOT_ID, b"private", 0o644, os.O_RDONLY, ALICE) == \
        errno.EACCES
    assert fuse_errno(ops.create, ROOT_ID, b"readable", 0o644, os.O_RDONLY | os.O_TRUNC,
                      ALICE) == errno.EACCES
    assert m.queries.lookup("readable", ROOT).size == MiB
    assert fuse_errno(ops.create, ROOT_ID, b"dir", 0o644, os.O_RDONLY, ROOT_CTX) == \
        errno.EISDIR
    clean(m)


# ---- access time -----------------------------------------------------------------------------
def stored_atime(m, node_id: int) -> int:
    return m.registry.db.execute("SELECT accessed_ns FROM nodes WHERE id = ?",
                                 (node_id,)).fetchone()[0]


def test_relatime_moves_a_day_old_access_time_and_leaves_a_recent_one(m):
    run_sync(m.names.create("f", ROOT, size=MiB))
    f = m.queries.lookup("f", ROOT)
    recent = f.modified_ns + 1
    m.names.setattr(f.id, ROOT, atime_ns=recent)
    f.changed_ns = f.modified_ns                       # as if nothing changed since
    m.names.note_access(f)
    assert f.accessed_ns == recent == stored_atime(m, f.id)
    day_old = f.modified_ns + 1
    f.modified_ns = f.changed_ns = day_old - RELATIME_NS
    f.accessed_ns = day_old - RELATIME_NS + 1         # after mtime, but a day old
    m.names.note_access(f)
    assert f.accessed_ns > day_old and stored_atime(m, f.id) == f.accessed_ns


def test_the_access_time_column_is_added_with_the_modification_time(tmp_path):
    """A registry from before schema 4 gets accessed_ns = modified_ns for every row."""
    path = str(tmp_path / "r.sqlite")
    reg = Registry(path)
    with reg.transaction(durable=True):
        reg.nodes.insert(parent=ROOT_ID, name="old", kind="alloc", uid=0, gid=0, mode=0o600,
                        created_ns=5, modified_ns=7, changed_ns=9, state="ready")
    reg.close()
    db = sqlite3.connect(path)                          # back to schema 3
    db.execute("ALTER TABLE nodes DROP COLUMN accessed_ns")
    db.execute("ALTER TABLE nodes ADD COLUMN parity_gen INTEGER")   # dropped by schema 5
    db.execute("ALTER TABLE nodes ADD COLUMN checksum TEXT")
    db.execute("PRAGMA user_version=3")
    db.commit()
    db.close()
    reg = Registry(path)
    assert reg.version() == SCHEMA_VERSION
    rows = {r["name"]: r for r in reg.nodes.load()}
    assert rows["old"]["accessed_ns"] == 7
    assert rows[""]["accessed_ns"] == rows[""]["modified_ns"]
    reg.close()


# ---- EFBIG: larger than any device; ENOSPC: not now ------------------------------------------
def test_too_big_for_any_device_is_efbig_and_not_now_is_enospc(m):
    """One 256 MiB host device."""
    with pytest.raises(NoMemory) as exc:
        run_sync(m.names.create("huge", ROOT, size=300 * MiB))
    assert errno_for(exc.value) == errno.EFBIG
    assert "free of 256M total; that exceeds the device's total memory" in str(exc.value)
    with pytest.raises(NoMemory) as exc:                # fits the total only without parity
        run_sync(m.names.create("almost", ROOT, size=256 * MiB))
    assert errno_for(exc.value) == errno.EFBIG and "ECC parity" in str(exc.value)
    # without ECC it fits exactly
    run_sync(m.names.create("none", ROOT, size=256 * MiB, ecc="none"))
    m.names.remove("none", ROOT)
    run_sync(m.names.create("hog", ROOT, size=150 * MiB))
    with pytest.raises(NoMemory) as exc:
        run_sync(m.names.create("more", ROOT, size=150 * MiB))
    assert errno_for(exc.value) == errno.ENOSPC
    clean(m)


def test_the_root_directory_is_fuses_root_inode():
    """The mount answers the root by pyfuse3.ROOT_INODE (it reaches no registry constant):
    the namespace's root node id must be that inode."""
    assert ROOT_ID == pyfuse3.ROOT_INODE
