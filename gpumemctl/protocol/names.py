"""Allocation names: paths in the one namespace shared by the socket API and the mount.

Rules (docs/design.md, "Names and permissions"): components of 1-255 bytes, no NUL, no `/` inside a
component, not `.` or `..`, at most 4096 bytes in all. One leading `/` is accepted and dropped,
so `/models/a` and `models/a` name the same thing. Names are bytes on Linux; on the wire they
travel as str with surrogateescape (os.fsdecode), so any byte except NUL and `/` is allowed.

One spelling per name: a component is the str its bytes decode to (UTF-8, surrogateescape),
so "\udcc3\udca9" (the bytes of "é", escaped by a client) is taken as "é", and a str
holding a surrogate that stands for no byte ("\ud800", which JSON can carry) is refused.
`name_bytes` and `name_from_bytes` are the two directions (the registry and the mount use
them).
"""
from __future__ import annotations

from .errors import UsageError

MAX_COMPONENT_BYTES = 255
MAX_PATH_BYTES = 4096
ENCODING = ("utf-8", "surrogateescape")


def name_bytes(name: str) -> bytes:
    """The bytes a (valid) name stands for."""
    return name.encode(*ENCODING)


def name_from_bytes(raw: bytes) -> str:
    """The one str spelling of a name's bytes."""
    return raw.decode(*ENCODING)


def _canonical(path: str) -> str:
    try:
        return name_from_bytes(name_bytes(path))
    except UnicodeEncodeError as exc:
        raise UsageError(f"invalid name {path!a}: holds {path[exc.start]!a}, a "
                         "surrogate that stands for no byte (only U+DC80-U+DCFF, "
                         "surrogateescape, may carry a byte that is not UTF-8)") from None


def _show(name: str) -> str:
    """A name as it may appear in an error message: quoted, and cut if long. Not escaped:
    whoever shows the message to a person escapes it whole (gpumemctl/protocol/escape.py),
    as it does the daemon's other messages, which quote names the same way."""
    if len(name) <= 78:
        return f"'{name}'"
    return f"'{name[:59]}...' ({len(name_bytes(name))} bytes)"


def split_path(path: str, *, allow_root: bool = False) -> list[str]:
    """Validate `path` and return its components. The root is "" (or "/") when allowed."""
    if not isinstance(path, str):
        raise UsageError(f"name must be a string, not {type(path).__name__}")
    path = _canonical(path)
    if "\0" in path:
        raise UsageError(f"invalid name {_show(path)}: contains a NUL byte")
    raw = name_bytes(path)
    if len(raw) > MAX_PATH_BYTES:
        raise UsageError(f"invalid name {_show(path)}: {len(raw)} bytes, at most "
                         f"{MAX_PATH_BYTES} allowed")
    body = path[1:] if path.startswith("/") else path
    if body == "":
        if allow_root:
            return []
        raise UsageError("invalid name '': a name needs at least one component")
    parts = body.split("/")
    for part in parts:
        check_component(part, whole=path)
    return parts


def check_component(part: str, *, whole: str | None = None) -> str:
    """Validate one path component (a file or directory name)."""
    part = _canonical(part)
    where = f"invalid name {_show(whole if whole is not None else part)}"
    if part == "":
        raise UsageError(f"{where}: empty component (a doubled or trailing '/')")
    if part in (".", ".."):
        raise UsageError(f"{where}: '{part}' is not allowed as a component")
    if "/" in part or "\0" in part:
        raise UsageError(f"{where}: a component may not contain '/' or NUL")
    size = len(name_bytes(part))
    if size > MAX_COMPONENT_BYTES:
        raise UsageError(f"{where}: component of {size} bytes, at most "
                         f"{MAX_COMPONENT_BYTES} allowed", details={"errno": "ENAMETOOLONG"})
    return part


def normalize(path: str, *, allow_root: bool = False) -> str:
    """The canonical spelling of a valid path: no leading slash."""
    return "/".join(split_path(path, allow_root=allow_root))
