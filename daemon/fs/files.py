"""Files open on the mount: what an open, a write and a truncate do besides their verb.

- An open holds the allocation (HandleVerbs.open_mount) for the file handle's life, so an
  unlinked file keeps its memory while it is open; the memory goes with its last close.
- open(2) with O_TRUNC truncates (libfuse 3 negotiates atomic O_TRUNC, so the flag arrives
  in the open, not as a setattr), as does a create that finds the name taken meanwhile.
- An open for reading moves the access time by the relatime rule: reads from the page
  cache never reach the daemon.
- Whether the kernel keeps the pages it cached of the file is decided at each open
  (daemon/fs/cache.py); a write-only open goes direct.
- A write or truncate by a process without CAP_FSETID clears the set-id bits where the
  kernel does not (drop_setid; daemon/fs/attrs.py says when).
"""
from __future__ import annotations

import os

import pyfuse3

from gpumemctl.protocol import UsageError

from ..core.nodes import Allocation, Node
from ..core.permissions import Credentials, R, W, require
from ..core.sessions import Session
from ..verbs import Verbs
from . import cache as fs_cache
from .attrs import SETID, has_fsetid, without_setid
from .cache import KernelCache


def writable(flags: int) -> bool:
    """Whether open(2)'s flags ask to write."""
    return flags & os.O_ACCMODE != os.O_RDONLY


# How a write-only open goes (issue 29; docs/mount.md, "Through the page cache"): direct I/O
# (the default), or through the page cache like every other open, so that what a bulk writer
# wrote is read back from the cache: GPUMEMD_MOUNT_WRITE_ONLY=cached, for experiments.
WRITE_ONLY_ENV = "GPUMEMD_MOUNT_WRITE_ONLY"


def write_only_direct() -> bool:
    """Whether write-only opens use direct I/O (WRITE_ONLY_ENV; ValueError names a bad
    value)."""
    value = os.environ.get(WRITE_ONLY_ENV, "direct")
    if value not in ("direct", "cached"):
        raise ValueError(f"{WRITE_ONLY_ENV}: invalid {value!r}: expected direct or cached")
    return value == "direct"


class FileHandle:
    """A file open on the mount: its holder, and who opened it. FUSE tells the filesystem
    nothing of the process behind a write, so the opener stands in for the writer when a
    write decides whether the set-id bits go (Files.drop_setid)."""

    def __init__(self, holder, cred: Credentials):
        self.holder, self.alloc, self.cred = holder, holder.alloc, cred
        self._fsetid: bool | None = None

    def keeps_setid(self) -> bool:
        if self._fsetid is None:          # read from /proc once, and only when it matters
            self._fsetid = has_fsetid(self.cred)
        return self._fsetid


class Files:
    """Opens of allocations on the mount, and the set-id bits their writes clear."""

    def __init__(self, verbs: Verbs, session: Session, kernel: KernelCache):
        self.v = verbs
        self.session = session          # the daemon's session: mount handles belong to it
        self.kernel = kernel
        self.write_only_direct = write_only_direct()

    def open_new(self, alloc: Allocation, cred: Credentials, flags: int) -> FileHandle:
        """The handle of a file the request itself created: nothing to truncate or note."""
        return FileHandle(self.v.handles.open_mount(alloc, cred, self.session,
                                                    writable(flags)), cred)

    def open(self, alloc: Allocation, cred: Credentials, flags: int) -> FileHandle:
        """Open an allocation; O_TRUNC truncates it first. libfuse 3 asks the kernel for
        atomic O_TRUNC, so the truncation arrives here, inside the open, never as a setattr;
        the kernel has checked write permission for it (as for any O_TRUNC)."""
        if flags & os.O_TRUNC:
            self.v.data.truncate_on_open(alloc, cred, self.session)
            self.drop_setid(alloc, cred)
        holder = self.v.handles.open_mount(alloc, cred, self.session, writable(flags))
        if flags & os.O_ACCMODE != os.O_WRONLY:
            self._note_read(alloc)
        return FileHandle(holder, cred)

    def info(self, fh: int, alloc: Allocation, flags: int) -> pyfuse3.FileInfo:
        """An allocation opened through the page cache: the kernel keeps the pages it has
        only if nothing changed them since it filled them (daemon/fs/cache.py). A
        write-only open goes direct: no mapping can come of it (mmap needs read access), and
        a bulk writer (`cp`, `dd of=`) then sends whole 1 MiB writes straight to the device
        memory instead of copying each page through the cache first. The kernel drops the
        cached pages of the range such a write covers (docs/mount.md, "Consistency")."""
        if flags & os.O_ACCMODE == os.O_WRONLY and self.write_only_direct:
            self.kernel.pages.keep(alloc.id, None)      # cached pages of others may be old
            return pyfuse3.FileInfo(fh=fh, direct_io=True, keep_cache=False)
        keep = self.kernel.pages.keep(alloc.id, self.v.queries.cache_generation(alloc))
        return pyfuse3.FileInfo(fh=fh, direct_io=False, keep_cache=keep)

    def existing_for_create(self, parent_inode: int, name: str, cred: Credentials,
                            flags: int) -> Allocation:
        """open(O_CREAT) of a name made (through the socket API) after the kernel looked it
        up: open it as it is. The kernel believes it created the file, so it checked no
        permission on it and left O_TRUNC to us (open)."""
        node = self.v.queries.lookup_child(parent_inode, name, cred)
        if not isinstance(node, Allocation):
            raise UsageError(f"'{node.path}' is a directory", details={"errno": "EISDIR"})
        wanted = R if flags & os.O_ACCMODE == os.O_RDONLY else W
        if flags & os.O_ACCMODE == os.O_RDWR:
            wanted = R | W
        require(node, cred, wanted | (W if flags & os.O_TRUNC else 0))
        return node

    def _note_read(self, alloc: Allocation) -> None:
        """Access time, by relatime, at an open for reading: reads served from the page
        cache never reach the daemon. The kernel caches atime with the other attributes
        (its own read requests drop it, an open does not), so it is told here, at once:
        dropping attributes takes no lock the kernel could hold on this open."""
        before = alloc.accessed_ns
        self.v.names.note_access(alloc)
        if alloc.accessed_ns != before:
            fs_cache.invalidate([(alloc.id, None)])

    def drop_setid(self, node: Node, cred: Credentials, handle: FileHandle | None = None
                   ) -> None:
        """After a write or truncate: clear the set-id bits as Linux does (without_setid),
        unless the process holds CAP_FSETID (for a write: the opener, see FileHandle). The
        kernel sends no setattr for this on O_TRUNC or a direct I/O write, and on truncate(2)
        it leaves S_ISGID without group-exec alone (docs/mount.md, "Set-user-ID and
        set-group-ID")."""
        if not node.mode & SETID:
            return                                   # the common case: nothing to clear
        if self.v.queries.node_or_none(node.id) is not node:
            return                                   # unlinked: it has no row to change
        mode = without_setid(node, cred)
        if mode == node.mode:
            return
        if handle.keeps_setid() if handle is not None else has_fsetid(cred):
            return
        self.v.names.setattr(node.id, cred, mode=mode, authorised=True)
        # The kernel did not make this change, so it still caches the old mode, and a
        # statx(STATX_MODE) alone (`stat -c %a`) would show it for ENTRY_TIMEOUT. Dropping
        # attributes takes no lock the kernel could hold on this write (as _note_read).
        fs_cache.invalidate([(node.id, None)])
