"""The AllocationManager: the one place that changes allocations.

The socket server (and, later, the FUSE operations) are thin adapters over these methods.
Every method takes the caller's Credentials and applies the same permission rules, raises
`gpumemctl.protocol` errors, and keeps three things in step: the in-memory tree, the registry
and the keeper.

Ordering for crash safety (a kill -9 can land between any two steps):
- create durable: allocate, deposit the fds in the keeper, commit the registry row. A crash
  before the commit leaves fds in the keeper under an id the registry does not know: the next
  start frees them as orphans.
- remove durable: commit the deletion, withdraw from the keeper, free. A crash after the
  commit again leaves an orphan for the next start to free.
- registry says durable but the keeper has nothing (reboot, GPU reset, keeper killed while
  the daemon was down): the allocation is `lost`, and stays listed until removed.
Transient allocations never outlive the daemon; their rows are dropped at the next start.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import os
import time
from typing import Callable

from gpumemctl.protocol.defaults import DIR_MODE, FILE_MODE
from gpumemctl.protocol import (Busy, Exists, InternalError, InvalidState, NoMemory,
                                NotFound, PermissionDenied, Uncorrectable, UsageError,
                                check_component, round_up, split_path)

from .backends import Backend
from .check import Checker
from .describe import damaged_ranges, describe
from .journal import Journal
from .keeper_link import KeeperGone, KeeperStalled
from .nodes import Allocation, Directory, Holder, Node, walk
from .ecc.layout import BLOCK
from .orphans import (POLICIES, RECOVERY_DIR, OrphansHeld, capacity_of, classify,
                      entry_name, held)
from .parity import Parity, block_range, protected_blocks
from .permissions import Credentials, R, W, X, may_remove_from, require, require_owner
from .quotas import Quotas
from .registry import ROOT_ID, Registry
from .sessions import Session

log = logging.getLogger("gpumemd")

ECC_MODES = ("rs", "none")
# Holders that take part in "one writer or many readers": handles opened for I/O, and clients
# that mapped the memory (attach). Leases do not lock.
IO_KINDS = ("read", "write", "attach-r", "attach-w")
WRITER_KINDS = ("write", "attach-w")
ATTACH_KINDS = {"r": "attach-r", "rw": "attach-w"}
# Files open on the mount. They keep the memory of an unlinked file alive and count in the
# refcount, but take no part in the lock: the mount follows POSIX (any number of opens), and
# its handles hold no fd to the memory, so a resize under them is safe.
MOUNT_KINDS = ("mount-r", "mount-w")
RESERVED_AT_ROOT = (".metadata",)   # the mount's read-only metadata view (daemon/fs.py)
# A write past the capacity grows it by this factor (capped at GROWTH_CAP bytes a step), so
# a file written sequentially is copied O(log n) times, not once per granule; the spare is
# trimmed when its last mount writer closes (release_mount).
GROWTH_FACTOR = 2
GROWTH_CAP = 1 << 30
RELATIME_NS = 24 * 3600 * 10**9   # relatime: an access time older than this moves on a read
DIRTY_NONE = (1 << 63, 0)   # (dirty_from, dirty_to) of an allocation with no unsynced write
NOW = "now"
# The registry's `unsealed` column (registry.add_damage_table).
SEALED, UNSEALED, WRITING = 0, 1, 2           # setattr(mtime_ns=NOW): utimensat's UTIME_NOW
DAEMON = Credentials(pid=os.getpid(), uid=os.geteuid(), gid=os.getegid())


def check_mode(mode: int) -> int:
    if not isinstance(mode, int) or isinstance(mode, bool) or not 0 <= mode <= 0o7777:
        raise UsageError(f"invalid mode {mode!r}: expected octal permission bits 0000-7777")
    return mode


class AllocationManager:
    def __init__(self, registry: Registry, backend: Backend, keeper, *,
                 fault_injection: bool = False, default_ecc: str = "rs",
                 quotas: dict[int, int] | None = None):
        """`fault_injection`: gpumemd --enable-fault-injection (debug_corrupt); `default_ecc`:
        the ECC of creates that name none (config `ecc`); `quotas`: uid -> the capacity in
        bytes that uid's allocations may hold (config [quotas])."""
        if default_ecc not in ECC_MODES:
            raise ValueError(f"invalid default ecc {default_ecc!r}: expected one of "
                             f"{', '.join(ECC_MODES)}")
        self.registry = registry
        self.backend = backend
        self.keeper = keeper
        self.nodes: dict[int, Node] = {}
        self.root: Directory | None = None
        # The unit of work: transactions with their undo log, events, observers.
        self.journal = Journal(registry)
        self._holder_ids = itertools.count(1)
        self.sessions: dict[int, Session] = {}
        self._dirty: set[int] = set()        # ids whose size/times await flush_times()
        # Callbacks told about changes the kernel may have cached (daemon/fs.py invalidates
        # its dentries and attributes): watcher.entry_changed(parent_id, name) and
        # watcher.attrs_changed(node_id).
        self.watchers: list = []
        self.parity = Parity(backend)
        self.fault_injection = fault_injection
        self.default_ecc = default_ecc
        self.quotas = Quotas(self, quotas)   # per-uid capacity limits

    # =====================================================================================
    # start and stop
    # =====================================================================================
    def start(self, orphans: str = "refuse") -> dict:
        """Load the registry, re-adopt durable memory from the keeper, drop what is stale.

        Keeper entries the registry does not list are crash residue and are freed, unless
        daemon/orphans.py finds them foreign (the registry is new, another one, or older
        than the keeper's contents). Then `orphans` decides: 'refuse' raises OrphansHeld
        having changed nothing; 'adopt' re-registers every unlisted entry under
        /lost+found/<time>; 'free' frees them all."""
        self._load_tree()
        self.keeper.ensure_running()
        kept = self.keeper.fetch_all()
        metas = self.keeper.entries()
        strays = self._take_strays(kept, metas, orphans)
        summary = {"adopted": 0, "lost": 0, "orphans_freed": 0, "orphans_adopted": 0,
                   "transients_dropped": 0}
        damage = self.registry.damage()
        recovered: dict[int, list[int]] = {}
        with self.journal.change(durable=True):
            self.registry.clear_holders()
            if kept or strays:      # no new id may alias a key the keeper holds
                self.registry.reserve_node_ids(max(abs(k) for k in [*kept, *strays]))
            for alloc in [n for n in self.nodes.values() if isinstance(n, Allocation)]:
                if not alloc.durable:
                    self._forget_node(alloc)
                    self.journal.event("drop", alloc, None, reason="transient after restart")
                    summary["transients_dropped"] += 1
                elif alloc.capacity is None:
                    continue  # durable but pending: there is no memory to adopt
                elif alloc.id in kept or -alloc.id in kept:
                    adopted = self._adopt(alloc, kept.pop(alloc.id, None),
                                          kept.pop(-alloc.id, None))
                    summary["adopted" if adopted else "lost"] += 1
                elif alloc.state != "lost":
                    self._mark_lost(alloc, "the keeper holds no memory for it")
                    summary["lost"] += 1
            for key, fds in kept.items():
                self._free_orphan(key, fds)
                summary["orphans_freed"] += 1
            if orphans == "adopt":
                recovered = self._adopt_orphans(strays, metas, summary)
            else:
                for key, fds in strays.items():
                    self._free_orphan(key, fds, "freed as told (--free-orphans)")
                    summary["orphans_freed"] += 1
            summary["parity_rebuilt_blocks"] = self._settle_parity(damage)
            self.journal.event("start", None, None, backend=self.backend.name, **summary)
        for key in recovered:       # committed under new ids: the old keys may go now
            with contextlib.suppress(KeeperGone):
                self.keeper.withdraw(key)
        self._adopt_identity(metas)
        return summary

    def _take_strays(self, kept: dict[int, list[int]], metas: dict[int, dict] | None,
                     orphans: str) -> dict[int, list[int]]:
        """Take out of `kept` the entries that the `orphans` policy handles (start()).
        Refusing, close every fetched fd (the keeper keeps its own) and raise."""
        if orphans not in POLICIES:
            raise ValueError(f"unknown orphans policy {orphans!r}")
        listed = {n.id for n in self.nodes.values() if isinstance(n, Allocation)}
        foreign, why = classify(kept, metas, listed, self.registry.instance,
                                self.registry.created, self.registry.last_node_id())
        if foreign and orphans == "refuse":
            count, nbytes = held(kept, metas, foreign)
            for fds in kept.values():
                for fd in fds:
                    os.close(fd)
            raise OrphansHeld(count, nbytes, self.registry.path, why)
        if orphans != "refuse":
            foreign |= {k for k in kept if abs(k) not in listed}
        if foreign:
            log.warning("the keeper holds %d entr%s that registry %s does not list (%s); "
                        "%s them as told", len(foreign), "y" if len(foreign) == 1 else "ies",
                        self.registry.path, why or "unlisted",
                        "re-registering" if orphans == "adopt" else "freeing")
        return {k: kept.pop(k) for k in foreign}

    def _adopt_identity(self, metas: dict[int, dict] | None) -> None:
        """Deposits made before the registry's identity went into their meta get it now, so
        that the next start can tell them from another registry's (daemon/orphans.py)."""
        if metas is None:
            return
        for alloc in self.allocations():
            meta = metas.get(alloc.id)
            if meta is not None and "registry" not in meta and alloc.buffer is not None \
                    and alloc.durable:
                with contextlib.suppress(InternalError):
                    self._deposit(alloc)

    def _settle_parity(self, damage: dict[int, set[int]]) -> int:
        """After adoption: give each protected allocation its parity and its damage list.
        Kept parity is used as it is, except where writes were in flight at a crash (the
        WRITING mark): there the data is what the writers left, so the parity is rebuilt
        from it rather than the data "repaired" back (docs/ecc.md, "After a crash")."""
        rebuilt = 0
        for alloc in self.allocations():
            alloc.damaged = damage.get(alloc.id, set())
            if not self.parity.wanted(alloc):
                continue
            if alloc.parity is None or alloc.parity.capacity != self.parity.size_for(alloc) \
                    or alloc.parity.blocks != alloc.capacity // BLOCK:
                self.parity.free(alloc)
                self.parity.ensure(alloc)
                self._deposit(alloc)
                rebuilt += protected_blocks(alloc)
            elif alloc.writing and not alloc.unsealed:
                # Writes were in flight when the daemon died: the data is what the writers
                # left; bring the parity to it rather than "repair" the data back.
                rebuilt += self.parity.encode(alloc, 0, alloc.size or 0)
                self._writes_synced(alloc)
                self.journal.event("parity", alloc, None, action="rebuilt",
                            reason="writes were in flight at an unclean stop")
        if rebuilt:
            log.info("parity rebuilt for %d blocks", rebuilt)
        return rebuilt

    # ---- the "writes in flight" mark (registry unsealed = WRITING) ------------------------
    def _writes_begin(self, alloc: Allocation) -> None:
        """Before the first write since the last sync to a protected durable allocation:
        record, with fsync, that its parity is about to go stale. A crash before the sync
        then rebuilds the parity from the data (_settle_parity), and only then: a crash
        never "repairs" pending writes away, nor blesses corruption elsewhere."""
        if alloc.writing or alloc.unsealed or alloc.parity is None or not alloc.durable \
                or alloc.unlinked:
            return
        with self.journal.change(durable=True):
            self.registry.update_node(alloc.id, unsealed=WRITING)
        alloc.writing = True

    def _writes_synced(self, alloc: Allocation) -> None:
        if not alloc.writing:
            return
        alloc.writing = False
        if not alloc.unlinked:
            with self.journal.change(durable=False):
                self.registry.update_node(alloc.id, unsealed=SEALED)

    def _load_tree(self) -> None:
        rows = self.registry.load_nodes()
        for row in rows:
            self.nodes[row["id"]] = self._node_from_row(row)
        for row in rows:
            node = self.nodes[row["id"]]
            if row["parent"] is None:
                self.root = node
            else:
                parent = self.nodes[row["parent"]]
                node.parent = parent
                parent.add_child(node)
        if self.root is None or self.root.id != ROOT_ID:
            raise InternalError("registry has no root directory")

    @staticmethod
    def _node_from_row(row) -> Node:
        common = dict(id=row["id"], name=row["name"], parent=None, uid=row["uid"],
                      gid=row["gid"], mode=row["mode"], created_ns=row["created_ns"],
                      modified_ns=row["modified_ns"], changed_ns=row["changed_ns"],
                      accessed_ns=row["accessed_ns"])
        if row["kind"] == "dir":
            return Directory(**common)
        return Allocation(**common, size=row["size"], capacity=row["capacity"],
                          device=row["device"], durable=bool(row["durable"]),
                          unsealed=row["unsealed"] == UNSEALED,
                          writing=row["unsealed"] == WRITING,
                          state=row["state"], ecc=row["ecc"], verified_ns=row["verified_ns"])

    def _adopt(self, alloc: Allocation, fds: list[int] | None,
               staged: list[int] | None = None) -> bool:
        """Re-adopt kept memory. `staged` is what a resize deposited under -id before its
        commit (see resize()): of the two copies, the one with the registry's capacity is
        the committed one; it ends up under the id, and the other is freed."""
        copies = [(k, f) for k, f in ((alloc.id, fds), (-alloc.id, staged)) if f is not None]
        error: Exception | None = None
        for i, (key, kept_fds) in enumerate(copies):
            data_fds, parity_fds = kept_fds[:1], kept_fds[1:]
            try:
                alloc.buffer = self.backend.adopt(data_fds, alloc.capacity, alloc.device)
            except Exception as exc:  # noqa: BLE001 - this copy is not the committed one
                error = exc
                for fd in parity_fds:
                    os.close(fd)
                with contextlib.suppress(KeeperGone):
                    self.keeper.withdraw(key)
                continue
            self._adopt_parity(alloc, parity_fds)
            for other_key, other_fds in copies[i + 1:]:
                self._free_orphan(other_key, other_fds)
            if key != alloc.id:     # the resize committed: its copy becomes the kept one
                self._deposit(alloc)
                with contextlib.suppress(KeeperGone):
                    self.keeper.withdraw(key)
            if alloc.state in ("lost", "pending"):
                alloc.state = "ready"
                self.registry.update_node(alloc.id, state="ready")
            self.journal.event("adopt", alloc, None, capacity=alloc.capacity)
            return True
        self._mark_lost(alloc, f"re-adoption failed: {error}")
        return False

    def _adopt_parity(self, alloc: Allocation, fds: list[int]) -> None:
        """Take back the parity the keeper kept; a missing or wrong-sized one is rebuilt
        from the data by _settle_parity."""
        if not fds:
            return
        if alloc.ecc != "rs":
            for fd in fds:
                os.close(fd)
            return
        try:
            alloc.parity = self.backend.adopt(fds, self.parity.size_for(alloc), alloc.device)
            alloc.parity.blocks = alloc.capacity // BLOCK
        except Exception as exc:  # noqa: BLE001 - rebuilt from the data instead
            log.warning("kept parity of '%s' unusable (%s); rebuilding it", alloc.path, exc)

    def _mark_lost(self, alloc: Allocation, reason: str) -> None:
        alloc.state = "lost"
        alloc.buffer = None
        self.registry.update_node(alloc.id, state="lost")
        self.journal.event("lost", alloc, None, reason=reason)
        log.warning("allocation %s (id %d) is lost: %s", alloc.path, alloc.id, reason)

    def _free_orphan(self, key: int, fds: list[int], reason: str = "crash residue") -> None:
        """Free what the keeper held under a key the registry does not list. Normally the
        residue of a crash (docs/durability.md, "Crash ordering"), yet memory is going, so
        it is a warning."""
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(KeeperGone):
            self.keeper.withdraw(key)
        self.journal.event("orphan", None, None, key=key,
                    reason=f"the keeper held memory the registry does not list; {reason}")
        log.warning("freed the memory the keeper held under key %d, which the registry does "
                    "not list (%s)", key, reason)

    def _adopt_orphans(self, strays: dict[int, list[int]], metas: dict[int, dict] | None,
                       summary: dict) -> dict[int, list[int]]:
        """--adopt-orphans: re-register each stray entry as a durable allocation in a new
        /lost+found/<UTC time>, owned by the daemon's user (root) with mode 0700, so that
        only root sees them until it hands them on (chown, mv). Returns the entries
        re-registered; their old keys are withdrawn once this commits (start()). One that
        cannot be (its device is gone, its size unknown) is freed and counted so."""
        if not strays:
            return {}
        directory = self._recovery_dir()
        summary["recovery_dir"] = directory.path
        recovered = {}
        for key in sorted(strays, key=lambda k: (abs(k), k < 0)):
            if self._adopt_orphan(directory, key, strays[key], (metas or {}).get(key)):
                recovered[key] = strays[key]
                summary["orphans_adopted"] += 1
            else:
                summary["orphans_freed"] += 1
        return recovered

    def _adopt_orphan(self, directory: Directory, key: int, fds: list[int],
                      meta: dict | None) -> bool:
        """One entry: its size is the capacity its deposit recorded (the size asked for is
        not kept), its ECC `rs` when a parity fd came with it. The kept parity is dropped
        and rebuilt from the data (_settle_parity): what it last covered is not known."""
        capacity = capacity_of(fds, meta)
        try:
            dev = self.backend.device((meta or {}).get("device"))
            if capacity <= 0:
                raise InvalidState("its size is not known")
        except Exception as exc:  # noqa: BLE001 - freed instead, and said so
            self._free_orphan(key, fds, f"cannot be re-registered: {exc}")
            return False
        for fd in fds[1:]:
            os.close(fd)
        try:
            buf = self.backend.adopt(fds[:1], capacity, dev.uuid)
        except Exception as exc:  # noqa: BLE001 - the backend closed the fd
            self._free_orphan(key, [], f"cannot be re-registered: {exc}")
            return False
        alloc = self._insert_node(
            Allocation, directory, entry_name(key), DAEMON, 0o600, size=capacity,
            capacity=capacity, device=dev.uuid, durable=True, state="ready",
            ecc="rs" if len(fds) > 1 else "none", buffer=buf)
        self._deposit(alloc)
        self.journal.event("adopt", alloc, None, capacity=capacity, key=key, recovered=True)
        log.warning("re-registered the memory the keeper held under key %d as '%s'", key,
                    alloc.path)
        return True

    def _recovery_dir(self) -> Directory:
        """A new /lost+found/<UTC time> for re-registered orphans. /lost+found is reused
        only if it is the daemon user's and closed to others (anyone may create entries at
        the root), else a free name beside it is taken."""
        top = self._private_dir(self.root, RECOVERY_DIR, reuse=True)
        stamp = time.strftime("%Y-%m-%dT%H-%M-%SZ", time.gmtime())
        return self._private_dir(top, stamp, reuse=False)

    def _private_dir(self, parent: Directory, base: str, reuse: bool) -> Directory:
        for n in itertools.count(1):
            name = base if n == 1 else f"{base}-{n}"
            node = parent.children.get(name)
            if node is None:
                made = self._insert_node(Directory, parent, name, DAEMON, 0o700)
                self.journal.event("mkdir", made, None, mode="0700")
                return made
            if reuse and isinstance(node, Directory) and node.uid == DAEMON.uid \
                    and not node.mode & 0o077:
                return node
        raise AssertionError("unreachable")

    def shutdown(self) -> None:
        """Clean stop: transient memory goes, durable memory stays with the keeper."""
        with self.journal.change(durable=False):
            for alloc in [n for n in self.nodes.values() if isinstance(n, Allocation)]:
                if not alloc.durable:
                    self._forget_node(alloc)
            self.registry.clear_holders()
            self.journal.event("stop", None, None)
        for alloc in [n for n in self.nodes.values() if isinstance(n, Allocation)]:
            self._free_buffer(alloc)
        self.keeper.close()

    # =====================================================================================
    # lookups
    # =====================================================================================
    def lookup(self, path: str, cred: Credentials, *, allow_root: bool = False) -> Node:
        """Resolve a path, requiring search (x) permission on every directory passed."""
        node: Node = self.root
        parts = split_path(path, allow_root=allow_root)
        for i, part in enumerate(parts):
            if not isinstance(node, Directory):
                raise NotFound(f"'{'/'.join(parts[:i])}' is an allocation, not a directory")
            require(node, cred, X)
            child = node.children.get(part)
            if child is None:
                raise NotFound(f"no such allocation or directory: '{'/'.join(parts[:i + 1])}'")
            node = child
        return node

    def lookup_allocation(self, path: str, cred: Credentials) -> Allocation:
        node = self.lookup(path, cred)
        if not isinstance(node, Allocation):
            raise UsageError(f"'{node.path}' is a directory, not an allocation")
        return node

    def info(self, path: str, cred: Credentials) -> dict:
        return describe(self.lookup(path, cred, allow_root=True), holders=True)

    def listdir(self, path: str, cred: Credentials, *, recursive: bool = False) -> list[dict]:
        node = self.lookup(path, cred, allow_root=True)
        if isinstance(node, Allocation):
            return [describe(node)]
        require(node, cred, R | X, "list")
        out: list[dict] = []
        self._list_into(node, cred, recursive, out)
        return out

    def _list_into(self, directory: Directory, cred, recursive: bool, out: list) -> None:
        """The entries below `directory`, pre-order; with `recursive`, into every directory
        the caller may list (walk: no recursion, a chain may be thousands deep)."""
        def enter(d: Directory) -> bool:
            return d is directory or (recursive and self._allowed(d, cred, R | X))
        out.extend(describe(node) for node in walk(directory, enter) if node is not directory)

    @staticmethod
    def _allowed(node, cred, want) -> bool:
        try:
            require(node, cred, want)
            return True
        except PermissionDenied:
            return False

    def allocations(self) -> list[Allocation]:
        return [n for n in self.nodes.values() if isinstance(n, Allocation)]

    # =====================================================================================
    # namespace changes
    # =====================================================================================
    def _parent_for_new(self, parts: list[str], cred: Credentials, parents: bool):
        """Find the directory that will hold parts[-1]; with `parents`, list the missing
        directories to create (as names under the last existing one)."""
        node: Node = self.root
        for i, part in enumerate(parts[:-1]):
            if not isinstance(node, Directory):
                raise NotFound(f"'{'/'.join(parts[:i])}' is an allocation, not a directory")
            require(node, cred, X)
            child = node.children.get(part)
            if child is None:
                if not parents:
                    raise NotFound(f"no such directory: '{'/'.join(parts[:i + 1])}'")
                return node, parts[i:-1]
            node = child
        if not isinstance(node, Directory):
            raise NotFound(f"'{'/'.join(parts[:-1])}' is an allocation, not a directory")
        return node, []

    def _insert_dirs(self, parent: Directory, names: list[str], cred: Credentials,
                     mode: int) -> Directory:
        """Create a chain of directories (inside the caller's transaction)."""
        for name in names:
            require(parent, cred, W | X, "create entries in")
            parent = self._insert_node(Directory, parent, name, cred, mode)
            self.journal.event("mkdir", parent, cred, mode=f"{mode:04o}")
        return parent

    def _insert_node(self, cls, parent: Directory, name: str, cred: Credentials, mode: int,
                     **alloc_fields):
        self._check_not_reserved(parent, name)
        now = time.time_ns()
        gid = parent.gid if parent.mode & 0o2000 else cred.gid   # setgid directories
        if cls is Directory and parent.mode & 0o2000:
            mode |= 0o2000
        row = dict(parent=parent.id, name=name, kind="dir" if cls is Directory else "alloc",
                   uid=cred.uid, gid=gid, mode=mode, created_ns=now, modified_ns=now,
                   changed_ns=now, accessed_ns=now)
        db_fields = {k: v for k, v in alloc_fields.items()
                     if k not in ("buffer", "leased")}
        node_id = self.registry.insert_node(**row, **db_fields)
        node = cls(id=node_id, name=name, parent=parent, uid=cred.uid, gid=gid, mode=mode,
                   created_ns=now, modified_ns=now, changed_ns=now, **alloc_fields)
        self._link(parent, node, now)
        return node

    def _check_not_reserved(self, parent: Directory, name: str) -> None:
        if parent is self.root and name in RESERVED_AT_ROOT:
            raise UsageError(f"'{name}' is reserved at the top level (the mount shows "
                             "allocation details there)", details={"errno": "EPERM"})

    def _link(self, parent: Directory, node: Node, now: int) -> None:
        self.journal.keep(parent, "modified_ns", "changed_ns")
        self.nodes[node.id] = node
        parent.add_child(node)

        def unlink() -> None:
            if parent.children.get(node.name) is node:
                parent.remove_child(node.name)
            self.nodes.pop(node.id, None)
        self.journal.on_rollback(unlink)
        parent.modified_ns = parent.changed_ns = now
        self.registry.update_node(parent.id, modified_ns=now, changed_ns=now)
        self.journal.node_changed(parent)

    def _unlink(self, node: Node) -> None:
        now = time.time_ns()
        parent = node.parent
        if self.nodes.get(node.id) is node:
            self.journal.on_rollback(lambda: self.nodes.__setitem__(node.id, node))
        if parent is not None and parent.children.get(node.name) is node:
            self.journal.keep(parent, "modified_ns", "changed_ns")
            parent.remove_child(node.name)
            self.journal.on_rollback(lambda: parent.add_child(node))
            parent.modified_ns = parent.changed_ns = now
            self.registry.update_node(parent.id, modified_ns=now, changed_ns=now)
            self._entry_changed(parent, node.name)
            self.journal.node_changed(parent)
        self.nodes.pop(node.id, None)

    def _entry_changed(self, parent: Directory, name: str) -> None:
        for watcher in self.watchers:
            watcher.entry_changed(parent.id, name)

    def _attrs_changed(self, node: Node) -> None:
        for watcher in self.watchers:
            watcher.attrs_changed(node.id)

    def _forget_node(self, node: Node) -> None:
        """Remove a node's row and its place in the tree (memory is the caller's concern)."""
        self.registry.delete_node(node.id)
        self._unlink(node)

    def mkdir(self, path: str, cred: Credentials, *, mode: int = DIR_MODE,
              parents: bool = False, exist_ok: bool = False) -> dict:
        check_mode(mode)
        parts = split_path(path)
        parent, missing = self._parent_for_new(parts, cred, parents)
        existing = parent.children.get(parts[-1]) if not missing else None
        if existing is not None:
            if isinstance(existing, Directory) and (exist_ok or parents):
                return describe(existing)
            raise Exists(f"'{existing.path}' already exists")
        with self.journal.change(durable=False):
            node = self._insert_dirs(parent, missing + [parts[-1]], cred, mode)
        return describe(node)

    def create(self, path: str, cred: Credentials, *, size: int, durable: bool = False,
               mode: int = FILE_MODE, device: str | None = None,
               ecc: str | None = None, exist_ok: bool = False,
               session: Session | None = None, lease: bool = False) -> dict:
        """Allocate. Missing parent directories are created (mode 0755), like `mkdir -p`.
        `ecc` None: the daemon's default (the configuration's `ecc`)."""
        check_mode(mode)
        ecc = self.default_ecc if ecc is None else ecc
        if ecc not in ECC_MODES:
            raise UsageError(f"invalid ECC mode {ecc!r}: expected one of {', '.join(ECC_MODES)}")
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise UsageError(f"invalid size {size!r}: must be a whole number of bytes >= 1")
        if lease and durable:
            raise UsageError("a durable allocation cannot have a session lease")
        if lease and session is None:
            raise UsageError("a lease needs a session")
        parts = split_path(path)
        parent, missing = self._parent_for_new(parts, cred, parents=True)
        existing = parent.children.get(parts[-1]) if not missing else None
        if existing is not None:
            return self._create_existing(existing, cred, size, durable, exist_ok)
        require(parent, cred, W | X, "create entries in")
        dev = self.backend.device(device)
        capacity = round_up(size, dev.granularity)
        self._require_could_fit(dev, size, ecc)
        self.quotas.check(cred.uid, capacity)
        self.backend.check_free(dev, capacity + self.parity.extra(ecc, dev, capacity),
                                requested=size)
        buf = self.backend.allocate(capacity, dev.uuid, label="/".join(parts))
        alloc = None
        try:
            with self.journal.change(durable=durable, batch=not durable and not missing):
                directory = self._insert_dirs(parent, missing, cred, DIR_MODE)
                alloc = self._insert_node(
                    Allocation, directory, parts[-1], cred, mode, size=size,
                    capacity=capacity, device=dev.uuid, durable=durable, state="ready",
                    ecc=ecc, buffer=buf, leased=lease)
                self.parity.ensure(alloc, fresh=True)
                if durable:
                    self._deposit(alloc)
                self.journal.event("create", alloc, cred, size=size, capacity=capacity,
                            device=dev.uuid, durable=durable, lease=lease)
        except BaseException:     # the undo log took back the tree and any deposit
            self.backend.free(buf)
            if alloc is not None:
                self.parity.free(alloc)
            raise
        if lease:
            self._add_holder(alloc, session, "lease")
        return describe(alloc, holders=True)

    def _create_existing(self, existing: Node, cred: Credentials, size: int, durable: bool,
                         exist_ok: bool) -> dict:
        if not exist_ok or not isinstance(existing, Allocation):
            raise Exists(f"'{existing.path}' already exists")
        if existing.size != size:
            raise Exists(f"'{existing.path}' already exists with size {existing.size}, not "
                         f"{size}", details={"size": existing.size})
        # Idempotent create never drops durability; asking for durable makes it durable.
        if durable and not existing.durable:
            return self.set_durable(existing.path, cred, True)
        require(existing, cred, R, "read")
        return describe(existing, holders=True)

    def _deposit(self, alloc: Allocation) -> None:
        """Hand the keeper the allocation's fds: [data] or [data, parity]."""
        fds = self.backend.keeper_fds(alloc.buffer)
        if alloc.parity is not None:
            fds += self.backend.keeper_fds(alloc.parity)
        try:
            self.keeper.deposit(alloc.id, fds, {"capacity": alloc.capacity,
                                                "device": alloc.device,
                                                "registry": self.registry.instance})
            self.journal.on_rollback(lambda: self._withdraw_quietly(alloc.id))
        except KeeperStalled as exc:         # busy, not broken: it works again once it answers
            raise Busy(f"cannot make '{alloc.path}' durable now: {exc}") from None
        except KeeperGone as exc:
            raise InternalError(f"cannot make '{alloc.path}' durable: {exc}") from None
        finally:
            for fd in fds:
                os.close(fd)

    def _withdraw_quietly(self, key: int) -> None:
        """Take a deposit back that a rolled-back transaction made; a keeper that cannot be
        reached is reconciled later (reconcile_keeper, redeposit_all, or the next start)."""
        with contextlib.suppress(KeeperGone):
            self.keeper.withdraw(key)

    def remove(self, path: str, cred: Credentials, *, recursive: bool = False,
               force: bool = False) -> list[str]:
        """Remove an allocation or (with `recursive`) a directory tree. Returns the paths
        removed. An allocation with open handles is busy unless `force`: then its name goes
        now and its memory with its last holder."""
        node = self.lookup(path, cred)
        if isinstance(node, Directory) and not recursive:
            raise UsageError(f"'{node.path}' is a directory; use -r to remove it and its "
                             "contents")
        doomed = self._removal_order(node, cred)
        if not force:
            for victim in doomed:
                if isinstance(victim, Allocation) and victim.holders_of(*IO_KINDS):
                    raise Busy(self._busy_message(victim))
        any_durable = any(isinstance(v, Allocation) and v.durable for v in doomed)
        with self.journal.change(durable=any_durable, batch=all(
                isinstance(v, Allocation) and not v.durable for v in doomed)):
            for victim in doomed:
                self._forget_node(victim)
                self.journal.event("remove", victim, cred, force=force)
        for victim in doomed:
            if isinstance(victim, Allocation):
                self._release_memory(victim)
        return [v.path for v in doomed]

    def _removal_order(self, node: Node, cred: Credentials) -> list[Node]:
        """Children before parents, each checked for permission before anything changes."""
        order: list[Node] = []
        stack: list[tuple[Node, bool]] = [(node, False)]     # (node, its children queued)
        while stack:                  # post-order with a stack: a chain may be thousands deep
            n, queued = stack.pop()
            if isinstance(n, Directory) and not queued:
                require(n, cred, R | W | X, "remove entries from")
                stack.append((n, True))
                stack.extend((child, False) for child in reversed(list(n.children.values())))
                continue
            parent = n.parent
            require(parent, cred, W | X, "remove entries from")
            if not may_remove_from(parent, n, cred):
                raise PermissionDenied(
                    f"permission denied: '{parent.path or '/'}' is sticky; only the owner "
                    f"of '{n.path}' (uid {n.uid}) may remove it")
            order.append(n)
        return order

    def _release_memory(self, alloc: Allocation) -> None:
        """After the row is gone: let go of the keeper's copy, then free (or wait for the
        last holder, if forced)."""
        alloc.unlinked = True
        if alloc.durable:
            with contextlib.suppress(KeeperGone):
                self.keeper.withdraw(alloc.id)
        if not alloc.holders_of(*IO_KINDS, *MOUNT_KINDS):
            for holder in list(alloc.holders.values()):
                self._drop_holder_record(holder)
            self._free_buffer(alloc)

    def _free_buffer(self, alloc: Allocation) -> None:
        if alloc.buffer is not None:
            self.backend.free(alloc.buffer)
            alloc.buffer = None
        self.parity.free(alloc)

    @staticmethod
    def _busy_message(alloc: Allocation) -> str:
        users = ", ".join(f"{h.kind} by pid {h.pid}" for h in alloc.holders_of(*IO_KINDS))
        return f"'{alloc.path}' is busy ({users}); use --force to remove it anyway"

    def set_durable(self, path: str, cred: Credentials, durable: bool) -> dict:
        return self.set_durable_node(self.lookup_allocation(path, cred), cred, durable)

    def set_durable_node(self, alloc: Allocation, cred: Credentials, durable: bool) -> dict:
        require_owner(alloc, cred, "change the durability of")
        if alloc.state == "lost":
            raise InvalidState(f"'{alloc.path}' is lost: its memory is gone; remove it")
        if alloc.unlinked:
            raise InvalidState(f"'{alloc.path}' has been removed; it cannot change "
                               "durability")
        if alloc.durable == durable:
            return describe(alloc, holders=True)
        with self.journal.change(durable=True):
            self.journal.keep(alloc, "durable", "changed_ns")
            alloc.durable = durable
            alloc.changed_ns = time.time_ns()
            self.registry.update_node(alloc.id, durable=int(durable),
                                      changed_ns=alloc.changed_ns)
            if durable and alloc.buffer is not None:
                self._deposit(alloc)
            self.journal.event("durable" if durable else "transient", alloc, cred)
        if durable:
            alloc.leased = False       # the durable pin replaces any lease
            if alloc.dirty_to > alloc.dirty_from:
                self._writes_begin(alloc)  # writes not yet synced now matter after a crash
            for holder in alloc.holders_of("lease"):
                self._remove_holder(holder)
        elif alloc.buffer is not None:
            with contextlib.suppress(KeeperGone):
                self.keeper.withdraw(alloc.id)
        return describe(alloc, holders=True)

    # =====================================================================================
    # filesystem operations: what the FUSE layer (daemon/fs.py) needs, by node id
    # =====================================================================================
    # Errors that need an errno other than their class's (daemon/errno_map.py) carry its
    # name in details["errno"]: ENOTDIR, EISDIR, ENOTEMPTY, EPERM.
    def node(self, node_id: int) -> Node:
        node = self.nodes.get(node_id)
        if node is None:
            raise NotFound(f"no node with id {node_id}")
        return node

    def _directory(self, node_id: int) -> Directory:
        node = self.node(node_id)
        if not isinstance(node, Directory):
            raise UsageError(f"'{node.path}' is an allocation, not a directory",
                             details={"errno": "ENOTDIR"})
        return node

    def lookup_child(self, parent_id: int, name: str, cred: Credentials) -> Node:
        check_component(name)
        parent = self._directory(parent_id)
        require(parent, cred, X)
        child = parent.children.get(name)
        if child is None:
            where = f"{parent.path}/{name}" if parent.path else name
            raise NotFound(f"no such allocation or directory: '{where}'")
        return child

    def mkdir_child(self, parent_id: int, name: str, cred: Credentials,
                    mode: int = DIR_MODE) -> Directory:
        parent = self._parent_for_entry(parent_id, name, cred, mode)
        with self.journal.change(durable=False):
            return self._insert_dirs(parent, [name], cred, mode)

    def _parent_for_entry(self, parent_id: int, name: str, cred: Credentials,
                          mode: int) -> Directory:
        """Checks shared by every new entry made by parent id: mode, name, permission on
        the parent, and that the name is free."""
        check_mode(mode)
        check_component(name)
        parent = self._directory(parent_id)
        require(parent, cred, W | X, "create entries in")
        if name in parent.children:
            raise Exists(f"'{parent.children[name].path}' already exists")
        return parent

    def create_pending(self, parent_id: int, name: str, cred: Credentials,
                       mode: int = FILE_MODE) -> Allocation:
        """An allocation without memory, as `touch` in the mount makes: state 'pending',
        size 0 (so st_size is 0; the registry's size column is 0, not NULL, for these),
        capacity, device and buffer None. It is transient; resize() gives it memory."""
        parent = self._parent_for_entry(parent_id, name, cred, mode)
        with self.journal.change(durable=False, batch=True):
            alloc = self._insert_node(Allocation, parent, name, cred, mode, size=0,
                                      capacity=None, device=None, durable=False,
                                      state="pending", ecc=self.default_ecc)
            self.journal.event("create", alloc, cred, size=0, state="pending")
        return alloc

    def resize(self, alloc: Allocation, cred: Credentials, size: int, *,
               session: Session | None = None, authorised: bool = False) -> Allocation:
        """Set the size (truncate, or `user.gpu.size`). Needs write permission, and no read,
        write or attach holder outside `session` (Busy): those hold fds to the memory.

        - pending: allocate round_up(size); size 0 leaves it pending.
        - same capacity: only the size changes.
        - new capacity (at least one granule: a ready allocation keeps memory at size 0):
          a new buffer, min(old, new size) bytes copied on the device, the old one freed.
        Bytes past the size are undefined (an attached client may write anywhere in the
        capacity): whatever a grow exposes is zeroed here, so it reads as zeros.

        A durable allocation's keeper copy changes in this order, so that the keeper never
        holds nothing for a committed allocation: (1) deposit the new fds under the staging
        key -id, (2) commit the registry, (3) deposit them under id (replacing the old
        copy), (4) withdraw -id. A crash before (2) restarts with the old capacity: the old
        copy is adopted and the staged one freed; after (2), start() adopts whichever copy
        has the committed capacity (_adopt). `authorised`: the caller (the kernel, for
        the mount) has checked the permission."""
        if not authorised:
            require(alloc, cred, W)
        return self._resize(alloc, cred, size, session)

    def _resize(self, alloc: Allocation, cred: Credentials, size: int,
                session: Session | None, *, capacity: int | None = None) -> Allocation:
        """`capacity`: what to allocate if the memory must change (default: the size rounded
        up to the granularity)."""
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise UsageError(f"invalid size {size!r}: must be a whole number of bytes >= 0")
        if alloc.state not in ("pending", "ready"):
            raise InvalidState(f"'{alloc.path}' is {alloc.state}: it cannot be resized")
        others = [h for h in alloc.holders_of(*IO_KINDS)
                  if session is None or h.session is not session]
        if others:
            raise Busy(f"'{alloc.path}' is in use ({others[0].kind} by pid {others[0].pid}); "
                       "it cannot be resized now")
        if size == alloc.size or (alloc.state == "pending" and size == 0):
            return alloc
        dev = self.backend.device(alloc.device)
        fit = max(dev.granularity, round_up(size, dev.granularity))
        capacity = max(fit, capacity or 0)
        held = alloc.capacity if alloc.buffer is not None else 0
        if size > alloc.size:
            self._require_could_fit(dev, size, alloc.ecc)
        self.quotas.check(alloc.uid, capacity - held)
        old_size, fresh = alloc.size, alloc.state == "pending"
        if fresh:
            self._allocate_pending(alloc, cred, dev, size, capacity)
        elif capacity == alloc.capacity:          # keep the memory: no copy at all
            if size > alloc.size:
                self.backend.zero(alloc.buffer, alloc.size, size)
            self._commit_size(alloc, cred, size, capacity, alloc.size)
        else:
            self._reallocate(alloc, cred, dev, size, capacity)
        self._protect_resized(alloc, old_size, fresh)
        return alloc

    def _require_could_fit(self, dev, size: int, ecc: str) -> None:
        """NoMemory with errno EFBIG for a size no device could ever hold: its footprint
        exceeds every device's total. A size that fits a device's total but not what is
        free now is check_free's (ENOSPC). `dev`: the device the request names; the
        message is the out-of-memory one (Backend.no_memory) and says why it is final."""
        if any(self._footprint(d, size, ecc) <= d.total for d in self.backend.devices()):
            return
        base = self.backend.no_memory(dev, self._footprint(dev, size, ecc), dev.free,
                                      requested=size)
        raise NoMemory(f"{base.message}; that exceeds the device's total memory: no device "
                       "here could ever hold it", details={**base.details, "errno": "EFBIG"})

    def _footprint(self, dev, size: int, ecc: str) -> int:
        """Bytes an allocation of `size` takes on `dev`: its capacity and its ECC parity."""
        capacity = round_up(max(size, 1), dev.granularity)
        return capacity + self.parity.extra(ecc, dev, capacity)

    def _protect_resized(self, alloc: Allocation, old_size: int, fresh: bool) -> None:
        """After a resize: parity sized for the new capacity (a new region is encoded
        whole), or, with the same capacity, the blocks between the two sizes re-encoded."""
        if self.parity.ensure(alloc, fresh=fresh, keep_below=min(old_size or 0, alloc.size)):
            if alloc.durable and not alloc.unlinked:
                self._deposit(alloc)
        elif alloc.parity is not None and not alloc.unsealed:
            self.parity.encode(alloc, min(old_size, alloc.size), max(old_size, alloc.size))

    def _allocate_pending(self, alloc: Allocation, cred: Credentials, dev, size: int,
                          capacity: int) -> None:
        """Same order as create: allocate, deposit (durable), commit. A crash before the
        commit leaves the row pending and the keeper's copy an orphan the next start frees."""
        self.backend.check_free(dev, capacity + self.parity.extra(alloc.ecc, dev, capacity),
                                requested=size)
        alloc.buffer = self.backend.allocate(capacity, dev.uuid, label=alloc.path)
        alloc.device, alloc.state = dev.uuid, "ready"
        try:
            self.backend.zero(alloc.buffer, 0, size)
            if alloc.durable and not alloc.unlinked:
                self._deposit(alloc)
            self._commit_size(alloc, cred, size, capacity, 0)
        except BaseException:
            if alloc.durable:
                with contextlib.suppress(KeeperGone):
                    self.keeper.withdraw(alloc.id)
            self._free_buffer(alloc)
            alloc.device, alloc.state = None, "pending"
            raise

    def _reallocate(self, alloc: Allocation, cred: Credentials, dev, size: int,
                    capacity: int) -> None:
        """A new buffer for a new capacity; the keeper order is in resize()'s docstring."""
        if self._resize_in_place(alloc, cred, dev, size, capacity):
            return
        self.backend.check_free(dev, capacity, requested=size)
        new = self.backend.allocate(capacity, dev.uuid, label=alloc.path)
        old, old_size = alloc.buffer, alloc.size
        kept = alloc.durable and not alloc.unlinked
        try:
            kept_bytes = min(old_size, size)
            self.backend.copy(old, new, kept_bytes)
            if size > kept_bytes:
                self.backend.zero(new, kept_bytes, size)
            if kept:
                self._deposit_buffer(-alloc.id, new, capacity, dev.uuid)
            alloc.buffer = new
            self._commit_size(alloc, cred, size, capacity, old_size)
        except BaseException:
            alloc.buffer = old
            if kept:
                with contextlib.suppress(KeeperGone):
                    self.keeper.withdraw(-alloc.id)
            self.backend.free(new)
            raise
        if kept:
            try:
                self._deposit(alloc)
                self.keeper.withdraw(-alloc.id)
            except (KeeperGone, InternalError) as exc:   # redeposit_all() repairs this
                log.warning("keeper update after resizing '%s' failed: %s", alloc.path, exc)
        self.backend.free(old)

    def _resize_in_place(self, alloc: Allocation, cred: Credentials, dev, size: int,
                         capacity: int) -> bool:
        """Where the backend can (host memfds), change the capacity without a copy. The
        keeper holds the same memory, so only the order against the registry matters: grow
        before the commit, shrink after it; a crash between leaves the memory larger than
        the committed capacity, which adoption trims (HostBackend.adopt)."""
        if not self.backend.resizes_in_place:
            return False
        old_capacity, old_size = alloc.capacity, alloc.size
        if capacity > old_capacity:
            self.backend.check_free(dev, capacity - old_capacity, requested=size)
            self.backend.resize_in_place(alloc.buffer, capacity)
            if size > old_size:            # past old_capacity the memory is new, so zero
                self.backend.zero(alloc.buffer, old_size, min(size, old_capacity))
            try:
                self._commit_size(alloc, cred, size, capacity, old_size)
            except BaseException:
                self.backend.resize_in_place(alloc.buffer, old_capacity)
                raise
        else:
            self._commit_size(alloc, cred, size, capacity, old_size)
            self.backend.resize_in_place(alloc.buffer, capacity)
        return True

    def _deposit_buffer(self, key: int, buf, capacity: int, device: str) -> None:
        fds = self.backend.keeper_fds(buf)
        try:
            self.keeper.deposit(key, fds, {"capacity": capacity, "device": device,
                                           "registry": self.registry.instance})
        except KeeperStalled as exc:
            raise Busy(f"cannot keep the resized memory now: {exc}") from None
        except KeeperGone as exc:
            raise InternalError(f"cannot keep the resized memory: {exc}") from None
        finally:
            for fd in fds:
                os.close(fd)

    def _commit_size(self, alloc: Allocation, cred: Credentials, size: int, capacity: int,
                     old_size: int) -> None:
        """Record size and capacity (memory and registry together, or neither)."""
        before = (alloc.size, alloc.capacity, alloc.modified_ns, alloc.changed_ns)
        now = time.time_ns()
        try:
            with self.journal.change(durable=alloc.durable, batch=not alloc.durable):
                alloc.size, alloc.capacity = size, capacity
                alloc.modified_ns = alloc.changed_ns = now
                self.registry.update_node(alloc.id, size=size, capacity=capacity,
                                          device=alloc.device, state=alloc.state,
                                          modified_ns=now, changed_ns=now)
                self.journal.event("resize", alloc, cred, size=size, capacity=capacity,
                            old_size=old_size)
        except BaseException:
            alloc.size, alloc.capacity, alloc.modified_ns, alloc.changed_ns = before
            raise
        self._dirty.discard(alloc.id)
        self._attrs_changed(alloc)

    def write_at(self, alloc: Allocation, offset: int, data, cred: Credentials | None = None,
                 *, session: Session | None = None) -> int:
        """Write `data` at `offset`. `cred` None means the caller (a handle opened for
        writing) has already been authorised.

        A write past the size grows the allocation: within the capacity only the size
        changes (and a gap between the old size and `offset` is zeroed); past it the memory
        is reallocated with room to spare (GROWTH_FACTOR), or NoMemory (ENOSPC) when the
        device is full. Size and modified time then change in memory only and the id is
        marked dirty: a registry commit per write would put a transaction on the data path.
        flush_times() commits them (at release/fsync); a crash before that loses the size
        change and the time, as a crash before fsync(2) may in any filesystem. A
        reallocation is committed at once: the keeper then holds the new memory."""
        if cred is not None:
            require(alloc, cred, W)
        if not isinstance(offset, int) or offset < 0:
            raise UsageError(f"invalid offset {offset!r}")
        if not len(data):
            return 0            # as write(2): a write of nothing never extends the file
        end = offset + len(data)
        if end > alloc.size:
            self._grow_for_write(alloc, offset, end, session)
        self._require_memory(alloc)
        self._writes_begin(alloc)
        self.backend.write(alloc.buffer, offset, data)
        alloc.modified_ns = alloc.changed_ns = time.time_ns()
        alloc.dirty_from = min(alloc.dirty_from, offset)
        alloc.dirty_to = max(alloc.dirty_to, end)
        self._dirty.add(alloc.id)
        return len(data)

    def _grow_for_write(self, alloc: Allocation, offset: int, end: int,
                        session: Session | None) -> None:
        if alloc.state == "ready" and end <= alloc.capacity:
            if offset > alloc.size:
                self.backend.zero(alloc.buffer, alloc.size, offset)
            alloc.size = end
            self._attrs_changed(alloc)
            self.journal.node_changed(alloc)
            return
        spare = None
        if alloc.state == "ready":
            spare = alloc.capacity + min(alloc.capacity * (GROWTH_FACTOR - 1), GROWTH_CAP)
        try:
            self._resize(alloc, DAEMON, end, session, capacity=spare)
        except NoMemory:
            if spare is None:
                raise
            self._resize(alloc, DAEMON, end, session)      # no room to spare: exact fit

    def read_at(self, alloc: Allocation, offset: int, length: int) -> bytes:
        """Up to `length` bytes at `offset`, clipped to the size (b"" at or past the end).
        Permission is the caller's (checked at open). No access time is kept."""
        return bytes(self.view_at(alloc, offset, length))

    def view_at(self, alloc: Allocation, offset: int, length: int) -> memoryview:
        """As read_at, as a view valid until the next call into the manager (Backend.view):
        the mount's read path, which hands it straight to the kernel."""
        if not isinstance(offset, int) or offset < 0 or not isinstance(length, int) or \
                length < 0:
            raise UsageError(f"invalid read range: offset {offset!r}, length {length!r}")
        end = min(offset + length, alloc.size or 0)
        if end <= offset:
            return memoryview(b"")
        self._require_memory(alloc)
        if alloc.damaged:
            self._require_undamaged(alloc, offset, end)
        return self.backend.view(alloc.buffer, offset, end - offset)

    @staticmethod
    def _require_undamaged(alloc: Allocation, start: int, end: int) -> None:
        hit = sorted(b for b in block_range(start, end) if b in alloc.damaged)
        if hit:
            raise Uncorrectable(
                f"'{alloc.path}': bytes {hit[0] * BLOCK}-{(hit[-1] + 1) * BLOCK - 1} are "
                "damaged beyond repair, or found damaged and not repaired yet; `gpumemctl "
                "recover` retries the repair",
                details={"blocks": hit})

    def flush_times(self, alloc: Allocation) -> None:
        """Commit the size and modified time that write_at() changed in memory."""
        if alloc.id not in self._dirty:
            return
        self._dirty.discard(alloc.id)
        if not alloc.unlinked:
            with self.journal.change(durable=alloc.durable, batch=not alloc.durable):
                self.registry.update_node(alloc.id, size=alloc.size,
                                          modified_ns=alloc.modified_ns,
                                          changed_ns=alloc.changed_ns)

    def sync(self, alloc: Allocation) -> None:
        """Make what was written durable and protected: at fsync(2) and at the close of a
        handle that wrote. Commits size and times, then brings the parity of the written
        range up to date (refresh_parity; ECC fills it in)."""
        self.flush_times(alloc)
        if alloc.dirty_to > alloc.dirty_from:
            self.refresh_parity(alloc, alloc.dirty_from, alloc.dirty_to)
            alloc.dirty_from, alloc.dirty_to = DIRTY_NONE

    def refresh_parity(self, alloc: Allocation, start: int, end: int) -> None:
        """Recompute the parity of the blocks touching [start, end) (not while an attached
        writer holds it unsealed: seal does it all). A damaged block that the write
        replaced whole is healed."""
        if alloc.parity is None or alloc.unsealed:
            return
        self.parity.encode(alloc, start, end)
        self._writes_synced(alloc)
        healed = {b for b in block_range(start, end)
                  if b * BLOCK >= start and (b + 1) * BLOCK <= end} & alloc.damaged
        if healed:
            self._set_damage(alloc, alloc.damaged - healed, None, reason="overwritten")

    def rename(self, src_parent_id: int, src_name: str, dst_parent_id: int, dst_name: str,
               cred: Credentials, *, replace: bool = True) -> Node:
        """POSIX rename(2). The id (and so the keeper key) stays; parent and name change in
        one registry transaction. A replaced allocation goes as with remove(force=True): its
        memory is freed now, or by its last holder."""
        check_component(src_name)
        check_component(dst_name)
        src_dir, dst_dir = self._directory(src_parent_id), self._directory(dst_parent_id)
        self._check_not_reserved(dst_dir, dst_name)
        node = self.lookup_child(src_parent_id, src_name, cred)
        self._require_removable(src_dir, node, cred, "rename entries in")
        require(dst_dir, cred, W | X, "rename entries in")
        target = dst_dir.children.get(dst_name)
        if target is node:
            return node
        if isinstance(node, Directory):
            self._check_dir_move(node, src_dir, dst_dir, cred)
        if target is not None:
            self._check_replace(node, target, dst_dir, cred, replace)
        old_path = node.path
        with self.journal.change(durable=self._has_durable(node) or self._has_durable(target)):
            if target is not None:
                self._forget_node(target)
                self.journal.event("remove", target, cred, replaced_by=old_path)
            now = time.time_ns()
            self.registry.update_node(node.id, parent=dst_dir.id, name=dst_name,
                                      changed_ns=now)
            self.journal.keep(node, "parent", "name", "changed_ns")
            for directory in {src_dir, dst_dir}:
                self.journal.keep(directory, "modified_ns", "changed_ns")
            src_dir.remove_child(src_name)

            def move_back() -> None:
                if dst_dir.children.get(dst_name) is node:
                    dst_dir.remove_child(dst_name)
                node.name = src_name
                src_dir.add_child(node)
            self.journal.on_rollback(move_back)
            self._entry_changed(src_dir, src_name)
            if target is None:
                self._entry_changed(dst_dir, dst_name)   # a cached negative entry, if any
            node.parent, node.name, node.changed_ns = dst_dir, dst_name, now
            for directory in {src_dir, dst_dir}:
                directory.modified_ns = directory.changed_ns = now
                self.registry.update_node(directory.id, modified_ns=now, changed_ns=now)
                self.journal.node_changed(directory)
            dst_dir.add_child(node)
            self.journal.event("rename", node, cred, **{"from": old_path, "to": node.path})
        if isinstance(target, Allocation):
            self._release_memory(target)
        return node

    def _check_dir_move(self, node: Directory, src_dir: Directory, dst_dir: Directory,
                        cred: Credentials) -> None:
        """No move into its own subtree; a move to another parent rewrites its '..', which
        needs write permission on the directory itself (as Linux requires)."""
        walk: Node | None = dst_dir
        while walk is not None:
            if walk is node:
                raise UsageError(f"cannot move '{node.path}' into itself "
                                 f"('{dst_dir.path}')")
            walk = walk.parent
        if src_dir is not dst_dir:
            require(node, cred, W, "move")

    def _check_replace(self, node: Node, target: Node, dst_dir: Directory, cred: Credentials,
                       replace: bool) -> None:
        if not replace:
            raise Exists(f"'{target.path}' already exists")
        if not may_remove_from(dst_dir, target, cred):
            raise self._sticky_denied(dst_dir, target)
        if isinstance(node, Directory) and not isinstance(target, Directory):
            raise UsageError(f"cannot replace allocation '{target.path}' with a directory",
                             details={"errno": "ENOTDIR"})
        if not isinstance(node, Directory) and isinstance(target, Directory):
            raise UsageError(f"cannot replace directory '{target.path}' with an allocation",
                             details={"errno": "EISDIR"})
        if isinstance(target, Directory) and target.children:
            raise Exists(f"directory '{target.path}' is not empty",
                         details={"errno": "ENOTEMPTY"})

    @staticmethod
    def _has_durable(node: Node | None) -> bool:
        """Whether a change to this node's row must be fsynced: it holds a durable
        allocation (a directory, anywhere below it)."""
        if node is None:
            return False
        return any(isinstance(n, Allocation) and n.durable for n in walk(node))

    def _require_removable(self, parent: Directory, node: Node, cred: Credentials,
                           what: str = "remove entries from") -> None:
        require(parent, cred, W | X, what)
        if not may_remove_from(parent, node, cred):
            raise self._sticky_denied(parent, node)

    @staticmethod
    def _sticky_denied(parent: Directory, node: Node) -> PermissionDenied:
        return PermissionDenied(
            f"permission denied: '{parent.path or '/'}' is sticky; only the owner of "
            f"'{node.path}' (uid {node.uid}) may remove or replace it")

    def unlink_child(self, parent_id: int, name: str, cred: Credentials) -> None:
        """unlink(2): the name goes now; the memory now or with its last holder (pyfuse3
        frees on forget, not unlink). Never a directory (EISDIR)."""
        node = self.lookup_child(parent_id, name, cred)
        if isinstance(node, Directory):
            raise UsageError(f"'{node.path}' is a directory", details={"errno": "EISDIR"})
        self._require_removable(node.parent, node, cred)
        with self.journal.change(durable=node.durable, batch=not node.durable):
            self._forget_node(node)
            self.journal.event("remove", node, cred, force=True)
        self._release_memory(node)

    def rmdir_child(self, parent_id: int, name: str, cred: Credentials) -> None:
        """rmdir(2): an empty directory only. A non-empty one is Exists (exit 5, "exists")
        with errno ENOTEMPTY: the CLI's own `rm DIR` without -r is a usage error instead,
        but here the request was well formed and the directory's contents are what stand
        in the way, which is what EEXIST/ENOTEMPTY say."""
        node = self.lookup_child(parent_id, name, cred)
        if not isinstance(node, Directory):
            raise UsageError(f"'{node.path}' is not a directory", details={"errno": "ENOTDIR"})
        if node.children:
            raise Exists(f"directory '{node.path}' is not empty",
                         details={"errno": "ENOTEMPTY"})
        self._require_removable(node.parent, node, cred)
        with self.journal.change(durable=False):
            self._forget_node(node)
            self.journal.event("remove", node, cred)

    def setattr(self, node_id: int, cred: Credentials, *, mode: int | None = None,
                uid: int | None = None, gid: int | None = None,
                mtime_ns: int | str | None = None, atime_ns: int | str | None = None,
                authorised: bool = False) -> Node:
        """chmod / chown / utimens. chmod: owner or root. chown: only root changes the
        owner; the owner may change the group to one it belongs to; a change of ownership
        clears an allocation's setuid/setgid bits. Times: an explicit time needs owner or
        root, NOW (the string 'now') needs write permission, as utimensat(2) says; atime_ns
        sets the access time (note_access moves it on reads).
        `authorised`: the kernel has applied these rules already (the mount runs with
        default_permissions, and only it knows whether a time was UTIME_NOW)."""
        node, actor = self.node(node_id), cred
        if authorised:
            cred = dataclasses.replace(cred, uid=0)    # passes every check below
        changes: dict = {}
        if mode is not None:
            self._require_owner_eperm(node, cred, "change the mode of")
            changes["mode"] = check_mode(mode)
        if uid is not None and uid != node.uid:
            if not cred.is_root:
                raise PermissionDenied(f"permission denied: only root may change the owner "
                                       f"of '{node.path}'", details={"errno": "EPERM"})
            changes["uid"] = uid
            if isinstance(node, Allocation) and node.buffer is not None:
                self.quotas.check(uid, node.capacity)      # the new owner pays for it
        if gid is not None and gid != node.gid:
            if not (cred.is_root or (cred.uid == node.uid and cred.in_group(gid))):
                raise PermissionDenied(f"permission denied: uid {cred.uid} may not give "
                                       f"'{node.path}' to group {gid}",
                                       details={"errno": "EPERM"})
            changes["gid"] = gid
        if ("uid" in changes or "gid" in changes) and isinstance(node, Allocation):
            changes["mode"] = changes.get("mode", node.mode) & ~0o6000
        for value in (mtime_ns, atime_ns):
            if value == NOW:
                if not (cred.uid == node.uid or self._allowed(node, cred, W)):
                    require(node, cred, W)
            elif value is not None:
                self._require_owner_eperm(node, cred, "set the times of")
        now = time.time_ns()
        if mtime_ns is not None:
            changes["modified_ns"] = now if mtime_ns == NOW else int(mtime_ns)
        if atime_ns is not None:
            changes["accessed_ns"] = now if atime_ns == NOW else int(atime_ns)
        changes["changed_ns"] = now
        with self.journal.change(durable=self._has_durable(node),
                          batch=isinstance(node, Allocation) and not node.durable):
            self.registry.update_node(node.id, **changes)
            self.journal.keep(node, *changes)
            for key, value in changes.items():
                setattr(node, key, value)
            self.journal.event("setattr", node, actor, **{k: (f"{v:04o}" if k == "mode" else v)
                                                   for k, v in changes.items()})
        self._attrs_changed(node)
        return node

    @staticmethod
    def _require_owner_eperm(node: Node, cred: Credentials, what: str) -> None:
        if not (cred.is_root or cred.uid == node.uid):
            raise PermissionDenied(f"permission denied: only the owner (uid {node.uid}) or "
                                   f"root may {what} '{node.path or '/'}'",
                                   details={"errno": "EPERM"})

    # =====================================================================================
    # holders: handles and leases
    # =====================================================================================
    def open(self, path: str, cred: Credentials, session: Session, mode: str):
        """Open for I/O by fd passing. Returns (holder, fd, info). One writer or many
        readers: a conflicting request is busy."""
        alloc, holder, fd = self._lock_and_export(path, cred, session, mode,
                                                  {"r": "read", "rw": "write"}, "open")
        return holder, fd, describe(alloc)

    def _lock_and_export(self, path: str, cred: Credentials, session: Session, mode: str,
                         kinds: dict, what: str):
        """The shared part of open and attach: permission, memory present, one writer or
        many readers; then a new fd for the memory and a holder of kinds[mode]."""
        if mode not in ("r", "rw"):
            raise UsageError(f"invalid {what} mode {mode!r}: expected 'r' or 'rw'")
        alloc = self.lookup_allocation(path, cred)
        writable = mode == "rw"
        require(alloc, cred, R | W if writable else R)
        self._require_memory(alloc)
        if alloc.damaged:     # a mapping cannot fail a range: refuse the whole allocation
            self._require_undamaged(alloc, 0, alloc.size or 0)
        conflicting = alloc.holders_of(*(IO_KINDS if writable else WRITER_KINDS))
        if conflicting:
            raise Busy(f"'{alloc.path}' is locked: " + ", ".join(
                f"{h.kind} by pid {h.pid}" for h in conflicting))
        if writable and kinds[mode] == "write":
            self._writes_begin(alloc)       # the client writes through its fd from now on
        fd = self.backend.export(alloc.buffer, writable)
        try:
            holder = self._add_holder(alloc, session, kinds[mode])
        except BaseException:
            os.close(fd)
            raise
        return alloc, holder, fd

    # ---- attach: clients that map the memory into their own address space ----------------
    def attach(self, path: str, cred: Credentials, session: Session, mode: str):
        """Like open, for a client that maps the memory and keeps it mapped (attach-r /
        attach-w holders). Read-write makes the allocation `unsealed` until the writer
        detaches or seals: its parity (ECC) cannot follow writes it does not see."""
        alloc, holder, fd = self._lock_and_export(path, cred, session, mode, ATTACH_KINDS,
                                                  "attach")
        if mode == "rw" and not alloc.unsealed:
            alloc.unsealed = True
            with self.journal.change(durable=alloc.durable):
                self.registry.update_node(alloc.id, unsealed=UNSEALED)
            self.journal.node_changed(alloc)
        return holder, fd, describe(alloc, holders=True)

    def detach(self, session: Session, holder_id: int) -> dict:
        """The client unmapped: release its holder; a writer's detach seals."""
        holder = session.holders.get(holder_id)
        if holder is None or holder.kind not in ATTACH_KINDS.values():
            raise NotFound(f"no attachment {holder_id} in this session")
        alloc = holder.alloc
        if holder.kind == "attach-w" and not alloc.unlinked:
            self._seal(alloc, session.cred, "detach")
        self._remove_holder(holder)
        return describe(alloc)

    def seal(self, path: str, cred: Credentials, session: Session) -> dict:
        """Declare the data written by an attached writer complete. The writer itself may
        seal while attached; anyone with write permission may seal an allocation whose
        writer is gone (it crashed: the allocation stays unsealed until then)."""
        alloc = self.lookup_allocation(path, cred)
        require(alloc, cred, R | W)
        others = [h for h in alloc.holders_of(*WRITER_KINDS) if h.session is not session]
        if others:
            raise Busy(f"'{alloc.path}' is being written ({others[0].kind} by pid "
                       f"{others[0].pid}); only that writer may seal it now")
        self._seal(alloc, cred, "seal")
        return describe(alloc, holders=True)

    def _seal(self, alloc: Allocation, cred: Credentials, reason: str) -> None:
        """Record that an attached writer's data is complete. (Once ECC exists, this is where
        parity is recomputed.)"""
        was = alloc.unsealed
        alloc.unsealed = False
        if was:
            self.parity.encode(alloc, 0, alloc.size or 0)   # the writer's data is final
            with self.journal.change(durable=alloc.durable):
                alloc.modified_ns = alloc.changed_ns = time.time_ns()
                self.registry.update_node(alloc.id, modified_ns=alloc.modified_ns,
                                          changed_ns=alloc.changed_ns, unsealed=SEALED)
                self.journal.event("seal", alloc, cred, reason=reason)

    def export_dmabuf(self, path: str, cred: Credentials) -> tuple[int, dict]:
        """A dma-buf fd of the whole capacity, for RDMA registration. A NIC may read and
        write it, so it needs read and write permission. It is not a holder: it bypasses
        the one-writer lock, like any RDMA registration (docs/cuda.md)."""
        alloc = self.lookup_allocation(path, cred)
        require(alloc, cred, R | W)
        self._require_memory(alloc)
        return self.backend.export_dmabuf(alloc.buffer), describe(alloc)

    @staticmethod
    def _require_memory(alloc: Allocation) -> None:
        if alloc.state == "lost":
            raise InvalidState(f"'{alloc.path}' is lost: its memory is gone (a reboot or GPU "
                               "reset); `gpumemctl recover` tells more")
        if alloc.buffer is None:
            raise InvalidState(f"'{alloc.path}' has no memory yet (state {alloc.state})")

    def close_handle(self, session: Session, holder_id: int, *, written: dict | None = None):
        holder = session.holders.get(holder_id)
        if holder is None or holder.kind not in ("read", "write"):
            raise NotFound(f"no open handle {holder_id} in this session")
        alloc = holder.alloc
        if holder.kind == "write" and not alloc.unlinked:
            # The client wrote through its own fd, anywhere it liked: re-encode it all.
            self.parity.encode(alloc, 0, alloc.size or 0)
            self._writes_synced(alloc)
        if written and holder.kind == "write" and not alloc.unlinked:
            with self.journal.change(durable=False):
                alloc.modified_ns = alloc.changed_ns = time.time_ns()
                self.registry.update_node(alloc.id, modified_ns=alloc.modified_ns,
                                          changed_ns=alloc.changed_ns)
                self.journal.event("write", alloc, session.cred, **written)
        self._remove_holder(holder)

    # ---- files open on the mount ---------------------------------------------------------
    def open_mount(self, alloc: Allocation, cred: Credentials, session: Session,
                   writable: bool) -> Holder:
        """open(2) on the mount. The kernel has checked the permission (default_permissions);
        a lost allocation cannot be opened (EIO), a pending one can (it gets memory when
        written or truncated)."""
        if alloc.state == "lost":
            self._require_memory(alloc)
        return self._add_holder(alloc, session, MOUNT_KINDS[writable], cred)

    def truncate_on_open(self, alloc: Allocation, cred: Credentials,
                         session: Session) -> None:
        """open(2) with O_TRUNC on the mount: truncate(2) to 0, memory trimmed to one granule
        and parity with it (resize; Busy while a socket client holds it). The kernel has
        checked write permission. POSIX moves mtime and ctime even when it was empty."""
        before = alloc.modified_ns
        self.resize(alloc, cred, 0, session=session, authorised=True)
        if alloc.modified_ns == before:            # it was empty: nothing changed
            self.setattr(alloc.id, cred, mtime_ns=NOW, authorised=True)

    def note_access(self, node: Node) -> None:
        """A read or a listing on the mount: move the access time by Linux's relatime rule
        (only when it is not after the modification or change time, or is a day old), so
        the registry is written once per change or per day, not at every read."""
        now = time.time_ns()
        if node.accessed_ns > max(node.modified_ns, node.changed_ns) and \
                now - node.accessed_ns < RELATIME_NS:
            return
        node.accessed_ns = now
        if self.nodes.get(node.id) is node:        # an unlinked file has no row left
            # Never fsynced: an access time lost to a power cut harms nobody.
            with self.journal.change(durable=False,
                              batch=isinstance(node, Allocation) and not node.durable):
                self.registry.update_node(node.id, accessed_ns=now)

    def release_mount(self, holder: Holder) -> None:
        """close(2) of the last descriptor of a mount handle. A handle that wrote syncs; the
        last writer gives back capacity left spare by write growth (one device copy)."""
        alloc = holder.alloc
        try:
            if holder.kind == "mount-w" and not alloc.unlinked:
                self.sync(alloc)
                if len(alloc.holders_of("mount-w")) == 1:
                    self._trim(alloc)
        finally:
            self._remove_holder(holder)

    def _trim(self, alloc: Allocation) -> None:
        if alloc.state != "ready" or alloc.holders_of(*IO_KINDS):
            return      # a socket client holds an fd to this memory: keep it
        dev = self.backend.device(alloc.device)
        fit = max(dev.granularity, round_up(alloc.size, dev.granularity))
        if alloc.capacity > fit:
            self._reallocate(alloc, DAEMON, dev, alloc.size, fit)
            self._protect_resized(alloc, alloc.size, fresh=False)

    def _add_holder(self, alloc: Allocation, session: Session, kind: str,
                    cred: Credentials | None = None) -> Holder:
        """A new holder; its registry row (the post-mortem record of who held what) is
        skipped for files open on the mount: a transaction per open(2) would halve the
        mount's create rate, and those handles all belong to the daemon's own session."""
        cred = cred or session.cred
        holder = Holder(id=next(self._holder_ids), kind=kind, session=session, alloc=alloc,
                        pid=cred.pid, uid=cred.uid, since_ns=time.time_ns())
        if kind not in MOUNT_KINDS:
            with self.registry.transaction(durable=False, batch=True):
                self.registry.add_holder(holder.id, alloc.id, session.id, kind, holder.pid,
                                         holder.uid, holder.since_ns)
        alloc.holders[holder.id] = holder
        session.holders[holder.id] = holder
        self.journal.node_changed(alloc)
        return holder

    def _drop_holder_record(self, holder: Holder) -> None:
        holder.alloc.holders.pop(holder.id, None)
        holder.session.holders.pop(holder.id, None)
        if holder.kind not in MOUNT_KINDS:
            with self.registry.transaction(durable=False, batch=True):
                self.registry.remove_holder(holder.id)
        self.journal.node_changed(holder.alloc)

    def _remove_holder(self, holder: Holder) -> None:
        """Drop a holder; free the memory if that was the last thing keeping it."""
        self._drop_holder_record(holder)
        alloc = holder.alloc
        if alloc.holders:
            return
        if alloc.unlinked:
            self._free_buffer(alloc)
        elif alloc.leased and not alloc.durable:
            with self.journal.change(durable=False):
                self._forget_node(alloc)
                self.journal.event("release", alloc, None,
                            reason="last holder of a leased allocation is gone")
            alloc.unlinked = True
            self._free_buffer(alloc)

    def open_session(self, cred: Credentials, client: str = "") -> Session:
        session = Session(cred=cred, client=client)
        self.sessions[session.id] = session
        return session

    def close_session(self, session: Session) -> None:
        """The connection ended (closed, or its process died): release what it held. An
        attached writer that did not detach leaves its allocation unsealed."""
        session.closed = True
        self.sessions.pop(session.id, None)
        for holder in list(session.holders.values()):
            if holder.kind == "write" and not holder.alloc.unlinked:
                self.parity.encode(holder.alloc, 0, holder.alloc.size or 0)
                self._writes_synced(holder.alloc)
            if holder.kind == "attach-w" and holder.alloc.unsealed and \
                    not holder.alloc.unlinked:
                with self.journal.change(durable=False):
                    self.journal.event("unsealed", holder.alloc, session.cred,
                                reason="the attached writer's session ended without detach")
            self._remove_holder(holder)

    # =====================================================================================
    # ECC: verify, repair, recover, fault injection (docs/ecc.md)
    # =====================================================================================
    def ecc_targets(self, paths: list[str], cred: Credentials, everything: bool
                    ) -> list[Allocation]:
        """The allocations a verify covers: the named ones (a directory: everything under
        it), or with `everything`, all that the caller may read."""
        if everything:
            nodes = [self.root]
        else:
            if not paths:
                raise UsageError("name one or more allocations, or use --all")
            nodes = [self.lookup(p, cred, allow_root=True) for p in paths]
        out: list[Allocation] = []
        for node in nodes:
            for a in self._walk_allocations(node):
                if a not in out and self._allowed(a, cred, R):
                    out.append(a)
        return out

    @staticmethod
    def _walk_allocations(node: Node):
        return (n for n in walk(node) if isinstance(n, Allocation))

    def verify_steps(self, alloc: Allocation, repair: bool, first_block: int = 0):
        """Verify (and repair) an allocation piece by piece: a generator that yields after
        each piece (the caller lets the event loop run), and returns the totals. Between
        pieces the allocation may have been written, resized or removed: each piece
        re-reads its state. Blocks written since their last sync (their parity is stale
        by design), unsealed allocations and those a socket client has open for writing are
        skipped, not judged."""
        total = {"path": alloc.path, "id": alloc.id, "ecc": alloc.ecc, "blocks": 0,
                 "clean": 0, "corrected": 0, "uncorrectable": 0, "skipped": 0,
                 "symbols": 0, "bytes": 0, "damaged": [], "uncorrectable_blocks": [],
                 "checked": []}
        if alloc.ecc != "rs" or alloc.state not in ("ready", "degraded"):
            total["skipped_reason"] = "no ECC" if alloc.ecc != "rs" else alloc.state
            return total
        block = first_block
        while True:
            if alloc.unlinked or alloc.parity is None:
                break
            stop = protected_blocks(alloc)
            if block >= stop:
                self._note_verified(alloc)
                break
            count = min(self.parity.chunk_blocks, stop - block)
            if alloc.unsealed or alloc.holders_of("write"):
                # A socket client writing through its own fd: its bytes are newer than the
                # parity until its close, and a "repair" would revert them (a write of up to
                # 4 KiB per block is within what the code corrects). Skipped, not judged.
                total["skipped"] += stop - block
                break
            self._verify_piece(alloc, block, count, repair, total)
            block += count
            yield block
        if not alloc.unlinked:
            # Record what this pass found, repaired or not (docs/ecc.md, "Damage"): the
            # recorded blocks it checked are replaced by what it left damaged, that is
            # uncorrectable or, without --repair, found and not yet repaired.
            checked = total.pop("checked")
            healed = {b for b in alloc.damaged if any(a <= b < z for a, z in checked)}
            bad = set(total["uncorrectable_blocks"]) | set(total["damaged"])
            self._set_damage(alloc, (alloc.damaged - healed) | bad, None,
                             reason="verify" if repair else "verify without --repair",
                             judged=repair)
        total.pop("checked", None)
        total["damaged_ranges"] = self.damaged_ranges(alloc)
        return total

    def _note_verified(self, alloc: Allocation) -> None:
        """A pass reached the allocation's last protected block: record when (the TUI's
        and `info`'s "verified"). Blocks skipped as unsynced still count: their parity is
        rebuilt at the next sync, not judged."""
        now = time.time_ns()
        with self.journal.change(durable=alloc.durable, batch=not alloc.durable):
            self.registry.update_node(alloc.id, verified_ns=now)
        alloc.verified_ns = now

    def _verify_piece(self, alloc: Allocation, first: int, count: int, repair: bool,
                      total: dict) -> None:
        dirty = block_range(alloc.dirty_from, alloc.dirty_to)
        lo, hi = first, first + count
        pieces = [(lo, hi)]
        if dirty and dirty.start < hi and dirty.stop > lo:       # skip the unsynced blocks
            pieces = [(lo, max(lo, dirty.start)), (min(hi, dirty.stop), hi)]
            total["skipped"] += min(hi, dirty.stop) - max(lo, dirty.start)
        for a, b in pieces:
            if b <= a:
                continue
            found = self.parity.check(alloc, a, b - a, repair)
            total["blocks"] += b - a
            total["bytes"] += min((b - a) * BLOCK, max(0, (alloc.size or 0) - a * BLOCK))
            total["clean"] += found["clean"]
            total["corrected"] += found["corrected"]
            total["symbols"] += found["symbols"]
            total["uncorrectable"] += len(found["uncorrectable"])
            total["uncorrectable_blocks"] += found["uncorrectable"]
            total["damaged"] += found["damaged"]          # found without --repair
            total["checked"].append((a, b))

    def _set_damage(self, alloc: Allocation, damaged: set[int], cred: Credentials | None,
                    reason: str, judged: bool = True) -> None:
        """Record the damaged blocks: beyond repair, or (not `judged`) found by a verify
        without --repair and not yet repaired. Either way they read as EIO and the
        allocation is degraded while there are any."""
        if damaged == alloc.damaged and (alloc.state == "degraded") == bool(damaged):
            return
        before = sorted(alloc.damaged)
        state = "degraded" if damaged else "ready"
        with self.journal.change(durable=alloc.durable):
            self.registry.set_damage(alloc.id, damaged, time.time_ns())
            self.registry.update_node(alloc.id, state=state)
            alloc.damaged, alloc.state = set(damaged), state
            if damaged:
                self.journal.event("damage", alloc, cred, reason=reason, blocks=sorted(damaged),
                            ranges=self.damaged_ranges(alloc))
            else:
                self.journal.event("healed", alloc, cred, reason=reason, blocks=before)
        if damaged and judged:
            log.error("'%s' has %d block(s) damaged beyond repair (%s): %s", alloc.path,
                      len(damaged), reason, self.damaged_ranges(alloc))
        elif damaged:
            log.warning("'%s' has %d damaged block(s) not repaired (%s): %s; `gpumemctl "
                        "verify --repair` or `recover` repairs what ECC can", alloc.path,
                        len(damaged), reason, self.damaged_ranges(alloc))

    damaged_ranges = staticmethod(damaged_ranges)

    def corrupt(self, path: str, cred: Credentials, offset: int, length: int,
                pattern: bytes, parity: bool) -> dict:
        """Fault injection (gpumemd --enable-fault-injection only; root or the daemon's
        uid): overwrite bytes of the data, or of the parity region, without updating the
        parity. For tests and drills."""
        if not self.fault_injection:
            raise PermissionDenied("fault injection is off: start gpumemd with "
                                   "--enable-fault-injection to use `debug corrupt`")
        if not (cred.is_root or cred.uid == os.geteuid()):
            raise PermissionDenied("permission denied: `debug corrupt` is for root and the "
                                   "daemon's user only")
        alloc = self.lookup_allocation(path, cred)
        self._require_memory(alloc)
        target = alloc.parity if parity else alloc.buffer
        if target is None:
            raise InvalidState(f"'{alloc.path}' has no parity (ecc {alloc.ecc})")
        limit = target.capacity
        if offset < 0 or length < 1 or offset + length > limit or not pattern:
            region = "parity region" if parity else "data"
            raise UsageError(f"invalid range {offset}+{length}: the {region} of "
                             f"'{alloc.path}' has {limit} bytes; the pattern must not be empty")
        data = (pattern * (length // len(pattern) + 1))[:length]
        self.backend.write(target, offset, data)
        with self.journal.change(durable=False):
            self.journal.event("corrupt", alloc, cred, offset=offset, length=length,
                        parity=parity)
        return {"path": alloc.path, "offset": offset, "length": length, "parity": parity}

    def note(self, kind: str, /, **detail) -> None:
        """Log an event that concerns no node (the scrubber's start and end)."""
        self.journal.note(kind, **detail)

    def meta(self, key: str) -> str | None:
        """A value save_meta stored (the scrubber's state), or None."""
        return self.registry.meta(key)

    @property
    def chunk_blocks(self) -> int:
        """The blocks of one piece of ECC work (verify_steps yields after each)."""
        return self.parity.chunk_blocks

    def save_meta(self, key: str, value: str) -> None:
        with self.journal.change(durable=False):
            self.registry.set_meta(key, value)

    # =====================================================================================
    # keeper supervision
    # =====================================================================================
    def reconcile_keeper(self) -> tuple[int, int]:
        """After the keeper stalled and answers again: the requests it never answered may or
        may not have been applied, and withdrawals refused meanwhile were skipped. Make it
        hold exactly the durable allocations: withdraw every other key, then hand it every
        durable allocation again. Returns (withdrawn, redeposited)."""
        durable = {a.id for a in self.allocations() if a.durable and a.buffer is not None}
        extra = [key for key in self.keeper.keys() if key not in durable]
        for key in extra:
            self.keeper.withdraw(key)
        return len(extra), self.redeposit_all(action="resumed")

    def redeposit_all(self, action: str = "restarted") -> int:
        """After a keeper restart (or stall): hand it every durable allocation's fds again."""
        count = 0
        for alloc in self.allocations():
            if alloc.durable and alloc.buffer is not None:
                self._deposit(alloc)
                count += 1
        with self.journal.change(durable=False):
            self.journal.event("keeper", None, None, action=action, redeposited=count)
        return count

    # =====================================================================================
    # status
    # =====================================================================================
    def totals(self) -> dict:
        allocs = self.allocations()
        by_state: dict[str, int] = {}
        for a in allocs:
            by_state[a.state] = by_state.get(a.state, 0) + 1
        return {
            "allocations": len(allocs),
            "directories": sum(1 for n in self.nodes.values() if isinstance(n, Directory)) - 1,
            "durable": sum(1 for a in allocs if a.durable),
            "size": sum(a.size or 0 for a in allocs),
            "capacity": sum(a.capacity or 0 for a in allocs if a.buffer is not None),
            "by_state": by_state,
            "sessions": len(self.sessions),
            "holders": sum(len(a.holders) for a in allocs),
        }

    def bytes_held_per_device(self) -> dict[str, int]:
        """Device UUID -> the bytes our allocations (memory and parity) hold on it."""
        ours: dict[str, int] = {}
        for alloc in self.allocations():
            if alloc.buffer is not None:
                parity = alloc.parity.capacity if alloc.parity is not None else 0
                ours[alloc.device] = ours.get(alloc.device, 0) + alloc.capacity + parity
        return ours

    @staticmethod
    def protected_bytes(alloc: Allocation) -> int:
        """The bytes of `alloc` that ECC protects now: its size when it has rs parity and
        memory, else none (what a verify of it goes through)."""
        if alloc.ecc != "rs" or alloc.state not in ("ready", "degraded"):
            return 0
        return alloc.size or 0

    @property
    def backend_name(self) -> str:
        return self.backend.name

    def devices(self) -> list:
        """The backend's devices (daemon/backends DeviceInfo), as it sees them now."""
        return self.backend.devices()

    def keeper_info(self) -> dict:
        return self.keeper.info()

    def quota_report(self, uid: int | None = None) -> list[dict]:
        """Each per-uid limit with its use (only `uid`'s, when given)."""
        return self.quotas.report(uid)

    def node_or_none(self, node_id: int) -> Node | None:
        """The live node with this id (inode), or None."""
        return self.nodes.get(node_id)

    def all_nodes(self) -> list[Node]:
        return list(self.nodes.values())

    def node_count(self) -> int:
        return len(self.nodes)

    def may_search_to(self, node: Node, cred: Credentials) -> bool:
        """Whether `cred` has search (x) permission on every directory above `node`: where
        it could look the node up (a removed node is judged by the directories it was in)."""
        directory = node.parent
        while directory is not None:
            try:
                require(directory, cred, X)
            except PermissionDenied:
                return False
            directory = directory.parent
        return True

    # =====================================================================================
    # the event log, observers and check
    # =====================================================================================
    def events(self, *, since: int, limit: int, path: str | None = None,
               uid: int | None = None) -> list[dict]:
        """Logged events after `since`, oldest first, at most `limit` (Journal.events)."""
        return self.journal.events(since=since, limit=limit, path=path, uid=uid)

    def last_event_id(self) -> int:
        return self.journal.last_event_id()

    def observing(self, on_event: Callable[[dict], None],
                  on_change: Callable[[Node], None] | None = None):
        """Committed events and nodes to redraw, while inside (Journal.observing)."""
        return self.journal.observing(on_event, on_change)

    def add_watcher(self, watcher) -> None:
        """A watcher of what the kernel may cache (daemon/fs.py): told entry_changed(
        parent_id, name) and attrs_changed(node_id), and settled after each request."""
        self.watchers.append(watcher)

    def remove_watcher(self, watcher) -> None:
        with contextlib.suppress(ValueError):
            self.watchers.remove(watcher)

    async def settle_watchers(self) -> None:
        """Let every watcher pass its pending invalidations on (the mount learns of a
        socket-side change before the socket client hears the answer)."""
        for watcher in list(self.watchers):
            await watcher.settle()

    def deposit(self, alloc: Allocation) -> None:
        """Hand `alloc`'s memory (and parity) to the keeper again (check's repair)."""
        self._deposit(alloc)

    def check(self, repair: bool = False, *,
              integrity_errors: list[str] | None = None) -> dict:
        """`gpumemctl check` (daemon/check.py). `integrity_errors`: SQLite's integrity
        check, made beforehand off the event loop (registry_integrity_errors); None makes
        it here."""
        return Checker(self, self.registry, self.keeper).run(
            repair=repair, integrity_errors=integrity_errors)

    def registry_integrity_errors(self) -> list[str]:
        """SQLite's integrity check of the registry on a read-only connection of its own:
        safe on a worker thread while the loop goes on changing the registry."""
        return self.registry.integrity_errors_readonly()


__all__ = ["AllocationManager", "check_component"]
