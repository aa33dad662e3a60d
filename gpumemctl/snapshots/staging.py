"""The host buffers a snapshot of GPU memory moves through when the checksums come from the
GPU (gpuhash.py), and the two pipelines over them: device -> buffer -> store (create) and
store -> buffer -> device (restore). The host touches each byte once: the store's write or
read copies it, nothing else reads it.

A ring of DEPTH buffers of CHUNK bytes, each with its own stream. Unlike the client's
Stager (gpumemctl.cudadrv), a buffer's file I/O is handed to the I/O pool as futures and
waited for only when the buffer comes round again, so the pool always has the next chunk's
pieces queued behind the current ones (no thread idles at a chunk's slowest piece), while
the copies run on the copy engine.

The buffers are anonymous memory advised to transparent huge pages and page-locked with
cuMemHostRegister (fewer pages to pin and to walk in the kernel's copies than
cuMemHostAlloc's 4 KiB ones); where that fails, cuMemHostAlloc's. Made as a copy first needs
them, no larger and no more than its spans need, and kept for the process's next copies."""
from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future

from ..protocol import UsageError

CHUNK = 64 << 20           # bytes per buffer (8 pieces of the I/O pool's 8 MiB)
HUGE_PAGE = 2 << 20        # buffers are whole transparent huge pages
DEPTH = 6                  # buffers: up to DEPTH - 1 chunks of file I/O queued at once
SHAPE_ENV = "GPUMEMCTL_SNAPSHOT_STAGING"   # "MiB,buffers" (e.g. "64,6"): for tuning and tests

_rings: dict[int, Ring] = {}
_lock = threading.Lock()


class HostBuffer:
    """CHUNK bytes of page-locked host memory: `ptr` for copies, `view` for file I/O."""

    def __init__(self, cu, device: int, size: int):
        self.cu, self.size = cu, size
        self.map: mmap.mmap | None = None
        self.unregister: Callable[[], None] | None = None
        self.pinned = None
        try:
            self.map = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            with contextlib.suppress(AttributeError, OSError):   # no THP: 4 KiB pages
                self.map.madvise(mmap.MADV_HUGEPAGE)
            self.ptr = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
            self.unregister = cu.host_register(self.ptr, size)
            self.view = memoryview(self.map)
        except (cu.CudaError, OSError, ValueError):
            self._unmap()
            self.pinned = cu.PinnedBuffer(size, device)
            self.ptr, self.view = self.pinned.ptr, self.pinned.view

    def _unmap(self) -> None:
        if self.map is not None:
            with contextlib.suppress(BufferError):
                self.map.close()
            self.map = None

    def free(self) -> None:
        self.view.release()
        if self.unregister is not None:
            self.unregister()
            self.unregister = None
        self._unmap()
        if self.pinned is not None:
            self.pinned.free()


def shape() -> tuple[int, int]:
    """(bytes per buffer, buffers): CHUNK and DEPTH, or what SHAPE_ENV asks for."""
    raw = os.environ.get(SHAPE_ENV)
    if not raw:
        return CHUNK, DEPTH
    try:
        mib, depth = (int(x) for x in raw.split(","))
    except ValueError:
        mib = depth = 0
    if not (1 <= mib <= 4096 and 2 <= depth <= 64):
        raise UsageError(f"invalid {SHAPE_ENV}={raw!r}: expected 'MiB,buffers', e.g. '64,6'")
    return mib << 20, depth


class Ring:
    """Host buffers and streams on one device (module docstring)."""

    def __init__(self, device: int):
        from .. import cudadrv
        self.cu, self.device = cudadrv, device
        self.chunk, self.depth = shape()
        self.buffers: list[HostBuffer] = []
        self.streams: list = []

    def _fit(self, spans: list[tuple[int, int]]) -> int:
        """Buffers for `spans`, made or grown here: one per span up to DEPTH (at least two,
        which the pipelines need), each as long as the longest span in whole huge pages.
        Page-locking costs about 16 ms per 64 MiB buffer: an incremental snapshot of a few
        changed blocks pins megabytes, not the 384 MiB of a full one (95 ms on an H200 of
        its 0.3 s). Returns the buffers to use."""
        slots = min(self.depth, max(2, len(spans)))
        need = -(-max(n for _, n in spans) // HUGE_PAGE) * HUGE_PAGE
        with self.cu.context(self.device):
            for k in range(slots):
                if k == len(self.buffers):
                    self.buffers.append(HostBuffer(self.cu, self.device, need))
                    self.streams.append(self.cu.stream_create())
                elif self.buffers[k].size < need:
                    self.buffers[k].free()
                    self.buffers[k] = HostBuffer(self.cu, self.device, need)
        return slots

    def spans(self, start: int, end: int) -> list[tuple[int, int]]:
        """[start, end) as (offset, length) pieces of at most a buffer."""
        return [(at, min(self.chunk, end - at)) for at in range(start, end, self.chunk)]

    def download(self, ptr: int, spans: list[tuple[int, int]],
                 consume: Callable[[int, memoryview], list[Future]]) -> None:
        """Copy each span (offset from ptr, length <= CHUNK) to a buffer and hand it to
        `consume(offset, view)`, which starts the view's file I/O and returns its futures;
        a buffer is reused once they are done. Returns when all are."""
        if not spans:
            return
        cu, slots = self.cu, self._fit(spans)
        busy: dict[int, list[Future]] = {}
        with cu.context(self.device):
            try:
                for k in range(len(spans) + 1):
                    if k < len(spans):
                        _wait(busy.pop(k - slots, []))          # the buffer's I/O is done
                        at, n = spans[k]
                        cu.memcpy_dtoh_async(self.buffers[k % slots].ptr, ptr + at, n,
                                             self.streams[k % slots])
                    if k:
                        at, n = spans[k - 1]
                        cu.stream_synchronize(self.streams[(k - 1) % slots])
                        busy[k - 1] = consume(at, self.buffers[(k - 1) % slots].view[:n])
                for futures in busy.values():
                    _wait(futures)
            finally:
                self._settle(busy)

    def upload(self, ptr: int, spans: list[tuple[int, int]],
               produce: Callable[[int, memoryview], list[Future]],
               advance: Callable[[int], None]) -> None:
        """Fill a buffer per span by `produce(offset, view)` (futures of its reads, several
        buffers' reads in flight at once) and copy it to ptr + offset once they are done.
        Returns when every copy is complete on the device."""
        if not spans:
            return
        cu, slots = self.cu, self._fit(spans)
        lag = max(slots - 2, 1)          # a copy has a whole step before its buffer is reused
        reading: dict[int, list[Future]] = {}
        with cu.context(self.device):
            try:
                for k in range(len(spans) + lag):
                    if k < len(spans):
                        cu.stream_synchronize(self.streams[k % slots])   # its copy is done
                        at, n = spans[k]
                        reading[k] = produce(at, self.buffers[k % slots].view[:n])
                    j = k - lag
                    if 0 <= j < len(spans):
                        _wait(reading.pop(j))
                        at, n = spans[j]
                        cu.memcpy_htod_async(ptr + at, self.buffers[j % slots].ptr, n,
                                             self.streams[j % slots])
                        advance(n)
            finally:
                self._settle(reading)

    def _settle(self, pending: dict[int, list[Future]]) -> None:
        """After an error: no I/O may outlive the call into a buffer, no copy run on."""
        for futures in pending.values():
            for future in futures:
                if not future.cancel():
                    future.exception()
        for stream in self.streams:
            self.cu.stream_synchronize(stream)


def _wait(futures: list[Future]) -> None:
    for future in futures:
        future.result()


def ring(device: int) -> Ring:
    """The process's ring for `device`, made at its first use."""
    with _lock:
        if device not in _rings:
            _rings[device] = Ring(device)
        return _rings[device]
