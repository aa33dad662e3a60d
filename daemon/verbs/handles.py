"""The verbs of open handles, attachments, files open on the mount and client sessions. The
records and the lock are daemon/core/holders.py's; here is the order of steps around them: what a
close must encode, seal or free, and when.

The parity work of a close, a detach, a seal and a session's end is a plan's slow step
(daemon/verbs/plan.py): the first step names the work, a worker thread runs it, and the last
step finishes it, or runs it if no worker did. Between them the holder stays: the memory
stays, no other writer comes.
"""
from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING

from gpumemctl.protocol import GpumemError, PermissionDenied, UsageError

from ..backends.packed import PackedBackend
from ..backends.slabs import region
from ..core.custody import Custody, require_extents_mapped
from ..core.describe import describe
from ..core.holders import ATTACH_KINDS, HANDLE_KINDS, MOUNT_KINDS, Holders
from ..core.integrity import Integrity, ParityJob
from ..core.journal import Journal
from ..core.lifecycle import Lifecycle
from ..core.namespace import SEALED, Namespace
from ..core.nodes import MOVING, WRITER_KINDS, Allocation, Holder
from ..core.permissions import Credentials, R, W, allowed, require
from ..core.refills import Refills
from ..core.sessions import Session
from ..core.sizing import Sizing
from ..registry import Registry
from .plan import ParityWork, Plan, breathing

if TYPE_CHECKING:
    from gpumemctl.protocol.replies import Node as NodeInfo

log = logging.getLogger("gpumemd")


class HandleVerbs:
    def __init__(self, registry: Registry, journal: Journal, namespace: Namespace,
                 backend: PackedBackend, custody: Custody, integrity: Integrity, holders: Holders,
                 sizing: Sizing, lifecycle: Lifecycle, refills: Refills, *,
                 fds_to_readers: bool = False):
        """`fds_to_readers`: config cuda_fds_to_readers (_require_fd_for_reader)."""
        self.registry = registry
        self.journal = journal
        self.ns = namespace
        self.backend = backend
        self.custody = custody
        self.integrity = integrity
        self.holders = holders
        self.sizing = sizing
        self.lifecycle = lifecycle
        self.refills = refills
        self.fds_to_readers = fds_to_readers
        # The parity work of ended sessions whose release has not committed yet, by session
        # id and holder id (end_session): a later attempt need not encode it again.
        self._ending_jobs: dict[int, dict[int, ParityJob | None]] = {}

    # ---- sessions ---------------------------------------------------------------------------
    def open_session(self, cred: Credentials, client: str = "",
                     pidfd: int | None = None) -> Session:
        """`pidfd`: the peer's at connect (Connection.peer_pidfd), or None."""
        return self.holders.open_session(cred, client, pidfd)

    def end_session(self, session: Session) -> Plan[None]:
        """The connection ended (closed, or its process died): release what it held, in one
        change. The parity its writers need is encoded off the loop first; a job not run
        (the daemon stopping) runs in the last step. An attached writer that did not detach
        leaves its allocation unsealed.

        A session's end cannot be refused: the client is gone. If its change fails (a full
        state disk), the error is raised and nothing else changes: the session is closed,
        and what it held stays held, in memory and in the registry alike, until the next
        attempt releases it (settle_ended_sessions): any later session's end (each client
        that disconnects, each CLI command), any open (on the socket or the mount), attach,
        seal or revoke. Nothing stays held for good."""
        self.settle_ended_sessions()
        jobs = {h.id: self._parity_job(h) for h in list(session.holders.values())
                if h.kind == "write" and self.refills.of(h.id) is None}
        try:
            for job in jobs.values():
                yield ParityWork(job)
        finally:
            # In one step with the release: no other attempt (settle_ended_sessions) ever
            # meets this session while its parity work is under way.
            self.holders.end_session(session)
            self._ending_jobs[session.id] = jobs
            self._release_session(session)

    def settle_ended_sessions(self) -> None:
        """Release what ended sessions still hold because their release could not be
        committed (end_session). A failure again (the state disk still full) leaves them
        for the next attempt."""
        for session in list(self.holders.ending.values()):
            try:
                self._release_session(session)
            except Exception as exc:     # tried again at the next attempt
                log.warning("what an ended session of uid %d (pid %d) held is still held: "
                            "%s; tried again at the next attempt", session.cred.uid,
                            session.cred.pid, exc, exc_info=not isinstance(exc, GpumemError))
                return

    def _release_session(self, session: Session) -> None:
        """One change drops every holder of the ended session (a writer's parity and its
        WRITING mark, an attached writer's `unsealed` event, a leased allocation's release
        with it); memory nothing keeps is freed after its commit. A refill's handle gives
        up the restore (Refills.abort)."""
        try:
            self._release_held(session, self._ending_jobs.get(session.id, {}))
        finally:
            self.holders.released(session)
            if session.id not in self.holders.ending:
                self._ending_jobs.pop(session.id, None)

    def _release_held(self, session: Session, jobs: dict[int, ParityJob | None]) -> None:
        held = list(session.holders.values())
        refilling = [h for h in held if self.refills.of(h.id) is not None]
        plain = [h for h in held if self.refills.of(h.id) is None]
        writing = {h.id: (jobs[h.id] if h.id in jobs else self.integrity.job_all(h.alloc))
                   for h in plain if h.kind == "write" and not h.alloc.unlinked}
        for holder in plain:
            if holder.id in writing:
                _run(writing[holder.id])
                self.integrity.changed_all(holder.alloc)     # it never said what it wrote
            if holder.kind in WRITER_KINDS and not holder.alloc.unlinked:
                self.ns.watchers.data_changed(holder.alloc)  # whatever it wrote before it went
        if plain:
            with self.journal.change(durable=False, batch=True):
                for holder in plain:
                    alloc = holder.alloc
                    if holder.id in writing:
                        self._finish(writing[holder.id])
                    if holder.kind == "attach-w" and alloc.unsealed and not alloc.unlinked:
                        self.journal.event("unsealed", alloc, session.cred,
                                           **holder.origin.detail(), reason="the "
                                           "attached writer's session ended without detach")
                released = self.lifecycle.drop_holders(plain)
            self.lifecycle.free_released(released)
        for holder in refilling:                          # a restore that did not finish
            self.refills.abort(session, holder)

    # ---- handles and attachments (the socket) -------------------------------------------------
    def open(self, path: str, cred: Credentials, session: Session, mode: str,
             regions: bool = False, extents: bool = False):
        """Open for I/O by fd passing. Returns (holder, fds, info). One writer or many
        readers: a conflicting request is busy. `regions`: the client maps a region of
        what the fd holds (info's `region`), so an allocation in its owner's slab may stay
        there (docs/storage.md, "The export rule"). `extents`: the client maps memory made
        of several extents (one fd each, info's `extents`); without it, such memory is
        refused."""
        alloc, holder, fds = self._lock_and_export(path, cred, session, mode, HANDLE_KINDS,
                                                   "open", regions, extents)
        return holder, fds, self._with_region(describe(alloc, cred=cred), alloc)

    def attach(self, path: str, cred: Credentials, session: Session, mode: str,
               regions: bool = False, extents: bool = False):
        """Like open, for a client that maps the memory and keeps it mapped. Read-write
        makes the allocation `unsealed` until the writer detaches or seals: its parity
        cannot follow writes it does not see."""
        alloc, holder, fds = self._lock_and_export(path, cred, session, mode, ATTACH_KINDS,
                                                   "attach", regions, extents)
        # With its metadata: a tensor index read here is the one of the memory attached
        # (gpumemctl.tensors), whatever changes after. Attaching needs read permission.
        return holder, fds, self._with_region(
            describe(alloc, holders=True, metadata=True, cred=cred), alloc)

    def _with_region(self, info: NodeInfo, alloc: Allocation) -> NodeInfo:
        """The reply's info, with `region` ({offset, span}: where the allocation lies in
        the memory the fd holds) when the fd is its slab's."""
        where = region(alloc.buffer)
        if where is not None:
            info["region"] = where  # type: ignore[typeddict-unknown-key]
        return info

    def _lock_and_export(self, path: str, cred: Credentials, session: Session, mode: str,
                         kinds: dict, what: str, regions: bool = False,
                         extents: bool = False):
        """Permission, memory present, the lock; then a new fd, and in one change the holder
        of kinds[mode] with what a writer brings: a handle's WRITING mark, an attachment's
        `unsealed`. If that change fails, the fd is closed and nothing is left."""
        self.settle_ended_sessions()
        if mode not in ("r", "rw"):
            raise UsageError(f"invalid {what} mode {mode!r}: expected 'r' or 'rw'")
        alloc = self.ns.lookup_allocation(path, cred)
        writable = mode == "rw"
        require(alloc, cred, R | W if writable else R)
        if not writable:
            self._require_fd_for_reader(alloc, cred)
        self.custody.require_memory(alloc)
        if alloc.damaged:     # a mapping cannot fail a range: refuse the whole allocation
            self.integrity.require_undamaged(alloc, 0, alloc.size or 0)
        self.holders.require_lockable(alloc, writable)
        if writable:    # its close encodes what it declares: the mount's writes are settled
            self.sizing.pending.settle_near(alloc)
        if not (regions and self.sizing.shares_slab_with(alloc, cred.uid)):
            self.sizing.own_memory(alloc)  # another's slab never: the slot moves out first
        require_extents_mapped(alloc, extents, what)
        kind = kinds[mode]
        fds = self.backend.export_all(alloc.buffer, writable)
        try:
            with self.journal.change(durable=False, batch=True):
                if kind == "write":
                    self.journal.keep(alloc, "writing")
                    self.integrity.writes_begin(alloc)  # the client writes through its fd
                holder = self.holders.add(alloc, session, kind)
                if kind == "attach-w":
                    self.journal.keep(alloc, "unsealed")
                    self.integrity.unseal(alloc)     # its parity cannot follow its writes
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        if kind == "attach-w":
            self.integrity.changed_all(alloc)        # it may write anywhere, unseen
        return alloc, holder, fds

    def _require_fd_for_reader(self, alloc: Allocation, cred: Credentials) -> None:
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

    def close(self, session: Session, holder_id: int, *, written: dict | None = None,
              restored: dict | None = None) -> Plan[dict]:
        """Op `close`. A handle that wrote has its parity encoded off the loop while it is
        still held. A refill's handle (daemon/core/refills.py) finishes the restore with
        `restored`, and gives it up without. A handle revoked meanwhile answers quietly."""
        if holder_id in session.revoked:
            return {"revoked": True}
        holder = self._handle(session, holder_id)
        if self.refills.of(holder.id) is not None and restored is None:
            self.refills.abort(session, holder)          # the restore gave up: lost again
            return {}
        job = self._parity_job(holder, written)
        yield ParityWork(job)
        if self.refills.of(holder.id) is not None:
            self.integrity.finish(job)
            damaged = (restored or {}).get("damaged", [])
            return {"info": self.refills.finish(session, holder, damaged,
                                                (restored or {}).get("modified_ns"))}
        self._close_handle(session, holder_id, written, job)
        return {}

    def _close_handle(self, session: Session, holder_id: int, written: dict | None,
                      job: ParityJob | None) -> None:
        """The parity first, then one change: the WRITING mark gone, the times a writer
        moved, its `write` event and the holder; memory nothing keeps freed after it."""
        holder = self._handle(session, holder_id)
        alloc = holder.alloc
        wrote = holder.kind == "write" and not alloc.unlinked
        if wrote:      # the bytes changed whatever becomes of the close: said at once
            self.integrity.note_close_written(alloc, written)
            self.ns.watchers.data_changed(alloc)  # written through its fd: the mount's cache goes
            _run(job)
        with self.journal.change(durable=False, batch=True):
            if wrote:
                self._finish(job)
            if wrote and written:
                with self.journal.change(durable=False):    # committed with it, at once
                    self.journal.keep(alloc, "modified_ns", "changed_ns", "let_go")
                    _stamp_written(alloc)
                    self.registry.nodes.update(alloc.id, modified_ns=alloc.modified_ns,
                                              changed_ns=alloc.changed_ns)
                    self.journal.event("write", alloc, session.cred, **written)
            released = self.lifecycle.drop_holders([holder])
        self.lifecycle.free_released(released)

    def _handle(self, session: Session, holder_id: int) -> Holder:
        return self.holders.find(session, holder_id, HANDLE_KINDS.values(), "open handle")

    def _finish(self, job: ParityJob | None) -> None:
        """Integrity.finish within the caller's change, run already (_run): the dirty range,
        the WRITING mark and the damage it clears come back if that change fails."""
        if job is not None:
            self.journal.keep(job.alloc, "writing", "dirty_from", "dirty_to", "damaged",
                              "state")
        self.integrity.finish(job)

    def _parity_job(self, holder: Holder, written: dict | None = None) -> ParityJob | None:
        """The parity work that releasing `holder` brings (close, release_mount,
        end_session); a writer's data changed by now (_let_go)."""
        if holder.alloc.unlinked:
            return None
        if holder.kind == "write":
            _let_go(holder.alloc)
            return self.integrity.job_all(holder.alloc, written)
        if holder.kind == "mount-w":
            self.sizing.flush_times(holder.alloc)
            return self.integrity.job_written(holder.alloc)
        return None

    def detach(self, session: Session, holder_id: int) -> Plan[dict]:
        """The client unmapped: release its holder; a writer's detach seals (its parity
        encoded off the loop). A revoked attachment answers quietly."""
        if holder_id in session.revoked:
            return {"info": None, "revoked": True}
        holder = self._attachment(session, holder_id)
        job = None
        if holder.kind == "attach-w":
            _let_go(holder.alloc)
            job = self.integrity.job_seal(holder.alloc)
        yield ParityWork(job)
        holder = self._attachment(session, holder_id)
        alloc = holder.alloc
        seals = holder.kind == "attach-w" and not alloc.unlinked
        if seals:
            self._encode_seal(alloc, job)
        with self.journal.change(durable=False, batch=True):     # the seal and the holder
            if seals:
                self._commit_seal(alloc, session.cred, "detach", session)
            released = self.lifecycle.drop_holders([holder])
        self.lifecycle.free_released(released)
        if seals:
            self.ns.watchers.data_changed(alloc)
        return {"info": describe(alloc, cred=session.cred)}

    def _attachment(self, session: Session, holder_id: int) -> Holder:
        return self.holders.find(session, holder_id, ATTACH_KINDS.values(), "attachment")

    def seal(self, path: str, cred: Credentials, session: Session) -> Plan[NodeInfo]:
        """Declare the data written by an attached writer complete. The writer itself may
        seal while attached; anyone with write permission may seal an allocation whose
        writer is gone (it crashed: the allocation stays unsealed until then)."""
        alloc = self._sealable(path, cred, session)
        _let_go(alloc)
        job = self.integrity.job_seal(alloc)
        yield ParityWork(job)
        alloc = self._sealable(path, cred, session)
        self._encode_seal(alloc, job)
        self._commit_seal(alloc, cred, "seal", session)
        self.ns.watchers.data_changed(alloc)  # what the writer wrote is what readers get now
        return describe(alloc, holders=True, cred=cred)

    def _sealable(self, path: str, cred: Credentials, session: Session) -> Allocation:
        self.settle_ended_sessions()       # a crashed writer's end, if it could not commit
        alloc = self.ns.lookup_allocation(path, cred)
        require(alloc, cred, R | W)
        self.holders.require_no_other_writer(alloc, session)
        return alloc

    def _encode_seal(self, alloc: Allocation, job: ParityJob | None) -> None:
        """Before a seal's change: the parity of all the data. `job`: the first step's, run
        meanwhile (for another allocation, if the name was given to one meanwhile: then it
        is encoded here)."""
        if alloc.unsealed:
            self.integrity.encode_sealed(alloc, job if job and job.alloc is alloc else None)

    def _commit_seal(self, alloc: Allocation, cred: Credentials, reason: str,
                     session: Session) -> None:
        """The seal recorded (in the caller's change, if it is in one); its event names
        the session's container."""
        if alloc.unsealed:
            with self.journal.change(durable=alloc.durable):
                self.journal.keep(alloc, "unsealed", "modified_ns", "changed_ns", "let_go")
                alloc.unsealed = False
                _stamp_written(alloc)
                self.registry.nodes.update(alloc.id, modified_ns=alloc.modified_ns,
                                          changed_ns=alloc.changed_ns, unsealed=SEALED)
                self.journal.event("seal", alloc, cred, reason=reason,
                                   **session.origin.detail())

    def revoke_readers(self, alloc: Allocation, cred: Credentials, session: Session
                       ) -> list[dict]:
        """`gpumemctl revoke`: drop the read handles and read-only attachments of every other
        session, so that a reader that never lets go no longer blocks the owner's writes
        (the caller checked it is the owner or the administrator). The readers' mappings
        stay valid (no backend can take a mapping back) and see what is written from now;
        their close or detach then answers quietly. Writers are not revoked: writes the
        daemon no longer tracks would leave the parity wrong (docs/security.md)."""
        self.settle_ended_sessions()
        readers = [h for h in alloc.holders_of("read", "attach-r") if h.session is not session]
        if not readers:
            return []
        with self.journal.change(durable=False):          # all of them, or none
            for holder in readers:
                holder.session.revoked.add(holder.id)
            self.journal.on_rollback(lambda: _unrevoke(readers))
            released = self.lifecycle.drop_holders(readers)
            self.journal.event("revoke", alloc, cred, holders=len(readers))
        self.lifecycle.free_released(released)
        return [holder.to_dict() for holder in readers]

    def export_dmabuf(self, path: str, cred: Credentials) -> tuple[int, NodeInfo]:
        """A dma-buf fd of the whole capacity, for RDMA registration. A NIC may read and
        write it, so it needs read and write permission. It is not a holder: it bypasses
        the one-writer lock, like any RDMA registration (docs/cuda.md)."""
        alloc = self.ns.lookup_allocation(path, cred)
        require(alloc, cred, R | W)
        self.custody.require_memory(alloc)
        self.sizing.own_memory(alloc)      # a slot's dma-buf would cover its whole slab
        fd = self.backend.export_dmabuf(alloc.buffer)
        alloc.untracked = True      # a NIC may write it at any time: no change is seen
        return fd, describe(alloc, cred=cred)

    def changes(self, session: Session, holder_id: int, reset: bool) -> dict:
        """Op `changes`: what changed since the allocation's last reset, asked under a read
        handle of this session, so that no writer can come between the answer and the
        snapshot's read (Integrity.take_changes)."""
        holder = self.holders.find(session, holder_id, ("read",), "read handle")
        return self.integrity.take_changes(holder.alloc, reset)

    # ---- files open on the mount ----------------------------------------------------------------
    def open_mount(self, alloc: Allocation, cred: Credentials, session: Session,
                   writable: bool) -> Holder:
        """open(2) on the mount. The kernel has checked the permission (default_permissions);
        a lost allocation cannot be opened (EIO), a pending one can (it gets memory when
        written or truncated)."""
        if alloc.state == "lost" or (writable and alloc.state in MOVING):
            self.custody.require_memory(alloc)      # asleep: read-only opens only
        self.settle_ended_sessions()
        return self.holders.add(alloc, session, MOUNT_KINDS[writable], cred)

    def release_mount(self, holder: Holder) -> Plan[None]:
        """close(2) of the last descriptor of a mount handle. A handle that wrote syncs, its
        parity encoded off the loop; the last writer gives back capacity left spare by write
        growth (one device copy). A small file's parity is left to the pass that encodes
        each block once for all the files closed in it (settle_parity). The holder goes
        whatever happens."""
        alloc = holder.alloc
        try:
            if holder.kind == "mount-w" and self.sizing.pending.accepts(alloc):
                # (in a slot: no capacity left spare by growth, nothing to trim)
                self.sizing.flush_times(alloc)
                self.sizing.pending.add(alloc)
                return
            job = self._parity_job(holder)
            yield ParityWork(job)
            if holder.kind == "mount-w" and not alloc.unlinked:
                self.sizing.flush_written(alloc, job)
                if len(alloc.holders_of("mount-w")) == 1:
                    self.sizing.trim(alloc)
        finally:
            self.lifecycle.remove_holder(holder)

    def settle_parity(self) -> Plan[int]:
        """The pass over the parity that mount closes left (release_mount): each block
        encoded once, its files settled, in pieces between which the loop serves (the
        mount's timer, and its stop). Returns how many stay pending (a writer has the
        file open again: its close comes)."""
        yield from breathing(self.sizing.pending.steps())
        return len(self.sizing.pending)


def _unrevoke(holders: list[Holder]) -> None:
    """A revoke's change failed: its readers are not revoked after all."""
    for holder in holders:
        holder.session.revoked.discard(holder.id)


def _run(job: ParityJob | None) -> None:
    """A job no worker ran (or one that failed there), run here before its change opens."""
    if job is not None and not job.done:
        job.run()


# ---- the time a writer's data changed, for a commit made after work off the loop ----------
def _let_go(alloc: Allocation) -> None:
    """The first step of a writer's close, detach or seal: its data changed by now."""
    alloc.let_go = (time.time_ns(), alloc.modified_ns)


def _stamp_written(alloc: Allocation) -> None:
    """The last step: the modification time is the first step's, not this later moment's,
    and a time set between the steps (utimensat) stays (issue 24: a commit after the work
    stamped over it). Without a first step (a name given to another allocation meanwhile),
    now."""
    step_one, alloc.let_go = alloc.let_go, None
    let_go, modified_then = step_one or (time.time_ns(), alloc.modified_ns)
    if alloc.modified_ns == modified_then:
        alloc.modified_ns = let_go
    alloc.changed_ns = max(alloc.changed_ns, let_go)

