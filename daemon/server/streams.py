"""The event log over the socket, and every request answered with more than one frame:
`events` (with `follow`, a stream), `subscribe` (a stream of events and coalesced `changed`
frames) and the progress frames of long calls (docs/protocol.md, "Streams").

A stream answers first, then pushes frames on its connection until the client hangs up;
nothing is buffered without limit, and a reader too slow to keep up is cut off.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import trio

from ..core.nodes import Node
from .call import (
    Call,
    ProgressSend,
    Reply,
    administrator,
    event_visible,
    node_visible,
    own_uid_unless_privileged,
)
from .transport import PEER_GONE, Connection

log = logging.getLogger("gpumemd")
EVENT_QUEUE = 1024          # frames a stream may have waiting; a reader further behind is cut off
COALESCE_SECONDS = 0.05     # `subscribe`: at most one `changed` frame per this, per subscriber
# Bytes of detail and path text in one answer's events (docs/protocol.md, "Limits"): the
# newest that fit, `complete: false` when older ones were left out (page with `since`).
EVENTS_ANSWER_BYTES = 4 << 20


async def events(call: Call) -> Reply:
    a = call.args
    found, complete = call.verbs.reports.events(
        since=a["since"], limit=a["limit"], path=a["path"], max_bytes=EVENTS_ANSWER_BYTES,
        **_whose_view(call))
    return {"events": found, "complete": complete}, []


def _whose_view(call: Call) -> dict:
    """The arguments of Reports.events that limit it to what this session may see
    (call.event_visible, in SQL)."""
    return {"uid": own_uid_unless_privileged(call.session),
            "administrator": administrator(call)}


async def follow_events(call: Call, conn: Connection) -> None:
    """`events` with `follow`: the backlog, then events as they commit."""
    backlog, _ = await events(call)
    await stream(call, conn, backlog, changes=False)


async def subscribe(call: Call, conn: Connection) -> None:
    """`subscribe`: the backlog (events after `since`; none without it) and the newest
    event id, then events as they commit and coalesced `changed` frames."""
    since, reports = call.args["since"], call.verbs.reports
    backlog, complete = ([], True) if since is None else reports.events(
        since=since, limit=call.args["limit"], max_bytes=EVENTS_ANSWER_BYTES,
        **_whose_view(call))
    answer = {"events": backlog, "complete": complete, "last_event": reports.last_event_id()}
    await stream(call, conn, answer, changes=True)


def progress_sender(conn: Connection, rid: Any) -> ProgressSend:
    """An async callable that sends {"id": rid, "progress": ...}; once the client is gone it
    sends nothing more (the work goes on, as it does without progress, and the answer then
    fails to send)."""
    gone = False

    async def send(progress: dict) -> None:
        nonlocal gone
        if gone:
            await trio.sleep(0)
            return
        try:
            await conn.push({"id": rid, "progress": progress})
        except PEER_GONE:
            gone = True
    return send


class _Outbox:
    """A stream's frames waiting to be sent: events in a queue of EVENT_QUEUE, changed
    nodes in a set (one wake-up in the queue stands for all of them). Filling the queue
    cancels `cut_off`: the client is too slow and its connection is closed."""

    CHANGED = ("changed", None)

    def __init__(self, call: Call, cut_off: trio.CancelScope):
        self.call, self.cut_off = call, cut_off
        self.queue_in, self.queue_out = trio.open_memory_channel[tuple[str, Any]](EVENT_QUEUE)
        self.pending: dict[int, Node] = {}  # nodes changed since the last `changed` frame

    def _push(self, item: tuple[str, Any]) -> None:
        try:
            self.queue_in.send_nowait(item)
        except trio.WouldBlock:   # a reader this slow gets cut off, not buffered
            if not self.cut_off.cancel_called:
                session = self.call.session
                log.warning("cutting off a subscriber too slow to read (session %d, pid %d): "
                            "%d frames waiting", session.id, session.cred.pid, EVENT_QUEUE)
            self.cut_off.cancel()

    def deliver(self, event: dict) -> None:
        """The journal's subscriber callback: an event has committed."""
        if event_visible(self.call, event):
            self._push(("event", event))

    def changed(self, node: Node) -> None:
        """The journal's change listener: a node changed in a way a monitor redraws."""
        if not self.pending:           # the first change since the last frame wakes it
            self._push(self.CHANGED)
        self.pending[node.id] = node

    def take_changed(self) -> list[Node]:
        """The changed nodes this session may see; the set starts again empty."""
        nodes = [n for n in self.pending.values() if node_visible(self.call, n)]
        self.pending.clear()
        return nodes


async def stream(call: Call, conn: Connection, answer: Mapping[str, Any], *,
                 changes: bool) -> None:
    """Send `answer`, then push frames on this connection until the client hangs up:
    {"id": rid, "event": {...}} for each committed event the session may see and, with
    `changes`, {"id": rid, "changed": {"nodes": [...], "paths": [...]}} at most once per
    COALESCE_SECONDS, naming every node changed since the last one. A client too slow to
    keep the outbox from filling is cut off: its connection is closed (the frame being
    written when it happens is left unfinished)."""
    with trio.CancelScope() as cut_off:
        outbox = _Outbox(call, cut_off)
        with call.verbs.reports.observing(outbox.deliver, outbox.changed if changes else None):
            await conn.answer(call.rid, answer)
            async with trio.open_nursery() as nursery:
                async def hang_up_watch() -> None:
                    await conn.wait_hang_up()
                    nursery.cancel_scope.cancel()
                nursery.start_soon(hang_up_watch)
                try:
                    await _send_outbox(call, conn, outbox)
                except PEER_GONE:
                    pass                # the client went away mid-frame
                nursery.cancel_scope.cancel()


async def _send_outbox(call: Call, conn: Connection, outbox: _Outbox) -> None:
    last_changed = -float("inf")
    async for kind, event in outbox.queue_out:
        if kind == "event":
            await conn.push({"id": call.rid, "event": event})
            continue
        wait = last_changed + COALESCE_SECONDS - trio.current_time()
        if wait > 0:
            await trio.sleep(wait)   # more changes gather meanwhile
        nodes = outbox.take_changed()
        last_changed = trio.current_time()
        if nodes:
            await conn.push({"id": call.rid, "changed": {
                "nodes": [n.id for n in nodes], "paths": [n.path for n in nodes]}})
