"""Housekeeping on a timer: the registry's WAL kept bounded, the slabs no allocation has used
for a quarter of a second freed (daemon/core/slabs.py), and the slabs compacted when a
device's have much slack (daemon/verbs/compaction.py, docs/storage.md)."""
from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from ..registry import Registry
from ..verbs.plan import run as run_plan

if TYPE_CHECKING:
    from ..verbs.compaction import CompactionVerbs

log = logging.getLogger("gpumemd")

CHECKPOINT_POLL_SECONDS = 0.1
SWEEP_EVERY = 2                  # polls: a sweep every 0.2 s
COMPACT_EVERY = 50               # polls: whether to compact, asked every 5 s
# Between two slices of housekeeping's compaction (each about 5 ms of work on the loop and
# one commit, daemon/core/compaction.py): the pass takes about a fifth of the loop's time.
COMPACT_PAUSE_SECONDS = 0.02


async def run(registry: Registry, sweep: Callable[[], object],
              compaction: CompactionVerbs | None = None) -> None:
    """Keep the registry's WAL bounded: fold it into the database, and truncate it when it
    passes its limit or the daemon goes idle (Registry.checkpoint_due), on a worker thread.
    Only the TRUNCATE's last step holds up the daemon's writes (Registry.checkpoint).
    Every SWEEP_EVERY polls, `sweep` (ServiceVerbs.sweep_slabs); every COMPACT_EVERY, a
    compaction pass if `compaction` says one is due (CompactionVerbs.due)."""
    for tick in itertools.count():
        await trio.sleep(CHECKPOINT_POLL_SECONDS)
        if tick % SWEEP_EVERY == 0:
            sweep()
        if compaction is not None and tick % COMPACT_EVERY == COMPACT_EVERY - 1:
            await compact(compaction)
        mode = registry.checkpoint_due(time.monotonic())
        if mode is None:
            continue
        try:
            await trio.to_thread.run_sync(registry.checkpoint, mode)
        except Exception as exc:  # noqa: BLE001 - retried next time; the WAL stays valid
            log.warning("registry checkpoint (%s) failed: %s", mode, exc)
            await trio.sleep(1)


async def compact(compaction: CompactionVerbs) -> dict | None:
    """One pass of compaction if one is due, in slices with a pause between them. A pass
    that fails (a full state disk) leaves every object where it was: logged, tried again
    at a later poll."""
    if not compaction.due():
        return None
    try:
        done = await run_plan(compaction.auto(),
                              on_breathe=lambda _: trio.sleep(COMPACT_PAUSE_SECONDS))
    except Exception as exc:  # noqa: BLE001 - nothing moved in the failed slice
        log.warning("slab compaction failed: %s", exc)
        return None
    if done["moved"] or done["slabs_freed"]:
        log.info("slabs compacted: %d allocations moved, %d slabs freed (%d bytes)",
                 done["moved"], done["slabs_freed"], done["freed_bytes"])
    return done
