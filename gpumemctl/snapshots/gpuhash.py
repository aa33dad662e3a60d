"""Snapshot block checksums computed on the GPU (issue 29): XXH3-128 of each 1 MiB block of
device memory, bit-identical to the xxhash package's (the manifest's `hash`, docs/snapshots.md),
so the host copies each byte once (to the store) instead of also hashing it.

The kernel is xxh3.cu beside this file (its comment explains the split of a block's stripes
over a warp), compiled with NVRTC for the device's architecture and cached per user
(gpumemctl/cudadrv/kcache.py); every driver and NVRTC call goes through gpumemctl.cudadrv.

Which path computes the checksums (`GPUMEMCTL_SNAPSHOT_HASH`):
    auto   the GPU's on the cuda backend where the kernel compiles and loads, else the CPU's
    cpu    the CPU's (xxhash), always
    gpu    the GPU's, and an error where it cannot run (for tests and benchmarks)
The host backend and S3 stores see no difference: the checksums are the same bytes.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import threading
from typing import Any

from ..cudadrv import kcache
from ..protocol import UsageError
from .manifest import BLOCK

MODE_ENV = "GPUMEMCTL_SNAPSHOT_HASH"
MODES = ("auto", "cpu", "gpu")
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "xxh3.cu")
WARPS = 4                  # hash blocks (one warp each) per CTA: XXH_WARPS in xxh3.cu
OPTIONS = ("-std=c++17", f"-DXXH_WARPS={WARPS}")
WHAT = "block-hash kernel cache"           # in the cache's log lines

_hashers: dict[int, GpuHasher | None] = {}
_lock = threading.Lock()


def requested() -> str:
    mode = os.environ.get(MODE_ENV, "auto") or "auto"
    if mode not in MODES:
        raise UsageError(f"invalid {MODE_ENV}={mode!r}: expected one of {', '.join(MODES)}")
    return mode


def for_memory(memory) -> GpuHasher | None:
    """The device's hasher for an allocation mapped on the cuda backend, made once per
    process; None where the CPU computes the checksums (module docstring)."""
    mode = requested()
    on_gpu = hasattr(memory, "ptr") and hasattr(memory, "device") and not memory.ptr % 8
    if mode == "cpu" or not on_gpu:
        if mode == "gpu":
            raise UsageError(f"{MODE_ENV}=gpu, but this allocation is not in GPU memory")
        return None
    with _lock:
        if memory.device not in _hashers:
            _hashers[memory.device] = _make(memory.device, mode)
        return _hashers[memory.device]


def _make(device: int, mode: str) -> GpuHasher | None:
    from .. import cudadrv
    try:
        return GpuHasher(device)
    except (cudadrv.CudaError, RuntimeError, OSError, ImportError) as exc:
        if mode == "gpu":
            raise UsageError(f"{MODE_ENV}=gpu, but the block-hash kernel cannot run on GPU "
                             f"{device}: {exc}") from None
        return None            # no NVRTC or no kernel support here: the CPU path stays


def _cache_name(source: bytes, arch: str, cubin: bool) -> str:
    h = hashlib.sha256(source)
    for o in (arch, *OPTIONS):
        h.update(b"\0" + o.encode())
    return f"xxh3-{arch}-{h.hexdigest()[:32]}.{'cubin' if cubin else 'ptx'}"


def kernel_image(capability: tuple[int, int]) -> bytes:
    """xxh3.cu compiled for a device of this compute capability: a cached cubin for its own
    sm_XY needs no NVRTC at all; else compiled (and cached)."""
    from .. import cudadrv
    with open(SOURCE, "rb") as f:
        source = f.read()
    cc = capability[0] * 10 + capability[1]
    with kcache.KernelCache(cache_dir(), WHAT) as cache:
        own = _cache_name(source, f"sm_{cc}", True)
        image = cache.load(own, own, f"sm_{cc}")
        if image is not None:
            return image
        arch, cubin = cudadrv.nvrtc_target(cc, cudadrv.nvrtc_supported_archs())
        name = _cache_name(source, arch, cubin)
        image = cache.load(name, name, arch) if name != own else None
        if image is None:
            image, _log = cudadrv.nvrtc_compile(source, "xxh3.cu",
                                                    (f"--gpu-architecture={arch}", *OPTIONS),
                                                    cubin=cubin)
            cache.store(name, image, name, arch, "nvrtc")
    return image


def cache_dir() -> str:
    """The caller's own cache of compiled kernels (checked by gpumemctl/cudadrv/kcache.py
    before anything in it is loaded)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(base, "gpumemctl")


def digests(words: list[int]) -> list[str]:
    """The kernel's output (low, high 64-bit words per block) as xxhash's hexdigest: the
    128-bit value, high half first, big-endian."""
    return [f"{hi:016x}{lo:016x}" for lo, hi in zip(words[::2], words[1::2], strict=True)]


def hash_path(used: set) -> str | None:
    """Where the block checksums of a command's allocations were computed: `gpu`, `cpu`,
    `mixed`, or None (no data read: only carried entries, or none)."""
    used = used - {None}
    return used.pop() if len(used) == 1 else ("mixed" if used else None)


class GpuHasher:
    """The block-hash kernel loaded on one device, with its stream and result buffers.
    One call at a time (a lock); launch() then collect(), or hash()."""

    def __init__(self, device: int):
        from .. import cudadrv
        self.cu, self.device = cudadrv, device
        self.lock = threading.Lock()
        self.dptr, self.room = 0, 0
        self.host: Any = None
        image = kernel_image(cudadrv.compute_capability(device))
        with cudadrv.context(device):
            self.module = cudadrv.module_load_data(image)
            try:
                self.fn = cudadrv.module_function(self.module, "xxh3_blocks")
                self.stream = cudadrv.stream_create()
            except BaseException:
                cudadrv.module_unload(self.module)
                raise
        self.pending = 0

    def launch(self, ptr: int, size: int) -> None:
        """Start hashing the blocks of device bytes [ptr, ptr+size) on the hasher's stream
        (asynchronous: it runs beside other streams' copies of the same memory)."""
        n = -(-size // BLOCK)
        with self.cu.context(self.device):
            self._room(16 * n)
            self._kernel(ptr, size, 0)
            if n:
                self.cu.memcpy_dtoh_async(self.host.ptr, self.dptr, 16 * n, self.stream)
        self.pending = n

    def collect(self) -> list[str]:
        """The checksums of what launch() started, once the kernel is done."""
        with self.cu.context(self.device):
            self.cu.stream_synchronize(self.stream)
        n, self.pending = self.pending, 0
        if not n:
            return []
        return digests(self.host.view[:16 * n].cast("Q").tolist())

    def hash(self, ptr: int, size: int) -> list[str]:
        with self.lock:
            self.launch(ptr, size)
            return self.collect()

    def hash_ranges(self, ranges: list[tuple[int, int]]) -> list[list[str]]:
        """The checksums of each device range (ptr, size), all launched before one wait: an
        incremental snapshot hashes the runs the change tracking names, 82 of them for 1%
        of 8 GiB, and a wait per run cost 45 ms on an H200."""
        counts = [-(-size // BLOCK) for _, size in ranges]
        with self.lock, self.cu.context(self.device):
            self._room(16 * sum(counts))
            at = 0
            for (ptr, size), n in zip(ranges, counts, strict=True):
                self._kernel(ptr, size, at)
                at += n
            if at:
                self.cu.memcpy_dtoh_async(self.host.ptr, self.dptr, 16 * at, self.stream)
            self.cu.stream_synchronize(self.stream)
            sums = digests(self.host.view[:16 * at].cast("Q").tolist()) if at else []
        out, at = [], 0
        for n in counts:
            out.append(sums[at:at + n])
            at += n
        return out

    def _kernel(self, ptr: int, size: int, first: int) -> None:
        """Launch the kernel over [ptr, ptr+size), its checksums to result slot `first` on
        (context held, result buffers large enough)."""
        if ptr % 8:
            raise ValueError(f"the block hash needs 8-byte aligned memory, not {ptr:#x}")
        n = -(-size // BLOCK)
        if n:
            c64 = ctypes.c_uint64
            self.cu.launch_kernel(self.fn, -(-n // WARPS), 32 * WARPS,
                                  [c64(ptr), c64(size), c64(BLOCK), c64(n),
                                   c64(self.dptr + 16 * first)], self.stream)

    def _room(self, nbytes: int) -> None:
        """Device and pinned result buffers of at least `nbytes` (context held)."""
        if nbytes <= self.room:
            return
        self._free_buffers()
        size = max(nbytes, 1 << 16)
        self.dptr = self.cu.mem_alloc(size)
        self.host = self.cu.PinnedBuffer(size, self.device)
        self.room = size

    def _free_buffers(self) -> None:
        if self.dptr:
            self.cu.mem_free(self.dptr)
        if self.host is not None:
            self.host.free()
        self.dptr, self.room, self.host = 0, 0, None

    def close(self) -> None:
        with self.lock, self.cu.context(self.device):
            self.cu.stream_synchronize(self.stream)
            self.cu.stream_destroy(self.stream)
            self._free_buffers()
            self.cu.module_unload(self.module)
