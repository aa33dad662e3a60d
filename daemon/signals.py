"""The stop signals (SIGTERM, SIGINT), received whatever the C libraries do to their handlers.

A process's signal dispositions are shared by its threads, and libraries loaded into
gpumemd change them behind Python's back: on the GPU machine (an H200, driver 580), while
the GPU libraries made their first calls on worker threads (the NVRTC compile of the ECC
kernels with the CUDA driver's init, NVML's), SIGTERM's handler was seen to change to a
library's own and back to what it had found. When that window overlapped the moment the
daemon installed its own, what was put back was the default, and the next SIGTERM killed
gpumemd outright (exit -15: no clean stop, no snapshot_on_stop, the mount left behind).

So the stop signals are never left to a handler. `block()`, the first thing gpumemd does
(before any thread exists, so that every thread, Python's or a library's, inherits it),
blocks them; a blocked signal stays pending whatever the disposition, unless that is "ignore".
`receiver()` takes them with sigtimedwait(2) on a thread of its own and hands them to the
event loop. A library that blocks or unblocks them in its own threads changes nothing for
the others.

Children inherit the blocked mask across exec. gpumemd's own (the keeper, the CLI it runs
for snapshot_on_stop and restore_on_start) call `unblock()` first; fusermount3 and umount run
for a moment and are never signalled.
"""
from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import AsyncIterator, Iterator

import trio

STOP = (signal.SIGTERM, signal.SIGINT)
POLL_SECONDS = 0.2          # how often the waiting thread looks whether it should end


def block() -> None:
    """Block the stop signals in this thread, and so in every thread started from now on."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP)


def unblock() -> None:
    """A child of gpumemd: take the stop signals as usual again (their default action, or the
    handler the program installs)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP)


def blocked() -> bool:
    return set(STOP) <= signal.pthread_sigmask(signal.SIG_BLOCK, [])


@contextlib.contextmanager
def receiver() -> Iterator[AsyncIterator[int]]:
    """The stop signals that arrive while inside, as an async iterator of signal numbers,
    like trio.open_signal_receiver. Where they are not blocked (a caller that did not
    block() first: tests that run the loop in-process), trio's own receiver serves."""
    if not blocked():
        with trio.open_signal_receiver(*STOP) as signals:
            yield signals
        return
    send, receive = trio.open_memory_channel[int](16)
    token = trio.lowlevel.current_trio_token()
    done = threading.Event()

    def deliver(signum: int) -> None:       # on the event loop: it must never raise
        with contextlib.suppress(trio.WouldBlock, trio.BrokenResourceError,
                                 trio.ClosedResourceError):
            send.send_nowait(signum)

    def wait() -> None:
        while not done.is_set():
            got = signal.sigtimedwait(STOP, POLL_SECONDS)
            # Only ours: a wait interrupted by a tracer attaching (py-spy, gdb) was seen to
            # come back with garbage in si_signo, which would have stopped the loop.
            if got is not None and got.si_signo in STOP and not done.is_set():
                with contextlib.suppress(trio.RunFinishedError):
                    token.run_sync_soon(deliver, got.si_signo)
    thread = threading.Thread(target=wait, name="gpumemd-stop-signals", daemon=True)
    thread.start()
    try:
        yield receive
    finally:
        done.set()
        # Wake the wait now rather than at its next timeout (a clean stop would take up to
        # POLL_SECONDS longer): a signal sent to that thread alone, which it takes and drops.
        if thread.ident is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pthread_kill(thread.ident, signal.SIGINT)
        thread.join(1.0)
