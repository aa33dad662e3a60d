"""The blocking client library: `gpumemctl.Client`.

One connection per Client, safe to share between threads (a lock serialises requests). The
connection is also the session: a transient allocation created with `lease=True` is freed
when the session ends, whether the Client is closed or its process dies.

Data moves through passed fds, never through JSON: `open()` receives the allocation's fd and
the client maps it (gpumemctl.memory): on the host backend a memfd, mapped with mmap (read-only
opens get a read-only fd); on the cuda backend an exported CUDA allocation, imported and
mapped into this process's CUDA context (read-only access for read-only opens) and copied
through pinned staging buffers. CUDA is imported only in the second case.

A CLI call makes one Client and one request, so what this module imports at the top is paid
by every `gpumemctl ls`: the C cores `_socket` and `_thread` rather than `socket` and
`threading` (their Python layers import `enum`, `selectors` and `collections`, several
milliseconds), and the memory mapping only when an allocation is opened. Beside it: an
open allocation (gpumemctl/handle.py), the streaming data paths of read_to/write_from
(gpumemctl/transfer.py) and what a streaming connection reads (gpumemctl/streams.py), each
imported when first used. The answers are typed (gpumemctl/protocol/replies.py), for mypy
only.
"""
from __future__ import annotations

import os
from _socket import AF_UNIX, SHUT_RDWR, SOCK_CLOEXEC, SOCK_STREAM
from _socket import socket as unix_socket
from _thread import allocate_lock  # what threading.Lock() returns

from .batch import BatchCalls
from .protocol import (
    PROTOCOL_VERSION,
    NotRunning,
    ProtocolError,
    default_socket,
    error_from_wire,
    framing,
    parse_size,
)
from .protocol.defaults import (
    CORRUPT_PATTERN,
    DIR_MODE,
    EVENTS_LIMIT,
    EVENTS_MAX_LIMIT,
    FILE_MODE,
    OPEN_MODE,
    READ_COPY_BYTES,
    SCRUB_ACTION,
)

TYPE_CHECKING = False               # typing is not imported at run time (the CLI's start-up)
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any, BinaryIO

    from .attach import Attachment
    from .handle import Handle
    from .protocol.replies import (
        Allocation,
        CheckResult,
        Compacted,
        Corrupted,
        Device,
        Directory,
        Event,
        GpuEvent,
        Hello,
        Holder,
        MetaRemoved,
        MetaSet,
        Node,
        RecoverResult,
        ScrubStatus,
        Status,
        Symlink,
        VerifyProgress,
        VerifyResult,
    )
    from .sleepwake import Slept, Woken
    from .streams import Subscription


class Client(BatchCalls):
    """A connection to gpumemd, and the session it is (module docstring); many objects in
    one request: create_many, remove_many, read_many, write_many (gpumemctl/batch.py)."""

    def __init__(self, socket_path: str | None = None, *, client_name: str = "gpumemctl",
                 timeout: float | None = 60.0):
        self.socket_path = socket_path or default_socket()
        self._lock = allocate_lock()
        self._next_id = 0
        self._closed = False
        self._pid = os.getpid()
        self.sock = unix_socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC)
        try:
            # Connect blocking: with a timeout set, a full listen backlog makes connect() fail
            # with EAGAIN, which would read as "not running" during a burst of clients.
            self.sock.connect(self.socket_path)
            self.sock.settimeout(timeout)
        except OSError as exc:
            self.sock.close()
            from .hints import not_running
            raise not_running(self.socket_path, exc.errno, exc.strerror) from None
        self.hello: Hello = self.call("hello", version=PROTOCOL_VERSION, client=client_name)

    # ---- transport ----------------------------------------------------------------------
    def call_fds(self, op: str, **args) -> tuple[Any, list[int]]:
        return self._call(op, args)

    def _call(self, op: str, args: dict, progress: Callable[[VerifyProgress], None] | None = None
              ) -> tuple[Any, list[int]]:
        """Send one request and read its answer. `progress` receives the payload of each
        progress frame the daemon sends for it first (verify/recover with progress: true);
        it runs under this Client's lock, so it must not call this Client. Should it
        raise, the answer is still read (the connection stays in step) and then the
        exception is raised."""
        failure: BaseException | None = None
        with self._lock:
            self._next_id += 1
            rid = self._next_id
            try:
                framing.send_frame(self.sock, {"id": rid, "op": op, "args": args},
                                   limit=framing.MAX_REQUEST_BYTES)
                while True:
                    reply, fds = framing.recv_frame(self.sock, framing.MAX_RESPONSE_BYTES)
                    if "progress" not in reply or reply.get("id") != rid:
                        break
                    framing.close_fds(fds)
                    if progress is not None and failure is None:
                        try:
                            progress(reply["progress"])
                        except Exception as exc:  # noqa: BLE001 - raised after the answer
                            failure = exc
            except (EOFError, ConnectionError) as exc:
                raise NotRunning(f"gpumemd closed the connection ({exc})") from None
            except OSError:
                if self._closed:
                    raise NotRunning("the client was closed") from None
                raise
        if failure is not None:
            framing.close_fds(fds)
            raise failure
        if not reply.get("ok"):
            framing.close_fds(fds)
            raise error_from_wire(reply.get("error") or {})
        if reply.get("id") != rid:
            framing.close_fds(fds)
            raise ProtocolError(f"answer to request {reply.get('id')} while waiting for {rid}")
        return reply["result"], fds

    def call(self, op: str, **args) -> Any:
        """One request and its answer (the op's result, as the daemon sent it)."""
        result, fds = self.call_fds(op, **args)
        framing.close_fds(fds)
        return result

    def close(self) -> None:
        """Close the connection (ending the session). Safe from another thread: a
        follow_events() or subscribe() iterator blocked on this connection then ends."""
        self._closed = True
        if os.getpid() == self._pid:
            # shutdown() wakes a thread blocked in recv() on this socket (close() alone
            # does not). Not in a forked child: that would cut its parent's connection.
            try:
                self.sock.shutdown(SHUT_RDWR)
            except OSError:
                pass
        self.sock.close()

    @property
    def closed(self) -> bool:
        """Whether close() was called (a stream reading this connection then ends)."""
        return self._closed

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- namespace ----------------------------------------------------------------------
    def ls(self, path: str = "", *, recursive: bool = False) -> list[Node]:
        """Every entry, however many answers it takes (walk())."""
        return list(self.walk(path, recursive=recursive))

    def walk(self, path: str = "", *, recursive: bool = True) -> Iterator[Node]:
        """The entries of `path` (recursively by default), page after page: a listing
        larger than any one answer, held in memory one page at a time (docs/protocol.md,
        "ls by pages"). A daemon that does not page answers everything at once."""
        after = None
        while True:
            page = self.call("ls", path=path, recursive=recursive, limit=EVENTS_MAX_LIMIT,
                             **({} if after is None else {"after": after}))
            yield from page["entries"]
            if page.get("next") is None:
                return
            if page["next"] == after:
                raise ProtocolError(f"gpumemd paged 'ls' without moving on from {after!r}")
            after = page["next"]

    def info(self, path: str) -> Node:
        return self.call("info", path=path)

    def create(self, path: str, size: int | str, *, durable: bool = False, mode: int = FILE_MODE,
               device: str | int | None = None, ecc: str | None = None,
               exist_ok: bool = False, lease: bool = False,
               metadata: dict[str, str] | None = None) -> Allocation:
        """`ecc` None: the daemon's default (its configuration's `ecc`, else "rs").
        `metadata`: user metadata {key: value} the new allocation gets in the same step
        (see meta_set; an existing one, with `exist_ok`, keeps its own)."""
        args = {"path": path, "size": parse_size(size), "durable": durable, "mode": mode,
                "device": None if device is None else str(device), "exist_ok": exist_ok,
                "lease": lease}
        if ecc is not None:
            args["ecc"] = ecc
        if metadata is not None:
            args["metadata"] = {key: _text(value) for key, value in metadata.items()}
        return self.call("create", **args)

    def mkdir(self, path: str, *, mode: int = DIR_MODE, parents: bool = False) -> Directory:
        return self.call("mkdir", path=path, mode=mode, parents=parents)

    def symlink(self, target: str, path: str) -> Symlink:
        """A symbolic link at `path` to `target` (argument order as ln -s and os.symlink);
        returns the link's node."""
        return self.call("symlink", path=path, target=target)

    def link(self, target: str, path: str) -> Node:
        """A hard link: `path` becomes one more name of what `target` names (argument order
        as ln and os.link; `target`'s last component is not followed). The node under its
        new name, with `links` (`info` lists the names)."""
        return self.call("link", path=path, target=target)

    def readlink(self, path: str) -> str:
        return self.call("readlink", path=path)["target"]

    def remove(self, path: str, *, recursive: bool = False, force: bool = False) -> list[str]:
        return self.call("rm", path=path, recursive=recursive, force=force)["removed"]

    def set_durable(self, path: str, durable: bool = True) -> Allocation:
        return self.call("durable", path=path, durable=durable)

    def rename(self, path: str, to: str, *, replace: bool = True) -> Node:
        """Give `path` the name `to` (rename(2): an existing `to` is replaced, unless
        `replace` is False; `to`'s directory must exist). Returns the node."""
        return self.call("rename", path=path, to=to, no_replace=not replace)

    def resize(self, path: str, size: int) -> Allocation:
        """Set an allocation's size (as truncate(2)): bytes past the old size read as
        zeros. No other client may hold it open or attached (Busy)."""
        return self.call("resize", path=path, size=size)

    # ---- data -----------------------------------------------------------------------------
    def open(self, path: str, mode: str = OPEN_MODE) -> Handle:
        from .handle import Handle
        from .memory import expect_fds
        result, fds = self.call_fds("open", path=path, mode=mode, regions=True, extents=True)
        expect_fds("open", result["info"], fds)
        backend = result.get("backend") or self.hello.get("backend", "host")
        try:
            return Handle(self, result["handle"], fds, result["info"], mode == "rw",
                          backend)
        except BaseException:
            self.call("close", handle=result["handle"], written=None)   # drop the lock
            raise

    def refill(self, path: str, *, size: int, mode: int = FILE_MODE, ecc: str | None = None,
               durable: bool = False, device: str | None = None, force: bool = False,
               unsealed: bool = False, metadata: dict[str, str] | None = None) -> Handle:
        """A handle to fill `path` from a snapshot (gpumemctl/snapshots): the allocation is
        made if missing, refilled in place if `lost` (or, with `force`, if it holds data
        the caller may write), and stays `restoring` until this handle closes with
        `handle.restored` set ({damaged: [[start, end], ...]}); without it, it ends `lost`.
        `metadata`: the user metadata it is to have, all of it (None: a new one has none,
        an existing one keeps its own)."""
        from .handle import Handle
        from .memory import expect_fds
        args: dict = {"path": path, "size": size, "mode": mode, "ecc": ecc,
                      "durable": durable, "device": device, "force": force,
                      "unsealed": unsealed, "extents": True}
        if metadata is not None:
            args["metadata"] = {key: _text(value) for key, value in metadata.items()}
        result, fds = self.call_fds("refill", **args)
        expect_fds("refill", result["info"], fds)
        backend = result.get("backend") or self.hello.get("backend", "host")
        try:
            return Handle(self, result["handle"], fds, result["info"], True, backend)
        except BaseException:
            self.call("close", handle=result["handle"], written=None)
            raise

    # ---- user metadata (docs/protocol.md, "User metadata") --------------------------------
    # Keys and values are str; bytes that are not UTF-8 travel with surrogateescape, as
    # names do (a value given as bytes is spelled so here).
    def meta(self, path: str) -> dict[str, str]:
        """All of the user metadata of an allocation or directory: {key: value}."""
        return self.call("meta_list", path=path)["metadata"]

    def meta_get(self, path: str, key: str) -> str:
        """One value; NotFound (exit code 4) when the key is not set."""
        return self.call("meta_get", path=path, key=key)["value"]

    def meta_set(self, path: str, key: str, value: str | bytes, *, create: bool = False,
                 replace: bool = False) -> MetaSet:
        """Set one key: {path, key, bytes}. `create`: Exists (5) if it is set already;
        `replace`: NotFound (4) if it is not. Over metadata_max_bytes: UsageError (2); over
        the owner's metadata_user_max_bytes: NoMemory (7)."""
        return self.call("meta_set", path=path, key=key, value=_text(value), create=create,
                         replace=replace)

    def meta_rm(self, path: str, key: str) -> MetaRemoved:
        """Remove one key: {path, key}; NotFound (4) when it is not set."""
        return self.call("meta_rm", path=path, key=key)

    def snapshot_report(self, **report) -> dict:
        """Tell gpumemd what a snapshot or restore did (its events, status, metrics)."""
        return self.call("snapshot_report", **report)

    def read(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        with self.open(path, "r") as h:
            return h.read(offset, length)

    def write(self, path: str, data, offset: int = 0) -> None:
        with self.open(path, "rw") as h:
            h.write(data, offset)

    def read_to(self, path: str, out: BinaryIO, offset: int = 0, length: int | None = None,
                progress: Callable[[int, int], None] | None = None) -> int:
        """Stream a range of an allocation to a file object; returns bytes written. Through
        an fd where the daemon gives one; by copy where it does not (a reader on the cuda
        backend: docs/security.md)."""
        from .transfer import read_to
        return read_to(self, path, out, offset, length, progress)

    def read_copy(self, path: str, offset: int = 0, length: int = READ_COPY_BYTES) -> bytes:
        """Up to `length` (at most READ_COPY_BYTES) bytes at `offset`, copied through the
        socket: no fd, no lock, read permission only (b"" at or past the end)."""
        from base64 import b64decode  # only on this path (module docstring)
        answer = self.call("read", path=path, offset=offset, length=length)
        return b64decode(answer["data"])

    def write_from(self, path: str, src: BinaryIO, offset: int = 0,
                   progress: Callable[[int, int], None] | None = None,
                   total: int | None = None) -> int:
        """Stream a file object into an allocation; fails before writing past its size."""
        from .transfer import write_from
        return write_from(self, path, src, offset, progress, total)

    # ---- mapping into this process, RDMA ------------------------------------------------
    def attach(self, path: str, mode: str = OPEN_MODE) -> Attachment:
        """Map an allocation into this process (see gpumemctl.attach); the attachment
        belongs to this connection's session."""
        from .attach import attach
        return attach(path, mode, client=self)

    def sleep(self, names: str | list[str]) -> list[Slept]:
        """Put allocations to sleep, parking this process's attachments (gpumemctl/sleepwake.py)."""
        from .sleepwake import sleep
        return sleep(self, names)

    def wake(self, names: str | list[str]) -> list[Woken]:
        """Wake allocations; this process's attachments see them again where they were."""
        from .sleepwake import wake
        return wake(self, names)

    def revoke(self, path: str) -> list[Holder]:
        """Take the read handles and read-only attachments of every other session off the
        allocation (its owner, or the administrator); returns them ({id, kind, pid, uid,
        session, since_ns}). Their mappings stay; their close/detach then answers quietly."""
        return self.call("revoke", path=path)["revoked"]

    def seal(self, path: str) -> Allocation:
        """Declare the data written by an attached writer complete (clears `unsealed`)."""
        return self.call("seal", path=path)

    def export_dmabuf(self, path: str) -> int:
        """A dma-buf fd covering the allocation's capacity, for RDMA registration (e.g.
        ibv_reg_dmabuf_mr at offset 0). The caller owns and closes it. Needs read and write
        permission, the cuda backend and a device with dma-buf support; otherwise
        InvalidState (exit code 10) says which is missing (docs/cuda.md)."""
        _result, fds = self.call_fds("export_dmabuf", path=path)
        if len(fds) != 1:
            framing.close_fds(fds)
            raise ProtocolError(f"'export_dmabuf' answered with {len(fds)} fds, expected 1")
        return fds[0]

    # ---- daemon -------------------------------------------------------------------------
    def status(self) -> Status:
        return self.call("status")

    def devices(self) -> list[Device]:
        return self.call("devices")["devices"]

    def events(self, *, since: int = 0, limit: int = EVENTS_LIMIT,
               path: str | None = None) -> list[Event]:
        return self.events_page(since=since, limit=limit, path=path)[0]

    def events_page(self, *, since: int = 0, limit: int = EVENTS_LIMIT,
                    path: str | None = None) -> tuple[list[Event], bool]:
        """events(), and whether the answer is complete: False when older events after
        `since` were left out because one answer carries at most 4 MiB of them (the newest
        are kept; docs/protocol.md, "Limits")."""
        args: dict[str, object] = {"since": since, "limit": limit}
        if path:
            args["path"] = path
        answer = self.call("events", **args)
        return answer["events"], answer.get("complete", True)

    def follow_events(self, *, since: int = 0, limit: int = EVENTS_LIMIT) -> Iterator[Event]:
        """The backlog, then each new event as it commits. Uses up this connection.
        Ends (StopIteration) when this Client is closed, from any thread."""
        from .streams import follow_events
        self.sock.settimeout(None)
        backlog = self.call("events", since=since, limit=limit, follow=True)["events"]
        yield from follow_events(self, backlog)

    def subscribe(self, since: int | None = None, limit: int = EVENTS_LIMIT) -> Subscription:
        """Live changes, for monitors (docs/protocol.md, `subscribe`): an iterator of
        {"type": "event", "event": {...}} (first the backlog: events after `since`, at most
        `limit`; none when `since` is None), then, as they happen,
        {"type": "event", "event": {...}} and
        {"type": "changed", "nodes": [ids], "paths": [paths]} (coalesced: at most one per
        ~50 ms). Its `last_event` is the newest event id when it started. Uses up this
        connection; close() of this Client, from any thread, ends the iteration. A
        subscriber that falls too far behind is cut off by the daemon: NotRunning."""
        from .streams import Subscription
        self.sock.settimeout(None)
        args: dict = {"limit": limit}
        if since is not None:
            args["since"] = since
        result = self.call("subscribe", **args)
        return Subscription(self, result)

    def check(self, *, repair: bool = False) -> CheckResult:
        return self.call("check", repair=repair)

    def compact(self, *, dry_run: bool = False) -> Compacted:
        """Compact the slabs (the administrator only; docs/storage.md): no timeout."""
        return self._long_call("compact", dry_run=dry_run)

    # ---- ECC (docs/ecc.md) ------------------------------------------------------------------
    def _long_call(self, op: str, progress: Callable[[VerifyProgress], None] | None = None,
                   **args) -> Any:
        """A call that runs as long as the work does (a verify of terabytes): no timeout.
        With `progress`, the daemon sends progress frames first, each passed to it."""
        if progress is not None:
            args["progress"] = True
        before = self.sock.gettimeout()
        self.sock.settimeout(None)
        try:
            result, fds = self._call(op, args, progress)
            framing.close_fds(fds)
            return result
        finally:
            self.sock.settimeout(before)

    def verify(self, paths: list[str] | None = None, *, all: bool = False,
               repair: bool = False, progress: Callable[[VerifyProgress], None] | None = None
               ) -> VerifyResult:
        """`progress` receives {path, done_bytes, total_bytes, allocations_done,
        allocations} up to ~10 times a second (it must not call this Client)."""
        return self._long_call("verify", progress, paths=list(paths or []), all=all,
                               repair=repair)

    def recover(self, path: str, progress: Callable[[VerifyProgress], None] | None = None
                ) -> RecoverResult:
        return self._long_call("recover", progress, path=path)

    def scrub(self, action: str = SCRUB_ACTION, *, rate: int | None = None) -> ScrubStatus:
        args: dict[str, object] = {"action": action}
        if rate is not None:
            args["rate"] = rate
        return self.call("scrub", **args)

    def debug_corrupt(self, path: str, *, offset: int, length: int, parity: bool = False,
                      pattern: str = CORRUPT_PATTERN) -> Corrupted:
        return self.call("debug_corrupt", path=path, offset=offset, length=length,
                         parity=parity, pattern=pattern)

    def debug_gpu_event(self, device: int, *, xid: int | None = None, ecc: str | None = None,
                        remap: bool = False) -> GpuEvent:
        """A GPU health incident on device `device` (its index), as if NVML reported it:
        one of `xid`, `ecc` ("double") or `remap` (gpumemd --enable-fault-injection)."""
        return self.call("debug_gpu_event", device=device, xid=xid, ecc=ecc, remap=remap)


def _text(value: str | bytes) -> str:
    """A metadata value as the wire carries it: bytes spelled with surrogateescape."""
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value


def __getattr__(name: str):
    """gpumemctl.client.Handle and .Subscription, where they were before they had modules of
    their own (imported when asked for: most CLI calls never need them)."""
    if name == "Handle":
        from .handle import Handle
        return Handle
    if name == "Subscription":
        from .streams import Subscription
        return Subscription
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
