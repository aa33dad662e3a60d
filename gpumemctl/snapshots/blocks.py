"""Blocks of a snapshot's data: their checksums, and reading them back checked (what create,
restore and verify share; docs/snapshots.md, "Format")."""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from . import manifest as fmt
from .iopool import io_pool
from .manifest import BLOCK, SnapshotDamaged
from .trust import Trust

Progress = Callable[[int, int, str], None]     # (bytes done, bytes total, detail)
HASH_GROUP = 8                                   # blocks per checksum task
CHUNK = 256 << 20          # bytes a snapshot moves at a time (a pinned buffer's, on cuda)
UNIT = 8                   # blocks per stripe unit (8 MiB) of a directory store's objects


def noop(done: int, total: int, detail: str = "") -> None:
    pass


def hash_jobs(view: memoryview) -> list:
    """Futures of the checksums of `view`'s blocks, HASH_GROUP blocks a task."""
    n = fmt.block_count(len(view))

    def run(g: int) -> list[str]:
        return [fmt.block_hash(view[b * BLOCK:(b + 1) * BLOCK])
                for b in range(g, min(g + HASH_GROUP, n))]
    return [io_pool().submit(run, g) for g in range(0, n, HASH_GROUP)]


def gather(jobs: list) -> list[str]:
    out: list[str] = []
    for job in jobs:
        out += job.result()
    return out


def big_chunks(memory) -> None:
    """Move CHUNK bytes at a time: enough 8 MiB pieces in flight to keep 16 threads busy
    (a cuda handle's staging buffers are made at their first use, this size)."""
    if hasattr(memory, "chunk"):
        memory.chunk = CHUNK


def places_of(entry: dict) -> dict[int, tuple[str, int]]:
    """Per block: (object key, byte offset)."""
    return {b: (key, off) for b, key, off, _n in fmt.extent_blocks(entry)}


class Readers:
    """The store's data objects a restore or verify reads, each opened once; with a
    `trust`, an object is opened only if a trusted uid owns it (trust.py)."""

    def __init__(self, store, trust: Trust | None = None):
        self.store, self.trust = store, trust
        self.open: dict[str, Any] = {}
        self.lock = threading.Lock()

    def get(self, key: str):
        with self.lock:
            if key not in self.open:
                self.open[key] = self.store.reader(key, self.trust)
            return self.open[key]

    def check(self, entry: dict) -> None:
        """Open every object the entry refers to now, before anything is changed: one that
        is not trusted raises (Untrusted, exit 6); a missing or short one is left for the
        block checks, which count its blocks as damaged."""
        for key in fmt.keys_of({"allocations": [entry]}):
            try:
                self.get(key)
            except SnapshotDamaged:
                pass

    def close(self) -> None:
        for r in self.open.values():
            r.close()


def fill_chunk(at: int, view: memoryview, entry: dict, places: dict, readers: Readers,
               bad: list[int]) -> None:
    """Fill `view` (bytes [at, at+len) of the allocation) from the store, checking each
    block; a block that fails is zeroed and listed in `bad`, never left as data. Blocks
    stored one after another (at most a stripe unit) are read in one call, each run with
    its checks a task of its own on the I/O pool."""
    first = at // BLOCK

    def run(k0: int, k1: int) -> list[int]:
        out = _read_run(view, first, k0, k1, places, readers)
        for k in range(k0, k1):
            if first + k in out:
                continue
            piece = view[k * BLOCK:min((k + 1) * BLOCK, len(view))]
            if fmt.block_hash(piece) != entry["blocks"][first + k]:
                piece[:] = bytes(len(piece))
                out.append(first + k)
        return out

    jobs = [io_pool().submit(run, k0, k1)
            for k0, k1 in contiguous(first, fmt.block_count(len(view)), places)]
    for job in jobs:
        bad += job.result()


def read_chunk(at: int, view: memoryview, places: dict, readers: Readers) -> list:
    """Start filling `view` (bytes [at, at+len) of the allocation) from the store, unchecked
    (the caller checks the blocks where they land: on the GPU, gpuhash.py); futures of the
    blocks that could not be read at all (zeroed, to be counted as damaged)."""
    first = at // BLOCK
    return [io_pool().submit(_read_run, view, first, k0, k1, places, readers)
            for k0, k1 in contiguous(first, fmt.block_count(len(view)), places)]


def _read_run(view: memoryview, first: int, k0: int, k1: int, places: dict,
              readers: Readers) -> list[int]:
    """Read blocks first+k0 .. first+k1 (one after another in one object) into their place
    in `view`; a block that cannot be read (a missing or short object) is zeroed and its
    number returned."""
    def piece(k: int) -> memoryview:
        return view[k * BLOCK:min((k + 1) * BLOCK, len(view))]

    key, off = places[first + k0]
    try:
        readers.get(key).read_into(off, view[k0 * BLOCK:min(k1 * BLOCK, len(view))])
        return []
    except SnapshotDamaged:         # find which blocks of the run are there after all
        pass
    failed = []
    for k in range(k0, k1):
        try:
            readers.get(key).read_into(off + (k - k0) * BLOCK, piece(k))
        except SnapshotDamaged:
            piece(k)[:] = bytes(len(piece(k)))
            failed.append(first + k)
    return failed


def contiguous(first: int, n: int, places: dict) -> list[tuple[int, int]]:
    """Runs [k0, k1) of the blocks first+k whose bytes follow each other in one object."""
    runs: list[tuple[int, int]] = []
    for k in range(n):
        key, off = places[first + k]
        if runs:
            k0, _ = runs[-1]
            key0, off0 = places[first + k0]
            if key0 == key and off0 + (k - k0) * BLOCK == off and k - k0 < UNIT:
                runs[-1] = (k0, k + 1)
                continue
        runs.append((k, k + 1))
    return runs
