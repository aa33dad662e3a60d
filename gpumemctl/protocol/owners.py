"""User and group names for uids and gids, where this machine's passwd and group databases
have them (issue 27: `OWNER 1001:1001` and "quota exceeded for uid 1001" told a person
nothing). Numbers stay in every JSON document; names are for a person's output only."""
from __future__ import annotations

import functools
import re


@functools.lru_cache(maxsize=1024)
def user_name(uid: int) -> str | None:
    import pwd
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError, ValueError):
        return None


@functools.lru_cache(maxsize=1024)
def group_name(gid: int) -> str | None:
    import grp
    try:
        return grp.getgrgid(gid).gr_name
    except (KeyError, OverflowError, ValueError):
        return None


def owner(uid: int, gid: int, numeric: bool = False) -> str:
    """`alice:staff` (a number where no name resolves, or with `numeric`, as `ls -n`)."""
    if numeric:
        return f"{uid}:{gid}"
    return f"{user_name(uid) or uid}:{group_name(gid) or gid}"


_UID = re.compile(r"\buid (\d+)\b")


def with_user_names(message: str) -> str:
    """A line for a person that names uids, with their names after it where they resolve:
    `quota exceeded for uid 1001: ... (uid 1001 is alice)`. At the end, so that the line
    reads as the daemon wrote it (scripts match its words)."""
    named = []
    for uid in dict.fromkeys(int(m.group(1)) for m in _UID.finditer(message)):
        name = user_name(uid)
        if name and name != str(uid):
            named.append(f"uid {uid} is {name}")
    return f"{message} ({', '.join(named)})" if named else message
