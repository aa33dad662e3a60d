"""POSIX rules of the mount that issue 12 found missing: set-id bits cleared by writes and
truncates of unprivileged processes, access times (stored, relatime on reads, kept across a
crash), and EFBIG for a size no device could ever hold. ("." and "..": posix.py,
tst_dot_entries.)"""
from __future__ import annotations

import errno
import os
import stat
import subprocess

import pytest

from tests.users import NOBODY, run_as

from .posix import expect_errno

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")
OLD_NS = 1_000_000_000          # 1970-01-01T00:00:01: any real update is later


def mode_of(path: str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def make(path: str, mode: int, data: bytes = b"old") -> None:
    with open(path, "wb") as fh:
        fh.write(data)
    os.chmod(path, mode)
    assert mode_of(path) == mode


# ---- set-user-ID and set-group-ID ------------------------------------------------------------
def _nobody_does(action: str, path: str):
    """In a child running as uid/gid 65534 (no capabilities): write or truncate `path`."""

    def act():
        if action == "write":
            fd = os.open(path, os.O_WRONLY)
            try:
                os.pwrite(fd, b"nobody", 0)
            finally:
                os.close(fd)
        elif action == "ftruncate":
            fd = os.open(path, os.O_WRONLY)
            try:
                os.ftruncate(fd, 1)
            finally:
                os.close(fd)
        elif action == "truncate":
            os.truncate(path, 2)
        else:                                            # open(O_TRUNC)
            os.close(os.open(path, os.O_WRONLY | os.O_TRUNC))
        return True

    assert run_as(act) is True


@root_only
@pytest.mark.parametrize("action", ["write", "truncate", "ftruncate", "o_trunc"])
@pytest.mark.parametrize("before,group,after", [
    (0o4777, 0, 0o0777),          # set-user-ID always goes
    (0o2777, 0, 0o0777),          # set-group-ID goes where group-exec is set,
    (0o2777, NOBODY, 0o0777),     # even for a member of the file's group
    (0o6777, 0, 0o0777),
    (0o2767, 0, 0o0767),          # without group-exec: for a process outside the group,
    (0o2767, NOBODY, 0o2767),     # not for a member (tmpfs does the same on this kernel)
])
def test_an_unprivileged_write_or_truncate_clears_setid(mounted, action, before, group,
                                                       after):
    f = os.path.join(mounted.mnt, "f")
    make(f, before)
    os.chown(f, 0, group)
    os.chmod(f, before)                      # chown clears the bits; set them again
    _nobody_does(action, f)
    assert mode_of(f) == after
    assert mounted.cli_json("info", "f")["mode"] == f"{after:04o}"      # stored, not cached


@root_only
def test_root_writes_and_truncates_keep_setid(mounted):
    """Root holds CAP_FSETID: its writes and truncates leave the bits alone (as on tmpfs)."""
    f = os.path.join(mounted.mnt, "f")
    make(f, 0o6777)
    with open(f, "r+b") as fh:
        fh.write(b"root writes")
    os.truncate(f, 3)
    os.close(os.open(f, os.O_WRONLY | os.O_TRUNC))
    assert mode_of(f) == 0o6777


@root_only
def test_setid_cleared_once_and_the_data_written(mounted):
    f = os.path.join(mounted.mnt, "f")
    make(f, 0o4777, b"0123456789")
    _nobody_does("write", f)
    with open(f, "rb") as fh:
        assert fh.read() == b"nobody6789"
    os.chmod(f, 0o4755)                     # the owner may set it again
    assert mode_of(f) == 0o4755


@root_only
def test_a_write_to_an_unlinked_setid_file_still_works(mounted):
    f = os.path.join(mounted.mnt, "f")
    make(f, 0o644)
    os.chown(f, NOBODY, NOBODY)
    os.chmod(f, 0o4777)

    def write_after_unlink():
        fd = os.open(f, os.O_RDWR)
        try:
            os.unlink(f)                         # nobody owns it: the sticky root allows it
            os.pwrite(fd, b"still", 0)
            return os.pread(fd, 5, 0).decode()
        finally:
            os.close(fd)

    assert run_as(write_after_unlink) == "still"


# ---- access time -----------------------------------------------------------------------------
def test_utimensat_sets_the_access_time(mounted):
    f = os.path.join(mounted.mnt, "f")
    make(f, 0o644)
    os.utime(f, ns=(1_111_111_111_000, 2_222_222_222_000))
    st = os.stat(f)
    assert (st.st_atime_ns, st.st_mtime_ns) == (1_111_111_111_000, 2_222_222_222_000)


def test_touch_a_changes_only_the_access_time(mounted):
    f = os.path.join(mounted.mnt, "f")
    make(f, 0o644)
    os.utime(f, ns=(OLD_NS, OLD_NS))
    subprocess.run(["touch", "-a", f], check=True)
    st = os.stat(f)
    assert st.st_atime_ns > OLD_NS and st.st_mtime_ns == OLD_NS
    subprocess.run(["touch", "-a", "-d", "2001-02-03 04:05:06Z", f], check=True)
    assert os.stat(f).st_atime_ns == 981173106 * 10**9


def test_a_read_moves_the_access_time_by_relatime(mounted):
    """Linux's relatime: a read updates atime when it is not after mtime/ctime (or is a
    day old); a second read right after leaves it."""
    f = os.path.join(mounted.mnt, "f")
    make(f, 0o644, b"read me")
    st = os.stat(f)
    os.utime(f, ns=(st.st_mtime_ns - 10**9, st.st_mtime_ns))     # atime before mtime
    with open(f, "rb") as fh:
        assert fh.read() == b"read me"
    first = os.stat(f).st_atime_ns
    assert first > os.stat(f).st_mtime_ns
    with open(f, "rb") as fh:
        fh.read()
    assert os.stat(f).st_atime_ns == first           # newer than mtime and ctime: left
    os.utime(f, ns=(first, first + 10**9))          # written since (mtime after atime)
    with open(f, "rb") as fh:
        fh.read()
    assert os.stat(f).st_atime_ns > first


def test_a_listing_moves_a_directory_access_time(mounted):
    d = os.path.join(mounted.mnt, "d")
    os.mkdir(d)
    os.utime(d, ns=(1_000_000_000, 2_000_000_000))
    os.listdir(d)
    assert os.stat(d).st_atime_ns > 2_000_000_000


def test_access_times_survive_kill9(mounted):
    f, g = os.path.join(mounted.mnt, "keep"), os.path.join(mounted.mnt, "read")
    d = os.path.join(mounted.mnt, "dir")
    for path in (f, g):
        make(path, 0o644, b"durable")
        os.setxattr(path, "user.gpu.durable", b"true")
    os.mkdir(d)
    os.utime(f, ns=(1_234_567_890_123, 2_000_000_000_000))
    os.utime(d, ns=(1_500_000_000_000, 2_000_000_000_000))
    os.utime(g, ns=(1_000_000_000, 2_000_000_000))
    with open(g, "rb") as fh:                       # relatime: this read moves it
        fh.read()
    read_at = os.stat(g).st_atime_ns
    assert read_at > 2_000_000_000
    mounted.kill9()
    mounted.start()
    assert os.stat(f).st_atime_ns == 1_234_567_890_123
    assert os.stat(d).st_atime_ns == 1_500_000_000_000
    assert os.stat(g).st_atime_ns == read_at
    mounted.cli("check", check=True)


# ---- EFBIG: larger than any device -----------------------------------------------------------
def device_total(mounted) -> int:
    return max(d["total"] for d in mounted.cli_json("devices"))


def test_a_size_no_device_could_hold_is_efbig(mounted):
    f = os.path.join(mounted.mnt, "f")
    os.close(os.open(f, os.O_CREAT | os.O_WRONLY))
    too_big = 2 * device_total(mounted)
    expect_errno(errno.EFBIG, os.truncate, f, too_big)
    expect_errno(errno.EFBIG, os.setxattr, f, "user.gpu.size", str(too_big).encode())
    fd = os.open(f, os.O_WRONLY)
    try:
        expect_errno(errno.EFBIG, os.ftruncate, fd, too_big)
        expect_errno(errno.EFBIG, os.pwrite, fd, b"x", too_big)
    finally:
        os.close(fd)
    assert os.getxattr(f, "user.gpu.state") == b"pending"


def test_the_cli_says_a_create_exceeds_the_device_total_and_exits_7(mounted):
    total = device_total(mounted)
    proc = mounted.cli("create", "huge", "--size", str(2 * total), check=7)
    err = proc.stderr.decode().strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("gpumemctl: error: out of memory on device ")
    assert f"({2 * total} bytes) requested" in err
    assert err.endswith("that exceeds the device's total memory: no device here could ever "
                        "hold it")
    assert mounted.cli_json("ls") == []
