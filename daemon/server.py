"""The socket server: a thin adapter from framed requests to the AllocationManager.

One trio task per connection. The first frame must be `hello` with our protocol version.
Each later frame is a request {id, op, args}; the answer is {id, ok: true, result} or
{id, ok: false, error: {code, name, message, details}}. A framing error (bad magic, oversized
frame, too many fds, truncated frame) is answered once and the connection is closed; the daemon
itself is unharmed. Every request is authorised by the manager from the peer's SO_PEERCRED.
See docs/protocol.md.
"""
from __future__ import annotations

import inspect
import logging
import os
import socket
import struct
import time

import trio

from gpumemctl.protocol import (PROTOCOL_VERSION, GpumemError, InternalError,
                                PermissionDenied, ProtocolError, UsageError, framing)

from gpumemctl.protocol.errors import OK, REPAIRED, UNCORRECTABLE

from . import nvml
from .check import Checker
from .manager import AllocationManager
from .permissions import Credentials, supplementary_groups
from .sessions import Session

log = logging.getLogger("gpumemd")
VERSION = "0.1.0"
EVENT_QUEUE = 1024


def peer_credentials(sock) -> Credentials:
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return Credentials(pid=pid, uid=uid, gid=gid, groups=supplementary_groups(pid))


def _bool(args: dict, key: str, default: bool = False) -> bool:
    value = args.get(key, default)
    if not isinstance(value, bool):
        raise UsageError(f"argument {key!r} must be true or false, not {value!r}")
    return value


def _str(args: dict, key: str, default: str | None = None) -> str:
    value = args.get(key, default)
    if not isinstance(value, str):
        raise UsageError(f"argument {key!r} must be a string, not {value!r}")
    return value


def _int(args: dict, key: str, default: int | None = None) -> int:
    value = args.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise UsageError(f"argument {key!r} must be an integer, not {value!r}")
    return value


class Server:
    def __init__(self, manager: AllocationManager, socket_path: str, info: dict):
        self.manager = manager
        self.scrubber = None          # daemon/scrub.py; set by gpumemd
        self.socket_path = socket_path
        self.info = info              # daemon facts for hello/status
        self.started = time.time()

    # ---- listening --------------------------------------------------------------------
    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await listener.bind(self.socket_path)
        # Anyone may connect; each request is authorised by its peer credentials.
        os.chmod(self.socket_path, 0o666)
        listener.listen(socket.SOMAXCONN)
        async with trio.open_nursery() as nursery:
            task_status.started()
            while True:
                conn, _ = await listener.accept()
                nursery.start_soon(self._connection, conn)

    async def _connection(self, conn) -> None:
        session: Session | None = None
        try:
            cred = peer_credentials(conn)
            session = await self._handshake(conn, cred)
            while True:
                msg, fds = await framing.arecv_frame(conn, framing.MAX_REQUEST_BYTES)
                if not await self._request(conn, session, msg, fds):
                    break
        except ProtocolError as exc:
            log.warning("closing a connection: %s", exc)
            await self._try_send(conn, {"id": None, "ok": False, "error": exc.to_wire()})
        except (EOFError, ConnectionError, trio.BrokenResourceError, OSError):
            pass
        except Exception:  # noqa: BLE001 - a bug in one connection must not stop the daemon
            log.exception("internal error on a connection; closing it")
        finally:
            if session is not None:
                self.manager.close_session(session)
            conn.close()

    async def _handshake(self, conn, cred: Credentials) -> Session:
        msg, fds = await framing.arecv_frame(conn, framing.MAX_REQUEST_BYTES)
        framing.close_fds(fds)
        args = msg.get("args", {})
        if msg.get("op") != "hello" or not isinstance(args, dict):
            raise ProtocolError("the first request must be 'hello' with an object 'args'")
        version = args.get("version")
        if type(version) is not int or version != PROTOCOL_VERSION:
            raise ProtocolError(f"protocol version {version!r} is not supported; this "
                                f"gpumemd speaks version {PROTOCOL_VERSION}")
        client = str(args.get("client", ""))[:100]
        session = self.manager.open_session(cred, client)
        await framing.asend_frame(conn, {"id": msg.get("id"), "ok": True, "result": {
            "version": PROTOCOL_VERSION, "daemon": f"gpumemd {VERSION}", "pid": os.getpid(),
            "backend": self.manager.backend.name, "session": session.id}})
        return session

    async def _try_send(self, conn, message: dict) -> None:
        try:
            await framing.asend_frame(conn, message)
        except (OSError, trio.BrokenResourceError):
            pass

    # ---- one request -------------------------------------------------------------------
    async def _request(self, conn, session: Session, msg: dict, fds: list[int]) -> bool:
        """Answer one request; False when the connection should end."""
        rid = msg.get("id")
        framing.close_fds(fds)  # clients never need to send us fds
        try:
            if fds:
                raise UsageError("requests to gpumemd carry no file descriptors")
            op, args = msg.get("op"), msg.get("args", {})
            if not isinstance(op, str) or not isinstance(args, dict):
                raise UsageError("a request needs a string 'op' and an object 'args'")
            if op == "events" and args.get("follow"):
                await self._follow_events(conn, session, rid, args)
                return False
            handler = getattr(self, "op_" + op, None)
            if handler is None:
                raise UsageError(f"unknown request {op!r}")
            reply = handler(session, args)
            if inspect.isawaitable(reply):   # ops that wait on a worker thread (NVML)
                reply = await reply
            result, out_fds = reply
            for watcher in self.manager.watchers:   # the mount learns of it first
                await watcher.settle()
        except GpumemError as exc:
            await framing.asend_frame(conn, {"id": rid, "ok": False, "error": exc.to_wire()})
            return True
        except Exception as exc:  # noqa: BLE001 - a bug: log it, answer it, keep serving
            log.exception("internal error handling %r", msg.get("op"))
            err = InternalError(f"internal error: {type(exc).__name__}: {exc}")
            await framing.asend_frame(conn, {"id": rid, "ok": False, "error": err.to_wire()})
            return True
        try:
            await framing.asend_frame(conn, {"id": rid, "ok": True, "result": result}, out_fds)
        finally:
            framing.close_fds(out_fds)
        return True

    # ---- operations (each returns (result, fds)) -------------------------------------------
    def op_ls(self, s: Session, a: dict):
        entries = self.manager.listdir(_str(a, "path", ""), s.cred,
                                       recursive=_bool(a, "recursive"))
        return {"entries": entries}, []

    def op_info(self, s: Session, a: dict):
        return self.manager.info(_str(a, "path"), s.cred), []

    def op_create(self, s: Session, a: dict):
        device = a.get("device")
        return self.manager.create(
            _str(a, "path"), s.cred, size=_int(a, "size"), durable=_bool(a, "durable"),
            mode=_int(a, "mode", 0o600), device=None if device is None else str(device),
            # No ecc: the daemon's default (config `ecc`); older clients always send one.
            ecc=None if a.get("ecc") is None else _str(a, "ecc"),
            exist_ok=_bool(a, "exist_ok"), session=s,
            lease=_bool(a, "lease")), []

    def op_mkdir(self, s: Session, a: dict):
        return self.manager.mkdir(_str(a, "path"), s.cred, mode=_int(a, "mode", 0o755),
                                  parents=_bool(a, "parents")), []

    def op_rm(self, s: Session, a: dict):
        removed = self.manager.remove(_str(a, "path"), s.cred, recursive=_bool(a, "recursive"),
                                      force=_bool(a, "force"))
        return {"removed": removed}, []

    def op_durable(self, s: Session, a: dict):
        return self.manager.set_durable(_str(a, "path"), s.cred, _bool(a, "durable")), []

    def op_open(self, s: Session, a: dict):
        holder, fd, info = self.manager.open(_str(a, "path"), s.cred, s, _str(a, "mode", "r"))
        return {"handle": holder.id, "info": info, "backend": self.manager.backend.name}, [fd]

    def op_attach(self, s: Session, a: dict):
        holder, fd, info = self.manager.attach(_str(a, "path"), s.cred, s,
                                               _str(a, "mode", "r"))
        return {"handle": holder.id, "info": info, "backend": self.manager.backend.name}, [fd]

    def op_detach(self, s: Session, a: dict):
        return {"info": self.manager.detach(s, _int(a, "handle"))}, []

    def op_seal(self, s: Session, a: dict):
        return self.manager.seal(_str(a, "path"), s.cred, s), []

    def op_export_dmabuf(self, s: Session, a: dict):
        fd, info = self.manager.export_dmabuf(_str(a, "path"), s.cred)
        return {"info": info, "offset": 0, "size": info["capacity"]}, [fd]

    # ---- ECC -------------------------------------------------------------------------------
    async def op_verify(self, s: Session, a: dict):
        """Verify (with `repair`, repair) the named allocations or all: synchronous for the
        client, piece by piece for the daemon (the event loop runs between pieces)."""
        paths = a.get("paths") or []
        if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
            raise UsageError("argument 'paths' must be a list of strings")
        targets = self.manager.ecc_targets(paths, s.cred, _bool(a, "all"))
        results = [await self._drive(self.manager.verify_steps(t, _bool(a, "repair")))
                   for t in targets]
        return {"allocations": results, "summary": ecc_summary(results)}, []

    async def op_recover(self, s: Session, a: dict):
        alloc = self.manager.lookup_allocation(_str(a, "path"), s.cred)
        result = await self._drive(self.manager.verify_steps(alloc, repair=True))
        return {"allocation": result, "info": self.manager.info(alloc.path, s.cred)}, []

    @staticmethod
    async def _drive(steps):
        """Run a manager generator to its end, letting the loop run between its pieces."""
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value
            await trio.sleep(0)

    def op_debug_corrupt(self, s: Session, a: dict):
        try:
            pattern = bytes.fromhex(_str(a, "pattern", "ff"))
        except ValueError:
            raise UsageError(f"invalid pattern {a.get('pattern')!r}: expected hex bytes, "
                             "e.g. ff or deadbeef") from None
        return self.manager.corrupt(_str(a, "path"), s.cred, _int(a, "offset"),
                                    _int(a, "length"), pattern, _bool(a, "parity")), []

    def _scrub_summary(self) -> dict:
        """`status`'s scrub part: the running scrub's progress, the last result (also while
        one runs: alerts on it must not flap), and the counters over every scrub."""
        if self.scrubber is None:
            return {"state": "unavailable"}
        st = self.scrubber.status()
        last = st.get("last")
        common = {"last": None if not last else
                  {k: last[k] for k in ("finished_ns", "stopped", "seconds", "totals")},
                  "lifetime": self.scrubber.lifetime(),
                  "default_rate": self.scrubber.default_rate}
        if st.get("running"):
            return {"state": "running", "progress": st["progress"], "totals": st["totals"],
                    "eta_seconds": st["eta_seconds"], **common}
        return {"state": "idle", **common}

    def op_scrub(self, s: Session, a: dict):
        """action: start (with an optional rate in bytes/s), stop, status."""
        if self.scrubber is None:
            raise InternalError("this gpumemd has no scrubber")
        action = _str(a, "action", "status")
        if action == "start":
            rate = a.get("rate")
            if rate is not None and (not isinstance(rate, int) or isinstance(rate, bool)):
                raise UsageError("argument 'rate' must be bytes per second")
            return self.scrubber.start(rate), []
        if action == "stop":
            return self.scrubber.stop(), []
        if action == "status":
            return self.scrubber.status(), []
        raise UsageError(f"unknown scrub action {action!r}: expected start, stop or status")

    def op_close(self, s: Session, a: dict):
        written = a.get("written")
        if written is not None and not isinstance(written, dict):
            raise UsageError("argument 'written' must be an object")
        self.manager.close_handle(s, _int(a, "handle"), written=written)
        return {}, []

    async def op_status(self, s: Session, a: dict):
        m = self.manager
        devices = await self._devices()
        return {
            "daemon": {**self.info, "pid": os.getpid(), "version": VERSION,
                       "uptime_s": round(time.time() - self.started, 3),
                       "backend": m.backend.name},
            "keeper": m.keeper.info(),
            "devices": devices,
            "totals": m.totals(),
            "scrub": self._scrub_summary(),
            # Per-uid limits and use (config [quotas]): all of them for root and the
            # daemon's user, one's own for anyone else.
            "quotas": m.quotas.report(None if self._privileged(s) else s.cred.uid),
        }, []

    async def op_devices(self, s: Session, a: dict):
        return {"devices": await self._devices()}, []

    async def _devices(self) -> list[dict]:
        """The backend's devices, the bytes our allocations hold on each, and NVML telemetry
        (docs/telemetry.md). The NVML snapshot is taken on a worker thread: a slow driver
        never stalls the socket server."""
        ours: dict[str, int] = {}
        for alloc in self.manager.allocations():
            if alloc.buffer is not None:
                parity = alloc.parity.capacity if alloc.parity is not None else 0
                ours[alloc.device] = ours.get(alloc.device, 0) + alloc.capacity + parity
        backend = self.manager.backend.name
        devices = [{**d.to_dict(), "backend": backend, "ours": ours.get(d.uuid, 0)}
                   for d in self.manager.backend.devices()]
        if backend == "host":          # memfd memory: there is no GPU to ask about
            return [{**d, **nvml.unavailable_fields("the host backend has no GPU")}
                    for d in devices]
        # abandon_on_cancel: a driver call that hangs must not hold up the daemon's stop.
        snap = await trio.to_thread.run_sync(nvml.snapshot, abandon_on_cancel=True)
        return [{**d, **snap.fields_for(d["uuid"])} for d in devices]

    @staticmethod
    def _privileged(s: Session) -> bool:
        return s.cred.is_root or s.cred.uid == os.geteuid()

    def _event_visible(self, s: Session, event: dict) -> bool:
        """Other users see their own events and daemon-wide ones: paths inside private
        directories must not leak through the log."""
        return self._privileged(s) or event["uid"] == s.cred.uid or event["node"] is None

    def op_events(self, s: Session, a: dict):
        path = a.get("path")
        events = self.manager.registry.events(
            since=_int(a, "since", 0), limit=min(max(_int(a, "limit", 100), 1), 10_000),
            path=None if path is None else _str(a, "path"),
            uid=None if self._privileged(s) else s.cred.uid)
        return {"events": events}, []

    def op_check(self, s: Session, a: dict):
        repair = _bool(a, "repair")
        if repair and not self._privileged(s):
            raise PermissionDenied("permission denied: only root or the daemon's user may "
                                   "repair")
        return Checker(self.manager).run(repair=repair), []

    async def _follow_events(self, conn, session: Session, rid, args: dict) -> None:
        """Stream events as they commit until the client hangs up."""
        send, receive = trio.open_memory_channel(EVENT_QUEUE)

        def deliver(event: dict) -> None:
            if not self._event_visible(session, event):
                return
            try:
                send.send_nowait(event)
            except trio.WouldBlock:       # a reader this slow gets cut off, not buffered
                send.close()

        backlog, _ = self.op_events(session, {k: v for k, v in args.items() if k != "follow"})
        self.manager.subscribers.add(deliver)
        try:
            await framing.asend_frame(conn, {"id": rid, "ok": True, "result": backlog})
            async with trio.open_nursery() as nursery:
                async def hang_up_watch():
                    while await conn.recv(4096):
                        pass
                    nursery.cancel_scope.cancel()
                nursery.start_soon(hang_up_watch)
                async for event in receive:
                    await framing.asend_frame(conn, {"id": rid, "event": event})
                nursery.cancel_scope.cancel()
        finally:
            self.manager.subscribers.discard(deliver)


def ecc_summary(results: list[dict]) -> dict:
    """Totals over allocations, and the exit code they mean (docs/ecc.md): 0 clean, 1
    damage found and all of it repaired, 8 damage left (uncorrectable, or found without
    --repair)."""
    keys = ("blocks", "clean", "corrected", "uncorrectable", "skipped", "symbols", "bytes")
    total = {k: sum(r.get(k, 0) for r in results) for k in keys}
    total["unrepaired"] = sum(len(r.get("damaged", [])) for r in results)
    total["allocations"] = len(results)
    left = total["uncorrectable"] + total["unrepaired"] + \
        sum(len(r.get("damaged_ranges", [])) for r in results)
    total["exit"] = UNCORRECTABLE if left else (REPAIRED if total["corrected"] else OK)
    return total
