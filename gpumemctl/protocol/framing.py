"""Frames on the Unix stream socket, with file descriptors passed by SCM_RIGHTS.

A frame is a 12-byte header followed by a JSON payload (UTF-8, one object):

    magic  b"GMP1"   4 bytes  catches garbage and peers that speak something else
    length uint32    payload bytes, big-endian
    nfds   uint16    how many fds ride with this frame
    flags  uint16    reserved, 0

The sender writes header and payload with one sendmsg() carrying the fds, so the fds are
attached to the header's first byte. The receiver reads exactly the header with recvmsg()
(getting the fds), then exactly `length` payload bytes. Reading the header on its own keeps
the receiver at a frame boundary, so fds can never be credited to the wrong frame.
See docs/protocol.md.
"""
from __future__ import annotations

import os
import struct

# The C core of the socket module: these constants are all framing needs, and importing
# `socket` itself (its enum classes, `selectors`) costs every CLI call milliseconds
# (protocol/jsontext.py says why that counts). Sockets here are blocking socket objects.
from _socket import CMSG_SPACE, MSG_CMSG_CLOEXEC, MSG_CTRUNC, SCM_RIGHTS, SOL_SOCKET

from . import jsontext
from .errors import ProtocolError

TYPE_CHECKING = False               # typing is not imported at run time (the CLI's start-up)
if TYPE_CHECKING:
    from collections.abc import Sequence

MAGIC = b"GMP1"
HEADER = struct.Struct("!4sIHH")
HEADER_SIZE = HEADER.size
MAX_FDS_PER_FRAME = 16
FD_BYTES = struct.calcsize("i")      # an fd in SCM_RIGHTS data: a C int, native order
# A request is small; an answer may list many allocations. Each side enforces its own limit.
MAX_REQUEST_BYTES = 1 << 20
MAX_RESPONSE_BYTES = 1 << 28
_ANC_SIZE = CMSG_SPACE(MAX_FDS_PER_FRAME * FD_BYTES)


def encode(message: dict, nfds: int = 0) -> bytes:
    if nfds > MAX_FDS_PER_FRAME:
        raise ProtocolError(f"{nfds} fds in one frame; at most {MAX_FDS_PER_FRAME} allowed")
    payload = jsontext.dumps(message).encode("utf-8", "surrogateescape")
    return HEADER.pack(MAGIC, len(payload), nfds, 0) + payload


def parse_header(header: bytes, max_bytes: int) -> tuple[int, int]:
    """Validate a header; returns (payload length, declared fd count)."""
    if len(header) < HEADER_SIZE:
        raise ProtocolError(f"truncated frame header ({len(header)} of {HEADER_SIZE} bytes)")
    magic, length, nfds, _flags = HEADER.unpack_from(header)
    if magic != MAGIC:
        raise ProtocolError(f"bad frame magic {magic!r} (expected {MAGIC!r}): not a gpumemd "
                            "peer, or garbage on the socket")
    if length > max_bytes:
        raise ProtocolError(f"frame of {length} bytes exceeds the {max_bytes}-byte limit")
    if nfds > MAX_FDS_PER_FRAME:
        raise ProtocolError(f"frame declares {nfds} fds; at most {MAX_FDS_PER_FRAME} allowed")
    return length, nfds


def decode_payload(payload: bytes) -> dict:
    try:
        message = jsontext.loads(payload.decode("utf-8", "surrogateescape"))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ProtocolError(f"frame payload is not JSON: {exc}") from None
    if not isinstance(message, dict):
        raise ProtocolError("frame payload must be a JSON object")
    return message


def fds_from_ancillary(ancdata, msg_flags: int) -> list[int]:
    """Collect passed fds; on truncation close what did arrive and fail."""
    fds: list[int] = []
    for level, kind, data in ancdata:
        if level == SOL_SOCKET and kind == SCM_RIGHTS:
            fds.extend(memoryview(data[: len(data) - (len(data) % FD_BYTES)]).cast("i"))
    if msg_flags & MSG_CTRUNC:
        close_fds(fds)
        raise ProtocolError(f"too many fds in one frame; at most {MAX_FDS_PER_FRAME} allowed")
    return fds


def check_fd_count(fds: list[int], declared: int) -> None:
    if len(fds) != declared:
        close_fds(fds)
        raise ProtocolError(f"frame declares {declared} fds but carried {len(fds)}")


def close_fds(fds) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def ancillary(fds: list[int]):
    return [(SOL_SOCKET, SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))] if fds else []


# ---- blocking side (client, keeper) ---------------------------------------------------

def send_frame(sock, message: dict, fds: Sequence[int] = (), limit: int | None = None) -> None:
    """`limit`: the most payload bytes the peer reads in one frame (the client passes
    MAX_REQUEST_BYTES): a larger frame is refused here, nothing sent, rather than sent for
    the peer to hang up on mid-frame (which reads as "gpumemd closed the connection")."""
    data = encode(message, len(fds))
    if limit is not None and len(data) - HEADER_SIZE > limit:
        size, op = len(data) - HEADER_SIZE, str(message.get("op", ""))[:40]
        raise ProtocolError(f"the '{op}' request would be {size} bytes, more than the "
                            f"{limit} gpumemd reads in one request: nothing was sent",
                            details={"errno": "E2BIG", "bytes": size, "limit": limit})
    sent = sock.sendmsg([data], ancillary(list(fds)))
    if sent < len(data):
        sock.sendall(data[sent:])


def _recv_exact(sock, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise EOFError("peer closed the connection mid-frame")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def recv_frame(sock, max_bytes: int) -> tuple[dict, list[int]]:
    """Read one frame. Raises EOFError on a clean close before a frame starts."""
    header, ancdata, flags, _ = sock.recvmsg(HEADER_SIZE, _ANC_SIZE, MSG_CMSG_CLOEXEC)
    fds = fds_from_ancillary(ancdata, flags)
    try:
        if not header:
            raise EOFError("peer closed the connection")
        if len(header) < HEADER_SIZE:
            header += _recv_exact(sock, HEADER_SIZE - len(header))
        length, nfds = parse_header(header, max_bytes)
        check_fd_count(fds, nfds)
        return decode_payload(_recv_exact(sock, length)), fds
    except BaseException:
        close_fds(fds)
        raise


# ---- trio side (daemon) -----------------------------------------------------------------

async def arecv_exact(sock, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = await sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise EOFError("peer closed the connection mid-frame")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


async def arecv_frame(sock, max_bytes: int) -> tuple[dict, list[int]]:
    header, ancdata, flags, _ = await sock.recvmsg(HEADER_SIZE, _ANC_SIZE,
                                                   MSG_CMSG_CLOEXEC)
    fds = fds_from_ancillary(ancdata, flags)
    try:
        if not header:
            raise EOFError("peer closed the connection")
        if len(header) < HEADER_SIZE:
            header += await arecv_exact(sock, HEADER_SIZE - len(header))
        length, nfds = parse_header(header, max_bytes)
        check_fd_count(fds, nfds)
        return decode_payload(await arecv_exact(sock, length)), fds
    except BaseException:
        close_fds(fds)
        raise


async def asend_frame(sock, message: dict, fds: Sequence[int] = ()) -> None:
    data = encode(message, len(fds))
    sent = await sock.sendmsg([data], ancillary(list(fds)))
    view = memoryview(data)[sent:]
    while view:
        n = await sock.send(view)
        view = view[n:]
