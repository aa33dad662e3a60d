"""Python's garbage collector, tuned for a daemon that keeps a node per object in memory."""
from __future__ import annotations

import contextlib
import gc

# Python's cyclic collector runs a young collection every 700 new objects, and each one's
# cost grows with the objects it keeps finding alive: with a million allocations in memory
# a create spent a quarter of its time there (bench/objects.py). Young collections every
# 50,000 objects keep what little garbage the daemon makes (removed nodes) in check.
GC_THRESHOLDS = (50_000, 20, 100)


def tune_gc() -> None:
    gc.set_threshold(*GC_THRESHOLDS)


@contextlib.contextmanager
def gc_paused():
    """No collection while inside (a start making a node per object). After it, what was
    made goes to the oldest generation (freeze, then unfreeze) rather than staying young:
    else the first young collection walks every object the start made (1.5 s at 500,000
    objects on the 2-core VM), only to find them alive."""
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.unfreeze()
        gc.enable()
