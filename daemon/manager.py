"""The AllocationManager: the public verbs, and each verb's order of steps.

The socket server, the mount (daemon/fs.py), check and the scrubber call these verbs and the
queries below, nothing under them. Every verb takes the caller's Credentials, raises
`gpumemctl.protocol` errors, and either happens whole (memory, tree, registry and keeper
agree) or changes nothing: the journal's undo log takes back what a failed transaction did.

The layers under it, each with one job (docs/design.md, "The daemon's core"):
- journal: the unit of work over the registry, events, observers;
- namespace: the tree and the POSIX rules;
- custody: backend and keeper, in crash-safe order, and start-up reconciliation;
- integrity: parity freshness, verify and repair, damage;
- holders: handles, attachments, leases, sessions, and the one-writer lock.
"""
from __future__ import annotations

import collections
import os
import stat
import time

from gpumemctl.protocol import (
    Busy,
    Exists,
    InvalidState,
    NoMemory,
    NotFound,
    PermissionDenied,
    UsageError,
    name_from_bytes,
    round_up,
    split_path,
)
from gpumemctl.protocol.defaults import DIR_MODE, FILE_MODE

from . import usermeta
from .backends import Backend
from .custody import Custody, Deposit, Prepared
from .describe import describe
from .handles import HandleVerbs
from .holders import IO_KINDS, MOUNT_KINDS, Holders
from .integrity import Integrity, ParityJob
from .journal import Journal
from .links import check_target
from .namespace import DAEMON, NOW, RELATIME_NS, Namespace, check_mode
from .nodes import SPECIAL_KINDS, Allocation, Directory, Node, Special, Symlink, entry_path
from .permissions import Credentials, R, W, X, administrative_uid, require, require_owner
from .queries import Queries
from .quotas import Quotas
from .refill import Refill, RefillVerbs, SnapshotRecords
from .registry import Registry
from .sessions import Session

ECC_MODES = ("rs", "none")
# A write past the capacity grows it by this factor (capped at GROWTH_CAP bytes a step), so
# a file written sequentially is copied O(log n) times, not once per granule; the spare is
# trimmed when its last mount writer closes (release_mount).
GROWTH_FACTOR = 2
GROWTH_CAP = 1 << 30


class AllocationManager(HandleVerbs, RefillVerbs, SnapshotRecords, Queries):
    def __init__(self, registry: Registry, backend: Backend, keeper, *,
                 fault_injection: bool = False, default_ecc: str = "rs",
                 quotas: dict[int, int] | None = None, default_quota: int | None = None,
                 max_names_per_uid: int | None = None, max_handles_per_uid: int | None = None,
                 fds_to_readers: bool = False, mountpoint: str | None = None,
                 metadata_max_bytes: int = usermeta.DEFAULT_MAX_BYTES,
                 metadata_user_max_bytes: int = usermeta.DEFAULT_USER_MAX_BYTES):
        """`fault_injection`: gpumemd --enable-fault-injection (debug_corrupt); `default_ecc`:
        the ECC of creates that name none (config `ecc`); `quotas`: uid -> the capacity in
        bytes that uid's allocations may hold (config [quotas]); `default_quota`: the
        capacity of every other uid but root's and the daemon's (config default_quota);
        `max_names_per_uid`, `max_handles_per_uid`: the same config keys (None: no limit);
        `fds_to_readers`: config cuda_fds_to_readers (HandleVerbs.require_fd_for_reader);
        `mountpoint`: where the namespace is mounted, if it is (absolute link targets under
        it are followed by the socket API: daemon/links.py); `metadata_max_bytes`,
        `metadata_user_max_bytes`: the bounds of user metadata (daemon/usermeta.py)."""
        if default_ecc not in ECC_MODES:
            raise ValueError(f"invalid default ecc {default_ecc!r}: expected one of "
                             f"{', '.join(ECC_MODES)}")
        self.registry, self.backend, self.keeper = registry, backend, keeper
        self.journal = Journal(registry)
        self.ns = Namespace(registry, self.journal)
        self.integrity = Integrity(registry, self.journal, backend)
        self.custody = Custody(registry, self.journal, backend, keeper, self.ns,
                               self.integrity.parity)
        self.ns.max_names_per_uid = max_names_per_uid
        self.ns.resolver.mountpoint = mountpoint
        self.holders = Holders(registry, self.journal)
        self.holders.max_per_uid = max_handles_per_uid
        self.quotas = Quotas(self.ns.allocations, quotas, kept=self._kept_open,
                             default=default_quota, exempt=administrative_uid)
        self.meta_bounds = usermeta.Bounds(metadata_max_bytes, metadata_user_max_bytes,
                                           used=self.ns.metadata_used,
                                           exempt=administrative_uid)
        self.fault_injection = fault_injection
        self.fds_to_readers = fds_to_readers
        self.default_ecc = default_ecc
        self._dirty: set[int] = set()        # ids whose size/times await flush_times()
        self._refills: dict[int, Refill] = {}  # refill handles by holder id (refill.py)
        self.last_snapshots: dict[str, dict] = {}  # the administrator's newest reports

    @property
    def root(self) -> Directory:
        return self.ns.root

    # ---- start and stop -----------------------------------------------------------------
    def start(self, orphans: str = "refuse") -> dict:
        """Load the registry, re-adopt durable memory from the keeper, drop what is stale
        (Custody.reconcile_at_start says how, and what `orphans` decides)."""
        self.ns.load()
        summary = self.custody.reconcile_at_start(orphans, self.integrity.settle)
        self.last_snapshots = self.registry.last_snapshot_reports(administrative_uid)
        return summary

    def shutdown(self) -> None:
        """Clean stop: transient memory goes, durable memory stays with the keeper."""
        with self.journal.change(durable=False):
            for alloc in self.ns.allocations():
                if not alloc.durable:
                    self.ns.forget(alloc)
            self.registry.clear_holders()
            self.journal.event("stop", None, None)
        for alloc in self.ns.allocations():
            self.custody.free(alloc)
        self.keeper.close()

    # ---- namespace verbs ------------------------------------------------------------------
    def mkdir(self, path: str, cred: Credentials, *, mode: int = DIR_MODE,
              parents: bool = False, exist_ok: bool = False) -> dict:
        check_mode(mode)
        parts = split_path(path)
        parent, missing = self.ns.parent_for_new(parts, cred, parents)
        existing = parent.children.get(parts[-1]) if not missing else None
        if existing is not None:
            if isinstance(existing, Directory) and (exist_ok or parents):
                return describe(existing)
            raise Exists(f"'{existing.path}' already exists")
        with self.journal.change(durable=False):
            node = self.ns.insert_dirs(parent, missing + [parts[-1]], cred, mode)
        return describe(node)

    def create(self, path: str, cred: Credentials, *, size: int, durable: bool = False,
               mode: int = FILE_MODE, device: str | None = None,
               ecc: str | None = None, exist_ok: bool = False,
               session: Session | None = None, lease: bool = False,
               prepared: Prepared | None = None, metadata: dict | None = None) -> dict:
        """Allocate. Missing parent directories are created (mode 0755), like `mkdir -p`.
        `ecc` None: the daemon's default. Order: allocate, deposit (durable), commit; a
        failure anywhere frees what was allocated. `prepared`: prepare_create's
        allocation, whose memory the keeper already holds. `metadata`: {key: value} of
        user metadata the new allocation gets in the same transaction (an existing one,
        with `exist_ok`, keeps its own)."""
        plan = self._plan_create(path, cred, size, durable, mode, device, ecc, lease, session,
                                 metadata)
        if isinstance(plan, Node):      # the name exists
            if prepared is not None:
                self.custody.abandon(prepared)
            return self._create_existing(plan, cred, size, durable, exist_ok)
        parent, missing, name, dev, capacity, ecc, entries = plan
        buf = prepared.alloc.buffer if prepared is not None else \
            self.custody.allocate(dev, size, capacity, ecc, label=path)
        alloc = None
        try:
            with self.journal.change(durable=durable, batch=not durable and not missing):
                ids = prepared.dir_ids if prepared else None
                directory = self.ns.insert_dirs(parent, missing, cred, DIR_MODE, ids=ids
                                                if ids and len(ids) == len(missing) else None)
                alloc = self.ns.insert_node(
                    Allocation, directory, name, cred, mode, size=size, capacity=capacity,
                    device=dev.uuid, durable=durable, state="ready", ecc=ecc, buffer=buf,
                    leased=lease, node_id=prepared.alloc.id if prepared else None,
                    parity=prepared.alloc.parity if prepared else None)
                if entries:
                    self.ns.replace_metadata(alloc, entries)
                if prepared is None:
                    self.integrity.protect_new(alloc)
                    if durable:
                        self.custody.deposit(alloc)
                self.journal.event("create", alloc, cred, size=size, capacity=capacity,
                                   device=dev.uuid, durable=durable, lease=lease,
                                   **({"metadata_keys": len(entries)} if entries else {}))
        except BaseException:     # the undo log took back the tree and any deposit
            if prepared is not None:
                self.custody.withdraw_quietly(prepared.alloc.id)
            self.backend.free(buf)
            freed = alloc if alloc is not None else prepared.alloc if prepared else None
            if freed is not None:
                self.integrity.release(freed)
            raise
        if lease and session is not None:
            self.holders.add(alloc, session, "lease")
        return describe(alloc, holders=True)

    def prepare_create(self, path: str, cred: Credentials, **request) -> Prepared | None:
        """Step one of a durable create whose deposit runs off the event loop (the socket
        server's create): create()'s checks, then memory, parity and a reserved id, in an
        allocation not yet in the tree. Step two sends custody.handover() of it on a
        worker thread; step three is create(prepared=it), which checks again. None: the
        name exists (create() answers that)."""
        plan = self._plan_create(path, cred, request["size"], True, request["mode"],
                                 request["device"], request["ecc"], False, None,
                                 request.get("metadata"))
        if isinstance(plan, Node):
            return None
        _parent, missing, _name, dev, capacity, ecc, _entries = plan
        return self.custody.prepare(self.ns.reserve_ids(len(missing) + 1), cred,
                                    request["mode"], request["size"], dev, capacity, ecc,
                                    label=path)

    def abandon(self, prepared: Prepared) -> None:
        self.custody.abandon(prepared)

    def _plan_create(self, path: str, cred: Credentials, size: int, durable: bool, mode: int,
                     device: str | None, ecc: str | None, lease: bool,
                     session: Session | None, metadata: dict | None = None):
        """create()'s checks: the existing node, or (parent, missing dirs, name, device,
        capacity, ecc, metadata entries) of a new allocation that may be made."""
        check_mode(mode)
        ecc = self.default_ecc if ecc is None else ecc
        if ecc not in ECC_MODES:
            raise UsageError(f"invalid ECC mode {ecc!r}: expected one of {', '.join(ECC_MODES)}")
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise UsageError(f"invalid size {size!r}: must be a whole number of bytes >= 1")
        if lease and (durable or session is None):
            raise UsageError("a durable allocation cannot have a session lease" if durable
                             else "a lease needs a session")
        entries = usermeta.entries(metadata) if metadata is not None else {}
        parts = split_path(path)
        parent, missing = self.ns.parent_for_new(parts, cred, parents=True)
        existing = parent.children.get(parts[-1]) if not missing else None
        if existing is not None:
            return existing
        require(parent, cred, W | X, "create entries in")
        dev = self.backend.device(device)
        capacity = round_up(size, dev.granularity)
        self.custody.require_could_fit(dev, size, ecc)
        self.quotas.check(cred.uid, capacity)
        self.custody.require_fds(cred.uid, ecc)       # its descriptors (daemon/fdbudget.py)
        if entries:
            self.meta_bounds.check("/".join(parts), cred.uid, 0, usermeta.size_of(entries))
        return parent, missing, parts[-1], dev, capacity, ecc, entries

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
        return describe(existing, holders=True, cred=cred)

    def remove(self, path: str, cred: Credentials, *, recursive: bool = False,
               force: bool = False) -> list[str]:
        """Remove an allocation or (with `recursive`) a directory tree. Returns the paths
        removed. An allocation with open handles is busy unless `force`: then its name goes
        now and its memory with its last holder. Order: commit, withdraw, free. A name of a
        hard-linked allocation goes alone while other names keep it (nothing is freed, and
        open handles do not make it busy)."""
        parent, name, node = self.ns.lookup_entry(path, cred)  # a link goes, not its target
        if isinstance(node, Directory) and not recursive:
            raise UsageError(f"'{node.path}' is a directory; use -r to remove it and its "
                             "contents")
        doomed = self.ns.removal_order(parent, name, node, cred)
        names_going = collections.Counter(n.id for _, _, n in doomed)
        last = {n.id: n for _, _, n in doomed if names_going[n.id] >= n.nlink}
        if not force:
            for victim in last.values():
                if isinstance(victim, Allocation) and victim.holders_of(*IO_KINDS):
                    raise Busy(self.holders.busy_message(victim))
        allocs = [v for _, _, v in doomed if isinstance(v, Allocation)]
        freed: list[Allocation] = []
        with self.journal.change(durable=any(a.durable for a in allocs),
                                 batch=len(allocs) == len(doomed) and
                                 not any(a.durable for a in allocs)):
            for directory, victim_name, victim in doomed:
                removed = entry_path(directory, victim_name)
                if self.ns.drop_name(directory, victim_name, victim):
                    self.journal.event("remove", victim, cred, force=force)
                    if isinstance(victim, Allocation):
                        freed.append(victim)
                else:
                    self.journal.event("remove", victim, cred, force=force, name=removed,
                                       links_left=victim.nlink)
        for victim in freed:
            self._release_memory(victim)
        return [entry_path(d, n) for d, n, _ in doomed]

    def _kept_open(self) -> list[Allocation]:
        """Allocations removed while held open: their memory goes with the last holder, and
        until then it counts against the owner's quota (daemon/quotas.py)."""
        kept = {h.alloc.id: h.alloc for s in self.holders.sessions.values()
                for h in s.holders.values() if h.alloc.unlinked}
        return list(kept.values())

    def _release_memory(self, alloc: Allocation) -> None:
        """After the row is gone: let go of the keeper's copy, then free (or wait for the
        last holder, if forced)."""
        alloc.unlinked = True
        if alloc.durable:
            self.custody.withdraw_quietly(alloc.id)
        if not alloc.holders_of(*IO_KINDS, *MOUNT_KINDS):
            self.holders.drop_all(alloc)
            self.custody.free(alloc)

    def set_durable(self, path: str, cred: Credentials, durable: bool, *,
                    deposited: Deposit | None = None) -> dict:
        return self.set_durable_node(self.ns.lookup_allocation(path, cred), cred, durable,
                                     deposited=deposited)

    def prepare_durable(self, path: str, cred: Credentials) -> Deposit | None:
        """Step one of making an allocation durable with the deposit off the event loop
        (as prepare_create): the checks, then its fds to send; None when there is nothing
        to deposit. Step three: set_durable(deposited=it), which checks again."""
        alloc = self.ns.lookup_allocation(path, cred)
        self._require_durability_change(alloc, cred)
        if alloc.durable or alloc.buffer is None:
            return None
        return self.custody.handover(alloc)

    def _require_durability_change(self, alloc: Allocation, cred: Credentials) -> None:
        require_owner(alloc, cred, "change the durability of")
        if alloc.state == "lost":
            raise InvalidState(f"'{alloc.path}' is lost: its memory is gone; remove it")
        if alloc.unlinked:
            raise InvalidState(f"'{alloc.path}' has been removed; it cannot change "
                               "durability")

    def set_durable_node(self, alloc: Allocation, cred: Credentials, durable: bool, *,
                         deposited: Deposit | None = None) -> dict:
        """Durable: deposit, then commit. Transient: commit, then withdraw. `deposited`:
        prepare_durable's deposit, made meanwhile (made again if the memory changed)."""
        self._require_durability_change(alloc, cred)
        if alloc.durable == durable:
            return describe(alloc, holders=True, cred=cred)
        with self.journal.change(durable=True):
            self.journal.keep(alloc, "durable", "changed_ns")
            alloc.durable = durable
            alloc.changed_ns = time.time_ns()
            self.registry.update_node(alloc.id, durable=int(durable),
                                      changed_ns=alloc.changed_ns)
            if durable and alloc.buffer is not None:
                if deposited is not None and deposited.taken_from(alloc):
                    self.journal.on_rollback(lambda: self.custody.withdraw_quietly(alloc.id))
                else:
                    self.custody.deposit(alloc)
            self.journal.event("durable" if durable else "transient", alloc, cred)
        if durable:
            alloc.leased = False       # the durable pin replaces any lease
            if alloc.dirty_to > alloc.dirty_from:
                self.integrity.writes_begin(alloc)  # unsynced writes now matter at a crash
            for holder in alloc.holders_of("lease"):
                self._remove_holder(holder)
        elif alloc.buffer is not None:
            self.custody.withdraw_quietly(alloc.id)
        return describe(alloc, holders=True, cred=cred)

    # ---- user metadata (daemon/usermeta.py) -------------------------------------------
    # By path for the socket (`meta_*`: links followed, as `info` does; read permission to
    # get or list, write permission to set or remove, search permission on the way), and
    # by node for the mount's user.KEY attributes, whose permissions the kernel has
    # checked (`authorised`: default_permissions, and Linux's rules for user.* names).
    def _metadata_node(self, path: str, cred: Credentials) -> Node:
        node = self.ns.lookup(path, cred, allow_root=True)
        if not isinstance(node, (Allocation, Directory)):
            raise UsageError(f"'{node.path}' is a {describe(node)['type']}: {usermeta.ONLY_ON}",
                             details={"errno": "EPERM"})
        return node

    def meta_list(self, path: str, cred: Credentials) -> dict:
        node = self._metadata_node(path, cred)
        require(node, cred, R, "read the metadata of")
        return {"path": node.path, "metadata": usermeta.shown(node.metadata)}

    def meta_get(self, path: str, key: str, cred: Credentials) -> dict:
        raw = usermeta.key_bytes(key)
        node = self._metadata_node(path, cred)
        value = self.metadata_value(node, raw, cred)
        return {"path": node.path, "key": name_from_bytes(raw),
                "value": name_from_bytes(value)}

    def meta_set(self, path: str, key: str, value: str, cred: Credentials, *,
                 create: bool = False, replace: bool = False) -> dict:
        raw, data = usermeta.key_bytes(key), usermeta.value_bytes(value, key)
        node = self._metadata_node(path, cred)
        self.set_metadata(node, raw, data, cred, create=create, replace=replace)
        return {"path": node.path, "key": name_from_bytes(raw), "bytes": len(data)}

    def meta_rm(self, path: str, key: str, cred: Credentials) -> dict:
        raw = usermeta.key_bytes(key)
        node = self._metadata_node(path, cred)
        self.remove_metadata(node, raw, cred)
        return {"path": node.path, "key": name_from_bytes(raw)}

    def metadata_value(self, node: Node, key: bytes, cred: Credentials, *,
                       authorised: bool = False) -> bytes:
        """One value (getxattr(2) of user.KEY); NotFound (ENODATA) when there is none."""
        if not authorised:
            require(node, cred, R, "read the metadata of")
        value = node.metadata.get(key)
        if value is None:
            raise NotFound(f"no metadata key '{name_from_bytes(key)}' on '{node.path or '/'}'",
                           details={"errno": "ENODATA"})
        return value

    def set_metadata(self, node: Node, key: bytes, value: bytes, cred: Credentials, *,
                     create: bool = False, replace: bool = False,
                     authorised: bool = False) -> None:
        """Set one key (setxattr(2) of user.KEY; `create`, `replace`: XATTR_CREATE and
        XATTR_REPLACE). The bounds are checked first; one transaction, its event `meta`
        names the key, never the value."""
        if create and replace:
            raise UsageError("create and replace exclude each other: a key cannot both be "
                             "absent and present")
        self._require_metadata_write(node, cred, authorised)
        old = node.metadata.get(key)
        shown = name_from_bytes(key)
        if create and old is not None:
            raise Exists(f"metadata key '{shown}' exists on '{node.path or '/'}'",
                         details={"errno": "EEXIST"})
        if replace and old is None:
            raise NotFound(f"no metadata key '{shown}' on '{node.path or '/'}'",
                           details={"errno": "ENODATA"})
        after = node.metadata_bytes + len(key) + len(value) - \
            (len(key) + len(old) if old is not None else 0)
        self.meta_bounds.check(node.path or "/", node.uid, node.metadata_bytes, after)
        with self.journal.change(**self._metadata_commit(node)):
            self.ns.set_metadata(node, key, value)
            self.journal.event("meta", node, cred, action="set", key=shown, bytes=len(value))

    def remove_metadata(self, node: Node, key: bytes, cred: Credentials, *,
                        authorised: bool = False) -> None:
        """removexattr(2) of user.KEY; NotFound (ENODATA) when there is none."""
        self._require_metadata_write(node, cred, authorised)
        if key not in node.metadata:
            raise NotFound(f"no metadata key '{name_from_bytes(key)}' on '{node.path or '/'}'",
                           details={"errno": "ENODATA"})
        with self.journal.change(**self._metadata_commit(node)):
            self.ns.set_metadata(node, key, None)
            self.journal.event("meta", node, cred, action="rm", key=name_from_bytes(key))

    def _require_metadata_write(self, node: Node, cred: Credentials, authorised: bool) -> None:
        if not isinstance(node, (Allocation, Directory)):
            raise UsageError(f"'{node.path}' is a {describe(node)['type']}: {usermeta.ONLY_ON}",
                             details={"errno": "EPERM"})
        if self.ns.node_or_none(node.id) is not node:
            raise NotFound(f"'{node.path}' was removed: its metadata cannot change",
                           details={"errno": "ENOENT"})
        if authorised:
            return
        require(node, cred, W, "change the metadata of")
        # Linux's rule for user.* attributes: in a sticky directory (such as the root, 1777)
        # only its owner (or root) may write them, as only they may remove others' entries.
        if isinstance(node, Directory) and node.mode & 0o1000 and \
                not (cred.is_root or cred.uid == node.uid):
            raise PermissionDenied(f"permission denied: '{node.path or '/'}' is sticky; only "
                                   f"its owner (uid {node.uid}) may change its metadata",
                                   details={"errno": "EPERM"})

    @staticmethod
    def _metadata_commit(node: Node) -> dict:
        """The journal change of a metadata change: fsynced for a durable allocation, as
        its other attributes are; batched for a transient one (gone after any restart);
        committed for a directory, as mkdir is."""
        durable = isinstance(node, Allocation) and node.durable
        return {"durable": durable, "batch": isinstance(node, Allocation) and not durable}

    # ---- the mount's verbs, by node id (daemon/fs.py) -----------------------------------
    # Errors that need an errno other than their class's (daemon/errno_map.py) carry its
    # name in details["errno"]: ENOTDIR, EISDIR, ENOTEMPTY, EPERM.
    def mkdir_child(self, parent_id: int, name: str, cred: Credentials,
                    mode: int = DIR_MODE) -> Directory:
        parent = self.ns.parent_for_entry(parent_id, name, cred, mode)
        with self.journal.change(durable=False):
            return self.ns.insert_dirs(parent, [name], cred, mode)

    def create_pending(self, parent_id: int, name: str, cred: Credentials,
                       mode: int = FILE_MODE) -> Allocation:
        """An allocation without memory, as `touch` in the mount makes: state 'pending',
        size 0, no capacity, device or buffer. It is transient; resize() gives it memory."""
        parent = self.ns.parent_for_entry(parent_id, name, cred, mode)
        with self.journal.change(durable=False, batch=True):
            alloc = self.ns.insert_node(Allocation, parent, name, cred, mode, size=0,
                                        capacity=None, device=None, durable=False,
                                        state="pending", ecc=self.default_ecc)
            self.journal.event("create", alloc, cred, size=0, state="pending")
        return alloc

    def rename(self, src_parent_id: int, src_name: str, dst_parent_id: int, dst_name: str,
               cred: Credentials, *, replace: bool = True) -> Node:
        """rename(2) (Namespace.move). A replaced allocation goes as with remove(force=True):
        its memory is freed now, or by its last holder."""
        node, replaced = self.ns.move(src_parent_id, src_name, dst_parent_id, dst_name, cred,
                                      replace=replace)
        if isinstance(replaced, Allocation):
            self._release_memory(replaced)
        return node

    def unlink_child(self, parent_id: int, name: str, cred: Credentials) -> None:
        """unlink(2): the name goes now; an allocation's memory now or with its last holder.
        Never a directory (EISDIR)."""
        node = self.ns.lookup_child(parent_id, name, cred)
        if isinstance(node, Directory):
            raise UsageError(f"'{node.path}' is a directory", details={"errno": "EISDIR"})
        parent = self.ns.directory(parent_id)
        self.ns.require_removable(parent, node, cred)
        durable = isinstance(node, Allocation) and node.durable
        with self.journal.change(durable=durable, batch=isinstance(node, Allocation)
                                 and not durable):
            removed = entry_path(parent, name)
            if not self.ns.drop_name(parent, name, node):
                self.journal.event("remove", node, cred, force=True, name=removed,
                                   links_left=node.nlink)
                return
            self.journal.event("remove", node, cred, force=True)
        if isinstance(node, Allocation):
            self._release_memory(node)

    def exchange(self, src_parent_id: int, src_name: str, dst_parent_id: int, dst_name: str,
                 cred: Credentials) -> tuple[Node, Node]:
        """renameat2(RENAME_EXCHANGE) (Namespace.exchange): nothing is freed."""
        return self.ns.exchange(src_parent_id, src_name, dst_parent_id, dst_name, cred)

    # ---- hard links: one node, several names -------------------------------------------
    def link(self, target: str, path: str, cred: Credentials) -> dict:
        """`ln TARGET PATH` (socket API): PATH becomes one more name of what TARGET names
        (TARGET's last component not followed, as link(2) and GNU ln). PATH's directory must
        exist. No `names` in the answer (`info` has them): a link would cost O(names)."""
        _, _, node = self.ns.lookup_entry(target, cred)
        parts = split_path(path)
        parent, _ = self.ns.parent_for_new(parts, cred, parents=False)
        self._add_name(node, parent, parts[-1], cred)
        return describe(node, holders=True, names=False, path=entry_path(parent, parts[-1]),
                        name=parts[-1])

    def link_child(self, node_id: int, parent_id: int, name: str, cred: Credentials) -> Node:
        """link(2) on the mount."""
        node = self.ns.node(node_id)
        self._add_name(node, self.ns.directory(parent_id), name, cred)
        return node

    def _add_name(self, node: Node, parent: Directory, name: str, cred: Credentials) -> None:
        # A durable allocation's new name must survive a power cut as the allocation does.
        with self.journal.change(durable=self.ns.has_durable(node)):
            self.ns.add_name(node, parent, name, cred)
            self.journal.event("link", node, cred, name=entry_path(parent, name),
                               links=node.nlink)

    # ---- symbolic links and special files: metadata only, never memory ------------------
    # Not fsynced, as mkdir is not: a committed row survives a crash of the daemon (kill -9),
    # and only a power cut may take the last ones (docs/durability.md).
    def symlink(self, path: str, target: str, cred: Credentials) -> dict:
        """`ln -s TARGET PATH` (socket API): the directory that holds PATH must exist
        (links on the way to it are followed); the target is kept as given."""
        parts = split_path(path)
        parent, _ = self.ns.parent_for_new(parts, cred, parents=False)
        return describe(self._insert_link(parent, parts[-1], target, cred))

    def symlink_child(self, parent_id: int, name: str, target: str,
                      cred: Credentials) -> Symlink:
        """symlink(2) on the mount."""
        parent = self.ns.parent_for_entry(parent_id, name, cred, 0o777)
        return self._insert_link(parent, name, target, cred)

    def _insert_link(self, parent: Directory, name: str, target: str,
                     cred: Credentials) -> Symlink:
        check_target(target)
        require(parent, cred, W | X, "create entries in")
        if name in parent.children:
            raise Exists(f"'{parent.children[name].path}' already exists")
        with self.journal.change(durable=False):
            link = self.ns.insert_node(Symlink, parent, name, cred, 0o777, target=target)
            self.journal.event("symlink", link, cred, target=target)
        return link

    def readlink(self, path: str, cred: Credentials) -> dict:
        """The link itself (not followed): {target, info}."""
        node = self.ns.lookup(path, cred, follow=False)
        if not isinstance(node, Symlink):
            raise UsageError(f"'{node.path}' is not a symbolic link",
                             details={"errno": "EINVAL"})
        return {"target": node.target, "info": describe(node, cred=cred)}

    def mknod_child(self, parent_id: int, name: str, cred: Credentials, mode: int,
                    ftype: int, rdev: int = 0) -> Special:
        """mknod(2) of a FIFO, socket or device node on the mount: a row, no memory. The
        mount is nodev, so a device node made here never opens the device."""
        if ftype not in SPECIAL_KINDS:
            raise UsageError(f"mknod of file type {ftype:o} is not supported",
                             details={"errno": "EINVAL"})
        parent = self.ns.parent_for_entry(parent_id, name, cred, mode)
        device = ftype in (stat.S_IFCHR, stat.S_IFBLK)
        with self.journal.change(durable=False):
            node = self.ns.insert_node(Special, parent, name, cred, mode, ftype=ftype,
                                       rdev=rdev if device else 0)
            self.journal.event("mknod", node, cred, type=node.kind, mode=f"{mode:04o}",
                               rdev=node.rdev)
        return node

    def rmdir_child(self, parent_id: int, name: str, cred: Credentials) -> None:
        """rmdir(2): an empty directory only; a non-empty one is Exists with ENOTEMPTY."""
        node = self.ns.lookup_child(parent_id, name, cred)
        if not isinstance(node, Directory):
            raise UsageError(f"'{node.path}' is not a directory", details={"errno": "ENOTDIR"})
        if node.children:
            raise Exists(f"directory '{node.path}' is not empty",
                         details={"errno": "ENOTEMPTY"})
        self.ns.require_removable(node.parent, node, cred)
        with self.journal.change(durable=False):
            self.ns.forget(node)
            self.journal.event("remove", node, cred)

    def setattr(self, node_id: int, cred: Credentials, **changes) -> Node:
        """chmod / chown / utimens (Namespace.setattr); a new owner's quota is checked."""
        return self.ns.setattr(node_id, cred, charge=self.quotas.check, **changes)

    def note_access(self, node: Node) -> None:
        self.ns.note_access(node)

    # ---- size -----------------------------------------------------------------------------
    def resize(self, alloc: Allocation, cred: Credentials, size: int, *,
               session: Session | None = None, authorised: bool = False) -> Allocation:
        """Set the size (truncate, or `user.gpu.size`). Needs write permission (unless
        `authorised`: the kernel checked it), and no read, write or attach holder outside
        `session` (Busy): those hold fds to the memory.

        - pending: allocate round_up(size); size 0 leaves it pending.
        - same capacity: only the size changes.
        - new capacity (at least one granule: a ready allocation keeps memory at size 0):
          new memory, min(old, new size) bytes kept (Custody.reallocate has the keeper order).
        Bytes past the size are undefined (an attached client may write anywhere in the
        capacity): whatever a grow exposes is zeroed here, so it reads as zeros."""
        if not authorised:
            require(alloc, cred, W)
        before = alloc.size, alloc.capacity
        self._resize(alloc, cred, size, session)
        if (alloc.size, alloc.capacity) != before:
            self.ns.data_changed(alloc)      # a cache of its pages must follow the new size
        return alloc

    def _resize(self, alloc: Allocation, cred: Credentials, size: int,
                session: Session | None, *, capacity: int | None = None) -> Allocation:
        """`capacity`: what to allocate if the memory must change (default: the size rounded
        up to the granularity)."""
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise UsageError(f"invalid size {size!r}: must be a whole number of bytes >= 0")
        if alloc.state not in ("pending", "ready"):
            raise InvalidState(f"'{alloc.path}' is {alloc.state}: it cannot be resized")
        self.holders.require_no_others(alloc, session, "resized")
        if size == alloc.size or (alloc.state == "pending" and size == 0):
            return alloc
        dev = self.backend.device(alloc.device)
        fit = max(dev.granularity, round_up(size, dev.granularity))
        capacity = max(fit, capacity or 0)
        held = alloc.capacity or 0 if alloc.buffer is not None else 0
        if size > alloc.size:
            self.custody.require_could_fit(dev, size, alloc.ecc)
        self.quotas.check(alloc.uid, capacity - held)
        old_size, fresh = alloc.size, alloc.state == "pending"

        def commit() -> None:    # looked up at call time: tests stand a crash in for it
            self._commit_size(alloc, cred, size, capacity, old_size)
        if fresh:
            self.custody.allocate_pending(alloc, dev, size, capacity, commit)
        elif capacity == alloc.capacity:          # keep the memory: no copy at all
            if size > alloc.size:
                self.backend.zero(alloc.buffer, alloc.size, size)
            commit()
        else:
            self.custody.reallocate(alloc, dev, size, capacity, commit)
        self._protect_resized(alloc, old_size, fresh)
        return alloc

    def _protect_resized(self, alloc: Allocation, old_size: int, fresh: bool) -> None:
        if self.integrity.protect_resized(alloc, old_size, fresh) and alloc.durable \
                and not alloc.unlinked:
            self.custody.deposit(alloc)          # new parity memory: the keeper follows

    def _commit_size(self, alloc: Allocation, cred: Credentials, size: int, capacity: int,
                     old_size: int) -> None:
        """Record size and capacity (memory and registry together, or neither)."""
        now = time.time_ns()
        with self.journal.change(durable=alloc.durable, batch=not alloc.durable):
            self.journal.keep(alloc, "size", "capacity", "modified_ns", "changed_ns")
            alloc.size, alloc.capacity = size, capacity
            alloc.modified_ns = alloc.changed_ns = now
            self.registry.update_node(alloc.id, size=size, capacity=capacity,
                                      device=alloc.device, state=alloc.state,
                                      modified_ns=now, changed_ns=now)
            self.journal.event("resize", alloc, cred, size=size, capacity=capacity,
                               old_size=old_size)
        self._dirty.discard(alloc.id)
        self.integrity.changed_all(alloc)      # a resize moves or zeroes bytes
        self.ns.attrs_changed(alloc)

    # ---- data -----------------------------------------------------------------------------
    def write_at(self, alloc: Allocation, offset: int, data, cred: Credentials | None = None,
                 *, session: Session | None = None) -> int:
        """Write `data` at `offset`. `cred` None: the caller (a handle opened for writing)
        has been authorised. A write past the size grows the allocation (past the capacity
        with room to spare, GROWTH_FACTOR; NoMemory/ENOSPC when the device is full). Size
        and times change in memory only, the id marked dirty: flush_times() commits them
        at release/fsync, as a filesystem does; a reallocation is committed at once."""
        if cred is not None:
            require(alloc, cred, W)
        if not isinstance(offset, int) or offset < 0:
            raise UsageError(f"invalid offset {offset!r}")
        if not len(data):
            return 0            # as write(2): a write of nothing never extends the file
        end = offset + len(data)
        if end > alloc.size:
            self._grow_for_write(alloc, offset, end, session)
        self.custody.require_memory(alloc)
        self.integrity.writes_begin(alloc)
        self.backend.write(alloc.buffer, offset, data)
        alloc.modified_ns = alloc.changed_ns = time.time_ns()
        self.integrity.note_written(alloc, offset, end)
        self._dirty.add(alloc.id)
        return len(data)

    def _grow_for_write(self, alloc: Allocation, offset: int, end: int,
                        session: Session | None) -> None:
        capacity = alloc.capacity or 0
        if alloc.state == "ready" and end <= capacity:
            if offset > alloc.size:
                self.backend.zero(alloc.buffer, alloc.size, offset)
                self.integrity.changed(alloc, alloc.size, offset)
            alloc.size = end
            self.ns.attrs_changed(alloc)
            self.journal.node_changed(alloc)
            return
        spare = None
        if alloc.state == "ready":
            spare = capacity + min(capacity * (GROWTH_FACTOR - 1), GROWTH_CAP)
        try:
            self._resize(alloc, DAEMON, end, session, capacity=spare)
        except NoMemory:
            if spare is None:
                raise
            self._resize(alloc, DAEMON, end, session)      # no room to spare: exact fit

    def read_at(self, alloc: Allocation, offset: int, length: int) -> bytes:
        """Up to `length` bytes at `offset`, clipped to the size (b"" at or past the end).
        Permission is the caller's (checked at open)."""
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
        self.custody.require_memory(alloc)
        if alloc.damaged:
            self.integrity.require_undamaged(alloc, offset, end)
        return self.backend.view(alloc.buffer, offset, end - offset)

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

    def sync(self, alloc: Allocation, *, parity: ParityJob | None = None,
             planned: bool = False) -> None:
        """fsync(2), and the close of a mount file that wrote: size and times committed,
        then the parity of the written range brought up to date. `planned`: `parity` is
        sync_job()'s job, run meanwhile on a worker thread (or None: nothing to do)."""
        self.flush_times(alloc)
        self.integrity.finish(parity if planned else self.integrity.job_written(alloc))

    # ---- parity work off the event loop (daemon/offload.py) -----------------------------
    # A caller that can wait takes a verb's parity job here (step one), runs it on a worker
    # thread, and passes it to the verb (step two), which finishes it, or runs it if the
    # worker did not. Between the steps the holder stays: the memory stays, no writer comes.
    def sync_job(self, alloc: Allocation) -> ParityJob | None:
        self.flush_times(alloc)
        return self.integrity.job_written(alloc)

    # ---- ECC (docs/ecc.md) -------------------------------------------------------------
    def corrupt(self, path: str, cred: Credentials, offset: int, length: int,
                pattern: bytes, parity: bool) -> dict:
        """Fault injection (gpumemd --enable-fault-injection only; root or the daemon's
        uid): overwrite bytes of the data or of the parity, without updating the parity."""
        if not self.fault_injection:
            raise PermissionDenied("fault injection is off: start gpumemd with "
                                   "--enable-fault-injection to use `debug corrupt`")
        if not (cred.is_root or cred.uid == os.geteuid()):
            raise PermissionDenied("permission denied: `debug corrupt` is for root and the "
                                   "daemon's user only")
        alloc = self.ns.lookup_allocation(path, cred)
        self.custody.require_memory(alloc)
        result = self.integrity.corrupt(alloc, cred, offset, length, pattern, parity)
        if not parity:
            self.ns.data_changed(alloc)      # the mount reads the damage, as the socket does
        return result


__all__ = ["DAEMON", "NOW", "RELATIME_NS", "AllocationManager", "Prepared"]
