"""What a Client's connection becomes once it streams (docs/protocol.md, `events` with
follow, `subscribe`): the frames the daemon pushes, read until the daemon or close() ends
them. Such a connection is used up: it carries no other request afterwards."""
from __future__ import annotations

from .protocol import NotRunning, framing

TYPE_CHECKING = False               # typing is not imported at run time (the CLI's start-up)
if TYPE_CHECKING:
    from collections.abc import Iterator

    from .client import Client
    from .protocol.replies import Change, Event, SubscribeAnswer


def frames(client: Client) -> Iterator[dict]:
    """The frames of a stream, until the daemon or client.close() ends it."""
    while True:
        try:
            reply, fds = framing.recv_frame(client.sock, framing.MAX_RESPONSE_BYTES)
        except (EOFError, ConnectionError, OSError) as exc:
            if client.closed:
                return
            if isinstance(exc, (EOFError, ConnectionError)):
                raise NotRunning("gpumemd closed the stream") from None
            raise
        framing.close_fds(fds)
        yield reply


def follow_events(client: Client, backlog: list[Event]) -> Iterator[Event]:
    """Client.follow_events, once the daemon answered with the `backlog`."""
    yield from backlog
    for reply in frames(client):
        if "event" in reply:
            yield reply["event"]


class Subscription:
    """The iterator Client.subscribe() returns; `last_event` is the newest event id when
    the subscription began (resubscribe with since=last_event to miss nothing)."""

    def __init__(self, client: Client, result: SubscribeAnswer):
        self.client = client
        self.last_event: int = result.get("last_event", 0)
        self._items = self._generate(result.get("events", []))

    def _generate(self, backlog: list[Event]) -> Iterator[Change]:
        for event in backlog:
            yield {"type": "event", "event": event}
        for reply in frames(self.client):
            if "event" in reply:
                yield {"type": "event", "event": reply["event"]}
            elif "changed" in reply:
                yield {"type": "changed", "nodes": reply["changed"].get("nodes", []),
                       "paths": reply["changed"].get("paths", [])}

    def __iter__(self) -> Subscription:
        return self

    def __next__(self) -> Change:
        return next(self._items)

    def close(self) -> None:
        """End the subscription (closes the Client)."""
        self.client.close()
