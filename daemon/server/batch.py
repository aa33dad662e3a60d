"""The handlers of many objects at once (issue 26; docs/protocol.md, "Many objects at once"):
create_many, remove_many, read_many and write_many.

Each takes a list and answers `{results: [...]}`, one result per item and in its order:
`{ok: true, result}` with what the single op answers, or `{ok: false, error: {code, name,
message, details}}` with the error it answers. The items run one after another through the
verbs of the single op (`create`, `rm`, `read`; a write as the socket's write path, without
its fd: daemon/verbs/copies.py), each authorised as that op is, so an item's error never
undoes another's. Every field is checked here: an item that is not an object, or whose
fields are not those of the schema (ops.py), is that item's usage error; more than
BATCH_MAX_ITEMS items refuse the request whole (code 2, nothing done).

Commits and the loop: the items run on the event loop one after another, and every
BATCH_SLICE_SECONDS the batch lets the loop serve everyone else (a checkpoint), so that a
batch holds the other clients a slice at a time, never the whole batch. create_many runs a
slice's creates as parts of one registry change (daemon/verbs/many.py): one commit for the
slice, with one fsync when any of them is durable, the answer after it. A create that needs
a keeper deposit of its own (a durable allocation with memory of its own) keeps its own
commit (its deposit, then its row, under the deposit lock): at most one key may be in the
keeper ahead of its row, which is what start-up takes for the residue of an interrupted
create (daemon/core/orphans.py). The other ops' transient changes share the registry's
group commit (daemon/registry/store.py), which flushes only at a checkpoint.
"""
from __future__ import annotations

import base64
import binascii
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio

from gpumemctl.protocol import GpumemError, InternalError, UsageError, jsontext
from gpumemctl.protocol.defaults import BATCH_MAX_ITEMS, BATCH_READ_BYTES, READ_COPY_BYTES

from ..verbs.plan import run
from .call import Call, Reply
from .schema import Arg, validate

log = logging.getLogger("gpumemd")
# How long a batch runs its items before it lets the loop serve the others (a checkpoint):
# what another client's request may wait behind a batch. The transient items of one slice
# share one registry commit (the group commit flushes only at a checkpoint).
BATCH_SLICE_SECONDS = 0.005

Do = Callable[[Any], Awaitable[Mapping[str, Any]]]


async def create_many(schema: tuple[Arg, ...], call: Call) -> Reply:
    """Each item is a `create` request's args (`schema`: the create op's). The items that
    need no keeper call of their own run in groups, a slice of them in one registry change
    (daemon/verbs/many.py): one commit and at most one fsync per slice. The others (a
    durable allocation with memory of its own, a lease, an existing name) run as `create`
    does, between groups."""
    cred, session = call.session.cred, call.session
    items = _bounded(call, "items")

    async def create(item: dict) -> Mapping[str, Any]:
        a = validate(schema, item)
        return await run(call.verbs.names.create(
            a["path"], cred, size=a["size"], durable=a["durable"], mode=a["mode"],
            device=a["device"], ecc=a["ecc"], exist_ok=a["exist_ok"], session=session,
            lease=a["lease"], metadata=a["metadata"]))

    def joined(item: Any) -> Mapping[str, Any] | None:
        a = validate(schema, _an_object(item))
        if a["lease"]:
            return None
        return call.verbs.many.create(
            a["path"], cred, size=a["size"], durable=a["durable"], mode=a["mode"],
            device=a["device"], ecc=a["ecc"], session=session, metadata=a["metadata"])

    results: list[dict] = []
    while len(results) < len(items):
        group, alone, deferred = _group(call, items, len(results), joined)
        if deferred is not None and deferred.owed:     # durable once on disk: then answer
            await trio.to_thread.run_sync(deferred.sync)
        results += group
        if alone is not None:
            results.append(await _answer(_object(create), alone, "items"))
        await trio.sleep(0)             # the others' turn, between groups
    return {"results": results}, []


def _group(call: Call, items: list, first: int, joined: Callable[[Any], Mapping | None]
           ) -> tuple[list[dict], Any, Any]:
    """Items from `first` on, as parts of one change, for BATCH_SLICE_SECONDS at most.
    Returns their results, the item that needs a change of its own (or None), and the
    fsync its commit owes (ManyVerbs.group)."""
    results: list[dict] = []
    started = time.monotonic()
    deferred = None
    try:
        with call.verbs.many.group() as deferred:
            while first + len(results) < len(items) and \
                    time.monotonic() - started < BATCH_SLICE_SECONDS:
                item = items[first + len(results)]
                try:
                    answer = joined(item)
                except Exception as exc:  # noqa: BLE001 - this item's answer (part undone)
                    results.append(_failed(exc, "items"))
                    continue
                if answer is None:
                    return results, item, deferred
                results.append({"ok": True, "result": answer})
    except GpumemError as exc:       # the commit failed: every item it held, undone, says so
        return [r if not r["ok"] else {"ok": False, "error": exc.to_wire()}
                for r in results], None, None
    return results, None, deferred


async def remove_many(call: Call) -> Reply:
    """Each item is a path, removed as `rm` with the request's `recursive` and `force`."""
    a = call.args

    async def remove(path: str) -> Mapping[str, Any]:
        return {"removed": call.verbs.names.remove(path, call.session.cred,
                                                    recursive=a["recursive"],
                                                    force=a["force"])}
    return await _each(call, "paths", remove)


async def read_many(schema: tuple[Arg, ...], call: Call) -> Reply:
    """Each item is a `read`: bytes by copy, read permission only, no lock, no fd. `length`
    null: to the end, at most READ_COPY_BYTES. The answer carries at most BATCH_READ_BYTES of
    data: the item that would pass it, and every item after it, is left out (code 2,
    details `left_out`: true), unread; the client asks for those again."""
    total = 0
    full = False

    async def read(item: dict) -> Mapping[str, Any]:
        nonlocal total, full
        a = validate(schema, item)
        if not full:
            length = READ_COPY_BYTES if a["length"] is None else a["length"]
            data = call.verbs.data.copy_out(a["path"], call.session.cred, a["offset"], length)
            full = total + len(data) > BATCH_READ_BYTES
            if not full:
                total += len(data)
                return {"offset": a["offset"], "bytes": len(data),
                        "data": base64.b64encode(data).decode("ascii")}
        raise UsageError(f"left out: a read_many answer carries at most {BATCH_READ_BYTES} "
                         f"bytes of data (BATCH_READ_BYTES), and {total} are taken; ask for "
                         "this item again", details={"errno": "E2BIG", "bytes": total,
                                                     "limit": BATCH_READ_BYTES,
                                                     "left_out": True})
    return await _each(call, "items", _object(read))


async def write_many(schema: tuple[Arg, ...], call: Call) -> Reply:
    """Each item is bytes (base64) to write at `offset`, within the allocation's size, by
    copy (CopyVerbs.write: the permission and the lock of `open` rw, no fd, the parity and
    the `write` event of a close). A range past the size is refused (code 2), nothing
    written."""
    cred, copies = call.session.cred, call.verbs.copies

    async def write(item: dict) -> Mapping[str, Any]:
        a = validate(schema, item)
        return await run(copies.write(a["path"], cred, a["offset"], _decoded(a["data"])))
    return await _each(call, "items", _object(write))


# ---- the loop over the items ------------------------------------------------------------------
async def _each(call: Call, name: str, do: Do) -> Reply:
    """`do` for each element of the argument `name`, in order; its answer or its error."""
    items = _bounded(call, name)
    results: list[dict] = []
    sliced = time.monotonic()
    for item in items:
        if time.monotonic() - sliced >= BATCH_SLICE_SECONDS:
            await trio.sleep(0)         # the others' turn (and the group commit's)
            sliced = time.monotonic()
        results.append(await _answer(do, item, name))
    return {"results": results}, []


def _bounded(call: Call, name: str) -> list:
    """The argument `name`'s items, at most BATCH_MAX_ITEMS (else nothing is done)."""
    items = call.args[name]
    if len(items) > BATCH_MAX_ITEMS:
        raise UsageError(f"{len(items)} {name} in one request: at most {BATCH_MAX_ITEMS} "
                         "(BATCH_MAX_ITEMS); send the rest in another request; nothing was "
                         "done", details={"items": len(items), "limit": BATCH_MAX_ITEMS})
    return items


async def _answer(do: Do, item: Any, name: str) -> dict:
    try:
        return {"ok": True, "result": await do(item)}
    except Exception as exc:  # noqa: BLE001 - the item's answer
        return _failed(exc, name)


def _failed(exc: Exception, name: str) -> dict:
    """An item's error answer; one that is no GpumemError is a bug: logged, answered as
    an internal error for this item, as for an op."""
    if not isinstance(exc, GpumemError):
        log.error("internal error in an item of %r", name, exc_info=exc)
        exc = InternalError(f"internal error: {type(exc).__name__}: {exc}")
    return {"ok": False, "error": exc.to_wire()}


def _an_object(item: Any) -> dict:
    """An item must be a JSON object (its fields are checked by the item's schema)."""
    if not isinstance(item, dict):
        kind = _JSON_KINDS.get(type(item), type(item).__name__)
        raise UsageError(f"an item must be an object, not {kind}: {_short(item)}")
    return item


def _object(do: Do) -> Do:
    async def checked(item: Any) -> Mapping[str, Any]:
        return await do(_an_object(item))
    return checked


def _decoded(data: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise UsageError(f"argument 'data' must be base64 (RFC 4648, no line breaks): "
                         f"{exc}") from None


_JSON_KINDS = {str: "a string", int: "a number", float: "a number", bool: "a boolean",
               list: "a list", type(None): "null"}


def _short(value: Any) -> str:
    """A value as the request spelt it (JSON), cut if long."""
    text = jsontext.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."
