"""Holders: who has an allocation open, and the lock between them.

A holder is one open handle (fd passing), one attachment (a client mapped the memory), one
lease (the allocation lives as long as its session), or one file open on the mount. Handles
and attachments take part in "one writer or many readers"; leases and mount files do not
(the mount follows POSIX: any number of opens). Every holder belongs to a session (one
client connection); its registry row is the post-mortem record of who held what.

What happens when the last holder goes (memory freed, a leased allocation released) is
daemon/core/lifecycle.py's: this module only keeps the records and the rule.
"""
from __future__ import annotations

import itertools
import time

from gpumemctl.protocol import Busy, NotFound

from ..registry import Registry
from . import containers
from .journal import Journal
from .nodes import WRITER_KINDS, Allocation, Holder
from .permissions import Credentials, administrative_uid
from .sessions import Session

# Holders that take part in "one writer or many readers": handles opened for I/O, and clients
# that mapped the memory (attach). Leases do not lock.
IO_KINDS = ("read", "write", "attach-r", "attach-w")
HANDLE_KINDS = {"r": "read", "rw": "write"}
ATTACH_KINDS = {"r": "attach-r", "rw": "attach-w"}
# Files open on the mount. They keep the memory of an unlinked file alive and count in the
# refcount, but take no part in the lock: the mount follows POSIX (any number of opens), and
# its handles hold no fd to the memory, so a resize under them is safe.
MOUNT_KINDS = ("mount-r", "mount-w")


class Holders:
    def __init__(self, registry: Registry, journal: Journal):
        self.registry = registry
        self.journal = journal
        self.sessions: dict[int, Session] = {}
        # Sessions that ended while their holders' release could not be committed (a full
        # state disk): they hold what they held, as memory and the registry agree, until
        # the next attempt releases it (HandleVerbs.settle_ended_sessions).
        self.ending: dict[int, Session] = {}
        self._ids = itertools.count(1)
        self.max_per_uid: int | None = None     # config max_handles_per_uid
        self.per_uid: dict[int, int] = {}       # holders (but the mount's) by uid

    # ---- sessions -----------------------------------------------------------------------
    def open_session(self, cred: Credentials, client: str = "",
                     pidfd: int | None = None) -> Session:
        """A new session; its client's cgroup is read now, once (`pidfd`: the peer's at
        connect, which vouches that the pid read is still that peer: containers.read)."""
        session = Session(cred=cred, client=client, origin=containers.read(cred.pid, pidfd))
        self.sessions[session.id] = session
        return session

    def end_session(self, session: Session) -> list[Holder]:
        """The session is over; returns what it still held, for the caller to release."""
        session.closed = True
        self.sessions.pop(session.id, None)
        return list(session.holders.values())

    def released(self, session: Session) -> None:
        """After an attempt to release what an ended session held: if something is left (its
        change failed), the session waits among `ending` for the next attempt."""
        if session.holders:
            self.ending[session.id] = session
        else:
            self.ending.pop(session.id, None)

    def unlinked_held(self) -> list[Allocation]:
        """Allocations removed while held open: their memory goes with the last holder, and
        until then it counts against the owner's quota (daemon/core/quotas.py)."""
        sessions = [*self.sessions.values(), *self.ending.values()]
        kept = {h.alloc.id: h.alloc for s in sessions
                for h in s.holders.values() if h.alloc.unlinked}
        return list(kept.values())

    def held_per_container(self, uid: int | None = None) -> list[dict]:
        """Per container that holds something: {runtime, id, pod, held_bytes, holders},
        held_bytes the capacity of the allocations with at least one holder in it (each
        counted once per container). `uid`: only that uid's holders."""
        held: dict[tuple[str, str, str], tuple[dict[int, int], list[int]]] = {}
        for session in [*self.sessions.values(), *self.ending.values()]:
            for h in session.holders.values():
                key = h.origin.key()
                if key is None or (uid is not None and h.uid != uid):
                    continue
                allocs, count = held.setdefault(key, ({}, [0]))
                allocs[h.alloc.id] = h.alloc.capacity or 0
                count[0] += 1
        return [{"runtime": k[0], "id": k[1], "pod": k[2], "held_bytes": sum(a.values()),
                 "holders": n[0]} for k, (a, n) in sorted(held.items())]

    # ---- the lock -----------------------------------------------------------------------
    @staticmethod
    def require_lockable(alloc: Allocation, writable: bool) -> None:
        """One writer or many readers: Busy if the request conflicts with a holder."""
        conflicting = alloc.holders_of(*(IO_KINDS if writable else WRITER_KINDS))
        if conflicting:
            raise Busy(f"'{alloc.path}' is locked: " + ", ".join(
                f"{h.kind} by pid {h.pid}" for h in conflicting))

    @staticmethod
    def require_no_others(alloc: Allocation, session: Session | None, what: str) -> None:
        """Busy if a handle or attachment outside `session` holds an fd to the memory."""
        others = [h for h in alloc.holders_of(*IO_KINDS)
                  if session is None or h.session is not session]
        if others:
            raise Busy(f"'{alloc.path}' is in use ({others[0].kind} by pid {others[0].pid}); "
                       f"it cannot be {what} now")

    @staticmethod
    def require_no_other_writer(alloc: Allocation, session: Session) -> None:
        others = [h for h in alloc.holders_of(*WRITER_KINDS) if h.session is not session]
        if others:
            raise Busy(f"'{alloc.path}' is being written ({others[0].kind} by pid "
                       f"{others[0].pid}); only that writer may seal it now")

    @staticmethod
    def busy_message(alloc: Allocation) -> str:
        users = ", ".join(f"{h.kind} by pid {h.pid}" for h in alloc.holders_of(*IO_KINDS))
        return f"'{alloc.path}' is busy ({users}); use --force to remove it anyway"

    # ---- records ------------------------------------------------------------------------
    @staticmethod
    def find(session: Session, holder_id: int, kinds, what: str) -> Holder:
        holder = session.holders.get(holder_id)
        if holder is None or holder.kind not in kinds:
            raise NotFound(f"no {what} {holder_id} in this session")
        return holder

    def add(self, alloc: Allocation, session: Session, kind: str,
            cred: Credentials | None = None) -> Holder:
        """A new holder, taken back if the change it is part of fails; its registry row is
        skipped for files open on the mount: a transaction per open(2) would halve the
        mount's create rate, and those handles all belong to the daemon's own session."""
        cred = cred or session.cred
        if kind not in MOUNT_KINDS:
            self._require_room(cred.uid)
        # The session's cgroup, or, for another pid (the mount's callers, each blocked in
        # its open(2) while this runs, so the pid is still theirs), that pid's, read now.
        origin = session.origin if cred.pid == session.cred.pid else containers.read(cred.pid)
        holder = Holder(id=next(self._ids), kind=kind, session=session, alloc=alloc,
                        pid=cred.pid, uid=cred.uid, since_ns=time.time_ns(), origin=origin)
        if kind in MOUNT_KINDS:
            self._link(holder)
        else:
            with self.journal.change(durable=False, batch=True):
                self.registry.holders.add(holder.id, alloc.id, session.id, kind, holder.pid,
                                         holder.uid, holder.since_ns)
                self._link(holder)
        self.journal.node_changed(alloc)
        return holder

    def _require_room(self, uid: int) -> None:
        """max_handles_per_uid: each open handle, attachment or lease is a registry row and
        memory in the daemon, so one user's are bounded; root and the daemon's uid are not."""
        limit, held = self.max_per_uid, self.per_uid.get(uid, 0)
        if limit is not None and held >= limit and not administrative_uid(uid):
            raise Busy(f"uid {uid} holds {held} handles, attachments and leases, the most one "
                       f"user may (max_handles_per_uid {limit}); close some first",
                       details={"uid": uid, "limit": limit})

    def drop(self, holder: Holder) -> None:
        """The record goes from the registry and from memory in one change (the caller's,
        if it is in one): if that fails, the holder stays in both."""
        if holder.kind in MOUNT_KINDS:
            self._unlink(holder)
        else:
            with self.journal.change(durable=False, batch=True):
                self.registry.holders.remove(holder.id)
                self._unlink(holder)
        self.journal.node_changed(holder.alloc)

    def drop_all(self, alloc: Allocation) -> None:
        for holder in list(alloc.holders.values()):
            self.drop(holder)

    def _link(self, holder: Holder) -> None:
        self._attach(holder)

        def undo() -> None:
            self._detach(holder)
        self.journal.on_rollback(undo)

    def _unlink(self, holder: Holder) -> None:
        if self._detach(holder):
            self.journal.on_rollback(lambda: self._attach(holder))

    def _attach(self, holder: Holder) -> None:
        holder.alloc.holders[holder.id] = holder
        holder.session.holders[holder.id] = holder
        if holder.kind not in MOUNT_KINDS:
            self.per_uid[holder.uid] = self.per_uid.get(holder.uid, 0) + 1

    def _detach(self, holder: Holder) -> bool:
        """Whether the holder was there to take away."""
        holder.session.holders.pop(holder.id, None)
        if holder.alloc.holders.pop(holder.id, None) is None:
            return False
        if holder.kind not in MOUNT_KINDS:
            left = self.per_uid[holder.uid] - 1
            if left:
                self.per_uid[holder.uid] = left
            else:
                del self.per_uid[holder.uid]
        return True
