"""The extended attributes of the mount: gpumemd's own `user.gpu.*` (names, values, and what
each set does), and `user.KEY` for every other key, the node's user metadata
(daemon/core/usermeta.py: `gpumemctl meta`, the socket's `meta_*` ops).

| name                | get                              | set                                  |
| ------------------- | -------------------------------- | ------------------------------------ |
| user.gpu.size       | size in bytes                    | allocate (pending) or resize         |
| user.gpu.durable    | `true` or `false`                | true/false/1/0/yes/no (any case)     |
| user.gpu.capacity   | bytes of memory held (0 pending) | read-only                            |
| user.gpu.device     | device UUID (empty while pending)| read-only                            |
| user.gpu.state      | pending/ready/degraded/lost/...  | read-only                            |
| user.gpu.refcount   | holders + the durable pin        | read-only                            |
| user.gpu.ecc        | `rs` or `none`                   | read-only                            |
| user.gpu.id         | the allocation's id (its inode)  | read-only                            |

On a directory, `user.gpu.durable` is its durable default (issue 27): `true` makes the
files and subdirectories made in it from then on durable; its owner or root may set it
(EPERM otherwise), and removing it is setting it to false. It is the only user.gpu.* name
a directory has.

listxattr never lists the user.gpu.* names (as CephFS keeps `ceph.*` out of it): they are
read and set by name, so that `rsync -aX` and `cp -a` neither copy gpumemd's state out of
the mount nor try to remove or set it on a file of the mount (rsync exited 23 on the
EPERM; issue 27).

`user.KEY` (any KEY not starting `gpu.`) on an allocation or a directory: get, set,
list and remove as on any Linux filesystem, through the same metadata the socket serves;
listxattr lists them. The kernel checks the permissions first (read to get,
write to set or remove, the owner for a sticky directory; EPERM for a set on a symlink or
special file, ENODATA for a get there).

Errors, as Linux filesystems answer them (docs/mount.md has the full table):
- a bad value for a writable name: EINVAL;
- a size larger than any device could ever hold: EFBIG; one that does not fit now: ENOSPC;
- set of a read-only name: EPERM, unless the value equals the current one (then nothing
  happens, so `cp -a`/`rsync -X` between two places on the mount do not fail);
- get of a name that is not there (a user.KEY not set), or of a user.gpu.* name other
  than `durable` on a directory: ENODATA;
- set of a directory's user.gpu.durable by another uid than its owner's (or root): EPERM;
- set of user.KEY: XATTR_CREATE of one that exists EEXIST, XATTR_REPLACE of one that does
  not ENODATA; past metadata_max_bytes ENOSPC, past the owner's metadata_user_max_bytes
  EDQUOT; a value over 64 KiB is refused by the kernel (E2BIG), and one set larger through
  the socket reads as E2BIG (ERANGE with a buffer under its size);
- set of any other name (another user.gpu.* name, security.*, trusted.*): ENOTSUP;
- remove of `user.gpu.durable`: the same as setting it to false; of another of our names:
  EPERM; of a user.KEY not set, or of any other name: ENODATA.
"""
from __future__ import annotations

import errno
import logging
from collections.abc import Callable
from typing import TypeGuard

import pyfuse3

from gpumemctl.protocol import UsageError, name_from_bytes
from gpumemctl.protocol.sizes import parse_size

from ..core.nodes import Allocation, Directory, Node
from ..core.permissions import Credentials
from ..core.sessions import Session
from ..core.usermeta import key_bytes
from ..verbs import Verbs

log = logging.getLogger("gpumemd.fs")

USER_PREFIX = b"user."
PREFIX = "user.gpu."
OUR_PREFIX = PREFIX.encode()
WRITABLE = ("size", "durable")
READ_ONLY = ("capacity", "device", "state", "refcount", "ecc", "id")
NAMES = WRITABLE + READ_ONLY
TRUE_WORDS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def short_name(raw: bytes) -> str | None:
    """'size' for b'user.gpu.size'; None for any name outside user.gpu.* (or not UTF-8)."""
    try:
        name = raw.decode()
    except UnicodeDecodeError:
        return None
    return name[len(PREFIX):] if name.startswith(PREFIX) else None


def metadata_key(raw: bytes) -> bytes:
    """The metadata key of a user.KEY attribute name (checked: EINVAL for `user.` alone)."""
    return key_bytes(name_from_bytes(raw[len(USER_PREFIX):]))


def value_of(alloc: Allocation, short: str) -> str:
    """The text of one attribute (a name from NAMES)."""
    if short == "size":
        return str(alloc.size or 0)
    if short == "durable":
        return "true" if alloc.durable else "false"
    if short == "capacity":
        return str(alloc.capacity if alloc.buffer is not None else 0)
    if short == "device":
        return alloc.device or ""
    if short == "refcount":
        return str(alloc.refcount)
    return str(getattr(alloc, short))          # state, ecc, id


def _text(raw: bytes, short: str) -> str:
    try:
        # setfattr passes the value as typed; tolerate the NUL and newline some tools add
        return raw.decode().strip().rstrip("\0").strip()
    except UnicodeDecodeError:
        raise UsageError(f"invalid value for {PREFIX}{short}: not UTF-8 text") from None


def parse_size_value(raw: bytes) -> int:
    return parse_size(_text(raw, "size"), allow_zero=True)


def parse_durable_value(raw: bytes) -> bool:
    text = _text(raw, "durable")
    if text.lower() not in TRUE_WORDS:
        raise UsageError(f"invalid value {text!r} for {PREFIX}durable: expected "
                         "true/false/1/0/yes/no")
    return TRUE_WORDS[text.lower()]


def _has_user_key(node: Node | None, name: bytes) -> TypeGuard[Allocation | Directory]:
    """Whether `name` is a user.KEY of a node that has user metadata."""
    return name.startswith(USER_PREFIX) and not name.startswith(OUR_PREFIX) and \
        isinstance(node, (Allocation, Directory))


class Xattrs:
    """The mount's xattr requests over the verbs: ours answered from the allocation, user.KEY
    through the metadata verbs. `node` is None for a .metadata inode, which has none.

    The kernel has checked the permission of a user.* name before it asks
    (default_permissions: read to get, write to set or remove, the owner for a sticky
    directory; EPERM for a set on anything but a file or a directory), so the verb is told
    so. XATTR_CREATE and XATTR_REPLACE reach us as a getxattr before the setxattr (pyfuse3
    does that, in one task: nothing runs between)."""

    def __init__(self, verbs: Verbs, session: Session,
                 truncated: Callable[[Node, Credentials], None]):
        """`truncated`: what follows a resize (`user.gpu.size`, a truncate): the set-id bits
        dropped (Files.drop_setid)."""
        self.v = verbs
        self.session = session
        self.truncated = truncated

    def get(self, node: Node | None, name: bytes, cred: Credentials) -> bytes:
        if not name.startswith(OUR_PREFIX):
            if not isinstance(node, (Allocation, Directory)):
                raise pyfuse3.FUSEError(errno.ENODATA)
            return self.v.metadata.metadata_value(node, metadata_key(name), cred,
                                                  authorised=True)
        short = short_name(name)
        if isinstance(node, Directory) and short == "durable":
            return b"true" if node.durable else b"false"       # its default (issue 27)
        if not isinstance(node, Allocation) or short not in NAMES:
            raise pyfuse3.FUSEError(errno.ENODATA)
        return value_of(node, short).encode()

    @staticmethod
    def names(node: Node | None) -> list[bytes]:
        """The user metadata's keys; never ours, which are read and set by name only (as
        CephFS keeps its virtual `ceph.*` attributes out of listxattr), so that `rsync -X`,
        `cp -a` and `getfattr -d` copy and show what users stored and no gpumemd state."""
        if not isinstance(node, (Allocation, Directory)):
            return []
        return [USER_PREFIX + key for key in sorted(node.metadata)]

    def set(self, node: Node | None, name: bytes, value: bytes, cred: Credentials) -> None:
        if _has_user_key(node, name):
            self.v.metadata.set_metadata(node, metadata_key(name), value, cred,
                                         authorised=True)
            return
        short = short_name(name)
        if isinstance(node, Directory) and short == "durable":
            self._set_durable(node, value, cred)
            return
        if not isinstance(node, Allocation) or short not in NAMES:
            raise pyfuse3.FUSEError(errno.ENOTSUP)
        try:
            if short == "size":
                self.v.data.resize(node, cred, parse_size_value(value), session=self.session)
                self.truncated(node, cred)             # a resize is a truncate
            elif short == "durable":
                self.v.durability.set_durable_node(node, cred, parse_durable_value(value))
            elif value.rstrip(b"\0\n") != value_of(node, short).encode():
                raise pyfuse3.FUSEError(errno.EPERM)         # read-only
        except UsageError as exc:
            log.info("setxattr %s on '%s' refused: %s", name.decode(errors="replace"),
                     node.path, exc)
            raise

    def _set_durable(self, directory: Directory, value: bytes, cred: Credentials) -> None:
        """A directory's durable default: its owner or root (EPERM otherwise, as chmod)."""
        try:
            self.v.durability.set_durable_node(directory, cred, parse_durable_value(value))
        except UsageError as exc:
            log.info("setxattr user.gpu.durable on '%s' refused: %s", directory.path, exc)
            raise

    def remove(self, node: Node | None, name: bytes, cred: Credentials) -> None:
        if _has_user_key(node, name):
            self.v.metadata.remove_metadata(node, metadata_key(name), cred, authorised=True)
            return
        short = short_name(name)
        if isinstance(node, Directory) and short == "durable":
            self.v.durability.set_durable_node(node, cred, False)
            return
        if not isinstance(node, Allocation) or short not in NAMES:
            raise pyfuse3.FUSEError(errno.ENODATA)
        if short != "durable":
            raise pyfuse3.FUSEError(errno.EPERM)
        self.v.durability.set_durable_node(node, cred, False)
