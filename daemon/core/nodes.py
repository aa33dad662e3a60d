"""The in-memory namespace: directories and allocations as a tree of nodes.

The verbs (daemon/verbs/) and the core under them own these objects and are the only code
that changes them; the registry holds their durable copy. A node's `id` is its registry row
id and its inode number.
"""
from __future__ import annotations

import dataclasses
import itertools
import stat
import threading
from collections.abc import Callable, Iterator
from typing import Any

from .containers import UNKNOWN, Origin

# Holders that write the memory through an fd of their own (daemon/core/holders.py has the rest).
WRITER_KINDS = ("write", "attach-w")


@dataclasses.dataclass(eq=False)
class Holder:
    """Something keeping an allocation alive: a lease, an open read or write handle."""
    id: int
    kind: str            # 'lease' | 'read' | 'write' | 'attach-r' | 'attach-w'
    session: Any         # the daemon.sessions.Session it belongs to
    alloc: Allocation
    pid: int
    uid: int
    since_ns: int
    # Its process's cgroup and container, read once when it was made (daemon/core/
    # containers.py): its session's, or, for a pid other than the session's (a file open
    # on the mount), that pid's then.
    origin: Origin = UNKNOWN
    # An attachment whose process let go of its mapping, keeping the address, while its
    # allocation sleeps (daemon/core/sleep.py); op `remap` maps it again.
    parked: bool = False

    def to_dict(self) -> dict:
        return {"id": self.id, "kind": self.kind, "pid": self.pid, "uid": self.uid,
                "session": self.session.id, "since_ns": self.since_ns,
                "cgroup": self.origin.cgroup, "container": self.origin.container,
                "parked": self.parked}


@dataclasses.dataclass(eq=False)
class Node:
    id: int
    name: str
    parent: Directory | None
    uid: int
    gid: int
    mode: int            # permission bits only
    created_ns: int
    modified_ns: int
    changed_ns: int
    accessed_ns: int | None = None   # last access (utimensat, or a read by the relatime
                                     # rule: ns.attributes.note_access); None when
                                     # made: the modification time
    # Hard links: the node's names beyond (parent, name), each (directory, name), in the
    # order they were made (the registry's `links` rows). Directories never have any.
    aliases: Aliases = dataclasses.field(default_factory=lambda: Aliases())
    # User metadata (daemon/core/usermeta.py): key -> value, both bytes; the registry's
    # `metadata` rows. Only allocations and directories carry any. `metadata_bytes` is
    # usermeta.size_of(metadata), kept as it changes (ns.metadata.set).
    metadata: dict[bytes, bytes] = dataclasses.field(default_factory=dict)
    metadata_bytes: int = 0

    def __post_init__(self) -> None:
        if self.accessed_ns is None:
            self.accessed_ns = self.modified_ns

    @property
    def path(self) -> str:
        parts = []
        node: Node | None = self
        while node is not None and node.parent is not None:
            parts.append(node.name)
            node = node.parent
        return "/".join(reversed(parts))

    @property
    def st_mode(self) -> int:
        """The file type and the permission bits, as stat(2) reports them."""
        raise NotImplementedError(f"{type(self).__name__} has no file type")

    @property
    def names(self) -> list[tuple[Directory, str]]:
        """Every (directory, name) the node is found under, its first name first."""
        first = [(self.parent, self.name)] if self.parent is not None else []
        return first + list(self.aliases)

    @property
    def nlink(self) -> int:
        """st_nlink of a file: its names (0 once the last one is gone and it is held
        open). Directories override it. O(1): the kernel asks it at every stat."""
        return (self.parent is not None) + len(self.aliases)


def entry_path(parent: Directory, name: str) -> str:
    """The path of the entry `name` in `parent`."""
    return f"{parent.path}/{name}" if parent.path else name


class Aliases:
    """A node's names beyond its first: (directory, name) entries in the order they were
    made, as the registry's `links` rows (by rowid) are. Adding, removing and taking the
    first are O(1), so that a link or unlink costs the same whatever the node's number of
    names (issue 24: with a list copied at each change, a file with 20,000 names took 28
    links a second). A removal taken back (restore: a rolled-back transaction) returns the
    entry to its place."""

    __slots__ = ("_order",)
    _clock = itertools.count()           # one order for all: entries are compared by it

    def __init__(self) -> None:
        self._order: dict[tuple[Directory, str], int] = {}

    def __len__(self) -> int:
        return len(self._order)

    def __iter__(self) -> Iterator[tuple[Directory, str]]:
        return iter(self._order)

    def __contains__(self, entry: object) -> bool:
        return entry in self._order

    def add(self, entry: tuple[Directory, str]) -> None:
        self._order[entry] = next(self._clock)

    def remove(self, entry: tuple[Directory, str]) -> int:
        """Take `entry` out; what restore() needs to put it back in its place."""
        return self._order.pop(entry)

    def discard(self, entry: tuple[Directory, str]) -> None:
        self._order.pop(entry, None)

    def first(self) -> tuple[Directory, str]:
        return next(iter(self._order))

    def restore(self, entry: tuple[Directory, str], place: int) -> None:
        """Undo remove(): rare (a failed commit), so a re-sort may cost O(n) here."""
        last = next(reversed(self._order.values()), -1)
        self._order[entry] = place
        if place < last:
            self._order = dict(sorted(self._order.items(), key=lambda item: item[1]))


@dataclasses.dataclass(eq=False)
class Directory(Node):
    children: dict[str, Node] = dataclasses.field(default_factory=dict)
    subdirs: int = 0         # directories among the children (st_nlink = 2 + subdirs)
    # The durable default (issue 27; registry column `durable` of its row): the files
    # and the subdirectories made in it from now are durable, and a subdirectory carries
    # the default on. What is in it already, and what a rename or a hard link brings in,
    # keep their own durability.
    durable: bool = False

    # Change `children` only through these two, which keep `subdirs` right. `name`: the
    # entry's name when it is not the node's first (a hard link's).
    def add_child(self, node: Node, name: str | None = None) -> None:
        self.children[node.name if name is None else name] = node
        if isinstance(node, Directory):
            self.subdirs += 1

    def remove_child(self, name: str) -> None:
        if isinstance(self.children.pop(name), Directory):
            self.subdirs -= 1

    @property
    def st_mode(self) -> int:
        return stat.S_IFDIR | self.mode

    @property
    def nlink(self) -> int:
        return 2 + self.subdirs          # its entry, its '.', each subdirectory's '..'


@dataclasses.dataclass(eq=False)
class Symlink(Node):
    """A symbolic link: metadata only (a registry row), never memory. Its target is a plain
    string, spelled as names are (surrogateescape), kept as given: the kernel follows it on
    the mount, daemon/core/links.py through the socket API. Its mode is always 0777, as Linux
    shows a link's (the permissions that count are those of what it leads to)."""
    target: str = ""

    @property
    def st_mode(self) -> int:
        return stat.S_IFLNK | 0o777


# The registry's `kind` of each special file type (mknod(2)), and back.
SPECIAL_KINDS = {stat.S_IFIFO: "fifo", stat.S_IFCHR: "chr", stat.S_IFBLK: "blk",
                 stat.S_IFSOCK: "sock"}
SPECIAL_TYPES = {kind: ftype for ftype, kind in SPECIAL_KINDS.items()}


@dataclasses.dataclass(eq=False)
class Special(Node):
    """A FIFO, socket, or character or block device node: metadata only, as tmpfs keeps
    them. The kernel gives FIFOs and sockets their behaviour; device nodes cannot be opened
    as devices (the mount is nodev)."""
    ftype: int = stat.S_IFIFO       # S_IFIFO, S_IFCHR, S_IFBLK or S_IFSOCK
    rdev: int = 0                   # the device number of a device node; 0 otherwise

    @property
    def st_mode(self) -> int:
        return self.ftype | self.mode

    @property
    def kind(self) -> str:
        return SPECIAL_KINDS[self.ftype]


def kind_of(node: Node) -> str:
    """The registry's `kind` column for a node."""
    if isinstance(node, Directory):
        return "dir"
    if isinstance(node, Symlink):
        return "symlink"
    if isinstance(node, Special):
        return node.kind
    return "alloc"


# An allocation's states of sleep (daemon/core/sleep.py): their row keeps the state it wakes
# into (`awake_state`).
MOVING = ("sleeping", "asleep", "waking")


@dataclasses.dataclass(eq=False)
class Allocation(Node):
    size: int = 0                    # 0 while pending (no memory yet)
    capacity: int | None = None
    device: str | None = None        # device UUID
    durable: bool = False
    state: str = "pending"           # 'pending' | 'ready' | 'degraded' | 'lost' (design.md),
                                     # or 'restoring' (daemon/core/refills.py; stored as 'lost')
                                     # or 'asleep' (daemon/core/sleep.py; column `asleep`),
                                     # 'sleeping' or 'waking' meanwhile (in memory only)
    ecc: str = "rs"
    buffer: Any = None               # the backend's buffer; None while pending or lost
    parity: Any = None               # ECC parity region (daemon/core/parity.py); None: no ECC
    tier: Any = None                 # asleep: its bytes in host memory (backends/tier.py)
    awake_state: str | None = None   # asleep: the state it wakes into, its row's `state`
    damaged: set = dataclasses.field(default_factory=set)  # blocks beyond repair (EIO)
    holders: dict[int, Holder] = dataclasses.field(default_factory=dict)
    unlinked: bool = False           # removed from the namespace, freed with its last holder
    leased: bool = False             # transient made with a session lease: freed with its
                                     # last holder
    unsealed: bool = False           # attached read-write and not yet sealed: its parity is
                                     # stale (registry column `unsealed`)
    writing: bool = False            # durable, written since its last sync: a crash now
                                     # leaves parity stale (registry unsealed = 2)
    dirty_from: int = 1 << 63        # the range written since the last sync (DataVerbs.sync):
    dirty_to: int = 0                # its parity is stale until then; empty when from > to
    verified_ns: int | None = None   # end of the last full verify/scrub pass; None: never
    snapshot: str | None = None      # newest snapshot reported to hold it (location/name)
    snapshot_ns: int | None = None   # and when it was taken; None: none reported
    # What changed since the last `changes` reset (a snapshot's): SNAPSHOT_BLOCK indices
    # written since `changes_token` was handed out; None: not known (never reset since the
    # daemon started, or written where the daemon cannot see: daemon/core/integrity.py).
    changes_token: str | None = None
    changed: set | None = None
    untracked: bool = False          # a dma-buf was exported: writes are never seen
    restore_queued: bool = False     # lost, and restore_on_start will refill it (autosnap)
    # (when a writer let go, modified_ns then): set by the first step of a close, detach or
    # seal whose parity work runs off the loop, for the time its last step stamps
    # (daemon/verbs/handles.py); None otherwise.
    let_go: tuple[int, int] | None = None
    # Held while its parity is encoded on a worker thread (daemon/integrity.ParityJob), and
    # by the event loop before it frees or replaces the memory or touches the parity.
    parity_lock: threading.RLock = dataclasses.field(default_factory=threading.RLock,
                                                     repr=False)

    @property
    def st_mode(self) -> int:
        return stat.S_IFREG | self.mode

    @property
    def nlink(self) -> int:
        return 0 if self.unlinked else (self.parent is not None) + len(self.aliases)

    @property
    def kept(self) -> bool:
        """Memory the keeper should hold: durable, present, and not half-way through a
        restore (a restore that dies must leave it lost, never adopted half-filled)."""
        return self.durable and self.buffer is not None and \
            self.state not in ("restoring", "waking")

    @property
    def asleep(self) -> bool:
        """Its bytes in host memory, its device memory given back (registry column), or
        coming back (`waking`: the row still says asleep, reads still come from there)."""
        return self.state in ("asleep", "waking")

    @property
    def stored_state(self) -> str:
        """The state its registry row has: a restore in progress is stored as 'lost', an
        asleep allocation as the state it wakes into (with `asleep` 1)."""
        if self.state in MOVING:
            return self.awake_state or "ready"
        return "lost" if self.state == "restoring" else self.state

    def holders_of(self, *kinds: str) -> list[Holder]:
        return [h for h in self.holders.values() if h.kind in kinds]

    @property
    def refcount(self) -> int:
        """Holders plus the durable pin (docs/design.md, "Lifetimes")."""
        return len(self.holders) + (1 if self.durable else 0)


def walk(top: Node, descend: Callable[[Directory], bool] = lambda d: True) -> Iterator[Node]:
    """`top` and everything below it, pre-order, children by name, entering only the
    directories `descend` accepts. A loop with a stack, not recursion: any user can make a
    directory chain thousands deep (0.3 s for 1,500 levels), deeper than Python's recursion
    limit."""
    stack = [top]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, Directory) and descend(node):
            stack.extend(node.children[name] for name in sorted(node.children, reverse=True))


def walk_entries(top: Directory, descend: Callable[[Directory], bool] = lambda d: True
                 ) -> Iterator[tuple[str, str, Node]]:
    """(path, name, node) of each entry below `top`, pre-order, children by name, entering
    only the directories `descend` accepts: a hard-linked file comes once per name, each
    with its own path (walk() gives the node and its first name's path)."""
    stack = [(top.path, name, node) for name, node in
             sorted(top.children.items(), reverse=True)] if descend(top) else []
    while stack:
        under, name, node = stack.pop()
        path = f"{under}/{name}" if under else name
        yield path, name, node
        if isinstance(node, Directory) and descend(node):
            stack.extend((path, child_name, child) for child_name, child
                         in sorted(node.children.items(), reverse=True))


class NodeTable:
    """Every node in the tree by id, and how many names each uid owns: what
    max_names_per_uid bounds (Namespace.insert_node; directories, allocations, symlinks,
    special files and hard links alike), counted as nodes and names come and go rather
    than by a walk. A node enters and leaves with one name; its hard links are counted by
    names_changed. Likewise the bytes of user metadata each uid's nodes hold (what
    metadata_user_max_bytes bounds, daemon/core/usermeta.py): a node brings its own and takes
    them with it, and metadata_changed counts a change of them."""

    def __init__(self) -> None:
        self._by_id: dict[int, Node] = {}
        self.owned: dict[int, int] = {}
        self.metadata: dict[int, int] = {}        # uid -> bytes of its nodes' metadata

    def __getitem__(self, node_id: int) -> Node:
        return self._by_id[node_id]

    def __setitem__(self, node_id: int, node: Node) -> None:
        self.pop(node_id)
        self._by_id[node_id] = node
        self._count(node.uid, 1)
        self._count_metadata(node.uid, node.metadata_bytes)

    def __len__(self) -> int:
        return len(self._by_id)

    def get(self, node_id: int) -> Node | None:
        return self._by_id.get(node_id)

    def pop(self, node_id: int, default: None = None) -> Node | None:
        node = self._by_id.pop(node_id, None)
        if node is not None:
            self._count(node.uid, -1)
            self._count_metadata(node.uid, -node.metadata_bytes)
        return node

    def values(self):
        return self._by_id.values()

    def reowned(self, node: Node, old_uid: int, new_uid: int) -> None:
        """A node went from `old_uid` to `new_uid` (chown, or its undoing): each of its
        names goes with it."""
        names = 1 + len(node.aliases)
        self._count(old_uid, -names)
        self._count(new_uid, names)
        self._count_metadata(old_uid, -node.metadata_bytes)
        self._count_metadata(new_uid, node.metadata_bytes)

    def names_changed(self, node: Node, delta: int) -> None:
        """A hard link to `node` was made (+1) or removed (-1): a name its owner has."""
        self._count(node.uid, delta)

    def metadata_changed(self, node: Node, delta: int) -> None:
        """`node`'s metadata grew by `delta` bytes (shrank, when negative)."""
        self._count_metadata(node.uid, delta)

    def _count_metadata(self, uid: int, delta: int) -> None:
        if not delta:
            return
        left = self.metadata.get(uid, 0) + delta
        if left:
            self.metadata[uid] = left
        else:
            self.metadata.pop(uid, None)

    def _count(self, uid: int, delta: int) -> None:
        left = self.owned.get(uid, 0) + delta
        if left:
            self.owned[uid] = left
        else:
            self.owned.pop(uid, None)
