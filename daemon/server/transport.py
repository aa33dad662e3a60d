"""The socket transport: the listening socket, peer credentials, framed I/O on a connection.

Nothing here knows an op. The listener accepts connections and starts one task per
connection; a `Connection` reads request frames (at most framing.MAX_REQUEST_BYTES, at most
framing.MAX_FDS_PER_FRAME fds: framing.py refuses more with a ProtocolError) and writes
answers, errors and the extra frames of streams and progress (docs/protocol.md, "Frames").
"""
from __future__ import annotations

import errno
import logging
import os
import socket
import struct
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio

from gpumemctl.protocol import Busy, GpumemError, ProtocolError, UsageError, framing

from ..paths import bind_unix
from ..permissions import Credentials, peer_groups

log = logging.getLogger("gpumemd")

# Anyone may connect; each request is authorised by its peer credentials (docs/protocol.md).
SOCKET_MODE = 0o666
# What a send to a peer that has gone away raises, mid-frame or before it.
# (SendRefused is an OSError: a connection closed for the send limits reads as gone.)
PEER_GONE = (OSError, trio.BrokenResourceError, trio.ClosedResourceError)


def peer_credentials(sock: trio.socket.SocketType) -> Credentials:
    """Who the peer was at connect(): pid, uid and gid (SO_PEERCRED) and its supplementary
    groups (SO_PEERGROUPS), never what /proc says of that pid later (daemon/permissions.py)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return Credentials(pid=pid, uid=uid, gid=gid, groups=peer_groups(sock, pid))


# accept() failing for want of file descriptors or memory: wait and try again, never stop.
OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
BACKOFF_FIRST, BACKOFF_MAX = 0.01, 1.0
# A refused connection hears why (one error frame) if it asks within this long; at most
# REFUSING of them wait at once, the rest are closed at once.
REFUSAL_WAIT, REFUSING = 1.0, 64
# Of the open-file limit, kept for everything but connections: allocations' fds in flight,
# the registry, the keeper, the mount, NVML, worker threads.
FDS_KEPT = 512
# Connections root and the daemon's uid may open past max_connections.
PRIVILEGED_EXTRA = 32
# What gpumemd sends (docs/protocol.md, "Limits"): an answer's JSON is at most
# MAX_ANSWER_BYTES (a larger one is answered with a usage error that says so); the frames
# one user's connections have not yet taken are at most SEND_BUDGET_PER_UID bytes together
# (a connection whose frame would pass it is closed), and a frame the peer takes no byte of
# for SEND_STALL_SECONDS closes its connection. So clients that never read cannot make the
# daemon hold their answers without bound.
MAX_ANSWER_BYTES = 64 << 20
SEND_BUDGET_PER_UID = 32 << 20
SEND_STALL_SECONDS = 60.0


class ConnectionLimits:
    """Who may hold how many connections (docs/security.md): `per_uid` for each user but
    root and the daemon's own uid, `total` for all together, with PRIVILEGED_EXTRA more for
    those two, so that a flood by one user never locks the administrator out."""

    def __init__(self, total: int, per_uid: int, fd_limit: int | None = None):
        if fd_limit is not None:
            total = max(16, min(total, fd_limit - FDS_KEPT - PRIVILEGED_EXTRA))
        self.total, self.per_uid = total, per_uid
        self.open: dict[int, int] = {}
        self.count = 0
        self.refusing = 0
        self._refusals, self._cuts = MinuteWarning(), MinuteWarning()
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


class MinuteWarning:
    """A warning logged at most once a minute, with how often it happened meanwhile: a
    flood must not flood the log too. The format's first %d is that count."""

    def __init__(self) -> None:
        self.count, self._logged = 0, -float("inf")

    def happened(self, fmt: str, *args: Any) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self._logged >= 60:
            log.warning(fmt, self.count, *args)
            self._logged, self.count = now, 0


class SendRefused(ConnectionError):
    """A frame this connection may not send (past its user's send budget, or the peer took
    nothing for SEND_STALL_SECONDS): the connection is closed, as for a peer gone."""


async def listen(socket_path: str,
                 on_connection: Callable[[Connection], Awaitable[None]],
                 limits: ConnectionLimits, *,
                 task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Accept connections on `socket_path` for ever, each handled by its own task. A
    failing accept() (out of fds or memory) waits and goes on: it never ends the loop."""
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    bind_unix(raw, socket_path, SOCKET_MODE)      # no chmod by path: paths.bind_unix says why
    listener = trio.socket.from_stdlib_socket(raw)
    listener.listen(socket.SOMAXCONN)
    backoff, starved_since = BACKOFF_FIRST, None
    async with trio.open_nursery() as nursery:
        task_status.started()
        while True:
            try:
                sock, _ = await listener.accept()
            except OSError as exc:
                if exc.errno not in OUT_OF_RESOURCES:
                    log.warning("accept() on %s failed: %s; going on", socket_path, exc)
                    continue
                if starved_since is None:
                    starved_since = time.monotonic()
                    log.error("accept() on %s failed: %s; new connections wait until "
                              "descriptors are free (max_connections: docs/config.md)",
                              socket_path, exc)
                await trio.sleep(backoff)
                backoff = min(BACKOFF_MAX, backoff * 2)
                continue
            if starved_since is not None:
                log.warning("accepting connections again after %.1f s",
                            time.monotonic() - starved_since)
                backoff, starved_since = BACKOFF_FIRST, None
            nursery.start_soon(_admitted, sock, on_connection, limits)


async def _admitted(sock: trio.socket.SocketType,
                    on_connection: Callable[[Connection], Awaitable[None]],
                    limits: ConnectionLimits) -> None:
    """Count the connection in (or refuse it with one Busy frame), serve it, count it out."""
    try:
        conn = Connection(sock, limits)
    except OSError:                     # gone before we looked at it
        sock.close()
        return
    refusal = limits.admit(conn.cred.uid)
    if refusal is not None:
        limits.note_refused(conn.cred.uid, refusal)
        await _refuse(conn, refusal, limits)
        return
    try:
        await on_connection(conn)
    finally:
        limits.release(conn.cred.uid)


async def _refuse(conn: Connection, why: GpumemError, limits: ConnectionLimits) -> None:
    """Answer the hello (if it comes soon) with the refusal, then hang up."""
    if limits.refusing >= REFUSING:
        conn.close()
        return
    limits.refusing += 1
    try:
        with trio.move_on_after(REFUSAL_WAIT):
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

    def __init__(self, sock: trio.socket.SocketType, limits: ConnectionLimits):
        self.sock = sock
        self.limits = limits
        self.cred = peer_credentials(sock)

    async def receive(self) -> tuple[dict, list[int]]:
        """The next request frame and the fds that came with it (the caller closes them).
        EOFError when the peer closes between frames; ProtocolError on a framing error."""
        return await framing.arecv_frame(self.sock, framing.MAX_REQUEST_BYTES)

    async def answer(self, rid: Any, result: dict, fds: Sequence[int] = ()) -> None:
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
