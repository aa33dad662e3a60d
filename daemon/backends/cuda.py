"""The cuda backend: VMM allocations on NVIDIA GPUs, shared by POSIX file descriptor.

- allocate: cuMemCreate (pinned device memory, POSIX-fd handle type) on one device, chosen by
  index or UUID; the creation step has already rounded the capacity to DeviceInfo.granularity, the
  driver's real granularity. Out of memory becomes NoMemory naming the device, its free bytes
  (cuMemGetInfo) and the request.
- extents: a buffer is a list of backend allocations (one for memory made at once); a
  resize of large memory appends or drops extents instead of copying (regrow;
  docs/storage.md, "Extents, as built"), and every mapping maps them one after another.
- export / keeper_fds: a dup of each extent's shareable fd. That fd is exported once, at
  allocation (cuMemExportToShareableHandle), or is the very fd the memory was imported from
  after a restart: the driver refuses to export a handle that was itself imported
  (CUDA_ERROR_INVALID_VALUE, seen on an H100 with driver 580), and a dup costs microseconds
  where an export costs ~650 us. The fd carries no
  access mode, so, unlike the host backend's O_RDONLY memfd, it cannot make a reader
  read-only: a read-only client is read-only because *it* maps the memory with
  cuMemSetAccess(PROT_READ) (gpumemctl.client / gpumemctl.attach; docs/cuda.md).
- adopt: cuMemImportFromShareableHandle of the keeper's fd, then checks that the memory is on
  the registry's device and exactly `capacity` bytes before it is used again.
- The daemon's own I/O (read/write, dma-buf) goes through a mapping of its own, made on first
  use (creating stays fast), with pinned staging buffers per device.
All CUDA calls go through gpumemctl.cudadrv.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import time

from gpumemctl import cudadrv
from gpumemctl.protocol import InvalidState, format_size

from .base import Backend, BackendUnavailable, Buffer, DeviceInfo

log = logging.getLogger("gpumemd")
FREE_CACHE_SECONDS = 0.01   # how old a device's free bytes may be (CudaBackend._free_of)
NVIDIA_DRIVER = "/proc/driver/nvidia/version"   # the kernel module's, where it is loaded
STAGING_CHUNK = 16 << 20     # the daemon's own I/O is small; clients bring their own buffers
# A resize of memory this large or larger appends or drops extents instead of copying the
# whole (CudaBackend.regrow); below it a copy costs less than the descriptors extents hold.
EXTENT_MIN = 64 << 20
MAX_EXTENTS = 8              # past this a resize copies into one extent again


@dataclasses.dataclass(eq=False)
class Extent:
    """One backend allocation (a cuMemCreate handle, or one imported from the keeper's fd)
    of the extents a buffer is made of. A resize's new buffer lists the old one's extents
    too (CudaBackend.regrow): each is released when the last buffer listing it is freed."""
    handle: int                  # 0 once released
    size: int
    share_fd: int = -1           # the POSIX fd clients and the keeper get dups of
    refs: int = 1                # buffers that list it


@dataclasses.dataclass(eq=False)
class CudaBuffer(Buffer):
    extents: list[Extent]        # in order; one for memory made at once; empty once freed
    capacity: int
    device: str                  # device UUID (what the registry stores)
    index: int                   # the device's ordinal in this process
    mapping: cudadrv.Mapping | None = None   # the daemon's read-write mapping, made lazily

    @property
    def handle(self) -> int | None:
        return self.extents[0].handle if self.extents else None

    @property
    def descriptors(self) -> int:
        return len(self.extents)

    @property
    def layout(self) -> list[int] | None:
        """The extents' sizes where there are several (a deposit's meta, an attach's reply)."""
        return [e.size for e in self.extents] if len(self.extents) > 1 else None


@dataclasses.dataclass(frozen=True)
class _Device:
    index: int
    uuid: str
    name: str
    total: int
    granularity: int


def _describe_unusable(index: int) -> str:
    support = cudadrv.device_support(index)
    missing = [what for what, ok in (("VMM", support.vmm), ("POSIX-fd handles",
                                                            support.posix_fd)) if not ok]
    return f"device {index} ({cudadrv.device_name(index)}) lacks {' and '.join(missing)}"


class CudaBackend(Backend[CudaBuffer]):
    name = "cuda"
    fd_grants_write = True          # the shareable fd carries no access mode (above)

    def __init__(self, **_options):
        try:
            cudadrv.init()
            count = cudadrv.device_count()
            usable = cudadrv.usable_devices()
            self.skipped = [_describe_unusable(i) for i in range(count) if i not in usable]
            self._devices = [self._probe(i) for i in usable]
        except cudadrv.CudaUnavailable as exc:
            if not os.path.exists(NVIDIA_DRIVER):    # no GPU here: the loader's words are noise
                log.debug("cuda backend: %s", exc)
                raise BackendUnavailable("no NVIDIA driver on this machine") from None
            raise BackendUnavailable(f"no usable CUDA device: {exc}") from None
        except cudadrv.CudaError as exc:
            raise BackendUnavailable(f"no usable CUDA device: {exc}") from None
        if not self._devices:
            raise BackendUnavailable(
                "no usable CUDA device: " + ("; ".join(self.skipped) or "none visible") +
                " (gpumemd needs VMM with POSIX-fd handles; see gpumemctl doctor)")
        self._stagers: dict[int, cudadrv.Stager] = {}
        self._free: dict[int, tuple[float, int]] = {}     # index -> (when, bytes): _free_of
        self._codecs: dict = {}              # device index -> GpuCodec, made on first use
        self.ecc_cache_dir: str | None = None   # compiled kernels (set by gpumemd: STATE_DIR)
        # The daemon does its own I/O on this (its event loop's) thread: keep the first
        # device's context current, so each mount request pays no context push and pop.
        cudadrv.make_current(self._devices[0].index)

    @staticmethod
    def _probe(index: int) -> _Device:
        return _Device(index=index, uuid=cudadrv.device_uuid(index),
                       name=cudadrv.device_name(index),
                       total=cudadrv.device_total_memory(index),
                       granularity=cudadrv.granularity(index))

    def summary(self) -> str:
        """One line for the start-up log."""
        used = ", ".join(f"{d.index} {d.name} ({d.uuid}, {format_size(d.total)}, granularity "
                         f"{format_size(d.granularity)})" for d in self._devices)
        skipped = f"; not usable: {'; '.join(self.skipped)}" if self.skipped else ""
        return f"{len(self._devices)} CUDA device(s) with VMM and POSIX-fd handles: " \
               f"{used}{skipped}"

    # ---- devices -----------------------------------------------------------------------
    def devices(self) -> list[DeviceInfo]:
        return [DeviceInfo(index=d.index, uuid=d.uuid, name=d.name, total=d.total,
                           free=self._free_of(d.index), granularity=d.granularity)
                for d in self._devices]

    def _free_of(self, index: int) -> int:
        """cuMemGetInfo's free bytes, at most FREE_CACHE_SECONDS old: a create asks for the
        devices a few times, and each query costs a context push and a driver call (a
        million small creates spent most of their time there). Our own allocations and
        frees forget it at once; another process's are seen within the interval, and a
        cuMemCreate the count let through that finds no room is refused as no memory."""
        now = time.monotonic()
        cached = self._free.get(index)
        if cached is None or now - cached[0] > FREE_CACHE_SECONDS:
            cached = self._free[index] = (now, cudadrv.mem_get_info(index)[0])
        return cached[1]

    def _by_uuid(self, uuid: str) -> _Device:
        for dev in self._devices:
            if dev.uuid.lower() == str(uuid).lower():
                return dev
        raise InvalidState(f"memory of device {uuid}, which is not among this daemon's CUDA "
                           "devices (another machine, or CUDA_VISIBLE_DEVICES changed)")

    # ---- memory ------------------------------------------------------------------------
    def allocate(self, capacity: int, device: str, label: str) -> CudaBuffer:
        dev = self.device(device)
        return CudaBuffer(extents=[self._extent(dev, capacity)], capacity=capacity,
                          device=dev.uuid, index=dev.index)

    def _extent(self, dev: DeviceInfo, size: int) -> Extent:
        """New device memory of `size` bytes, exported once for the keeper and clients."""
        self.check_free(dev, size)
        self._free.clear()
        try:
            handle = cudadrv.mem_create(size, dev.index)
        except cudadrv.CudaOutOfMemory:
            # cuMemGetInfo said there was room, but the driver disagrees (its own reserve,
            # another process racing us): same answer as the check above.
            raise self.no_memory(dev, size, cudadrv.mem_get_info(dev.index)[0]) from None
        extent = Extent(handle, size)
        try:
            with cudadrv.context(dev.index):
                extent.share_fd = cudadrv.export_fd(handle)
        except BaseException:
            self._release(extent, dev.index)
            raise
        return extent

    def _release(self, extent: Extent, index: int) -> None:
        extent.refs -= 1
        if extent.refs > 0 or not extent.handle:
            return
        with cudadrv.context(index):
            cudadrv.release(extent.handle)
        extent.handle = 0
        self._free.clear()
        if extent.share_fd >= 0:
            os.close(extent.share_fd)
            extent.share_fd = -1

    def free(self, buf: CudaBuffer) -> None:
        if not buf.extents:
            return
        if buf.mapping is not None:
            buf.mapping.close(release_handle=False)
            buf.mapping = None
        extents, buf.extents = buf.extents, []
        for extent in extents:
            self._release(extent, buf.index)

    # ---- extents: a large allocation resized without copying it (docs/storage.md) ---------
    def regrow(self, buf: CudaBuffer, capacity: int) -> CudaBuffer | None:
        """A new buffer of `capacity` over `buf`'s memory: growing appends one extent,
        shrinking keeps the extents that end within `capacity` and replaces the one it
        cuts by a copy of its part kept. None where that would not pay (a buffer below
        EXTENT_MIN, or one with MAX_EXTENTS already): the caller copies into new memory.
        `buf` stays valid; freeing either buffer releases only the extents the other does
        not list."""
        if min(capacity, buf.capacity) < EXTENT_MIN or not buf.extents:
            return None
        kept, at = [], 0
        for extent in buf.extents:
            if at + extent.size > capacity:
                break
            kept.append(extent)
            at += extent.size
        if len(kept) + (at < capacity) > MAX_EXTENTS:
            return None
        dev = self.device(buf.device)
        new = CudaBuffer(extents=[*kept], capacity=capacity, device=buf.device,
                         index=buf.index)
        for extent in kept:
            extent.refs += 1
        try:
            if at < capacity:
                new.extents.append(self._extent(dev, capacity - at))
                if capacity < buf.capacity:      # the cut extent: its kept part copied
                    self.copy(buf, new, capacity - at, at, at)
        except BaseException:
            self.free(new)
            raise
        return new

    def export(self, buf: CudaBuffer, writable: bool) -> int:
        # `writable` cannot be expressed in the fd (see the module docstring).
        if len(buf.extents) != 1:
            raise InvalidState("memory made of several extents is exported as a list "
                               "(export_all)")
        return os.dup(buf.extents[0].share_fd)

    def export_all(self, buf: CudaBuffer, writable: bool) -> list[int]:
        return [os.dup(e.share_fd) for e in buf.extents]

    def keeper_fds(self, buf: CudaBuffer) -> list[int]:
        return [os.dup(e.share_fd) for e in buf.extents]

    def adopt(self, fds: list[int], capacity: int, device: str,
              layout: list[int] | None = None) -> CudaBuffer:
        """`layout`: the extents' sizes, one fd each (a deposit's meta); None: one extent
        of `capacity`, and any fd past the first is closed."""
        sizes = layout or [capacity]
        mine, extra = fds[:len(sizes)], fds[len(sizes):]
        for other in extra:
            os.close(other)
        buf = CudaBuffer(extents=[], capacity=capacity, device=device, index=-1)
        try:
            if len(mine) != len(sizes) or sum(sizes) != capacity:
                raise InvalidState(f"kept memory of {len(mine)} extent(s), "
                                   f"{sum(sizes)} bytes, for a capacity of {capacity}")
            dev = self._by_uuid(device)
            buf.device, buf.index = dev.uuid, dev.index
            while mine:
                fd, size = mine.pop(0), sizes[len(buf.extents)]
                try:
                    with cudadrv.context(dev.index):
                        handle = cudadrv.import_fd(fd)
                except BaseException:
                    os.close(fd)
                    raise
                # Keep the fd: it is how this memory is shared from now on (docstring).
                buf.extents.append(Extent(handle, size, fd))
            self._free.clear()
            self._verify_adopted(buf)
        except BaseException:
            for fd in mine:
                os.close(fd)
            self.free(buf)
            raise
        return buf

    def _verify_adopted(self, buf: CudaBuffer) -> None:
        """Kept memory (just imported into `buf`) must be on the registry's device and
        exactly `capacity` bytes, each extent exactly its size."""
        with cudadrv.context(buf.index):
            for extent in buf.extents:
                try:
                    actual = cudadrv.handle_device(extent.handle)
                except cudadrv.CudaError as exc:   # cannot tell: the size checks still run
                    log.warning("cannot read the device of kept memory on %s: %s",
                                buf.device, exc)
                    actual = buf.index
                if actual != buf.index:
                    raise InvalidState(f"kept memory is on device {actual}, the registry "
                                       f"says {buf.index} ({buf.device})")
                if cudadrv.extends_beyond(extent.handle, extent.size, buf.index):
                    raise InvalidState(f"kept memory is larger than the registry's "
                                       f"capacity {buf.capacity}")
        try:
            self._mapping(buf)      # mapping all of `capacity` fails if the memory is smaller
        except cudadrv.CudaInvalidValue:
            raise InvalidState(f"kept memory is smaller than the registry's capacity "
                               f"{buf.capacity}") from None

    # ---- the daemon's own I/O ------------------------------------------------------------
    def _mapping(self, buf: CudaBuffer) -> cudadrv.Mapping:
        if not buf.extents:
            raise InvalidState("the allocation's memory has been freed")
        if buf.mapping is None:
            buf.mapping = cudadrv.Mapping([(e.handle, e.size) for e in buf.extents],
                                          buf.capacity, buf.index, writable=True)
        return buf.mapping

    def _stager(self, index: int) -> cudadrv.Stager:
        if index not in self._stagers:
            self._stagers[index] = cudadrv.Stager(index, chunk=STAGING_CHUNK)
        return self._stagers[index]

    def read(self, buf: CudaBuffer, offset: int, length: int) -> bytes:
        return self._stager(buf.index).read_bytes(self._mapping(buf).ptr + offset, length)

    def write(self, buf: CudaBuffer, offset: int, data) -> None:
        stager = self._stager(buf.index)
        if len(data) <= stager.chunk:          # the mount's requests: at most 1 MiB
            stager.write_small(self._mapping(buf).ptr + offset, data)
        else:
            stager.write_bytes(self._mapping(buf).ptr + offset, data)

    def view(self, buf: CudaBuffer, offset: int, length: int) -> memoryview:
        stager = self._stager(buf.index)
        if length > stager.chunk:
            return memoryview(self.read(buf, offset, length))
        return stager.read_view(self._mapping(buf).ptr + offset, length)

    # Both below wait for the device before returning: the memset and the copy run on the
    # legacy stream, asynchronously to the host, and the staging streams do not wait for it
    # (a later write could land before the zeroes), nor may a buffer be freed under a copy.
    def zero(self, buf: CudaBuffer, start: int, end: int) -> None:
        if end > start:
            with cudadrv.context(buf.index):
                cudadrv.memset_d8(self._mapping(buf).ptr + start, 0, end - start)
                cudadrv.ctx_synchronize()

    def copy(self, src: CudaBuffer, dst: CudaBuffer, length: int, src_offset: int = 0,
             dst_offset: int = 0) -> None:
        """Device to device (a resize): no trip through host memory. Both buffers are mapped
        in this process; a copy across devices goes through the driver's peer path."""
        if length:
            with cudadrv.context(dst.index):
                cudadrv.memcpy_dtod(self._mapping(dst).ptr + dst_offset,
                                    self._mapping(src).ptr + src_offset, length)
                cudadrv.ctx_synchronize()

    def to_host(self, buf: CudaBuffer, length: int, view: memoryview, addr: int) -> None:
        """One device-to-host copy of the whole length: DMA at the pinned rate when the host
        tier is registered (HostTier.register), the driver's staged copy otherwise."""
        if length:
            with cudadrv.context(buf.index):
                cudadrv.memcpy_dtoh(addr, self._mapping(buf).ptr, length)

    def from_host(self, buf: CudaBuffer, length: int, view: memoryview, addr: int) -> None:
        if length:
            with cudadrv.context(buf.index):
                cudadrv.memcpy_htod(self._mapping(buf).ptr, addr, length)

    registers_host_memory = True

    def write_pinned(self, buf: CudaBuffer, offset: int, view: memoryview, addr: int) -> None:
        """One synchronous DMA from the page-locked source (no copy into staging first), on
        the legacy stream as write_small's."""
        if len(view):
            with cudadrv.context(buf.index):
                cudadrv.memcpy_htod(self._mapping(buf).ptr + offset, addr, len(view))

    def host_register(self, addr: int, size: int, device: str):
        """In the device's context: the caller may be a worker thread, with none current."""
        index = self._by_uuid(device).index
        with cudadrv.context(index):
            unregister = cudadrv.host_register(addr, size)

        def undo() -> None:
            with cudadrv.context(index):
                unregister()
        return undo

    def ecc(self, op: str, data: CudaBuffer, parity: CudaBuffer, first: int, count: int,
            total: int, parity_offset: int = 0):
        """The CUDA codec (daemon/ecc/gpu.py: NVRTC-compiled kernels, cached on disk) on
        the daemon's own mappings; where it cannot be built (no NVRTC), the numpy codec
        on host copies of the blocks."""
        from ..ecc.layout import BLOCK, CHECKSUM_BYTES, PARITY_BLOCK
        spans = ((data, first * BLOCK, count * BLOCK),
                 (parity, parity_offset + first * PARITY_BLOCK, count * PARITY_BLOCK),
                 (parity, parity_offset + total * PARITY_BLOCK + first * CHECKSUM_BYTES,
                  count * CHECKSUM_BYTES))
        codec = self._codec(data.index)
        if codec is not None:
            return getattr(codec, op)(*(self._mapping(b).ptr + o for b, o, _ in spans), count)
        return self._ecc_on_host(op, spans)

    def _ecc_on_host(self, op: str, spans):
        import numpy as np

        from ..ecc import cpu
        copies = [bytearray(self.read(b, o, n)) for b, o, n in spans]
        result = getattr(cpu, op)(*(np.frombuffer(c, np.uint8) for c in copies))
        changed = {"encode": (1, 2), "repair": (0, 1, 2)}
        for i in changed.get(op, ()):
            buf, offset, _ = spans[i]
            self.write(buf, offset, copies[i])
        return result

    def _codec(self, index: int):
        if index not in self._codecs:
            try:
                from ..ecc.gpu import GpuCodec
                self._codecs[index] = GpuCodec(index, self.ecc_cache_dir)
            except Exception as exc:  # noqa: BLE001 - any failure: fall back, say why once
                log.warning("GPU ECC codec unavailable on device %d (%s); using the CPU "
                            "codec through host copies (slow)", index, exc)
                self._codecs[index] = None
        return self._codecs[index]

    def export_dmabuf(self, buf: CudaBuffer) -> int:
        if not cudadrv.device_support(buf.index).dma_buf:
            raise InvalidState(f"device {buf.index} ({buf.device}) does not support dma-buf "
                               "export (it needs the NVIDIA open kernel modules and Linux "
                               "5.12 or newer; see docs/cuda.md)")
        ptr = self._mapping(buf).ptr
        with cudadrv.context(buf.index):
            try:
                return cudadrv.dmabuf_fd(ptr, buf.capacity)
            except cudadrv.CudaNotSupported as exc:
                raise InvalidState(f"device {buf.index} ({buf.device}) refused dma-buf "
                                   f"export: {exc}") from None

    def close(self) -> None:
        for stager in self._stagers.values():
            stager.close()
        self._stagers.clear()
        cudadrv.release_contexts()
