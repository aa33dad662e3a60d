"""The directory store: snapshots in a directory (local disk, NFS, Lustre, 3FS: anything
mounted), every file and directory below its root reached through directory descriptors
(dirfd.py), never by a path a swapped name could redirect (gpumemctl/snapshots/stores.py
says why, and what it writes private to its creator)."""
from __future__ import annotations

import contextlib
import os
import stat

from ..memory import _pwrite_full as pwrite_full
from ..protocol import GpumemError, InvalidState, NotFound, UsageError
from . import dirfd
from .dirfd import NotPlain
from .dirio import DirReader, DirWriter, os_error
from .manifest import NAME_RE, SnapshotDamaged
from .trust import Trust


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
                raise os_error(exc, f"cannot create snapshot directory {location}") from None
        try:
            self.fd = dirfd.open_root(self.root)
        except (FileNotFoundError, NotADirectoryError):
            raise NotFound(f"snapshot store {location}: no such directory") from None
        except OSError as exc:
            raise os_error(exc, f"cannot open snapshot store {location}") from None
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
            raise os_error(exc, f"cannot read {self.where(key)}") from None

    # ---- the store's calls (the same as S3Store's) ---------------------------------------
    def names(self) -> list[str]:
        try:
            return sorted(n for n in os.listdir(self.fd) if NAME_RE.fullmatch(n))
        except OSError as exc:
            raise os_error(exc, f"cannot list {self.location}") from None

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
            raise os_error(exc, f"cannot write to {self.location}") from None

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
            raise os_error(exc, f"cannot read {self.where(key)}") from None
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
            raise os_error(exc, f"cannot write {self.where(key)}") from None

    def sync_dir(self, key: str = "") -> None:
        try:
            os.fsync(self.dir_fd(key))
        except OSError as exc:
            raise os_error(exc, f"cannot write {self.where(key)}") from None

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
            raise os_error(exc, f"cannot remove {self.where(key)}") from None

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
                raise os_error(exc, f"cannot list {self.where(dkey)}") from None
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
