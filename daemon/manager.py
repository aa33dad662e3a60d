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
import itertools
import logging
import os
import time
from typing import Callable

from gpumemctl.protocol import (Busy, Exists, InternalError, InvalidState, NotFound,
                                PermissionDenied, UsageError, check_component, format_size,
                                round_up, split_path)

from .backends import Backend
from .describe import describe
from .keeper_link import KeeperGone
from .nodes import Allocation, Directory, Holder, Node
from .permissions import Credentials, R, W, X, may_remove_from, require, require_owner
from .registry import ROOT_ID, Registry
from .sessions import Session

log = logging.getLogger("gpumemd")

DEFAULT_FILE_MODE = 0o600   # allocations are private unless asked otherwise
DEFAULT_DIR_MODE = 0o755
ECC_MODES = ("rs", "none")
# Holders that take part in "one writer or many readers": handles opened for I/O, and clients
# that mapped the memory (attach). Leases do not lock.
IO_KINDS = ("read", "write", "attach-r", "attach-w")
WRITER_KINDS = ("write", "attach-w")
ATTACH_KINDS = {"r": "attach-r", "rw": "attach-w"}
DAEMON = Credentials(pid=os.getpid(), uid=os.geteuid(), gid=os.getegid())


def check_mode(mode: int) -> int:
    if not isinstance(mode, int) or isinstance(mode, bool) or not 0 <= mode <= 0o7777:
        raise UsageError(f"invalid mode {mode!r}: expected octal permission bits 0000-7777")
    return mode


class AllocationManager:
    def __init__(self, registry: Registry, backend: Backend, keeper):
        self.registry = registry
        self.backend = backend
        self.keeper = keeper
        self.nodes: dict[int, Node] = {}
        self.root: Directory | None = None
        self.subscribers: set[Callable[[dict], None]] = set()
        self._holder_ids = itertools.count(1)
        self._pending_events: list[dict] = []
        self._txn_nodes: list[Node] = []     # nodes inserted by the open transaction
        self._last_insert_id = 0
        self.sessions: dict[int, Session] = {}
        self.started_ns = time.time_ns()

    # =====================================================================================
    # start and stop
    # =====================================================================================
    def start(self) -> dict:
        """Load the registry, re-adopt durable memory from the keeper, drop what is stale."""
        self._load_tree()
        self.keeper.ensure_running()
        kept = self.keeper.fetch_all()
        summary = {"adopted": 0, "lost": 0, "orphans_freed": 0, "transients_dropped": 0}
        with self._change(durable=True):
            self.registry.clear_holders()
            for alloc in [n for n in self.nodes.values() if isinstance(n, Allocation)]:
                if not alloc.durable:
                    self._forget_node(alloc)
                    self._event("drop", alloc, None, reason="transient after restart")
                    summary["transients_dropped"] += 1
                elif alloc.capacity is None:
                    continue  # durable but pending: there is no memory to adopt
                elif alloc.id in kept:
                    summary["adopted" if self._adopt(alloc, kept.pop(alloc.id)) else "lost"] += 1
                elif alloc.state != "lost":
                    self._mark_lost(alloc, "the keeper holds no memory for it")
                    summary["lost"] += 1
            for key, fds in kept.items():
                self._free_orphan(key, fds)
                summary["orphans_freed"] += 1
            self._event("start", None, None, backend=self.backend.name, **summary)
        return summary

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
                parent.children[node.name] = node
        if self.root is None or self.root.id != ROOT_ID:
            raise InternalError("registry has no root directory")

    @staticmethod
    def _node_from_row(row) -> Node:
        common = dict(id=row["id"], name=row["name"], parent=None, uid=row["uid"],
                      gid=row["gid"], mode=row["mode"], created_ns=row["created_ns"],
                      modified_ns=row["modified_ns"], changed_ns=row["changed_ns"])
        if row["kind"] == "dir":
            return Directory(**common)
        return Allocation(**common, size=row["size"], capacity=row["capacity"],
                          device=row["device"], durable=bool(row["durable"]),
                          state=row["state"], ecc=row["ecc"], parity_gen=row["parity_gen"],
                          checksum=row["checksum"])

    def _adopt(self, alloc: Allocation, fds: list[int]) -> bool:
        try:
            alloc.buffer = self.backend.adopt(fds, alloc.capacity, alloc.device)
        except Exception as exc:  # noqa: BLE001 - any failure to adopt means the memory is lost
            self._mark_lost(alloc, f"re-adoption failed: {exc}")
            with contextlib.suppress(KeeperGone):
                self.keeper.withdraw(alloc.id)
            return False
        if alloc.state in ("lost", "recovering", "pending"):
            alloc.state = "ready"
            self.registry.update_node(alloc.id, state="ready")
        self._event("adopt", alloc, None, capacity=alloc.capacity)
        return True

    def _mark_lost(self, alloc: Allocation, reason: str) -> None:
        alloc.state = "lost"
        alloc.buffer = None
        self.registry.update_node(alloc.id, state="lost")
        self._event("lost", alloc, None, reason=reason)
        log.warning("allocation %s (id %d) is lost: %s", alloc.path, alloc.id, reason)

    def _free_orphan(self, key: int, fds: list[int]) -> None:
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(KeeperGone):
            self.keeper.withdraw(key)
        self._event("orphan", None, None, key=key,
                    reason="the keeper held memory the registry does not list; freed")

    def shutdown(self) -> None:
        """Clean stop: transient memory goes, durable memory stays with the keeper."""
        with self._change(durable=False):
            for alloc in [n for n in self.nodes.values() if isinstance(n, Allocation)]:
                if not alloc.durable:
                    self._forget_node(alloc)
            self.registry.clear_holders()
            self._event("stop", None, None)
        for alloc in [n for n in self.nodes.values() if isinstance(n, Allocation)]:
            if alloc.buffer is not None:
                self.backend.free(alloc.buffer)
                alloc.buffer = None
        self.keeper.close()

    # =====================================================================================
    # events and transactions
    # =====================================================================================
    @contextlib.contextmanager
    def _change(self, *, durable: bool):
        """A registry transaction; its events reach subscribers only once it committed."""
        outer = not self.registry._in_txn
        if outer:
            self._txn_nodes = []
        try:
            with self.registry.transaction(durable=durable):
                yield
        except BaseException:
            if outer:
                self._pending_events.clear()
                self._undo_inserts()
            raise
        if outer:
            events, self._pending_events = self._pending_events, []
            for event in events:
                self._publish(event)

    def _undo_inserts(self) -> None:
        """The registry rolled back: take the nodes this transaction added out of the tree."""
        for node in reversed(self._txn_nodes):
            if node.parent is not None and node.parent.children.get(node.name) is node:
                del node.parent.children[node.name]
            self.nodes.pop(node.id, None)
        self._txn_nodes = []

    def _event(self, kind: str, node: Node | None, cred: Credentials | None, **detail) -> None:
        now = time.time_ns()
        path = node.path if node is not None else None
        event_id = self.registry.add_event(
            kind, node.id if node else None, path, cred.uid if cred else None,
            cred.pid if cred else None, detail, now)
        self._pending_events.append({
            "id": event_id, "time_ns": now, "kind": kind, "node": node.id if node else None,
            "path": path, "uid": cred.uid if cred else None,
            "pid": cred.pid if cred else None, "detail": detail})

    def _publish(self, event: dict) -> None:
        who = f" uid={event['uid']} pid={event['pid']}" if event["uid"] is not None else ""
        detail = " ".join(f"{k}={v}" for k, v in event["detail"].items())
        log.info("event %s %s%s %s", event["kind"], event["path"] or "-", who, detail)
        for callback in list(self.subscribers):
            callback(event)

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
        for name in sorted(directory.children):
            child = directory.children[name]
            out.append(describe(child))
            if recursive and isinstance(child, Directory) and \
                    self._allowed(child, cred, R | X):
                self._list_into(child, cred, recursive, out)

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
            self._event("mkdir", parent, cred, mode=f"{mode:04o}")
        return parent

    def _insert_node(self, cls, parent: Directory, name: str, cred: Credentials, mode: int,
                     **alloc_fields):
        now = time.time_ns()
        gid = parent.gid if parent.mode & 0o2000 else cred.gid   # setgid directories
        if cls is Directory and parent.mode & 0o2000:
            mode |= 0o2000
        row = dict(parent=parent.id, name=name, kind="dir" if cls is Directory else "alloc",
                   uid=cred.uid, gid=gid, mode=mode, created_ns=now, modified_ns=now,
                   changed_ns=now)
        db_fields = {k: v for k, v in alloc_fields.items()
                     if k not in ("buffer", "leased")}
        node_id = self.registry.insert_node(**row, **db_fields)
        self._last_insert_id = node_id
        node = cls(id=node_id, name=name, parent=parent, uid=cred.uid, gid=gid, mode=mode,
                   created_ns=now, modified_ns=now, changed_ns=now, **alloc_fields)
        self._link(parent, node, now)
        self._txn_nodes.append(node)
        return node

    def _link(self, parent: Directory, node: Node, now: int) -> None:
        self.nodes[node.id] = node
        parent.children[node.name] = node
        parent.modified_ns = parent.changed_ns = now
        self.registry.update_node(parent.id, modified_ns=now, changed_ns=now)

    def _unlink(self, node: Node) -> None:
        now = time.time_ns()
        parent = node.parent
        if parent is not None and parent.children.get(node.name) is node:
            del parent.children[node.name]
            parent.modified_ns = parent.changed_ns = now
            self.registry.update_node(parent.id, modified_ns=now, changed_ns=now)
        self.nodes.pop(node.id, None)

    def _forget_node(self, node: Node) -> None:
        """Remove a node's row and its place in the tree (memory is the caller's concern)."""
        self.registry.delete_node(node.id)
        self._unlink(node)

    def mkdir(self, path: str, cred: Credentials, *, mode: int = DEFAULT_DIR_MODE,
              parents: bool = False, exist_ok: bool = False) -> dict:
        check_mode(mode)
        parts = split_path(path)
        parent, missing = self._parent_for_new(parts, cred, parents)
        existing = parent.children.get(parts[-1]) if not missing else None
        if existing is not None:
            if isinstance(existing, Directory) and (exist_ok or parents):
                return describe(existing)
            raise Exists(f"'{existing.path}' already exists")
        with self._change(durable=False):
            node = self._insert_dirs(parent, missing + [parts[-1]], cred, mode)
        return describe(node)

    def create(self, path: str, cred: Credentials, *, size: int, durable: bool = False,
               mode: int = DEFAULT_FILE_MODE, device: str | None = None, ecc: str = "rs",
               exist_ok: bool = False, session: Session | None = None,
               lease: bool = False) -> dict:
        """Allocate. Missing parent directories are created (mode 0755), like `mkdir -p`."""
        check_mode(mode)
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
        self.backend.check_free(dev, capacity, requested=size)
        buf = self.backend.allocate(capacity, dev.uuid, label="/".join(parts))
        try:
            with self._change(durable=durable):
                directory = self._insert_dirs(parent, missing, cred, DEFAULT_DIR_MODE)
                alloc = self._insert_node(
                    Allocation, directory, parts[-1], cred, mode, size=size,
                    capacity=capacity, device=dev.uuid, durable=durable, state="ready",
                    ecc=ecc, parity_gen=0, buffer=buf, leased=lease)
                if durable:
                    self._deposit(alloc)
                self._event("create", alloc, cred, size=size, capacity=capacity,
                            device=dev.uuid, durable=durable, lease=lease)
        except BaseException:
            if durable:   # deposited but not committed: take it back from the keeper
                with contextlib.suppress(KeeperGone, InternalError):
                    self.keeper.withdraw(self._last_insert_id)
            self.backend.free(buf)
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
        fds = self.backend.keeper_fds(alloc.buffer)
        try:
            self.keeper.deposit(alloc.id, fds, {"capacity": alloc.capacity,
                                                "device": alloc.device})
        except KeeperGone as exc:
            raise InternalError(f"cannot make '{alloc.path}' durable: {exc}") from None
        finally:
            for fd in fds:
                os.close(fd)

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
        with self._change(durable=any_durable):
            for victim in doomed:
                self._forget_node(victim)
                self._event("remove", victim, cred, force=force)
        for victim in doomed:
            if isinstance(victim, Allocation):
                self._release_memory(victim)
        return [v.path for v in doomed]

    def _removal_order(self, node: Node, cred: Credentials) -> list[Node]:
        """Children before parents, each checked for permission before anything changes."""
        order: list[Node] = []

        def visit(n: Node) -> None:
            if isinstance(n, Directory):
                require(n, cred, R | W | X, "remove entries from")
                for child in list(n.children.values()):
                    visit(child)
            parent = n.parent
            require(parent, cred, W | X, "remove entries from")
            if not may_remove_from(parent, n, cred):
                raise PermissionDenied(
                    f"permission denied: '{parent.path or '/'}' is sticky; only the owner "
                    f"of '{n.path}' (uid {n.uid}) may remove it")
            order.append(n)

        visit(node)
        return order

    def _release_memory(self, alloc: Allocation) -> None:
        """After the row is gone: let go of the keeper's copy, then free (or wait for the
        last holder, if forced)."""
        alloc.unlinked = True
        if alloc.durable:
            with contextlib.suppress(KeeperGone):
                self.keeper.withdraw(alloc.id)
        if not alloc.holders_of(*IO_KINDS):
            for holder in list(alloc.holders.values()):
                self._drop_holder_record(holder)
            self._free_buffer(alloc)

    def _free_buffer(self, alloc: Allocation) -> None:
        if alloc.buffer is not None:
            self.backend.free(alloc.buffer)
            alloc.buffer = None

    @staticmethod
    def _busy_message(alloc: Allocation) -> str:
        users = ", ".join(f"{h.kind} by pid {h.pid}" for h in alloc.holders_of(*IO_KINDS))
        return f"'{alloc.path}' is busy ({users}); use --force to remove it anyway"

    def set_durable(self, path: str, cred: Credentials, durable: bool) -> dict:
        alloc = self.lookup_allocation(path, cred)
        require_owner(alloc, cred, "change the durability of")
        if alloc.state == "lost":
            raise InvalidState(f"'{alloc.path}' is lost: its memory is gone; remove it")
        if alloc.durable == durable:
            return describe(alloc, holders=True)
        with self._change(durable=True):
            alloc.durable = durable
            alloc.changed_ns = time.time_ns()
            self.registry.update_node(alloc.id, durable=int(durable),
                                      changed_ns=alloc.changed_ns)
            if durable and alloc.buffer is not None:
                try:
                    self._deposit(alloc)
                except BaseException:
                    alloc.durable = False
                    raise
            self._event("durable" if durable else "transient", alloc, cred)
        if durable:
            alloc.leased = False       # the durable pin replaces any lease
            for holder in alloc.holders_of("lease"):
                self._remove_holder(holder)
        elif alloc.buffer is not None:
            with contextlib.suppress(KeeperGone):
                self.keeper.withdraw(alloc.id)
        return describe(alloc, holders=True)

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
        conflicting = alloc.holders_of(*(IO_KINDS if writable else WRITER_KINDS))
        if conflicting:
            raise Busy(f"'{alloc.path}' is locked: " + ", ".join(
                f"{h.kind} by pid {h.pid}" for h in conflicting))
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
        if mode == "rw":
            alloc.unsealed = True
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
            with self._change(durable=False):
                alloc.modified_ns = alloc.changed_ns = time.time_ns()
                self.registry.update_node(alloc.id, modified_ns=alloc.modified_ns,
                                          changed_ns=alloc.changed_ns)
                self._event("seal", alloc, cred, reason=reason)

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
        if written and holder.kind == "write" and not alloc.unlinked:
            with self._change(durable=False):
                alloc.modified_ns = alloc.changed_ns = time.time_ns()
                self.registry.update_node(alloc.id, modified_ns=alloc.modified_ns,
                                          changed_ns=alloc.changed_ns)
                self._event("write", alloc, session.cred, **written)
        self._remove_holder(holder)

    def _add_holder(self, alloc: Allocation, session: Session, kind: str) -> Holder:
        holder = Holder(id=next(self._holder_ids), kind=kind, session=session, alloc=alloc,
                        pid=session.cred.pid, uid=session.cred.uid, since_ns=time.time_ns())
        with self.registry.transaction(durable=False):
            self.registry.add_holder(holder.id, alloc.id, session.id, kind, holder.pid,
                                     holder.uid, holder.since_ns)
        alloc.holders[holder.id] = holder
        session.holders[holder.id] = holder
        return holder

    def _drop_holder_record(self, holder: Holder) -> None:
        holder.alloc.holders.pop(holder.id, None)
        holder.session.holders.pop(holder.id, None)
        with self.registry.transaction(durable=False):
            self.registry.remove_holder(holder.id)

    def _remove_holder(self, holder: Holder) -> None:
        """Drop a holder; free the memory if that was the last thing keeping it."""
        self._drop_holder_record(holder)
        alloc = holder.alloc
        if alloc.holders:
            return
        if alloc.unlinked:
            self._free_buffer(alloc)
        elif alloc.leased and not alloc.durable:
            with self._change(durable=False):
                self._forget_node(alloc)
                self._event("release", alloc, None,
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
            if holder.kind == "attach-w" and holder.alloc.unsealed and \
                    not holder.alloc.unlinked:
                with self._change(durable=False):
                    self._event("unsealed", holder.alloc, session.cred,
                                reason="the attached writer's session ended without detach")
            self._remove_holder(holder)

    # =====================================================================================
    # keeper supervision
    # =====================================================================================
    def redeposit_all(self) -> int:
        """After a keeper restart: hand it every durable allocation's fds again."""
        count = 0
        for alloc in self.allocations():
            if alloc.durable and alloc.buffer is not None:
                self._deposit(alloc)
                count += 1
        with self._change(durable=False):
            self._event("keeper", None, None, action="restarted", redeposited=count)
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

    def describe_size(self, n: int) -> str:
        return format_size(n)


__all__ = ["AllocationManager", "check_component"]
