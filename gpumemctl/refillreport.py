"""Parity while a refill is still being written (issue 29): `gpumemctl load` reports, as its
copy goes on, the bytes it has written for good (op `refill_written`), and gpumemd encodes
their parity meanwhile, so that the close encodes only the rest instead of the whole.

The copy calls `advance(n)` as it goes (bytes [0, n) submitted). A thread of its own waits
until another `every` bytes are submitted, makes sure they have landed (on a GPU the copies
are asynchronous: it waits for the device, `settle`), reports them and waits for the daemon's
answer: which byte ranges have their parity encoded. So the copy never waits for a report,
and a report never names a byte still in flight. `finish()` stops the thread and says what
the close must still encode (its `written`).

The rule a report carries (docs/protocol.md, "Snapshots"): the bytes it names are final.
The loader keeps it: it writes each byte once, in order, and reports only bytes behind it.
"""
from __future__ import annotations

import threading
from collections.abc import Callable

REPORT_CUDA = 512 << 20     # a report per this much copied: ~10 ms of copy, ~1 ms to encode
REPORT_HOST = 32 << 20      # the host's numpy codec is slow: begin early, in small pieces


def start(handle) -> Reporter | None:
    """A reporter for a refill `handle` (Client.refill) whose parity may be encoded early:
    rs parity of its own (not a slot of a slab, whose parity is encoded whole at the close)
    and more than one report's bytes; else None."""
    info = handle.info
    every = REPORT_CUDA if handle.backend == "cuda" else REPORT_HOST
    if info.get("ecc") != "rs" or info.get("region") or handle.size <= every:
        return None
    return Reporter(handle, every, _settle(handle.memory))


def _settle(memory) -> Callable[[], None] | None:
    """What waits until the copies submitted so far have landed: on a GPU, the device
    (the whole context: the copies run on several streams); on the host backend nothing,
    the bytes are in the memory when the copy's write returns."""
    cu = getattr(memory, "cu", None)
    if cu is None:
        return None
    device = memory.device

    def settle() -> None:
        with cu.context(device):
            cu.ctx_synchronize()
    return settle


class Reporter:
    def __init__(self, handle, every: int, settle: Callable[[], None] | None):
        self.handle, self.every, self.settle = handle, every, settle
        self.submitted = 0            # bytes [0, submitted) handed to the copy
        self.reported = 0             # bytes [0, reported) reported (the thread's own)
        self.encoded: list[list[int]] = []    # the daemon's last answer
        self.failed: BaseException | None = None
        self._stop = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="gpumemctl-refill-report",
                                        daemon=True)
        self._thread.start()

    def advance(self, n: int) -> None:
        """The copy's progress: bytes [0, n) submitted."""
        with self._cond:
            self.submitted = n
            if n - self.reported >= self.every:
                self._cond.notify()

    def _next(self) -> int | None:
        """The end of the next report, once there is one to make; None: stop."""
        with self._cond:
            while not self._stop and self.submitted - self.reported < self.every:
                self._cond.wait()
            return None if self._stop else self.submitted

    def _run(self) -> None:
        while (upto := self._next()) is not None:
            try:
                if self.settle is not None:
                    self.settle()
                reply = self.handle.client.call("refill_written", handle=self.handle.id,
                                                ranges=[[self.reported, upto]])
            except Exception as exc:  # noqa: BLE001 - reports only save time
                # (an older gpumemd without the op, a CUDA error, a broken connection):
                # no more reports; the close encodes what was not reported, and reports
                # the error if it is still there
                self.failed = exc
                return
            self.encoded = reply.get("encoded") or []
            self.reported = upto

    def finish(self) -> list[list[int]]:
        """Stop, after the report in flight is answered: the byte ranges of the allocation
        whose parity is still to be encoded (the close's `written`)."""
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join()
        return _complement(self.encoded, self.handle.size)


def _complement(ranges: list[list[int]], size: int) -> list[list[int]]:
    """[0, size) less the sorted, disjoint `ranges`."""
    out, at = [], 0
    for a, b in ranges:
        if a > at:
            out.append([at, a])
        at = max(at, b)
    if at < size:
        out.append([at, size])
    return out
