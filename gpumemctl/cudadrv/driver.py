"""Calling the CUDA driver: init, devices, primary contexts and VMM allocations
(create, map, export, import).

The bindings (`cuda.bindings.driver`) are imported lazily, inside the first call. Every driver
call in cuda-python returns a tuple `(CUresult, *outputs)`; `_cu()` checks the CUresult and
returns the outputs (one value, or a tuple of several); a failure raises the CUresult's own
class from .errors. The other modules of this package call the driver through `_cu()` too.

Contexts: we use each device's *primary* context, the one the CUDA runtime (PyTorch, CuPy)
uses too, so pointers mapped here are valid in their kernels. It is retained once per process
and pushed around each group of calls by `context(index)`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import threading

from .errors import CudaError, CudaInvalidValue, CudaNotSupported, CudaUnavailable, error_class


def _error_for(code: int, call: str) -> CudaError:
    d = _driver()
    try:
        name = d.CUresult(code).name
    except ValueError:
        name = f"CUDA_ERROR_{code}"
    text = ""
    with contextlib.suppress(Exception):   # a describing call must never hide the error
        err, raw = d.cuGetErrorString(d.CUresult(code))
        if int(err) == 0 and raw:
            text = ": " + raw.decode(errors="replace")
    return error_class(name)(f"{call} failed with {name} ({code}){text}", result=code,
                             name=name, call=call)


# =========================================================================================
# calling the driver
# =========================================================================================
_drv = None
_init_lock = threading.Lock()
_initialized = False


def _driver():
    """The cuda.bindings.driver module, imported on first use."""
    global _drv
    if _drv is None:
        try:
            from cuda.bindings import driver
        except ImportError as exc:
            raise CudaUnavailable(f"cuda-python is not installed ({exc}): pip install "
                                  "'gpumemctl[cuda]'") from None
        except Exception as exc:   # noqa: BLE001 - a broken install: say so, as one error
            raise CudaUnavailable(f"cuda-python cannot be loaded: {type(exc).__name__}: "
                                  f"{exc}") from None
        _drv = driver
    return _drv


def _raw(name: str, *args):
    """Call one driver function and check its CUresult; returns its outputs."""
    fn = getattr(_driver(), name)
    try:
        ret = fn(*args)
    except RuntimeError as exc:   # cuda.pathfinder: libcuda.so.1 not found, symbol missing
        raise CudaUnavailable(f"{name}: the CUDA driver cannot be used: {exc}",
                              call=name) from None
    err, out = (ret[0], ret[1:]) if isinstance(ret, tuple) else (ret, ())
    code = int(err)
    if code:
        raise _error_for(code, name)
    if not out:
        return None
    return out[0] if len(out) == 1 else out


def _cu(name: str, *args):
    """Like _raw, after cuInit (once per process)."""
    if not _initialized:
        init()
    return _raw(name, *args)


def init() -> None:
    """cuInit(0), once. Raises CudaUnavailable (no driver) or CudaNoDevice."""
    global _initialized
    with _init_lock:
        if not _initialized:
            _raw("cuInit", 0)
            _initialized = True


def driver_version() -> tuple[int, int]:
    """The CUDA version the driver supports, e.g. (13, 0)."""
    v = _raw("cuDriverGetVersion")
    return v // 1000, (v % 1000) // 10


# =========================================================================================
# devices
# =========================================================================================
def device_count() -> int:
    """Visible devices: CUDA_VISIBLE_DEVICES is applied by the driver itself."""
    return _cu("cuDeviceGetCount")


def _device(index: int):
    return _cu("cuDeviceGet", int(index))


def device_uuid(index: int) -> str:
    """The device UUID as nvidia-smi shows it: 'GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx'."""
    raw = bytes(_cu("cuDeviceGetUuid", _device(index)).bytes)
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def device_name(index: int) -> str:
    raw = _cu("cuDeviceGetName", 256, _device(index))
    return raw.split(b"\0", 1)[0].decode(errors="replace").strip()


def device_total_memory(index: int) -> int:
    return int(_cu("cuDeviceTotalMem", _device(index)))


def device_index(spec: str | int) -> int:
    """A device by ordinal (int or digits) or by UUID (with or without 'GPU-')."""
    text = str(spec).strip()
    if text.isdigit():
        index = int(text)
        if index >= device_count():
            raise error_class("CUDA_ERROR_INVALID_DEVICE")(
                f"no CUDA device {index}: {device_count()} visible", call="device_index")
        return index
    want = text.lower().removeprefix("gpu-")
    for index in range(device_count()):
        if device_uuid(index).lower().removeprefix("gpu-") == want:
            return index
    raise error_class("CUDA_ERROR_INVALID_DEVICE")(
        f"no visible CUDA device has UUID {text} (check CUDA_VISIBLE_DEVICES)",
        call="device_index")


def attribute(index: int, name: str) -> int:
    """cuDeviceGetAttribute by the attribute's name, e.g. 'CU_DEVICE_ATTRIBUTE_...'."""
    attr = getattr(_driver().CUdevice_attribute, name)
    return int(_cu("cuDeviceGetAttribute", attr, _device(index)))


@dataclasses.dataclass(frozen=True)
class DeviceSupport:
    vmm: bool          # cuMemCreate/cuMemMap (virtual memory management)
    posix_fd: bool     # export/import of allocations as POSIX fds
    dma_buf: bool      # cuMemGetHandleForAddressRange(DMA_BUF_FD)
    rdma_vmm: bool     # GPUDirect RDMA on VMM allocations (gpuDirectRDMACapable)

    @property
    def usable(self) -> bool:
        """What gpumemd's cuda backend needs."""
        return self.vmm and self.posix_fd


_support_cache: dict[int, DeviceSupport] = {}


def device_support(index: int) -> DeviceSupport:
    if index not in _support_cache:
        a = "CU_DEVICE_ATTRIBUTE_"
        _support_cache[index] = DeviceSupport(
            vmm=bool(attribute(index, a + "VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED")),
            posix_fd=bool(attribute(index, a + "HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED")),
            dma_buf=bool(attribute(index, a + "DMA_BUF_SUPPORTED")),
            rdma_vmm=bool(attribute(index, a + "GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED")))
    return _support_cache[index]


def usable_devices() -> list[int]:
    """Ordinals of the devices the cuda backend can use (VMM + POSIX-fd handles)."""
    return [i for i in range(device_count()) if device_support(i).usable]


# =========================================================================================
# primary contexts
# =========================================================================================
_contexts: dict[int, object] = {}
_ctx_lock = threading.Lock()


def primary_context(index: int):
    """The device's primary context, retained once for the life of the process."""
    ctx = _contexts.get(index)
    if ctx is not None:
        return ctx
    with _ctx_lock:
        if index not in _contexts:
            _contexts[index] = _cu("cuDevicePrimaryCtxRetain", _device(index))
        return _contexts[index]


_current = threading.local()     # .index: the device whose primary context this thread has
                                 # current through context() or make_current()


@contextlib.contextmanager
def context(index: int):
    """Make the device's primary context current for the calls inside. Free when it is
    current already (a thread that called make_current(), or a nested use)."""
    before = getattr(_current, "index", None)
    if before == index:
        yield
        return
    _cu("cuCtxPushCurrent", primary_context(index))
    _current.index = index
    try:
        yield
    finally:
        _current.index = before
        _cu("cuCtxPopCurrent")


def make_current(index: int) -> None:
    """Make the device's primary context this thread's current one for good, so that
    context(index) costs no driver call (the daemon's I/O thread: two calls less per FUSE
    request)."""
    _cu("cuCtxSetCurrent", primary_context(index))
    _current.index = index


def release_contexts() -> None:
    """Release the primary contexts retained here (at daemon stop)."""
    with _ctx_lock:
        for index in list(_contexts):
            _cu("cuDevicePrimaryCtxRelease", _device(index))
            del _contexts[index]


def mem_get_info(index: int) -> tuple[int, int]:
    """(free, total) bytes on the device, as the driver sees it now (all processes)."""
    with context(index):
        free, total = _cu("cuMemGetInfo")
    return int(free), int(total)


# =========================================================================================
# VMM allocations
# =========================================================================================
def _posix_fd_type():
    return _driver().CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR


def _alloc_prop(index: int, *, posix_fd: bool = True, rdma: bool = False):
    d = _driver()
    prop = d.CUmemAllocationProp()
    prop.type = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = int(index)
    if posix_fd:
        prop.requestedHandleTypes = _posix_fd_type()
    if rdma:
        prop.allocFlags.gpuDirectRDMACapable = 1
    return prop


_granularity_cache: dict[int, int] = {}


def granularity(index: int) -> int:
    """Minimum granularity of a pinned, POSIX-fd-exportable allocation (2 MiB on an H100).
    Sizes, offsets and mapped addresses are multiples of it."""
    if index not in _granularity_cache:
        option = _driver().CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
        with context(index):
            _granularity_cache[index] = int(_cu("cuMemGetAllocationGranularity",
                                                _alloc_prop(index), option))
    return _granularity_cache[index]


def mem_create(size: int, index: int, *, posix_fd: bool = True) -> int:
    """cuMemCreate on one device; returns the allocation handle as an int. `size` must be a
    multiple of granularity(). Where the device can do GPUDirect RDMA on VMM memory, the
    allocation asks for it, so a dma-buf of it can be registered with a NIC."""
    rdma = device_support(index).rdma_vmm
    with context(index):
        try:
            return int(_cu("cuMemCreate", size, _alloc_prop(index, posix_fd=posix_fd,
                                                            rdma=rdma), 0))
        except (CudaInvalidValue, CudaNotSupported):
            if not rdma:
                raise
            # Some platforms refuse the RDMA flag with fd export: plain memory still serves.
            return int(_cu("cuMemCreate", size, _alloc_prop(index, posix_fd=posix_fd), 0))


def export_fd(handle: int) -> int:
    """A new POSIX fd for the allocation (the caller owns and closes it). It carries no
    access mode: read-only is enforced where the importer maps it (set_access)."""
    return int(_cu("cuMemExportToShareableHandle", handle, _posix_fd_type(), 0))


def import_fd(fd: int) -> int:
    """An allocation handle for an exported fd. The fd stays the caller's to close: the
    handle keeps the memory alive on its own."""
    return int(_cu("cuMemImportFromShareableHandle", fd, _posix_fd_type()))


def handle_device(handle: int) -> int:
    """The device ordinal (in this process) the allocation lives on."""
    prop = _cu("cuMemGetAllocationPropertiesFromHandle", handle)
    return int(prop.location.id)


def release(handle: int) -> None:
    """Drop this handle; the memory goes once no handle, mapping or exported fd remains."""
    _cu("cuMemRelease", handle)


def reserve(size: int, alignment: int = 0) -> int:
    return int(_cu("cuMemAddressReserve", size, alignment, 0, 0))


def address_free(ptr: int, size: int) -> None:
    _cu("cuMemAddressFree", ptr, size)


def map_memory(ptr: int, size: int, handle: int, offset: int = 0) -> None:
    _cu("cuMemMap", ptr, size, offset, handle, 0)


def unmap(ptr: int, size: int) -> None:
    _cu("cuMemUnmap", ptr, size)


def set_access(ptr: int, size: int, index: int, writable: bool) -> None:
    """Grant this device read-only or read-write access to a mapped range. Read-only is the
    protection a read-only attach gets: a kernel that stores to it faults."""
    d = _driver()
    desc = d.CUmemAccessDesc()
    desc.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    desc.location.id = int(index)
    desc.flags = (d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE if writable
                  else d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READ)
    _cu("cuMemSetAccess", ptr, size, [desc], 1)


def extends_beyond(handle: int, size: int, index: int) -> bool:
    """True when the allocation is larger than `size` (a multiple of the granularity): maps
    `size` plus one granule from offset 0, which the driver refuses for a smaller
    allocation. Not one granule at offset `size`: the H100's driver (580, CUDA 13.0) answers
    any non-zero offset with CUDA_ERROR_NOT_SUPPORTED, which read as "no" every time."""
    span = size + granularity(index)
    with context(index):
        ptr = reserve(span)
        try:
            map_memory(ptr, span, handle, 0)
        except CudaError:   # INVALID_VALUE is the documented answer; any refusal means no
            return False
        else:
            unmap(ptr, span)
            return True
        finally:
            address_free(ptr, span)


class Mapping:
    """Allocation handles mapped one after another at a fresh virtual address range of this
    process, with read-only or read-write access for its device: `pieces` is one handle of
    `size` bytes, or a list of (handle, bytes) laid out in order (an allocation made of
    extents: docs/storage.md, "Mapping one object contiguously"). Each piece is mapped
    from its offset 0 (the driver refuses a non-zero offset into a handle) and unmapped on
    its own. Owns the handles: close() unmaps, frees the range and releases them.

    park() gives the memory back but keeps the range reserved, and remap() maps other
    handles there: an allocation put to sleep and woken comes back at the same `ptr`, so
    pointers into it (and CUDA graphs that captured them) stay valid (gpumemctl/sleepwake.py).
    """

    def __init__(self, pieces: int | list[tuple[int, int]], size: int, index: int,
                 writable: bool):
        self.pieces = [(pieces, size)] if isinstance(pieces, int) else list(pieces)
        self.handle = self.pieces[0][0]
        self.size, self.device, self.writable = size, index, writable
        self._check(self.pieces)
        with context(index):
            self.ptr = reserve(size, granularity(index))
            try:
                self._map(self.pieces)
            except BaseException:
                address_free(self.ptr, size)
                raise

    @property
    def parked(self) -> bool:
        """The range is reserved with nothing mapped (between park() and remap())."""
        return bool(self.ptr) and not self.pieces

    def _check(self, pieces: list[tuple[int, int]]) -> None:
        if sum(n for _, n in pieces) != self.size:
            raise ValueError(f"pieces of {sum(n for _, n in pieces)} bytes for a "
                             f"mapping of {self.size}")

    def _map(self, pieces: list[tuple[int, int]]) -> None:
        """Map `pieces` in order from ptr and set the access; all or nothing (what was
        mapped is unmapped again on a failure; the handles stay the caller's then)."""
        mapped = 0
        try:
            for handle, n in pieces:
                map_memory(self.ptr + mapped, n, handle)
                mapped += n
            set_access(self.ptr, self.size, self.device, self.writable)
        except BaseException:
            self._unmap(pieces, mapped)
            raise

    def _unmap(self, pieces: list[tuple[int, int]], upto: int) -> None:
        at = 0
        for _, n in pieces:
            if at >= upto:
                break
            unmap(self.ptr + at, n)
            at += n

    def park(self) -> None:
        """Unmap every piece and release its handle, keeping the address range: the memory
        can go (nothing of this process holds it) and `ptr` stays ours for remap()."""
        if not self.ptr or not self.pieces:
            return
        with context(self.device):
            self._unmap(self.pieces, self.size)
            for handle, _ in self.pieces:
                release(handle)
        self.pieces, self.handle = [], 0

    def remap(self, pieces: list[tuple[int, int]]) -> None:
        """Map new handles (owned from now on) at the parked range, one after another, with
        the access it had. ValueError unless their sizes sum to exactly `size`."""
        if not self.parked:
            raise ValueError("remap() of a mapping that is not parked" if self.ptr
                             else "remap() of a closed mapping")
        self._check(pieces)
        with context(self.device):
            self._map(pieces)
        self.pieces, self.handle = list(pieces), pieces[0][0]

    def close(self, *, release_handle: bool = True) -> None:
        """Unmap and free the range (parked: only free it), releasing the handles."""
        if not self.ptr:
            return
        with context(self.device):
            self._unmap(self.pieces, self.size)
            address_free(self.ptr, self.size)
            if release_handle:
                for handle, _ in self.pieces:
                    release(handle)
        self.ptr = 0


def dmabuf_fd(ptr: int, size: int) -> int:
    """A dma-buf fd for a mapped range (for RDMA registration); the caller closes it."""
    kind = _driver().CUmemRangeHandleType.CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD
    return int(_cu("cuMemGetHandleForAddressRange", ptr, size, kind, 0))
