"""The verbs of open handles, attachments, files open on the mount and client sessions: a
part of the AllocationManager façade (daemon/manager.py has the verbs that change names,
memory and durability; daemon/queries.py the read-only queries). The records and the lock
are daemon/holders.py's; here is the order of steps around them: what a close must encode,
seal or free, and when.

Parity work of a close runs off the event loop where the caller can wait (daemon/offload.py):
step one (parity_job, session_jobs) names the work, a worker thread runs it, and step two
(close_handle, release_mount, close_session with the job) finishes it, or runs it if no
worker did. Between the steps the holder stays: the memory stays, no other writer comes.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable

from gpumemctl.protocol import PermissionDenied, UsageError, round_up

from .backends import Backend
from .custody import Custody
from .describe import describe
from .holders import ATTACH_KINDS, HANDLE_KINDS, IO_KINDS, MOUNT_KINDS, Holders
from .integrity import Integrity, ParityJob
from .journal import Journal
from .namespace import DAEMON, NOW, SEALED, Namespace
from .nodes import WRITER_KINDS, Allocation, Holder
from .permissions import Credentials, R, W, allowed, require
from .registry import Registry
from .sessions import Session


class HandleVerbs:
    # Set by AllocationManager.__init__, and the verbs of daemon/manager.py used here.
    registry: Registry
    backend: Backend
    fds_to_readers: bool            # config cuda_fds_to_readers
    journal: Journal
    ns: Namespace
    integrity: Integrity
    custody: Custody
    holders: Holders
    resize: Callable[..., Allocation]
    setattr: Callable[..., object]
    sync: Callable[..., None]
    sync_job: Callable[[Allocation], ParityJob | None]
    read_at: Callable[..., bytes]
    _protect_resized: Callable[..., None]
    _refills: dict
    abort_refill: Callable[..., None]

    def parity_job(self, holder: Holder) -> ParityJob | None:
        """The parity work that releasing `holder` brings (close_handle, release_mount,
        close_session)."""
        if holder.alloc.unlinked:
            return None
        if holder.kind == "write":
            self._let_go(holder.alloc)
            return self.integrity.job_all(holder.alloc)
        return self.sync_job(holder.alloc) if holder.kind == "mount-w" else None

    def changes(self, session: Session, holder_id: int, reset: bool) -> dict:
        """Op `changes`: what changed since the allocation's last reset, asked under a read
        handle of this session, so that no writer can come between the answer and the
        snapshot's read (Integrity.take_changes)."""
        holder = self.holders.find(session, holder_id, ("read",), "read handle")
        return self.integrity.take_changes(holder.alloc, reset)

    def handle(self, session: Session, holder_id: int) -> Holder:
        """An open handle of this session (for close's step one)."""
        return self.holders.find(session, holder_id, HANDLE_KINDS.values(), "open handle")

    # ---- holders: handles, attachments, mount files, sessions ----------------------------
    def open(self, path: str, cred: Credentials, session: Session, mode: str):
        """Open for I/O by fd passing. Returns (holder, fd, info). One writer or many
        readers: a conflicting request is busy."""
        alloc, holder, fd = self._lock_and_export(path, cred, session, mode, HANDLE_KINDS,
                                                  "open")
        return holder, fd, describe(alloc, cred=cred)

    def attach(self, path: str, cred: Credentials, session: Session, mode: str):
        """Like open, for a client that maps the memory and keeps it mapped. Read-write
        makes the allocation `unsealed` until the writer detaches or seals: its parity
        cannot follow writes it does not see."""
        alloc, holder, fd = self._lock_and_export(path, cred, session, mode, ATTACH_KINDS,
                                                  "attach")
        if mode == "rw":
            self.integrity.unseal(alloc)
        # With its metadata: a tensor index read here is the one of the memory attached
        # (gpumemctl.tensors), whatever changes after. Attaching needs read permission.
        return holder, fd, describe(alloc, holders=True, metadata=True, cred=cred)

    def _lock_and_export(self, path: str, cred: Credentials, session: Session, mode: str,
                         kinds: dict, what: str):
        """Permission, memory present, the lock; then a new fd and a holder of kinds[mode]."""
        if mode not in ("r", "rw"):
            raise UsageError(f"invalid {what} mode {mode!r}: expected 'r' or 'rw'")
        alloc = self.ns.lookup_allocation(path, cred)
        writable = mode == "rw"
        require(alloc, cred, R | W if writable else R)
        if not writable:
            self.require_fd_for_reader(alloc, cred)
        self.custody.require_memory(alloc)
        if alloc.damaged:     # a mapping cannot fail a range: refuse the whole allocation
            self.integrity.require_undamaged(alloc, 0, alloc.size or 0)
        self.holders.require_lockable(alloc, writable)
        if writable and kinds[mode] == "write":
            self.integrity.writes_begin(alloc)   # the client writes through its fd from now
        if writable and kinds[mode] == "attach-w":
            self.integrity.changed_all(alloc)    # it may write anywhere, unseen
        fd = self.backend.export(alloc.buffer, writable)
        try:
            holder = self.holders.add(alloc, session, kinds[mode])
        except BaseException:
            os.close(fd)
            raise
        return alloc, holder, fd

    def revoke_readers(self, alloc: Allocation, cred: Credentials, session: Session
                       ) -> list[dict]:
        """`gpumemctl revoke`: drop the read handles and read-only attachments of every other
        session, so that a reader that never lets go no longer blocks the owner's writes
        (the caller checked it is the owner or the administrator). The readers' mappings
        stay valid (no backend can take a mapping back) and see what is written from now;
        their close or detach then answers quietly. Writers are not revoked: writes the
        daemon no longer tracks would leave the parity wrong (docs/security.md)."""
        revoked = []
        for holder in alloc.holders_of("read", "attach-r"):
            if holder.session is session:
                continue
            revoked.append(holder.to_dict())
            holder.session.revoked.add(holder.id)
            self._remove_holder(holder)
        if revoked:
            with self.journal.change(durable=False):
                self.journal.event("revoke", alloc, cred, holders=len(revoked))
        return revoked

    @staticmethod
    def was_revoked(session: Session, holder_id: int) -> bool:
        return holder_id in session.revoked

    def detach_job(self, session: Session, holder_id: int) -> ParityJob | None:
        """Step one of detach: the parity a writer's detach encodes."""
        holder = self.holders.find(session, holder_id, ATTACH_KINDS.values(), "attachment")
        if holder.kind != "attach-w":
            return None
        self._let_go(holder.alloc)
        return self.integrity.job_seal(holder.alloc)

    def detach(self, session: Session, holder_id: int, *, parity: ParityJob | None = None,
               planned: bool = False) -> dict:
        """The client unmapped: release its holder; a writer's detach seals."""
        holder = self.holders.find(session, holder_id, ATTACH_KINDS.values(), "attachment")
        alloc = holder.alloc
        if holder.kind == "attach-w" and not alloc.unlinked:
            self._seal(alloc, session.cred, "detach", parity, planned)
            self.ns.data_changed(alloc)
        self._remove_holder(holder)
        return describe(alloc, cred=session.cred)

    def seal_job(self, path: str, cred: Credentials, session: Session) -> ParityJob | None:
        """Step one of seal: its checks, and the parity it encodes."""
        alloc = self._sealable(path, cred, session)
        self._let_go(alloc)
        return self.integrity.job_seal(alloc)

    def seal(self, path: str, cred: Credentials, session: Session, *,
             parity: ParityJob | None = None, planned: bool = False) -> dict:
        """Declare the data written by an attached writer complete. The writer itself may
        seal while attached; anyone with write permission may seal an allocation whose
        writer is gone (it crashed: the allocation stays unsealed until then)."""
        alloc = self._sealable(path, cred, session)
        self._seal(alloc, cred, "seal", parity, planned)
        self.ns.data_changed(alloc)           # what the writer wrote is what readers get now
        return describe(alloc, holders=True, cred=cred)

    def _sealable(self, path: str, cred: Credentials, session: Session) -> Allocation:
        alloc = self.ns.lookup_allocation(path, cred)
        require(alloc, cred, R | W)
        self.holders.require_no_other_writer(alloc, session)
        return alloc

    def _seal(self, alloc: Allocation, cred: Credentials, reason: str,
              job: ParityJob | None = None, planned: bool = False) -> None:
        """`planned`: `job` is step one's (detach_job, seal_job), run meanwhile."""
        if alloc.unsealed:
            self.integrity.encode_sealed(alloc, job if planned else None)
            with self.journal.change(durable=alloc.durable):
                self.journal.keep(alloc, "unsealed", "modified_ns", "changed_ns")
                alloc.unsealed = False
                self._stamp_written(alloc, planned)
                self.registry.update_node(alloc.id, modified_ns=alloc.modified_ns,
                                          changed_ns=alloc.changed_ns, unsealed=SEALED)
                self.journal.event("seal", alloc, cred, reason=reason)

    def require_fd_for_reader(self, alloc: Allocation, cred: Credentials) -> None:
        """Where an fd lets its holder write (Backend.fd_grants_write: cuda), a caller gets
        one only with write permission, unless the administrator trusts readers with it
        (config cuda_fds_to_readers). A reader gets the bytes by copy instead: the `read`
        request (what `gpumemctl read` falls back to) or the mount (docs/security.md)."""
        if not self.backend.fd_grants_write or self.fds_to_readers or allowed(alloc, cred, W):
            return
        raise PermissionDenied(
            f"permission denied: on the {self.backend.name} backend a descriptor of "
            f"'{alloc.path}' would let uid {cred.uid} write it, and uid {cred.uid} may only "
            "read it: read it by copy (gpumemctl read, the mount), or open it with write "
            "permission (docs/security.md)", details={"errno": "EACCES", "by_copy": True})

    def copy_out(self, path: str, cred: Credentials, offset: int, length: int) -> bytes:
        """The `read` request: up to `length` bytes at `offset` by copy (clipped to the size),
        for a caller with read permission; no fd, no holder (as the mount reads)."""
        alloc = self.ns.lookup_allocation(path, cred)
        require(alloc, cred, R)
        self.custody.require_memory(alloc)
        if offset < 0 or length < 0:
            raise UsageError(f"invalid read range: offset {offset}, length {length}: "
                             "expected offsets and lengths of 0 or more")
        length = max(0, min(offset + length, alloc.size or 0) - offset)
        if alloc.damaged and length:
            self.integrity.require_undamaged(alloc, offset, length)
        return self.read_at(alloc, offset, length)

    def export_dmabuf(self, path: str, cred: Credentials) -> tuple[int, dict]:
        """A dma-buf fd of the whole capacity, for RDMA registration. A NIC may read and
        write it, so it needs read and write permission. It is not a holder: it bypasses
        the one-writer lock, like any RDMA registration (docs/cuda.md)."""
        alloc = self.ns.lookup_allocation(path, cred)
        require(alloc, cred, R | W)
        self.custody.require_memory(alloc)
        fd = self.backend.export_dmabuf(alloc.buffer)
        alloc.untracked = True      # a NIC may write it at any time: no change is seen
        return fd, describe(alloc, cred=cred)

    def close_handle(self, session: Session, holder_id: int, *, written: dict | None = None,
                     parity: ParityJob | None = None, planned: bool = False):
        holder = self.handle(session, holder_id)
        alloc = holder.alloc
        if holder.kind == "write" and not alloc.unlinked:
            self.integrity.finish(parity if planned else self.integrity.job_all(alloc))
            self.integrity.note_close_written(alloc, written)
            self.ns.data_changed(alloc)       # written through its fd: the mount's cache goes
            if written:
                with self.journal.change(durable=False):
                    self.journal.keep(alloc, "modified_ns", "changed_ns")
                    self._stamp_written(alloc, planned)
                    self.registry.update_node(alloc.id, modified_ns=alloc.modified_ns,
                                              changed_ns=alloc.changed_ns)
                    self.journal.event("write", alloc, session.cred, **written)
        self._remove_holder(holder)

    def open_mount(self, alloc: Allocation, cred: Credentials, session: Session,
                   writable: bool) -> Holder:
        """open(2) on the mount. The kernel has checked the permission (default_permissions);
        a lost allocation cannot be opened (EIO), a pending one can (it gets memory when
        written or truncated)."""
        if alloc.state == "lost":
            self.custody.require_memory(alloc)
        return self.holders.add(alloc, session, MOUNT_KINDS[writable], cred)

    def truncate_on_open(self, alloc: Allocation, cred: Credentials,
                         session: Session) -> None:
        """open(2) with O_TRUNC: truncate(2) to 0 (the kernel checked write permission).
        POSIX moves mtime and ctime even when it was empty."""
        before = alloc.modified_ns
        self.resize(alloc, cred, 0, session=session, authorised=True)
        if alloc.modified_ns == before:            # it was empty: nothing changed
            self.setattr(alloc.id, cred, mtime_ns=NOW, authorised=True)

    def release_mount(self, holder: Holder, *, parity: ParityJob | None = None,
                      planned: bool = False) -> None:
        """close(2) of the last descriptor of a mount handle. A handle that wrote syncs; the
        last writer gives back capacity left spare by write growth (one device copy)."""
        alloc = holder.alloc
        try:
            if holder.kind == "mount-w" and not alloc.unlinked:
                self.sync(alloc, parity=parity, planned=planned)
                if len(alloc.holders_of("mount-w")) == 1:
                    self._trim(alloc)
        finally:
            self._remove_holder(holder)

    def _trim(self, alloc: Allocation) -> None:
        if alloc.state != "ready" or alloc.holders_of(*IO_KINDS):
            return      # a socket client holds an fd to this memory: keep it
        dev = self.backend.device(alloc.device)
        fit = max(dev.granularity, round_up(alloc.size, dev.granularity))
        if (alloc.capacity or 0) > fit:
            self.custody.reallocate(alloc, dev, alloc.size, fit,
                                    lambda: self._commit_capacity(alloc, fit))
            self._protect_resized(alloc, alloc.size, fresh=False)

    def _commit_capacity(self, alloc: Allocation, capacity: int) -> None:
        """Record a trimmed capacity. The bytes and the size are what they were, so no time
        moves: this runs after a close's parity work, and a time set meanwhile (tar's and
        `rsync -a`'s utimensat right after close) must stay (issue 24)."""
        with self.journal.change(durable=alloc.durable, batch=not alloc.durable):
            self.journal.keep(alloc, "capacity")
            alloc.capacity = capacity
            self.registry.update_node(alloc.id, capacity=capacity, device=alloc.device,
                                      state=alloc.state)
            self.journal.event("resize", alloc, DAEMON, size=alloc.size, capacity=capacity,
                               old_size=alloc.size)
        self.integrity.changed_all(alloc)      # new memory: what tracked changes say goes
        self.ns.attrs_changed(alloc)

    # ---- the time a writer's data changed, for a commit made after work off the loop ----
    @staticmethod
    def _let_go(alloc: Allocation) -> None:
        """Step one of a writer's close, detach or seal: its data changed by now."""
        alloc.let_go = (time.time_ns(), alloc.modified_ns)

    @staticmethod
    def _stamp_written(alloc: Allocation, planned: bool) -> None:
        """Step two (`planned`: after step one, whose parity work ran meanwhile): the
        modification time is step one's, not this later moment's, and a time set between
        the steps (utimensat) stays (issue 24: a commit after the work stamped over it)."""
        step_one, alloc.let_go = alloc.let_go if planned else None, None
        let_go, modified_then = step_one or (time.time_ns(), alloc.modified_ns)
        if alloc.modified_ns == modified_then:
            alloc.modified_ns = let_go
        alloc.changed_ns = max(alloc.changed_ns, let_go)

    def _remove_holder(self, holder: Holder) -> None:
        """Drop a holder; free the memory if that was the last thing keeping it."""
        self.holders.drop(holder)
        alloc = holder.alloc
        if alloc.holders:
            return
        if alloc.unlinked:
            self.custody.free(alloc)
        elif alloc.leased and not alloc.durable:
            with self.journal.change(durable=False):
                self.ns.forget(alloc)
                self.journal.event("release", alloc, None,
                                   reason="last holder of a leased allocation is gone")
            alloc.unlinked = True
            self.custody.free(alloc)

    def session_jobs(self, session: Session) -> dict[int, ParityJob | None]:
        return {h.id: self.parity_job(h) for h in list(session.holders.values())
                if h.kind == "write"}

    def open_session(self, cred: Credentials, client: str = "") -> Session:
        return self.holders.open_session(cred, client)

    def close_session(self, session: Session,
                      parity: dict[int, ParityJob | None] | None = None) -> None:
        """The connection ended (closed, or its process died): release what it held. An
        attached writer that did not detach leaves its allocation unsealed. `parity`:
        session_jobs()'s jobs, by holder id, run meanwhile on worker threads."""
        planned = parity or {}
        for holder in self.holders.end_session(session):
            alloc = holder.alloc
            if holder.id in self._refills:      # a restore that did not finish
                self.abort_refill(session, holder)
                continue
            if holder.kind == "write" and not alloc.unlinked:
                self.integrity.finish(planned[holder.id] if holder.id in planned
                                      else self.integrity.job_all(alloc))
                self.integrity.changed_all(alloc)    # it never said what it wrote
            if holder.kind in WRITER_KINDS and not alloc.unlinked:
                self.ns.data_changed(alloc)   # whatever it wrote before it went
            if holder.kind == "attach-w" and alloc.unsealed and not alloc.unlinked:
                with self.journal.change(durable=False):
                    self.journal.event("unsealed", alloc, session.cred, reason="the attached "
                                       "writer's session ended without detach")
            self._remove_holder(holder)
