"""POSIX permission checks on peer credentials, the same rules the mount applies.

The socket server authorises every request with these, from the peer's SO_PEERCRED pid, uid
and gid plus its SO_PEERGROUPS supplementary groups: all four as the kernel recorded them
when the peer called connect(). Not /proc/PID/status read at accept time: by then the
process may have changed its groups, or exited and had its pid taken by another process,
whose groups it would lend. The mount has no socket and reads /proc (daemon/fs/requests.py
says why).
"""
from __future__ import annotations

import ctypes
import dataclasses
import errno
import logging
import os
import socket
import struct
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


# The daemon itself, as the owner of what it makes (re-registered orphans, /lost+found) and
# the credentials of the mount's own session.
DAEMON = Credentials(pid=os.getpid(), uid=os.geteuid(), gid=os.getegid())
SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)    # Linux >= 4.13
GID = struct.calcsize("I")               # gid_t
PY_BUFLEN = 1024                         # the most socket.getsockopt() reads: 256 groups
log = logging.getLogger("gpumemd")


def peer_groups(sock, pid: int) -> frozenset[int]:
    """The supplementary groups of a Unix socket's peer at connect() (SO_PEERGROUPS). A
    kernel older than 4.13 does not know the option: then /proc, as before, said once."""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, PY_BUFLEN)
    except OSError as exc:
        if exc.errno == errno.ERANGE:    # more than 256 groups: ask with a buffer that fits
            raw = _peer_groups_large(sock.fileno())
        elif exc.errno == errno.ENOPROTOOPT:
            _warn_no_peergroups()
            return supplementary_groups(pid)
        else:
            raise
    return frozenset(struct.unpack(f"{len(raw) // GID}I", raw[:len(raw) // GID * GID]))


def _peer_groups_large(fd: int) -> bytes:
    """SO_PEERGROUPS through libc: on ERANGE the kernel says how many bytes it needs, and
    the list may grow in between (it is the peer's at connect, so it does not)."""
    libc = ctypes.CDLL(None, use_errno=True)
    size = ctypes.c_uint32(PY_BUFLEN * 4)
    while True:
        buf = ctypes.create_string_buffer(size.value)
        if libc.getsockopt(fd, socket.SOL_SOCKET, SO_PEERGROUPS, buf, ctypes.byref(size)) == 0:
            return buf.raw[:size.value]
        err = ctypes.get_errno()
        if err != errno.ERANGE:
            raise OSError(err, f"getsockopt(SO_PEERGROUPS): {errno.errorcode.get(err, err)}")


_warned = False


def _warn_no_peergroups() -> None:
    global _warned
    if not _warned:
        _warned = True
        log.warning("this kernel has no SO_PEERGROUPS (Linux < 4.13): supplementary groups "
                    "are read from /proc/PID/status when a connection is accepted")


def supplementary_groups(pid: int) -> frozenset[int]:
    """A process's supplementary groups now, from /proc (the mount's only source)."""
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
