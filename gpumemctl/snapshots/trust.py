"""What a restore trusts (docs/snapshots.md, "Who may write a store, and what a restore
trusts"; issue 24).

A manifest's SHA-256 finds accidents, not forgeries: anyone who can put a directory in a
store can write a well-sealed manifest. So who wrote a snapshot is established by the file
system, as sshd's StrictModes does for authorized_keys: in a directory store a snapshot is
read by `restore` (and by `create`, as the base of an incremental snapshot or the source of
a lost allocation's entry) only if its directory, its manifest and every data object read
are owned by the caller, by root or by a uid the caller names (`--trust-uid`, for a fleet
store written under another uid: NFS root_squash maps root to 65534), and are writable by
nobody else. The store's root itself may be shared (1777, a group's): each snapshot is
checked. An S3 store has no owners: write access to the bucket is the trust there.

Beyond who wrote it, each field a restore acts on is checked against what the caller may
do: a lost allocation is refilled only from an entry recorded with its owner and its size,
and, for root (whom the daemon lets link anywhere), a further name of an allocation is made
only in directories owned by root or by the allocation's owner that nobody else may rename
entries of, so a confused manifest cannot pin someone's allocation into another user's
directory. For anyone else the daemon's own permission checks decide.
"""
from __future__ import annotations

import dataclasses
import os
import pwd
import stat

from ..protocol import NotFound, PermissionDenied, UsageError

DOC = "docs/snapshots.md"
TRUST_ENV = "GPUMEMCTL_SNAPSHOT_TRUST_UIDS"


class Untrusted(PermissionDenied):
    """A snapshot file someone the caller does not trust could have written (exit 6)."""


@dataclasses.dataclass(frozen=True)
class Trust:
    """Whose files a restore reads: the caller's, root's and `extra` uids'."""
    extra: frozenset[int] = frozenset()

    @property
    def owners(self) -> frozenset[int]:
        return frozenset({os.geteuid(), 0}) | self.extra

    def _whom(self) -> str:
        if not self.extra:
            return "you or root"
        return "you, root or a --trust-uid (" + ", ".join(map(str, sorted(self.extra))) + ")"

    def check(self, st: os.stat_result, where: str) -> None:
        """Raise Untrusted unless a trusted uid owns the entry and nobody else may write it
        (a symlink's own mode means nothing: its owner is what counts)."""
        if st.st_uid not in self.owners:
            raise Untrusted(f"{where} is owned by uid {st.st_uid}, not by {self._whom()}: a "
                            "snapshot is restored only from files its restorer or root wrote "
                            f"({DOC}; --trust-uid UID trusts another writer)")
        mode = stat.S_IMODE(st.st_mode)
        if not stat.S_ISLNK(st.st_mode) and mode & 0o022:
            raise Untrusted(f"{where} is writable by others (mode {mode:04o}): a snapshot is "
                            f"restored only from files nobody else may change ({DOC})")


def parse_uids(values: list[str] | None) -> frozenset[int]:
    """--trust-uid values, and those of $GPUMEMCTL_SNAPSHOT_TRUST_UIDS (comma-separated;
    how gpumemd's restore_on_start and snapshot_on_stop children get them: they inherit
    its environment): uids, or user names of this host."""
    given = [(f"--trust-uid {v!r}", v) for v in values or []]
    given += [(f"{TRUST_ENV}={os.environ[TRUST_ENV]!r}", v.strip())
              for v in os.environ.get(TRUST_ENV, "").split(",") if v.strip()]
    out = set()
    for what, value in given:
        try:
            out.add(int(value) if value.isdigit() else pwd.getpwnam(value).pw_uid)
        except KeyError:
            raise UsageError(f"invalid {what}: expected uids or user names of this "
                             "host") from None
    return frozenset(out)


# ---- the fields of an entry, against what the caller may do ------------------------------
def check_refill(entry: dict, info: dict, where: str) -> None:
    """A lost allocation is refilled only from an entry recorded with its owner and its
    size: one that names it but was someone else's (a confused or forged manifest) is
    refused."""
    path = info["path"]
    if info.get("uid") != entry["uid"]:
        raise PermissionDenied(f"'{path}' is uid {info.get('uid')}'s, and {where} recorded "
                               f"uid {entry['uid']}'s allocation under that name: a lost "
                               "allocation is refilled only with its owner's data (restore "
                               "the copy under --as PREFIX to look at it)")
    if (info.get("size") or 0) != entry["size"]:
        raise PermissionDenied(f"'{path}' has size {info.get('size')} and {where}'s copy "
                               f"{entry['size']}: remove it first, or restore the copy with "
                               "--as PREFIX")


def check_names(client, names: list[str], owner: int) -> None:
    """As root: every directory on the way to each further name is a directory owned by
    root or by `owner` (the allocation's owner) that nobody else may rename entries of (a
    group/other-writable one must be sticky). Directories that do not exist yet are made by
    root. Others are held to their own rights by the daemon."""
    if os.geteuid() != 0:
        return
    for name in names:
        parts = name.strip("/").split("/")[:-1]
        for depth in range(1, len(parts) + 1):
            directory = "/".join(parts[:depth])
            try:
                info = client.info(directory)
            except NotFound:
                break                           # made by root from here down
            mode = int(info.get("mode") or "0", 8)
            problem = None
            if info.get("type") != "directory":
                problem = f"'{directory}' is a {info.get('type')}"
            elif info.get("uid") not in (0, owner):
                problem = f"'{directory}' is owned by uid {info.get('uid')}"
            elif mode & 0o022 and not mode & stat.S_ISVTX:
                problem = f"'{directory}' is writable by others (mode {mode:04o})"
            if problem:
                raise PermissionDenied(
                    f"not restoring the name '{name}' of uid {owner}'s allocation: {problem}, "
                    "and root makes such a name only in directories of root or of the "
                    f"allocation's owner that nobody else may change ({DOC})")
