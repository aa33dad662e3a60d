"""POSIX checks for symbolic links, special files and renameat2's flags on a mounted gpumemd
(issue 15), in the style of posix.py: one helper per behaviour, each taking the mount point
and leaving the mount empty. test_posix.py runs them, each followed by `gpumemctl check`."""
from __future__ import annotations

import ctypes
import errno
import json
import os
import socket
import stat
import subprocess
import sys

from .posix import expect_errno

RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2
AT_FDCWD = -100
_libc = ctypes.CDLL(None, use_errno=True)


def renameat2(src: str, dst: str, flags: int) -> None:
    if _libc.renameat2(AT_FDCWD, os.fsencode(src), AT_FDCWD, os.fsencode(dst), flags) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), src)


def _write(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def tst_symlink_readlink_lstat(mnt: str) -> None:
    """A relative link: readlink gives the target as made, lstat the link (lrwxrwxrwx, size
    = the target's length), stat and open go through it, O_NOFOLLOW stops at it (ELOOP)."""
    t, link = os.path.join(mnt, "t"), os.path.join(mnt, "l")
    _write(t, b"through the link")
    os.symlink("t", link)
    assert os.readlink(link) == "t"
    lst, st = os.lstat(link), os.stat(link)
    assert stat.S_ISLNK(lst.st_mode) and stat.S_IMODE(lst.st_mode) == 0o777
    assert lst.st_size == 1 and lst.st_nlink == 1
    assert (lst.st_uid, lst.st_gid) == (os.getuid(), os.getgid())
    assert stat.S_ISREG(st.st_mode) and st.st_ino == os.stat(t).st_ino != lst.st_ino
    assert _read(link) == b"through the link"
    expect_errno(errno.ELOOP, os.open, link, os.O_RDONLY | os.O_NOFOLLOW)
    expect_errno(errno.EEXIST, os.symlink, "other", link)
    expect_errno(errno.EEXIST, os.symlink, "other", t)
    assert sorted(os.listdir(mnt)) == ["l", "t"]
    meta = json.loads(_read(os.path.join(mnt, ".metadata", "l")))
    assert (meta["type"], meta["target"]) == ("symlink", "t")
    os.rename(link, os.path.join(mnt, "l2"))             # a link renames as any name does
    assert os.readlink(os.path.join(mnt, "l2")) == "t"
    os.unlink(os.path.join(mnt, "l2"))                   # the link goes, its target stays
    assert _read(t) == b"through the link"
    os.unlink(t)


def tst_symlink_targets(mnt: str) -> None:
    """Absolute targets are plain strings the kernel follows; '..' in a relative target; a
    link to a directory is a way into it; the longest target (4095 bytes) and one too long."""
    d, t = os.path.join(mnt, "d"), os.path.join(mnt, "t")
    os.mkdir(d)
    _write(t, b"abc")
    os.symlink(t, os.path.join(d, "abs"))                 # absolute: through the host root
    assert os.readlink(os.path.join(d, "abs")) == t
    assert _read(os.path.join(d, "abs")) == b"abc"
    os.symlink("../t", os.path.join(d, "up"))
    assert _read(os.path.join(d, "up")) == b"abc"
    os.symlink("d", os.path.join(mnt, "dl"))
    _write(os.path.join(mnt, "dl", "made"), b"x")         # created through the link
    assert sorted(os.listdir(os.path.join(mnt, "dl"))) == ["abs", "made", "up"]
    expect_errno(errno.ENOTDIR, os.rmdir, os.path.join(mnt, "dl"))
    longest = "x/" * 2047 + "y"
    assert len(longest) == 4095
    os.symlink(longest, os.path.join(mnt, "long"))
    assert os.readlink(os.path.join(mnt, "long")) == longest
    assert os.lstat(os.path.join(mnt, "long")).st_size == 4095
    expect_errno(errno.ENAMETOOLONG, os.symlink, longest + "z", os.path.join(mnt, "toolong"))
    for name in ("long", "dl", "t", "d/abs", "d/up", "d/made"):
        os.unlink(os.path.join(mnt, name))
    os.rmdir(d)


def tst_symlink_dangling_and_loops(mnt: str) -> None:
    """A dangling link: lstat works, stat is ENOENT, O_CREAT through it makes the target.
    Loops (a pair, and a link to itself) are ELOOP."""
    dangling = os.path.join(mnt, "dangling")
    os.symlink("nowhere", dangling)
    assert stat.S_ISLNK(os.lstat(dangling).st_mode)
    expect_errno(errno.ENOENT, os.stat, dangling)
    expect_errno(errno.ENOENT, os.open, dangling, os.O_RDONLY)
    os.close(os.open(dangling, os.O_CREAT | os.O_WRONLY, 0o600))
    assert stat.S_ISREG(os.stat(os.path.join(mnt, "nowhere")).st_mode)
    a, b, me = (os.path.join(mnt, n) for n in ("a", "b", "me"))
    os.symlink("b", a)
    os.symlink("a", b)
    os.symlink("me", me)
    for path in (a, b, me, os.path.join(a, "inside")):
        expect_errno(errno.ELOOP, os.stat, path)
    expect_errno(errno.ELOOP, os.open, a, os.O_CREAT | os.O_WRONLY)
    for name in ("dangling", "nowhere", "a", "b", "me"):
        os.unlink(os.path.join(mnt, name))


def tst_symlink_attributes(mnt: str) -> None:
    """lchown and utimes(follow_symlinks=False) change the link, not its target."""
    t, link = os.path.join(mnt, "t"), os.path.join(mnt, "l")
    _write(t, b"")
    os.symlink("t", link)
    os.lchown(link, 4321, 4322)
    assert (os.lstat(link).st_uid, os.lstat(link).st_gid) == (4321, 4322)
    assert os.stat(t).st_uid == os.getuid()
    os.utime(link, ns=(10**18, 2 * 10**18), follow_symlinks=False)
    assert os.lstat(link).st_mtime_ns == 2 * 10**18
    assert os.stat(t).st_mtime_ns != 2 * 10**18
    os.unlink(link)
    os.unlink(t)


def tst_fifo(mnt: str) -> None:
    """mkfifo makes a FIFO (no memory); two processes pass data through it."""
    fifo = os.path.join(mnt, "fifo")
    os.mkfifo(fifo, 0o620)
    st = os.stat(fifo)
    assert stat.S_ISFIFO(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o620 & ~_umask()
    data = b"through the pipe\n" * 1000
    writer = subprocess.Popen([sys.executable, "-c",
                               "import sys; open(sys.argv[1], 'wb').write(sys.stdin.buffer"
                               ".read())", fifo], stdin=subprocess.PIPE)
    writer.stdin.write(data)
    writer.stdin.close()
    assert _read(fifo) == data
    assert writer.wait(timeout=30) == 0
    os.unlink(fifo)


def tst_device_nodes(mnt: str) -> None:
    """mknod of character and block devices keeps type and rdev; the mount is nodev, so
    opening one is EACCES and never reaches the device."""
    assert "nodev" in _mount_options(mnt)
    for kind, dev, name in ((stat.S_IFCHR, os.makedev(1, 3), "null"),
                            (stat.S_IFBLK, os.makedev(7, 0), "loop")):
        path = os.path.join(mnt, name)
        os.mknod(path, kind | 0o666, dev)
        st = os.lstat(path)
        assert stat.S_IFMT(st.st_mode) == kind and st.st_rdev == dev
        assert st.st_size == 0 and stat.S_IMODE(st.st_mode) == 0o666 & ~_umask()
        expect_errno(errno.EACCES, os.open, path, os.O_RDONLY)
        expect_errno(errno.EACCES, os.open, path, os.O_WRONLY)
        os.unlink(path)


def _mount_options(mnt: str) -> list[str]:
    with open("/proc/self/mounts") as f:
        for line in f:
            fields = line.split()
            if fields[1] == mnt:
                return fields[3].split(",")
    raise AssertionError(f"{mnt} is not mounted")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def tst_unix_socket(mnt: str) -> None:
    """bind() of a Unix socket makes an S_IFSOCK node; a client connects through it."""
    path = os.path.join(mnt, "sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(path)
        server.listen(1)
        assert stat.S_ISSOCK(os.stat(path).st_mode)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(path)
            conn, _ = server.accept()
            with conn:
                client.sendall(b"hello")
                assert conn.recv(5) == b"hello"
    finally:
        server.close()
    os.unlink(path)


def tst_rename_exchange(mnt: str) -> None:
    """RENAME_EXCHANGE swaps a file and a directory (contents travel with the directory);
    it needs both names; a directory cannot be swapped into its own subtree.
    RENAME_NOREPLACE refuses an existing name."""
    f, d = os.path.join(mnt, "f"), os.path.join(mnt, "d")
    _write(f, b"file")
    os.mkdir(d)
    _write(os.path.join(d, "inside"), b"in")
    ino_f, ino_d = os.stat(f).st_ino, os.stat(d).st_ino
    renameat2(f, d, RENAME_EXCHANGE)
    assert os.stat(f).st_ino == ino_d and stat.S_ISDIR(os.stat(f).st_mode)
    assert os.stat(d).st_ino == ino_f and _read(d) == b"file"
    assert _read(os.path.join(f, "inside")) == b"in"
    expect_errno(errno.ENOENT, renameat2, d, os.path.join(mnt, "missing"), RENAME_EXCHANGE)
    expect_errno(errno.EINVAL, renameat2, f, os.path.join(f, "inside"), RENAME_EXCHANGE)
    os.symlink("d", os.path.join(f, "link"))           # across directories, a link and a file
    renameat2(os.path.join(f, "link"), d, RENAME_EXCHANGE)
    assert os.readlink(d) == "d" and _read(os.path.join(f, "link")) == b"file"
    expect_errno(errno.EEXIST, renameat2, d, os.path.join(f, "inside"), RENAME_NOREPLACE)
    renameat2(d, os.path.join(mnt, "new"), RENAME_NOREPLACE)
    os.unlink(os.path.join(mnt, "new"))
    for name in ("inside", "link"):
        os.unlink(os.path.join(f, name))
    os.rmdir(f)


ALL = [tst_symlink_readlink_lstat, tst_symlink_targets, tst_symlink_dangling_and_loops,
       tst_symlink_attributes, tst_fifo, tst_device_nodes, tst_unix_socket,
       tst_rename_exchange]
