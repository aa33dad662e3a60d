"""The one module that calls the CUDA driver API (`cuda.bindings.driver`, cuda-python >= 12.6).

Why one module: every CUresult is checked in one place and becomes one typed exception, and
the rest of the project never sees raw bindings (docs/design.md). The daemon's cuda backend, the
client's data path and `gpumemctl.attach()` all use it; it imports nothing of gpumemctl, so the
daemon may import it without importing the client (docs/architecture.md).

The bindings are imported lazily, inside the first call: `import gpumemctl` and `gpumemctl ls`
never load CUDA. Every driver call in cuda-python returns a tuple `(CUresult, *outputs)`;
`_cu()` checks the CUresult and returns the outputs (one value, or a tuple of several).

Errors: `CudaError` carries `.result` (the CUresult as int) and `.name` ('CUDA_ERROR_...');
there is one subclass per CUresult, made on demand by `error_class(name)`, and the ones code
catches are named here (CudaOutOfMemory, CudaNotSupported, ...). `CudaUnavailable` means
cuda-python or the driver library (libcuda.so.1) could not be loaded at all.

Contexts: we use each device's *primary* context, the one the CUDA runtime (PyTorch, CuPy)
uses too, so pointers mapped here are valid in their kernels. It is retained once per process
and pushed around each group of calls by `context(index)`.
"""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import re
import threading
from collections.abc import Callable

# =========================================================================================
# errors
# =========================================================================================


class CudaError(Exception):
    """A failed CUDA driver call. `.result` is the CUresult (int), `.name` its name."""

    result = -1
    name = "CUDA_ERROR"

    def __init__(self, message: str, *, result: int | None = None, name: str | None = None,
                 call: str | None = None):
        super().__init__(message)
        if result is not None:
            self.result = result
        if name is not None:
            self.name = name
        self.call = call


class CudaUnavailable(CudaError):
    """cuda-python is not installed, or the NVIDIA driver library cannot be loaded."""

    name = "CUDA_UNAVAILABLE"


_CLASSES: dict[str, type[CudaError]] = {}
_CLASSES_LOCK = threading.Lock()


def _named(name: str, result: int):
    """Register an explicitly written subclass for one CUresult."""
    def register(cls):
        cls.name, cls.result = name, result
        _CLASSES[name] = cls
        return cls
    return register


@_named("CUDA_ERROR_INVALID_VALUE", 1)
class CudaInvalidValue(CudaError):
    pass


@_named("CUDA_ERROR_OUT_OF_MEMORY", 2)
class CudaOutOfMemory(CudaError):
    pass


@_named("CUDA_ERROR_NOT_INITIALIZED", 3)
class CudaNotInitialized(CudaError):
    pass


@_named("CUDA_ERROR_NO_DEVICE", 100)
class CudaNoDevice(CudaError):
    pass


@_named("CUDA_ERROR_INVALID_DEVICE", 101)
class CudaInvalidDevice(CudaError):
    pass


@_named("CUDA_ERROR_INVALID_CONTEXT", 201)
class CudaInvalidContext(CudaError):
    pass


@_named("CUDA_ERROR_INVALID_HANDLE", 400)
class CudaInvalidHandle(CudaError):
    pass


@_named("CUDA_ERROR_NOT_FOUND", 500)
class CudaNotFound(CudaError):
    pass


@_named("CUDA_ERROR_ILLEGAL_ADDRESS", 700)
class CudaIllegalAddress(CudaError):
    pass


@_named("CUDA_ERROR_NOT_PERMITTED", 800)
class CudaNotPermitted(CudaError):
    pass


@_named("CUDA_ERROR_NOT_SUPPORTED", 801)
class CudaNotSupported(CudaError):
    pass


def _class_name(name: str) -> str:
    """'CUDA_ERROR_LAUNCH_FAILED' -> 'CudaLaunchFailed'."""
    words = re.sub(r"^CUDA_ERROR_", "", name).split("_")
    return "Cuda" + "".join(w.capitalize() for w in words if w)


def error_class(name: str) -> type[CudaError]:
    """The exception class for a CUresult name, made on first use and cached."""
    with _CLASSES_LOCK:
        cls = _CLASSES.get(name)
        if cls is None:
            cls = type(_class_name(name), (CudaError,), {"name": name, "__module__": __name__})
            _CLASSES[name] = cls
        return cls


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
    one granule at offset `size`, which the driver refuses past the end."""
    gran = granularity(index)
    with context(index):
        ptr = reserve(gran)
        try:
            map_memory(ptr, gran, handle, size)
        except CudaError:   # INVALID_VALUE is the documented answer; any refusal means no
            return False
        else:
            unmap(ptr, gran)
            return True
        finally:
            address_free(ptr, gran)


class Mapping:
    """An allocation handle mapped at a fresh virtual address range of this process, with
    read-only or read-write access for its device. Owns the handle: close() unmaps, frees
    the range and releases the handle."""

    def __init__(self, handle: int, size: int, index: int, writable: bool):
        self.handle, self.size, self.device, self.writable = handle, size, index, writable
        with context(index):
            self.ptr = reserve(size, granularity(index))
            try:
                map_memory(self.ptr, size, handle)
            except BaseException:
                address_free(self.ptr, size)
                raise
            try:
                set_access(self.ptr, size, index, writable)
            except BaseException:
                unmap(self.ptr, size)
                address_free(self.ptr, size)
                raise

    def close(self, *, release_handle: bool = True) -> None:
        if not self.ptr:
            return
        with context(self.device):
            unmap(self.ptr, self.size)
            address_free(self.ptr, self.size)
            if release_handle:
                release(self.handle)
        self.ptr = 0


def dmabuf_fd(ptr: int, size: int) -> int:
    """A dma-buf fd for a mapped range (for RDMA registration); the caller closes it."""
    kind = _driver().CUmemRangeHandleType.CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD
    return int(_cu("cuMemGetHandleForAddressRange", ptr, size, kind, 0))


# =========================================================================================
# copies, pinned host memory, streams and events
# =========================================================================================
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


# =========================================================================================
# device scratch memory, modules and kernel launches (the ECC codec, daemon/ecc/gpu.py)
# =========================================================================================
def compute_capability(index: int) -> tuple[int, int]:
    """(major, minor), e.g. (9, 0) on an H100."""
    a = "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_"
    return attribute(index, a + "MAJOR"), attribute(index, a + "MINOR")


def mem_alloc(size: int) -> int:
    """cuMemAlloc in the current context (small scratch buffers, not VMM allocations)."""
    return int(_cu("cuMemAlloc", size))


def mem_free(ptr: int) -> None:
    _cu("cuMemFree", ptr)


def module_load_data(image: bytes):
    """Load a cubin (or NUL-terminated PTX, JIT-compiled by the driver) into the current
    context; returns the CUmodule."""
    buf = ctypes.create_string_buffer(bytes(image), len(image) + 1)   # + NUL for PTX
    return _cu("cuModuleLoadData", ctypes.addressof(buf))


def module_unload(module) -> None:
    _cu("cuModuleUnload", module)


def module_function(module, name: str):
    """The CUfunction of an `extern "C"` kernel in a loaded module."""
    return _cu("cuModuleGetFunction", module, name.encode())


def function_max_dynamic_shared(func, nbytes: int) -> None:
    """Allow a kernel more than 48 KiB of dynamic shared memory per block."""
    attr = _driver().CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    _cu("cuFuncSetAttribute", func, attr, int(nbytes))


def launch_kernel(func, grid: int | tuple, block: int | tuple, args, stream,
                  shared: int = 0) -> None:
    """cuLaunchKernel: `args` are ctypes scalars (c_uint64 for pointers and sizes, c_uint32,
    ...) in the kernel's parameter order. The driver copies them at the call, so they need
    not outlive it."""
    gx, gy, gz = (grid, 1, 1) if isinstance(grid, int) else tuple(grid)
    bx, by, bz = (block, 1, 1) if isinstance(block, int) else tuple(block)
    args = list(args)
    params = (ctypes.c_void_p * max(1, len(args)))(*[ctypes.addressof(a) for a in args])
    _cu("cuLaunchKernel", func, gx, gy, gz, bx, by, bz, shared, stream,
        ctypes.addressof(params), 0)


# =========================================================================================
# NVRTC (runtime compilation of CUDA C++; cuda.bindings.nvrtc and libnvrtc, loaded lazily)
# =========================================================================================
class NvrtcError(CudaError):
    """A failed NVRTC call; a failed compilation carries the compiler's `.log`."""

    name = "NVRTC_ERROR"

    def __init__(self, message: str, *, log: str = "", **kw):
        super().__init__(message, **kw)
        self.log = log


_nvrtc_module = None


def _nvrtc():
    global _nvrtc_module
    if _nvrtc_module is None:
        try:
            from cuda.bindings import nvrtc
        except ImportError as exc:
            raise CudaUnavailable(f"cuda.bindings.nvrtc is not installed ({exc}): pip install "
                                  "'gpumemctl[cuda]'") from None
        except Exception as exc:   # noqa: BLE001 - a broken install: say so, as one error
            raise CudaUnavailable(f"cuda.bindings.nvrtc cannot be loaded: "
                                  f"{type(exc).__name__}: {exc}") from None
        _nvrtc_module = nvrtc
    return _nvrtc_module


def _nv(name: str, *args):
    """Call one NVRTC function and check its nvrtcResult; returns its outputs."""
    fn = getattr(_nvrtc(), name)
    try:
        ret = fn(*args)
    except RuntimeError as exc:   # cuda.pathfinder: libnvrtc.so not found
        raise CudaUnavailable(f"{name}: NVRTC cannot be used: {exc}", call=name) from None
    err, out = (ret[0], ret[1:]) if isinstance(ret, tuple) else (ret, ())
    code = int(err)
    if code:
        label = getattr(err, "name", f"NVRTC_ERROR_{code}")
        raise NvrtcError(f"{name} failed with {label} ({code})", result=code, name=label,
                         call=name)
    if not out:
        return None
    return out[0] if len(out) == 1 else out


def nvrtc_supported_archs() -> list[int]:
    """The sm_XY numbers (e.g. 90) this NVRTC can compile for."""
    return [int(a) for a in _nv("nvrtcGetSupportedArchs")]


def nvrtc_compile(source: bytes, name: str, options, *, cubin: bool = True) -> tuple[bytes, str]:
    """Compile CUDA C++ `source` with `options` (strings, e.g. '--gpu-architecture=sm_90');
    returns (the cubin, or the PTX without its NUL, and the compiler's log). A compile error
    raises NvrtcError with the log."""
    opts = [o.encode() if isinstance(o, str) else bytes(o) for o in options]
    prog = _nv("nvrtcCreateProgram", bytes(source), name.encode(), 0, [], [])
    try:
        try:
            _nv("nvrtcCompileProgram", prog, len(opts), opts)
            failed = None
        except NvrtcError as exc:
            failed = exc
        size = int(_nv("nvrtcGetProgramLogSize", prog))
        raw = b" " * size
        if size:
            _nv("nvrtcGetProgramLog", prog, raw)
        log = raw.rstrip(b"\0").decode(errors="replace").strip()
        if failed is not None:
            raise NvrtcError(f"compiling {name} failed ({failed.name}):\n{log}",
                             result=failed.result, name=failed.name, call="nvrtcCompileProgram",
                             log=log)
        kind = "CUBIN" if cubin else "PTX"
        size = int(_nv(f"nvrtcGet{kind}Size", prog))
        image = b" " * size
        _nv(f"nvrtcGet{kind}", prog, image)
        return (image if cubin else image.rstrip(b"\0")), log
    finally:
        _nv("nvrtcDestroyProgram", prog)
