"""The local files a command reads and writes, for a caller who may be root working in
directories other users can write (issue 24; docs/cli.md, "Local files").

Errors: an OSError on a path the user named becomes one line naming the path and the
errno's words, and the exit status of its errno (`file_error`; gpumemctl/cli/context.py
`report` is where every command's errors meet).

Output (`save`): a file is written crash-safe, never through a name someone else chose:
- OUT's parent directory is resolved once and opened; every create, rename and fsync after
  that is relative to that fd, so a directory swapped on the way changes nothing.
- What OUT is decides: a regular file or a new name is replaced by rename; a symbolic link
  is refused (it is neither followed nor replaced: the link's owner chose its target, the
  caller named the link); a device, FIFO, socket or directory is refused. Nothing is
  changed when refused.
- The temporary file is created O_CREAT|O_EXCL|O_NOFOLLOW under a random name: a symlink or
  file planted there is never opened (EEXIST: another random name). O_TMPFILE + linkat
  was not taken: linkat cannot replace an existing OUT, so a named temporary is needed
  anyway, and some file systems (FUSE, NFS) lack O_TMPFILE.
- A directory OUT is made if missing (its parent must exist) and opened O_NOFOLLOW; the
  directories below it (a shard `a/b.safetensors`) likewise, each by the fd of the one
  above: a symlink planted inside OUT is refused, not followed.
"""
from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from typing import BinaryIO

from .output import STDIN_NAME, STDOUT_NAME
from .protocol import (
    Busy,
    Exists,
    GpumemError,
    NoMemory,
    NotFound,
    PermissionDenied,
    UsageError,
)

# errno -> the error class (its exit code) of a local path: docs/cli.md, "Local files".
# Anything else (EISDIR, ELOOP, ENAMETOOLONG, EIO, ENXIO...) is a usage error (2).
_BY_ERRNO: dict[int, type[GpumemError]] = {
    errno.ENOENT: NotFound, errno.ENOTDIR: NotFound,
    errno.EACCES: PermissionDenied, errno.EPERM: PermissionDenied,
    errno.EROFS: PermissionDenied,
    errno.ENOSPC: NoMemory, errno.EDQUOT: NoMemory, errno.EFBIG: NoMemory,
    errno.EEXIST: Exists,
    errno.EBUSY: Busy, errno.ETXTBSY: Busy,
}
_SHOWN = {STDOUT_NAME: ("stdout", "write to"), STDIN_NAME: ("stdin", "read from")}
_KINDS = [(stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISLNK, "a symbolic link")]
NAME_MAX = 255                      # bytes in one path component (Linux)
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_TEMP_TRIES = 16


def file_error(exc: OSError, path: str | None = None, doing: str | None = None
               ) -> GpumemError:
    """One line for an OSError on a local path: "cannot DOING PATH: words" (or "PATH:
    words" when what was being done is not known); its class carries the exit code."""
    where = path if path is not None else exc.filename
    shown, verb = _SHOWN.get(where, (where, doing)) if isinstance(where, str) else \
        ("?", doing)
    words = exc.strerror or str(exc)
    message = f"cannot {verb} {shown}: {words}" if verb else f"{shown}: {words}"
    cls = _BY_ERRNO.get(exc.errno or 0, UsageError)
    return cls(message, details={"errno": errno.errorcode.get(exc.errno or 0, "EIO"),
                                 "path": shown})


def kind_of(mode: int) -> str:
    for test, kind in _KINDS:
        if test(mode):
            return kind
    return "of an unknown kind"


# ---- input ------------------------------------------------------------------------------------
def open_input(path: str, regular_only: bool = True) -> BinaryIO:
    """`path` opened for reading (a symbolic link is followed: the caller named it). A
    regular file, else one line and nothing read; with `regular_only` False anything but a
    directory (`write NAME <(zcat f.gz)` reads a pipe, waiting for its writer as cat does).
    For a regular file only it is opened non-blocking: naming a FIFO never hangs there."""
    flags = os.O_RDONLY | os.O_CLOEXEC | (os.O_NONBLOCK if regular_only else 0)

    def opener(name: str, _flags: int) -> int:
        return os.open(name, flags)
    try:
        f = open(path, "rb", opener=opener)      # the caller closes it
    except OSError as exc:
        raise file_error(exc, path, "read") from None
    try:
        mode = os.fstat(f.fileno()).st_mode
        if stat.S_ISDIR(mode) or (regular_only and not stat.S_ISREG(mode)):
            raise UsageError(f"cannot read {path}: it is {kind_of(mode)}, not a regular file")
        os.set_blocking(f.fileno(), True)
        return f
    except BaseException:
        f.close()
        raise


# ---- output -----------------------------------------------------------------------------------
def check_component(name: str, what: str) -> None:
    """`name` is one path component we may create: not empty, '.' or '..', no '/' or NUL,
    at most NAME_MAX bytes. `what` says where the name came from, for the error."""
    size = len(os.fsencode(name))
    if name in ("", ".", "..") or "/" in name or "\0" in name or size > NAME_MAX:
        raise UsageError(f"{what} {name!r} is not a file name (one path component, no '/', "
                         f"not '.' or '..', at most {NAME_MAX} bytes): refused, nothing "
                         "written")


class OutDir:
    """An open directory that output files are written into, by its fd (module docstring).
    `shown` is how errors name it."""

    def __init__(self, fd: int, shown: str):
        self.fd, self.shown = fd, shown

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> OutDir:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def path(self, name: str) -> str:
        return name if self.shown == "." else os.path.join(self.shown, name)

    def lstat(self, name: str) -> os.stat_result | None:
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise file_error(exc, self.path(name), "write") from None

    def check_file_target(self, name: str) -> None:
        """`name` may be replaced by a file: absent or a regular file (module docstring)."""
        st = self.lstat(name)
        if st is None or stat.S_ISREG(st.st_mode):
            return
        shown = self.path(name)
        if stat.S_ISLNK(st.st_mode):
            raise UsageError(f"{shown} is a symbolic link; name its target "
                             f"({_readlink(self.fd, name)}): a link is neither followed nor "
                             "replaced, nothing written")
        raise UsageError(f"{shown} is {kind_of(st.st_mode)}, not a regular file: refused, "
                         "nothing written")

    def subdir(self, name: str, make: bool = True) -> OutDir:
        """The directory `name` in this one, made if missing (mode 0777 less the umask),
        opened without following a link."""
        shown = self.path(name)
        st = self.lstat(name)
        if st is None and make:
            try:
                os.mkdir(name, 0o777, dir_fd=self.fd)
            except FileExistsError:
                pass
            except OSError as exc:
                raise file_error(exc, shown, "make directory") from None
            st = self.lstat(name)
        if st is not None and not stat.S_ISDIR(st.st_mode):
            why = "a symbolic link; name its target" if stat.S_ISLNK(st.st_mode) else \
                f"{kind_of(st.st_mode)}, not a directory"
            raise UsageError(f"{shown} is {why}: refused, nothing written")
        try:
            fd = os.open(name, _OPEN_DIR | os.O_NOFOLLOW, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):     # swapped since the lstat
                raise UsageError(f"{shown} is not a directory (it changed while being "
                                 "written): refused") from None
            raise file_error(exc, shown, "open directory") from None
        return OutDir(fd, shown)

    def write_file(self, name: str, write: Callable[[BinaryIO], object]) -> None:
        """`write(f)` into a new temporary file here, fsynced, renamed to `name` and the
        directory fsynced: a reader (or a crash) never finds `name` half written. Every
        OSError on the way is one line naming `name`'s path."""
        self.check_file_target(name)
        shown = self.path(name)
        temp, fd = self._create_temp(shown)
        renamed = False
        try:
            with os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            # Should `name` have become a link since the check (only someone who may write
            # this directory can do that), rename replaces the link: nothing is written
            # through it.
            os.rename(temp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
            renamed = True
            os.fsync(self.fd)
        except OSError as exc:
            raise file_error(exc, shown, "write") from None
        finally:
            if not renamed:
                _unlink_quietly(self.fd, temp)

    def _create_temp(self, shown: str) -> tuple[str, int]:
        for _ in range(_TEMP_TRIES):
            temp = f".gpumemctl-{os.urandom(8).hex()}.tmp"
            try:
                return temp, os.open(temp, _CREATE, 0o666, dir_fd=self.fd)
            except FileExistsError:
                continue                # a name already taken (planted?): draw another
            except OSError as exc:
                raise file_error(exc, shown, "write") from None
        raise UsageError(f"cannot write {shown}: {_TEMP_TRIES} random temporary names in "
                         f"{self.shown} were all taken")


def open_parent(path: str) -> tuple[OutDir, str]:
    """OUT's directory, resolved once and opened (links above OUT are followed: the caller
    chose that path), and OUT's last component."""
    head, name = os.path.split(path)
    parent = head or "."
    try:
        fd = os.open(parent, _OPEN_DIR)
    except OSError as exc:
        raise file_error(exc, path, "write") from None
    return OutDir(fd, head or "."), name


def write_file(path: str, write: Callable[[BinaryIO], object]) -> None:
    """The file OUT written crash-safe (module docstring)."""
    if path.endswith("/"):
        raise UsageError(f"{path}: names a directory; expected a file name")
    parent, name = open_parent(path)
    with parent:
        check_component(name, "output file name")
        parent.write_file(name, write)


def open_out_dir(path: str) -> OutDir:
    """The directory OUT, made if missing (not its parents), never a symbolic link."""
    trimmed = path.rstrip("/") or "/"
    if trimmed == "/":
        return OutDir(_open_dir_or_fail("/", path), "/")
    parent, name = open_parent(trimmed)
    with parent:
        if name in (".", ".."):
            return OutDir(_open_dir_or_fail(trimmed, path), trimmed)
        check_component(name, "output directory name")
        return parent.subdir(name)


def _open_dir_or_fail(where: str, shown: str) -> int:
    try:
        return os.open(where, _OPEN_DIR)
    except OSError as exc:
        raise file_error(exc, shown, "write") from None


def _readlink(dir_fd: int, name: str) -> str:
    try:
        return os.readlink(name, dir_fd=dir_fd)
    except OSError:
        return "?"


def _unlink_quietly(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass
