"""Housekeeping on a timer: the registry's WAL kept bounded, and the slabs no allocation has
used for a quarter of a second freed (daemon/core/slabs.py)."""
from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable

import trio

from ..registry import Registry

log = logging.getLogger("gpumemd")

CHECKPOINT_POLL_SECONDS = 0.1
SWEEP_EVERY = 2                  # polls: a sweep every 0.2 s


async def run(registry: Registry, sweep: Callable[[], object]) -> None:
    """Keep the registry's WAL bounded: fold it into the database, and truncate it when it
    passes its limit or the daemon goes idle (Registry.checkpoint_due), on a worker thread.
    Only the TRUNCATE's last step holds up the daemon's writes (Registry.checkpoint).
    Every SWEEP_EVERY polls, `sweep` (ServiceVerbs.sweep_slabs)."""
    for tick in itertools.count():
        await trio.sleep(CHECKPOINT_POLL_SECONDS)
        if tick % SWEEP_EVERY == 0:
            sweep()
        mode = registry.checkpoint_due(time.monotonic())
        if mode is None:
            continue
        try:
            await trio.to_thread.run_sync(registry.checkpoint, mode)
        except Exception as exc:  # noqa: BLE001 - retried next time; the WAL stays valid
            log.warning("registry checkpoint (%s) failed: %s", mode, exc)
            await trio.sleep(1)
