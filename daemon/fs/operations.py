"""The FUSE filesystem (pyfuse3): every file an allocation, every directory a directory of
the same namespace the socket API serves.

The Operations class is a set of thin handlers over the verbs (daemon/verbs/): each
translates the kernel's request into one verb call (or runs its plan) and the answer back.
Protocol errors become `FUSEError(errno)` only here, through daemon/errno_map.py; an
unexpected exception is logged with its traceback and answered EIO, so a bug fails one
request and never the mount.

Choices a user can observe (docs/mount.md says more):
- Files go through the kernel's page cache, write-through (no writeback cache: the daemon
  owns sizes and times, and a write is in device memory when write(2) returns), so shared
  mmap(2) works. When another path changes an allocation's bytes or size (a socket writer's
  close, a detach or seal, a repair), the namespace's watchers drop the file's cached pages
  before that request is answered, and an open keeps the kernel's pages only if the data
  generation is the one they were filled at (daemon/fs_cache.py; docs/mount.md,
  "Consistency", has the rules).
- The kernel enforces permissions (default_permissions); the verbs check them again with
  the same rules, except where the kernel's check is the only right one (setattr, I/O on an
  open handle).
- Entries and attributes are cached for ENTRY_TIMEOUT seconds; a change made through the
  socket API invalidates them at once (the namespace's watchers call this class).
- `/.metadata/<path>` mirrors the tree read-only: directories as directories, each
  allocation as a file holding what `gpumemctl info --json` prints. It is hidden from the
  root's listing (like ZFS's .zfs) and is never an allocation.
- Symbolic links are nodes of the namespace (daemon/nodes.Symlink): symlink makes one,
  readlink answers its target as given, and the kernel follows them (O_NOFOLLOW, ELOOP and
  the 40-link limit are its own). An absolute target is a plain string, never resolved
  here. A hard link (link) is one more name of the same node: one allocation, several
  names (st_nlink); a directory cannot have one (EPERM).
- mknod makes FIFOs, sockets and character and block device nodes as tmpfs does: metadata
  only (daemon/nodes.Special). The kernel gives FIFOs and sockets their behaviour without
  asking us; the mount is nodev, so a device node never opens its device (EACCES).
- rename honours RENAME_NOREPLACE and RENAME_EXCHANGE.
- Extended attributes: `user.gpu.*` are gpumemd's own (daemon/xattrs.py); every other
  `user.KEY` of an allocation or directory is its user metadata (daemon/usermeta.py), the
  same that `gpumemctl meta` serves.
- An unlinked file keeps its memory while it is open; the memory goes with its last close.
- open(2) with O_TRUNC truncates (libfuse 3 negotiates atomic O_TRUNC, so the flag arrives
  in the open, not as a setattr), as does a create that finds the name taken meanwhile.
- Set-id bits: a write or truncate by a process without CAP_FSETID clears them. The kernel
  does it for truncate(2) (the new mode rides on its setattr), not for O_TRUNC (atomic: no
  setattr): _drop_setid does it. For a write the kernel clears them itself (page-cache
  writes go through its file_remove_privs, a setattr of the mode); _drop_setid at a write
  stays as a second line, by the rights of the process that opened the file.
- Access times are stored; opens for reading, reads and listings move them by the relatime
  rule (reads from the page cache never reach the daemon).
- A size larger than any device could hold is EFBIG; one that does not fit now, ENOSPC.
- Every listing starts with "." and ".." (the root's ".." is the root).
"""
from __future__ import annotations

import errno
import functools
import inspect
import json
import logging
import os
import stat
from typing import TypeVar

import pyfuse3
import trio

from gpumemctl.protocol import (
    Exists,
    GpumemError,
    NotFound,
    UsageError,
    name_bytes,
    name_from_bytes,
)
from gpumemctl.protocol.names import MAX_COMPONENT_BYTES

from ..core.describe import describe
from ..core.nodes import Allocation, Directory, Node, Special, Symlink
from ..core.permissions import Credentials, R, W, X, allowed, require, supplementary_groups
from ..core.sessions import Session
from ..logbudget import CLIENT_UID
from ..verbs import Verbs
from ..verbs.plan import Plan, run
from . import cache as fs_cache
from . import xattrs
from .cache import DATA, Invalidation, PageCache
from .errno_map import errno_for

log = logging.getLogger("gpumemd.fs")

ENTRY_TIMEOUT = 5.0          # seconds; socket-side changes invalidate earlier (watchers)
META_NAME = ".metadata"
META_BASE = 1 << 62          # the .metadata mirror of node N has inode META_BASE + N
BLOCK = 1 << 20              # st_blksize: cp and dd size their buffers by it
STATFS_BLOCK = 4096
CAP_FSETID = 4               # capability(7) bit: keep set-id bits through writes
SETID = stat.S_ISUID | stat.S_ISGID
XATTR_PREFIX = xattrs.PREFIX.encode()
DOTS = 2                     # "." and "..": the first entries of every directory snapshot
T = TypeVar("T")


class ProcGroups:
    """A process's supplementary groups, read from /proc only if a check needs them (most
    requests are decided by uid alone: root, or the owner).

    /proc and not SO_PEERGROUPS as the socket does (daemon/permissions.py): a FUSE request
    carries the caller's pid, uid and gid and nothing else, and there is no socket of the
    caller's to ask. So this is what the kernel offers. It is read while the request is
    being served, while the caller normally still waits in its system call (a caller killed
    meanwhile could leave its pid to another process: a narrow window, and the kernel has
    checked the permission bits already wherever default_permissions applies)."""

    def __init__(self, pid: int):
        self.pid = pid
        self._groups: frozenset[int] | None = None

    def __contains__(self, gid: object) -> bool:
        if self._groups is None:
            self._groups = supplementary_groups(self.pid)
        return gid in self._groups


def credentials(ctx) -> Credentials:
    return Credentials(pid=ctx.pid, uid=ctx.uid, gid=ctx.gid, groups=ProcGroups(ctx.pid))


def has_fsetid(cred: Credentials) -> bool:
    """Whether the process holds CAP_FSETID (its writes keep the set-id bits): its effective
    capabilities in /proc; where the process is gone, whether it was root."""
    try:
        with open(f"/proc/{cred.pid}/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_FSETID & 1)
    except (OSError, ValueError, IndexError):
        pass
    return cred.is_root


def without_setid(node: Node, cred: Credentials) -> int:
    """The mode after a write or truncate by a process without CAP_FSETID, as this kernel
    does it on tmpfs and ext4 (setattr_should_drop_suidgid): S_ISUID goes; S_ISGID goes
    where group-exec is set, and also without it when the process is not in the file's
    group (without group-exec the bit once meant mandatory locking, which a group member
    keeps)."""
    mode = node.mode & ~stat.S_ISUID
    if mode & stat.S_ISGID and (mode & stat.S_IXGRP or not cred.in_group(node.gid)):
        mode &= ~stat.S_ISGID
    return mode


def decode_name(raw: bytes) -> str:
    """A name from the kernel, spelled as the socket API spells it: any bytes but NUL and
    `/` (the kernel lets neither through), so one that is not UTF-8 too, with
    surrogateescape (gpumemctl/protocol/names.py)."""
    return name_from_bytes(raw)


def handler(method):
    """The error boundary of every operation (see the module docstring). A plain method is
    also marked as the mount's own request, so the watchers do not invalidate what the
    kernel knows; an async one (a plan's: fsync, release) marks each of its steps on the
    loop itself (Operations._run), never the time it waits. The lines a request logs are its
    uid's (daemon/logbudget.py): FUSE passes the request context last. read, write and the
    handle ops take none: what they log is not counted against anyone (their refusals log
    nothing; a bug's traceback does)."""
    if inspect.iscoroutinefunction(method):
        @functools.wraps(method)
        async def run_async(self, *args):
            client = CLIENT_UID.set(getattr(args[-1], "uid", None) if args else None)
            try:
                return await method(self, *args)
            except Exception as exc:  # noqa: BLE001 - _fuse_error logs a bug's traceback
                raise _fuse_error(method.__name__, args, exc) from None
            finally:
                CLIENT_UID.reset(client)
        return run_async

    @functools.wraps(method)
    async def wrapper(self, *args):
        self._own_request = True
        client = CLIENT_UID.set(getattr(args[-1], "uid", None) if args else None)
        try:
            return method(self, *args)
        except Exception as exc:  # noqa: BLE001 - _fuse_error logs a bug's traceback
            raise _fuse_error(method.__name__, args, exc) from None
        finally:
            CLIENT_UID.reset(client)
            self._own_request = False
    return wrapper


class OwnSteps:
    """Entered around each step on the loop of a plan the mount runs: while inside, a change
    is the mount's own (Operations._own_request), as during a plain operation."""

    def __init__(self, ops: Operations):
        self.ops = ops

    def __enter__(self) -> None:
        self.ops._own_request = True

    def __exit__(self, *exc) -> None:
        self.ops._own_request = False


def _fuse_error(name: str, args: tuple, exc: Exception) -> pyfuse3.FUSEError:
    """What the kernel is answered (called while `exc` is being handled)."""
    if isinstance(exc, pyfuse3.FUSEError):
        return exc
    if isinstance(exc, GpumemError):
        log.debug("%s%r: %s", name, args[:2], exc)
        return pyfuse3.FUSEError(errno_for(exc))
    log.exception("%s%r failed", name, args[:2])
    return pyfuse3.FUSEError(errno.EIO)


class MetaHandle:
    """An open .metadata file: the JSON, fixed at open so reads are consistent."""

    def __init__(self, text: bytes):
        self.text = text


class FileHandle:
    """A file open on the mount: its holder, and who opened it. FUSE tells the filesystem
    nothing of the process behind a write, so the opener stands in for the writer when a
    write decides whether the set-id bits go (Operations._drop_setid)."""

    def __init__(self, holder, cred: Credentials):
        self.holder, self.alloc, self.cred = holder, holder.alloc, cred
        self._fsetid: bool | None = None

    def keeps_setid(self) -> bool:
        if self._fsetid is None:          # read from /proc once, and only when it matters
            self._fsetid = has_fsetid(self.cred)
        return self._fsetid


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
        self._lookups: dict[int, int] = {}         # inode -> the kernel's lookup count
        self._known: dict[int, Node] = {}          # inode -> node, while the kernel has it
        self._own_request = False
        self._own_steps = OwnSteps(self)           # a plan's steps on the loop (_run)
        self._stale: list[Invalidation] = []      # delivered by settle()
        self.page_cache = PageCache()             # what the kernel's pages hold, per inode
        self.mounted = False

    # =====================================================================================
    # inodes, attributes, the kernel's lookup count
    # =====================================================================================
    def _remember(self, node: Node) -> None:
        self._lookups[node.id] = self._lookups.get(node.id, 0) + 1
        self._known[node.id] = node

    def _node(self, inode: int) -> Node:
        """The node behind an inode: in the tree, or unlinked but still known to the
        kernel (an open file whose name is gone)."""
        node = self.v.queries.node_or_none(inode) or self._known.get(inode)
        if node is None:
            raise NotFound(f"no node with inode {inode}")
        return node

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

    @staticmethod
    def _attrs(node: Node) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = node.id
        a.entry_timeout = a.attr_timeout = ENTRY_TIMEOUT
        a.st_mode = node.st_mode
        a.st_uid, a.st_gid = node.uid, node.gid
        a.st_blksize = BLOCK
        a.st_nlink = node.nlink
        if isinstance(node, Allocation):
            a.st_size = node.size or 0
            a.st_blocks = (node.capacity or 0) // 512 if node.buffer is not None else 0
        elif isinstance(node, Directory):
            a.st_size = 0
        elif isinstance(node, Symlink):
            a.st_size = len(name_bytes(node.target))      # lstat(2): the target's bytes
        elif isinstance(node, Special):
            a.st_size = 0
            a.st_rdev = node.rdev
        a.st_mtime_ns = node.modified_ns
        # (None only before Node.__post_init__, which sets the modification time)
        a.st_atime_ns = node.modified_ns if node.accessed_ns is None else node.accessed_ns
        a.st_ctime_ns = node.changed_ns
        a.st_birthtime_ns = node.created_ns
        return a

    # ---- the .metadata mirror ------------------------------------------------------------
    @staticmethod
    def _is_meta(inode: int) -> bool:
        return inode >= META_BASE

    def _meta_node(self, inode: int) -> Node:
        node = self.v.queries.node_or_none(inode - META_BASE)
        if node is None:
            raise NotFound(f"no metadata inode {inode}")
        return node

    @staticmethod
    def _meta_text(node: Node, cred: Credentials | None = None) -> bytes:
        """What `gpumemctl info --json` prints for `cred`: the user metadata when it may
        read the node, null when not, and the names it may search to. Without `cred` (the
        size in a stat, which is only a guess: the file is read with direct I/O) both are
        left out."""
        metadata = None if cred is None else allowed(node, cred, R)
        shown = describe(node, holders=True, metadata=metadata, names=cred is not None,
                         cred=cred)
        return (json.dumps(shown, indent=2) + "\n").encode()

    def _meta_attrs(self, node: Node) -> pyfuse3.EntryAttributes:
        a = self._attrs(node)
        a.st_ino = META_BASE + node.id
        if isinstance(node, Directory):
            a.st_mode = stat.S_IFDIR | (node.mode & 0o555)
        else:
            a.st_mode, a.st_nlink = stat.S_IFREG | 0o444, 1
            a.st_size, a.st_blocks = len(self._meta_text(node)), 0
        a.entry_timeout = a.attr_timeout = 0      # sizes and contents change all the time
        return a

    def _meta_lookup(self, parent_inode: int, name: str, cred: Credentials):
        parent = self._meta_node(parent_inode)
        return self._meta_attrs(self.v.queries.lookup_child(parent.id, name, cred))

    # =====================================================================================
    # the namespace's watchers: changes made through the socket API
    # =====================================================================================
    # The kernel must hear of a change before the socket client that made it gets its
    # answer ("agree at once"), but telling it from this thread could deadlock: the kernel
    # may wait for a directory lock held by a request that this thread is to answer. So
    # changes are queued here and the socket server awaits settle() before it replies, which
    # delivers them from a worker thread while this loop keeps answering the kernel.
    def entry_changed(self, parent_id: int, name: str) -> None:
        if self.mounted and not self._own_request and \
                (parent_id == pyfuse3.ROOT_INODE or parent_id in self._known):
            self._stale.append((parent_id, name_bytes(name)))

    def attrs_changed(self, node_id: int) -> None:
        if self.mounted and not self._own_request and node_id in self._known:
            self._stale.append((node_id, None))

    def data_changed(self, node_id: int) -> None:
        """Bytes or size changed by another path: the kernel's pages of the file go too
        (daemon/fs_cache.py). The mount's own truncates are the kernel's to apply."""
        if self.mounted and not self._own_request and node_id in self._known:
            self._stale.append((node_id, DATA))

    async def settle(self) -> None:
        if self._stale and self.mounted:
            batch, self._stale = self._stale, []
            await trio.to_thread.run_sync(fs_cache.invalidate, batch)

    # =====================================================================================
    # lookup and attributes
    # =====================================================================================
    @handler
    def lookup(self, parent_inode, name, ctx):
        cred, text = credentials(ctx), decode_name(name)
        if self._is_meta(parent_inode):
            return self._meta_lookup(parent_inode, text, cred)
        if parent_inode == pyfuse3.ROOT_INODE and text == META_NAME:
            return self._meta_attrs(self._node(pyfuse3.ROOT_INODE))
        self._missing(parent_inode, name, text, cred)
        node = self.v.queries.lookup_child(parent_inode, text, cred)
        self._remember(node)
        return self._attrs(node)

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
            left = self._lookups.get(inode, 0) - count
            if left > 0:
                self._lookups[inode] = left
            else:
                self._lookups.pop(inode, None)
                self._known.pop(inode, None)
                self.page_cache.forget(inode)

    @handler
    def getattr(self, inode, ctx):
        if self._is_meta(inode):
            return self._meta_attrs(self._meta_node(inode))
        return self._attrs(self._node(inode))

    @handler
    def setattr(self, inode, attr, fields, fh, ctx):
        """truncate/ftruncate, chmod, chown, utimes. The kernel has applied the permission
        rules (default_permissions runs setattr_prepare), so the verb is told so."""
        if self._is_meta(inode):
            raise pyfuse3.FUSEError(errno.EROFS)
        cred, node = credentials(ctx), self._node(inode)
        if self._kills_setid_of_unlinked(node, attr, fields):
            return self._attrs(node)
        if fields.update_size:
            self.v.data.resize(self._alloc(inode), cred, attr.st_size, session=self.session,
                          authorised=True)
            if not fields.update_mode:        # an explicit mode in the same call wins
                self._drop_setid(node, cred)
        changes = {}
        if fields.update_mode:
            changes["mode"] = stat.S_IMODE(attr.st_mode)
        if fields.update_uid:
            changes["uid"] = attr.st_uid
        if fields.update_gid:
            changes["gid"] = attr.st_gid
        if fields.update_mtime:
            changes["mtime_ns"] = attr.st_mtime_ns
        if fields.update_atime:
            changes["atime_ns"] = attr.st_atime_ns
        if changes:
            self.v.names.setattr(node.id, cred, authorised=True, **changes)
        return self._attrs(node)

    def _kills_setid_of_unlinked(self, node: Node, attr, fields) -> bool:
        """The kernel clears the set-id bits before a page-cache write by a process without
        CAP_FSETID, with a setattr of the mode alone. An unlinked file has no row left to
        store it in; the write itself must still go on."""
        only_mode = fields.update_mode and not (
            fields.update_size or fields.update_uid or fields.update_gid or
            fields.update_mtime or fields.update_atime)
        setid = stat.S_ISUID | stat.S_ISGID
        return bool(only_mode) and self.v.queries.node_or_none(node.id) is not node and \
            stat.S_IMODE(attr.st_mode) | setid == stat.S_IMODE(node.mode) | setid

    # =====================================================================================
    # namespace
    # =====================================================================================
    @handler
    def mkdir(self, parent_inode, name, mode, ctx):
        self._writable_parent(parent_inode)
        node = self.v.names.mkdir_child(parent_inode, decode_name(name), credentials(ctx),
                                  stat.S_IMODE(mode))
        self._remember(node)
        return self._attrs(node)

    @handler
    def create(self, parent_inode, name, mode, flags, ctx):
        self._writable_parent(parent_inode)
        cred, text = credentials(ctx), decode_name(name)
        try:
            alloc = self.v.names.create_pending(parent_inode, text, cred, stat.S_IMODE(mode))
        except Exists:
            if flags & os.O_EXCL:
                raise
            alloc = self._existing_for_create(parent_inode, text, cred, flags)
            fh = self._open_file(alloc, cred, flags)
        else:
            fh = self._add_fh(FileHandle(
                self.v.handles.open_mount(alloc, cred, self.session, _writable(flags)), cred))
        self._remember(alloc)
        return self._alloc_info(fh, alloc, flags), self._attrs(alloc)

    def _existing_for_create(self, parent_inode: int, name: str, cred: Credentials,
                             flags: int) -> Allocation:
        """open(O_CREAT) of a name made (through the socket API) after the kernel looked it
        up: open it as it is. The kernel believes it created the file, so it checked no
        permission on it and left O_TRUNC to us (_open_file)."""
        node = self.v.queries.lookup_child(parent_inode, name, cred)
        if not isinstance(node, Allocation):
            raise UsageError(f"'{node.path}' is a directory", details={"errno": "EISDIR"})
        wanted = R if flags & os.O_ACCMODE == os.O_RDONLY else W
        if flags & os.O_ACCMODE == os.O_RDWR:
            wanted = R | W
        require(node, cred, wanted | (W if flags & os.O_TRUNC else 0))
        return node

    @handler
    def mknod(self, parent_inode, name, mode, rdev, ctx):
        self._writable_parent(parent_inode)
        cred, text = credentials(ctx), decode_name(name)
        if stat.S_ISREG(mode):
            node: Node = self.v.names.create_pending(parent_inode, text, cred, stat.S_IMODE(mode))
        else:     # a FIFO, socket (bind(2)) or device node: metadata only
            node = self.v.names.mknod_child(parent_inode, text, cred, stat.S_IMODE(mode),
                                      stat.S_IFMT(mode), rdev)
        self._remember(node)
        return self._attrs(node)

    @handler
    def unlink(self, parent_inode, name, ctx):
        self._writable_parent(parent_inode)
        self.v.names.unlink_child(parent_inode, decode_name(name), credentials(ctx))

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
        if self._is_meta(inode):
            raise pyfuse3.FUSEError(errno.EROFS)
        node = self.v.names.link_child(inode, new_parent_inode, decode_name(new_name),
                                 credentials(ctx))
        self._remember(node)
        return self._attrs(node)

    @handler
    def symlink(self, parent_inode, name, target, ctx):
        self._writable_parent(parent_inode)
        link = self.v.names.symlink_child(parent_inode, decode_name(name), decode_name(target),
                                    credentials(ctx))
        self._remember(link)
        return self._attrs(link)

    @handler
    def readlink(self, inode, ctx):
        node = None if self._is_meta(inode) else self._node(inode)
        if not isinstance(node, Symlink):
            raise pyfuse3.FUSEError(errno.EINVAL)
        return name_bytes(node.target)

    def _writable_parent(self, inode: int) -> None:
        if self._is_meta(inode):
            raise pyfuse3.FUSEError(errno.EROFS)

    # =====================================================================================
    # files
    # =====================================================================================
    def _alloc_info(self, fh: int, alloc: Allocation, flags: int) -> pyfuse3.FileInfo:
        """An allocation opened through the page cache: the kernel keeps the pages it has
        only if nothing changed them since it filled them (daemon/fs_cache.py). A
        write-only open goes direct: no mapping can come of it (mmap needs read access), and
        a bulk writer (`cp`, `dd of=`) then sends whole 1 MiB writes straight to the device
        memory instead of copying each page through the cache first. The kernel drops the
        cached pages of the range such a write covers (docs/mount.md, "Consistency")."""
        if flags & os.O_ACCMODE == os.O_WRONLY:
            self.page_cache.keep(alloc.id, None)        # cached pages of others may be old
            return pyfuse3.FileInfo(fh=fh, direct_io=True, keep_cache=False)
        keep = self.page_cache.keep(alloc.id, self.v.queries.cache_generation(alloc))
        return pyfuse3.FileInfo(fh=fh, direct_io=False, keep_cache=keep)

    @handler
    def open(self, inode, flags, ctx):
        if self._is_meta(inode):
            if _writable(flags):
                raise pyfuse3.FUSEError(errno.EROFS)
            node = self._meta_node(inode)
            # Direct I/O: the text is made per open, and st_size is that of another one.
            text = self._meta_text(node, credentials(ctx))
            return pyfuse3.FileInfo(fh=self._add_fh(MetaHandle(text)),
                                    direct_io=True, keep_cache=False)
        alloc = self._alloc(inode)
        return self._alloc_info(self._open_file(alloc, credentials(ctx), flags), alloc,
                                flags)

    def _open_file(self, alloc: Allocation, cred: Credentials, flags: int) -> int:
        """Open an allocation; O_TRUNC truncates it first. libfuse 3 asks the kernel for
        atomic O_TRUNC, so the truncation arrives here, inside the open, never as a setattr;
        the kernel has checked write permission for it (as for any O_TRUNC)."""
        if flags & os.O_TRUNC:
            self.v.data.truncate_on_open(alloc, cred, self.session)
            self._drop_setid(alloc, cred)
        holder = self.v.handles.open_mount(alloc, cred, self.session, _writable(flags))
        if flags & os.O_ACCMODE != os.O_WRONLY:
            self._note_read(alloc)
        return self._add_fh(FileHandle(holder, cred))

    def _note_read(self, alloc: Allocation) -> None:
        """Access time, by relatime, at an open for reading: reads served from the page
        cache never reach the daemon. The kernel caches atime with the other attributes
        (its own read requests drop it, an open does not), so it is told here, at once:
        dropping attributes takes no lock the kernel could hold on this open."""
        before = alloc.accessed_ns
        self.v.names.note_access(alloc)
        if alloc.accessed_ns != before:
            fs_cache.invalidate([(alloc.id, None)])

    def _drop_setid(self, node: Node, cred: Credentials, handle: FileHandle | None = None
                    ) -> None:
        """After a write or truncate: clear the set-id bits as Linux does (without_setid),
        unless the process holds CAP_FSETID (for a write: the opener, see FileHandle). The
        kernel sends no setattr for this on O_TRUNC or a direct I/O write, and on truncate(2)
        it leaves S_ISGID without group-exec alone (docs/mount.md, "Set-user-ID and
        set-group-ID")."""
        if not node.mode & (stat.S_ISUID | stat.S_ISGID):
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

    @handler
    def read(self, fh, off, size):
        handle = self._file(fh)
        if isinstance(handle, MetaHandle):
            return handle.text[off:off + size]
        self.v.names.note_access(handle.alloc)     # also at open (_note_read): for a file kept open
        return self.v.data.view_at(handle.alloc, off, size)

    @handler
    def write(self, fh, off, buf):
        handle = self._file(fh)
        if isinstance(handle, MetaHandle):    # opened read-only: the kernel refuses first
            raise UsageError("a .metadata file is read-only", details={"errno": "EBADF"})
        written = self.v.data.write_at(handle.alloc, off, buf, session=self.session)
        if handle.alloc.mode & SETID:                 # rare: most files have neither bit
            self._drop_setid(handle.alloc, handle.cred, handle)
        return written

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
        meta = self._is_meta(inode)
        directory = self._meta_node(inode) if meta else self._node(inode)
        if not isinstance(directory, Directory):
            raise UsageError("not a directory", details={"errno": "ENOTDIR"})
        if not meta:
            self.v.names.note_access(directory)
        # A snapshot: listing positions stay valid while entries come and go. Each entry is
        # (name, node, whether it is shown as its .metadata mirror).
        entries = self._dots(directory, meta) + \
            [(name, node, meta) for name, node in sorted(directory.children.items())]
        return self._add_fh(entries)

    def _dots(self, directory: Directory, meta: bool) -> list[tuple[str, Node, bool]]:
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
            attrs = self._meta_attrs(node) if meta else self._attrs(node)
            if not pyfuse3.readdir_reply(token, name_bytes(name), attrs, index + 1):
                break
            if not meta and not dot:           # the kernel counts no lookup for dots
                self._remember(node)

    @handler
    def releasedir(self, fh):
        self.handles.pop(fh, None)

    @handler
    def fsyncdir(self, fh, datasync):
        pass       # namespace changes are committed to the registry as they happen

    @handler
    def statfs(self, ctx):
        devices = self.v.reports.devices()
        s = pyfuse3.StatvfsData()
        s.f_bsize = s.f_frsize = STATFS_BLOCK
        s.f_blocks = sum(d.total for d in devices) // STATFS_BLOCK
        s.f_bfree = s.f_bavail = sum(d.free for d in devices) // STATFS_BLOCK
        s.f_files = 1 << 32
        s.f_ffree = s.f_favail = s.f_files - self.v.queries.node_count()
        s.f_namemax = 255
        return s

    # =====================================================================================
    # extended attributes (daemon/xattrs.py has the table)
    # =====================================================================================
    # Two kinds of names: ours, user.gpu.* (xattrs.NAMES), and user.KEY for every other key,
    # the node's user metadata (daemon/usermeta.py). The kernel has checked the permission
    # of a user.* name before it asks (default_permissions: read to get, write to set or
    # remove, the owner for a sticky directory; EPERM for a set on anything but a file or a
    # directory), so the verb is told so. XATTR_CREATE and XATTR_REPLACE reach us as a
    # getxattr before the setxattr (pyfuse3 does that, in one task: nothing runs between).
    @handler
    def getxattr(self, inode, name, ctx):
        if not name.startswith(xattrs.USER_PREFIX):
            # The kernel asks for security.capability before every write through the page
            # cache (file_remove_privs): answered without looking anything up.
            raise pyfuse3.FUSEError(errno.ENODATA)
        node = None if self._is_meta(inode) else self._node(inode)
        if not name.startswith(XATTR_PREFIX):
            if not isinstance(node, (Allocation, Directory)):
                raise pyfuse3.FUSEError(errno.ENODATA)
            return self.v.metadata.metadata_value(node, xattrs.metadata_key(name), credentials(ctx),
                                         authorised=True)
        short = xattrs.short_name(name)
        if not isinstance(node, Allocation) or short not in xattrs.NAMES:
            raise pyfuse3.FUSEError(errno.ENODATA)
        return xattrs.value_of(node, short).encode()

    @handler
    def listxattr(self, inode, ctx):
        node = None if self._is_meta(inode) else self._node(inode)
        ours = [(xattrs.PREFIX + n).encode() for n in xattrs.NAMES] \
            if isinstance(node, Allocation) else []
        if not isinstance(node, (Allocation, Directory)):
            return ours
        return ours + [xattrs.USER_PREFIX + key for key in sorted(node.metadata)]

    @handler
    def setxattr(self, inode, name, value, ctx):
        node = None if self._is_meta(inode) else self._node(inode)
        if name.startswith(xattrs.USER_PREFIX) and not name.startswith(XATTR_PREFIX) and \
                isinstance(node, (Allocation, Directory)):
            self.v.metadata.set_metadata(node, xattrs.metadata_key(name), value, credentials(ctx),
                                authorised=True)
            return
        short = xattrs.short_name(name)
        if not isinstance(node, Allocation) or short not in xattrs.NAMES:
            raise pyfuse3.FUSEError(errno.ENOTSUP)
        cred = credentials(ctx)
        try:
            if short == "size":
                self.v.data.resize(node, cred, xattrs.parse_size_value(value), session=self.session)
                self._drop_setid(node, cred)             # a resize is a truncate
            elif short == "durable":
                self.v.durability.set_durable_node(node, cred, xattrs.parse_durable_value(value))
            elif value.rstrip(b"\0\n") != xattrs.value_of(node, short).encode():
                raise pyfuse3.FUSEError(errno.EPERM)         # read-only
        except UsageError as exc:
            log.info("setxattr %s on '%s' refused: %s", name.decode(errors="replace"),
                     node.path, exc)
            raise

    @handler
    def removexattr(self, inode, name, ctx):
        node = None if self._is_meta(inode) else self._node(inode)
        if name.startswith(xattrs.USER_PREFIX) and not name.startswith(XATTR_PREFIX) and \
                isinstance(node, (Allocation, Directory)):
            self.v.metadata.remove_metadata(node, xattrs.metadata_key(name), credentials(ctx),
                                   authorised=True)
            return
        short = xattrs.short_name(name)
        if not isinstance(node, Allocation) or short not in xattrs.NAMES:
            raise pyfuse3.FUSEError(errno.ENODATA)
        if short != "durable":
            raise pyfuse3.FUSEError(errno.EPERM)
        self.v.durability.set_durable_node(node, credentials(ctx), False)


def _writable(flags: int) -> bool:
    return flags & os.O_ACCMODE != os.O_RDONLY
