"""The Backend interface. The daemon's core talks to memory only through it."""
from __future__ import annotations

import abc
import dataclasses
from typing import Generic, TypeVar

from gpumemctl.protocol import InvalidState, NoMemory, NotFound, format_size, round_up

COPY_CHUNK = 16 << 20   # default zero()/copy() work in pieces this big


def _bytes(n: int) -> str:
    """A byte count for a person and for a script: `16G (17179869184 bytes)`."""
    return f"{format_size(n)} ({n} bytes)"


def _needs(dev: DeviceInfo, requested: int, capacity: int, parity: int, needed: int) -> str:
    """What a request takes from the device, part by part (empty when it is the request)."""
    if needed < capacity:        # a resize in place: the allocation already holds the rest
        return (f", growing the allocation to a capacity of {format_size(capacity)}, "
                f"needs {_bytes(needed)} more")
    if needed == requested:
        return ""
    parts = [f"capacity {format_size(capacity)}"
             + (f" (the size rounded up to the device's {format_size(dev.granularity)} "
                "granularity)" if capacity != requested else "")]
    if parity:
        parts.append(f"ECC parity {format_size(parity)}")
    return f", which needs {_bytes(needed)}: " + " + ".join(parts)


class BackendUnavailable(Exception):
    """The backend asked for cannot run on this machine; the message says why, in one line."""


@dataclasses.dataclass
class DeviceInfo:
    index: int
    uuid: str
    name: str
    total: int           # bytes this backend may hand out on the device
    free: int            # bytes still free for new allocations
    granularity: int     # capacity is a multiple of this

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class Buffer(abc.ABC):
    """One allocation's memory. Owned by the backend that made or adopted it."""
    capacity: int
    device: str          # device UUID

    @property
    def descriptors(self) -> int:
        """The fds gpumemd holds for it: one per extent (CudaBuffer), else one."""
        return 1

    @property
    def layout(self) -> list[int] | None:
        """Its extents' sizes where there are several, else None."""
        return None


BufferT = TypeVar("BufferT", bound=Buffer)   # the Buffer subclass a backend makes and takes


class Backend(abc.ABC, Generic[BufferT]):
    name: str
    ecc_cache_dir: str | None = None   # where a GPU codec keeps compiled kernels (gpumemd sets it)
    # Whether any fd `export` hands out lets its holder write the memory, whatever `writable`
    # said (cuda: an imported VMM handle cannot be made read-only). The manager then gives
    # fds only to callers with write permission (docs/security.md).
    fd_grants_write: bool = False

    @abc.abstractmethod
    def devices(self) -> list[DeviceInfo]: ...

    def device(self, spec: str | int | None) -> DeviceInfo:
        """Resolve a device by index or UUID (None: the first one)."""
        devices = self.devices()
        if spec is None or spec == "":
            return devices[0]
        text = str(spec)
        for dev in devices:
            if text == str(dev.index) or text.lower() == dev.uuid.lower():
                return dev
        known = ", ".join(f"{d.index} ({d.uuid})" for d in devices)
        raise NotFound(f"no device {text!r} on the {self.name} backend; devices: {known}")

    def check_free(self, dev: DeviceInfo, capacity: int, requested: int | None = None) -> None:
        """Raise the out-of-memory error unless `capacity` bytes (what the step takes from
        the device: the rounded size, plus the parity for a new allocation, or only the
        growth for a resize in place) are free; `requested` is the size the user asked for."""
        if capacity > dev.free:
            raise self.no_memory(dev, capacity, dev.free, requested)

    @staticmethod
    def no_memory(dev: DeviceInfo, needed: int, free: int,
                  requested: int | None = None) -> NoMemory:
        """The out-of-memory error, one line that names every number: the size requested,
        what it needs on the device (the capacity it rounds up to, plus ECC parity for a new
        allocation, or the growth of a resize), and the device's free and total bytes.

        The callers pass only `needed` and `requested`; the parts are told apart here: the
        capacity is the request rounded up to the granularity, anything above it is parity,
        and a `needed` below it is the growth of an allocation that already holds the rest."""
        requested = needed if requested is None else requested
        capacity = round_up(requested, dev.granularity)
        parity = max(0, needed - capacity)
        return NoMemory(
            f"out of memory on device {dev.index} ({dev.uuid}): {_bytes(requested)} "
            f"requested{_needs(dev, requested, capacity, parity, needed)}; "
            f"{_bytes(free)} free of {format_size(dev.total)} total",
            details={"device": dev.uuid, "index": dev.index, "free": free,
                     "total": dev.total, "requested": requested, "capacity": capacity,
                     "parity": parity, "needed": needed})

    @abc.abstractmethod
    def allocate(self, capacity: int, device: str, label: str) -> BufferT: ...

    @abc.abstractmethod
    def free(self, buf: BufferT) -> None: ...

    @abc.abstractmethod
    def export(self, buf: BufferT, writable: bool) -> int:
        """A new fd for a client; the caller closes it after sending."""

    def export_all(self, buf: BufferT, writable: bool) -> list[int]:
        """New fds for a client, one per extent of `buf` (`layout` says their sizes)."""
        return [self.export(buf, writable)]

    @abc.abstractmethod
    def keeper_fds(self, buf: BufferT) -> list[int]:
        """New fds that let the keeper hold the memory; the caller closes them after sending."""

    @abc.abstractmethod
    def adopt(self, fds: list[int], capacity: int, device: str,
              layout: list[int] | None = None) -> BufferT:
        """Rebuild a buffer from fds the keeper kept. Takes ownership of `fds`. `layout`:
        the sizes of the extents the first fds are (the deposit's meta said), else one."""

    def regrow(self, buf: BufferT, capacity: int) -> BufferT | None:
        """A buffer of `capacity` that shares `buf`'s memory where it can (extents), or
        None: the caller allocates new memory and copies (docs/storage.md)."""
        return None

    @abc.abstractmethod
    def read(self, buf: BufferT, offset: int, length: int) -> bytes: ...

    @abc.abstractmethod
    def write(self, buf: BufferT, offset: int, data) -> None: ...

    # ---- the mount's data path: no buffer allocated per request ------------------------
    def view(self, buf: BufferT, offset: int, length: int) -> memoryview:
        """Bytes [offset, offset+length) for a reply sent before the next call into this
        backend (the FUSE read path). A backend may return a view of its own memory or of a
        reused staging buffer instead of a new copy; this default copies."""
        return memoryview(self.read(buf, offset, length))

    def zero(self, buf: BufferT, start: int, end: int) -> None:
        """Make [start, end) read as zeros."""
        zeros = bytes(min(COPY_CHUNK, end - start))
        for offset in range(start, end, COPY_CHUNK):
            n = min(COPY_CHUNK, end - offset)
            self.write(buf, offset, zeros if n == len(zeros) else zeros[:n])

    resizes_in_place = False     # whether resize_in_place() works (else: reallocate + copy)
    fresh_memory_is_zero = False # whether allocate() returns memory that reads as zeros
    # Whether host_register page-locks anything (copies by DMA from it): the cuda backend's.
    registers_host_memory = False

    def resize_in_place(self, buf: BufferT, capacity: int) -> None:
        """Change the buffer's capacity where it is, keeping its contents and every fd that
        refers to it (only where `resizes_in_place`)."""
        raise NotImplementedError

    def copy(self, src: BufferT, dst: BufferT, length: int, src_offset: int = 0,
             dst_offset: int = 0) -> None:
        """Copy `length` bytes of src (from src_offset) to dst (at dst_offset): a resize;
        this default goes through host memory in COPY_CHUNK pieces."""
        for offset in range(0, length, COPY_CHUNK):
            n = min(COPY_CHUNK, length - offset)
            self.write(dst, dst_offset + offset, self.read(src, src_offset + offset, n))

    # ---- the host tier of an asleep allocation (daemon/core/sleep.py) -----------------------
    def to_host(self, buf: BufferT, length: int, view: memoryview, addr: int) -> None:
        """Copy the first `length` bytes of `buf` into host memory (`view`, at address
        `addr`); this default goes through read() in COPY_CHUNK pieces."""
        for offset in range(0, length, COPY_CHUNK):
            n = min(COPY_CHUNK, length - offset)
            view[offset:offset + n] = self.view(buf, offset, n)

    def from_host(self, buf: BufferT, length: int, view: memoryview, addr: int) -> None:
        """Copy `length` bytes of host memory (`view`, at `addr`) to the start of `buf`."""
        for offset in range(0, length, COPY_CHUNK):
            self.write(buf, offset, view[offset:offset + min(COPY_CHUNK, length - offset)])

    def write_pinned(self, buf: BufferT, offset: int, view: memoryview, addr: int) -> None:
        """write() of `view`, which lies at host address `addr` in memory page-locked by
        host_register (the mount's receive buffer): the cuda backend copies it by DMA
        straight from there; this default writes it as any other bytes."""
        self.write(buf, offset, view)

    def host_register(self, addr: int, size: int, device: str):
        """Page-lock host memory for this backend's copies to and from `device`; returns
        what undoes it. Only the cuda backend has anything to do (HostTier.register)."""
        return lambda: None

    # ---- ECC: the codec runs where the memory is (daemon/core/parity.py) --------------------
    def ecc(self, op: str, data: BufferT, parity: BufferT, first: int, count: int,
            total: int, parity_offset: int = 0):
        """Run codec operation `op` (encode, verify, repair; see
        daemon/ecc/cpu.py) on blocks [first, first+count) of `data`, whose parity region
        (sized for `total` blocks) is `parity` from byte `parity_offset` on (a span of a
        parity arena: daemon/backends/arenas.py)."""
        raise InvalidState(f"the {self.name} backend has no ECC codec")

    def export_dmabuf(self, buf: BufferT) -> int:
        """A dma-buf fd covering the buffer's capacity (for RDMA registration); the caller
        closes it. Backends or devices without dma-buf raise InvalidState."""
        raise InvalidState(f"dma-buf export needs the cuda backend on a device that supports "
                           f"it; this gpumemd runs the {self.name} backend (docs/cuda.md)")

    def close(self) -> None:    # optional: only the cuda backend holds any
        """Release backend-wide resources at daemon stop."""
