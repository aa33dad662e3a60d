"""The socket transport: the listening socket, peer credentials, framed I/O on a connection.

Nothing here knows an op. The listener accepts connections and starts one task per
connection; a `Connection` reads request frames (at most framing.MAX_REQUEST_BYTES, at most
framing.MAX_FDS_PER_FRAME fds: framing.py refuses more with a ProtocolError) and writes
answers, errors and the extra frames of streams and progress (docs/protocol.md, "Frames").
"""
from __future__ import annotations

import os
import socket
import struct
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio

from gpumemctl.protocol import GpumemError, framing

from ..permissions import Credentials, supplementary_groups

# Anyone may connect; each request is authorised by its peer credentials (docs/protocol.md).
SOCKET_MODE = 0o666
# What a send to a peer that has gone away raises, mid-frame or before it.
PEER_GONE = (OSError, trio.BrokenResourceError, trio.ClosedResourceError)


def peer_credentials(sock: trio.socket.SocketType) -> Credentials:
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return Credentials(pid=pid, uid=uid, gid=gid, groups=supplementary_groups(pid))


async def listen(socket_path: str,
                 on_connection: Callable[[trio.socket.SocketType], Awaitable[None]], *,
                 task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Accept connections on `socket_path` for ever, each handled by its own task."""
    listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await listener.bind(socket_path)
    os.chmod(socket_path, SOCKET_MODE)
    listener.listen(socket.SOMAXCONN)
    async with trio.open_nursery() as nursery:
        task_status.started()
        while True:
            conn, _ = await listener.accept()
            nursery.start_soon(on_connection, conn)


class Connection:
    """One client's socket: its credentials, and frames in and out."""

    def __init__(self, sock: trio.socket.SocketType):
        self.sock = sock
        self.cred = peer_credentials(sock)

    async def receive(self) -> tuple[dict, list[int]]:
        """The next request frame and the fds that came with it (the caller closes them).
        EOFError when the peer closes between frames; ProtocolError on a framing error."""
        return await framing.arecv_frame(self.sock, framing.MAX_REQUEST_BYTES)

    async def answer(self, rid: Any, result: dict, fds: Sequence[int] = ()) -> None:
        await framing.asend_frame(self.sock, {"id": rid, "ok": True, "result": result}, fds)

    async def fail(self, rid: Any, error: GpumemError) -> None:
        await framing.asend_frame(self.sock, {"id": rid, "ok": False,
                                              "error": error.to_wire()})

    async def push(self, frame: dict) -> None:
        """A frame that is not an answer: an event, a `changed` or a progress frame."""
        await framing.asend_frame(self.sock, frame)

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
