"""Work that must not hold the event loop: keeper round trips and parity encoding run on
worker threads while the loop serves everyone else (issue 13, "nothing slow on the loop").

The verbs stay synchronous (daemon/manager.py): a caller that can wait (a socket request,
a mount request) splits a verb into its steps, runs the slow one here, and finishes on the
loop, where the verb checks again what may have changed meanwhile.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import trio

log = logging.getLogger("gpumemd")

T = TypeVar("T")

# Per trio run (tests run several): the worker limits and the deposit lock.
_KEEPER = trio.lowlevel.RunVar[trio.CapacityLimiter]("keeper_limiter")
_PARITY = trio.lowlevel.RunVar[trio.CapacityLimiter]("parity_limiter")
_DEPOSITS = trio.lowlevel.RunVar[trio.Lock]("deposits")
PARITY_THREADS = 2      # encodes in flight at once; more would only share the same cores
# Parity work this small runs on the loop: about 20 ms with the host's numpy codec, far
# less on a GPU; a thread would cost more than it saves, and the mount's close(2), which
# the kernel does not wait for, would see its effects later than it does now.
INLINE_BYTES = 4 << 20


def _get(var, make):
    try:
        return var.get()
    except LookupError:
        value = make()
        var.set(value)
        return value


async def keeper_call(rest: Callable[[], T] | None) -> T | None:
    """The rest of a keeper call the loop began (Custody.send_begin): the keeper answers in
    well under a millisecond, and then there is no rest; a stalled one is waited for here,
    on a worker thread, for up to CALL_TIMEOUT."""
    if rest is None:
        return None
    limiter = _get(_KEEPER, lambda: trio.CapacityLimiter(1))
    return await trio.to_thread.run_sync(rest, limiter=limiter)


def deposits() -> trio.Lock:
    """Held from a durable create's deposit to its commit: at most one key is in the keeper
    ahead of its row, which is what start-up takes for crash residue (daemon/orphans.py)."""
    return _get(_DEPOSITS, trio.Lock)


async def parity_work(job) -> None:
    """Run a ParityJob (daemon/integrity.py) on a worker thread; None: nothing to do. A job
    that fails there is logged and left undone: the verb it belongs to runs it again on the
    loop, where the error reaches the client (Integrity.finish)."""
    if job is None:
        return
    if job.end - job.start <= INLINE_BYTES:
        return                  # a few milliseconds: the verb runs it on the loop
    limiter = _get(_PARITY, lambda: trio.CapacityLimiter(PARITY_THREADS))
    try:
        await trio.to_thread.run_sync(job.run, limiter=limiter)
    except Exception:
        log.exception("parity work for '%s' failed on a worker thread", job.alloc.path)
