"""An open allocation (`Client.open`, `Client.refill`): the mapping of its memory in this
process (gpumemctl/memory.py: an mmap on the host backend, an imported CUDA allocation on
the cuda backend) and the daemon's lock on it, given back at close with the ranges written
(the daemon's change tracking, for incremental snapshots, reads only what a handle reports).
"""
from __future__ import annotations

from .protocol import out_of_range

TYPE_CHECKING = False               # typing is not imported at run time (the CLI's start-up)
if TYPE_CHECKING:
    from .client import Client
    from .protocol.replies import Allocation

MAX_RANGES = 256        # written ranges a handle reports at close (more are joined)


class Handle:
    """An open allocation: a mapping of its memory and the daemon's lock on it."""

    def __init__(self, client: Client, handle_id: int, fds: list[int], info: Allocation,
                 writable: bool, backend: str = "host"):
        self.client, self.id, self.info, self.writable = client, handle_id, info, writable
        self.size = info["size"]
        self.backend = backend
        from .memory import open_memory
        self.memory = open_memory(backend, fds, info, writable)
        self.map = getattr(self.memory, "map", None)     # the mmap, on the host backend
        self._written: dict | None = None
        self._ranges: list[list[int]] = []     # what was written, merged (_note_write)
        self.restored: dict | None = None    # a refill handle's outcome, sent at close

    def _check_range(self, offset: int, length: int, *, writing: bool = False) -> None:
        if offset < 0 or length < 0 or offset + length > self.size:
            raise out_of_range(self.info["path"], offset, length, self.size, writing=writing)

    def read(self, offset: int = 0, length: int | None = None) -> bytes:
        length = self.size - offset if length is None else length
        self._check_range(offset, length)
        return self.memory.read(offset, length)

    def write(self, data, offset: int = 0) -> None:
        self._check_range(offset, len(data), writing=True)
        self.memory.write(offset, data)
        self._note_write(offset, len(data))

    def _note_write(self, offset: int, length: int) -> None:
        """Remember the range written: the daemon's change tracking (incremental
        snapshots) reads only what a handle reports. Kept as merged ranges, at most
        MAX_RANGES of them (past that the two closest are joined)."""
        if length <= 0:
            return
        ranges = self._ranges
        ranges.append([offset, offset + length])
        ranges.sort()
        merged = [ranges[0]]
        for a, b in ranges[1:]:
            if a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        while len(merged) > MAX_RANGES:
            k = min(range(len(merged) - 1), key=lambda i: merged[i + 1][0] - merged[i][1])
            merged[k:k + 2] = [[merged[k][0], merged[k + 1][1]]]
        self._ranges = merged
        self._written = {"offset": merged[0][0], "end": merged[-1][1]}

    def close(self) -> None:
        if self.memory is None:
            return
        memory, self.memory, self.map = self.memory, None, None
        written: dict | None = None
        if len(self._ranges) > 1:
            written = {"ranges": self._ranges}
        elif self._written:
            written = {"offset": self._written["offset"],
                       "bytes": self._written["end"] - self._written["offset"]}
        elif self.writable:
            written = {"ranges": []}     # wrote nothing: no parity to encode at close
        try:
            memory.close()
        finally:                 # the lock goes even if unmapping failed
            if self.restored is not None:
                self.client.call("close", handle=self.id, written=written,
                                 restored=self.restored)
            else:
                self.client.call("close", handle=self.id, written=written)

    def __enter__(self) -> Handle:
        return self

    def __exit__(self, *exc):
        self.close()
