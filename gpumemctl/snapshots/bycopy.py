"""An asleep allocation in a snapshot (issue 28; docs/engines.md, "Sleep and wake"): its
bytes wait in the daemon's host memory, with no device memory to hand out an fd of, so
`snapshot create` reads them by copy through the socket (op `read`, as `gpumemctl read`
does) instead of skipping a durable model because its engine put it to sleep.

A read by copy takes no lock: a wake and a write could land between two pieces. So the
allocation is looked at again once read: still asleep, and not modified since, or the copy
is refused (InvalidState) and the allocation skipped and named, as a busy one is. Each piece
names the allocation's id (op `read`'s `id`): a name its owner gives to another allocation
between two pieces (a rename there and back, which a look at the end would not see) is
refused by the daemon, so root's snapshot never records one allocation's bytes, and owner,
under another's entry."""
from __future__ import annotations

from base64 import b64decode
from collections.abc import Callable

from ..protocol import InvalidState
from ..protocol.defaults import READ_COPY_BYTES


class AsleepHandle:
    """What snapshot create's copy needs of a read handle (`info`, `memory.drain`,
    `client`), for an allocation read by copy; `id` None: no change tracking, every block
    is read (an incremental snapshot still writes only the blocks that differ)."""

    def __init__(self, client, path: str):
        self.client, self.path, self.id = client, path, None
        self.info = client.info(path)
        self.memory = CopyReader(client, path, self.info["id"])

    def __enter__(self) -> AsleepHandle:
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.require_unchanged()

    def require_unchanged(self) -> None:
        now = self.client.info(self.path)
        if now.get("state") != "asleep" or now.get("modified") != self.info.get("modified") \
                or now.get("id") != self.info.get("id"):
            raise InvalidState(f"'{self.path}' woke and changed while it was copied into the "
                               "snapshot; take the snapshot again")


class CopyReader:
    """memory.drain by op `read`, READ_COPY_BYTES (a whole number of blocks) at a time."""
    chunk = READ_COPY_BYTES

    def __init__(self, client, path: str, node: int):
        self.client, self.path, self.node = client, path, node

    def drain(self, offset: int, length: int, sink: Callable[[int, memoryview], None]) -> None:
        done = 0
        while done < length:
            answer = self.client.call("read", path=self.path, offset=offset + done,
                                      length=min(READ_COPY_BYTES, length - done),
                                      id=self.node)
            data = b64decode(answer["data"])
            if not data:
                raise InvalidState(f"'{self.path}' ended at {offset + done} bytes while it "
                                   "was copied into the snapshot")
            sink(offset + done, memoryview(data))
            done += len(data)
