"""User metadata (issue 17): the rules for keys and values, and the bounds on what they take.

Any allocation or directory may carry small key-value pairs (`gpumemctl meta`, the socket's
`meta_*` ops, `user.KEY` extended attributes on the mount, `info`'s `metadata`). They belong
to the node, so a hard link's names share them; symbolic links and special files carry none.
The namespace keeps them on the nodes and in the registry's `metadata` table
(daemon/core/namespace/metadata.py); this module says what may be stored and how much:

- a key is 1 to MAX_KEY_BYTES bytes (so that `user.` + key fits the 255 bytes the kernel
  allows an attribute name), with no NUL, and does not start with `gpu.`: the mount's
  `user.gpu.*` attributes are gpumemd's own (daemon/fs/xattrs.py);
- a value is any bytes, none included;
- both travel as str on the wire, bytes that are not UTF-8 with surrogateescape, as names do
  (gpumemctl/protocol/names.py), and are stored as bytes;
- what one node's metadata takes, the sum of len(key) + len(value) over its keys, is at
  most `metadata_max_bytes` (a usage error past it, ENOSPC on the mount: it is a bound of
  the format, as a filesystem's per-inode attribute space is, not of the user);
- what all the nodes a uid owns take together is at most `metadata_user_max_bytes`
  (MetadataQuotaExceeded, exit 7, EDQUOT on the mount), but for root and the daemon's own
  uid, as default_quota treats them (docs/security.md). The namespace keeps the running
  total per uid (nodes.NodeTable), so a check costs no walk and no SQL.

Only a change that grows a node's metadata is held to the bounds: one that keeps or shrinks
it always succeeds, so a user over a bound lowered since can still clean up.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpumemctl.protocol import NoMemory, UsageError, format_size, name_bytes, name_from_bytes

MAX_KEY_BYTES = 250                 # 255 (XATTR_NAME_MAX) less len("user.")
RESERVED_PREFIX = b"gpu."           # user.gpu.* on the mount is ours (daemon/fs/xattrs.py)
DEFAULT_MAX_BYTES = 512 << 10       # config metadata_max_bytes
DEFAULT_USER_MAX_BYTES = 64 << 20   # config metadata_user_max_bytes
# The most metadata_max_bytes may be: a request is at most 1 MiB of JSON
# (gpumemctl/protocol/framing.py MAX_REQUEST_BYTES), and a node's metadata must fit in one
# (`create` and `refill` carry all of it), with room for the rest of the request.
MAX_BYTES_LIMIT = 896 << 10
ONLY_ON = "metadata is kept on allocations and directories only"


def _show(text: str) -> str:
    """A key as an error message quotes it: cut if long (escaped where it is shown)."""
    return f"'{text}'" if len(text) <= 60 else f"'{text[:48]}...' ({len(text)} characters)"


def key_bytes(key: Any) -> bytes:
    """The bytes of a valid key, or UsageError naming the key and the rule it breaks."""
    if not isinstance(key, str):
        raise UsageError(f"a metadata key must be a string, not {type(key).__name__}")
    try:
        raw = name_bytes(key)
    except UnicodeEncodeError as exc:
        raise UsageError(f"invalid metadata key {key!a}: holds {key[exc.start]!a}, a "
                         "surrogate that stands for no byte (only U+DC80-U+DCFF, "
                         "surrogateescape, may carry a byte that is not UTF-8)") from None
    if not raw:
        raise UsageError(f"invalid metadata key '': a key is 1 to {MAX_KEY_BYTES} bytes")
    if len(raw) > MAX_KEY_BYTES:
        raise UsageError(f"invalid metadata key {_show(key)}: {len(raw)} bytes, at most "
                         f"{MAX_KEY_BYTES} (so that user.KEY fits the mount's 255-byte "
                         "attribute names)")
    if b"\0" in raw:
        raise UsageError(f"invalid metadata key {_show(key)}: contains a NUL byte")
    if raw.startswith(RESERVED_PREFIX):
        raise UsageError(f"invalid metadata key {_show(key)}: keys starting 'gpu.' are "
                         "reserved (the mount's user.gpu.* attributes are gpumemd's own)")
    return raw


def value_bytes(value: Any, key: str = "") -> bytes:
    """The bytes of a value: any str whose surrogates stand for bytes (surrogateescape)."""
    if isinstance(value, bytes):
        return value
    if not isinstance(value, str):
        raise UsageError(f"the value of metadata key {_show(key)} must be a string, not "
                         f"{type(value).__name__}")
    try:
        return name_bytes(value)
    except UnicodeEncodeError as exc:
        raise UsageError(f"invalid value for metadata key {_show(key)}: holds "
                         f"{value[exc.start]!a}, a surrogate that stands for no byte (only "
                         "U+DC80-U+DCFF, surrogateescape, may carry a byte that is not "
                         "UTF-8)") from None


def entries(obj: Any) -> dict[bytes, bytes]:
    """`create`'s and `refill`'s `metadata` argument, {key: value} of strings, as bytes."""
    if not isinstance(obj, dict):
        raise UsageError(f"argument 'metadata' must be an object of keys and string values, "
                         f"not {type(obj).__name__}")
    out: dict[bytes, bytes] = {}
    for key, value in obj.items():
        raw = key_bytes(key)
        if raw in out:      # two spellings of one key's bytes ("\udcc3\udca9" and "é")
            raise UsageError(f"metadata key {_show(key)} is given twice")
        out[raw] = value_bytes(value, key)
    return out


def size_of(metadata: dict[bytes, bytes]) -> int:
    """What a node's metadata takes against the bounds: sum of len(key) + len(value)."""
    return sum(len(k) + len(v) for k, v in metadata.items())


def shown(metadata: dict[bytes, bytes]) -> dict[str, str]:
    """As clients see it: {key: value}, by key, as names are spelled (surrogateescape)."""
    return {name_from_bytes(k): name_from_bytes(metadata[k]) for k in sorted(metadata)}


class MetadataQuotaExceeded(NoMemory):
    """A uid's metadata would pass metadata_user_max_bytes: exit 7, EDQUOT on the mount."""

    def __init__(self, uid: int, limit: int, used: int, requested: int):
        super().__init__(
            f"metadata quota exceeded for uid {uid}: {limit} bytes ({format_size(limit)}) of "
            f"metadata allowed (metadata_user_max_bytes), {used} used, {requested} more "
            "requested",
            details={"errno": "EDQUOT", "uid": uid, "quota": limit, "used": used,
                     "requested": requested})


class Bounds:
    """The two bounds, and the check a change makes before it grows a node's metadata."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES,
                 user_max_bytes: int = DEFAULT_USER_MAX_BYTES, *,
                 used: Callable[[int], int], exempt: Callable[[int], bool]):
        """`used(uid)`: what uid's nodes hold now (ns.metadata.used); `exempt(uid)`:
        true for the uids no per-user bound binds (permissions.administrative_uid)."""
        self.max_bytes, self.user_max_bytes = max_bytes, user_max_bytes
        self.used, self.exempt = used, exempt

    def check(self, where: str, uid: int, now: int, after: int) -> None:
        """The metadata of `where` (a path, for the message), owned by `uid`, is to take
        `after` bytes; it takes `now` bytes."""
        more = after - now
        if more <= 0:
            return
        if after > self.max_bytes:
            raise UsageError(
                f"metadata of '{where}' would take {after} bytes (keys and values), more "
                f"than the {self.max_bytes} one allocation or directory may hold "
                "(metadata_max_bytes)",
                details={"errno": "ENOSPC", "bytes": after, "limit": self.max_bytes})
        if self.exempt(uid):
            return
        used = self.used(uid)
        if used + more > self.user_max_bytes:
            raise MetadataQuotaExceeded(uid, self.user_max_bytes, used, more)
