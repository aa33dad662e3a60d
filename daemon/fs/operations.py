"""The FUSE filesystem (pyfuse3): every file an allocation, every directory a directory of
the same namespace the socket API serves.

The Operations class is a set of thin handlers over the verbs (daemon/verbs/): each
translates the kernel's request into one verb call (or runs its plan) and the answer back,
inside the error boundary of daemon/fs/requests.py (protocol errors become
`FUSEError(errno)` only there; a bug fails one request and never the mount). Beside it, in
daemon/fs/: the attributes it answers (attrs.py), the `.metadata` mirror
(metadata_view.py), files open on it (files.py), what the kernel caches and hears of
(cache.py) and the extended attributes (xattrs.py).

Choices a user can observe (docs/mount.md says more):
- Files go through the kernel's page cache, write-through (no writeback cache: the daemon
  owns sizes and times, and a write is in device memory when write(2) returns), so shared
  mmap(2) works. When another path changes an allocation's bytes or size, the kernel's
  cached pages go before that request is answered (daemon/fs/cache.py; docs/mount.md,
  "Consistency", has the rules).
- The kernel enforces permissions (default_permissions); the verbs check them again with
  the same rules, except where the kernel's check is the only right one (setattr, I/O on an
  open handle).
- Entries and attributes are cached for ENTRY_TIMEOUT seconds (daemon/fs/attrs.py).
- `/.metadata/<path>` mirrors the tree read-only (daemon/fs/metadata_view.py).
- Symbolic links are nodes of the namespace (Symlink, daemon/core/nodes.py): symlink makes
  one, readlink answers its target as given, and the kernel follows them (O_NOFOLLOW, ELOOP
  and the 40-link limit are its own). An absolute target is a plain string, never resolved
  here. A hard link (link) is one more name of the same node: one allocation, several
  names (st_nlink); a directory cannot have one (EPERM).
- mknod makes FIFOs, sockets and character and block device nodes as tmpfs does: metadata
  only (Special, daemon/core/nodes.py). The kernel gives FIFOs and sockets their behaviour
  without asking us; the mount is nodev, so a device node never opens its device (EACCES).
- rename honours RENAME_NOREPLACE and RENAME_EXCHANGE.
- Extended attributes: `user.gpu.*` are gpumemd's own (daemon/fs/xattrs.py); every other
  `user.KEY` of an allocation or directory is its user metadata (daemon/core/usermeta.py),
  the same that `gpumemctl meta` serves.
- An unlinked file keeps its memory while it is open; O_TRUNC truncates in the open; a
  write or truncate clears the set-id bits as Linux does (daemon/fs/files.py).
- Access times are stored; opens for reading, reads and listings move them by the relatime
  rule (reads from the page cache never reach the daemon).
- A size larger than any device could hold is EFBIG; one that does not fit now, ENOSPC.
- Every listing starts with "." and ".." (the root's ".." is the root).
"""
from __future__ import annotations

import errno
import os
import stat
from typing import TypeVar

import pyfuse3

from gpumemctl.protocol import Exists, NotFound, UsageError, name_bytes
from gpumemctl.protocol.names import MAX_COMPONENT_BYTES

from ..core.nodes import Allocation, Directory, Node, Symlink
from ..core.permissions import Credentials, X, allowed
from ..core.sessions import Session
from ..verbs import Verbs
from ..verbs.plan import Plan, run
from .attrs import SETID, changes_of, clears_setid_only, entry_attributes, statvfs
from .cache import KernelCache
from .files import FileHandle, Files
from .metadata_view import META_NAME, MetadataView, MetaHandle, is_meta, meta_attrs
from .requests import OwnSteps, answer_now, credentials, decode_name, handler
from .xattrs import USER_PREFIX, Xattrs

DOTS = 2                     # "." and "..": the first entries of every directory snapshot
T = TypeVar("T")


# An open directory: its entries when opened, (name, node, shown as its .metadata mirror).
DirSnapshot = list[tuple[str, Node, bool]]


class Operations(pyfuse3.Operations):
    supports_dot_lookup = False
    # Write-through, not write-back: each write(2) reaches the device memory before it
    # returns, and the daemon, not the kernel, owns sizes and times, so that a change made
    # through the socket shows in the mount at once (docs/mount.md, "Consistency").
    enable_writeback_cache = False

    def __init__(self, verbs: Verbs, session: Session):
        super().__init__()
        self.v = verbs
        self.session = session          # the daemon's session: mount handles belong to it
        self.handles: dict[int, FileHandle | MetaHandle | DirSnapshot] = {}   # fh -> ...
        self._next_fh = 1
        self.kernel = KernelCache()     # what the kernel knows; the namespace's watcher
        self.meta = MetadataView(verbs.queries)
        self.files = Files(verbs, session, self.kernel)
        self.xattrs = Xattrs(verbs, session, truncated=self.files.drop_setid)
        self._own_steps = OwnSteps(self.kernel)    # a plan's steps on the loop (_run)
        self.pinned = (0, 0)    # [start, end): the page-locked receive buffer (write_now)
        self.pinned_writes = 0  # WRITEs whose bytes were in it (the unmount's log line)

    # =====================================================================================
    # inodes and handles
    # =====================================================================================
    def _remember(self, node: Node) -> pyfuse3.EntryAttributes:
        """The kernel is answered `node` (it counts a lookup): its attributes."""
        self.kernel.remember(node)
        return entry_attributes(node)

    def _node(self, inode: int) -> Node:
        """The node behind an inode: in the tree, or unlinked but still known to the
        kernel (an open file whose name is gone)."""
        node = self.v.queries.node_or_none(inode) or self.kernel.known(inode)
        if node is None:
            raise NotFound(f"no node with inode {inode}")
        return node

    def _plain_node(self, inode: int) -> Node | None:
        """The node of a tree inode; None for a .metadata one (no links, no xattrs)."""
        return None if is_meta(inode) else self._node(inode)

    def _alloc(self, inode: int) -> Allocation:
        node = self._node(inode)
        if not isinstance(node, Allocation):
            raise UsageError(f"'{node.path}' is a directory", details={"errno": "EISDIR"})
        return node

    def _add_fh(self, value: FileHandle | MetaHandle | DirSnapshot) -> int:
        fh, self._next_fh = self._next_fh, self._next_fh + 1
        self.handles[fh] = value
        return fh

    # The kernel passes file calls only handles from open/create, directory calls only those
    # from opendir: these two say so to the type checker, and name the errno if not.
    def _file(self, fh: int) -> FileHandle | MetaHandle:
        handle = self.handles[fh]
        if isinstance(handle, list):
            raise UsageError(f"handle {fh} is an open directory", details={"errno": "EISDIR"})
        return handle

    def _snapshot(self, fh: int) -> DirSnapshot:
        handle = self.handles[fh]
        if not isinstance(handle, list):
            raise UsageError(f"handle {fh} is an open file", details={"errno": "ENOTDIR"})
        return handle

    # =====================================================================================
    # lookup and attributes
    # =====================================================================================
    @handler
    def lookup(self, parent_inode, name, ctx):
        cred, text = credentials(ctx), decode_name(name)
        if is_meta(parent_inode):
            return self.meta.lookup(parent_inode, text, cred)
        if parent_inode == pyfuse3.ROOT_INODE and text == META_NAME:
            return meta_attrs(self._node(pyfuse3.ROOT_INODE))
        self._missing(parent_inode, name, text, cred)
        return self._remember(self.v.queries.lookup_child(parent_inode, text, cred))

    def _missing(self, parent_inode: int, raw: bytes, text: str, cred: Credentials) -> None:
        """ENOENT at once for a name not in the directory: every creat(2) of a new name
        is looked up first. The answer lookup_child would give, without building its
        error: the name is one the verbs take as it is, and the caller may search the
        directory (the kernel has checked that too: default_permissions)."""
        parent = self.v.queries.node_or_none(parent_inode)
        if isinstance(parent, Directory) and text not in parent.children and \
                0 < len(raw) <= MAX_COMPONENT_BYTES and allowed(parent, cred, X):
            raise pyfuse3.FUSEError(errno.ENOENT)

    @handler
    def forget(self, inode_list):
        for inode, count in inode_list:
            self.kernel.forget(inode, count)

    @handler
    def getattr(self, inode, ctx):
        if is_meta(inode):
            return meta_attrs(self.meta.node(inode))
        return entry_attributes(self._node(inode))

    @handler
    def setattr(self, inode, attr, fields, fh, ctx):
        """truncate/ftruncate, chmod, chown, utimes. The kernel has applied the permission
        rules (default_permissions runs setattr_prepare), so the verb is told so."""
        if is_meta(inode):
            raise pyfuse3.FUSEError(errno.EROFS)
        cred, node = credentials(ctx), self._node(inode)
        if self._kills_setid_of_unlinked(node, attr, fields):
            return entry_attributes(node)
        if fields.update_size:
            self.v.data.resize(self._alloc(inode), cred, attr.st_size, session=self.session,
                               authorised=True)
            if not fields.update_mode:        # an explicit mode in the same call wins
                self.files.drop_setid(node, cred)
        changes = changes_of(attr, fields)
        if changes:
            self.v.names.setattr(node.id, cred, authorised=True, **changes)
        return entry_attributes(node)

    def _kills_setid_of_unlinked(self, node: Node, attr, fields) -> bool:
        """The kernel clears the set-id bits before a page-cache write by a process without
        CAP_FSETID, with a setattr of the mode alone. An unlinked file has no row left to
        store it in; the write itself must still go on."""
        return clears_setid_only(node, attr, fields) and \
            self.v.queries.node_or_none(node.id) is not node

    # =====================================================================================
    # namespace
    # =====================================================================================
    @handler
    def mkdir(self, parent_inode, name, mode, ctx):
        self._writable_parent(parent_inode)
        return self._remember(self.v.names.mkdir_child(
            parent_inode, decode_name(name), credentials(ctx), stat.S_IMODE(mode)))

    @handler
    def create(self, parent_inode, name, mode, flags, ctx):
        self._writable_parent(parent_inode)
        cred, text = credentials(ctx), decode_name(name)
        try:
            alloc = self.v.names.create_pending(parent_inode, text, cred, stat.S_IMODE(mode))
        except Exists:
            if flags & os.O_EXCL:
                raise
            alloc = self.files.existing_for_create(parent_inode, text, cred, flags)
            fh = self._add_fh(self.files.open(alloc, cred, flags))
        else:
            fh = self._add_fh(self.files.open_new(alloc, cred, flags))
        self.kernel.remember(alloc)
        return self.files.info(fh, alloc, flags), entry_attributes(alloc)

    @handler
    def mknod(self, parent_inode, name, mode, rdev, ctx):
        self._writable_parent(parent_inode)
        cred, text = credentials(ctx), decode_name(name)
        if stat.S_ISREG(mode):
            node: Node = self.v.names.create_pending(parent_inode, text, cred,
                                                     stat.S_IMODE(mode))
        else:     # a FIFO, socket (bind(2)) or device node: metadata only
            node = self.v.names.mknod_child(parent_inode, text, cred, stat.S_IMODE(mode),
                                            stat.S_IFMT(mode), rdev)
        return self._remember(node)

    @handler
    def unlink(self, parent_inode, name, ctx):
        self._writable_parent(parent_inode)
        text = decode_name(name)
        parent = self.v.queries.node_or_none(parent_inode)
        child = parent.children.get(text) if isinstance(parent, Directory) else None
        if isinstance(child, Allocation):
            # `rm -r` right after `tar -xf`: its block's pending parity encoded once for
            # all, not zeroed and encoded for each file removed (DataVerbs.settle)
            self.v.data.settle(child)
        self.v.names.unlink_child(parent_inode, text, credentials(ctx))

    @handler
    def rmdir(self, parent_inode, name, ctx):
        self._writable_parent(parent_inode)
        self.v.names.rmdir_child(parent_inode, decode_name(name), credentials(ctx))

    @handler
    def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
        self._writable_parent(parent_inode_old)
        self._writable_parent(parent_inode_new)
        if flags & pyfuse3.RENAME_EXCHANGE:
            self.v.names.exchange(parent_inode_old, decode_name(name_old), parent_inode_new,
                                  decode_name(name_new), credentials(ctx))
            return
        self.v.names.rename(parent_inode_old, decode_name(name_old), parent_inode_new,
                            decode_name(name_new), credentials(ctx),
                            replace=not flags & pyfuse3.RENAME_NOREPLACE)

    @handler
    def link(self, inode, new_parent_inode, new_name, ctx):
        self._writable_parent(new_parent_inode)
        if is_meta(inode):
            raise pyfuse3.FUSEError(errno.EROFS)
        return self._remember(self.v.names.link_child(
            inode, new_parent_inode, decode_name(new_name), credentials(ctx)))

    @handler
    def symlink(self, parent_inode, name, target, ctx):
        self._writable_parent(parent_inode)
        return self._remember(self.v.names.symlink_child(
            parent_inode, decode_name(name), decode_name(target), credentials(ctx)))

    @handler
    def readlink(self, inode, ctx):
        node = self._plain_node(inode)
        if not isinstance(node, Symlink):
            raise pyfuse3.FUSEError(errno.EINVAL)
        return name_bytes(node.target)

    @staticmethod
    def _writable_parent(inode: int) -> None:
        if is_meta(inode):
            raise pyfuse3.FUSEError(errno.EROFS)

    # =====================================================================================
    # files
    # =====================================================================================
    @handler
    def open(self, inode, flags, ctx):
        if is_meta(inode):
            # Direct I/O: the text is made per open, and st_size is that of another one.
            return pyfuse3.FileInfo(fh=self._add_fh(self.meta.open(inode, flags,
                                                                   credentials(ctx))),
                                    direct_io=True, keep_cache=False)
        alloc = self._alloc(inode)
        fh = self._add_fh(self.files.open(alloc, credentials(ctx), flags))
        return self.files.info(fh, alloc, flags)

    @handler
    def read(self, fh, off, size):
        handle = self._file(fh)
        if isinstance(handle, MetaHandle):
            return handle.text[off:off + size]
        self.v.names.note_access(handle.alloc)   # also at open (Files): for one kept open
        return self.v.data.view_at(handle.alloc, off, size)

    @handler
    def write(self, fh, off, buf, pinned_at: int | None = None):
        handle = self._file(fh)
        if isinstance(handle, MetaHandle):    # opened read-only: the kernel refuses first
            raise UsageError("a .metadata file is read-only", details={"errno": "EBADF"})
        written = self.v.data.write_at(handle.alloc, off, buf, session=self.session,
                                       pinned_at=pinned_at)
        if handle.alloc.mode & SETID:                 # rare: most files have neither bit
            self.files.drop_setid(handle.alloc, handle.cred, handle)
        return written

    def write_now(self, fh: int, off: int, view: memoryview, addr: int) -> int:
        """WRITE served by the init-flags library (initflags.serve_writes; docs/mount.md,
        "Writes from C"): the same handler, called at once with a view of
        libfuse's buffer (at `addr`), never a copy; where the view lies in the page-locked
        part of the receive buffer (Mount.open), its bytes go to the device by DMA from
        there. Returns the count written, or -errno: it must not raise."""
        start, end = self.pinned
        pinned = None
        if start <= addr and addr + len(view) <= end:
            pinned = addr
            self.pinned_writes += 1
        try:
            return answer_now(self, Operations.write.__wrapped__, (fh, off, view, pinned))
        except pyfuse3.FUSEError as exc:
            return -exc.errno

    async def flush(self, fh):
        # Sent at every close(2), synchronously. There is nothing to do before release (the
        # last close) and fsync: ENOSYS makes the kernel stop sending it, one round trip
        # less per close.
        raise pyfuse3.FUSEError(errno.ENOSYS)

    # fsync and the last close encode the parity of what was written on a worker thread: each
    # is a verb's plan (daemon/verbs/plan.py), run inside the error boundary, and the mount
    # serves other requests meanwhile.
    @handler
    async def fsync(self, fh, datasync):
        handle = self._file(fh)
        if not isinstance(handle, MetaHandle):
            await self._run(self.v.data.sync(handle.alloc))

    @handler
    async def release(self, fh):
        handle = self.handles.pop(fh)
        if isinstance(handle, FileHandle):
            await self._run(self.v.handles.release_mount(handle.holder))

    async def _run(self, plan: Plan[T]) -> T:
        """Each of the plan's steps on the loop is the mount's own request (OwnSteps); its
        work off the loop is not: other requests run meanwhile."""
        return await run(plan, within=self._own_steps)

    # =====================================================================================
    # directories
    # =====================================================================================
    @handler
    def opendir(self, inode, ctx):
        meta = is_meta(inode)
        directory = self.meta.node(inode) if meta else self._node(inode)
        if not isinstance(directory, Directory):
            raise UsageError("not a directory", details={"errno": "ENOTDIR"})
        if not meta:
            self.v.names.note_access(directory)
        # A snapshot: listing positions stay valid while entries come and go. Each entry is
        # (name, node, whether it is shown as its .metadata mirror).
        entries = self._dots(directory, meta) + \
            [(name, node, meta) for name, node in sorted(directory.children.items())]
        return self._add_fh(entries)

    @staticmethod
    def _dots(directory: Directory, meta: bool) -> DirSnapshot:
        """"." and "..": the root's ".." is the root; that of /.metadata is the root too."""
        if directory.parent is not None:
            return [(".", directory, meta), ("..", directory.parent, meta)]
        return [(".", directory, meta), ("..", directory, False)]

    @handler
    def readdir(self, fh, start_id, token):
        entries = self._snapshot(fh)
        for index in range(start_id, len(entries)):
            name, node, meta = entries[index]
            dot = index < DOTS
            if not dot and self.v.queries.node_or_none(node.id) is not node:
                continue                       # removed since opendir
            attrs = meta_attrs(node) if meta else entry_attributes(node)
            if not pyfuse3.readdir_reply(token, name_bytes(name), attrs, index + 1):
                break
            if not meta and not dot:           # the kernel counts no lookup for dots
                self.kernel.remember(node)

    @handler
    def releasedir(self, fh):
        self.handles.pop(fh, None)

    @handler
    def fsyncdir(self, fh, datasync):
        pass       # namespace changes are committed to the registry as they happen

    @handler
    def statfs(self, ctx):
        return statvfs(self.v.reports.devices(), self.v.queries.node_count())

    # =====================================================================================
    # extended attributes (daemon/fs/xattrs.py: the table, and what each request does)
    # =====================================================================================
    @handler
    def getxattr(self, inode, name, ctx):
        if not name.startswith(USER_PREFIX):
            # The kernel asks for security.capability before every write through the page
            # cache (file_remove_privs): answered without looking anything up.
            raise pyfuse3.FUSEError(errno.ENODATA)
        return self.xattrs.get(self._plain_node(inode), name, credentials(ctx))

    @handler
    def listxattr(self, inode, ctx):
        return self.xattrs.names(self._plain_node(inode))

    @handler
    def setxattr(self, inode, name, value, ctx):
        self.xattrs.set(self._plain_node(inode), name, value, credentials(ctx))

    @handler
    def removexattr(self, inode, name, ctx):
        self.xattrs.remove(self._plain_node(inode), name, credentials(ctx))
