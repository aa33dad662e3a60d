"""The socket transport: the listening socket, peer credentials, framed I/O on a connection.

Nothing here knows an op. The listener accepts connections and starts one task per
connection that ConnectionLimits admits; a `Connection` reads request frames (at
most framing.MAX_REQUEST_BYTES, at most framing.MAX_FDS_PER_FRAME fds: framing.py refuses
more with a ProtocolError) and writes answers, errors and the extra frames of streams and
progress (docs/protocol.md, "Frames").
"""
from __future__ import annotations

import errno
import logging
import os
import socket
import struct
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import trio

from gpumemctl.protocol import Busy, GpumemError, ProtocolError, UsageError, framing

from ..config import DEFAULT_MAX_CONNECTION_RATE_PER_UID
from ..core.permissions import Credentials, peer_groups
from ..logbudget import acting_for
from ..paths import bind_unix
from .limits import MinuteWarning, OpenRate, RefusalAnswers

log = logging.getLogger("gpumemd")

# Anyone may connect; each request is authorised by its peer credentials (docs/protocol.md).
SOCKET_MODE = 0o666
# What a send to a peer that has gone away raises, mid-frame or before it.
# (SendRefused is an OSError: a connection closed for the send limits reads as gone.)
PEER_GONE = (OSError, trio.BrokenResourceError, trio.ClosedResourceError)
PEERCRED_SIZE = struct.calcsize("3i")         # struct ucred: pid, uid, gid
SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)   # Linux >= 6.5: a pidfd of the peer


def peer_credentials(sock: trio.socket.SocketType) -> Credentials:
    """Who the peer was at connect(): pid, uid and gid (SO_PEERCRED) and its supplementary
    groups (SO_PEERGROUPS), never what /proc says of that pid later (daemon/core/permissions.py)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEERCRED_SIZE)
    pid, uid, gid = struct.unpack("3i", raw)
    return Credentials(pid=pid, uid=uid, gid=gid, groups=peer_groups(sock, pid))


# accept() failing for want of file descriptors or memory: wait and try again, never stop.
OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
BACKOFF_FIRST, BACKOFF_MAX = 0.01, 1.0
# A refused connection hears why (one error frame) if it asks within this long; at most
# REFUSING of them wait at once, and RefusalAnswers of each uid (limits.py); the rest are
# closed at once.
REFUSAL_WAIT, REFUSING = 1.0, 64
# The listen queue's length, and how many connections are taken off it at a time before the
# other tasks run again. While more than CHURN_DROPS connections a second are refused
# unanswered (a user connecting and hanging up in a loop), the queue is CHURN_BACKLOG long,
# so that a connect() waits behind that many at most; CALM_SECONDS after the last such
# second it is BACKLOG again, where a burst of clients queues without waiting in connect()
# (Acceptor; bench/churn.py measured these: root's p99 went from 234 ms to 9 ms).
BACKLOG = socket.SOMAXCONN
ACCEPT_BATCH = 16
CHURN_BACKLOG, CHURN_DROPS, CALM_SECONDS = 128, 256, 10.0
# What gpumemd sends (docs/protocol.md, "Limits"): an answer's JSON is at most
# MAX_ANSWER_BYTES (a larger one is answered with a usage error that says so); the frames
# one user's connections have not yet taken are at most SEND_BUDGET_PER_UID bytes together
# (a connection whose frame would pass it is closed), and a frame the peer takes no byte of
# for SEND_STALL_SECONDS closes its connection. So clients that never read cannot make the
# daemon hold their answers without bound.
MAX_ANSWER_BYTES = 64 << 20
SEND_BUDGET_PER_UID = 32 << 20
SEND_STALL_SECONDS = 60.0
# Connections root and the daemon's uid may open past max_connections.
PRIVILEGED_EXTRA = 32


class ConnectionLimits:
    """Who may hold how many connections (docs/security.md): `per_uid` for each user but
    root and the daemon's own uid, `total` for all together (what the open-file limit
    leaves them, daemon/core/fdbudget.py), with PRIVILEGED_EXTRA more for those two, so that a
    flood by one user never locks the administrator out. And how fast: each of those users'
    connections are served at most `rate_per_uid` a second (`per_uid` at once; OpenRate), so
    that one opening and closing them in a loop costs the daemon little more than the
    accept() of each."""

    def __init__(self, total: int, per_uid: int,
                 rate_per_uid: int = DEFAULT_MAX_CONNECTION_RATE_PER_UID):
        self.total, self.per_uid, self.rate_per_uid = total, per_uid, rate_per_uid
        self.open: dict[int, int] = {}
        self.count = 0
        self.refusing = 0
        self._refusals, self._cuts = MinuteWarning(), MinuteWarning()
        self._answers = RefusalAnswers(lambda uid: False)
        self._opened = OpenRate(per_uid, rate_per_uid)
        self.unsent: dict[int, int] = {}    # uid: bytes of frames its peers have not taken

    @staticmethod
    def privileged(uid: int) -> bool:
        return uid == 0 or uid == os.geteuid()

    def admit(self, uid: int) -> GpumemError | None:
        """Count a new connection of `uid` in, or say why it is refused."""
        if self.privileged(uid):
            if self.count >= self.total + PRIVILEGED_EXTRA:
                return Busy(f"gpumemd has {self.count} connections open, the most it "
                            f"serves; try again later")
        elif self.count >= self.total:
            return Busy(f"gpumemd has {self.count} connections open (max_connections "
                        f"{self.total}); try again later")
        elif self.open.get(uid, 0) >= self.per_uid:
            return Busy(f"uid {uid} has {self.open[uid]} connections open to gpumemd "
                        f"(max_connections_per_uid {self.per_uid}); close some first")
        self.open[uid] = self.open.get(uid, 0) + 1
        self.count += 1
        return None

    def release(self, uid: int) -> None:
        self.count -= 1
        left = self.open[uid] - 1
        if left:
            self.open[uid] = left
        else:
            del self.open[uid]

    async def pace(self, uid: int) -> None:
        """Wait for `uid`'s turn to open a connection (OpenRate); root and the daemon's uid
        never wait."""
        if not self.privileged(uid):
            delay = self._opened.delay(uid)
            if delay:
                await trio.sleep(delay)

    def may_answer(self, uid: int) -> bool:
        """Whether a refused connection of `uid` is told why (else it is closed at once)."""
        return self.refusing < REFUSING and self._answers.take(uid)

    def note_refused(self, uid: int, why: GpumemError) -> None:
        self._refusals.happened("refused %d connection(s) in the last minute; the last one of "
                            "uid %d: %s", uid, why.message)

    def reserve_send(self, uid: int, nbytes: int) -> bool:
        """Count `nbytes` of a frame about to be sent as unsent by `uid`; False (nothing
        counted) when that would pass SEND_BUDGET_PER_UID. Root and the daemon's uid have no
        budget."""
        unsent = self.unsent.get(uid, 0)
        if not self.privileged(uid) and unsent and unsent + nbytes > SEND_BUDGET_PER_UID:
            self._note_cut(uid, unsent)
            return False
        self.unsent[uid] = unsent + nbytes
        return True

    def sent(self, uid: int, nbytes: int) -> None:
        left = self.unsent[uid] - nbytes
        if left:
            self.unsent[uid] = left
        else:
            del self.unsent[uid]

    def _note_cut(self, uid: int, unsent: int) -> None:
        self._cuts.happened("closed %d connection(s) in the last minute whose peers do not read; "
                        "the last one of uid %d, with %d bytes unread", uid, unsent)


class SendRefused(ConnectionError):
    """A frame this connection may not send (past its user's send budget, or the peer took
    nothing for SEND_STALL_SECONDS): the connection is closed, as for a peer gone."""


async def listen(socket_path: str,
                 on_connection: Callable[[Connection], Awaitable[None]],
                 limits: ConnectionLimits, *,
                 task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Accept connections on `socket_path` for ever, each admitted one handled by its own
    task (Acceptor). A failing accept() (out of fds or memory) waits and goes on: it never
    ends the loop."""
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    bind_unix(raw, socket_path, SOCKET_MODE)      # no chmod by path: paths.bind_unix says why
    raw.setblocking(False)
    raw.listen(BACKLOG)
    with raw:
        async with trio.open_nursery() as nursery:
            task_status.started()
            await Acceptor(raw, socket_path, on_connection, limits).run(nursery)


class Acceptor:
    """Takes connections off the listen queue as fast as it can: a connection's place in
    the queue is all that its connect() waits for, and the queue is first come, first
    served, whoever connects. So one user connecting and hanging up in a loop past its cap
    would make everyone, root included, wait behind each of its connections (issue 24).
    Here a refused connection costs an accept(), SO_PEERCRED and a close(): no task, no
    Connection, no SO_PEERGROUPS; only the first few a minute of each uid hear why
    (RefusalAnswers). The queue is drained ACCEPT_BATCH at a time between turns of the
    other tasks."""

    def __init__(self, listener: socket.socket, path: str,
                 on_connection: Callable[[Connection], Awaitable[None]],
                 limits: ConnectionLimits):
        self.listener, self.path = listener, path
        self.on_connection, self.limits = on_connection, limits
        self.backoff = BACKOFF_FIRST
        self.starved_since: float | None = None
        self.backlog = BACKLOG
        self._second, self._drops = 0.0, 0      # refusals closed unanswered this second
        self._churn_seen = -CALM_SECONDS

    async def run(self, nursery: trio.Nursery) -> None:
        while True:
            await trio.lowlevel.wait_readable(self.listener)
            pause = self.take_batch(nursery)
            if self.backlog != BACKLOG and \
                    time.monotonic() - self._churn_seen >= CALM_SECONDS:
                self._set_backlog(BACKLOG)
            if pause:
                await trio.sleep(pause)

    def take_batch(self, nursery: trio.Nursery) -> float:
        """Accept what is queued (at most ACCEPT_BATCH); the pause before trying again
        when accept() fails for want of descriptors, else 0."""
        for _ in range(ACCEPT_BATCH):
            try:
                sock, _ = self.listener.accept()
            except BlockingIOError:
                break
            except OSError as exc:
                return self.starved(exc)
            if self.starved_since is not None:
                log.warning("accepting connections again after %.1f s",
                            time.monotonic() - self.starved_since)
                self.backoff, self.starved_since = BACKOFF_FIRST, None
            self.sort(sock, nursery)
        return 0.0

    def starved(self, exc: OSError) -> float:
        if exc.errno not in OUT_OF_RESOURCES:
            log.warning("accept() on %s failed: %s; going on", self.path, exc)
            return 0.0
        if self.starved_since is None:
            self.starved_since = time.monotonic()
            log.error("accept() on %s failed: %s; new connections wait until descriptors "
                      "are free (max_connections: docs/config.md)", self.path, exc)
        pause, self.backoff = self.backoff, min(BACKOFF_MAX, self.backoff * 2)
        return pause

    def sort(self, sock: socket.socket, nursery: trio.Nursery) -> None:
        """Serve the connection, refuse it with one `busy` frame, or just close it."""
        try:
            raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEERCRED_SIZE)
        except OSError:                 # gone before we looked at it
            sock.close()
            return
        pid, uid, gid = struct.unpack("3i", raw)
        refusal = self.limits.admit(uid)
        if refusal is None:
            nursery.start_soon(_admitted, sock, (pid, uid, gid), self.on_connection,
                               self.limits)
            return
        self.limits.note_refused(uid, refusal)
        if self.limits.may_answer(uid):
            self.limits.refusing += 1       # counted now: the task starts later
            nursery.start_soon(_refuse, sock, Credentials(pid, uid, gid), refusal,
                               self.limits)
        else:
            sock.close()
            self._dropped()

    def _dropped(self) -> None:
        """A refused connection was closed unanswered; many a second shorten the queue."""
        now = time.monotonic()
        if now - self._second >= 1.0:
            self._second, self._drops = now, 0
        self._drops += 1
        if self._drops >= CHURN_DROPS:
            self._churn_seen = now
            if self.backlog != CHURN_BACKLOG:
                self._set_backlog(CHURN_BACKLOG)

    def _set_backlog(self, length: int) -> None:
        """listen() again: a listening socket takes a new queue length so."""
        self.listener.listen(length)
        self.backlog = length
        if length == CHURN_BACKLOG:
            log.info("more than %d connections a second refused: the listen queue is %d "
                     "long until they stop", CHURN_DROPS, length)
        else:
            log.info("connections are no longer refused in bulk: the listen queue is %d "
                     "long again", length)


async def _admitted(raw: socket.socket, ids: tuple[int, int, int],
                    on_connection: Callable[[Connection], Awaitable[None]],
                    limits: ConnectionLimits) -> None:
    """Serve an admitted connection, its lines counted as its user's (daemon/logbudget.py),
    then count it out."""
    pid, uid, gid = ids
    try:
        with acting_for(uid):
            try:
                await limits.pace(uid)
                sock = trio.socket.from_stdlib_socket(raw)
                conn = Connection(sock, limits,
                                  Credentials(pid, uid, gid, peer_groups(sock, pid)))
            except OSError:             # gone before we looked at it
                raw.close()
                return
            except BaseException:       # the daemon stops while it waits its turn
                raw.close()
                raise
            await on_connection(conn)
    finally:
        limits.release(uid)


async def _refuse(raw: socket.socket, cred: Credentials, why: GpumemError,
                  limits: ConnectionLimits) -> None:
    """Answer the hello (if it comes soon) with the refusal, then hang up."""
    conn = Connection(trio.socket.from_stdlib_socket(raw), limits, cred)
    try:
        with acting_for(cred.uid), trio.move_on_after(REFUSAL_WAIT):
            msg, fds = await conn.receive()
            framing.close_fds(fds)
            await conn.fail(msg.get("id"), why)
    except (ProtocolError, EOFError, *PEER_GONE):
        pass
    finally:
        limits.refusing -= 1
        conn.close()


class Connection:
    """One client's socket: its credentials, and frames in and out within the send limits
    (MAX_ANSWER_BYTES, SEND_BUDGET_PER_UID, SEND_STALL_SECONDS)."""

    def __init__(self, sock: trio.socket.SocketType, limits: ConnectionLimits,
                 cred: Credentials | None = None):
        self.sock = sock
        self.limits = limits
        self.cred = cred or peer_credentials(sock)

    def peer_pidfd(self) -> int | None:
        """A pidfd of the process that connected (SO_PEERPIDFD, Linux >= 6.5; the caller
        closes it), or None: an older kernel, or the peer gone. It lets the daemon tell that
        the pid it reads /proc of is still that process (daemon/core/containers.py)."""
        try:
            fd = self.sock.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)
        except OSError:
            return None
        return fd if fd >= 0 else None

    async def receive(self) -> tuple[dict, list[int]]:
        """The next request frame and the fds that came with it (the caller closes them).
        EOFError when the peer closes between frames; ProtocolError on a framing error."""
        return await framing.arecv_frame(self.sock, framing.MAX_REQUEST_BYTES)

    async def answer(self, rid: Any, result: Mapping[str, Any], fds: Sequence[int] = ()
                     ) -> None:
        data = framing.encode({"id": rid, "ok": True, "result": result}, len(fds))
        size = len(data) - framing.HEADER_SIZE
        if size > MAX_ANSWER_BYTES:
            del data
            await self.fail(rid, UsageError(
                f"the answer would be {size} bytes, more than the {MAX_ANSWER_BYTES} gpumemd "
                f"sends at once (docs/protocol.md, \"Limits\"); ask for less: a narrower "
                f"path, or without --recursive", details={"bytes": size,
                                                           "limit": MAX_ANSWER_BYTES}))
            return
        await self._send(data, fds)

    async def fail(self, rid: Any, error: GpumemError) -> None:
        await self._send(framing.encode({"id": rid, "ok": False, "error": error.to_wire()}))

    async def push(self, frame: dict) -> None:
        """A frame that is not an answer: an event, a `changed` or a progress frame."""
        await self._send(framing.encode(frame))

    async def _send(self, data: bytes, fds: Sequence[int] = ()) -> None:
        """Send one encoded frame, counted against the user's send budget while the peer
        has not taken it all; SendRefused (and the connection closed) past the budget or
        when the peer takes nothing for SEND_STALL_SECONDS."""
        uid = self.cred.uid
        if not self.limits.reserve_send(uid, len(data)):
            self.close()
            raise SendRefused(f"uid {uid} has too many bytes unread")
        try:
            await self._send_taken(data, fds)
        finally:
            self.limits.sent(uid, len(data))

    async def _send_taken(self, data: bytes, fds: Sequence[int]) -> None:
        view = memoryview(data)
        first = True
        while view:
            with trio.move_on_after(SEND_STALL_SECONDS):
                if first:
                    n = await self.sock.sendmsg([view], framing.ancillary(list(fds)))
                    first = False
                else:
                    n = await self.sock.send(view)
                view = view[n:]
                continue
            self.close()
            raise SendRefused(f"the peer took nothing for {SEND_STALL_SECONDS:.0f} s")

    async def fail_quietly(self, rid: Any, error: GpumemError) -> None:
        """The last word before hanging up: a peer that is gone does not hear it."""
        try:
            await self.fail(rid, error)
        except PEER_GONE:
            pass

    async def wait_hang_up(self) -> None:
        """Return once the peer closes its end. What it sends meanwhile is dropped: a
        stream's connection takes no more requests."""
        try:
            while await self.sock.recv(4096):
                pass
        except OSError:
            pass

    def close(self) -> None:
        self.sock.close()
