"""POSIX permission checks on peer credentials, the same rules the mount applies.

The socket server authorises every request with these, from the peer's SO_PEERCRED pid, uid
and gid plus the supplementary groups read from /proc/PID/status at connect time.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Container

from gpumemctl.protocol import PermissionDenied

R, W, X = 4, 2, 1
_WHAT = {R: "read", W: "write", X: "search", W | X: "write", R | X: "read",
         R | W: "write"}


@dataclasses.dataclass(frozen=True)
class Credentials:
    pid: int
    uid: int
    gid: int
    groups: Container[int] = frozenset()     # or fs.ProcGroups: read only when asked

    @property
    def is_root(self) -> bool:
        return self.uid == 0

    def in_group(self, gid: int) -> bool:
        return gid == self.gid or gid in self.groups


def supplementary_groups(pid: int) -> frozenset[int]:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Groups:"):
                    return frozenset(int(g) for g in line.split()[1:])
    except OSError:
        pass
    return frozenset()


def allowed(node, cred: Credentials, want: int) -> bool:
    """True when `cred` has all of the access bits `want` (R|W|X) on `node`."""
    if cred.is_root:
        return True
    if cred.uid == node.uid:
        bits = (node.mode >> 6) & 7
    elif cred.in_group(node.gid):
        bits = (node.mode >> 3) & 7
    else:
        bits = node.mode & 7
    return bits & want == want


def require(node, cred: Credentials, want: int, what: str | None = None) -> None:
    if not allowed(node, cred, want):
        action = what or _WHAT.get(want, "access")
        raise PermissionDenied(f"permission denied: uid {cred.uid} may not {action} "
                               f"'{node.path or '/'}' (owner {node.uid}:{node.gid}, "
                               f"mode {node.mode:04o})")


def require_owner(node, cred: Credentials, what: str) -> None:
    if not (cred.is_root or cred.uid == node.uid):
        raise PermissionDenied(f"permission denied: only the owner (uid {node.uid}) or root "
                               f"may {what} '{node.path}'")


def may_remove_from(parent, child, cred: Credentials) -> bool:
    """The sticky-bit rule: in a sticky directory only the owner of the entry, the owner of
    the directory, or root may remove or rename the entry."""
    if not parent.mode & 0o1000 or cred.is_root:
        return True
    return cred.uid in (child.uid, parent.uid)


def administrative_uid(uid: int) -> bool:
    """Root and the daemon's own uid: the administrator, whom per-user limits (default_quota,
    max_names_per_uid, ...) do not bind (docs/security.md)."""
    return uid == 0 or uid == os.geteuid()
