"""The socket server: a thin adapter from framed requests to the AllocationManager.

One trio task per connection. The first frame must be `hello` with our protocol version.
Each later frame is a request {id, op, args}; the answer is {id, ok: true, result} or
{id, ok: false, error: {code, name, message, details}}. A framing error (bad magic, oversized
frame, too many fds, truncated frame) is answered once and the connection is closed; the daemon
itself is unharmed. Every request is authorised by the manager from the peer's SO_PEERCRED.
Two kinds of request answer with more than one frame: streams (`events` with `follow`,
`subscribe`), which push frames until the client hangs up, and long calls (`verify`,
`recover` with `progress`), which send progress frames before their answer.
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
from gpumemctl.protocol.release import VERSION

from . import nvml
from .check import Checker
from .ecc.layout import BLOCK
from .manager import AllocationManager
from .nodes import Allocation, Node
from .permissions import X, Credentials, require, supplementary_groups
from .sessions import Session

log = logging.getLogger("gpumemd")
EVENT_QUEUE = 1024          # frames a stream may have waiting; a reader further behind is cut off
COALESCE_SECONDS = 0.05     # `subscribe`: at most one `changed` frame per this, per subscriber
PROGRESS_SECONDS = 0.1      # `progress`: at most one progress frame per this (plus the first)
PROGRESS_OPS = ("verify", "recover")


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
            if op == "subscribe":
                await self._subscribe(conn, session, rid, args)
                return False
            handler = getattr(self, "op_" + op, None)
            if handler is None:
                raise UsageError(f"unknown request {op!r}")
            if op in PROGRESS_OPS and _bool(args, "progress"):
                reply = handler(session, args, progress=self._progress_sender(conn, rid))
            else:
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
    async def op_verify(self, s: Session, a: dict, progress=None):
        """Verify (with `repair`, repair) the named allocations or all: synchronous for the
        client, piece by piece for the daemon (the event loop runs between pieces).
        `progress`: an async callable that sends a progress frame (args `progress: true`)."""
        paths = a.get("paths") or []
        if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
            raise UsageError("argument 'paths' must be a list of strings")
        repair = _bool(a, "repair")
        targets = self.manager.ecc_targets(paths, s.cred, _bool(a, "all"))
        results = await self._verify_all(targets, repair, progress)
        return {"allocations": results, "summary": ecc_summary(results)}, []

    async def op_recover(self, s: Session, a: dict, progress=None):
        alloc = self.manager.lookup_allocation(_str(a, "path"), s.cred)
        [result] = await self._verify_all([alloc], True, progress)
        return {"allocation": result, "info": self.manager.info(alloc.path, s.cred)}, []

    async def _verify_all(self, targets: list[Allocation], repair: bool,
                          progress=None) -> list[dict]:
        if progress is None:
            return [await self._drive(self.manager.verify_steps(t, repair)) for t in targets]
        meter = EccProgress(targets, progress)
        await meter.report(force=True)
        results = []
        for i, target in enumerate(targets):
            meter.begin(i)
            results.append(await self._drive(self.manager.verify_steps(target, repair),
                                             meter.piece))
            meter.end()
        return results

    @staticmethod
    async def _drive(steps, on_piece=None):
        """Run a manager generator to its end, letting the loop run between its pieces
        (`on_piece(value)`, awaited, does that when given: it always checkpoints)."""
        while True:
            try:
                value = next(steps)
            except StopIteration as done:
                return done.value
            if on_piece is None:
                await trio.sleep(0)
            else:
                await on_piece(value)

    def _progress_sender(self, conn, rid):
        """An async callable that sends {"id": rid, "progress": ...}; once the client is
        gone it sends nothing more (the work goes on, as it does without progress, and the
        answer then fails to send)."""
        gone = False

        async def send(progress: dict) -> None:
            nonlocal gone
            if gone:
                await trio.sleep(0)
                return
            try:
                await framing.asend_frame(conn, {"id": rid, "progress": progress})
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                gone = True
        return send

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
                    "eta_seconds": st["eta_seconds"], "to_scrub": st["to_scrub"],
                    "rate_now": st["rate_now"], "rate_limit": st.get("rate"),
                    "started_ns": st["started_ns"], **common}
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
        """`events` with `follow`: the backlog, then events as they commit."""
        backlog, _ = self.op_events(session, {k: v for k, v in args.items() if k != "follow"})
        await self._stream(conn, session, rid, backlog, changes=False)

    async def _subscribe(self, conn, session: Session, rid, args: dict) -> None:
        """`subscribe`: the backlog (events after `since`; none without it) and the newest
        event id, then events as they commit and coalesced `changed` frames."""
        since = args.get("since")
        if since is not None:
            since = _int(args, "since")
        limit = min(max(_int(args, "limit", 100), 1), 10_000)
        events = [] if since is None else self.manager.registry.events(
            since=since, limit=limit, uid=None if self._privileged(session) else
            session.cred.uid)
        answer = {"events": events, "last_event": self.manager.registry.last_event_id()}
        await self._stream(conn, session, rid, answer, changes=True)

    def _node_visible(self, s: Session, node: Node) -> bool:
        """Whether a `changed` frame may name this node to the session: where it could
        `info` it (search permission on every directory above it; the daemon's user and
        root see all). A removed node is judged by the directories it was in."""
        if self._privileged(s):
            return True
        directory = node.parent
        while directory is not None:
            try:
                require(directory, s.cred, X)
            except PermissionDenied:
                return False
            directory = directory.parent
        return True

    async def _stream(self, conn, session: Session, rid, answer: dict, *,
                      changes: bool) -> None:
        """Send `answer`, then push frames on this connection until the client hangs up:
        {"id": rid, "event": {...}} for each committed event the session may see and, with
        `changes`, {"id": rid, "changed": {"nodes": [...], "paths": [...]}} at most once per
        COALESCE_SECONDS, naming every node changed since the last one. Nothing is buffered
        without limit: events wait in a queue of EVENT_QUEUE frames, changes in a set of
        nodes. A client too slow to keep that queue from filling is cut off: its connection
        is closed (the frame being written when it happens is left unfinished)."""
        queue_in, queue_out = trio.open_memory_channel(EVENT_QUEUE)
        pending: dict[int, Node] = {}       # nodes changed since the last `changed` frame
        CHANGED = ("changed", None)

        with trio.CancelScope() as cut_off:
            def push(item) -> None:
                try:
                    queue_in.send_nowait(item)
                except trio.WouldBlock:   # a reader this slow gets cut off, not buffered
                    if not cut_off.cancel_called:
                        log.warning("cutting off a subscriber too slow to read (session "
                                    "%d, pid %d): %d frames waiting", session.id,
                                    session.cred.pid, EVENT_QUEUE)
                    cut_off.cancel()

            def deliver(event: dict) -> None:
                if self._event_visible(session, event):
                    push(("event", event))

            def changed(node: Node) -> None:
                if not pending:           # the first change since the last frame wakes it
                    push(CHANGED)
                pending[node.id] = node

            self.manager.subscribers.add(deliver)
            if changes:
                self.manager.change_listeners.add(changed)
            try:
                await framing.asend_frame(conn, {"id": rid, "ok": True, "result": answer})
                async with trio.open_nursery() as nursery:
                    async def hang_up_watch():
                        try:
                            while await conn.recv(4096):
                                pass        # a stream's connection takes no more requests
                        except OSError:
                            pass
                        nursery.cancel_scope.cancel()
                    nursery.start_soon(hang_up_watch)
                    last_changed = -float("inf")
                    try:
                        async for kind, event in queue_out:
                            if kind == "event":
                                await framing.asend_frame(conn, {"id": rid, "event": event})
                                continue
                            wait = last_changed + COALESCE_SECONDS - trio.current_time()
                            if wait > 0:
                                await trio.sleep(wait)   # more changes gather meanwhile
                            nodes = [n for n in pending.values()
                                     if self._node_visible(session, n)]
                            pending.clear()
                            last_changed = trio.current_time()
                            if nodes:
                                await framing.asend_frame(conn, {"id": rid, "changed": {
                                    "nodes": [n.id for n in nodes],
                                    "paths": [n.path for n in nodes]}})
                    except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                        pass                # the client went away mid-frame
                    nursery.cancel_scope.cancel()
            finally:
                self.manager.subscribers.discard(deliver)
                self.manager.change_listeners.discard(changed)


class EccProgress:
    """The progress frames of one verify or recover: one at the start, then at most one
    per PROGRESS_SECONDS. `total_bytes` is the protected bytes (the size of each allocation
    with ECC and memory) of all targets at the start; `done_bytes` never decreases and
    never passes it, whatever the allocations do meanwhile (grow, shrink, go away)."""

    def __init__(self, targets: list[Allocation], send):
        self.targets, self.send = targets, send
        self.sizes = [self.protected_bytes(t) for t in targets]
        self.total = sum(self.sizes)
        self.index = 0              # the allocation being verified
        self.base = 0               # protected bytes of the allocations finished
        self.current = 0            # bytes of the current one checked so far
        self.last = -float("inf")

    @staticmethod
    def protected_bytes(alloc: Allocation) -> int:
        if alloc.ecc != "rs" or alloc.state not in ("ready", "degraded"):
            return 0
        return alloc.size or 0

    def begin(self, index: int) -> None:
        self.index, self.current = index, 0

    def end(self) -> None:
        self.base += self.sizes[self.index]
        self.index, self.current = self.index + 1, 0

    async def piece(self, block: int) -> None:
        self.current = min(block * BLOCK, self.sizes[self.index])
        await self.report()

    async def report(self, force: bool = False) -> None:
        now = trio.current_time()
        if not force and now - self.last < PROGRESS_SECONDS:
            await trio.sleep(0)
            return
        self.last = now
        i = min(self.index, len(self.targets) - 1)
        await self.send({
            "path": self.targets[i].path if self.targets else None,
            "done_bytes": self.base + self.current, "total_bytes": self.total,
            "allocations_done": self.index, "allocations": len(self.targets)})


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
