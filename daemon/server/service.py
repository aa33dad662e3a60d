"""The socket service: a connection's life (handshake, session, requests in order) and the
dispatch of one request through the op table.

One trio task per connection. The first frame must be `hello` with our protocol version.
Each later frame is a request {id, op, args}: its op is looked up in ops.OPS, its args are
checked against the op's schema, and its handler answers {id, ok: true, result} or
{id, ok: false, error: {code, name, message, details}}. A framing error is answered once and
the connection is closed; the daemon itself is unharmed. Every request is authorised by the
verbs from the peer's SO_PEERCRED. See docs/protocol.md.
"""
from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any

import trio

from gpumemctl.protocol import (
    PROTOCOL_VERSION,
    GpumemError,
    InternalError,
    ProtocolError,
    UsageError,
    framing,
)
from gpumemctl.protocol.release import VERSION

from ..config import DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_CONNECTIONS_PER_UID
from ..core.sessions import Session
from ..verbs.plan import run, run_sync
from . import ops, status, streams
from .call import Call
from .schema import validate
from .transport import Connection, ConnectionLimits, listen

if TYPE_CHECKING:
    from ..services.health import HealthMonitor
    from ..services.scrub import Scrubber
    from ..verbs import Verbs

log = logging.getLogger("gpumemd")
CLIENT_NAME_CHARS = 100     # what of hello's `client` is kept (it names the session in logs)
HANDSHAKE_SECONDS = 5.0     # a connection must say hello within this long


class Server:
    def __init__(self, verbs: Verbs, socket_path: str, info: dict, *,
                 scrubber: Scrubber | None = None, limits: ConnectionLimits | None = None,
                 admin_gid: int | None = None, health: HealthMonitor | None = None):
        """`limits`: how many connections each user may hold (config max_connections,
        max_connections_per_uid); `admin_gid`: config admin_group."""
        self.verbs = verbs
        self.admin_gid = admin_gid
        self.limits = limits or ConnectionLimits(DEFAULT_MAX_CONNECTIONS,
                                                 DEFAULT_MAX_CONNECTIONS_PER_UID)
        self.scrubber = scrubber      # daemon/services/scrub.py
        self.health = health          # daemon/services/health.py (GPU health)
        self.socket_path = socket_path
        self.info = info              # daemon facts for hello/status
        self.started = time.time()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        await listen(self.socket_path, self._connection, self.limits,
                     task_status=task_status)

    async def _devices(self) -> list[dict]:
        """The devices with telemetry, as `devices` answers (tests/unit/test_nvml.py)."""
        return await status.devices_with_telemetry(self.verbs.reports)

    # ---- a connection -----------------------------------------------------------------------
    async def _connection(self, conn: Connection) -> None:
        session: Session | None = None
        try:
            with trio.move_on_after(HANDSHAKE_SECONDS):     # a silent peer is let go
                session = await self._handshake(conn)
            if session is None:
                return
            while True:
                msg, fds = await conn.receive()
                if not await self._request(conn, session, msg, fds):
                    break
        except ProtocolError as exc:
            # One line per broken connection, within its user's share (daemon/logbudget.py).
            log.warning("closing a connection of uid %d (pid %d): %s", conn.cred.uid,
                        conn.cred.pid, exc)
            await conn.fail_quietly(None, exc)
        except (EOFError, ConnectionError, trio.BrokenResourceError, OSError):
            pass
        except Exception:  # a bug in one connection must not stop the daemon
            log.exception("internal error on a connection; closing it")
        finally:
            try:
                if session is not None:   # its writers' parity encoded off the loop first
                    await run(self.verbs.handles.end_session(session))
            except GpumemError as exc:    # a full state disk: released at the next attempt
                log.warning("what a session of uid %d (pid %d) held is released later: %s",
                            conn.cred.uid, conn.cred.pid, exc)
            finally:
                conn.close()

    async def _handshake(self, conn: Connection) -> Session:
        msg, fds = await conn.receive()
        framing.close_fds(fds)
        args = msg.get("args", {})
        if msg.get("op") != "hello" or not isinstance(args, dict):
            raise ProtocolError("the first request must be 'hello' with an object 'args'")
        version = args.get("version")
        if type(version) is not int or version != PROTOCOL_VERSION:
            raise ProtocolError(f"protocol version {version!r} is not supported; this "
                                f"gpumemd speaks version {PROTOCOL_VERSION}")
        client = str(args.get("client", ""))[:CLIENT_NAME_CHARS]
        pidfd = conn.peer_pidfd()
        try:        # the client's cgroup read once, now (daemon/core/containers.py)
            session = self.verbs.handles.open_session(conn.cred, client, pidfd)
        finally:
            if pidfd is not None:
                os.close(pidfd)
        try:
            await conn.answer(msg.get("id"), {
                "version": PROTOCOL_VERSION, "daemon": f"gpumemd {VERSION}",
                "pid": os.getpid(), "backend": self.verbs.reports.backend_name,
                "session": session.id})
        except BaseException:
            # The peer went (a client killed mid-hello, tests/security/test_soak.py) or
            # the handshake timed out: the caller never sees this session, so end it here.
            run_sync(self.verbs.handles.end_session(session))
            raise
        return session

    # ---- one request ------------------------------------------------------------------------
    async def _request(self, conn: Connection, session: Session, msg: dict,
                       fds: list[int]) -> bool:
        """Answer one request; False when the connection should end (after a stream)."""
        rid = msg.get("id")
        framing.close_fds(fds)  # clients never need to send us fds
        try:
            if fds:
                raise UsageError("requests to gpumemd carry no file descriptors")
            op, call = self._parse(session, msg)
            if op.streams(call.args):
                assert op.stream is not None
                await op.stream(call, conn)
                return False
            if op.wants_progress(call.args):
                call.progress = streams.progress_sender(conn, rid)
            assert op.handler is not None
            result, out_fds = await op.handler(call)
            await self.verbs.reports.settle_watchers()    # the mount learns of it first
        except GpumemError as exc:
            await conn.fail(rid, exc)
            return True
        except Exception as exc:  # a bug: log it, answer it, keep serving
            log.exception("internal error handling %r", msg.get("op"))
            await conn.fail(rid, InternalError(f"internal error: {type(exc).__name__}: {exc}"))
            return True
        try:
            await conn.answer(rid, result, out_fds)
        finally:
            framing.close_fds(out_fds)
        return True

    def _parse(self, session: Session, msg: dict[str, Any]) -> tuple[ops.Op, Call]:
        """The request's op and its arguments checked against the op's schema."""
        name, args = msg.get("op"), msg.get("args", {})
        if not isinstance(name, str) or not isinstance(args, dict):
            raise UsageError("a request needs a string 'op' and an object 'args'")
        op = ops.lookup(name)
        return op, Call(self, session, msg.get("id"), validate(op.args, args))
