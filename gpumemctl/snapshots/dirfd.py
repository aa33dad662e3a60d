"""A directory store's files, reached only through directory descriptors (issue 24).

A store may be a directory other users can create names in (a 1777 directory, a group's
fleet store): any name in it, or in a snapshot directory someone else made, may be swapped
for a symlink, a FIFO or a device between two system calls. So nothing here resolves a path
below the store's root: the root is opened once (its own path is the caller's choice), each
directory under it with openat(O_DIRECTORY|O_NOFOLLOW), each file with
openat(O_NOFOLLOW|O_NONBLOCK) and then fstat'ed (only a regular file is used: a FIFO never
blocks the open, a symlink never reaches /dev/zero or root's files). New files are made with
O_CREAT|O_EXCL|O_NOFOLLOW, and names are removed with unlinkat/rmdir relative to the
descriptor of the directory that holds them, so a swapped name is never followed.
"""
from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable

from ..localfiles import kind_of as kind
from .manifest import SnapshotDamaged

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
NEW_FILE_FLAGS = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
Check = Callable[[os.stat_result, str], None]      # raises where the entry is not trusted


class NotPlain(SnapshotDamaged):
    """A store entry that is not what a snapshot has there (a symlink where its directory
    should be, a FIFO for its manifest): exit 8, never followed or read."""


def lstat_at(dir_fd: int, name: str) -> os.stat_result:
    return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)


def open_root(path: str) -> int:
    """The store's root directory: its path may go through symlinks the caller chose."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def open_dir(dir_fd: int, name: str, where: str, check: Check | None = None) -> int:
    """The directory `name` in `dir_fd`; NotPlain if it is anything else (a symlink too).
    `check(stat, where)`, the caller's owner check, sees the entry before its type counts:
    someone else's symlink is refused as theirs."""
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        st = lstat_at(dir_fd, name)
        if check is not None:
            check(st, where)
        raise NotPlain(f"{where} is {kind(st.st_mode)}, not a snapshot directory") from None
    if check is not None:
        try:
            check(os.fstat(fd), where)
        except BaseException:
            os.close(fd)
            raise
    return fd


def open_file(dir_fd: int, name: str, where: str, flags: int = os.O_RDONLY,
              check: Check | None = None) -> tuple[int, os.stat_result]:
    """An existing regular file `name` in `dir_fd`, and its fstat; NotPlain for anything
    else (O_NONBLOCK: a FIFO does not block the open; it is refused after it). `check` as
    for open_dir."""
    try:
        fd = os.open(name, flags | FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        if check is not None:
            check(lstat_at(dir_fd, name), where)
        raise NotPlain(f"{where} is a symbolic link, not a snapshot file") from None
    try:
        st = os.fstat(fd)
        if check is not None:
            check(st, where)
        if not stat.S_ISREG(st.st_mode):
            raise NotPlain(f"{where} is {kind(st.st_mode)}, not a snapshot file")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def create_file(dir_fd: int, name: str, mode: int = 0o600) -> int:
    """A new file made by this call (never an existing one, never through a symlink)."""
    return os.open(name, os.O_WRONLY | NEW_FILE_FLAGS, mode, dir_fd=dir_fd)


def read_bounded(fd: int, limit: int) -> bytes:
    """At most limit+1 bytes from the start (the caller sees that more was there)."""
    out = bytearray()
    while len(out) <= limit:
        piece = os.pread(fd, min(limit + 1 - len(out), 8 << 20), len(out))
        if not piece:
            break
        out += piece
    return bytes(out)


def proc_path(fd: int) -> str:
    """A path that opens the very file `fd` is open on (KvikIO and O_DIRECT open by path):
    /proc's magic link, never the name in the store, which may have been swapped since."""
    return f"/proc/self/fd/{fd}"


def reopen(fd: int, flags: int) -> int:
    """The same file again, with a file description of its own (O_DIRECT, say)."""
    return os.open(proc_path(fd), flags | os.O_CLOEXEC)


def entries(dir_fd: int) -> list[tuple[str, bool]]:
    """(name, is a directory) of each entry; a symlink is never a directory here."""
    with os.scandir(dir_fd) as it:
        return [(e.name, e.is_dir(follow_symlinks=False)) for e in it]


def same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
