"""POSIX behaviour checks for a mounted gpumemd, one function per operation, in the style of
pyfuse3's test_examples.py (tst_* helpers that take the mount point). test_posix.py runs them
on the host backend in CI; tests/gpu runs the same functions on the cuda backend.

Each helper leaves the mount as it found it (everything it made is removed), so they can run
one after another on one mount.
"""
from __future__ import annotations

import errno
import os
import stat
import struct
import time

MiB = 1 << 20


def pattern(n: int, seed: int = 0) -> bytes:
    block = bytes((i * 7 + seed) & 0xFF for i in range(4096))
    return (block * (n // 4096 + 1))[:n]


def expect_errno(code: int, fn, *args, **kw) -> None:
    try:
        fn(*args, **kw)
    except OSError as exc:
        assert exc.errno == code, f"{fn.__name__}{args}: errno {exc.errno} " \
                                  f"({os.strerror(exc.errno)}), wanted {errno.errorcode[code]}"
    else:
        raise AssertionError(f"{fn.__name__}{args} succeeded, wanted {errno.errorcode[code]}")


def listing(path: str) -> list[str]:
    return sorted(os.listdir(path))


def tst_create_empty(mnt: str) -> None:
    f = os.path.join(mnt, "empty")
    fd = os.open(f, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o640)
    os.close(fd)
    st = os.stat(f)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o640
    assert st.st_size == 0 and st.st_nlink == 1
    assert (st.st_uid, st.st_gid) == (os.getuid(), os.getgid())
    assert "empty" in listing(mnt)
    expect_errno(errno.EEXIST, os.open, f, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    with open(f, "rb") as fh:
        assert fh.read() == b""
    os.unlink(f)
    expect_errno(errno.ENOENT, os.stat, f)


def tst_write_read(mnt: str) -> None:
    f = os.path.join(mnt, "data")
    data = pattern(3 * MiB + 123)
    with open(f, "wb") as fh:
        fh.write(data)
    assert os.stat(f).st_size == len(data)
    with open(f, "rb") as fh:
        assert fh.read() == data
    fd = os.open(f, os.O_RDWR)
    try:
        os.pwrite(fd, b"XYZ", 5)
        assert os.pread(fd, 10, 0) == data[:5] + b"XYZ" + data[8:10]
        assert os.pread(fd, 100, len(data) - 10) == data[-10:]      # short read at the end
        assert os.pread(fd, 100, len(data) + 5) == b""              # past the end
        os.pwrite(fd, b"tail", len(data) + 4096)                    # a hole, then data
        assert os.fstat(fd).st_size == len(data) + 4100
        assert os.pread(fd, 4100, len(data)) == bytes(4096) + b"tail"
    finally:
        os.close(fd)
    os.unlink(f)


def tst_append(mnt: str) -> None:
    f = os.path.join(mnt, "log")
    for i in range(5):
        with open(f, "ab") as fh:
            fh.write(b"line %d\n" % i)
    with open(f, "rb") as fh:
        assert fh.read() == b"".join(b"line %d\n" % i for i in range(5))
    os.unlink(f)


def tst_truncate(mnt: str) -> None:
    f = os.path.join(mnt, "trunc")
    data = pattern(3 * MiB)
    with open(f, "wb") as fh:
        fh.write(data)
    os.truncate(f, 1000)
    assert os.stat(f).st_size == 1000
    os.truncate(f, 5 * MiB)                 # grows: the new part reads as zeros
    with open(f, "rb") as fh:
        assert fh.read() == data[:1000] + bytes(5 * MiB - 1000)
    with open(f, "r+b") as fh:               # ftruncate on an open descriptor
        fh.truncate(0)
        assert os.fstat(fh.fileno()).st_size == 0
    with open(f, "wb") as fh:                # O_TRUNC, then write
        fh.write(b"new")
    with open(f, "rb") as fh:
        assert fh.read() == b"new"
    os.unlink(f)


def tst_unlink_open(mnt: str) -> None:
    """An unlinked file stays readable and writable through its open descriptor."""
    f = os.path.join(mnt, "ghost")
    with open(f, "wb") as fh:
        fh.write(pattern(MiB))
    fd = os.open(f, os.O_RDWR)
    try:
        os.unlink(f)
        assert "ghost" not in listing(mnt)
        expect_errno(errno.ENOENT, os.stat, f)
        assert os.fstat(fd).st_nlink == 0
        assert os.pread(fd, MiB, 0) == pattern(MiB)
        os.pwrite(fd, b"still here", 0)
        assert os.pread(fd, 10, 0) == b"still here"
    finally:
        os.close(fd)


def tst_mkdir_rmdir(mnt: str) -> None:
    d = os.path.join(mnt, "dir")
    os.mkdir(d, 0o750)
    st = os.stat(d)
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o750
    assert st.st_nlink == 2
    os.mkdir(os.path.join(d, "sub"))
    assert os.stat(d).st_nlink == 3
    with open(os.path.join(d, "sub", "f"), "wb") as fh:
        fh.write(b"x")
    expect_errno(errno.EEXIST, os.mkdir, d)
    expect_errno(errno.ENOTEMPTY, os.rmdir, os.path.join(d, "sub"))
    expect_errno(errno.ENOTDIR, os.rmdir, os.path.join(d, "sub", "f"))
    expect_errno(errno.EISDIR, os.unlink, os.path.join(d, "sub"))
    expect_errno(errno.ENOTDIR, os.mkdir, os.path.join(d, "sub", "f", "x"))
    os.unlink(os.path.join(d, "sub", "f"))
    os.rmdir(os.path.join(d, "sub"))
    os.rmdir(d)
    assert "dir" not in listing(mnt)


def tst_readdir(mnt: str) -> None:
    d = os.path.join(mnt, "many")
    os.mkdir(d)
    names = [f"f{i:04d}" for i in range(300)]      # more than one readdir reply
    for name in names:
        os.close(os.open(os.path.join(d, name), os.O_CREAT | os.O_WRONLY))
    os.mkdir(os.path.join(d, "subdir"))
    assert listing(d) == sorted(names + ["subdir"])
    kinds = {e.name: e.is_dir() for e in os.scandir(d)}
    assert kinds["subdir"] and not kinds["f0000"]
    for name in names:
        os.unlink(os.path.join(d, name))
    os.rmdir(os.path.join(d, "subdir"))
    os.rmdir(d)


def tst_rename(mnt: str) -> None:
    a, b = os.path.join(mnt, "a"), os.path.join(mnt, "b")
    d = os.path.join(mnt, "d")
    os.mkdir(d)
    with open(a, "wb") as fh:
        fh.write(b"AAAA")
    with open(b, "wb") as fh:
        fh.write(b"BB")
    ino = os.stat(a).st_ino
    os.rename(a, b)                          # over an existing file
    assert listing(mnt).count("a") == 0
    with open(b, "rb") as fh:
        assert fh.read() == b"AAAA"
    assert os.stat(b).st_ino == ino          # the same allocation under its new name
    os.rename(b, os.path.join(d, "c"))       # across directories
    with open(os.path.join(d, "c"), "rb") as fh:
        assert fh.read() == b"AAAA"
    os.mkdir(os.path.join(mnt, "e"))
    os.rename(d, os.path.join(mnt, "e", "d"))     # a directory, with its contents
    with open(os.path.join(mnt, "e", "d", "c"), "rb") as fh:
        assert fh.read() == b"AAAA"
    expect_errno(errno.EINVAL, os.rename, os.path.join(mnt, "e"),
                 os.path.join(mnt, "e", "d", "x"))        # into its own subtree
    os.mkdir(os.path.join(mnt, "full"))
    os.close(os.open(os.path.join(mnt, "full", "x"), os.O_CREAT | os.O_WRONLY))
    expect_errno(errno.ENOTEMPTY, os.rename, os.path.join(mnt, "e"),
                 os.path.join(mnt, "full"))
    expect_errno(errno.EISDIR, os.rename, os.path.join(mnt, "full", "x"),
                 os.path.join(mnt, "e"))
    expect_errno(errno.ENOTDIR, os.rename, os.path.join(mnt, "e"),
                 os.path.join(mnt, "full", "x"))
    os.unlink(os.path.join(mnt, "full", "x"))
    os.rename(os.path.join(mnt, "e"), os.path.join(mnt, "full"))   # over an empty dir
    os.unlink(os.path.join(mnt, "full", "d", "c"))
    os.rmdir(os.path.join(mnt, "full", "d"))
    os.rmdir(os.path.join(mnt, "full"))
    assert listing(mnt) == []


def tst_chmod_chown_utimes(mnt: str) -> None:
    f = os.path.join(mnt, "attrs")
    os.close(os.open(f, os.O_CREAT | os.O_WRONLY, 0o600))
    os.chmod(f, 0o644)
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o644
    os.utime(f, ns=(1_000_000_000, 1_500_000_000_123))
    assert os.stat(f).st_mtime_ns == 1_500_000_000_123
    before = time.time_ns()
    os.utime(f)              # now: the kernel's coarse clock, up to a tick behind time_ns()
    assert os.stat(f).st_mtime_ns >= before - 100_000_000
    if os.geteuid() == 0:
        os.chown(f, 1234, 5678)
        st = os.stat(f)
        assert (st.st_uid, st.st_gid) == (1234, 5678)
    os.unlink(f)


def tst_mtime_follows_writes(mnt: str) -> None:
    f = os.path.join(mnt, "times")
    os.close(os.open(f, os.O_CREAT | os.O_WRONLY))
    os.utime(f, ns=(0, 0))
    with open(f, "ab") as fh:
        fh.write(b"x")
    assert os.stat(f).st_mtime_ns > 0
    os.unlink(f)


def tst_fsync(mnt: str) -> None:
    f = os.path.join(mnt, "synced")
    fd = os.open(f, os.O_CREAT | os.O_RDWR)
    try:
        os.write(fd, pattern(MiB))
        os.fsync(fd)
        os.fdatasync(fd)
        assert os.pread(fd, MiB, 0) == pattern(MiB)
    finally:
        os.close(fd)
    os.unlink(f)


def tst_statfs(mnt: str) -> None:
    s = os.statvfs(mnt)
    assert s.f_blocks > 0 and 0 < s.f_bavail <= s.f_blocks
    before = s.f_bavail * s.f_frsize
    f = os.path.join(mnt, "space")
    with open(f, "wb") as fh:
        fh.write(pattern(8 * MiB))
    after = os.statvfs(mnt)
    assert after.f_bavail * after.f_frsize <= before - 8 * MiB
    assert after.f_namemax == 255
    os.unlink(f)


def tst_bad_names(mnt: str) -> None:
    expect_errno(errno.ENAMETOOLONG, os.open, os.path.join(mnt, "x" * 256),
                 os.O_CREAT | os.O_WRONLY)
    # A name that is not UTF-8 is no bad name (EINVAL until issue 14): names are bytes, as
    # on tmpfs (tests/security/test_non_utf8_names.py).
    expect_errno(errno.EEXIST, os.mkdir, os.path.join(mnt, ".metadata"))


def getdents(path: str) -> list[tuple[str, int, int]]:
    """(name, d_ino, d_off) of every entry, as getdents64(2) returns them: unlike
    os.listdir and os.scandir it keeps "." and "..", and d_ino is the filesystem's own
    number (ls -i and stat(2) show the mounted-on directory's for the mount's "..")."""
    import ctypes
    number = {"x86_64": 217, "aarch64": 61}[os.uname().machine]
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(1 << 16)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    out = []
    try:
        while (n := libc.syscall(number, fd, buf, len(buf))) > 0:
            at = 0
            while at < n:       # struct linux_dirent64: ino u64, off s64, reclen u16, type u8
                ino, off, reclen = struct.unpack_from("<QqH", buf.raw, at)
                name = buf.raw[at + 19:at + reclen].split(b"\0", 1)[0]
                out.append((os.fsdecode(name), ino, off))
                at += reclen
        if n < 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()), path)
    finally:
        os.close(fd)
    return out


def tst_dot_entries(mnt: str) -> None:
    """Every directory lists "." and ".." first, with their inode numbers; the root's ".."
    is the root; offsets count up from 1 (a listing resumes where it stopped)."""
    d = os.path.join(mnt, "dots")
    os.mkdir(d)
    os.mkdir(os.path.join(d, "sub"))
    os.close(os.open(os.path.join(d, "f"), os.O_CREAT | os.O_WRONLY))
    root_ino, d_ino = os.stat(mnt).st_ino, os.stat(d).st_ino
    assert getdents(d) == [(".", d_ino, 1), ("..", root_ino, 2),
                           ("f", os.stat(os.path.join(d, "f")).st_ino, 3),
                           ("sub", os.stat(os.path.join(d, "sub")).st_ino, 4)]
    sub = getdents(os.path.join(d, "sub"))
    assert [(name, ino) for name, ino, _ in sub] == [(".", os.stat(
        os.path.join(d, "sub")).st_ino), ("..", d_ino)]
    top = getdents(mnt)
    assert top[:2] == [(".", root_ino, 1), ("..", root_ino, 2)]
    assert [name for name, _, _ in top[2:]] == ["dots"]        # .metadata stays hidden
    meta = os.path.join(mnt, ".metadata")
    meta_root, meta_d = os.stat(meta).st_ino, os.stat(os.path.join(meta, "dots")).st_ino
    assert getdents(meta)[:2] == [(".", meta_root, 1), ("..", root_ino, 2)]
    assert [(n, i) for n, i, _ in getdents(os.path.join(meta, "dots"))] == [
        (".", meta_d), ("..", meta_root),
        ("f", os.stat(os.path.join(meta, "dots", "f")).st_ino),
        ("sub", os.stat(os.path.join(meta, "dots", "sub")).st_ino)]
    assert listing(d) == ["f", "sub"]                        # readdir(3) users see no change
    os.unlink(os.path.join(d, "f"))
    os.rmdir(os.path.join(d, "sub"))
    os.rmdir(d)


def tst_overwrite_truncates(mnt: str) -> None:
    """open(O_TRUNC) of an existing file empties it before the new bytes go in."""
    f = os.path.join(mnt, "over")
    with open(f, "wb") as fh:
        fh.write(pattern(3 * MiB))
    with open(f, "wb") as fh:
        fh.write(b"short")
    with open(f, "rb") as fh:
        assert fh.read() == b"short"
    os.close(os.open(f, os.O_WRONLY | os.O_TRUNC))
    assert os.stat(f).st_size == 0
    os.unlink(f)


ALL = [tst_create_empty, tst_write_read, tst_append, tst_truncate, tst_unlink_open,
       tst_mkdir_rmdir, tst_readdir, tst_rename, tst_chmod_chown_utimes,
       tst_mtime_follows_writes, tst_fsync, tst_statfs, tst_bad_names,
       tst_dot_entries, tst_overwrite_truncates]
