"""Copies, pinned host memory, streams, and the staged copy engine (`Stager`) that the
client's read/write path and the daemon's I/O move bytes through."""
from __future__ import annotations

import ctypes
from collections.abc import Callable
from concurrent.futures import Future

from .driver import _cu, _driver, context


def memcpy_htod(dst: int, src: int, n: int) -> None:
    _cu("cuMemcpyHtoD", dst, src, n)


def memcpy_dtoh(dst: int, src: int, n: int) -> None:
    _cu("cuMemcpyDtoH", dst, src, n)


def memcpy_htod_async(dst: int, src: int, n: int, stream) -> None:
    _cu("cuMemcpyHtoDAsync", dst, src, n, stream)


def memcpy_dtoh_async(dst: int, src: int, n: int, stream) -> None:
    _cu("cuMemcpyDtoHAsync", dst, src, n, stream)


def memcpy_dtod(dst: int, src: int, n: int) -> None:
    """Device to device. Asynchronous with respect to the host (CUDA's "API synchronization
    behavior"): call ctx_synchronize() before freeing either side or reading the result
    through another stream."""
    _cu("cuMemcpyDtoD", dst, src, n)


def ctx_synchronize() -> None:
    """Wait for all work of the current context (the legacy stream's copies and memsets)."""
    _cu("cuCtxSynchronize")


def memset_d8(dst: int, value: int, n: int) -> None:
    """Asynchronous with respect to the host for device memory, like memcpy_dtod."""
    _cu("cuMemsetD8", dst, value, n)


def stream_create():
    """A non-blocking stream (does not wait on the legacy default stream)."""
    return _cu("cuStreamCreate", _driver().CUstream_flags.CU_STREAM_NON_BLOCKING)


def stream_synchronize(stream) -> None:
    _cu("cuStreamSynchronize", stream)


def stream_destroy(stream) -> None:
    _cu("cuStreamDestroy", stream)


def host_register(ptr: int, size: int) -> Callable[[], None]:
    """Page-lock existing host memory (a mapping of a memfd) for every context, so that
    copies from and to it run by DMA; returns what unregisters it."""
    _cu("cuMemHostRegister", ptr, size, _driver().CU_MEMHOSTREGISTER_PORTABLE)
    return lambda: _cu("cuMemHostUnregister", ptr)


class PinnedBuffer:
    """Page-locked host memory (cuMemHostAlloc, portable to every context), exposed as a
    writable memoryview. Copies from and to it run at full PCIe/NVLink speed and can be
    asynchronous. Do not use `view` after free()."""

    def __init__(self, size: int, index: int = 0):
        portable = _driver().CU_MEMHOSTALLOC_PORTABLE
        with context(index):
            self.ptr = int(_cu("cuMemHostAlloc", size, portable))
        self.size, self.device = size, index
        self.view = memoryview((ctypes.c_ubyte * size).from_address(self.ptr)).cast("B")

    def free(self) -> None:
        if self.ptr:
            self.view.release()
            with context(self.device):
                _cu("cuMemFreeHost", self.ptr)
            self.ptr = 0


# =========================================================================================
# the staged copy engine (client read/write, daemon I/O)
# =========================================================================================
class Stager:
    """Moves bytes between host code and device memory through `depth` pinned buffers of
    `chunk` bytes, each with its own stream, so filling (or draining) one buffer on the CPU
    overlaps the DMA of the others. Made per device; close() frees it."""

    def __init__(self, index: int, chunk: int = 64 << 20, depth: int = 2):
        self.device, self.chunk = index, chunk
        self.buffers: list[PinnedBuffer] = []
        self.streams: list = []
        try:
            for _ in range(depth):
                self.buffers.append(PinnedBuffer(chunk, index))
                with context(index):
                    self.streams.append(stream_create())
        except BaseException:
            self.close()
            raise

    def upload(self, dptr: int, fill: Callable[[memoryview], int], limit: int) -> int:
        """Fill a pinned buffer with `fill(view) -> bytes put` (0 = no more input), copy it
        to dptr + done asynchronously, and go on with the next buffer; at most `limit`
        bytes. Returns the bytes copied, all of them complete on the device."""
        done, k, slots = 0, 0, len(self.buffers)
        with context(self.device):
            try:
                while done < limit:
                    buf, stream = self.buffers[k % slots], self.streams[k % slots]
                    stream_synchronize(stream)          # this buffer's last copy is done
                    n = fill(buf.view[:min(self.chunk, limit - done)])
                    if not n:
                        break
                    memcpy_htod_async(dptr + done, buf.ptr, n, stream)
                    done, k = done + n, k + 1
            finally:
                self._sync_all()
        return done

    def upload_pieces(self, dptr: int, length: int,
                      read: Callable[[memoryview, int], list[Future]],
                      advance: Callable[[int], None] = lambda n: None) -> None:
        """Copy `length` bytes to dptr, where `read(view, offset)` starts filling `view`
        with the input's bytes at `offset` (pieces of a regular file on a thread pool) and
        returns their futures. Unlike upload(), the reads of all buffers but two are in
        flight at once, so the readers never wait at a buffer's end for its slowest piece,
        and a buffer's copy has had a whole step to finish before it is waited for."""
        spans = [(o, min(self.chunk, length - o)) for o in range(0, length, self.chunk)]
        slots = len(self.buffers)
        lag = max(slots - 2, 1)
        reading: dict[int, list[Future]] = {}
        with context(self.device):
            try:
                for k in range(len(spans) + lag):
                    if k < len(spans):
                        slot = k % slots
                        stream_synchronize(self.streams[slot])    # its last copy is done
                        offset, n = spans[k]
                        reading[k] = read(self.buffers[slot].view[:n], offset)
                    j = k - lag
                    if j >= 0:
                        for future in reading.pop(j):
                            future.result()
                        offset, n = spans[j]
                        memcpy_htod_async(dptr + offset, self.buffers[j % slots].ptr, n,
                                          self.streams[j % slots])
                        advance(offset + n)
            finally:
                for futures in reading.values():       # an error: no read may outlive us
                    for future in futures:
                        if not future.cancel():
                            future.exception()
                self._sync_all()

    def download(self, dptr: int, length: int, drain: Callable[[memoryview], None]) -> None:
        """Copy device bytes [dptr, dptr+length) to the host, handing each chunk to
        `drain(view)` in order while the next chunks are already in flight."""
        spans = [(o, min(self.chunk, length - o)) for o in range(0, length, self.chunk)]
        slots = len(self.buffers)
        with context(self.device):
            try:
                for k in range(min(slots, len(spans))):
                    self._fetch(k, dptr, spans[k])
                for k, (_, n) in enumerate(spans):
                    stream_synchronize(self.streams[k % slots])
                    drain(self.buffers[k % slots].view[:n])
                    if k + slots < len(spans):
                        self._fetch(k + slots, dptr, spans[k + slots])
            finally:
                self._sync_all()

    def read_view(self, dptr: int, length: int) -> memoryview:
        """Device bytes [dptr, dptr+length), at most `chunk`, as a view of the first staging
        buffer: valid until the next call on this Stager. One DMA and no host-side copy: the
        mount's read path hands the view straight to the kernel."""
        if length > self.chunk:
            raise ValueError(f"read_view of {length} bytes: at most {self.chunk}")
        buf = self.buffers[0]        # idle: every call of this class ends synchronised
        with context(self.device):
            memcpy_dtoh(buf.ptr, dptr, length)   # to pinned memory: synchronous, one call
        return buf.view[:length]

    def write_small(self, dptr: int, data) -> None:
        """Copy `data`, at most `chunk` bytes, to dptr through the first staging buffer:
        one host copy and one synchronous DMA (pinned to device), no stream bookkeeping."""
        src = memoryview(data).cast("B")
        if len(src) > self.chunk:
            raise ValueError(f"write_small of {len(src)} bytes: at most {self.chunk}")
        buf = self.buffers[0]
        buf.view[:len(src)] = src
        with context(self.device):
            memcpy_htod(dptr, buf.ptr, len(src))

    def read_bytes(self, dptr: int, length: int) -> bytes:
        """Device bytes [dptr, dptr+length) as bytes, through the staging buffers."""
        out = bytearray(length)
        sink, pos = memoryview(out), 0

        def drain(view: memoryview) -> None:
            nonlocal pos
            sink[pos:pos + len(view)] = view
            pos += len(view)

        if length:
            self.download(dptr, length, drain)
        return bytes(out)

    def write_bytes(self, dptr: int, data) -> None:
        """Copy `data` (any buffer) to device memory at dptr, through the staging buffers."""
        src, pos = memoryview(data).cast("B"), 0

        def fill(view: memoryview) -> int:
            nonlocal pos
            n = min(len(view), len(src) - pos)
            view[:n] = src[pos:pos + n]
            pos += n
            return n

        if len(src):
            self.upload(dptr, fill, len(src))

    def _fetch(self, k: int, dptr: int, span: tuple[int, int]) -> None:
        slot = k % len(self.buffers)
        memcpy_dtoh_async(self.buffers[slot].ptr, dptr + span[0], span[1], self.streams[slot])

    def _sync_all(self) -> None:
        for stream in self.streams:
            stream_synchronize(stream)

    def close(self) -> None:
        if self.streams:
            with context(self.device):
                for stream in self.streams:
                    stream_destroy(stream)
        self.streams = []
        for buf in self.buffers:
            buf.free()
        self.buffers = []
