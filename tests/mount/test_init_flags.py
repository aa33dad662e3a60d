"""The FUSE connection's init flags (issue 29; daemon/fs/initflags.py): the daemon's library
over libfuse interposes fuse_session_new under pyfuse3, so the flags libfuse asks the kernel
for are the daemon's to set and clear. What a user observes: the daemon's log names what was
asked for, and a read after a write through the page cache keeps the cached pages when
`auto_inval_data` is cleared (the daemon invalidates them itself when another path writes:
tests/mount/test_consistency.py passes either way)."""
from __future__ import annotations

import ctypes
import errno
import mmap
import os
import re

import pytest

from daemon.fs import initflags
from tests.harness import wait_for
from tests.users import run_as

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")


def _asked(d) -> list[str]:
    wait_for(lambda: "FUSE init" in d.log(), what="the init flags logged")
    line = next(line for line in d.log().splitlines() if "FUSE init" in line)
    if "asked for" not in line:
        pytest.skip(f"init flags unavailable here: {line.split('INFO: ')[-1]}")
    return line.split("asked for ")[1].split(" ")[0].split(",")


def test_libfuse_defaults_are_asked_for_but_auto_inval_data(mounted_factory):
    d = mounted_factory()
    asked = _asked(d)
    assert "auto_inval_data" not in asked
    assert {"async_read", "readdirplus", "parallel_dirops", "atomic_o_trunc"} <= set(asked)


def test_the_setting_can_ask_for_auto_inval_data_again(mounted_factory):
    d = mounted_factory(env={"GPUMEMD_FUSE_INIT": "+auto_inval_data"})
    assert "auto_inval_data" in _asked(d)


def test_a_cleared_flag_is_not_asked_for_and_a_set_one_is(mounted_factory):
    d = mounted_factory(env={"GPUMEMD_FUSE_INIT": "-splice_read,+flock_locks"})
    asked = _asked(d)
    assert "splice_read" not in asked and "flock_locks" in asked
    assert "auto_inval_data" not in asked           # the daemon's default stays
    # The mount still works, and a socket write still shows through it (the daemon's own
    # invalidation: tests/mount/test_consistency.py has the rules).
    path = os.path.join(d.mnt, "f")
    with open(path, "wb") as f:
        f.write(b"a" * 8192)
    with open(path, "rb") as f:
        assert f.read() == b"a" * 8192
    d.cli("write", "f", "-", input=b"b" * 4096, check=True)
    with open(path, "rb") as f:
        assert f.read() == b"b" * 4096 + b"a" * 4096


def test_an_unknown_flag_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown FUSE init flag"):
        initflags.want(["no_such_flag"], [])


def test_a_bad_setting_names_what_is_allowed(monkeypatch):
    from daemon.fs.mount import init_flags_asked
    monkeypatch.setenv("GPUMEMD_FUSE_INIT", "-auto_inval_data, +splice_read")
    assert init_flags_asked() == (["splice_read"], ["auto_inval_data"])
    monkeypatch.setenv("GPUMEMD_FUSE_INIT", "+auto_inval_data")
    assert init_flags_asked() == (["auto_inval_data"], [])
    monkeypatch.setenv("GPUMEMD_FUSE_INIT", "auto_inval_data")
    with pytest.raises(ValueError, match=r"expected \+NAME or -NAME, NAME one of async_read"):
        init_flags_asked()


# ---- what the kernel keeps cached --------------------------------------------------------------
def _resident_pages(path: str) -> int:
    """How many of the file's pages are in the page cache (mincore(2) of a shared mapping:
    mapping maps nothing in by itself)."""
    size = os.stat(path).st_size
    pages = -(-size // mmap.PAGESIZE)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        vec = (ctypes.c_ubyte * pages)()
        try:
            assert libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) == 0
        finally:
            libc.munmap(ctypes.c_void_p(addr), ctypes.c_size_t(size))
    finally:
        os.close(fd)
    return sum(v & 1 for v in vec)


def _write_then_stat(path: str, data: bytes) -> None:
    """Write through a read-write descriptor (through the page cache), then stat: the stat
    brings the daemon's new modification time, which auto_inval_data takes as a change."""
    with open(path, "wb+") as f:
        f.write(data)
    wait_for(lambda: os.stat(path).st_size == len(data), what="the size")
    os.stat(path)


def test_pages_written_through_the_mount_stay_cached(mounted_factory):
    """By default a file's pages written through the mount stay in the page cache (a read
    right after comes from memory); with auto_inval_data asked for again, the kernel drops
    them at the first stat, because the daemon's modification time moved."""
    data = os.urandom(64 * mmap.PAGESIZE)
    kept = mounted_factory()
    path = os.path.join(kept.mnt, "f")
    _write_then_stat(path, data)
    assert _resident_pages(path) == 64
    with open(path, "rb") as f:
        assert f.read() == data
    dropped = mounted_factory(env={"GPUMEMD_FUSE_INIT": "+auto_inval_data"})
    path = os.path.join(dropped.mnt, "f")
    _write_then_stat(path, data)
    assert _resident_pages(path) < 64
    with open(path, "rb") as f:
        assert f.read() == data


# ---- requests the library answers itself ------------------------------------------------------
def _unmount_counts(d) -> tuple[int, int, int]:
    """The counts the daemon logs at unmount (after d.stop()): GETXATTRs the library
    answered, WRITEs it passed to the daemon directly, and how many of those came from the
    library's receive buffer (page-locked for the device, where the backend copies by DMA)."""
    line = next(line for line in d.log().splitlines() if "unmounted" in line)
    found = re.search(r"answered (\d+) GETXATTRs .* passed (\d+) WRITEs .*, (\d+) of them", line)
    assert found, line
    return int(found[1]), int(found[2]), int(found[3])


def _answered(d) -> int:
    return _unmount_counts(d)[0]


def test_xattrs_outside_user_are_answered_without_python(mounted_factory):
    d = mounted_factory()
    _asked(d)                                           # skips where the library is missing
    os.mkdir(os.path.join(d.mnt, "many"))
    for i in range(50):
        with open(os.path.join(d.mnt, "many", f"f{i}"), "wb") as f:
            f.write(b"x")
    path = os.path.join(d.mnt, "many", "f0")
    for name in ("security.selinux", "system.posix_acl_access", "trusted.x",
                 "security.capability"):
        with pytest.raises(OSError) as exc:
            os.getxattr(path, name)
        assert exc.value.errno == errno.ENODATA, name
    os.setxattr(path, "user.note", b"kept")                  # user.* still reaches the daemon
    assert os.getxattr(path, "user.note") == b"kept"
    assert os.getxattr(path, "user.gpu.size") == b"1"
    listing = [os.stat(os.path.join(d.mnt, "many", n)) for n in sorted(os.listdir(
        os.path.join(d.mnt, "many")))]
    assert len(listing) == 50
    for n in os.listdir(os.path.join(d.mnt, "many")):         # what `ls -l` asks of each
        for name in ("security.selinux", "system.posix_acl_access"):
            with pytest.raises(OSError):
                os.getxattr(os.path.join(d.mnt, "many", n), name)
    assert d.stop() == 0
    assert _answered(d) >= 4 + 100


@needs_root
def test_another_uid_learns_nothing_from_xattrs_outside_user(mounted):
    """The library's ENODATA is the answer for every name outside user.*, whoever asks; the
    kernel still checks the path first, so a file in a directory nobody may search stays
    out of reach (EACCES), and user.* still goes through the daemon's checks."""
    closed = os.path.join(mounted.mnt, "closed")
    os.mkdir(closed, 0o700)
    hidden, open_ = os.path.join(closed, "f"), os.path.join(mounted.mnt, "private")
    for path in (hidden, open_):
        with open(path, "wb") as f:
            f.write(b"secret")
        os.setxattr(path, "user.note", b"root's")
    os.chmod(open_, 0o600)

    def probe(path, name):
        try:
            return os.getxattr(path, name)
        except OSError as exc:
            return errno.errorcode[exc.errno]

    def as_nobody():
        return {"selinux of hidden": probe(hidden, "security.selinux"),
                "selinux of private": probe(open_, "security.selinux"),
                "acl of private": probe(open_, "system.posix_acl_access"),
                "note of private": probe(open_, "user.note")}
    assert run_as(as_nobody) == {"selinux of hidden": "EACCES",
                                 "selinux of private": "ENODATA",
                                 "acl of private": "ENODATA",
                                 "note of private": "EACCES"}


# ---- write-only opens ---------------------------------------------------------------------
def _dd(path: str, data: bytes) -> None:
    """What `dd of=` and `cp` do: a write-only descriptor, 1 MiB writes."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for at in range(0, len(data), 1 << 20):
            os.write(fd, data[at:at + (1 << 20)])
    finally:
        os.close(fd)


def test_write_only_opens_go_direct_unless_told(mounted_factory):
    """By default a write-only descriptor writes with direct I/O: nothing of it is cached
    (a bulk copy into the mount does not also fill host memory). With
    GPUMEMD_MOUNT_WRITE_ONLY=cached it goes through the page cache, which keeps it."""
    data = os.urandom(2 << 20)
    pages = len(data) // mmap.PAGESIZE
    for setting, cached in (({}, False), ({"GPUMEMD_MOUNT_WRITE_ONLY": "cached"}, True)):
        d = mounted_factory(env=setting)
        path = os.path.join(d.mnt, "f")
        _dd(path, data)
        assert (_resident_pages(path) == pages) is cached, setting
        with open(path, "rb") as f:
            assert f.read() == data
        d.cli("write", "f", "-", input=b"new" * 4, check=True)   # another path: dropped
        with open(path, "rb") as f:
            assert f.read(12) == b"new" * 4


def test_a_bad_write_only_setting_stops_the_start_naming_it(mounted_factory):
    d = mounted_factory(start=False, env={"GPUMEMD_MOUNT_WRITE_ONLY": "sometimes"})
    d.start(wait=False)
    assert d.proc.wait(30) != 0
    assert "GPUMEMD_MOUNT_WRITE_ONLY: invalid 'sometimes': expected direct or cached" in d.log()
