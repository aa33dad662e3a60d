"""The verbs of names: create, mkdir, rm, rename, hard and symbolic links, special files, and
the attributes of a name (chmod, chown, utimens, access times); by path for the socket, by
node id for the mount (daemon/fs/).

Every verb takes the caller's Credentials, raises `gpumemctl.protocol` errors, and either
happens whole or changes nothing (the journal's undo log). Errors that need an errno other
than their class's (daemon/fs/errno_map.py) carry its name in details["errno"]: ENOTDIR,
EISDIR, ENOTEMPTY, EPERM.
"""
from __future__ import annotations

import collections
import stat
from typing import TYPE_CHECKING

from gpumemctl.protocol import Busy, Exists, UsageError, split_path
from gpumemctl.protocol.defaults import DIR_MODE, FILE_MODE

from ..core.creation import Creation, NewAllocation, Request
from ..core.custody import Custody, Prepared
from ..core.describe import describe
from ..core.holders import IO_KINDS, Holders
from ..core.journal import Journal
from ..core.lifecycle import Lifecycle
from ..core.links import check_target
from ..core.namespace import Namespace, check_mode
from ..core.namespace.rules import has_durable, removal_order, require_removable
from ..core.nodes import SPECIAL_KINDS, Allocation, Directory, Node, Special, Symlink, entry_path
from ..core.permissions import Credentials, R, W, X, require
from ..core.quotas import Quotas
from ..core.sessions import Session
from ..core.sizing import Sizing
from .plan import DEPOSITS, Exclusive, KeeperWork, Plan

if TYPE_CHECKING:
    from gpumemctl.protocol.replies import Node as NodeInfo


class NameVerbs:
    def __init__(self, journal: Journal, namespace: Namespace, custody: Custody,
                 holders: Holders, quotas: Quotas, creation: Creation, lifecycle: Lifecycle,
                 sizing: Sizing):
        self.sizing = sizing
        self.journal = journal
        self.ns = namespace
        self.custody = custody
        self.holders = holders
        self.quotas = quotas
        self.creation = creation
        self.lifecycle = lifecycle

    # ---- allocations and directories by path (the socket) -------------------------------
    def create(self, path: str, cred: Credentials, *, size: int, durable: bool = False,
               mode: int = FILE_MODE, device: str | None = None, ecc: str | None = None,
               exist_ok: bool = False, session: Session | None = None, lease: bool = False,
               metadata: dict | None = None) -> Plan[NodeInfo]:
        """Allocate (daemon/core/creation.py has the order). Missing parent directories are made.
        `ecc` None: the daemon's default. `metadata`: {key: value} of user metadata the new
        allocation gets in the same transaction (an existing one, with `exist_ok`, keeps its
        own). A durable create's deposit goes to the keeper off the loop, under the deposit
        lock, so that a stalled keeper holds this request only, never the loop. A create
        in a directory whose durable default is set (issue 27) is a durable create."""
        request = Request(size, durable, mode, device, ecc, lease, session, metadata)
        if lease:
            return self._create(path, cred, request, exist_ok)
        if not durable:
            new = self.creation.check(path, cred, request)
            if not (isinstance(new, NewAllocation) and new.durable):
                return self._create(path, cred, request, exist_ok, checked=new)
        yield Exclusive(DEPOSITS)
        prepared = None
        new = self.creation.check(path, cred, request)
        if isinstance(new, NewAllocation) and not self.creation.packed(new):
            prepared = self.creation.prepare(new, path, cred, request)
            try:
                deposit = self.custody.handover(prepared.alloc)
                if deposit is not None:
                    yield KeeperWork(self.custody.send_begin(deposit))
            except BaseException:
                self.custody.abandon(prepared)
                raise
        return self._create(path, cred, request, exist_ok, prepared)

    def _create(self, path: str, cred: Credentials, request: Request, exist_ok: bool,
                prepared: Prepared | None = None, checked: NewAllocation | Node | None = None
                ) -> NodeInfo:
        """The last step, which checks again: `prepared`'s memory the keeper holds by now.
        `checked`: creation.check's answer made in this same step (nothing came between)."""
        new = self.creation.check(path, cred, request) if checked is None else checked
        if isinstance(new, NewAllocation):
            return describe(self.creation.make(new, path, cred, request, prepared),
                            holders=True)
        if prepared is not None:
            self.custody.abandon(prepared)
        return self._create_existing(new, cred, request, exist_ok)

    def _create_existing(self, existing: Node, cred: Credentials, request: Request,
                         exist_ok: bool) -> NodeInfo:
        if not exist_ok or not isinstance(existing, Allocation):
            raise Exists(f"'{existing.path}' already exists")
        if existing.size != request.size:
            raise Exists(f"'{existing.path}' already exists with size {existing.size}, not "
                         f"{request.size}", details={"size": existing.size})
        # Idempotent create never drops durability; asking for durable makes it durable.
        if request.durable and not existing.durable:
            self.lifecycle.set_durable(existing, cred, True)
            return describe(existing, holders=True, cred=cred)
        require(existing, cred, R, "read")
        return describe(existing, holders=True, cred=cred)

    def mkdir(self, path: str, cred: Credentials, *, mode: int = DIR_MODE,
              parents: bool = False, exist_ok: bool = False) -> NodeInfo:
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
        doomed = removal_order(parent, name, node, cred)
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
                if self.ns.hardlinks.drop_name(directory, victim_name, victim):
                    self.journal.event("remove", victim, cred, force=force)
                    if isinstance(victim, Allocation):
                        freed.append(victim)
                else:
                    self.journal.event("remove", victim, cred, force=force, name=removed,
                                       links_left=victim.nlink)
        for victim in freed:
            self.lifecycle.release_memory(victim)
        return [entry_path(d, n) for d, n, _ in doomed]

    # ---- the mount's verbs, by node id (daemon/fs/) -----------------------------------
    def mkdir_child(self, parent_id: int, name: str, cred: Credentials,
                    mode: int = DIR_MODE) -> Directory:
        parent = self.ns.parent_for_entry(parent_id, name, cred, mode)
        with self.journal.change(durable=False):
            return self.ns.insert_dirs(parent, [name], cred, mode)

    def create_pending(self, parent_id: int, name: str, cred: Credentials,
                       mode: int = FILE_MODE) -> Allocation:
        """An allocation without memory, as `touch` in the mount makes: state 'pending',
        size 0, no capacity, device or buffer; a resize gives it memory. It is transient,
        or durable in a directory whose durable default is set (issue 27): then its row is
        committed at once (not left to the group commit), though without an fsync, as a
        mkdir's (it holds no memory yet; its first memory's commit is fsynced)."""
        parent = self.ns.parent_for_entry(parent_id, name, cred, mode)
        durable = parent.durable
        with self.journal.change(durable=False, batch=not durable):
            alloc = self.ns.insert_node(Allocation, parent, name, cred, mode, size=0,
                                        capacity=None, device=None, durable=durable,
                                        state="pending", ecc=self.creation.default_ecc)
            self.journal.event("create", alloc, cred, size=0, state="pending",
                               **({"durable": True} if durable else {}))
        return alloc

    def rename(self, src_parent_id: int, src_name: str, dst_parent_id: int, dst_name: str,
               cred: Credentials, *, replace: bool = True) -> Node:
        """rename(2) (ns.renames.move). A replaced allocation goes as with remove(force=True):
        its memory is freed now, or by its last holder."""
        node, replaced = self.ns.renames.move(src_parent_id, src_name, dst_parent_id, dst_name,
                                              cred, replace=replace)
        if isinstance(replaced, Allocation):
            self.lifecycle.release_memory(replaced)
        return node

    def exchange(self, src_parent_id: int, src_name: str, dst_parent_id: int, dst_name: str,
                 cred: Credentials) -> tuple[Node, Node]:
        """renameat2(RENAME_EXCHANGE) (ns.renames.exchange): nothing is freed."""
        return self.ns.renames.exchange(src_parent_id, src_name, dst_parent_id, dst_name, cred)

    def rename_path(self, path: str, to: str, cred: Credentials, *,
                    replace: bool = True) -> NodeInfo:
        """Op `rename` (`gpumemctl mv`): rename(2) by paths, with the checks rename(2) makes
        (ns.renames.move: write and search on both directories, sticky directories, a
        directory not into its own subtree). `path`'s last component is not followed (a
        link is renamed, not its target); `to`'s directory must exist. `replace` False: an
        existing `to` is an error (Exists) instead of being replaced."""
        src_dir, src_name, _node = self.ns.lookup_entry(path, cred)
        parts = split_path(to)
        dst_dir, _missing = self.ns.parent_for_new(parts, cred, parents=False)
        node = self.rename(src_dir.id, src_name, dst_dir.id, parts[-1], cred, replace=replace)
        return describe(node, cred=cred)

    def unlink_child(self, parent_id: int, name: str, cred: Credentials) -> None:
        """unlink(2): the name goes now; an allocation's memory now or with its last holder.
        Never a directory (EISDIR)."""
        node = self.ns.lookup_child(parent_id, name, cred)
        if isinstance(node, Directory):
            raise UsageError(f"'{node.path}' is a directory", details={"errno": "EISDIR"})
        parent = self.ns.directory(parent_id)
        require_removable(parent, node, cred)
        durable = isinstance(node, Allocation) and node.durable
        with self.journal.change(durable=durable, batch=isinstance(node, Allocation)
                                 and not durable):
            if not self.ns.hardlinks.drop_name(parent, name, node):
                self.journal.event("remove", node, cred, force=True,
                                   name=entry_path(parent, name), links_left=node.nlink)
                return
            self.journal.event("remove", node, cred, force=True)
        if isinstance(node, Allocation):
            self.lifecycle.release_memory(node)

    def rmdir_child(self, parent_id: int, name: str, cred: Credentials) -> None:
        """rmdir(2): an empty directory only; a non-empty one is Exists with ENOTEMPTY."""
        node = self.ns.lookup_child(parent_id, name, cred)
        if not isinstance(node, Directory):
            raise UsageError(f"'{node.path}' is not a directory", details={"errno": "ENOTDIR"})
        if node.children:
            raise Exists(f"directory '{node.path}' is not empty",
                         details={"errno": "ENOTEMPTY"})
        require_removable(node.parent, node, cred)
        with self.journal.change(durable=False):
            self.ns.forget(node)
            self.journal.event("remove", node, cred)

    # ---- hard links: one node, several names -------------------------------------------
    def link(self, target: str, path: str, cred: Credentials) -> NodeInfo:
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
        with self.journal.change(durable=has_durable(node)):
            self.ns.hardlinks.add_name(node, parent, name, cred)
            self.journal.event("link", node, cred, name=entry_path(parent, name),
                               links=node.nlink)

    # ---- symbolic links and special files: metadata only, never memory ------------------
    # Not fsynced, as mkdir is not: a committed row survives a crash of the daemon (kill -9),
    # and only a power cut may take the last ones (docs/durability.md).
    def symlink(self, path: str, target: str, cred: Credentials) -> NodeInfo:
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

    # ---- attributes -----------------------------------------------------------------------
    def setattr(self, node_id: int, cred: Credentials, **changes) -> Node:
        """chmod / chown / utimens (ns.attributes.setattr); a new owner's quota is checked.
        A packed allocation given to another owner leaves its slab first (a slab holds one
        owner's bytes: docs/storage.md); busy while a descriptor of it is held."""
        node = self.ns.node(node_id)
        uid = changes.get("uid")
        if uid is not None and isinstance(node, Allocation) and uid != node.uid and \
                (cred.uid == 0 or changes.get("authorised")):
            self.sizing.own_memory(node)
        return self.ns.attributes.setattr(node_id, cred, charge=self.quotas.check, **changes)

    def note_access(self, node: Node) -> None:
        """The access time, by the relatime rule (ns.attributes.note_access)."""
        self.ns.attributes.note_access(node)
