"""Many objects at once (issue 26; docs/protocol.md, "Many objects at once"): the client side
of `create_many`, `remove_many`, `read_many` and `write_many`, as methods of
`gpumemctl.Client` (the mixin `BatchCalls`).

Each method takes a list and returns a list, one result per item and in its order: what the
single call returns (a node, the paths removed, the bytes read, the number of bytes written),
or, where the daemon refused that item, its `GpumemError` (returned, not raised: the other
items happened all the same). With `raise_errors=True` the first item's error is raised
instead, once every item has been tried.

One request carries as many items as it may (BATCH_MAX_ITEMS, 1 MiB of JSON); a longer list
goes as several requests, in order. A read answers at most BATCH_READ_BYTES: the items it
leaves out are asked for again. A read without a length reads to the end, in pieces of
READ_COPY_BYTES; a write's data goes in pieces of BATCH_WRITE_PIECE bytes, in order (an item
whose piece fails returns that error; the pieces before it are written).

Imported by gpumemctl/client.py for every CLI call: nothing here imports more than the
protocol package (base64 only when bytes move).
"""
from __future__ import annotations

from .protocol import GpumemError, ProtocolError, UsageError, error_from_wire, framing, parse_size
from .protocol.defaults import (
    BATCH_MAX_ITEMS,
    BATCH_WRITE_PIECE,
    FILE_MODE,
    READ_COPY_BYTES,
)
from .protocol.jsontext import dumps

TYPE_CHECKING = False               # typing is not imported at run time (the CLI's start-up)
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator
    from typing import Any, Protocol

    from .protocol.replies import Allocation

    class Caller(Protocol):
        def call(self, op: str, **args: Any) -> Any: ...

# What one request's JSON may hold besides its items ({"id":..,"op":..,"args":{..}}).
ENVELOPE_BYTES = 4096


class BatchCalls:
    """The many-object calls of gpumemctl.Client (module docstring)."""

    def create_many(self: Caller, items: Iterable, *, durable: bool = False,
                    mode: int = FILE_MODE, device: str | int | None = None,
                    ecc: str | None = None, exist_ok: bool = False, lease: bool = False,
                    raise_errors: bool = False) -> list[Allocation | GpumemError]:
        """Create each item: a pair (path, size) or a dict of `create`'s arguments (path,
        size and any of the keywords here, which it overrides for that item). A size may be
        a string ("64K"). The creates share registry commits, one per slice of the batch,
        durable ones too unless their memory is their own (1 MiB and more: those commit
        one by one; docs/protocol.md, "Many objects at once")."""
        common = {"durable": durable, "mode": mode, "exist_ok": exist_ok, "lease": lease,
                  "device": None if device is None else str(device)}
        if ecc is not None:
            common["ecc"] = ecc
        wire = [_create_item(n, item, common) for n, item in enumerate(items)]
        return _settled(_send(self, "create_many", "items", wire), raise_errors)

    def remove_many(self: Caller, paths: Iterable[str], *, recursive: bool = False,
                    force: bool = False, raise_errors: bool = False
                    ) -> list[list[str] | GpumemError]:
        """Remove each path, as remove() does; each result is the paths it removed."""
        answers = _send(self, "remove_many", "paths", list(paths),
                        recursive=recursive, force=force)
        return _settled([a if isinstance(a, GpumemError) else a["removed"] for a in answers],
                        raise_errors)

    def read_many(self: Caller, items: Iterable, *, raise_errors: bool = False
                  ) -> list[bytes | GpumemError]:
        """The bytes of each item, by copy (read permission only, no lock): a path (all of
        it), or (path, offset) or (path, offset, length), or a dict of those. Clipped to the
        allocation's size, as read() is."""
        reads = [_Read(n, item) for n, item in enumerate(items)]
        _read_all(self, reads)
        return _settled([r.result() for r in reads], raise_errors)

    def write_many(self: Caller, items: Iterable, *, raise_errors: bool = False
                   ) -> list[int | GpumemError]:
        """Write each item, (path, data) or (path, data, offset) or a dict of those, by copy
        through the socket, as write() does (read and write permission, one writer at a
        time, never past the size); each result is the number of bytes written."""
        from base64 import b64encode
        pieces: list[tuple[int, dict]] = []
        for n, item in enumerate(items):
            path, data, offset = _write_item(n, item)
            view = memoryview(data).cast("B")
            for start in range(0, len(view), BATCH_WRITE_PIECE) if len(view) else (0,):
                piece = view[start:start + BATCH_WRITE_PIECE]
                pieces.append((n, {"path": path, "offset": offset + start,
                                   "data": b64encode(piece).decode("ascii")}))
        answers = _send(self, "write_many", "items", [p for _, p in pieces])
        results: dict[int, int | GpumemError] = {}
        for (n, _), answer in zip(pieces, answers, strict=True):
            before = results.get(n, 0)
            if isinstance(before, GpumemError):
                continue                    # the item's first error is its result
            results[n] = answer if isinstance(answer, GpumemError) else \
                before + answer["bytes"]
        return _settled([results[n] for n in sorted(results)], raise_errors)


# ---- requests -----------------------------------------------------------------------------------
def _send(client: Caller, op: str, key: str, wire: list, **args) -> list:
    """Each element of `wire` sent as an item of `op` (under `key`), as few requests as the
    limits allow; the answers in order: each result, or the item's error."""
    out: list = []
    for chunk in _chunks(wire):
        if isinstance(chunk, GpumemError):
            out.append(chunk)
            continue
        results = client.call(op, **{key: chunk}, **args)["results"]
        if len(results) != len(chunk):
            raise ProtocolError(f"'{op}' answered {len(results)} results for {len(chunk)} "
                                f"items")
        out.extend(r["result"] if r.get("ok") else error_from_wire(r.get("error") or {})
                   for r in results)
    return out


def _chunks(wire: list) -> Iterator[list | GpumemError]:
    """The items in requests of at most BATCH_MAX_ITEMS and MAX_REQUEST_BYTES of JSON; an
    item too large for any request comes as its error instead (nothing sent for it)."""
    budget = framing.MAX_REQUEST_BYTES - ENVELOPE_BYTES
    chunk: list = []
    used = 0
    for item in wire:
        size = len(dumps(item)) + 1
        if size > budget:
            if chunk:
                yield chunk
                chunk, used = [], 0
            yield UsageError(f"this item would make a request of {size} bytes, more than "
                             f"the {framing.MAX_REQUEST_BYTES} gpumemd reads in one request: "
                             "not sent", details={"errno": "E2BIG", "bytes": size,
                                                  "limit": framing.MAX_REQUEST_BYTES})
            continue
        if chunk and (len(chunk) == BATCH_MAX_ITEMS or used + size > budget):
            yield chunk
            chunk, used = [], 0
        chunk.append(item)
        used += size
    if chunk:
        yield chunk


def _settled(results: list, raise_errors: bool) -> list:
    if raise_errors:
        for result in results:
            if isinstance(result, GpumemError):
                raise result
    return results


# ---- the items ----------------------------------------------------------------------------------
def _create_item(n: int, item: Any, common: dict) -> dict:
    if isinstance(item, dict):
        wire = {**common, **item}
    elif isinstance(item, (tuple, list)) and len(item) == 2:
        wire = {**common, "path": item[0], "size": item[1]}
    else:
        raise UsageError(f"create_many item {n}: expected (path, size) or a dict, not "
                         f"{item!r:.60}")
    if isinstance(wire.get("size"), str):
        try:
            wire["size"] = parse_size(wire["size"])
        except UsageError as exc:
            raise UsageError(f"create_many item {n}: {exc}") from None
    if isinstance(wire.get("metadata"), dict):
        wire["metadata"] = {k: v.decode("utf-8", "surrogateescape")
                            if isinstance(v, bytes) else v
                            for k, v in wire["metadata"].items()}
    return wire


def _write_item(n: int, item: Any) -> tuple[Any, Any, int]:
    if isinstance(item, dict):
        path, data, offset = item.get("path"), item.get("data"), item.get("offset", 0)
    elif isinstance(item, (tuple, list)) and len(item) in (2, 3):
        path, data, offset = item[0], item[1], item[2] if len(item) == 3 else 0
    else:
        raise UsageError(f"write_many item {n}: expected (path, data[, offset]) or a dict, "
                         f"not {item!r:.60}")
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise UsageError(f"write_many item {n}: data must be bytes, not "
                         f"{type(data).__name__}")
    if not isinstance(offset, int) or isinstance(offset, bool):
        raise UsageError(f"write_many item {n}: offset must be an integer, not {offset!r}")
    return path, data, offset       # the daemon checks the path


class _Read:
    """One item of read_many: what is still to read, and what came."""

    def __init__(self, n: int, item: Any):
        path: Any
        if isinstance(item, str):
            path, offset, length = item, 0, None
        elif isinstance(item, dict):
            path, offset, length = item.get("path"), item.get("offset", 0), item.get("length")
        elif isinstance(item, (tuple, list)) and 1 <= len(item) <= 3:
            path, offset, length = item[0], item[1] if len(item) > 1 else 0, \
                item[2] if len(item) > 2 else None
        else:
            raise UsageError(f"read_many item {n}: expected a path, (path, offset[, length]) "
                             f"or a dict, not {item!r:.60}")
        self.path, self.offset, self.left = path, offset, length     # left None: to the end
        self.parts: list[bytes] = []
        self.error: GpumemError | None = None
        self.done = False

    def wire(self) -> dict:
        """The next piece to ask for."""
        length = READ_COPY_BYTES if self.left is None else min(self.left, READ_COPY_BYTES)
        return {"path": self.path, "offset": self.offset, "length": length}

    def take(self, answer: Any, asked: int) -> None:
        """A piece's answer: bytes (then more, unless the end came), or the item's error."""
        if isinstance(answer, GpumemError):
            self.error, self.done = answer, True
            return
        from base64 import b64decode
        data = b64decode(answer["data"])
        self.parts.append(data)
        self.offset += len(data)
        if self.left is not None:
            self.left -= len(data)
        self.done = len(data) < asked or self.left == 0 or not data

    def result(self) -> bytes | GpumemError:
        return self.error if self.error is not None else b"".join(self.parts)


def _read_all(client: Caller, reads: list[_Read]) -> None:
    """Ask for every read's pieces until each is done: an answer's left-out items (past its
    BATCH_READ_BYTES) are asked for again, with the next pieces of the others."""
    pending = list(reads)
    while pending:
        wires = [r.wire() for r in pending]
        sent = [(r, w) for r, w in zip(pending, wires, strict=True)]
        answers = _send(client, "read_many", "items", wires)
        progress = False
        for (r, w), answer in zip(sent, answers, strict=True):
            if isinstance(answer, GpumemError) and answer.details.get("left_out"):
                continue                    # asked for again in the next round
            progress = True
            r.take(answer, w["length"])
        if not progress:            # not one item fitted: never loop for ever
            for r, _ in sent:
                r.take(UsageError("read_many: gpumemd answered no item of the request"), 0)
        pending = [r for r in pending if not r.done]
