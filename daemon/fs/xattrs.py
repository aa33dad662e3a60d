"""The extended attributes of the mount: gpumemd's own `user.gpu.*` (names, values, and what
each set does), and `user.KEY` for every other key, the node's user metadata
(daemon/usermeta.py: `gpumemctl meta`, the socket's `meta_*` ops).

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

`user.KEY` (any KEY not starting `gpu.`) on an allocation or a directory: get, set,
list and remove as on any Linux filesystem, through the same metadata the socket serves;
listxattr lists them after ours. The kernel checks the permissions first (read to get,
write to set or remove, the owner for a sticky directory; EPERM for a set on a symlink or
special file, ENODATA for a get there).

Errors, as Linux filesystems answer them (docs/mount.md has the full table):
- a bad value for a writable name: EINVAL;
- a size larger than any device could ever hold: EFBIG; one that does not fit now: ENOSPC;
- set of a read-only name: EPERM, unless the value equals the current one (then nothing
  happens, so `cp -a`/`rsync -X` between two places on the mount do not fail);
- get of a name that is not there (a user.KEY not set), or of a user.gpu.* name on a
  directory: ENODATA;
- set of user.KEY: XATTR_CREATE of one that exists EEXIST, XATTR_REPLACE of one that does
  not ENODATA; past metadata_max_bytes ENOSPC, past the owner's metadata_user_max_bytes
  EDQUOT; a value over 64 KiB is refused by the kernel (E2BIG), and one set larger through
  the socket reads as E2BIG (ERANGE with a buffer under its size);
- set of any other name (another user.gpu.* name, security.*, trusted.*): ENOTSUP;
- remove of `user.gpu.durable`: the same as setting it to false; of another of our names:
  EPERM; of a user.KEY not set, or of any other name: ENODATA.
"""
from __future__ import annotations

from gpumemctl.protocol import UsageError, name_from_bytes
from gpumemctl.protocol.sizes import parse_size

from ..core.nodes import Allocation
from ..core.usermeta import key_bytes

USER_PREFIX = b"user."
PREFIX = "user.gpu."
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
