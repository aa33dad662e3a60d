"""POSIX checks for hard links on a mounted gpumemd (issue 15), in the style of posix.py: one
helper per behaviour, each taking the mount point and leaving the mount empty. test_posix.py
runs them, each followed by `gpumemctl check`."""
from __future__ import annotations

import errno
import os
import stat
import time

from .posix import expect_errno, pattern
from .posix_links import RENAME_EXCHANGE, _read, _write, renameat2

MiB = 1 << 20


def tst_hardlink_one_file_two_names(mnt: str) -> None:
    """link(2): the same inode under two names, st_nlink 2 on each; a write through one
    name is read through the other; the link moves ctime, not mtime; unlink of one name
    leaves the other with the bytes and st_nlink 1."""
    a, b = os.path.join(mnt, "a"), os.path.join(mnt, "b")
    _write(a, pattern(MiB))
    before = os.stat(a)
    time.sleep(0.01)
    os.link(a, b)
    sa, sb = os.stat(a), os.stat(b)
    assert sa.st_ino == sb.st_ino == before.st_ino
    assert sa.st_nlink == sb.st_nlink == 2
    assert sa.st_ctime_ns > before.st_ctime_ns and sa.st_mtime_ns == before.st_mtime_ns
    assert sorted(os.listdir(mnt)) == ["a", "b"]
    with open(b, "r+b") as f:
        f.write(b"through b")
    assert _read(a)[:9] == b"through b" and len(_read(a)) == MiB
    os.unlink(a)
    assert os.stat(b).st_nlink == 1
    assert _read(b) == b"through b" + pattern(MiB)[9:]
    expect_errno(errno.ENOENT, os.stat, a)
    os.unlink(b)


def tst_hardlink_across_directories(mnt: str) -> None:
    """Names in different directories: the directories' link counts do not move (only
    subdirectories count there), each directory lists its own name, and the file outlives
    the removal of the directory that held its first name."""
    d1, d2 = os.path.join(mnt, "d1"), os.path.join(mnt, "d2")
    os.mkdir(d1)
    os.mkdir(d2)
    f, g = os.path.join(d1, "f"), os.path.join(d2, "g")
    _write(f, b"shared")
    os.link(f, g)
    assert os.stat(d1).st_nlink == os.stat(d2).st_nlink == 2
    assert os.listdir(d1) == ["f"] and os.listdir(d2) == ["g"]
    assert os.stat(g).st_nlink == 2 and os.stat(g).st_ino == os.stat(f).st_ino
    expect_errno(errno.ENOTEMPTY, os.rmdir, d1)
    os.unlink(f)
    os.rmdir(d1)
    assert _read(g) == b"shared" and os.stat(g).st_nlink == 1
    os.unlink(g)
    os.rmdir(d2)


def tst_hardlink_unlink_while_open(mnt: str) -> None:
    """A file open through one name: unlink of that name leaves it reachable by the other;
    unlink of the last leaves the descriptor working with st_nlink 0 until it is closed."""
    a, b = os.path.join(mnt, "open-a"), os.path.join(mnt, "open-b")
    _write(a, b"kept open")
    os.link(a, b)
    fd = os.open(a, os.O_RDWR)
    try:
        os.unlink(a)
        assert os.fstat(fd).st_nlink == 1
        os.pwrite(fd, b"KEPT", 0)
        assert _read(b) == b"KEPT open"
        os.unlink(b)
        assert os.fstat(fd).st_nlink == 0
        assert os.pread(fd, 9, 0) == b"KEPT open"
    finally:
        os.close(fd)
    assert os.listdir(mnt) == []


def tst_hardlink_rename(mnt: str) -> None:
    """rename(2) of a name over another name of the same file does nothing and succeeds
    (POSIX); a rename of a third file over one name of a hard-linked file replaces only
    that name: the other keeps the bytes."""
    a, b, c = (os.path.join(mnt, n) for n in ("ra", "rb", "rc"))
    _write(a, b"linked")
    os.link(a, b)
    os.rename(a, b)
    assert sorted(os.listdir(mnt)) == ["ra", "rb"] and os.stat(a).st_nlink == 2
    _write(c, b"replacement")
    os.rename(c, a)
    assert _read(a) == b"replacement" and os.stat(a).st_nlink == 1
    assert _read(b) == b"linked" and os.stat(b).st_nlink == 1
    os.rename(b, os.path.join(mnt, "moved"))          # a lone name moves as any file
    assert _read(os.path.join(mnt, "moved")) == b"linked"
    for name in ("ra", "moved"):
        os.unlink(os.path.join(mnt, name))


def tst_hardlink_exchange(mnt: str) -> None:
    """RENAME_EXCHANGE with a second name of a hard-linked file: the names trade places,
    the link count stays."""
    a, b, other = (os.path.join(mnt, n) for n in ("xa", "xb", "xo"))
    os.mkdir(os.path.join(mnt, "xd"))
    in_dir = os.path.join(mnt, "xd", "xb2")
    _write(a, b"linked")
    os.link(a, in_dir)
    _write(other, b"other")
    renameat2(in_dir, other, RENAME_EXCHANGE)
    assert _read(other) == b"linked" and _read(in_dir) == b"other"
    assert os.stat(other).st_nlink == 2 and os.stat(other).st_ino == os.stat(a).st_ino
    renameat2(a, other, RENAME_EXCHANGE)             # two names of one file: nothing moves
    assert _read(a) == _read(other) == b"linked"
    os.rename(in_dir, b)
    for name in ("xa", "xb", "xo"):
        os.unlink(os.path.join(mnt, name))
    os.rmdir(os.path.join(mnt, "xd"))


def tst_hardlink_errors_and_kinds(mnt: str) -> None:
    """No hard link to a directory (EPERM) or over an existing name (EEXIST); a symbolic
    link and a FIFO take a second name as files do (link(2) does not follow)."""
    d, f = os.path.join(mnt, "hd"), os.path.join(mnt, "hf")
    os.mkdir(d)
    _write(f, b"x")
    expect_errno(errno.EPERM, os.link, d, os.path.join(mnt, "hd2"))
    expect_errno(errno.EEXIST, os.link, f, d)
    expect_errno(errno.ENOENT, os.link, os.path.join(mnt, "nothing"), os.path.join(mnt, "n"))
    link, link2 = os.path.join(mnt, "sl"), os.path.join(mnt, "sl2")
    os.symlink("hf", link)
    os.link(link, link2, follow_symlinks=False)
    assert stat.S_ISLNK(os.lstat(link2).st_mode) and os.readlink(link2) == "hf"
    assert os.lstat(link).st_nlink == 2 and os.stat(f).st_nlink == 1
    fifo, fifo2 = os.path.join(mnt, "ff"), os.path.join(mnt, "ff2")
    os.mkfifo(fifo)
    os.link(fifo, fifo2)
    assert stat.S_ISFIFO(os.lstat(fifo2).st_mode) and os.lstat(fifo).st_nlink == 2
    for name in ("hf", "sl", "sl2", "ff", "ff2"):
        os.unlink(os.path.join(mnt, name))
    os.rmdir(d)


ALL = [tst_hardlink_one_file_two_names, tst_hardlink_across_directories,
       tst_hardlink_unlink_while_open, tst_hardlink_rename, tst_hardlink_exchange,
       tst_hardlink_errors_and_kinds]
