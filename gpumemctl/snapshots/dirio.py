"""A directory store's data files (gpumemctl/snapshots/dirstore.py): written in order or by
offset (DirWriter), read by byte range (DirReader), each through its file's descriptor and,
for the pieces a file system takes so, O_DIRECT (Direct). The I/O runs on the store's pool
(iopool.py) in PIECE-sized parts."""
from __future__ import annotations

import contextlib
import errno
import os

from ..memory import _pread_full as pread_full
from ..memory import _pwrite_full as pwrite_full
from ..protocol import GpumemError, NoMemory, NotFound, PermissionDenied, UsageError
from . import dirfd
from .iopool import PIECE, io_pool
from .manifest import SnapshotDamaged
from .trust import Trust

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .dirstore import DirStore

DIRECT_ALIGN = 4096        # O_DIRECT wants offsets and lengths of whole logical blocks


def os_error(exc: OSError, what: str) -> GpumemError:
    if exc.errno in (errno.EACCES, errno.EPERM):
        return PermissionDenied(f"permission denied: {what}")
    if exc.errno == errno.ENOENT:
        return NotFound(f"{what}: no such file or directory")
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return NoMemory(f"{what}: {exc.strerror}")
    return UsageError(f"{what}: {exc.strerror}")


class Direct:
    """An open regular file's two descriptors: the one given, and one with O_DIRECT where
    the file system takes it, used for pieces whose address, length and offset it accepts
    (the pinned staging buffers and mappings are page-aligned and pieces start at 1 MiB
    multiples, so all but a short tail). Direct I/O is what the disk's own rate is measured
    with (dd oflag=direct): it skips the page cache copy, and a snapshot neither evicts the
    page cache nor leaves gigabytes of dirty pages to flush at its fsync. The O_DIRECT one
    is the same file opened again through /proc, never through its name in the store."""

    def __init__(self, fd: int, access: int, where: str):
        self.fd, self.where = fd, where
        self.direct: int | None = None
        with contextlib.suppress(OSError, AttributeError):   # tmpfs, some FUSE: EINVAL
            self.direct = dirfd.reopen(fd, access | os.O_DIRECT)

    def _direct_fits(self, piece: memoryview, offset: int) -> bool:
        return self.direct is not None and not (len(piece) | offset) % DIRECT_ALIGN

    def pwrite_all(self, piece: memoryview, offset: int) -> None:
        try:
            if self._direct_fits(piece, offset):
                try:
                    return pwrite_full(self.direct, piece, offset)   # type: ignore[arg-type]
                except OSError as exc:
                    if exc.errno != errno.EINVAL:                    # not aligned after all
                        raise
            pwrite_full(self.fd, piece, offset)
        except OSError as exc:
            raise os_error(exc, f"cannot write {self.where}") from None

    def pread_all(self, piece: memoryview, offset: int) -> int:
        try:
            if self._direct_fits(piece, offset):
                try:
                    return pread_full(self.direct, piece, offset)     # type: ignore[arg-type]
                except OSError as exc:
                    if exc.errno != errno.EINVAL:
                        raise
            return pread_full(self.fd, piece, offset)
        except OSError as exc:
            raise SnapshotDamaged(f"cannot read {self.where}: {exc.strerror}") from None

    def close(self) -> None:
        for fd in (self.fd, self.direct):
            if fd is not None and fd >= 0:
                os.close(fd)
        self.fd, self.direct = -1, None


class DirWriter:
    """A data object written in order, each view cut into pieces written in parallel. It is
    made under a new name (O_EXCL, in the snapshot's own directory, by descriptor) and
    renamed into place at commit."""

    def __init__(self, store: DirStore, key: str):
        self.where = store.where(key)
        self.dir_fd, self.leaf = store.parent(key)
        self.tmp = self.leaf + ".partial"
        try:
            fd = dirfd.create_file(self.dir_fd, self.tmp)
        except OSError as exc:
            raise os_error(exc, f"cannot write {self.where}") from None
        self.file = Direct(fd, os.O_WRONLY, self.where)
        self.offset = 0

    @property
    def proc_path(self) -> str:
        """The file, for KvikIO (gpumemctl/snapshots/gds.py), which opens by path."""
        return dirfd.proc_path(self.file.fd)

    def write(self, view: memoryview) -> None:
        """Returns once every byte of `view` is written (the caller reuses the buffer)."""
        base = self.offset
        pieces = [(view[o:o + PIECE], base + o) for o in range(0, len(view), PIECE)]
        if len(pieces) == 1:
            self.file.pwrite_all(*pieces[0])
        else:
            for f in [io_pool().submit(self.file.pwrite_all, p, at) for p, at in pieces]:
                f.result()
        self.offset += len(view)

    def write_at(self, offset: int, piece: memoryview) -> None:
        """One piece at `offset` (the caller runs several at once: striped objects)."""
        self.file.pwrite_all(piece, offset)

    def commit(self) -> None:
        try:
            os.fsync(self.file.fd)
            self.file.close()
            os.rename(self.tmp, self.leaf, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        except OSError as exc:
            raise os_error(exc, f"cannot write {self.where}") from None

    def abort(self) -> None:
        self.file.close()
        with contextlib.suppress(OSError):
            os.unlink(self.tmp, dir_fd=self.dir_fd)


class DirReader:
    """A data object read by byte range (a regular file, owned as `trust` wants)."""

    def __init__(self, store: DirStore, key: str, trust: Trust | None = None):
        self.key = key
        try:
            fd, st = store.open_file(key, trust)
        except FileNotFoundError:
            raise SnapshotDamaged(f"data object {key} is missing") from None
        self.file = Direct(fd, os.O_RDONLY, store.where(key))
        self.size = st.st_size

    @property
    def proc_path(self) -> str:
        return dirfd.proc_path(self.file.fd)

    def read_into(self, offset: int, view: memoryview) -> None:
        """Fill `view` with the bytes at `offset`; SnapshotDamaged where the object is short."""
        pieces = [(view[o:o + PIECE], offset + o) for o in range(0, len(view), PIECE)]
        if len(pieces) == 1:
            got = [self.file.pread_all(*pieces[0])]
        else:
            got = [f.result() for f in [io_pool().submit(self.file.pread_all, p, at)
                                        for p, at in pieces]]
        if sum(got) != len(view):
            raise SnapshotDamaged(f"data object {self.key} ends at {self.size} bytes, before "
                                  f"{offset + len(view)}")

    def close(self) -> None:
        self.file.close()
