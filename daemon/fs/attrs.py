"""The attributes the mount answers: a node's as the kernel caches them (EntryAttributes),
the filesystem's (statfs), a setattr's fields read back into changes, and the mode a write
leaves behind (the set-id bits).

- Entries and attributes are cached for ENTRY_TIMEOUT seconds; a change made through the
  socket API invalidates them at once (the namespace's watchers, daemon/fs/cache.py).
- Set-id bits: a write or truncate by a process without CAP_FSETID clears them
  (without_setid, as Linux does). The kernel does it for truncate(2) (the new mode rides on
  its setattr), not for O_TRUNC (atomic: no setattr), so the mount does it there
  (Files.drop_setid, daemon/fs/files.py). For a write the kernel clears them itself
  (page-cache writes go through its file_remove_privs, a setattr of the mode); the drop at
  a write stays as a second line, by the rights of the process that opened the file.
"""
from __future__ import annotations

import stat

import pyfuse3

from gpumemctl.protocol import name_bytes

from ..core.nodes import Allocation, Directory, Node, Special, Symlink
from ..core.permissions import Credentials

ENTRY_TIMEOUT = 5.0          # seconds; socket-side changes invalidate earlier (watchers)
BLOCK = 1 << 20              # st_blksize: cp and dd size their buffers by it
STATFS_BLOCK = 4096
NAME_MAX = 255
FILES = 1 << 32              # statfs's inode count: the namespace has no fixed table
CAP_FSETID = 4               # capability(7) bit: keep set-id bits through writes
SETID = stat.S_ISUID | stat.S_ISGID


def entry_attributes(node: Node) -> pyfuse3.EntryAttributes:
    """What stat(2) of `node` shows, and how long the kernel may cache it."""
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


def statvfs(devices, node_count: int) -> pyfuse3.StatvfsData:
    """statfs(2): the devices' memory as blocks, the nodes as used inodes."""
    s = pyfuse3.StatvfsData()
    s.f_bsize = s.f_frsize = STATFS_BLOCK
    s.f_blocks = sum(d.total for d in devices) // STATFS_BLOCK
    s.f_bfree = s.f_bavail = sum(d.free for d in devices) // STATFS_BLOCK
    s.f_files = FILES
    s.f_ffree = s.f_favail = s.f_files - node_count
    s.f_namemax = NAME_MAX
    return s


def changes_of(attr: pyfuse3.EntryAttributes, fields: pyfuse3.SetattrFields) -> dict:
    """A setattr's chmod, chown and utimes as the keywords of NameVerbs.setattr (the size
    is a resize, the handler's own)."""
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
    return changes


def clears_setid_only(node: Node, attr: pyfuse3.EntryAttributes,
                      fields: pyfuse3.SetattrFields) -> bool:
    """Whether a setattr changes the mode alone, and only by set-id bits: what the kernel
    sends before a page-cache write by a process without CAP_FSETID."""
    only_mode = fields.update_mode and not (
        fields.update_size or fields.update_uid or fields.update_gid or
        fields.update_mtime or fields.update_atime)
    return bool(only_mode) and \
        stat.S_IMODE(attr.st_mode) | SETID == stat.S_IMODE(node.mode) | SETID


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
