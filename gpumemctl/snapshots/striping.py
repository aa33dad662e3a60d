"""How a snapshot writes one allocation's data (docs/snapshots.md, "Format"): striped over
data objects in a directory store, one object in an object store, or straight from GPU
memory by KvikIO (gds.py); and the extents the manifest records of where each block went.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import gds
from . import manifest as fmt
from .blocks import UNIT, gather, hash_jobs
from .iopool import io_pool
from .manifest import BLOCK

STRIPES = 16               # data objects per allocation in a directory store


class Writing:
    """One allocation's data, written as blocks go by. In a directory store it is striped
    over STRIPES objects in 8 MiB units, so that parallel writes go to different files (a
    file system serialises writes to one file: tmpfs's 2 GB/s against the 27 GB/s of 16
    files at once on the GPU machine); an object store gets one object (its multipart
    upload is parallel already). Objects are opened at their first block."""

    def __init__(self, store, name: str, index: int):
        self.store = store
        self.stripes = STRIPES if store.kind == "dir" else 1
        self.keys = [fmt.data_key(name, index * STRIPES + k) for k in range(self.stripes)]
        self.key = self.keys[0]
        self.writers: dict[int, Any] = {}
        self.blocks = 0             # blocks written so far (their order in the stripes)
        self.written = 0            # bytes written so far

    def _writer(self, k: int):
        if k not in self.writers:
            self.writers[k] = self.store.writer(self.keys[k])
        return self.writers[k]

    def _place(self, lb: int) -> tuple[int, int]:
        unit = lb // UNIT
        return unit % self.stripes, (unit // self.stripes) * UNIT * BLOCK + lb % UNIT * BLOCK

    def write(self, view: memoryview) -> list[tuple[str, int]]:
        """Write whole blocks (the last may be short); where each block went."""
        places, jobs = self.submit(view)
        for job in jobs:
            job.result()
        return places

    def submit(self, view: memoryview) -> tuple[list[tuple[str, int]], list]:
        """As write(), but returns as soon as the writes are started: where each block
        goes, and the futures of the writes (the caller keeps `view` until they are done).
        An object store's one object is written in order, before this returns."""
        n = fmt.block_count(len(view))
        places = [self._place(self.blocks + k) for k in range(n)]
        jobs = []
        if self.stripes == 1:
            self._writer(0).write(view)
        else:
            k = 0
            while k < n:                       # runs of blocks in one stripe unit
                end = min(n, k + UNIT - (self.blocks + k) % UNIT)
                stripe, off = places[k]
                piece = view[k * BLOCK:min(end * BLOCK, len(view))]
                jobs.append(io_pool().submit(self._writer(stripe).write_at, off, piece))
                k = end
        self.blocks += n
        self.written += len(view)
        return [(self.keys[stripe], off) for stripe, off in places], jobs

    def write_device(self, memory, at: int, n: int) -> int:
        """`n` bytes of GPU memory at offset `at`, by KvikIO (gds.py), to the first object."""
        if 0 not in self.writers:
            self.writers[0] = gds.DeviceWriter(self.store, self.key, memory.device)
        off = self.writers[0].write_device(memory.ptr + at, n)
        self.written += n
        return off

    def commit(self) -> None:
        for w in self.writers.values():
            w.commit()

    def abort(self) -> None:
        for w in self.writers.values():
            w.abort()


def device_to_file(memory, size: int, data: Writing, blocks: list, places: list,
                   advance: Callable[[int], None], hasher=None) -> None:
    """A full copy of GPU memory by KvikIO, chunk by chunk. The checksums come from the GPU
    (`hasher`, gpuhash.py) where it runs, else from a device-to-host pass through the
    staging buffers, chunk by chunk beside KvikIO's writes."""
    if hasher is not None:
        hasher.launch(memory.ptr, size)
    try:
        for at in range(0, size, gds.CHUNK):
            n = min(gds.CHUNK, size - at)
            written = io_pool().submit(data.write_device, memory, at, n)
            first = at // BLOCK

            def hash_sink(where: int, view: memoryview) -> None:
                sums = gather(hash_jobs(view))
                b = where // BLOCK
                blocks[b:b + len(sums)] = sums

            try:
                if hasher is None:
                    memory.drain(at, n, hash_sink)
            finally:
                off = written.result()
            count = fmt.block_count(n)
            places[first:first + count] = [(data.key, off + k * BLOCK) for k in range(count)]
            advance(n)
    finally:
        if hasher is not None:
            blocks[:] = hasher.collect()


def extents(places: list[tuple[str, int]]) -> list[list]:
    out: list[list] = []
    for b, (key, off) in enumerate(places):
        last = out[-1] if out else None
        if last and last[2] == key and last[3] + last[1] * BLOCK == off:
            last[1] += 1
        else:
            out.append([b, 1, key, off])
    return out
