"""The host backend: each allocation is a memfd, mapped for the daemon's own I/O.

It has the cuda backend's interface and crash semantics (fd passing, keeper-held fds), so
everything above the backend is developed and tested on machines without a GPU. Capacity is
rounded to 2 MiB, the VMM granularity of an H100. The backend hands out at most `limit` bytes
(by default half of physical memory, at most what is available at start: hostmem.py): memfd
pages are allocated lazily, so without this limit
an over-large request would "succeed" and fail later, at first touch.
"""
from __future__ import annotations

import dataclasses
import mmap
import os
import uuid

from gpumemctl.protocol import InvalidState, round_up

from .base import Backend, Buffer, DeviceInfo
from .hostmem import default_capacity, warn_if_shared

GRANULARITY = 2 << 20
PAGE = mmap.PAGESIZE


@dataclasses.dataclass(eq=False)
class HostBuffer(Buffer):
    fd: int
    capacity: int
    device: str
    _map: mmap.mmap | None = None

    def mapping(self) -> mmap.mmap:
        if self._map is None:
            self._map = mmap.mmap(self.fd, self.capacity, mmap.MAP_SHARED,
                                  mmap.PROT_READ | mmap.PROT_WRITE)
        return self._map


def host_uuid() -> str:
    """A stable id for this machine's host 'device', in the style of a GPU UUID."""
    try:
        with open("/etc/machine-id") as f:
            raw = f.read().strip()
        return "HOST-" + str(uuid.UUID(raw))
    except (OSError, ValueError):
        return "HOST-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, os.uname().nodename))


class HostBackend(Backend[HostBuffer]):
    name = "host"

    def __init__(self, limit: int | None = None):
        self.limit = round_up(limit, GRANULARITY) if limit else \
            default_capacity(GRANULARITY)
        warn_if_shared(self.limit, explicit=bool(limit))
        self.uuid = host_uuid()
        self.used = 0

    def devices(self) -> list[DeviceInfo]:
        return [DeviceInfo(index=0, uuid=self.uuid, name="host memory (memfd)",
                           total=self.limit, free=max(0, self.limit - self.used),
                           granularity=GRANULARITY)]

    def allocate(self, capacity: int, device: str, label: str) -> HostBuffer:
        dev = self.device(device)
        self.check_free(dev, capacity)
        fd = os.memfd_create(f"gpumem:{label}"[:249], os.MFD_CLOEXEC)
        try:
            # A memfd's inode is mode 0777: without this, a client given a read-only fd could
            # reopen /proc/self/fd/N read-write. Only the daemon's uid may reopen it.
            os.fchmod(fd, 0o600)
            os.ftruncate(fd, capacity)
        except OSError:
            os.close(fd)
            raise
        self.used += capacity
        return HostBuffer(fd=fd, capacity=capacity, device=dev.uuid)

    def free(self, buf: HostBuffer) -> None:
        if buf._map is not None:
            buf._map.close()
            buf._map = None
        if buf.fd >= 0:
            os.close(buf.fd)
            buf.fd = -1
            self.used -= buf.capacity

    def export(self, buf: HostBuffer, writable: bool) -> int:
        # Reopening through /proc gives a new open file description with its own access mode,
        # so a read-only client really cannot map the memory writable (mmap fails EACCES).
        flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC
        return os.open(f"/proc/self/fd/{buf.fd}", flags)

    def keeper_fds(self, buf: HostBuffer) -> list[int]:
        return [os.dup(buf.fd)]

    def adopt(self, fds: list[int], capacity: int, device: str,
              layout: list[int] | None = None) -> HostBuffer:
        fd, extra = fds[0], fds[1:]
        for other in extra:
            os.close(other)
        if layout is not None and len(layout) > 1:   # a memfd grows in place: one extent
            os.close(fd)
            raise InvalidState(f"kept memory of {len(layout)} extents; the host backend "
                               "makes one")
        actual = os.fstat(fd).st_size
        if actual > capacity:
            # A resize in place grows the memfd before the registry commits the capacity,
            # and a shrink commits before it truncates: a crash between leaves the memfd
            # larger than the committed capacity, never smaller. What lies past it was
            # never committed.
            os.ftruncate(fd, capacity)
            actual = capacity
        if actual != capacity:
            os.close(fd)
            raise InvalidState(f"kept memory has {actual} bytes, the registry says {capacity}")
        if device != self.uuid:
            os.close(fd)
            raise InvalidState(f"kept memory belongs to device {device}, not {self.uuid}")
        self.used += capacity
        return HostBuffer(fd=fd, capacity=capacity, device=device)

    def read(self, buf: HostBuffer, offset: int, length: int) -> bytes:
        return buf.mapping()[offset:offset + length]

    def write(self, buf: HostBuffer, offset: int, data) -> None:
        # pwrite, not a copy into the mapping: the memfd's own write path allocates new pages
        # as tmpfs does, where a store through the mapping takes a page fault per 4 KiB
        # (measured: 2.5x faster for fresh pages).
        view = memoryview(data).cast("B")
        while view:
            n = os.pwrite(buf.fd, view, offset)
            view, offset = view[n:], offset + n

    def view(self, buf: HostBuffer, offset: int, length: int) -> memoryview:
        # A view of the mapping itself: the reply is copied out of the memfd once, by the
        # kernel. It must be dropped before free() closes the mapping (FUSE replies are).
        return memoryview(buf.mapping())[offset:offset + length]

    def zero(self, buf: HostBuffer, start: int, end: int) -> None:
        """Whole pages are given back (MADV_REMOVE punches them out of the memfd, so they
        read as zeros and cost no memory); the unaligned edges are written."""
        m = buf.mapping()
        first, last = round_up(start, PAGE), end // PAGE * PAGE
        if last - first < PAGE:
            m[start:end] = bytes(end - start)
            return
        m[start:first] = bytes(first - start)
        m.madvise(mmap.MADV_REMOVE, first, last - first)
        m[last:end] = bytes(end - last)

    resizes_in_place = True
    fresh_memory_is_zero = True     # a new memfd reads as zeros

    def resize_in_place(self, buf: HostBuffer, capacity: int) -> None:
        """A memfd grows or shrinks where it is: no copy, and the keeper's and clients' fds
        stay valid (their mappings keep their old length)."""
        if buf._map is not None:
            buf._map.close()
            buf._map = None
        os.ftruncate(buf.fd, capacity)
        self.used += capacity - buf.capacity
        buf.capacity = capacity

    def ecc(self, op: str, data: HostBuffer, parity: HostBuffer, first: int, count: int,
            total: int, parity_offset: int = 0):
        """The numpy codec on views of the two mappings (no copies)."""
        import numpy as np

        from ..ecc import cpu
        from ..ecc.layout import BLOCK, CHECKSUM_BYTES, PARITY_BLOCK

        views = (np.frombuffer(data.mapping(), np.uint8, count * BLOCK, first * BLOCK),
                 np.frombuffer(parity.mapping(), np.uint8, count * PARITY_BLOCK,
                               parity_offset + first * PARITY_BLOCK),
                 np.frombuffer(parity.mapping(), np.uint8, count * CHECKSUM_BYTES,
                               parity_offset + total * PARITY_BLOCK + first * CHECKSUM_BYTES))
        try:
            return getattr(cpu, op)(*views)
        finally:
            del views          # the mappings cannot close while a view exports them

    def copy(self, src: HostBuffer, dst: HostBuffer, length: int, src_offset: int = 0,
             dst_offset: int = 0) -> None:
        dst.mapping()[dst_offset:dst_offset + length] = \
            memoryview(src.mapping())[src_offset:src_offset + length]
