"""How names are stored. Names and paths (nodes.name, links.name, nodes.target, events.path)
are bytes on Linux and may be anything but NUL and `/` (gpumemctl/protocol/names.py), while
SQLite TEXT is UTF-8, which a name decoded with surrogateescape is not. So a name is stored as
TEXT when it is valid UTF-8 (every name an older gpumemd stored) and as a BLOB of its bytes
when it is not: each name has exactly one stored form, so UNIQUE (parent, name) still means
what it says (stored_name, loaded_name)."""
from __future__ import annotations

from gpumemctl.protocol import name_bytes, name_from_bytes


def stored_name(name: str) -> str | bytes:
    """A name or path as the registry stores it: TEXT when its bytes are UTF-8, else a BLOB
    of its bytes (a str holding surrogateescape's lone surrogates cannot be SQLite TEXT)."""
    raw = name_bytes(name)
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return raw


def loaded_name(value: str | bytes) -> str:
    """What stored_name() stored, as the daemon spells names (surrogateescape)."""
    return name_from_bytes(value) if isinstance(value, bytes) else value
