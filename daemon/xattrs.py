"""The `user.gpu.*` extended attributes of the mount: names, values, and what each set does.

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

Errors, as Linux filesystems answer them (docs/mount.md has the full table):
- a bad value for a writable name: EINVAL;
- a size larger than any device could ever hold: EFBIG; one that does not fit now: ENOSPC;
- set of a read-only name: EPERM, unless the value equals the current one (then nothing
  happens, so `cp -a`/`rsync -X` between two places on the mount do not fail);
- get of a name that is not there, or of any name on a directory: ENODATA;
- set of any other name: ENOTSUP (no arbitrary attributes are stored);
- remove of `user.gpu.durable`: the same as setting it to false; of another of our names:
  EPERM; of any other name: ENODATA.
"""
from __future__ import annotations

from gpumemctl.protocol import UsageError
from gpumemctl.protocol.sizes import parse_size

from .nodes import Allocation

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
