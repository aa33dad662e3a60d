"""Snapshot create and restore of GPU memory with the block checksums computed on the GPU
(gpuhash.py): the host copies each byte once, between its staging buffers (staging.py) and
the store, and never reads it to hash it. What a snapshot holds is the same as on the CPU
path (the same XXH3-128 per 1 MiB block), and so are the rules: a restore checks every block
where it landed, and a block that fails is zeroed on the device and named, before the
allocation can be served."""
from __future__ import annotations

from collections.abc import Callable

from . import manifest as fmt
from .blocks import Readers, read_chunk
from .manifest import BLOCK
from .staging import ring


def create_full(memory, size: int, data, hasher, blocks: list, places: list,
                advance: Callable[[int], None]) -> None:
    """Every block to the store (striping.Writing `data`): the checksum kernel runs over the
    whole allocation on its own stream while the copy engine moves it, chunk by chunk, to
    the host buffers the store's writes take it from."""
    hasher.launch(memory.ptr, size)

    def consume(at: int, view: memoryview) -> list:
        wrote, jobs = data.submit(view)
        first = at // BLOCK
        places[first:first + len(wrote)] = wrote
        advance(len(view))
        return jobs

    stage = ring(memory.device)
    try:
        stage.download(memory.ptr, stage.spans(0, size), consume)
    finally:
        sums = hasher.collect()          # also when the copy failed: no kernel left running
    blocks[:] = sums


def create_changed(memory, size: int, runs: list[tuple[int, int]], data, hasher,
                   blocks: list, places: list, advance: Callable[[int], None]) -> None:
    """An incremental snapshot: the blocks of `runs` (those the change tracking names, or
    all) are hashed on the GPU, and only those whose checksum differs from the previous
    snapshot's (`blocks`) are copied to the host and written."""
    changed: list[int] = []
    spans = [(a * BLOCK, min(b * BLOCK, size) - a * BLOCK) for a, b in runs]
    for (a, _), sums in zip(runs, hasher.hash_ranges([(memory.ptr + at, n) for at, n in spans]),
                            strict=True):
        changed += [a + k for k, h in enumerate(sums) if blocks[a + k] != h]
        blocks[a:a + len(sums)] = sums
    advance(sum(n for _, n in spans))

    def consume(at: int, view: memoryview) -> list:
        jobs = []
        for k in range(fmt.block_count(len(view))):
            wrote, started = data.submit(view[k * BLOCK:(k + 1) * BLOCK])
            places[at // BLOCK + k] = wrote[0]
            jobs += started
        return jobs

    if changed:
        stage = ring(memory.device)
        stage.download(memory.ptr, _block_spans(changed, size, stage.chunk), consume)


def _block_spans(numbers: list[int], size: int, chunk: int) -> list[tuple[int, int]]:
    """Sorted block numbers as (offset, length) spans of consecutive blocks, each at most
    a staging buffer."""
    out: list[tuple[int, int]] = []
    for b in numbers:
        at, n = b * BLOCK, min(BLOCK, size - b * BLOCK)
        if out and out[-1][0] + out[-1][1] == at and out[-1][1] + n <= chunk:
            out[-1] = (out[-1][0], out[-1][1] + n)
        else:
            out.append((at, n))
    return out


def restore(memory, entry: dict, places: dict, readers: Readers, hasher, bad: list[int],
            advance: Callable[[int], None]) -> None:
    """Fill the allocation from the store through the host buffers, then check every block
    on the device against the manifest; a block that could not be read or fails its
    checksum is zeroed on the device and listed in `bad` (the restore names it, and the
    allocation is `degraded`), exactly as the CPU path does before its copy."""
    from .. import cudadrv
    size = entry["size"]
    reads: list = []
    moved = 0

    def produce(at: int, view: memoryview) -> list:
        jobs = read_chunk(at, view, places, readers)
        reads.extend(jobs)
        return jobs

    def step(n: int) -> None:
        nonlocal moved
        moved += n
        advance(moved)

    stage = ring(memory.device)
    stage.upload(memory.ptr, stage.spans(0, size), produce, step)
    unread = {b for job in reads for b in job.result()}
    sums = hasher.hash(memory.ptr, size)
    found = [b for b, h in enumerate(sums) if b in unread or h != entry["blocks"][b]]
    if found:
        with cudadrv.context(memory.device):
            for b in found:
                cudadrv.memset_d8(memory.ptr + b * BLOCK, 0, min(BLOCK, size - b * BLOCK))
            cudadrv.ctx_synchronize()
    bad += found
