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
across a fleet by granting access to it on purpose (docs/snapshots.md). Its root may be a
directory others can write (1777, a group's): below the root it reaches every file and
directory through directory descriptors, never by a path a swapped name could redirect
(gpumemctl/snapshots/dirfd.py), and with a `trust` (gpumemctl/snapshots/trust.py) it reads
only what a trusted uid owns.
"""
from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
from concurrent.futures import ThreadPoolExecutor

from ..memory import _pread_full as pread_full
from ..memory import _pwrite_full as pwrite_full
from ..protocol import (
    GpumemError,
    InvalidState,
    NoMemory,
    NotFound,
    PermissionDenied,
    UsageError,
)
from . import dirfd
from .dirfd import NotPlain
from .manifest import NAME_RE, SnapshotDamaged
from .trust import Trust

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


def _os_error(exc: OSError, what: str) -> GpumemError:
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
            raise _os_error(exc, f"cannot write {self.where}") from None

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
            raise _os_error(exc, f"cannot write {self.where}") from None
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
            raise _os_error(exc, f"cannot write {self.where}") from None

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


def _split(key: str) -> tuple[str, str]:
    """(the directory's key, the last name) of a key; keys are made from NAME_RE/KEY_RE
    names (manifest.py) and fixed names, never from a user's path."""
    head, _, leaf = key.rpartition("/")
    if leaf in ("", ".", "..") or any(p in ("", ".", "..") for p in head.split("/") if head):
        raise UsageError(f"invalid key in a snapshot store: {key!r}")
    return head, leaf


class DirStore:
    """A store in a directory: every snapshot directory and file below the root is reached
    by descriptor (dirfd.py), the descriptors of directories kept while the store is open."""
    kind = "dir"
    MAX_DEPTH = 3            # a snapshot has snap-X/data/N.bin: deeper trees are not walked

    def __init__(self, location: str, *, create: bool = False):
        self.location = location
        self.root = os.path.abspath(location)
        if create:
            try:
                os.makedirs(self.root, mode=0o700, exist_ok=True)
            except OSError as exc:
                raise _os_error(exc, f"cannot create snapshot directory {location}") from None
        try:
            self.fd = dirfd.open_root(self.root)
        except (FileNotFoundError, NotADirectoryError):
            raise NotFound(f"snapshot store {location}: no such directory") from None
        except OSError as exc:
            raise _os_error(exc, f"cannot open snapshot store {location}") from None
        self._dirs: dict[str, int] = {"": self.fd}
        self._made: dict[str, os.stat_result] = {}     # what begin() made, by snapshot

    def close(self) -> None:
        for fd in self._dirs.values():
            os.close(fd)
        self._dirs = {}

    def __enter__(self) -> DirStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def where(self, key: str = "") -> str:
        return os.path.join(self.root, key) if key else self.location

    # ---- descriptors ---------------------------------------------------------------------
    def dir_fd(self, dkey: str, trust: Trust | None = None) -> int:
        """The directory `dkey` ("" the root, "snap-X", "snap-X/data"), each level below the
        root opened with O_NOFOLLOW; with `trust`, each level below the root checked.
        FileNotFoundError where it is missing, NotPlain where it is no directory."""
        fd = self._dirs.get(dkey)
        if not dkey:
            return self.fd
        head, leaf = _split(dkey)
        parent = self.dir_fd(head, trust)
        if fd is None:
            fd = dirfd.open_dir(parent, leaf, self.where(dkey),
                                trust.check if trust else None)
            self._dirs[dkey] = fd
        elif trust is not None:
            trust.check(os.fstat(fd), self.where(dkey))
        return fd

    def parent(self, key: str, trust: Trust | None = None) -> tuple[int, str]:
        """The descriptor of the directory holding `key`, and its last name."""
        dkey, leaf = _split(key)
        return self.dir_fd(dkey, trust), leaf

    def open_file(self, key: str, trust: Trust | None = None) -> tuple[int, os.stat_result]:
        """A regular file, read-only, and its stat (FileNotFoundError where missing)."""
        try:
            dfd, leaf = self.parent(key, trust)
            return dirfd.open_file(dfd, leaf, self.where(key),
                                   check=trust.check if trust else None)
        except (FileNotFoundError, GpumemError):
            raise
        except OSError as exc:
            raise _os_error(exc, f"cannot read {self.where(key)}") from None

    # ---- the store's calls (the same as S3Store's) ---------------------------------------
    def names(self) -> list[str]:
        try:
            return sorted(n for n in os.listdir(self.fd) if NAME_RE.fullmatch(n))
        except OSError as exc:
            raise _os_error(exc, f"cannot list {self.location}") from None

    def owner(self, name: str) -> int | None:
        """The uid owning a snapshot's entry in the root (None where it is gone)."""
        try:
            return dirfd.lstat_at(self.fd, name).st_uid
        except FileNotFoundError:
            return None

    def exists(self, key: str) -> bool:
        """Whether anything is at `key` (a snapshot that is no directory counts as there)."""
        try:
            dfd, leaf = self.parent(key)
            dirfd.lstat_at(dfd, leaf)
            return True
        except FileNotFoundError:
            return False
        except (NotPlain, OSError):
            return True                 # something is there: reading it will say what

    def begin(self, snapshot: str) -> None:
        """Make the snapshot's directories, keeping their descriptors: what is written goes
        into them even if their names are swapped meanwhile (confirm() then says so)."""
        try:
            os.mkdir(snapshot, 0o700, dir_fd=self.fd)
            fd = self.dir_fd(snapshot)
            made = os.fstat(fd)
            if made.st_uid != os.geteuid():
                raise InvalidState(self._replaced(snapshot))
            self._made[snapshot] = made
            os.mkdir("data", 0o700, dir_fd=fd)
            self.dir_fd(f"{snapshot}/data")
        except NotPlain:
            raise InvalidState(self._replaced(snapshot)) from None
        except OSError as exc:
            raise _os_error(exc, f"cannot write to {self.location}") from None

    def confirm(self, snapshot: str) -> None:
        """After the commit: the store's name of the snapshot still leads to the directory
        begin() made (in a store others may rename entries of, it might not)."""
        try:
            now = dirfd.lstat_at(self.fd, snapshot)
        except FileNotFoundError:
            now = None
        if now is None or not dirfd.same_file(now, self._made[snapshot]):
            raise InvalidState(self._replaced(snapshot))

    def _replaced(self, snapshot: str) -> str:
        return (f"{self.where(snapshot)} was moved or replaced while it was written: another "
                f"user may rename entries of {self.location}; make it sticky (chmod +t) or "
                "give it to one owner (docs/snapshots.md)")

    def read(self, key: str, limit: int, trust: Trust | None = None) -> bytes | None:
        """The whole file (at most limit+1 bytes), or None where there is none; a regular
        file only, and one larger than `limit` is refused without reading it."""
        try:
            fd, st = self.open_file(key, trust)
        except FileNotFoundError:
            return None
        try:
            if st.st_size > limit:
                raise SnapshotDamaged(f"{self.where(key)} is {st.st_size} bytes, more than "
                                      f"{limit}: not a snapshot's")
            return dirfd.read_bounded(fd, limit)
        except OSError as exc:
            raise _os_error(exc, f"cannot read {self.where(key)}") from None
        finally:
            os.close(fd)

    def put_atomic(self, key: str, data: bytes) -> None:
        """Write whole, fsync, rename over, fsync the directory: old or new, never half."""
        try:
            dfd, leaf = self.parent(key)
            tmp = f"{leaf}.tmp-{os.getpid()}"
            with contextlib.suppress(FileNotFoundError):    # left by a process of our pid
                os.unlink(tmp, dir_fd=dfd)
            fd = dirfd.create_file(dfd, tmp)
            try:
                pwrite_full(fd, memoryview(data), 0)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, leaf, src_dir_fd=dfd, dst_dir_fd=dfd)
            os.fsync(dfd)
        except OSError as exc:
            raise _os_error(exc, f"cannot write {self.where(key)}") from None

    def sync_dir(self, key: str = "") -> None:
        try:
            os.fsync(self.dir_fd(key))
        except OSError as exc:
            raise _os_error(exc, f"cannot write {self.where(key)}") from None

    def writer(self, key: str) -> DirWriter:
        return DirWriter(self, key)

    def reader(self, key: str, trust: Trust | None = None) -> DirReader:
        return DirReader(self, key, trust)

    def delete(self, key: str) -> None:
        """Unlink `key` in its directory (a symlink there: the link itself)."""
        try:
            dfd, leaf = self.parent(key)
            os.unlink(leaf, dir_fd=dfd)
        except (FileNotFoundError, NotPlain):
            pass
        except OSError as exc:
            raise _os_error(exc, f"cannot remove {self.where(key)}") from None

    def keys(self, snapshot: str) -> list[str]:
        """Every name under the snapshot that is no directory (objects, partial ones, a
        manifest; a symlink too: removing it removes the link), found by descriptor."""
        out: list[str] = []

        def walk(dkey: str, depth: int) -> None:
            try:
                fd = self.dir_fd(dkey)
                found = dirfd.entries(fd)
            except (FileNotFoundError, NotPlain):
                return
            except OSError as exc:
                raise _os_error(exc, f"cannot list {self.where(dkey)}") from None
            for name, is_dir in found:
                if not is_dir:
                    out.append(f"{dkey}/{name}")
                elif depth < self.MAX_DEPTH:
                    walk(f"{dkey}/{name}", depth + 1)
        walk(snapshot, 1)
        return sorted(out)

    def finish_removal(self, snapshot: str) -> None:
        """Drop the snapshot's directories that are empty now, deepest first, each by its
        parent's descriptor and only while its name still leads to it; an entry that is no
        directory (a symlink where the snapshot should be) is unlinked, never followed."""
        self.keys(snapshot)                                 # opens what is below
        below = sorted((k for k in self._dirs if k.startswith(snapshot + "/")),
                       key=lambda k: k.count("/"), reverse=True)
        for dkey in [*below, snapshot]:
            head, leaf = _split(dkey)
            parent = self._dirs.get(head, self.fd)
            fd = self._dirs.pop(dkey, None)
            with contextlib.suppress(OSError):
                here = dirfd.lstat_at(parent, leaf)
                if fd is not None and dirfd.same_file(here, os.fstat(fd)):
                    os.rmdir(leaf, dir_fd=parent)
                elif fd is None and not stat.S_ISDIR(here.st_mode):
                    os.unlink(leaf, dir_fd=parent)
            if fd is not None:
                os.close(fd)

    def object_size(self, key: str) -> int | None:
        try:
            fd, st = self.open_file(key)
        except (FileNotFoundError, NotPlain):
            return None
        os.close(fd)
        return st.st_size
