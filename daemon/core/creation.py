"""Creation: a new allocation at a path, in crash-safe order: checks, memory, deposit
(durable), commit; a failure anywhere frees what was allocated. A `create` and a refill of a
missing name (daemon/verbs/refill.py) both make one here.

`check` first (the existing node, or where the new one goes), then `make`. A durable create
sends its deposit off the event loop (daemon/verbs/names.py's plan): `check`, `prepare`
(memory, parity and a reserved id, in an allocation not yet in the tree), the keeper's
deposit meanwhile, then `check` again and `make(prepared=...)`.

A directory's durable default (issue 27, Directory.durable) makes what is created in it
durable, as if the request had asked so (`NewAllocation.durable`), unless it asks for a
session lease (a lease is a lifetime asked for). Missing parents made on the way inherit the
default of the directory they are made in.
"""
from __future__ import annotations

import dataclasses

from gpumemctl.protocol import UsageError, split_path
from gpumemctl.protocol.defaults import DIR_MODE, FILE_MODE

from ..backends import DeviceInfo
from ..backends.packed import PackedBackend
from . import usermeta
from .custody import Custody, Prepared
from .holders import Holders
from .integrity import Integrity
from .journal import Journal
from .namespace import Namespace, check_mode
from .nodes import Allocation, Directory, Node
from .permissions import Credentials, W, X, require
from .quotas import Quotas
from .sessions import Session

ECC_MODES = ("rs", "none")


@dataclasses.dataclass
class Request:
    """What a create asks for (the op's arguments but the path)."""
    size: int
    durable: bool = False
    mode: int = FILE_MODE
    device: str | None = None
    ecc: str | None = None          # None: the daemon's default (config `ecc`)
    lease: bool = False
    session: Session | None = None
    metadata: dict | None = None


@dataclasses.dataclass
class NewAllocation:
    """check()'s answer when the name is free: where the allocation goes and what it takes."""
    parent: Directory
    missing: list[str]              # parent directories to make on the way
    name: str
    device: DeviceInfo
    capacity: int
    ecc: str
    entries: dict[bytes, bytes]     # user metadata, checked
    durable: bool = False           # asked for, or the directory's durable default


class Creation:
    def __init__(self, journal: Journal, namespace: Namespace, backend: PackedBackend,
                 custody: Custody, integrity: Integrity, holders: Holders, quotas: Quotas,
                 meta_bounds: usermeta.Bounds, default_ecc: str):
        """`default_ecc`: the ECC of creates that name none (config `ecc`)."""
        if default_ecc not in ECC_MODES:
            raise ValueError(f"invalid default ecc {default_ecc!r}: expected one of "
                             f"{', '.join(ECC_MODES)}")
        self.journal = journal
        self.ns = namespace
        self.backend = backend
        self.custody = custody
        self.integrity = integrity
        self.holders = holders
        self.quotas = quotas
        self.meta_bounds = meta_bounds
        self.default_ecc = default_ecc

    def check(self, path: str, cred: Credentials, request: Request) -> NewAllocation | Node:
        """create's checks: the existing node, or where a new allocation goes."""
        check_mode(request.mode)
        ecc = self.default_ecc if request.ecc is None else request.ecc
        if ecc not in ECC_MODES:
            raise UsageError(f"invalid ECC mode {ecc!r}: expected one of {', '.join(ECC_MODES)}")
        size = request.size
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise UsageError(f"invalid size {size!r}: must be a whole number of bytes >= 1")
        if request.lease and (request.durable or request.session is None):
            raise UsageError("a durable allocation cannot have a session lease"
                             if request.durable else "a lease needs a session")
        metadata = request.metadata
        entries = usermeta.entries(metadata) if metadata is not None else {}
        parts = split_path(path)
        parent, missing = self.ns.parent_for_new(parts, cred, parents=True)
        existing = parent.children.get(parts[-1]) if not missing else None
        if existing is not None:
            return existing
        require(parent, cred, W | X, "create entries in")
        dev = self.backend.device(request.device)
        capacity = self.backend.capacity_for(dev, size)     # a slot's class, or granules
        self.custody.require_could_fit(dev, size, ecc)
        self.quotas.check(cred.uid, capacity)
        if not self.backend.packs(capacity, dev):     # a slot holds no descriptor of its own
            self.custody.require_fds(cred.uid, ecc)   # (daemon/core/fdbudget.py)
        if entries:
            self.meta_bounds.check("/".join(parts), cred.uid, 0, usermeta.size_of(entries))
        durable = request.durable or (parent.durable and not request.lease)
        return NewAllocation(parent, missing, parts[-1], dev, capacity, ecc, entries, durable)

    def packed(self, new: NewAllocation) -> bool:
        """Whether the new allocation's memory will be a slot: its slab is kept already, so
        a durable create needs no keeper deposit of its own (NameVerbs.create)."""
        return self.backend.packs(new.capacity, new.device)

    def prepare(self, new: NewAllocation, path: str, cred: Credentials,
                request: Request) -> Prepared:
        """A durable allocation's memory, parity and id, before its row: the keeper takes its
        deposit (custody.handover) while the loop goes on."""
        return self.custody.prepare(self.ns.ids.reserve(len(new.missing) + 1), cred,
                                    request.mode, request.size, new.device, new.capacity,
                                    new.ecc, label=path)

    def make(self, new: NewAllocation, path: str, cred: Credentials, request: Request,
             prepared: Prepared | None = None) -> Allocation:
        """Allocate (or take `prepared`'s memory, which the keeper already holds), deposit
        when durable, commit. Missing parent directories are made (mode 0755), like
        `mkdir -p`, in the same transaction, as is the user metadata. Durable when asked,
        when its directory's default says so, or when `prepared` (the keeper holds it)."""
        size, lease = request.size, request.lease
        durable = new.durable or prepared is not None
        dev = new.device
        buf = prepared.alloc.buffer if prepared is not None else \
            self.custody.allocate(dev, size, new.capacity, new.ecc, label=path, uid=cred.uid)
        alloc = None
        try:
            with self.journal.change(durable=durable, batch=not durable and not new.missing):
                ids = prepared.dir_ids if prepared else None
                directory = self.ns.insert_dirs(new.parent, new.missing, cred, DIR_MODE,
                                                ids=ids if ids and len(ids) ==
                                                len(new.missing) else None)
                alloc = self.ns.insert_node(
                    Allocation, directory, new.name, cred, request.mode, size=size,
                    capacity=new.capacity, device=dev.uuid, durable=durable, state="ready",
                    ecc=new.ecc, buffer=buf, leased=lease,
                    node_id=prepared.alloc.id if prepared else None,
                    parity=prepared.alloc.parity if prepared else None)
                self.custody.bind(alloc)
                if new.entries:
                    self.ns.metadata.replace(alloc, new.entries)
                if prepared is None:
                    self.integrity.protect_new(alloc)
                    if durable:
                        self.custody.deposit(alloc)
                    if durable and not request.durable:
                        self.journal.on_commit(lambda: self._kept_only(alloc))
                self.journal.event("create", alloc, cred, size=size, capacity=new.capacity,
                                   device=dev.uuid, durable=durable, lease=lease,
                                   **({"metadata_keys": len(new.entries)} if new.entries
                                      else {}),
                                   **(request.session.origin.detail() if request.session
                                      else {}))
        except BaseException:     # the undo log took back the tree and any deposit
            if prepared is not None:
                self.custody.withdraw_quietly(prepared.alloc.id)
            self.custody.free_memory(buf)
            freed = alloc if alloc is not None else prepared.alloc if prepared else None
            if freed is not None:
                self.integrity.release(freed)
            raise
        if lease and request.session is not None:
            self.holders.add(alloc, request.session, "lease")
        return alloc

    def _kept_only(self, alloc: Allocation) -> None:
        """After the commit of an allocation made durable by its directory's default: a
        caller that went on to make it `restoring` in the same change (a refill of a missing
        name, daemon/verbs/refill.py) must leave the keeper without it until the restore
        ends (daemon/core/refills.py deposits it then), so that a crash meanwhile finds it
        lost rather than adopting its unfilled memory."""
        if not alloc.kept and not alloc.unlinked:
            self.custody.withdraw_quietly(alloc.id)
