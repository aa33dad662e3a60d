"""Where snapshots live: a directory (local disk, NFS, Lustre, 3FS: anything mounted) or an
S3-compatible bucket (gpumemctl/snapshots/s3.py). Both offer the same few calls, so the
engine (gpumemctl/snapshots/engine.py) never knows which one it writes to.

A store's objects have keys `snap-.../manifest.json`, `snap-.../lock.json` and
`snap-.../data/<n>.bin` (gpumemctl/snapshots/manifest.py). Large objects are written in order
by an ObjectWriter and read back by byte range through an ObjectReader; small ones
(manifest, lock) whole. `put_atomic` is the commit point: readers see the old state or the
new one, never half of it.

The directory store writes what it makes private to its creator (directories 0700, files
0600): a snapshot holds the data of every allocation its creator could read. Share a store
across a fleet by granting access to it on purpose (docs/snapshots.md).
"""
from __future__ import annotations

import contextlib
import errno
import os
import threading
from concurrent.futures import ThreadPoolExecutor

from ..memory import _pread_full as pread_full
from ..memory import _pwrite_full as pwrite_full
from ..protocol import NotFound, PermissionDenied, UsageError
from .manifest import NAME_RE, SnapshotDamaged

PIECE = 8 << 20            # a write or read is cut into pieces of this size for the I/O pool
DIRECT_ALIGN = 4096        # O_DIRECT wants offsets and lengths of whole logical blocks
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _forget_pool() -> None:
    """In a forked child: the parent's threads are not there, so its pool is unusable."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)


def io_pool() -> ThreadPoolExecutor:
    """Threads for file I/O and checksums: preadv/pwrite and xxhash release the GIL."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=min(16, max(4, os.cpu_count() or 1)),
                                       thread_name_prefix="gpumemctl-snap")
        return _pool


def open_store(location: str, *, create: bool = False):
    """The store at `location`: `s3://bucket/prefix` or a directory path."""
    if location.startswith("s3://"):
        from .s3 import S3Store
        return S3Store(location)
    return DirStore(location, create=create)


def _os_error(exc: OSError, what: str) -> Exception:
    if exc.errno in (errno.EACCES, errno.EPERM):
        return PermissionDenied(f"permission denied: {what}")
    if exc.errno == errno.ENOENT:
        return NotFound(f"{what}: no such file or directory")
    return UsageError(f"{what}: {exc.strerror}")


class Direct:
    """A file's two descriptors: one with O_DIRECT where the file system takes it, used for
    pieces whose address, length and offset it accepts (the pinned staging buffers and
    mappings are page-aligned and pieces start at 1 MiB multiples, so all but a short tail),
    and a buffered one for the rest. Direct I/O is what the disk's own rate is measured with
    (dd oflag=direct): it skips the page cache copy, and a snapshot neither evicts the page
    cache nor leaves gigabytes of dirty pages to flush at its fsync."""

    def __init__(self, path: str, flags: int, mode: int = 0o600):
        self.fd = os.open(path, flags | os.O_CLOEXEC, mode)
        self.direct: int | None = None
        with contextlib.suppress(OSError, AttributeError):   # tmpfs, some FUSE: EINVAL
            self.direct = os.open(path, (flags & ~(os.O_CREAT | os.O_TRUNC)) | os.O_DIRECT |
                                  os.O_CLOEXEC)

    def _direct_fits(self, piece: memoryview, offset: int) -> bool:
        return self.direct is not None and not (len(piece) | offset) % DIRECT_ALIGN

    def pwrite_all(self, piece: memoryview, offset: int) -> None:
        if self._direct_fits(piece, offset):
            try:
                return pwrite_full(self.direct, piece, offset)   # type: ignore[arg-type]
            except OSError as exc:
                if exc.errno != errno.EINVAL:                    # not aligned after all
                    raise
        pwrite_full(self.fd, piece, offset)

    def pread_all(self, piece: memoryview, offset: int) -> int:
        if self._direct_fits(piece, offset):
            try:
                return pread_full(self.direct, piece, offset)     # type: ignore[arg-type]
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
        return pread_full(self.fd, piece, offset)

    def close(self) -> None:
        for fd in (self.fd, self.direct):
            if fd is not None and fd >= 0:
                os.close(fd)
        self.fd, self.direct = -1, None


class DirWriter:
    """A data object written in order, each view cut into pieces written in parallel."""

    def __init__(self, path: str):
        self.path, self.tmp = path, path + ".partial"
        self.file = Direct(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        self.offset = 0

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
        os.fsync(self.file.fd)
        self.file.close()
        os.rename(self.tmp, self.path)

    def abort(self) -> None:
        self.file.close()
        with contextlib.suppress(OSError):
            os.unlink(self.tmp)


class DirReader:
    def __init__(self, path: str, key: str):
        self.key = key
        try:
            self.file = Direct(path, os.O_RDONLY)
        except FileNotFoundError:
            raise SnapshotDamaged(f"data object {key} is missing") from None
        self.size = os.fstat(self.file.fd).st_size

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


class DirStore:
    kind = "dir"

    def __init__(self, location: str, *, create: bool = False):
        self.location = location
        self.root = os.path.abspath(location)
        if create:
            try:
                os.makedirs(self.root, mode=0o700, exist_ok=True)
            except OSError as exc:
                raise _os_error(exc, f"cannot create snapshot directory {location}") from None
        if not os.path.isdir(self.root):
            raise NotFound(f"snapshot store {location}: no such directory")

    def _path(self, key: str) -> str:
        # Keys come from NAME_RE/KEY_RE-checked names only (manifest.py); never a user path.
        return os.path.join(self.root, key)

    def local_path(self, key: str) -> str:
        """The file of an object, for KvikIO (gpumemctl/snapshots/gds.py)."""
        return self._path(key)

    def where(self, key: str = "") -> str:
        return self._path(key) if key else self.location

    def names(self) -> list[str]:
        try:
            return sorted(n for n in os.listdir(self.root) if NAME_RE.fullmatch(n))
        except OSError as exc:
            raise _os_error(exc, f"cannot list {self.location}") from None

    def begin(self, snapshot: str) -> None:
        try:
            os.mkdir(self._path(snapshot), 0o700)
            os.mkdir(self._path(f"{snapshot}/data"), 0o700)
        except OSError as exc:
            raise _os_error(exc, f"cannot write to {self.location}") from None

    def read(self, key: str, limit: int) -> bytes | None:
        try:
            with open(self._path(key), "rb") as f:
                return f.read(limit + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _os_error(exc, f"cannot read {self._path(key)}") from None

    def put_atomic(self, key: str, data: bytes) -> None:
        """Write whole, fsync, rename over, fsync the directory: old or new, never half."""
        path = self._path(key)
        tmp = f"{path}.tmp-{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            pwrite_full(fd, memoryview(data), 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
        self.sync_dir(os.path.dirname(key))

    def sync_dir(self, key: str = "") -> None:
        fd = os.open(self._path(key) if key else self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def writer(self, key: str) -> DirWriter:
        return DirWriter(self._path(key))

    def reader(self, key: str) -> DirReader:
        return DirReader(self._path(key), key)

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(key))

    def keys(self, snapshot: str) -> list[str]:
        """Every object of one snapshot (partial data objects included)."""
        out = []
        base = self._path(snapshot)
        for dirpath, _dirs, files in os.walk(base):
            rel = os.path.relpath(dirpath, self.root)
            out += [f"{rel}/{f}" for f in files]
        return sorted(out)

    def finish_removal(self, snapshot: str) -> None:
        """Drop the snapshot's directories once its objects are gone (what is still
        referenced keeps them)."""
        for sub in (f"{snapshot}/data", snapshot):
            with contextlib.suppress(OSError):
                os.rmdir(self._path(sub))

    def object_size(self, key: str) -> int | None:
        try:
            return os.stat(self._path(key)).st_size
        except FileNotFoundError:
            return None
